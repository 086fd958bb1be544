"""ADD discriminator (Zhang et al. 2025; MimicKit ``add_agent.py``): loss, analytic gradient penalty,
differentiable reward, replay buffer and the SGD update.

Network D_ψ: MLP [1024, 512] with ReLU (no LayerNorm), linear logit with weights ~ U(-1, 1), bias 0;
the hidden layers use torch's default initialisation (``mlp.py``). Input: the normalised differential
Δ̂ = Δ / max(mean|Δ|, 1e-4) (``normalizer.DiffNormalizer``), Δ = f(ŝ) - f(s).

Loss for a batch of n negatives (the single positive is Δ̂ = 0)::

    L = ½ [BCE(D(0), 1) + mean_i BCE(D(Δ̂_i), 0)]
        + c_logit ‖w_logit‖²                        c_logit = 0.01
        + c_wd Σ_layers ‖W‖²                         c_wd = 1e-4 (MimicKit's weight decay, as a loss term)
        + c_gp ½ [mean_i ‖∇_Δ̂ D(Δ̂_i)‖² + ‖∇_Δ̂ D(0)‖²]   c_gp = 2.0

``gp_on_positive=False`` gives MimicKit's penalty on the negatives only (c_gp mean_i ‖∇D(Δ̂_i)‖²).
For a ReLU network the input gradient is piecewise linear in the weights and independent of the biases
(almost everywhere): ∇_x D = W0 M0 W1 M1 ... w_logit with the 0/1 activation masks M_k, so the penalty
and its weight gradient are computed in closed form below (no double backward).

Reward, with ψ frozen: r = 2 min(softplus(D(Δ̂)), ln 1e4) = -2 log max(1 - σ(D), 1e-4), and
dr/dΔ = 2 σ(D) [softplus(D) < ln 1e4] ∇_Δ̂ D ⊙ (1 / max(mean|Δ|, 1e-4)).

Replay (MimicKit): raw differentials in a ring buffer of 200k rows; after each window all new rows
are pushed while the buffer is not full, then ``replay_push`` = 1000 random rows per window. Each SGD
step sees ``batch_size`` negatives: half from the current window, half from the replay buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcg.learn.adam import SGDState, sgd_init, sgd_step
from bcg.learn.mlp import MLPSpec, Params, mlp_backward, mlp_forward, mlp_init
from bcg.learn.normalizer import DIFF_MIN, DiffNormalizer

REWARD_MAX = float(np.log(1e4))


@dataclass(frozen=True)
class DiscriminatorConfig:
    """ADD hyperparameters [MimicKit's ADD defaults; the learning rate is the paper's].

    Attributes:
        hidden: ReLU layer widths.
        logit_init_scale: logit weights ~ U(-s, s).
        lr: SGD learning rate.
        momentum: SGD momentum.
        weight_decay: c_wd, on every weight matrix (not biases).
        logit_reg: c_logit.
        grad_penalty: c_gp.
        gp_on_positive: include ‖∇D(0)‖² in the penalty (see module docstring).
        replay_size: ring-buffer rows.
        replay_push: rows pushed per window once the buffer is full.
        batch_size: negatives per SGD step (half current, half replay) [R].
        epochs: passes over the window's differentials per update [R].
        reward_scale: reward multiplier.
        min_diff: floor of the differential normaliser.
    """

    hidden: tuple[int, ...] = (1024, 512)
    logit_init_scale: float = 1.0
    lr: float = 2.5e-4
    momentum: float = 0.9
    weight_decay: float = 1e-4
    logit_reg: float = 0.01
    grad_penalty: float = 2.0
    gp_on_positive: bool = True
    replay_size: int = 200_000
    replay_push: int = 1000
    batch_size: int = 128
    epochs: int = 2
    reward_scale: float = 2.0
    min_diff: float = DIFF_MIN

    def __post_init__(self):
        if self.batch_size < 2 or self.epochs < 1 or self.replay_size < 1:
            raise ValueError(f"batch_size >= 2, epochs >= 1 and replay_size >= 1 required: {self}")


@dataclass
class ReplayBuffer:
    """Ring buffer of raw differentials.

    Attributes:
        data: (capacity, dim) float32; rows [0, size) are valid.
        head: next row to write.
        size: valid rows.
    """

    data: np.ndarray
    head: int = 0
    size: int = 0

    @classmethod
    def new(cls, capacity: int, dim: int) -> ReplayBuffer:
        return cls(np.empty((capacity, dim), np.float32))

    def push(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.float32)[-self.data.shape[0] :]
        idx = (self.head + np.arange(rows.shape[0])) % self.data.shape[0]
        self.data[idx] = rows
        self.head = int((self.head + rows.shape[0]) % self.data.shape[0])
        self.size = int(min(self.size + rows.shape[0], self.data.shape[0]))

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.size == 0:
            raise ValueError("replay buffer is empty")
        return self.data[rng.integers(0, self.size, count)]

    def state_dict(self) -> dict:
        return {
            "data": self.data[: self.size].copy(),
            "capacity": np.int64(self.data.shape[0]),
            "head": np.int64(self.head),
            "size": np.int64(self.size),
        }

    @classmethod
    def from_state_dict(cls, d: dict) -> ReplayBuffer:
        stored = np.asarray(d["data"], np.float32)
        buf = cls.new(int(d["capacity"]), stored.shape[1])
        buf.data[: stored.shape[0]] = stored
        buf.head, buf.size = int(d["head"]), int(d["size"])
        return buf


@dataclass
class Discriminator:
    """Network, optimiser, differential normaliser and replay buffer."""

    cfg: DiscriminatorConfig
    spec: MLPSpec
    params: Params
    optimizer: SGDState
    normalizer: DiffNormalizer
    replay: ReplayBuffer

    def state_dict(self) -> dict:
        return {
            "params": dict(self.params),
            "optimizer": self.optimizer.state_dict(),
            "normalizer": self.normalizer.state_dict(),
            "replay": self.replay.state_dict(),
        }

    def load_state_dict(self, d: dict) -> None:
        for key, ref in self.params.items():
            if d["params"][key].shape != ref.shape:
                raise ValueError(f"discriminator '{key}': stored {d['params'][key].shape} != {ref.shape}")
        self.params = {k: np.array(v) for k, v in d["params"].items()}
        self.optimizer = SGDState.from_state_dict(d["optimizer"])
        self.normalizer = DiffNormalizer.from_state_dict(d["normalizer"])
        self.replay = ReplayBuffer.from_state_dict(d["replay"])


def discriminator_init(
    cfg: DiscriminatorConfig, dim: int, rng: np.random.Generator, dtype=np.float32
) -> Discriminator:
    """New discriminator for differentials of ``dim`` features."""
    spec = MLPSpec(dim, cfg.hidden, 1, activation="relu", layer_norm=False)
    params = mlp_init(spec, rng, out_init_scale=cfg.logit_init_scale, dtype=dtype)
    return Discriminator(
        cfg,
        spec,
        params,
        sgd_init(params),
        DiffNormalizer.new(dim, cfg.min_diff),
        ReplayBuffer.new(cfg.replay_size, dim),
    )


def _input_gradient(params: Params, cache: dict) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """∇_x D for each row, and the intermediates U_k, M_k the penalty's backward needs.

    With masks M_k = [a_k > 0] (n, H_k):
        U_{L-1} = M_{L-1} * w_out^T,   U_k = M_k * (U_{k+1} @ w_{k+1}^T),   ∇_x D = U_0 @ w0^T.
    """
    n_hidden = len(cache["spec"].hidden)
    masks = [(cache["inputs"][k + 1] > 0).astype(params["w_out"].dtype) for k in range(n_hidden)]
    us = [None] * n_hidden
    us[-1] = masks[-1] * params["w_out"][:, 0]
    for k in range(n_hidden - 2, -1, -1):
        us[k] = masks[k] * (us[k + 1] @ params[f"w{k + 1}"].T)
    return us[0] @ params["w0"].T, us, masks


def _penalty_backward(params: Params, us: list, masks: list, d_gx: np.ndarray) -> Params:
    """Weight gradients of a loss with dL/d(∇_x D) = d_gx (n, dim); bias gradients are zero."""
    n_hidden = len(us)
    grads = {"w0": d_gx.T @ us[0]}
    d_u = d_gx @ params["w0"]
    for k in range(n_hidden - 1):
        d_s = masks[k] * d_u
        grads[f"w{k + 1}"] = d_s.T @ us[k + 1]
        d_u = d_s @ params[f"w{k + 1}"]
    grads["w_out"] = np.sum(masks[-1] * d_u, axis=0)[:, None]
    return grads


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))


def discriminator_loss(
    cfg: DiscriminatorConfig, spec: MLPSpec, params: Params, negatives: np.ndarray
) -> tuple[float, Params, dict[str, float]]:
    """ADD loss and its exact gradient.

    Args:
        cfg: loss coefficients.
        spec: network shape (ReLU, no LayerNorm).
        params: network parameters; the computation runs in their dtype.
        negatives: normalised differentials Δ̂ (n, dim).

    Returns:
        loss, dL/dparams, and diagnostics (terms, accuracies, mean logits).
    """
    dtype = params["w_out"].dtype
    neg = np.asarray(negatives, dtype)
    if neg.ndim != 2 or neg.shape[1] != spec.in_dim or neg.shape[0] < 1:
        raise ValueError(f"negatives must be (n >= 1, {spec.in_dim}), got {neg.shape}")
    n = neg.shape[0]
    x = np.concatenate([np.zeros((1, spec.in_dim), dtype), neg])
    logits, cache = mlp_forward(spec, params, x)
    logits = logits[:, 0]
    bce_pos = float(_softplus(-logits[0]))
    bce_neg = float(np.mean(_softplus(logits[1:])))
    d_logits = np.empty(n + 1, dtype)
    d_logits[0] = -0.5 * _sigmoid(-logits[0])
    d_logits[1:] = 0.5 / n * _sigmoid(logits[1:])
    grads, _ = mlp_backward(params, cache, d_logits[:, None], need_dx=False)

    gx, us, masks = _input_gradient(params, cache)
    sq = np.sum(gx * gx, axis=1)
    if cfg.gp_on_positive:
        weights = np.full(n + 1, 0.5 / n, dtype)
        weights[0] = 0.5
    else:
        weights = np.full(n + 1, 1.0 / n, dtype)
        weights[0] = 0.0
    penalty = float(np.dot(weights, sq))
    gp_grads = _penalty_backward(params, us, masks, (2 * cfg.grad_penalty) * weights[:, None] * gx)
    for k, g in gp_grads.items():
        grads[k] += g

    weight_keys = [k for k in params if k.startswith("w")]
    logit_sq = float(np.sum(params["w_out"] ** 2))
    decay_sq = float(sum(np.dot(params[k].ravel(), params[k].ravel()) for k in weight_keys))
    grads["w_out"] += (2 * cfg.logit_reg) * params["w_out"]
    for k in weight_keys:
        grads[k] += (2 * cfg.weight_decay) * params[k]

    loss = (
        0.5 * (bce_pos + bce_neg)
        + cfg.logit_reg * logit_sq
        + cfg.weight_decay * decay_sq
        + cfg.grad_penalty * penalty
    )
    info = {
        "loss": loss,
        "bce_pos": bce_pos,
        "bce_neg": bce_neg,
        "grad_penalty": penalty,
        "logit_reg": logit_sq,
        "pos_logit": float(logits[0]),
        "neg_logit": float(np.mean(logits[1:])),
        "pos_acc": float(logits[0] > 0),
        "neg_acc": float(np.mean(logits[1:] < 0)),
    }
    return loss, grads, info


def add_reward(
    disc: Discriminator, delta: np.ndarray, need_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """ADD reward of raw differentials and its gradient (discriminator and normaliser frozen).

    Args:
        disc: the discriminator (not modified).
        delta: Δ = f(ŝ) - f(s), (..., dim).
        need_grad: also return dr/dΔ.

    Returns:
        reward: (...,) in [0, 2 ln 1e4].
        d_reward: dr/dΔ (..., dim) (row-wise; multiply by the upstream dL/dr), or None.
    """
    dtype = disc.params["w_out"].dtype
    delta = np.asarray(delta, dtype)
    if delta.shape[-1] != disc.spec.in_dim:
        raise ValueError(
            f"differentials have {delta.shape[-1]} features, the discriminator {disc.spec.in_dim}"
        )
    lead = delta.shape[:-1]
    scale = disc.normalizer.scale(dtype)
    logits, cache = mlp_forward(disc.spec, disc.params, delta.reshape(-1, disc.spec.in_dim) * scale)
    logits = logits[:, 0]
    sp = _softplus(logits)
    reward = disc.cfg.reward_scale * np.minimum(sp, REWARD_MAX)
    if not need_grad:
        return reward.reshape(lead), None
    gx, _, _ = _input_gradient(disc.params, cache)
    dr_dlogit = np.where(sp < REWARD_MAX, disc.cfg.reward_scale * _sigmoid(logits), 0).astype(dtype)
    d_reward = (dr_dlogit[:, None] * gx) * scale
    return reward.reshape(lead), d_reward.reshape(*lead, disc.spec.in_dim)


def tracking_reward(
    disc: Discriminator, delta: np.ndarray, need_grad: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """A fixed tracking reward on the same normalised differentials, for ``env.imitation_reward =
    "tracking"`` (not the paper's: a baseline that needs no discriminator training).

        r = reward_scale · ln 1e4 · exp(-mean(Δ̂²) / 2),   Δ̂ = Δ / max(mean|Δ|, 1e-4)

    i.e. the DeepMimic form exp(-k·error²) over the 305 features, each scaled by the running mean of
    its absolute differential (the discriminator's normaliser, still updated every window), with
    ADD's maximum 2 ln 1e4 at Δ = 0 so the action-rate weight keeps its meaning.

    Returns:
        reward: (...,) in (0, 2 ln 1e4].
        d_reward: dr/dΔ (..., dim), or None.
    """
    dtype = disc.params["w_out"].dtype
    delta = np.asarray(delta, dtype)
    if delta.shape[-1] != disc.spec.in_dim:
        raise ValueError(f"differentials have {delta.shape[-1]} features, the reward {disc.spec.in_dim}")
    scale = disc.normalizer.scale(dtype)
    z = delta * scale
    reward = (disc.cfg.reward_scale * REWARD_MAX * np.exp(-0.5 * np.mean(z * z, axis=-1))).astype(dtype)
    if not need_grad:
        return reward, None
    d_reward = (-reward / delta.shape[-1])[..., None] * z * scale
    return reward, d_reward.astype(dtype)


def discriminator_logits(disc: Discriminator, delta: np.ndarray) -> np.ndarray:
    """D(Δ̂) for raw differentials (..., dim) -> (...,)."""
    delta = np.asarray(delta)
    y, _ = mlp_forward(disc.spec, disc.params, disc.normalizer.normalize(delta, disc.params["w_out"].dtype))
    return y[..., 0]


@dataclass
class DiscriminatorPlan:
    """Everything an ADD update draws, decided before its SGD steps run (:func:`discriminator_plan`).

    Attributes:
        normalizer: the differential normaliser with the window folded in.
        push: raw rows to push into the replay buffer.
        batches: the SGD steps' normalised minibatches, (2 * rows, dim) each: the window's rows,
            then as many replay rows (drawn from the buffer as it is after the push).
    """

    normalizer: DiffNormalizer
    push: np.ndarray
    batches: list[np.ndarray]


def discriminator_plan(disc: Discriminator, delta: np.ndarray, rng: np.random.Generator) -> DiscriminatorPlan:
    """Draw an ADD update after a rollout window without changing ``disc``.

    Order (MimicKit): fold the window's differentials into the normaliser, push them into the replay
    buffer, then ``cfg.epochs`` passes over the window's rows in shuffled minibatches of
    ``batch_size // 2``, each joined by as many replay rows. ``rng`` is drawn from in the order
    :func:`discriminator_update` always has (the push's subset, then per epoch the shuffle and each
    minibatch's replay rows), so planning first and stepping later gives the same update.

    Args:
        disc: read only; :func:`discriminator_apply` commits the plan's normaliser and push.
        delta: the window's raw differentials (..., dim), no gradient.
        rng: shuffles and replay draws.
    """
    cfg = disc.cfg
    delta = np.asarray(delta, np.float32).reshape(-1, disc.spec.in_dim)
    n = delta.shape[0]
    if n < 1:
        raise ValueError("no differentials given")
    normalizer = DiffNormalizer.from_state_dict(disc.normalizer.state_dict())
    normalizer.update(delta)
    replay = disc.replay
    capacity = replay.data.shape[0]
    full = replay.size == capacity
    push = delta[rng.permutation(n)[: min(n, cfg.replay_push)]] if full else delta
    written = push[-capacity:]
    size = min(replay.size + written.shape[0], capacity)

    def replay_rows(count: int) -> np.ndarray:
        # ReplayBuffer.sample on the buffer after the push, without writing it
        idx = rng.integers(0, size, count)
        rows = replay.data[idx]
        offset = (idx - replay.head) % capacity
        new = offset < written.shape[0]
        rows[new] = written[offset[new]]
        return rows

    half = cfg.batch_size // 2
    scale = normalizer.scale(disc.params["w_out"].dtype)
    batches = []
    for _ in range(cfg.epochs):
        order = rng.permutation(n)
        for start in range(0, n, half):
            current = delta[order[start : start + half]]
            batches.append(np.concatenate([current, replay_rows(current.shape[0])]) * scale)
    return DiscriminatorPlan(normalizer, push, batches)


def discriminator_apply(disc: Discriminator, plan: DiscriminatorPlan) -> None:
    """Commit a plan's normaliser and replay push to ``disc`` (its SGD steps are
    :func:`discriminator_sgd`)."""
    disc.normalizer = plan.normalizer
    disc.replay.push(plan.push)


def discriminator_sgd(
    cfg: DiscriminatorConfig, spec: MLPSpec, params: Params, optimizer: SGDState, batches: list[np.ndarray]
) -> dict[str, float]:
    """A plan's SGD steps on ``params`` and ``optimizer``, in place.

    Returns:
        Diagnostics averaged over the SGD steps, plus ``steps`` and ``skipped_steps`` (minibatches
        whose gradient was not finite, left out: the weights keep their values).
    """
    totals: dict[str, float] = {}
    steps = skipped = 0
    for batch in batches:
        _, grads, info = discriminator_loss(cfg, spec, params, batch)
        if not all(np.all(np.isfinite(g)) for g in grads.values()):
            skipped += 1  # a non-finite gradient never reaches the weights (nor a checkpoint)
            continue
        sgd_step(optimizer, params, grads, cfg.lr, cfg.momentum)
        for k, v in info.items():
            totals[k] = totals.get(k, 0.0) + v
        steps += 1
    out = {k: v / max(steps, 1) for k, v in totals.items()}
    out["steps"] = float(steps)
    out["skipped_steps"] = float(skipped)
    return out


def discriminator_update(
    disc: Discriminator, delta: np.ndarray, rng: np.random.Generator
) -> dict[str, float]:
    """One ADD update after a rollout window, in place: :func:`discriminator_plan`, then
    :func:`discriminator_apply` and :func:`discriminator_sgd`.

    Args:
        disc: updated in place.
        delta: the window's raw differentials (..., dim), no gradient.
        rng: shuffles and replay draws.

    Returns:
        Diagnostics averaged over the SGD steps, plus ``steps`` and ``skipped_steps`` (minibatches
        whose gradient was not finite, left out: the weights keep their values).
    """
    plan = discriminator_plan(disc, delta, rng)
    discriminator_apply(disc, plan)
    return discriminator_sgd(disc.cfg, disc.spec, disc.params, disc.optimizer, plan.batches)


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
