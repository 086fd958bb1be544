"""SHAC (Xu et al. 2022) on the differentiable simulator, with the ADD discriminator update.

One iteration (:meth:`Shac._iteration`, built from the functions of :mod:`bcg.learn.shac_loss`):

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
   (:mod:`bcg.learn.shac_updates`), and either way the numbers are those of a fit right after the
   reverse pass. The row of an iteration reports the fit of the iteration before it.
6. Discriminator: two epochs of SGD on the window's differentials and the replay buffer, drawn
   before the reverse pass (with ``cfg.critic_worker`` they run in the worker during it).

A non-finite state, reward, loss or gradient skips every update of the iteration and resets the
affected envs (:mod:`bcg.learn.nan_guard`).

The environment interface: :class:`bcg.learn.env_protocol.DifferentiableEnv`
(:class:`bcg.learn.env.G1TrackingEnv` is the real one).
"""

from __future__ import annotations

import numpy as np

from bcg.learn.actor import actor_forward, actor_init
from bcg.learn.adam import AdamState, adam_init, adam_step, clip_grad_norm, grad_norm, linear_lr
from bcg.learn.config import TrainConfig
from bcg.learn.critic import critic_init, critic_value, critic_value_backward, fit_minibatches
from bcg.learn.discriminator import (
    Discriminator,
    DiscriminatorPlan,
    discriminator_apply,
    discriminator_plan,
    discriminator_state,
    load_discriminator_state,
)
from bcg.learn.env_protocol import DifferentiableEnv
from bcg.learn.mlp import rng_from_state, rng_state
from bcg.learn.nan_guard import NanGuard
from bcg.learn.normalizer import ReturnNormalizer, RunningMeanStd
from bcg.learn.shac_loss import (
    ActorGradient,
    Segments,
    actor_loss,
    actor_loss_seeds,
    bootstrap_obs_grads,
    critic_targets,
    return_scale,
    segments,
)
from bcg.learn.shac_updates import ShacUpdates
from bcg.learn.stages import config_at, set_env_config
from bcg.learn.stopwatch import Stopwatch
from bcg.learn.window import Window, window_backward, window_stats


def time_columns(seconds: dict[str, float], kept: bool) -> dict[str, float]:
    """The log's time columns from an iteration's :class:`~bcg.learn.stopwatch.Stopwatch` parts.

    ``time_critic`` is the take of the last fit plus, when the update is kept, this iteration's
    targets and the fit's dispatch; ``time_disc`` (kept updates only) the discriminator's draws and
    steps and the observation statistics. A skipped iteration reports what it ran of the rest.
    """
    out = {"time_rollout": seconds["rollout"], "time_critic": seconds["take"]}
    if "backward" in seconds:
        out["time_backward"] = seconds["backward"]
    if kept:
        out["time_critic"] = seconds["targets"] + seconds["take"]
        out["time_disc"] = seconds["plan"] + seconds["disc"]
    return out


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
        env: DifferentiableEnv,
        disc: Discriminator | None,
        rng: np.random.Generator,
        log=print,
        dump_dir=None,
    ):
        self.cfg, self.env, self.disc, self.rng = cfg, env, disc, rng
        self.log = log
        self.actor = actor_init(cfg.actor, env.obs_dim, env.act_dim, rng)
        self.actor_opt: AdamState = adam_init(self.actor)
        self.critic = critic_init(cfg.critic, env.obs_dim, rng)
        self.obs_rms = RunningMeanStd.new(env.obs_dim, initial_count=cfg.obs_rms_count)
        self.ret_norm = ReturnNormalizer.new(env.num_envs, cfg.gamma)
        self.iteration = 0
        self.guard = NanGuard(cfg.nan_ring_size, dump_dir, log)
        self.updates = ShacUpdates(cfg.critic_worker, log)

    @property
    def _critic_worker(self):
        """The update worker process, or None (read by the tests)."""
        return self.updates.worker

    @property
    def _critic_job(self) -> tuple | None:
        """The critic fit not taken yet (:attr:`ShacUpdates.critic_job`; read by the tests)."""
        return self.updates.critic_job

    def take_critic_fit(self) -> dict[str, float]:
        """Install the last iteration's critic fit and make the Polyak step (waits for the worker).
        Returns the fit's diagnostics ({} when there was none or it was dropped), which the next
        iteration also reports. Called by the iteration after its rollout and by :meth:`state_dict`."""
        return self.updates.take_critic_fit(self.critic)

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
    def iteration_step(self, update: bool = True) -> dict[str, float]:
        """One SHAC iteration (:meth:`_iteration`), with this process's BLAS threads limited while the
        update worker runs (:meth:`bcg.learn.shac_updates.ShacUpdates.threads`)."""
        with self.updates.threads():
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
        cfg, it, clock = self.cfg, self.iteration, Stopwatch()
        self._enter_stage(it)
        self._ramp_action_rate(it)
        rms = self.obs_rms.copy()  # frozen for the window
        with clock("rollout"):
            w = self.rollout(rms)
        with clock("take"):
            self.take_critic_fit()  # the last iteration's, before the bootstrap values read the critic
        critic_info = self.updates.pop_critic_info()
        stats = self._window_stats(w) | {"action_std": float(np.mean(np.exp(self.actor["log_std"])))}
        self.iteration += 1
        if w.nonfinite.any():
            reason = "non-finite state, observation or reward in the rollout"
            return stats | time_columns(clock.seconds, False) | self._skip(it, reason, w.nonfinite)

        seg = segments(w.terminated, w.truncated)
        scale = self._return_scale(w, seg)
        loss, g_rewards, g_obs_end = self._actor_loss(w, seg, scale, rms)
        disc_plan = self._start_updates(it, w, seg, scale, clock) if update else None
        with clock("backward"):
            grad = ActorGradient(
                self.actor, w.caches, rms if cfg.obs_normalization else None,
                w.noise.shape, cfg.drop_nonfinite_env_grads, per_step=not update,
            )  # fmt: skip
            window_backward(self.env, g_rewards, g_obs_end, grad, seg.live)
        if not update:
            return self._gradient_report(loss, grad)
        norm = clip_grad_norm(grad.grads, cfg.actor.grad_clip)
        if not (np.isfinite(loss) and np.isfinite(norm)):
            reason = f"non-finite actor loss ({loss}) or gradient norm ({norm})"
            skipped = self._skip(it, reason, grad.nonfinite_envs())
            self.updates.drop()  # the discriminator's steps and the critic fit
            return stats | time_columns(clock.seconds, False) | skipped | {"actor_loss": loss}
        lr_actor = linear_lr(cfg.actor.lr, it, cfg.iterations, cfg.lr_end)
        adam_step(self.actor_opt, self.actor, grad.grads, lr_actor, cfg.actor.betas)
        with clock("disc"):
            disc_info = self._finish_updates(w, seg, disc_plan)
        columns = self._update_columns(loss, norm, grad, critic_info, disc_info, lr_actor)
        return stats | time_columns(clock.seconds, True) | columns

    def _enter_stage(self, it: int) -> None:
        """The env's settings for iteration ``it`` (``cfg.env_stages``; also right after a resume)."""
        if not self.cfg.env_stages:
            return
        changed = set_env_config(self.env, config_at(self.cfg, it).env)
        if changed:
            self.log(f"iteration {it + 1} on: " + ", ".join(f"env.{k}={v}" for k, v in changed.items()))

    def _ramp_action_rate(self, it: int) -> None:
        """The env's action-rate weight at iteration ``it`` (``cfg.action_rate_ramp``)."""
        if hasattr(self.env, "action_rate_weight"):
            ramp, weight = self.cfg.action_rate_ramp, self.cfg.env.action_rate_weight
            self.env.action_rate_weight = weight * (min(1.0, it / ramp) if ramp > 0 else 1.0)

    def _skip(self, it: int, reason: str, bad: np.ndarray) -> dict[str, float]:
        """A non-finite event: every update of the iteration is skipped and the ``bad`` envs (N,)
        reset; returns the row's columns for it."""
        self.guard.trip(it, reason, bad)
        self.env.request_reset(bad)
        return {"skipped": 1.0, "nan_events": float(self.guard.count)}

    def _gradient_report(self, loss: float, grad: ActorGradient) -> dict:
        """What an iteration without updates returns (see :meth:`_iteration`)."""
        return {
            "actor_loss": loss,
            "actor_grads": grad.grads,
            "actor_grad_norm": grad_norm(grad.grads),
            "action_grads": grad.step_grads,
            "bcg_trigger_rate": self.env.bundle_trigger_rate(),
        }

    def _update_columns(
        self,
        loss: float,
        norm: float,
        grad: ActorGradient,
        critic_info: dict[str, float],
        disc_info: dict[str, float],
        lr_actor: float,
    ) -> dict[str, float]:
        """The log's columns of a kept update; the critic's are those of the last iteration's fit
        (NaN without one)."""
        return {
            "skipped": 0.0,
            "nan_events": float(self.guard.count),
            "actor_loss": loss,
            "actor_grad_norm": norm,
            "critic_grad_norm": critic_info.get("grad_norm", np.nan),
            "critic_loss": critic_info.get("loss_last", np.nan),
            "grad_variance": grad.variance(),
            "nan_grad_envs": float(grad.dropped.sum()),
            "disc_accuracy": 0.5 * (disc_info["pos_acc"] + disc_info["neg_acc"])
            if "pos_acc" in disc_info
            else np.nan,
            "lr_actor": lr_actor,
        }

    def _return_scale(self, w: Window, seg: Segments) -> float:
        """SHAC's reward scale (1 without ``cfg.return_normalization``)."""
        if not self.cfg.return_normalization:
            return 1.0
        return return_scale(self.ret_norm, w.rewards, w.alive, seg.ended)

    def _actor_loss(
        self, w: Window, seg: Segments, scale: float, rms: RunningMeanStd
    ) -> tuple[float, np.ndarray, dict[int, np.ndarray]]:
        """L, dL/dr_k (h, N), and {k: dL/do_k (N, D) raw} of the bootstrap values V̄(o_{k_end+1})."""
        g_rewards, d_v = actor_loss_seeds(seg, self.cfg.gamma, scale)
        obs_end = w.obs_critic_hat[seg.end + 1, np.arange(len(seg.end))]
        v_end, v_cache = critic_value(self.critic, obs_end, target=True)
        loss = actor_loss(w.rewards, v_end, g_rewards, d_v, seg.live)
        g_boot = critic_value_backward(self.critic, v_cache, d_v)
        g_boot = rms.normalize_grad(g_boot) if self.cfg.obs_normalization else g_boot
        return loss, g_rewards, bootstrap_obs_grads(g_boot, seg.end)

    def _start_updates(
        self, it: int, w: Window, seg: Segments, scale: float, clock: Stopwatch
    ) -> DiscriminatorPlan | None:
        """The critic's data and the discriminator's draws, made before the reverse pass and sent to
        the update worker (the discriminator first: the next rollout needs it). The TD(λ) targets
        come from the target copies, which the reverse pass reads too and the Polyak step changes
        only after both. Returns the discriminator's plan (None without a discriminator update)."""
        cfg, h, n = self.cfg, *w.rewards.shape
        with clock("targets"):
            obs_next = w.obs_critic_hat[1:].reshape(h * n, -1)
            v_next = critic_value(self.critic, obs_next, target=True)[0].reshape(h, n)
            targets = critic_targets(w.rewards, v_next, w.terminated, seg, scale, cfg.gamma, cfg.lam)
            fit_obs, fit_targets = w.obs_critic_hat[:h][seg.live], targets[seg.live]
            batches = fit_minibatches(cfg.critic, len(fit_targets), self.rng)
            self.updates.start_worker()
        plan = None
        with clock("plan"):
            if self.disc is not None and w.delta is not None and cfg.env.imitation_reward != "tracking":
                plan = discriminator_plan(self.disc, w.delta[seg.live], self.rng)
                self.updates.submit_disc(self.disc, plan)
        with clock("targets"):
            lr_critic = linear_lr(cfg.critic.lr, it, cfg.iterations, cfg.lr_end)
            self.updates.submit_critic_fit(self.critic, fit_obs, fit_targets, lr_critic, batches)
        return plan

    def _finish_updates(self, w: Window, seg: Segments, plan: DiscriminatorPlan | None) -> dict[str, float]:
        """The discriminator's steps (or, with the tracking reward, its normaliser alone) and the
        observation statistics take in the window; returns the discriminator's diagnostics."""
        info = {}
        if plan is not None:
            discriminator_apply(self.disc, plan)
            info = self.updates.finish_disc(self.disc, plan)
        elif self.disc is not None and w.delta is not None:
            delta = np.asarray(w.delta[seg.live], np.float32)
            self.disc.normalizer.update(delta.reshape(-1, self.disc.spec.in_dim))
        if self.cfg.obs_normalization:
            self.obs_rms.update(w.obs_raw[seg.live])
        return info

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
        self.updates.forget()  # the updates of the state being replaced
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
