"""TD(λ) value targets for the SHAC critic, vectorised over environments.

The recursion is SHAC's (``NVlabs/DiffRL``, ``algorithms/shac.py``), run backward over the window
i = h-1 .. 0 with A = B = 0 and ℓ = 1 at the start::

    ℓ = λ ℓ (1 - d_i) + d_i
    A = (1 - d_i) (λ γ A + γ V_{i+1} + (1 - ℓ) / (1 - λ) r_i)
    B = γ (V_{i+1} d_i + B (1 - d_i)) + r_i
    y_i = (1 - λ) A + ℓ B

``V_{i+1}`` is the bootstrap value after step i: the target critic at the next observation, the
critic at the observation before reset on a timeout, 0 on an early termination. ``d_i`` marks the end
of a segment (any episode end); the last step of the window is always treated as one (d_{h-1} := 1).
The result is the λ-return truncated at each segment end.
"""

from __future__ import annotations

import numpy as np


def td_lambda_targets(
    rewards: np.ndarray,
    next_values: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """λ-return targets.

    Args:
        rewards: r_i (h, num_envs).
        next_values: V_{i+1} (h, num_envs), already 0 where the episode terminated early.
        dones: d_i (h, num_envs), bool or 0/1; the last row is treated as all ones.
        gamma: discount γ.
        lam: λ in [0, 1).

    Returns:
        y: (h, num_envs) in the dtype of ``rewards`` (float32 unless given float64).
    """
    rewards = np.asarray(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (h, num_envs), got {rewards.shape}")
    if np.shape(next_values) != rewards.shape or np.shape(dones) != rewards.shape:
        raise ValueError(
            f"shapes differ: rewards {rewards.shape}, next_values {np.shape(next_values)}, "
            f"dones {np.shape(dones)}"
        )
    if not 0.0 <= lam < 1.0:
        raise ValueError(f"lam must be in [0, 1), got {lam}")
    dtype = rewards.dtype if rewards.dtype == np.float64 else np.float32
    r = rewards.astype(dtype, copy=False)
    v = np.asarray(next_values, dtype)
    d = np.asarray(dones, dtype).copy()
    d[-1] = 1
    h, n = r.shape
    a = np.zeros(n, dtype)
    b = np.zeros(n, dtype)
    ell = np.ones(n, dtype)
    y = np.empty((h, n), dtype)
    for i in reversed(range(h)):
        ell = lam * ell * (1 - d[i]) + d[i]
        a = (1 - d[i]) * (lam * gamma * a + gamma * v[i] + (1 - ell) / (1 - lam) * r[i])
        b = gamma * (v[i] * d[i] + b * (1 - d[i])) + r[i]
        y[i] = (1 - lam) * a + ell * b
    return y
