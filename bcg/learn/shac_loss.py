"""SHAC's actor loss, its gradient seeds, the actor's side of the reverse pass and the critic's targets.

Functions of a window's arrays (:class:`bcg.learn.window.Window`); :meth:`bcg.learn.shac.Shac._iteration`
strings them together. Each env's episode segment inside the window (episodes reset at window starts
only, so one segment per env) runs from step 0 to k_end, its first episode end or the window's last
step. The actor loss over N envs and h steps is

    L = -1/(N h) Σ_e [ Σ_{k ≤ k_end} γ^k r̃_k + γ^{k_end+1} V̄(o_{k_end+1}) ]

with r̃ the reward times SHAC's return scale, V̄ the target critic and V̄ = 0 after an early
termination. L is linear in the rewards and the bootstrap values, so its gradient seeds dL/dr_k and
dL/dV̄ are its coefficients (:func:`actor_loss_seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcg.learn.actor import actor_backward
from bcg.learn.adam import accumulate_grads
from bcg.learn.mlp import Params
from bcg.learn.normalizer import ReturnNormalizer, RunningMeanStd
from bcg.learn.td import td_lambda_targets


@dataclass(frozen=True)
class Segments:
    """Each env's episode segment inside a window of h steps over N envs.

    Attributes:
        end: k_end (N,), the segment's last step.
        live: (h, N) bool, step k belongs to the segment (k <= k_end).
        ended: (h, N) bool, an episode ended at step k (terminated or truncated).
        bootstrap: (N,) bool, the segment ends without an early termination, so its value
            bootstraps from the target critic.
    """

    end: np.ndarray
    live: np.ndarray
    ended: np.ndarray
    bootstrap: np.ndarray


def segments(terminated: np.ndarray, truncated: np.ndarray) -> Segments:
    """The segments of a window from its (h, N) episode ends."""
    h, n = terminated.shape
    ended = terminated | truncated
    end = np.where(ended.any(axis=0), np.argmax(ended, axis=0), h - 1)
    bootstrap = ~terminated[end, np.arange(n)]
    live = np.arange(h)[:, None] <= end[None, :]
    return Segments(end=end, live=live, ended=ended, bootstrap=bootstrap)


def return_scale(
    ret_norm: ReturnNormalizer, rewards: np.ndarray, alive: np.ndarray, ended: np.ndarray
) -> float:
    """SHAC's reward scale, read before the window's returns are folded into ``ret_norm``, which
    this then does with the (h, N) unscaled ``rewards`` of the ``alive`` steps."""
    scale = ret_norm.scale()
    rn = ret_norm
    for k in range(rewards.shape[0]):
        live = alive[k]
        rn.returns = np.where(live, rn.returns * rn.gamma + np.where(live, rewards[k], 0.0), rn.returns)
        if live.any():
            rn.rms.update(rn.returns[live])
        rn.returns = np.where(live & ended[k], 0.0, rn.returns)
    return scale


def actor_loss_seeds(seg: Segments, gamma: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The actor loss's coefficients: dL/dr_k (h, N), zero after a segment's end, and dL/dV̄ (N,)
    float32 of the bootstrap values at o_{k_end+1}, zero after an early termination."""
    h, n = seg.live.shape
    gammas = gamma ** np.arange(h + 1)
    g_rewards = np.where(seg.live, -gammas[:h, None] * scale / (n * h), 0.0)
    d_v = np.where(seg.bootstrap, -gammas[seg.end + 1] / (n * h), 0.0).astype(np.float32)
    return g_rewards, d_v


def actor_loss(
    rewards: np.ndarray, v_end: np.ndarray, g_rewards: np.ndarray, d_v: np.ndarray, live: np.ndarray
) -> float:
    """L from the window's (h, N) unscaled rewards and the (N,) bootstrap values, by its
    coefficients (:func:`actor_loss_seeds`; the return scale is in ``g_rewards``)."""
    return float(np.sum(g_rewards * np.where(live, rewards, 0.0)) + np.sum(d_v * v_end))


def bootstrap_obs_grads(g_boot: np.ndarray, end: np.ndarray) -> dict[int, np.ndarray]:
    """{k: dL/do_k (N, D)} from the bootstrap values' observation gradient ``g_boot`` (N, D) at each
    env's o_{k_end+1}: the rows of the envs whose segment ends at k - 1, zeros elsewhere."""
    out: dict[int, np.ndarray] = {}
    for k in np.unique(end + 1):
        rows = (end + 1 == k)[:, None]
        out[int(k)] = np.where(rows, g_boot, 0.0)
    return out


def critic_targets(
    rewards: np.ndarray,
    v_next: np.ndarray,
    terminated: np.ndarray,
    seg: Segments,
    scale: float,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """TD(λ) targets (h, N) of the segments' steps (:func:`bcg.learn.td.td_lambda_targets`) from the
    unscaled rewards and the target critic's values V̄(o_{k+1}) (h, N); a segment's end is a done,
    and an early termination bootstraps from 0."""
    v_next = np.where(terminated, 0.0, v_next)
    r_scaled = np.where(seg.live, rewards * scale, 0.0)
    return td_lambda_targets(r_scaled, np.where(seg.live, v_next, 0.0), seg.ended | ~seg.live, gamma, lam)


class ActorGradient:
    """The actor's side of a window's reverse pass: called as ``policy_vjp`` by
    :func:`bcg.learn.window.window_backward` once per step from the last, it sums the actor's
    parameter gradient and returns dL/do_k for the step's observation.

    An env whose action gradient turns non-finite at a step (the simulator's partials can break at a
    violent contact) keeps the finite part, the steps after it, when ``drop_nonfinite`` is on: its
    gradient from that step on is cut, and it is counted in ``dropped``.

    Args:
        actor: the actor's parameters.
        caches: the rollout's actor caches, one per step.
        rms: the observation statistics the rollout normalised with, or None (no normalisation).
        shape: (h, N, A).
        drop_nonfinite: cut an env's gradient where it turns non-finite.
        per_step: also keep dL/da_k per step and env (``step_grads``).

    Attributes:
        grads: the actor's parameter gradient so far (None before the first step).
        per_env: (N, A) Σ_k dL/da_k of each env.
        step_grads: (h, N, A) float32 dL/da_k, or None.
        dropped: (N,) bool, envs whose gradient was cut.
    """

    def __init__(
        self,
        actor: Params,
        caches: list,
        rms: RunningMeanStd | None,
        shape: tuple[int, int, int],
        drop_nonfinite: bool,
        per_step: bool = False,
    ):
        h, n, act_dim = shape
        self.actor, self.caches, self.rms, self.drop_nonfinite = actor, caches, rms, drop_nonfinite
        self.grads: Params | None = None
        self.per_env = np.zeros((n, act_dim))
        self.step_grads = np.zeros((h, n, act_dim), np.float32) if per_step else None
        self.dropped = np.zeros(n, bool)

    def __call__(self, k: int, g_a: np.ndarray, g_mean: np.ndarray | None = None) -> np.ndarray:
        """dL/do_k (N, D) raw, given dL/da_k (N, A) and, when the action-rate term reads the mean
        actions, dL/dm_k (N, A)."""
        g_a32 = np.asarray(g_a, np.float32)
        g_m32 = None if g_mean is None else np.asarray(g_mean, np.float32)
        bad = ~np.all(np.isfinite(g_a32), axis=1)
        if g_m32 is not None:
            bad |= ~np.all(np.isfinite(g_m32), axis=1)
        if bad.any() and self.drop_nonfinite:
            g_a32[bad] = 0.0  # the env's gradient is cut where the simulator's partials broke
            if g_m32 is not None:
                g_m32[bad] = 0.0
            self.dropped[:] |= bad
        g_step = g_a32 if g_m32 is None else g_a32 + g_m32
        self.per_env[:] += g_step
        if self.step_grads is not None:
            self.step_grads[k] += g_step
        g, d_obs_hat = actor_backward(self.actor, self.caches[k], g_a32, d_mean=g_m32)
        self.grads = accumulate_grads(self.grads, g)
        return self.rms.normalize_grad(d_obs_hat) if self.rms is not None else d_obs_hat

    def nonfinite_envs(self) -> np.ndarray:
        """(N,) bool, the envs whose summed action gradient is not finite; all of them when none is
        (the loss itself, or a sum over envs, broke)."""
        bad = ~np.all(np.isfinite(self.per_env), axis=1)
        return bad if bad.any() else np.ones(len(bad), bool)

    def variance(self) -> float:
        """Mean over action dimensions of the variance across envs of their gradient contribution
        (scaled by N, so that it does not shrink with the number of envs)."""
        n = self.per_env.shape[0]
        return float(np.mean(np.var(self.per_env * n, axis=0)))
