"""Ensemble value function for SHAC: members, target copies, fitting, bootstrap values.

Each of the ``ensemble_size`` members is an MLP [256, 256] (Linear -> LayerNorm -> ELU) with one
output, fitted independently (own Adam state, own gradient clipping) to the same TD(λ) targets on the
same minibatches; the members differ through their initialisation. Bootstrap values come from the
target copies, aggregated by the minimum over members (or the mean) [R].

Target update (Polyak): θ' <- α θ' + (1 - α) θ with α = 0.9, once per SHAC epoch. The paper is
silent. DiffRL's humanoids use 0.995, which leaves the bootstrap values about 200 iterations behind
the fit; 0.9 lengthens the learning benchmark's episodes faster (docs/learning.md#the-learning-benchmark).

The bootstrap value enters the actor loss (γ^k V̄(s_end)), so :func:`critic_value_backward` returns
dL/dô through the aggregated target value; with ``min`` the gradient goes to the selected member.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcg.learn.adam import PAPER_BETAS, AdamState, adam_init, adam_step, clip_grad_norm
from bcg.learn.mlp import MLPSpec, Params, copy_params, mlp_backward, mlp_forward, mlp_init, polyak_update

AGGREGATES = ("min", "mean")


@dataclass(frozen=True)
class CriticConfig:
    """Value ensemble and its fitting [paper table unless marked].

    Attributes:
        hidden: member widths.
        ensemble_size: members.
        aggregate: ``"min"`` or ``"mean"`` over the target members for bootstrapping [R].
        lr: initial Adam learning rate (decays linearly to 1e-5).
        betas: Adam betas.
        iterations: passes over the window's data per epoch.
        minibatches: minibatches per pass.
        grad_clip: global gradient-norm limit per member.
        polyak: target smoothing α [R: between DiffRL's humanoid 0.995 and hopper/cheetah 0.2;
            measured on the learning benchmark].
    """

    hidden: tuple[int, ...] = (256, 256)
    ensemble_size: int = 3
    aggregate: str = "min"
    lr: float = 2e-3
    betas: tuple[float, float] = PAPER_BETAS
    iterations: int = 16
    minibatches: int = 4
    grad_clip: float = 10.0
    polyak: float = 0.9

    def __post_init__(self):
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        if self.ensemble_size < 1 or self.iterations < 1 or self.minibatches < 1:
            raise ValueError(f"ensemble_size, iterations and minibatches must be positive: {self}")
        if not 0.0 <= self.polyak < 1.0:
            # 1 would freeze the targets at their initial weights, and outside [0, 1] they diverge
            raise ValueError(f"polyak must lie in [0, 1), got {self.polyak!r}")


@dataclass
class Critic:
    """Members, their target copies and their optimiser states (lists of length ensemble_size)."""

    cfg: CriticConfig
    spec: MLPSpec
    members: list[Params]
    targets: list[Params]
    optimizers: list[AdamState]

    def state_dict(self) -> dict:
        n = range(len(self.members))
        return {
            "members": {str(i): self.members[i] for i in n},
            "targets": {str(i): self.targets[i] for i in n},
            "optimizers": {str(i): self.optimizers[i].state_dict() for i in n},
        }

    def load_state_dict(self, d: dict) -> None:
        """Replace all arrays with the stored ones (shapes must match this critic's)."""
        n = len(self.members)
        if len(d["members"]) != n:
            raise ValueError(f"stored ensemble has {len(d['members'])} members, this critic {n}")
        for i in range(n):
            for key, ref in self.members[i].items():
                if d["members"][str(i)][key].shape != ref.shape:
                    raise ValueError(
                        f"member {i} '{key}': stored {d['members'][str(i)][key].shape} != {ref.shape}"
                    )
        self.members = [{k: np.array(v) for k, v in d["members"][str(i)].items()} for i in range(n)]
        self.targets = [{k: np.array(v) for k, v in d["targets"][str(i)].items()} for i in range(n)]
        self.optimizers = [AdamState.from_state_dict(d["optimizers"][str(i)]) for i in range(n)]


def critic_init(cfg: CriticConfig, obs_dim: int, rng: np.random.Generator, dtype=np.float32) -> Critic:
    """New ensemble; targets start as exact copies."""
    spec = MLPSpec(obs_dim, cfg.hidden, 1, activation="elu", layer_norm=True)
    members = [mlp_init(spec, rng, dtype=dtype) for _ in range(cfg.ensemble_size)]
    return Critic(cfg, spec, members, [copy_params(p) for p in members], [adam_init(p) for p in members])


def critic_member_values(critic: Critic, obs: np.ndarray, target: bool = False) -> np.ndarray:
    """Every member's value, (ensemble_size, ...) for obs (..., obs_dim)."""
    nets = critic.targets if target else critic.members
    return np.stack([mlp_forward(critic.spec, p, obs)[0][..., 0] for p in nets])


def critic_value(critic: Critic, obs: np.ndarray, target: bool = True) -> tuple[np.ndarray, dict]:
    """Aggregated value (...,) of obs (..., obs_dim) and a cache for :func:`critic_value_backward`."""
    nets = critic.targets if target else critic.members
    outs = [mlp_forward(critic.spec, p, obs) for p in nets]
    values = np.stack([y[..., 0] for y, _ in outs])
    if critic.cfg.aggregate == "min":
        choice = np.argmin(values, axis=0)
        value = np.take_along_axis(values, choice[None], axis=0)[0]
    else:
        choice = None
        value = values.mean(axis=0)
    return value, {"nets": nets, "caches": [c for _, c in outs], "choice": choice}


def critic_value_backward(critic: Critic, cache: dict, d_value: np.ndarray) -> np.ndarray:
    """dL/dô (..., obs_dim) from dL/dV (...,) through :func:`critic_value` (parameters are fixed)."""
    d_value = np.asarray(d_value)
    m = len(cache["nets"])
    dobs = None
    for i, (params, c) in enumerate(zip(cache["nets"], cache["caches"], strict=True)):
        if cache["choice"] is None:
            dv = d_value / m
        else:
            dv = np.where(cache["choice"] == i, d_value, 0)
        _, dx = mlp_backward(params, c, dv[..., None], need_dx=True)
        dobs = dx if dobs is None else dobs + dx
    return dobs


def fit_minibatches(cfg: CriticConfig, n: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """The sample indices of every minibatch of a fit: ``cfg.iterations`` passes, each a fresh
    permutation of the ``n`` samples split into ``cfg.minibatches`` parts (sizes differ by at most
    one). Drawn in the order :func:`critic_fit` draws them itself."""
    if n < cfg.minibatches:
        raise ValueError(f"need at least {cfg.minibatches} samples, got {n}")
    return [np.array_split(rng.permutation(n), cfg.minibatches) for _ in range(cfg.iterations)]


def critic_fit(
    critic: Critic,
    obs: np.ndarray,
    targets: np.ndarray,
    lr: float,
    rng: np.random.Generator | None = None,
    batches: list[list[np.ndarray]] | None = None,
) -> dict[str, float]:
    """Fit every member to ``targets`` by minibatch Adam on the mean squared error.

    ``cfg.iterations`` passes; each pass reshuffles the samples and splits them into
    ``cfg.minibatches`` minibatches (sizes differ by at most one).

    Args:
        critic: updated in place (members and optimisers; not the targets).
        obs: normalised observations (n, obs_dim) or (h, num_envs, obs_dim).
        targets: TD(λ) targets, same leading shape as ``obs``.
        lr: learning rate for this epoch.
        rng: draws the shuffles, or
        batches: the minibatches' indices drawn beforehand (:func:`fit_minibatches`).

    Returns:
        ``loss_first`` / ``loss_last``: mean over members of the minibatch MSE averaged over the
        first / last pass; ``grad_norm``: mean pre-clip gradient norm of the last pass.
    """
    cfg = critic.cfg
    obs = np.asarray(obs).reshape(-1, critic.spec.in_dim)
    y = np.asarray(targets).reshape(-1)
    if y.shape[0] != obs.shape[0]:
        raise ValueError(f"{obs.shape[0]} observations but {y.shape[0]} targets")
    n = obs.shape[0]
    if batches is None:
        if rng is None:
            raise ValueError("critic_fit needs rng or batches")
        batches = fit_minibatches(cfg, n, rng)
    y = y.astype(critic.members[0]["w_out"].dtype)
    pass_losses = []
    pass_norms = []
    for minibatches in batches:
        losses, norms = [], []
        for idx in minibatches:
            xb, yb = obs[idx], y[idx]
            for params, opt in zip(critic.members, critic.optimizers, strict=True):
                v, cache = mlp_forward(critic.spec, params, xb)
                err = v[:, 0] - yb
                losses.append(float(np.mean(err * err)))
                grads, _ = mlp_backward(params, cache, (2.0 / len(idx)) * err[:, None], need_dx=False)
                norms.append(clip_grad_norm(grads, cfg.grad_clip))
                if np.isfinite(norms[-1]):
                    adam_step(opt, params, grads, lr, cfg.betas)
        pass_losses.append(float(np.mean(losses)))
        pass_norms.append(float(np.mean(norms)))
    return {"loss_first": pass_losses[0], "loss_last": pass_losses[-1], "grad_norm": pass_norms[-1]}


def critic_update_target(critic: Critic) -> None:
    """Polyak-average every member into its target copy."""
    for tgt, src in zip(critic.targets, critic.members, strict=True):
        polyak_update(tgt, src, critic.cfg.polyak)
