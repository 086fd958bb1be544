"""PPO's losses with their gradients, the Gaussian policy's log-probability and KL, and rsl_rl's
adaptive learning rate: pure functions on arrays (rsl_rl ``algorithms/ppo.py``, ``update``).

For a minibatch of n samples with advantages A, old log-probabilities ℓ_old and the new ℓ::

    ρ = exp(ℓ - ℓ_old)
    L_surr = mean max(-A ρ, -A clip(ρ, 1 - ε, 1 + ε))
    L_V    = mean max((V - R)², (V_old + clip(V - V_old, -ε, ε) - R)²)   (clipped value loss)
    L      = L_surr + c_V L_V - c_H mean H(π)

The policy is a diagonal Gaussian N(μ, diag σ²) with σ = exp(log_std), so
ℓ = Σ_j [-(a_j - μ_j)² / (2σ_j²) - log σ_j - ½ log 2π] and H = Σ_j (log σ_j + ½ log 2πe).
Gradients follow torch's conventions where a max or a clamp has a kink: the clamp passes the
gradient inside its bounds; the max takes the unclipped term on a tie (where both agree).
"""

from __future__ import annotations

import numpy as np

LOG_2PI = float(np.log(2.0 * np.pi))


def gaussian_log_prob(
    actions: np.ndarray, mean: np.ndarray, log_std: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log π(a) (n,) of actions (n, A) under N(mean (n, A), exp(log_std (A,))²), with its gradients
    with respect to the mean (n, A) and to log_std (n, A), per sample."""
    inv_var = np.exp(-2.0 * log_std)
    diff = actions - mean
    z2 = diff * diff * inv_var
    log_prob = np.sum(-0.5 * z2 - log_std - 0.5 * LOG_2PI, axis=-1)
    return log_prob, diff * inv_var, z2 - 1.0


def gaussian_entropy(log_std: np.ndarray) -> float:
    """H of a diagonal Gaussian with standard deviations exp(log_std (A,)); dH/dlog_std = 1."""
    return float(np.sum(log_std + 0.5 * (LOG_2PI + 1.0)))


def gaussian_kl(mean_old, std_old, mean, std) -> np.ndarray:
    """KL(N_old ‖ N) per sample (n,), as rsl_rl computes it (with its 1e-5 inside the log)."""
    return np.sum(
        np.log(std / std_old + 1e-5) + (std_old**2 + (mean_old - mean) ** 2) / (2.0 * std**2) - 0.5,
        axis=-1,
    )


def surrogate_loss(
    log_prob: np.ndarray, old_log_prob: np.ndarray, advantages: np.ndarray, clip: float
) -> tuple[float, np.ndarray, float]:
    """The clipped surrogate L_surr, dL_surr/dℓ (n,), and the fraction of samples whose ratio is
    clipped (the clipped term is the larger)."""
    n = log_prob.shape[0]
    ratio = np.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * np.clip(ratio, 1.0 - clip, 1.0 + clip)
    take = unclipped >= clipped
    loss = float(np.mean(np.where(take, unclipped, clipped)))
    d_log_prob = np.where(take, -advantages * ratio, 0.0) / n  # the clamp is flat where it binds
    return loss, d_log_prob, float(np.mean(~take))


def value_loss(
    values: np.ndarray, old_values: np.ndarray, returns: np.ndarray, clip: float | None
) -> tuple[float, np.ndarray]:
    """The (clipped, unless ``clip`` is None) value loss L_V and dL_V/dV (n,)."""
    n = values.shape[0]
    err = values - returns
    if clip is None:
        return float(np.mean(err * err)), 2.0 * err / n
    change = values - old_values
    inside = np.abs(change) <= clip
    err_clipped = old_values + np.clip(change, -clip, clip) - returns
    take = err * err >= err_clipped * err_clipped
    loss = float(np.mean(np.where(take, err * err, err_clipped * err_clipped)))
    d_values = np.where(take, 2.0 * err, np.where(inside, 2.0 * err_clipped, 0.0)) / n
    return loss, d_values


def adaptive_lr(lr: float, kl: float, desired_kl: float, lr_min: float = 1e-5, lr_max: float = 1e-2) -> float:
    """rsl_rl's rule: lr / 1.5 (at least ``lr_min``) when kl > 2 KL*, lr · 1.5 (at most ``lr_max``)
    when 0 < kl < KL* / 2, else unchanged."""
    if kl > 2.0 * desired_kl:
        return max(lr_min, lr / 1.5)
    if 0.0 < kl < desired_kl / 2.0:
        return min(lr_max, lr * 1.5)
    return lr


def normalize_advantages(advantages: np.ndarray) -> np.ndarray:
    """(A - mean) / (std + 1e-8) over a minibatch, with torch's unbiased std (n - 1)."""
    std = np.std(advantages, ddof=1) if advantages.shape[0] > 1 else 0.0
    return (advantages - np.mean(advantages)) / (std + 1e-8)
