"""Generalised advantage estimation, GAE(λ) (Schulman et al. 2016), over one rollout window.

Per env and step k = h-1 .. 0 (rsl_rl's ``compute_returns``, with the window's masks)::

    δ_k = r_k + γ (1 - term_k) V(o_k+1) - V(o_k)
    A_k = δ_k + γ λ (1 - end_k) A_k+1            (A_h = 0)
    R_k = A_k + V(o_k)                            (the value target)

``term_k`` marks an early termination (a fall: no value after it), ``end_k`` any episode end
(termination or time-out). A time-out keeps the bootstrap γ V(o_k+1) in δ_k: rsl_rl adds
γ V(o_k) to the reward at a time-out because its environment has already reset the next
observation; ours resets only at window boundaries, so the true final observation o_k+1 is there.
An env whose episode ended inside the window waits, masked, until the window ends; its masked steps
get A = R = 0 and, being after an episode end, never reach the steps before it.
"""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets of a window.

    Args:
        rewards: r_k (h, N).
        values: V(o_k) (h, N).
        next_values: V(o_k+1) (h, N), the critic at the observation after step k.
        terminated: (h, N) bool, the episode ended early at step k.
        truncated: (h, N) bool, the episode timed out at step k.
        valid: (h, N) bool, step k belongs to an episode (False: the env waits for the window's end).
        gamma: discount γ.
        lam: λ in [0, 1].

    Returns:
        advantages A (h, N) and returns R = A + V (h, N), float64, zero where not valid.
    """
    rewards = np.asarray(rewards, np.float64)
    h, n = rewards.shape
    for name, a in (("values", values), ("next_values", next_values), ("terminated", terminated),
                    ("truncated", truncated), ("valid", valid)):  # fmt: skip
        if np.shape(a) != (h, n):
            raise ValueError(f"{name} has shape {np.shape(a)}, rewards {rewards.shape}")
    valid = np.asarray(valid, bool)
    values = np.where(valid, np.asarray(values, np.float64), 0.0)
    next_values = np.where(valid, np.asarray(next_values, np.float64), 0.0)
    rewards = np.where(valid, rewards, 0.0)
    keep_value = 1.0 - np.asarray(terminated, np.float64)
    carry = 1.0 - np.asarray(np.asarray(terminated, bool) | np.asarray(truncated, bool), np.float64)
    advantages = np.zeros((h, n))
    a = np.zeros(n)
    for k in reversed(range(h)):
        delta = rewards[k] + gamma * keep_value[k] * next_values[k] - values[k]
        a = np.where(valid[k], delta + gamma * lam * carry[k] * a, 0.0)
        advantages[k] = a
    return advantages, np.where(valid, advantages + values, 0.0)
