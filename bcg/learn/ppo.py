"""PPO (Schulman et al. 2017) with the ADD reward on the same environment as SHAC, forward only.

The formulas are rsl_rl's (``rsl_rl/algorithms/ppo.py``): GAE(λ) (:mod:`bcg.learn.gae`), the clipped
surrogate and clipped value loss (:mod:`bcg.learn.ppo_loss`), advantages normalised per minibatch, one
Adam over actor and critic with the global gradient norm clipped to 1, and the learning rate adapted
after each minibatch's KL divergence. One iteration (:meth:`Ppo.iteration_step`):

1. Rollout: one window of ``horizon`` control steps of :class:`bcg.learn.env.G1TrackingEnv` on a
   simulator built without gradients (no tape of partials, no reward VJP data). Actions
   a = μ_θ(ô) + σ ⊙ ε; the old log-probabilities, means and values are kept. Episodes reset at
   window boundaries only, as for SHAC: an env whose episode ended inside the window waits, and its
   steps are masked out of GAE and the update.
2. GAE on the critic's values of the noiseless observations; a time-out bootstraps from the
   critic at the final observation, a fall does not.
3. ``epochs`` passes over the window's valid samples in ``minibatches`` minibatches (one shuffle
   for all passes, as rsl_rl's generator); per minibatch: KL(π_old ‖ π) adapts the learning rate,
   then one Adam step on L_surr + c_V L_V - c_H H.
4. The ADD discriminator: the same plan and SGD steps as SHAC's (:mod:`bcg.learn.discriminator`) on
   the window's differentials; then the observation statistics take in the window.

Where we differ from rsl_rl, and why:

- The observation statistics are frozen for a window and updated after the update (SHAC's rule;
  rsl_rl updates them every step and normalises the stored observations anew in the update, so
  its ratio starts off 1). The first window starts from the statistics of its first observation.
- A time-out bootstraps from V(o_k+1), the true final observation (see :mod:`bcg.learn.gae`).
- σ is learned as log σ (the project's actor); rsl_rl learns σ itself.
- The actor's output layer starts small (weights ~ U(-0.01, 0.01)), as SHAC's, so the first
  actions hold the default pose.
"""

from __future__ import annotations

import time

import numpy as np

from bcg.learn.actor import actor_forward, actor_init, actor_mlp_spec
from bcg.learn.adam import AdamState, adam_init, adam_step, clip_grad_norm
from bcg.learn.config import PPOConfig
from bcg.learn.discriminator import (
    Discriminator,
    discriminator_apply,
    discriminator_plan,
    discriminator_sgd,
    discriminator_state,
    load_discriminator_state,
)
from bcg.learn.env_protocol import Env
from bcg.learn.gae import gae
from bcg.learn.mlp import MLPSpec, Params, mlp_backward, mlp_forward, mlp_init, rng_from_state, rng_state
from bcg.learn.nan_guard import NanGuard
from bcg.learn.normalizer import RunningMeanStd
from bcg.learn.ppo_loss import (
    adaptive_lr,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
    normalize_advantages,
    surrogate_loss,
    value_loss,
)
from bcg.learn.window import Window, window_stats

VALUE_CHUNK = 16384  # rows per critic evaluation of a window (bounds the activations' memory)


def critic_spec(cfg: PPOConfig, obs_dim: int) -> MLPSpec:
    """PPO's value network: ELU, no LayerNorm, one output."""
    return MLPSpec(obs_dim, cfg.critic_hidden, 1, activation="elu", layer_norm=False)


def _joint(actor: Params, critic: Params) -> Params:
    """One parameter dict over both networks (the same arrays), for the one Adam."""
    return {f"actor.{k}": v for k, v in actor.items()} | {f"critic.{k}": v for k, v in critic.items()}


class Ppo:
    """The learner's state and its iteration (the interface :mod:`bcg.learn.train` drives, as
    :class:`bcg.learn.shac.Shac`'s: ``iteration``, ``actor``, ``obs_rms``, ``env``,
    ``iteration_step()``, ``state_dict()``, ``load_state_dict()``).

    Args:
        cfg: PPO config.
        env: the environment, on a simulator built with ``requires_grad=False``.
        disc: ADD discriminator the env's reward reads, or None (no discriminator update).
        rng: draws action noise, minibatches and discriminator batches.
        log: ``log(message)`` for NaN-guard reports.
        dump_dir: folder for NaN dumps (None: no dumps).
    """

    def __init__(self, cfg: PPOConfig, env: Env, disc: Discriminator | None, rng: np.random.Generator,
                 log=print, dump_dir=None):  # fmt: skip
        self.cfg, self.env, self.disc, self.rng = cfg, env, disc, rng
        self.actor = actor_init(cfg.actor, env.obs_dim, env.act_dim, rng)
        self.critic_spec = critic_spec(cfg, env.obs_dim)
        self.critic = mlp_init(self.critic_spec, rng)
        self.optimizer: AdamState = adam_init(_joint(self.actor, self.critic))
        self.lr = float(cfg.lr)
        self.obs_rms = RunningMeanStd.new(env.obs_dim)
        self.iteration = 0
        self.guard = NanGuard(cfg.nan_ring_size, dump_dir, log)

    # ------------------------------------------------------------------ rollout
    def _normalize(self, obs: np.ndarray) -> np.ndarray:
        """Normalised observations; non-finite rows become zeros (their env is flagged)."""
        out = self.obs_rms.normalize(obs) if self.cfg.obs_normalization else np.asarray(obs, np.float32)
        finite = np.all(np.isfinite(out), axis=1)
        return out if finite.all() else np.where(finite[:, None], out, 0.0).astype(np.float32)

    def values(self, obs_hat: np.ndarray) -> np.ndarray:
        """V(ô) (...,) of normalised observations (..., D), in chunks."""
        flat = obs_hat.reshape(-1, obs_hat.shape[-1])
        out = np.concatenate(
            [mlp_forward(self.critic_spec, self.critic, flat[i : i + VALUE_CHUNK])[0][:, 0]
             for i in range(0, len(flat), VALUE_CHUNK)]
        )  # fmt: skip
        return out.reshape(obs_hat.shape[:-1])

    def rollout(self) -> tuple[Window, dict[str, np.ndarray]]:
        """One window of the current policy; returns it and the samples' old log-probabilities
        ``log_prob`` (h, N), means ``mean`` (h, N, A) and actions ``actions`` (h, N, A)."""
        env, cfg, h, n = self.env, self.cfg, self.cfg.horizon, self.env.num_envs
        obs, obs_critic = env.begin_window()
        if cfg.obs_normalization and self.obs_rms.count == 0:
            self.obs_rms.update(obs)  # the first window is normalised by its first observation
        log_std = self.actor["log_std"].astype(np.float64)
        # filled in place: at 4096 envs a window's observations take 0.3 GB each
        obs_hat = np.empty((h, n, env.obs_dim), np.float32)
        obs_c_hat = np.empty((h + 1, n, env.obs_dim), np.float32)
        raw = np.empty((h, n, env.obs_dim), np.float32)
        obs_c_hat[0] = self._normalize(obs_critic)
        actions_all, means, log_probs = [], [], []
        rewards, term, trunc, alive, noise, err, delta, age, leg_gap = ([] for _ in range(9))
        nonfinite = np.zeros(n, bool)
        for k in range(h):
            o_hat = self._normalize(obs)
            eps = self.rng.standard_normal((n, env.act_dim)).astype(np.float32)
            actions, cache = actor_forward(cfg.actor, self.actor, o_hat, eps)
            mean64 = cache["mean_action"].astype(np.float64)
            log_probs.append(gaussian_log_prob(actions.astype(np.float64), mean64, log_std)[0])
            if getattr(env, "wants_mean_actions", False):
                res = env.step(actions, mean_actions=cache["mean_action"])
            else:
                res = env.step(actions)
            self.guard.record(self.iteration, k, res.info.get("qpos", env.sim.qpos_now),
                              res.info.get("qvel", env.sim.qvel_now), actions)  # fmt: skip
            obs_hat[k], raw[k] = o_hat, obs
            actions_all.append(actions)
            means.append(cache["mean_action"])
            noise.append(eps)
            rewards.append(res.reward)
            term.append(res.terminated)
            trunc.append(res.truncated)
            alive.append(res.info.get("alive", np.ones(n, bool)))
            err.append(res.info.get("tracking_error", np.full(n, np.nan)))
            age.append(res.info.get("episode_step", np.full(n, -1, np.int64)))
            leg_gap.append(res.info.get("leg_gap", np.full(n, np.nan)))
            if "delta" in res.info:
                delta.append(np.asarray(res.info["delta"], np.float32))
            bad = res.info.get("nonfinite", np.zeros(n, bool)) | ~np.isfinite(res.reward)
            bad |= ~np.all(np.isfinite(res.obs), axis=1)
            nonfinite |= bad & alive[-1]
            obs, obs_critic = res.obs, res.obs_critic
            obs_c_hat[k + 1] = self._normalize(obs_critic)
        env.end_window()
        w = Window(
            obs_hat=obs_hat,
            obs_critic_hat=obs_c_hat,
            caches=[],
            rewards=np.stack(rewards),
            terminated=np.stack(term),
            truncated=np.stack(trunc),
            alive=np.stack(alive),
            noise=np.stack(noise),
            tracking_error=np.stack(err),
            episode_step=np.stack(age),
            delta=np.stack(delta) if delta else None,
            nonfinite=nonfinite,
            obs_raw=raw,
            leg_gap=np.stack(leg_gap),
        )
        old = {"log_prob": np.stack(log_probs), "mean": np.stack(means), "actions": np.stack(actions_all)}
        return w, old

    # ------------------------------------------------------------------ the iteration
    def iteration_step(self) -> dict[str, float]:
        """One PPO iteration; returns the log row's values (see :data:`bcg.learn.runlog.LOG_COLUMNS`)."""
        cfg, env = self.cfg, self.env
        h = cfg.horizon
        it = self.iteration
        t0 = time.perf_counter()
        w, old = self.rollout()
        times = {"time_rollout": time.perf_counter() - t0}
        stats = window_stats(env, w) | {"action_std": float(np.mean(np.exp(self.actor["log_std"])))}
        self.iteration += 1
        if w.nonfinite.any():
            self.guard.trip(it, "non-finite state, observation or reward in the rollout", w.nonfinite)
            env.request_reset(w.nonfinite)
            return stats | times | {"skipped": 1.0, "nan_events": float(self.guard.count)}

        t1 = time.perf_counter()
        valid = w.alive
        v_all = self.values(w.obs_critic_hat)  # (h + 1, N)
        advantages, returns = gae(
            np.where(valid, w.rewards, 0.0), v_all[:h], v_all[1:], w.terminated, w.truncated, valid,
            cfg.gamma, cfg.lam,
        )  # fmt: skip
        update = self._update(w, old, valid, v_all[:h], advantages, returns)
        times["time_update"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        disc_info = {}
        if self.disc is not None and w.delta is not None:
            deltas = w.delta[valid]
            if cfg.env.imitation_reward != "tracking":
                plan = discriminator_plan(self.disc, deltas, self.rng)
                discriminator_apply(self.disc, plan)
                d = self.disc
                disc_info = discriminator_sgd(d.cfg, d.spec, d.params, d.optimizer, plan.batches)
            else:  # the tracking reward: only its normaliser
                self.disc.normalizer.update(deltas.reshape(-1, self.disc.spec.in_dim))
        if cfg.obs_normalization:
            self.obs_rms.update(w.obs_raw[valid])
        times["time_disc"] = time.perf_counter() - t2
        accuracy = 0.5 * (disc_info["pos_acc"] + disc_info["neg_acc"]) if "pos_acc" in disc_info else np.nan
        return (
            stats
            | times
            | update
            | {
                "skipped": 0.0,
                "nan_events": float(self.guard.count),
                "disc_accuracy": accuracy,
                "lr_actor": self.lr,
            }
        )

    def _update(self, w: Window, old: dict, valid, values_old, advantages, returns) -> dict[str, float]:
        """``epochs`` passes of minibatch Adam over the window's valid samples."""
        cfg = self.cfg
        rows = np.flatnonzero(valid.reshape(-1))
        d = w.obs_hat.shape[-1]
        obs = w.obs_hat.reshape(-1, d)
        obs_critic = w.obs_critic_hat[:-1].reshape(-1, d)
        actions = old["actions"].reshape(len(obs), -1).astype(np.float64)
        mean_old = old["mean"].reshape(len(obs), -1).astype(np.float64)
        log_prob_old = old["log_prob"].reshape(-1)
        values_old, advantages, returns = (a.reshape(-1) for a in (values_old, advantages, returns))
        std_old = np.exp(self.actor["log_std"].astype(np.float64))
        spec = actor_mlp_spec(cfg.actor, d, actions.shape[1])
        batches = np.array_split(self.rng.permutation(len(rows)), cfg.minibatches)
        sums = {
            "actor_loss": 0.0,
            "critic_loss": 0.0,
            "actor_grad_norm": 0.0,
            "kl": 0.0,
            "clip_fraction": 0.0,
        }
        steps = 0
        for _ in range(cfg.epochs):
            for batch in batches:
                if len(batch) < 2:
                    continue
                idx = rows[batch]
                mlp_params = {k: v for k, v in self.actor.items() if k != "log_std"}
                mean, cache = mlp_forward(spec, mlp_params, obs[idx])
                mean64 = mean.astype(np.float64)
                log_std = self.actor["log_std"].astype(np.float64)
                kl = float(np.mean(gaussian_kl(mean_old[idx], std_old, mean64, np.exp(log_std))))
                if cfg.desired_kl is not None:
                    self.lr = adaptive_lr(self.lr, kl, cfg.desired_kl, cfg.lr_min, cfg.lr_max)
                log_prob, d_mean_lp, d_log_std_lp = gaussian_log_prob(actions[idx], mean64, log_std)
                adv = normalize_advantages(advantages[idx])
                surrogate, d_log_prob, clipped = surrogate_loss(log_prob, log_prob_old[idx], adv, cfg.clip)
                v, v_cache = mlp_forward(self.critic_spec, self.critic, obs_critic[idx])
                clip_v = cfg.clip if cfg.clipped_value_loss else None
                v_loss, d_v = value_loss(v[:, 0].astype(np.float64), values_old[idx], returns[idx], clip_v)
                g_actor, _ = mlp_backward(mlp_params, cache, d_log_prob[:, None] * d_mean_lp, need_dx=False)
                g_log_std = np.sum(d_log_prob[:, None] * d_log_std_lp, axis=0) - cfg.entropy_coef
                g_actor["log_std"] = g_log_std.astype(self.actor["log_std"].dtype)
                g_critic, _ = mlp_backward(self.critic, v_cache, cfg.value_coef * d_v[:, None], need_dx=False)
                grads = _joint(g_actor, g_critic)
                norm = clip_grad_norm(grads, cfg.max_grad_norm)
                if np.isfinite(norm):
                    adam_step(
                        self.optimizer, _joint(self.actor, self.critic), grads, self.lr, cfg.actor.betas
                    )
                values = (surrogate, v_loss, norm, kl, clipped)
                for key, value in zip(sums, values, strict=True):
                    sums[key] += value
                steps += 1
        out = {k: v / max(steps, 1) for k, v in sums.items()}
        out["entropy"] = gaussian_entropy(self.actor["log_std"].astype(np.float64))
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, include_replay: bool = True) -> dict:
        d = {
            "iteration": np.int64(self.iteration),
            "actor": dict(self.actor),
            "critic": dict(self.critic),
            "optimizer": self.optimizer.state_dict(),
            "lr": np.float64(self.lr),
            "obs_rms": self.obs_rms.state_dict(),
            "rng": rng_state(self.rng),
            "env": self.env.state_dict(),
            "nan_events": np.int64(self.guard.count),
        }
        if self.disc is not None:
            d["disc"] = discriminator_state(self.disc, include_replay)
        return d

    def load_state_dict(self, d: dict) -> None:
        for name, ref in (("actor", self.actor), ("critic", self.critic)):
            for key, value in ref.items():
                if key not in d[name] or np.shape(d[name][key]) != value.shape:
                    raise ValueError(f"checkpoint {name} '{key}' is missing or has another shape")
        self.iteration = int(d["iteration"])
        self.actor = {k: np.array(v) for k, v in d["actor"].items()}
        self.critic = {k: np.array(v) for k, v in d["critic"].items()}
        self.optimizer = AdamState.from_state_dict(d["optimizer"])
        self.lr = float(d["lr"])
        self.obs_rms = RunningMeanStd.from_state_dict(d["obs_rms"])
        self.rng = rng_from_state(d["rng"])
        self.env.load_state_dict(d["env"])
        self.guard.count = int(d.get("nan_events", 0))
        if self.disc is not None and "disc" in d:
            load_discriminator_state(self.disc, d["disc"])
