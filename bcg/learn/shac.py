"""SHAC (Xu et al. 2022) on the differentiable simulator, with the ADD discriminator update.

One iteration (:meth:`Shac.iteration`):

1. Rollout: ``horizon`` control steps over N envs from the current states (the window start cuts the
   gradient). The observation statistics are frozen for the window; actions ã = μ_θ(ô) + σ ⊙ ε.
2. Actor loss, each env's episode segment inside the window (episodes reset at window starts only, so
   one segment per env, see :mod:`bcg.learn.env`):
       L = -1/(N h) Σ_e [ Σ_{k ≤ k_end} γ^k r̃_k + γ^{k_end+1} V̄(o_{k_end+1}) ]
   with r̃ the reward times SHAC's return scale, V̄ the target critic (min over the ensemble), and
   V̄ = 0 after an early termination (fall, non-finite state).
3. Reverse pass, one control step at a time (k = h-1 .. 0) through the simulator's stepwise API:
   at the state s_k+1, dL/dr_k (reward VJP) and dL/do_k+1 (policy and bootstrap VJPs through the
   observation) become dL/d(qpos, qvel) and are added at that boundary; reversing step k yields
   dL/dctrl_k, which the env maps to dL/da; then the actor's backward gives the parameter gradient
   and dL/dô_k for the next boundary.
   An env whose reverse pass turns non-finite at some step (the simulator's partials can break at
   a violent contact) keeps the finite part of its gradient, the steps after that point, and loses
   the rest (``drop_nonfinite_env_grads``; counted as ``nan_grad_envs``); with the switch off, any
   non-finite gradient skips the update.
4. Clip the actor gradient to norm 1.0, Adam (β = (0.7, 0.95)), linear learning-rate decay.
5. Critic: TD(λ) targets from the target critic, 16 passes x 4 minibatches, then Polyak targets.
   The fit is taken (and the Polyak step made) after the next iteration's rollout, before its
   bootstrap values, the first thing that reads the critic: with ``cfg.critic_worker`` it runs in
   a worker process during this iteration's reverse pass and the next rollout
   (:mod:`bcg.learn.critic_worker`), and either way the numbers are those of a fit right after the
   reverse pass. The row of an iteration reports the fit of the iteration before it.
6. Discriminator: two epochs of SGD on the window's differentials and the replay buffer, drawn
   before the reverse pass (with ``cfg.critic_worker`` they run in the worker during it).

A non-finite state, reward, loss or gradient skips every update of the iteration and resets the
affected envs (:mod:`bcg.learn.nan_guard`).

The environment interface (duck-typed; :class:`bcg.learn.env.G1TrackingEnv` is the real one):
``num_envs, horizon, obs_dim, act_dim, sim``; ``begin_window() -> (obs, obs_critic)``;
``step(a) -> StepResult``; ``end_window()``; ``state_vjp(k, g_obs, g_reward) -> (gq, gv, {j: g_a})``;
``ctrl_vjp(k, g_ctrl) -> {j: g_a}``; ``request_reset(mask)``; ``state_dict()`` / ``load_state_dict(d)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

from bcg.learn.actor import actor_backward, actor_forward, actor_init
from bcg.learn.adam import (
    AdamState,
    accumulate_grads,
    adam_init,
    adam_step,
    clip_grad_norm,
    grad_norm,
    linear_lr,
)
from bcg.learn.config import TrainConfig
from bcg.learn.critic import (
    critic_fit,
    critic_init,
    critic_update_target,
    critic_value,
    critic_value_backward,
    fit_minibatches,
)
from bcg.learn.critic_worker import CriticWorker, CriticWorkerError
from bcg.learn.discriminator import (
    Discriminator,
    discriminator_apply,
    discriminator_plan,
    discriminator_sgd,
)
from bcg.learn.mlp import rng_from_state, rng_state
from bcg.learn.nan_guard import NanGuard
from bcg.learn.normalizer import ReturnNormalizer, RunningMeanStd
from bcg.learn.td import td_lambda_targets

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


def window_stats(env, w: Window) -> dict[str, float]:
    """The log's window columns (reward, episodes, tracking error, ...) of a rollout ``w``; consumes
    the env's finished episodes. Shared by SHAC and PPO (:mod:`bcg.learn.ppo`)."""
    finished = getattr(env, "finished", [])
    lengths = [f[0] for f in finished]
    returns = [f[1] for f in finished]
    falls = [f[2] for f in finished]
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
        "bcg_trigger_rate": env.bundle_trigger_rate() if hasattr(env, "bundle_trigger_rate") else np.nan,
        "live_fraction": float(np.mean(live)),
        # env-steps in which the legs' spheres overlap (they would strike each other in MuJoCo)
        "leg_overlap_rate": _overlap_rate(w.leg_gap, live),
    }


def discriminator_state(disc: Discriminator, include_replay: bool) -> dict:
    """The discriminator's checkpoint entry, with or without its replay buffer."""
    state = disc.state_dict()
    if not include_replay:
        state.pop("replay")
    return state


def load_discriminator_state(disc: Discriminator, state: dict) -> None:
    """Restore :func:`discriminator_state`; without a stored replay buffer it starts empty."""
    state = dict(state)
    if "replay" not in state:
        state["replay"] = disc.replay.state_dict() | {
            "data": disc.replay.data[:0],
            "size": np.int64(0),
            "head": np.int64(0),
        }
    disc.load_state_dict(state)


def _add_at_boundary(env, k: int, g_obs, g_reward) -> dict[int, np.ndarray]:
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
    env, g_rewards: np.ndarray, g_obs_end: dict[int, np.ndarray], policy_vjp, live: np.ndarray | None = None
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


class Shac:
    """The learner's state and its iteration.

    Args:
        cfg: training config.
        env: environment (see the module docstring).
        disc: ADD discriminator used by the env's reward, or None (no discriminator update).
        rng: draws action noise, critic minibatches and discriminator batches.
        log: ``log(message)`` for NaN-guard reports.
        dump_dir: folder for NaN dumps (None: no dumps).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        env,
        disc: Discriminator | None,
        rng: np.random.Generator,
        log=print,
        dump_dir=None,
    ):
        self.cfg, self.env, self.disc, self.rng = cfg, env, disc, rng
        self.actor = actor_init(cfg.actor, env.obs_dim, env.act_dim, rng)
        self.actor_opt: AdamState = adam_init(self.actor)
        self.critic = critic_init(cfg.critic, env.obs_dim, rng)
        self.obs_rms = RunningMeanStd.new(env.obs_dim, initial_count=cfg.obs_rms_count)
        self.ret_norm = ReturnNormalizer.new(env.num_envs, cfg.gamma)
        self.iteration = 0
        self.guard = NanGuard(cfg.nan_ring_size, dump_dir, log)
        self._log = log
        self._critic_worker: CriticWorker | None = None  # started on the first fit (cfg.critic_worker)
        self._worker_lost = False  # the worker failed: the updates run in this process from then on
        self._blas = None  # threadpoolctl's controller of this process's BLAS (with the worker)
        # the critic fit of the last iteration, taken after the next rollout: (where, keep,
        # critic_fit's arguments), where "worker" or "here"; None when there is none
        self._critic_job: tuple | None = None
        self._critic_info: dict[str, float] = {}  # its diagnostics, for the next iteration's row

    @property
    def _use_worker(self) -> bool:
        return self.cfg.critic_worker and not self._worker_lost

    def _worker(self) -> CriticWorker:
        if self._critic_worker is None:
            self._critic_worker = CriticWorker()
        return self._critic_worker

    def _worker_call(self, call) -> object | None:
        """``call(worker)``; if the worker fails (it exited, or a job raised), log it, stop it and
        return None: the caller runs the update in this process from the inputs it kept (a job that
        raised raises again there, with its own traceback), and so do later iterations."""
        if self._critic_worker is None:
            return None
        try:
            return call(self._critic_worker)
        except CriticWorkerError as exc:
            self._log(f"the update worker failed, updates run in this process from now on: {exc}")
            self._critic_worker.close()
            self._critic_worker, self._worker_lost = None, True
            return None

    def take_critic_fit(self) -> dict[str, float]:
        """Install the last iteration's critic fit and make the Polyak step (waits for the worker).
        Returns the fit's diagnostics ({} when there was none or it was dropped), which the next
        iteration also reports. Called by the iteration after its rollout and by :meth:`state_dict`."""
        job, self._critic_job = self._critic_job, None
        if job is None:
            return {}
        where, keep, args = job
        if not keep:  # its iteration was skipped
            if where == "worker":
                self._worker_call(lambda w: w.result(None))
            return {}
        info = self._worker_call(lambda w: w.result(self.critic)) if where == "worker" else None
        if info is None:
            info = critic_fit(self.critic, *args)
        critic_update_target(self.critic)
        self._critic_info = info
        return info

    # ------------------------------------------------------------------ rollout
    def _normalize(self, rms: RunningMeanStd, obs: np.ndarray) -> np.ndarray:
        """Normalised observations; rows that are not finite become zeros (their env is flagged by
        the rollout, and a non-finite row must not reach the networks' caches)."""
        out = rms.normalize(obs) if self.cfg.obs_normalization else np.asarray(obs, np.float32)
        finite = np.all(np.isfinite(out), axis=1)
        return out if finite.all() else np.where(finite[:, None], out, 0.0).astype(np.float32)

    def rollout(self, rms: RunningMeanStd) -> Window:
        env, h, n = self.env, self.cfg.horizon, self.env.num_envs
        obs, obs_critic = env.begin_window()
        obs_hat, obs_c_hat, caches, raw = [], [self._normalize(rms, obs_critic)], [], []
        rewards, term, trunc, alive, noise, err, delta, age = [], [], [], [], [], [], [], []
        leg_gap = []
        nonfinite = np.zeros(n, bool)
        for k in range(h):
            o_hat = self._normalize(rms, obs)
            eps = self.rng.standard_normal((n, env.act_dim)).astype(np.float32)
            actions, cache = actor_forward(self.cfg.actor, self.actor, o_hat, eps)
            if getattr(env, "wants_mean_actions", False):
                res = env.step(actions, mean_actions=cache["mean_action"])
            else:
                res = env.step(actions)
            qpos = res.info["qpos"] if "qpos" in res.info else env.sim.qpos_now
            qvel = res.info["qvel"] if "qvel" in res.info else env.sim.qvel_now
            self.guard.record(self.iteration, k, qpos, qvel, actions)
            obs_hat.append(o_hat)
            raw.append(obs)
            caches.append(cache)
            noise.append(eps)
            rewards.append(res.reward)
            term.append(res.terminated)
            trunc.append(res.truncated)
            alive.append(res.info.get("alive", np.ones(n, bool)))
            err.append(res.info.get("tracking_error", np.full(n, np.nan)))
            age.append(res.info.get("episode_step", np.full(n, -1, np.int64)))  # -1: not reported
            leg_gap.append(res.info.get("leg_gap", np.full(n, np.nan)))
            if "delta" in res.info:
                delta.append(res.info["delta"])
            bad = res.info.get("nonfinite", np.zeros(n, bool)) | ~np.isfinite(res.reward)
            bad |= ~np.all(np.isfinite(res.obs), axis=1)
            nonfinite |= bad & alive[-1]
            obs, obs_critic = res.obs, res.obs_critic
            obs_c_hat.append(self._normalize(rms, obs_critic))
        env.end_window()
        return Window(
            obs_hat=np.stack(obs_hat),
            obs_critic_hat=np.stack(obs_c_hat),
            caches=caches,
            rewards=np.stack(rewards),
            terminated=np.stack(term),
            truncated=np.stack(trunc),
            alive=np.stack(alive),
            noise=np.stack(noise),
            tracking_error=np.stack(err),
            episode_step=np.stack(age),
            delta=np.stack(delta) if delta else None,
            nonfinite=nonfinite,
            obs_raw=np.stack(raw),
            leg_gap=np.stack(leg_gap),
        )

    # ------------------------------------------------------------------ the iteration
    def _return_scale(self, w: Window) -> float:
        """SHAC's reward scale, read before this window's returns are folded in."""
        if not self.cfg.return_normalization:
            return 1.0
        scale = self.ret_norm.scale()
        rn = self.ret_norm
        for k in range(w.rewards.shape[0]):
            live = w.alive[k]
            rn.returns = np.where(live, rn.returns * rn.gamma + np.where(live, w.rewards[k], 0.0), rn.returns)
            if live.any():
                rn.rms.update(rn.returns[live])
            rn.returns = np.where(live & (w.terminated[k] | w.truncated[k]), 0.0, rn.returns)
        return scale

    def iteration_step(self, update: bool = True) -> dict[str, float]:
        """One SHAC iteration (:meth:`_iteration`). With ``cfg.critic_worker`` this process's BLAS
        runs on one thread meanwhile: the worker's takes every core but the simulator's, and this
        process's own products (the actor's, batch num_envs) on more threads would wait for a core
        the worker holds (measured: the actor's reverse pass 3x slower)."""
        if not self._use_worker:
            return self._iteration(update)
        if self._blas is None:
            self._blas = ThreadpoolController()
        with self._blas.limit(limits=1, user_api="blas"):
            return self._iteration(update)

    def _iteration(self, update: bool) -> dict[str, float]:
        """One SHAC iteration; returns diagnostics (see :data:`bcg.learn.runlog.LOG_COLUMNS`).

        With ``update=False`` (:mod:`bcg.learn.gradcheck`, :mod:`bcg.studies.gradscatter`) it stops after the
        reverse pass and returns ``{"actor_loss", "actor_grads" (unclipped), "actor_grad_norm",
        "action_grads" (dL/da_k per step and environment, (horizon, N, A)), "bcg_trigger_rate"}``
        without touching the actor, critic, discriminator or observation statistics. The window
        itself still changes state: the environments and the random generators advance, the
        iteration counter, the return normaliser and the NaN guard's count move on and the finished
        episodes are consumed; restore everything with :meth:`load_state_dict` to repeat a window.
        """
        cfg, env = self.cfg, self.env
        h, n = cfg.horizon, env.num_envs
        it = self.iteration
        lr_actor = linear_lr(cfg.actor.lr, it, cfg.iterations, cfg.lr_end)
        lr_critic = linear_lr(cfg.critic.lr, it, cfg.iterations, cfg.lr_end)
        times = {}
        if hasattr(env, "action_rate_weight"):
            ramp = cfg.action_rate_ramp
            env.action_rate_weight = cfg.env.action_rate_weight * (min(1.0, it / ramp) if ramp > 0 else 1.0)
        t0 = time.perf_counter()
        rms = self.obs_rms.copy()
        w = self.rollout(rms)
        times["time_rollout"] = time.perf_counter() - t0
        t_take = time.perf_counter()
        self.take_critic_fit()
        critic_info, self._critic_info = self._critic_info, {}
        t_take = time.perf_counter() - t_take
        stats = self._window_stats(w) | {"action_std": float(np.mean(np.exp(self.actor["log_std"])))}
        self.iteration += 1
        if w.nonfinite.any():
            self.guard.trip(it, "non-finite state, observation or reward in the rollout", w.nonfinite)
            env.request_reset(w.nonfinite)
            times["time_critic"] = t_take
            return stats | times | {"skipped": 1.0, "nan_events": float(self.guard.count)}

        # segments: one per env, ending at k_end (first episode end, or the window's last step)
        ended = w.terminated | w.truncated
        k_end = np.where(ended.any(axis=0), np.argmax(ended, axis=0), h - 1)
        envs = np.arange(n)
        bootstrap = ~w.terminated[k_end, envs]
        scale = self._return_scale(w)
        gammas = cfg.gamma ** np.arange(h + 1)
        live = np.arange(h)[:, None] <= k_end[None, :]
        g_rewards = np.where(live, -gammas[:h, None] * scale / (n * h), 0.0)

        # bootstrap values at s_{k_end + 1}
        obs_end = w.obs_critic_hat[k_end + 1, envs]
        v_end, v_cache = critic_value(self.critic, obs_end, target=True)
        d_v = np.where(bootstrap, -gammas[k_end + 1] / (n * h), 0.0).astype(np.float32)
        loss = float(np.sum(g_rewards * np.where(live, w.rewards, 0.0)) + np.sum(d_v * v_end))
        g_obs_end: dict[int, np.ndarray] = {}
        g_boot = critic_value_backward(self.critic, v_cache, d_v)
        g_boot = rms.normalize_grad(g_boot) if cfg.obs_normalization else g_boot
        for k in np.unique(k_end + 1):
            rows = (k_end + 1 == k)[:, None]
            g_obs_end[int(k)] = np.where(rows, g_boot, 0.0)

        # the critic's data: TD(lambda) targets from the target copies (which the reverse pass reads
        # too, and the Polyak step changes only after both), the minibatches drawn now; then the
        # discriminator's draws. With cfg.critic_worker both run in a child process during the
        # reverse pass (the discriminator first: the next rollout needs it)
        t_targets = time.perf_counter()
        disc_plan, disc_in_worker = None, False
        if update:
            obs_next = w.obs_critic_hat[1:].reshape(h * n, -1)
            v_next = critic_value(self.critic, obs_next, target=True)[0].reshape(h, n)
            v_next = np.where(w.terminated, 0.0, v_next)
            r_scaled = np.where(live, w.rewards * scale, 0.0)
            targets = td_lambda_targets(
                r_scaled, np.where(live, v_next, 0.0), ended | ~live, cfg.gamma, cfg.lam
            )
            fit_obs, fit_targets = w.obs_critic_hat[:h][live], targets[live]
            batches = fit_minibatches(cfg.critic, len(fit_targets), self.rng)
            if self._use_worker:
                self._worker()  # started with the first update
            t_plan = time.perf_counter()
            if self.disc is not None and w.delta is not None and cfg.env.imitation_reward != "tracking":
                disc_plan = discriminator_plan(self.disc, w.delta[live], self.rng)
                if self._use_worker:
                    disc_in_worker = self._worker_call(
                        lambda wk: wk.submit_disc(self.disc, disc_plan.batches) or True
                    )
            t_plan = time.perf_counter() - t_plan
            fit_args = (fit_obs, fit_targets, lr_critic, None, batches)
            sent = self._use_worker and self._worker_call(
                lambda wk: wk.submit(self.critic, fit_obs, fit_targets, lr_critic, batches) or True
            )
            self._critic_job = ("worker" if sent else "here", True, fit_args)
        t_targets = time.perf_counter() - t_targets - (t_plan if update else 0.0)

        # reverse pass
        t1 = time.perf_counter()
        grads = None
        per_env_mean_grad = np.zeros((n, env.act_dim))
        step_grads = None if update else np.zeros((h, n, env.act_dim), np.float32)  # dL/da_k per env

        dropped = np.zeros(n, bool)

        def policy_vjp(k, g_a, g_mean=None):
            nonlocal grads
            g_a32 = np.asarray(g_a, np.float32)
            g_m32 = None if g_mean is None else np.asarray(g_mean, np.float32)
            bad = ~np.all(np.isfinite(g_a32), axis=1)
            if g_m32 is not None:
                bad |= ~np.all(np.isfinite(g_m32), axis=1)
            if bad.any() and cfg.drop_nonfinite_env_grads:
                g_a32[bad] = 0.0  # the env's gradient is cut where the simulator's partials broke
                if g_m32 is not None:
                    g_m32[bad] = 0.0
                dropped[:] |= bad
            g_step = g_a32 if g_m32 is None else g_a32 + g_m32
            per_env_mean_grad[:] += g_step
            if step_grads is not None:
                step_grads[k] += g_step
            g, d_obs_hat = actor_backward(self.actor, w.caches[k], g_a32, d_mean=g_m32)
            grads = accumulate_grads(grads, g)
            return rms.normalize_grad(d_obs_hat) if cfg.obs_normalization else d_obs_hat

        window_backward(env, g_rewards, g_obs_end, policy_vjp, live)
        times["time_backward"] = time.perf_counter() - t1
        if not update:
            return {
                "actor_loss": loss,
                "actor_grads": grads,
                "actor_grad_norm": grad_norm(grads),
                "action_grads": step_grads,
                "bcg_trigger_rate": env.bundle_trigger_rate(),
            }
        norm = clip_grad_norm(grads, cfg.actor.grad_clip)
        if not (np.isfinite(loss) and np.isfinite(norm)):
            bad = ~np.all(np.isfinite(per_env_mean_grad), axis=1)
            bad = bad if bad.any() else np.ones(n, bool)
            self.guard.trip(it, f"non-finite actor loss ({loss}) or gradient norm ({norm})", bad)
            env.request_reset(bad)
            # no update this iteration: the discriminator's steps and the critic fit are dropped
            if disc_in_worker:
                self._worker_call(lambda wk: wk.result_disc(None))
            self._critic_job = (self._critic_job[0], False, None)
            times["time_critic"] = t_take
            return stats | times | {"skipped": 1.0, "nan_events": float(self.guard.count), "actor_loss": loss}
        adam_step(self.actor_opt, self.actor, grads, lr_actor, cfg.actor.betas)

        times["time_critic"] = t_targets + t_take

        # discriminator and observation statistics
        t3 = time.perf_counter()
        disc_info = {}
        if disc_plan is not None:
            discriminator_apply(self.disc, disc_plan)
            disc_info = self._worker_call(lambda wk: wk.result_disc(self.disc)) if disc_in_worker else None
            if disc_info is None:
                d = self.disc
                disc_info = discriminator_sgd(d.cfg, d.spec, d.params, d.optimizer, disc_plan.batches)
        elif self.disc is not None and w.delta is not None:  # the tracking reward: only its normaliser
            self.disc.normalizer.update(
                np.asarray(w.delta[live], np.float32).reshape(-1, self.disc.spec.in_dim)
            )
        if cfg.obs_normalization:
            self.obs_rms.update(w.obs_raw[live])
        times["time_disc"] = t_plan + time.perf_counter() - t3
        var = float(np.mean(np.var(per_env_mean_grad * n, axis=0)))
        return (
            stats
            | times
            | {
                "skipped": 0.0,
                "nan_events": float(self.guard.count),
                "actor_loss": loss,
                "actor_grad_norm": norm,
                "critic_grad_norm": critic_info.get("grad_norm", np.nan),
                "critic_loss": critic_info.get("loss_last", np.nan),
                "grad_variance": var,
                "nan_grad_envs": float(dropped.sum()),
                "disc_accuracy": 0.5 * (disc_info["pos_acc"] + disc_info["neg_acc"])
                if "pos_acc" in disc_info
                else np.nan,
                "lr_actor": lr_actor,
            }
        )

    def _window_stats(self, w: Window) -> dict[str, float]:
        return window_stats(self.env, w)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, include_replay: bool = True) -> dict:
        self.take_critic_fit()  # the last iteration's fit belongs to the state
        d = {
            "iteration": np.int64(self.iteration),
            "actor": dict(self.actor),
            "actor_opt": self.actor_opt.state_dict(),
            "critic": self.critic.state_dict(),
            "obs_rms": self.obs_rms.state_dict(),
            "ret_norm": self.ret_norm.state_dict(),
            "rng": rng_state(self.rng),
            "env": self.env.state_dict(),
            "nan_events": np.int64(self.guard.count),
        }
        if self.disc is not None:
            d["disc"] = discriminator_state(self.disc, include_replay)
        return d

    def load_state_dict(self, d: dict) -> None:
        for key, ref in self.actor.items():
            if key not in d["actor"] or d["actor"][key].shape != ref.shape:
                raise ValueError(f"checkpoint actor '{key}' is missing or has another shape")
        self._critic_job, self._critic_info = None, {}  # a fit of the state being replaced
        self._worker_call(lambda w: w.drop_all())
        self.iteration = int(d["iteration"])
        self.actor = {k: np.array(v) for k, v in d["actor"].items()}
        self.actor_opt = AdamState.from_state_dict(d["actor_opt"])
        self.critic.load_state_dict(d["critic"])
        self.obs_rms = RunningMeanStd.from_state_dict(d["obs_rms"])
        self.ret_norm = ReturnNormalizer.from_state_dict(d["ret_norm"])
        self.rng = rng_from_state(d["rng"])
        self.env.load_state_dict(d["env"])
        self.guard.count = int(d.get("nan_events", 0))
        if self.disc is not None and "disc" in d:
            load_discriminator_state(self.disc, d["disc"])
