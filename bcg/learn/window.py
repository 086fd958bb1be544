"""A window of control steps: what the rollout keeps of it, its log statistics, and its reverse pass.

SHAC (:mod:`bcg.learn.shac`) and PPO (:mod:`bcg.learn.ppo`) both roll out windows of ``horizon``
control steps and log them by :func:`window_stats`; SHAC then reverses its window through the
simulator one control step at a time (:func:`window_backward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcg.learn.env_protocol import DifferentiableEnv, Env

EARLY_TRACKING_STEPS = 25
"""``tracking_error_early_cm`` averages the tracking error over the first 25 control steps (0.5 s)
of each episode. The all-steps mean grows with the episode length (a robot that falls later spends
more steps far from the reference), so it can rise while tracking improves; this one is not
confounded by the episode length."""


@dataclass
class Window:
    """What the rollout keeps for the reverse pass and the updates (k = 0 .. h-1, states 0 .. h).

    Attributes:
        obs_hat: normalised actor observations (h, N, D).
        obs_critic_hat: normalised critic observations (h+1, N, D).
        caches: actor caches per step.
        rewards: (h, N) unscaled.
        terminated, truncated, alive: (h, N) bool; alive = the episode had not ended before step k.
        noise: (h, N, A) ε.
        tracking_error: (h, N) m.
        episode_step: (h, N) steps of each env's episode up to and including step k (-1 where the env
            does not report it).
        delta: (h, N, F) ADD differentials, or None.
        nonfinite: (N,) bool, the env produced a non-finite value in this window.
        leg_gap: (h, N) m, smallest gap between the legs (:mod:`bcg.learn.clearance`; NaN where the
            env does not report it).
    """

    obs_hat: np.ndarray
    obs_critic_hat: np.ndarray
    caches: list
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    alive: np.ndarray
    noise: np.ndarray
    tracking_error: np.ndarray
    episode_step: np.ndarray
    delta: np.ndarray | None
    nonfinite: np.ndarray
    obs_raw: np.ndarray
    leg_gap: np.ndarray | None = None


def _overlap_rate(leg_gap: np.ndarray | None, live: np.ndarray) -> float:
    """Fraction of live env-steps whose legs overlap (gap < 0); NaN where no gap is reported."""
    if leg_gap is None:
        return float("nan")
    gaps = leg_gap[live]
    gaps = gaps[np.isfinite(gaps)]
    return float(np.mean(gaps < 0.0)) if gaps.size else float("nan")


def window_stats(env: Env, w: Window) -> dict[str, float]:
    """The log's window columns (reward, episodes, tracking error, ...) of a rollout ``w``; consumes
    the env's finished episodes. Shared by SHAC and PPO (:mod:`bcg.learn.ppo`)."""
    finished = getattr(env, "finished", [])
    lengths = [f[0] for f in finished]
    returns = [f[1] for f in finished]
    falls = [f[2] for f in finished]
    lost = [f[3] for f in finished if len(f) > 3]
    if hasattr(env, "finished"):
        env.finished = []
    live = w.alive & ~w.nonfinite[None, :]
    err = w.tracking_error[live]
    early = live & (w.episode_step >= 1) & (w.episode_step <= EARLY_TRACKING_STEPS)
    err_early = w.tracking_error[early]
    return {
        "reward": float(np.mean(w.rewards[live])) if live.any() else np.nan,
        "tracking_error_cm": float(np.nanmean(err) * 100) if err.size else np.nan,
        "tracking_error_early_cm": float(np.nanmean(err_early) * 100) if err_early.size else np.nan,
        "episodes": float(len(lengths)),
        "episode_length": float(np.mean(lengths)) if lengths else np.nan,
        "episode_return": float(np.mean(returns)) if returns else np.nan,
        "fall_rate": float(np.mean(falls)) if falls else np.nan,
        "lost_track_rate": float(np.mean(lost)) if lost else np.nan,
        "bcg_trigger_rate": env.bundle_trigger_rate() if hasattr(env, "bundle_trigger_rate") else np.nan,
        "live_fraction": float(np.mean(live)),
        # env-steps in which the legs' spheres overlap (they would strike each other in MuJoCo)
        "leg_overlap_rate": _overlap_rate(w.leg_gap, live),
    }


def _add_at_boundary(env: DifferentiableEnv, k: int, g_obs, g_reward) -> dict[int, np.ndarray]:
    """Add the gradient of o_k and r_{k-1} to the simulator's state at boundary k.

    The env's VJP may run kinematics queries that clear the simulator's gradient buffers, so the
    boundary gradient accumulated so far is read before and restored with the new terms.
    """
    sim = env.sim
    q_before, v_before = sim.state_grad(k)
    gq, gv, g_actions = env.state_vjp(k, g_obs, g_reward)
    q_after, v_after = sim.state_grad(k)
    sim.add_state_grad(k, gq + (q_before - q_after), gv + (v_before - v_after))
    return g_actions


def window_backward(
    env: DifferentiableEnv,
    g_rewards: np.ndarray,
    g_obs_end: dict[int, np.ndarray],
    policy_vjp,
    live: np.ndarray | None = None,
) -> None:
    """The reverse pass of a window, driven one control step at a time.

    Args:
        env: the environment that ran the window (its simulator holds the window).
        g_rewards: dL/dr_k (h, N).
        g_obs_end: {k: dL/do_k (N, D)} extra observation gradients (bootstrap values), raw obs.
        policy_vjp: ``policy_vjp(k, g_a (N, A)) -> dL/do_k (N, D) raw or None``, called once per step
            from k = h-1 down to 0 with the complete dL/da_k; it accumulates the parameter gradient.
            When the env's ``rate_on_mean`` is true it is called as ``policy_vjp(k, g_a, g_mean)``,
            g_mean being dL/d(mean action m_k) of the reward's action-rate terms.
        live: (h, N) bool, step k belongs to env's episode segment in the loss; None: every step.
            After a segment's end nothing depends on the env's state, so its state gradient there is
            set to exactly zero and its action gradients are dropped: the simulator's reverse pass of
            a robot that has already fallen may hold non-finite partials even under a zero upstream
            gradient, and those must not leak into the segment.
    """
    sim = env.sim
    h, n = g_rewards.shape
    g_a = np.zeros((h, n, env.act_dim))
    on_mean = bool(getattr(env, "rate_on_mean", False))
    g_m = np.zeros((h, n, env.act_dim)) if on_mean else g_a
    sim.backward_begin()
    g_obs_policy = None
    for k in range(h - 1, -1, -1):
        if live is not None and k + 1 < h and not live[k + 1].all():
            # what reversing the dead step k+1 left at boundary k+1 must be exactly zero
            sim.zero_state_grad(k + 1, np.flatnonzero(~live[k + 1]))
        g_obs = g_obs_end.get(k + 1)
        if g_obs_policy is not None:
            g_obs = g_obs_policy if g_obs is None else g_obs + g_obs_policy
        for j, g in _add_at_boundary(env, k + 1, g_obs, g_rewards[k]).items():
            g_m[j] += g
        c = sim.backward_step()
        if c != k:
            raise RuntimeError(f"the simulator reversed control step {c}, expected {k}")
        for j, g in env.ctrl_vjp(k, sim.ctrl_grad(k)).items():
            g_a[j] += g
        if live is not None:
            g_a[k] = np.where(live[k][:, None], g_a[k], 0.0)
            g_m[k] = np.where(live[k][:, None], g_m[k], 0.0)
        g_obs_policy = policy_vjp(k, g_a[k], g_m[k]) if on_mean else policy_vjp(k, g_a[k])
    sim.backward_end()  # the window start is detached: gradients at s_0 go nowhere
