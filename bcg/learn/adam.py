"""Optimisers on parameter dicts: Adam, SGD with momentum, global gradient-norm clipping, linear LR.

All updates are in place on the parameter arrays and on the optimiser state (the arrays are large
and the trainer owns both). The formulas match ``torch.optim.Adam`` and ``torch.optim.SGD``
(no dampening, no Nesterov), so published hyperparameters carry over unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bcg.learn.mlp import Params

#: Adam betas used for the actor and the critic [paper, hyperparameter table].
PAPER_BETAS = (0.7, 0.95)
#: Final learning rate of the linear schedule [paper].
LR_END = 1e-5


@dataclass
class AdamState:
    """First and second moments per parameter and the number of steps taken."""

    step: int
    m: Params
    v: Params

    def state_dict(self) -> dict:
        return {"step": np.asarray(self.step, np.int64), "m": dict(self.m), "v": dict(self.v)}

    @classmethod
    def from_state_dict(cls, d: dict) -> AdamState:
        return cls(
            int(d["step"]),
            {k: np.array(x) for k, x in d["m"].items()},
            {k: np.array(x) for k, x in d["v"].items()},
        )


def adam_init(params: Params) -> AdamState:
    """Zero moments shaped like ``params``."""
    return AdamState(
        0, {k: np.zeros_like(p) for k, p in params.items()}, {k: np.zeros_like(p) for k, p in params.items()}
    )


def adam_step(
    state: AdamState,
    params: Params,
    grads: Params,
    lr: float,
    betas: tuple[float, float] = PAPER_BETAS,
    eps: float = 1e-8,
) -> None:
    """One Adam step, in place on ``params`` and ``state``.

    m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
    p <- p - lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
    """
    if set(grads) != set(params):
        raise ValueError(f"gradient keys {sorted(grads)} differ from parameter keys {sorted(params)}")
    b1, b2 = float(betas[0]), float(betas[1])
    state.step += 1
    t = state.step
    # Python floats keep float32 arrays in float32 (a numpy float64 scalar would promote them)
    step_size = float(lr) / (1.0 - b1**t)
    inv_sqrt_bc2 = 1.0 / math.sqrt(1.0 - b2**t)
    for k, p in params.items():
        g = grads[k]
        m, v = state.m[k], state.v[k]
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * (g * g)
        denom = np.sqrt(v)
        denom *= inv_sqrt_bc2
        denom += eps
        p -= (step_size * m / denom).astype(p.dtype, copy=False)


@dataclass
class SGDState:
    """Momentum buffers per parameter."""

    momentum_buffer: Params

    def state_dict(self) -> dict:
        return {"momentum_buffer": dict(self.momentum_buffer)}

    @classmethod
    def from_state_dict(cls, d: dict) -> SGDState:
        return cls({k: np.array(x) for k, x in d["momentum_buffer"].items()})


def sgd_init(params: Params) -> SGDState:
    """Zero momentum buffers shaped like ``params``."""
    return SGDState({k: np.zeros_like(p) for k, p in params.items()})


def sgd_step(
    state: SGDState,
    params: Params,
    grads: Params,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
) -> None:
    """One SGD-with-momentum step, in place: g' = g + wd p; b <- mu b + g'; p <- p - lr b.

    A zero initial buffer makes the first step b = g', as in torch.
    """
    if set(grads) != set(params):
        raise ValueError(f"gradient keys {sorted(grads)} differ from parameter keys {sorted(params)}")
    lr, momentum, weight_decay = float(lr), float(momentum), float(weight_decay)
    for k, p in params.items():
        g = grads[k] + weight_decay * p if weight_decay else grads[k]
        b = state.momentum_buffer[k]
        b *= momentum
        b += g
        p -= (lr * b).astype(p.dtype, copy=False)


def accumulate_grads(total: Params | None, grads: Params) -> Params:
    """``total + grads`` key by key, in place on ``total``; ``None`` starts a new sum (a copy of grads).

    The actor's gradient over a window is the sum of its per-step backward passes.
    """
    if total is None:
        return {k: np.array(g) for k, g in grads.items()}
    if set(grads) != set(total):
        raise ValueError(f"gradient keys {sorted(grads)} differ from {sorted(total)}")
    for k, g in grads.items():
        total[k] += g
    return total


def grad_norm(grads: Params) -> float:
    """Global L2 norm over all gradient arrays.

    Each array's sum of squares is one BLAS dot product in the array's own precision (for float32,
    a few parts in 1e7 of the norm; casting to float64 first cost 25x more), summed in float64."""
    total = 0.0
    for g in grads.values():
        flat = g.ravel()
        with np.errstate(over="ignore"):
            square = float(np.dot(flat, flat))
        if square == math.inf and np.isfinite(flat).all():  # finite entries above ~1e19 in float32
            wide = flat.astype(np.float64)
            square = float(wide @ wide)
        total += square
    return float(np.sqrt(total))


def clip_grad_norm(grads: Params, max_norm: float) -> float:
    """Scale all gradients in place so their global norm is at most ``max_norm``.

    Same rule as ``torch.nn.utils.clip_grad_norm_``: factor min(1, max_norm / (norm + 1e-6)).

    Returns:
        The norm before clipping. If it is not finite the gradients are left untouched, so the
        caller can skip the step (SHAC aborts on NaN).
    """
    norm = grad_norm(grads)
    if np.isfinite(norm):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in grads.values():
                g *= coef
    return norm


def linear_lr(lr0: float, epoch: int, total_epochs: int, lr_end: float = LR_END) -> float:
    """Linear decay: lr_e = lr0 + (lr_end - lr0) * e / E (SHAC), for e in [0, E]."""
    if total_epochs <= 0:
        raise ValueError(f"total_epochs must be positive, got {total_epochs}")
    return lr0 + (lr_end - lr0) * epoch / total_epochs
