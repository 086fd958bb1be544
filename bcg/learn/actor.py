"""Gaussian policy: MLP mean, state-independent learned log standard deviation.

    ã = μ_θ(ô) + exp(log_std) ⊙ ε,    ε ~ N(0, I) drawn by the caller (reparameterised sample)
    a = ã                 (default, ``squash=False``)
    a = tanh(ã)           (``squash=True``, SHAC's choice)

The environment receives ``a`` and maps it with ``g1.action_to_target``: q* = q_default + s ⊙ a.

Choice: no tanh by default. The paper's table gives an initial action std of 1.0 together with the
BeyondMimic mapping q* = q_default + 0.25 τmax/k_p · a, which is unbounded in BeyondMimic and mjlab;
a tanh after noise of std 1 would saturate about a third of the samples and shrink their gradients
(SHAC pairs tanh with std e^-1). Torques are clipped to the effort limits by the simulator anyway.
``squash=True`` restores SHAC's behaviour; the choice is a config field and belongs in the policy file.

Parameters are one dict: the MLP's keys (``mlp.py``) plus ``log_std`` (act_dim,), so one Adam state
covers the whole actor. The mean network is MLP [512, 256, 128] with Linear -> LayerNorm -> ELU and
a small output layer (weights ~ U(-0.01, 0.01), bias 0) so the initial mean action is close to 0,
i.e. close to the default pose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcg.learn.adam import PAPER_BETAS
from bcg.learn.mlp import MLPSpec, Params, mlp_backward, mlp_forward, mlp_init


@dataclass(frozen=True)
class ActorConfig:
    """Policy network and its optimiser [paper table unless marked].

    Attributes:
        hidden: mean-network widths.
        log_std_init: initial log σ; log(1.0) = 0 (paper: initial action std 1.0, learned).
        squash: apply tanh after sampling (see module docstring) [R].
        out_init_scale: output-layer weights ~ U(-s, s) [R].
        lr: initial Adam learning rate (decays linearly to 1e-5).
        betas: Adam betas.
        grad_clip: global gradient-norm limit.
        layer_norm: LayerNorm after every hidden Linear (SHAC's actor); PPO's has none (paper table).
    """

    hidden: tuple[int, ...] = (512, 256, 128)
    log_std_init: float = 0.0
    squash: bool = False
    out_init_scale: float = 0.01
    lr: float = 5e-3
    betas: tuple[float, float] = PAPER_BETAS
    grad_clip: float = 1.0
    layer_norm: bool = True


def actor_mlp_spec(cfg: ActorConfig, obs_dim: int, act_dim: int) -> MLPSpec:
    return MLPSpec(obs_dim, cfg.hidden, act_dim, activation="elu", layer_norm=cfg.layer_norm)


def actor_init(
    cfg: ActorConfig, obs_dim: int, act_dim: int, rng: np.random.Generator, dtype=np.float32
) -> Params:
    """New actor parameters: MLP keys plus ``log_std`` (act_dim,)."""
    params = mlp_init(
        actor_mlp_spec(cfg, obs_dim, act_dim), rng, out_init_scale=cfg.out_init_scale, dtype=dtype
    )
    params["log_std"] = np.full(act_dim, cfg.log_std_init, dtype)
    return params


def _split(params: Params) -> tuple[Params, np.ndarray]:
    return {k: v for k, v in params.items() if k != "log_std"}, params["log_std"]


def _spec_of(cfg: ActorConfig, params: Params) -> MLPSpec:
    return actor_mlp_spec(cfg, params["w0"].shape[0], params["log_std"].shape[0])


def actor_forward(
    cfg: ActorConfig, params: Params, obs: np.ndarray, noise: np.ndarray
) -> tuple[np.ndarray, dict]:
    """Sample actions with the given noise.

    Args:
        cfg: actor config (``squash``, widths).
        params: from :func:`actor_init`.
        obs: normalised observations (..., obs_dim).
        noise: ε (..., act_dim); zeros give the deterministic (mean) action.

    Returns:
        actions: (..., act_dim), what the environment receives.
        cache: for :func:`actor_backward`.
    """
    mlp_params, log_std = _split(params)
    mean, mlp_cache = mlp_forward(_spec_of(cfg, params), mlp_params, obs)
    noise = np.asarray(noise, mean.dtype)
    if noise.shape != mean.shape:
        raise ValueError(f"noise shape {noise.shape} != action shape {mean.shape}")
    std_noise = np.exp(log_std) * noise
    actions = mean + std_noise
    if cfg.squash:
        actions = np.tanh(actions)
    mean_action = np.tanh(mean) if cfg.squash else mean
    cache = {"mlp": mlp_cache, "std_noise": std_noise, "actions": actions, "squash": cfg.squash}
    return actions, cache | {"mean_action": mean_action}


def actor_mean(cfg: ActorConfig, params: Params, obs: np.ndarray) -> np.ndarray:
    """Deterministic action (evaluation): μ_θ(ô), through tanh when squashing."""
    mlp_params, _ = _split(params)
    mean, _ = mlp_forward(_spec_of(cfg, params), mlp_params, obs)
    return np.tanh(mean) if cfg.squash else mean


def actor_backward(
    params: Params,
    cache: dict,
    d_actions: np.ndarray,
    need_dobs: bool = True,
    d_mean: np.ndarray | None = None,
) -> tuple[Params, np.ndarray | None]:
    """Reverse pass of :func:`actor_forward`.

    Args:
        params: the parameters used in the forward pass.
        cache: from :func:`actor_forward`.
        d_actions: dL/da (..., act_dim) of the sampled actions.
        need_dobs: also return dL/dô.
        d_mean: dL/d(mean action) (..., act_dim) of terms that use the deterministic action
            (``cache["mean_action"]``) rather than the sample; it does not reach ``log_std``.

    Returns:
        grads: dL/dparams (MLP keys and ``log_std``).
        dobs: dL/dô (..., obs_dim), or None.
    """
    mlp_params, _ = _split(params)
    d_pre = np.asarray(d_actions, cache["actions"].dtype)
    if cache["squash"]:
        d_pre = d_pre * (1 - cache["actions"] ** 2)
    act_dim = d_pre.shape[-1]
    g_log_std = np.sum((d_pre * cache["std_noise"]).reshape(-1, act_dim), axis=0)
    if d_mean is not None:
        d_m = np.asarray(d_mean, d_pre.dtype)
        if cache["squash"]:
            d_m = d_m * (1 - cache["mean_action"] ** 2)
        d_pre = d_pre + d_m
    grads, dobs = mlp_backward(mlp_params, cache["mlp"], d_pre, need_dx=need_dobs)
    grads["log_std"] = g_log_std
    return grads, dobs
