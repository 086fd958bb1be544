"""Numerical checks the gradient tests share."""


def central_difference(f, x, idx, eps=1e-6):
    """(f(x + eps e_idx) - f(x - eps e_idx)) / (2 eps)."""
    xp, xm = x.copy(), x.copy()
    xp[idx] += eps
    xm[idx] -= eps
    return (f(xp) - f(xm)) / (2 * eps)
