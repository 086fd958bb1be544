"""MLP, actor, critic and ADD discriminator against hand-computed values and float64 finite differences."""

import math

import numpy as np
import pytest

from bcg.learn.actor import ActorConfig, actor_backward, actor_forward, actor_init, actor_mean
from bcg.learn.critic import (
    CriticConfig,
    critic_fit,
    critic_init,
    critic_member_values,
    critic_update_target,
    critic_value,
    critic_value_backward,
)
from bcg.learn.discriminator import (
    REWARD_MAX,
    DiscriminatorConfig,
    add_reward,
    discriminator_init,
    discriminator_logits,
    discriminator_loss,
    discriminator_update,
    tracking_reward,
)
from bcg.learn.mlp import MLPSpec, cast_params, mlp_backward, mlp_forward, mlp_init

FD_STEP = 1e-6


def _fd_check(f, x, analytic, rtol=1e-6, atol=1e-8, max_entries=40, rng=None):
    """Compare analytic dF/dx with central differences at up to ``max_entries`` entries of x."""
    rng = rng or np.random.default_rng(0)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, min(max_entries, flat.size), replace=False)
    for j in picks:
        old = flat[j]
        flat[j] = old + FD_STEP
        up = f()
        flat[j] = old - FD_STEP
        down = f()
        flat[j] = old
        np.testing.assert_allclose(analytic.reshape(-1)[j], (up - down) / (2 * FD_STEP), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------- MLP


def _jitter(params, rng):
    """Move LayerNorm gains off 1 and biases off 0 so their gradient paths are exercised."""
    return {k: v + 0.3 * rng.normal(size=v.shape) if k.startswith("ln_") else v for k, v in params.items()}


def _elu(v):
    return v if v > 0 else math.exp(v) - 1


def test_mlp_forward_matches_hand_computation():
    spec = MLPSpec(2, (3,), 1, activation="elu", layer_norm=True)
    params = {
        "w0": np.array([[1.0, 0.5, -1.0], [-1.0, 2.0, 0.0]]),
        "b0": np.array([0.1, 0.0, -0.2]),
        "ln_gain0": np.array([1.0, 2.0, 0.5]),
        "ln_bias0": np.array([0.0, -0.5, 0.3]),
        "w_out": np.array([[1.0], [-1.0], [2.0]]),
        "b_out": np.array([0.25]),
    }
    x = [0.3, -0.7]
    z = [x[0] * params["w0"][0, j] + x[1] * params["w0"][1, j] + params["b0"][j] for j in range(3)]
    mean = sum(z) / 3
    var = sum((v - mean) ** 2 for v in z) / 3
    h = [
        (z[j] - mean) / math.sqrt(var + 1e-5) * params["ln_gain0"][j] + params["ln_bias0"][j]
        for j in range(3)
    ]
    expected = sum(_elu(h[j]) * params["w_out"][j, 0] for j in range(3)) + 0.25
    y, _ = mlp_forward(spec, params, np.array([x]))
    assert y.shape == (1, 1)
    assert y[0, 0] == pytest.approx(expected, rel=1e-12)
    # ReLU without LayerNorm
    spec_relu = MLPSpec(2, (3,), 1, activation="relu", layer_norm=False)
    p = {k: params[k] for k in ("w0", "b0", "w_out", "b_out")}
    expected_relu = sum(max(z[j], 0.0) * params["w_out"][j, 0] for j in range(3)) + 0.25
    assert mlp_forward(spec_relu, p, np.array(x))[0][0] == pytest.approx(expected_relu, rel=1e-12)


@pytest.mark.parametrize(
    "activation,layer_norm", [("elu", True), ("elu", False), ("relu", False), ("relu", True)]
)
def test_mlp_backward_matches_finite_differences(activation, layer_norm):
    rng = np.random.default_rng(1)
    spec = MLPSpec(5, (7, 6), 3, activation=activation, layer_norm=layer_norm)
    params = _jitter(mlp_init(spec, rng, dtype=np.float64), rng)
    x = rng.normal(size=(2, 4, 5))  # leading batch dims are kept
    weights = rng.normal(size=(2, 4, 3))

    def loss():
        return float(np.sum(mlp_forward(spec, params, x)[0] * weights))

    y, cache = mlp_forward(spec, params, x)
    assert y.shape == (2, 4, 3)
    grads, dx = mlp_backward(params, cache, weights)
    assert grads.keys() == params.keys()
    for k in params:
        _fd_check(loss, params[k], grads[k], rng=rng)
    _fd_check(loss, x, dx, rng=rng)
    grads_no_dx, none = mlp_backward(params, cache, weights, need_dx=False)
    assert none is None
    np.testing.assert_allclose(grads_no_dx["w0"], grads["w0"])


def test_mlp_float32_follows_float64():
    rng = np.random.default_rng(2)
    spec = MLPSpec(10, (32, 16), 4)
    p32 = mlp_init(spec, rng)
    assert all(v.dtype == np.float32 for v in p32.values())
    x = rng.normal(size=(64, 10))
    y32, c32 = mlp_forward(spec, p32, x)
    y64, c64 = mlp_forward(spec, cast_params(p32, np.float64), x)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-5)
    g32, dx32 = mlp_backward(p32, c32, np.ones((64, 4)))
    g64, dx64 = mlp_backward(cast_params(p32, np.float64), c64, np.ones((64, 4)))
    assert g32["w0"].dtype == np.float32 and dx32.dtype == np.float32
    np.testing.assert_allclose(g32["w0"], g64["w0"], rtol=1e-3, atol=1e-4)


def test_mlp_rejects_bad_input():
    with pytest.raises(ValueError, match="activation"):
        MLPSpec(3, (4,), 1, activation="tanh")
    spec = MLPSpec(3, (4,), 1)
    with pytest.raises(ValueError, match="expects 3"):
        mlp_forward(spec, mlp_init(spec, np.random.default_rng(0)), np.zeros((2, 4)))


# --------------------------------------------------------------------------------------- actor


def test_actor_init():
    params = actor_init(ActorConfig(), 825, 29, np.random.default_rng(3))
    assert (
        params["w0"].shape == (825, 512)
        and params["w2"].shape == (256, 128)
        and params["w_out"].shape == (128, 29)
    )
    np.testing.assert_array_equal(params["log_std"], np.zeros(29, np.float32))  # sigma_0 = 1.0
    assert np.abs(params["w_out"]).max() <= 0.01


@pytest.mark.parametrize("squash", [False, True])
def test_actor_backward_matches_finite_differences(squash):
    rng = np.random.default_rng(4)
    cfg = ActorConfig(hidden=(9, 7, 5), squash=squash, out_init_scale=0.5, log_std_init=-0.3)
    params = _jitter(actor_init(cfg, 6, 4, rng, dtype=np.float64), rng)
    obs = rng.normal(size=(5, 6))
    noise = rng.normal(size=(5, 4))
    weights = rng.normal(size=(5, 4))

    def loss():
        return float(np.sum(actor_forward(cfg, params, obs, noise)[0] * weights))

    actions, cache = actor_forward(cfg, params, obs, noise)
    mean = actor_mean(cfg, params, obs)
    pre = np.arctanh(actions) if squash else actions
    np.testing.assert_allclose(pre - np.exp(-0.3) * noise, np.arctanh(mean) if squash else mean, atol=1e-10)
    grads, dobs = actor_backward(params, cache, weights)
    for k in params:
        _fd_check(loss, params[k], grads[k], rng=rng)
    _fd_check(loss, obs, dobs, rng=rng)


@pytest.mark.parametrize("squash", [False, True])
def test_actor_backward_of_mean_action_terms_matches_finite_differences(squash):
    """L = <W, a> + <V, mean action>: the mean's part reaches the MLP, not log_std."""
    rng = np.random.default_rng(6)
    cfg = ActorConfig(hidden=(9, 7, 5), squash=squash, out_init_scale=0.5, log_std_init=-0.3)
    params = _jitter(actor_init(cfg, 6, 4, rng, dtype=np.float64), rng)
    obs, noise = rng.normal(size=(5, 6)), rng.normal(size=(5, 4))
    w_a, w_m = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))

    def loss():
        actions, cache = actor_forward(cfg, params, obs, noise)
        return float(np.sum(actions * w_a) + np.sum(cache["mean_action"] * w_m))

    _, cache = actor_forward(cfg, params, obs, noise)
    np.testing.assert_allclose(cache["mean_action"], actor_mean(cfg, params, obs), atol=1e-12)
    grads, dobs = actor_backward(params, cache, w_a, d_mean=w_m)
    only_a, _ = actor_backward(params, cache, w_a)
    np.testing.assert_allclose(grads["log_std"], only_a["log_std"], rtol=1e-12)
    for k in params:
        _fd_check(loss, params[k], grads[k], rng=rng)
    _fd_check(loss, obs, dobs, rng=rng)


def test_actor_rejects_wrong_noise_shape():
    cfg = ActorConfig(hidden=(4,))
    params = actor_init(cfg, 3, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="noise shape"):
        actor_forward(cfg, params, np.zeros((5, 3)), np.zeros((5, 3)))


# --------------------------------------------------------------------------------------- critic


def test_critic_fit_reduces_mse_on_toy_regression():
    rng = np.random.default_rng(5)
    critic = critic_init(CriticConfig(hidden=(64, 64)), 8, rng)
    obs = rng.normal(size=(1024, 8)).astype(np.float32)
    targets = np.sin(obs[:, 0]) + 0.5 * obs[:, 1] * obs[:, 2]
    before = np.mean((critic_member_values(critic, obs) - targets) ** 2, axis=1)
    info = critic_fit(critic, obs, targets, lr=2e-3, rng=rng)
    after = np.mean((critic_member_values(critic, obs) - targets) ** 2, axis=1)
    assert np.all(after < 0.25 * before), (before, after)
    assert info["loss_last"] < 0.25 * info["loss_first"]
    # targets untouched by fitting
    np.testing.assert_allclose(
        critic_member_values(critic, obs[:4], target=True),
        critic_member_values(
            critic_init(CriticConfig(hidden=(64, 64)), 8, np.random.default_rng(5)), obs[:4]
        ),
    )


def test_critic_target_polyak_update():
    rng = np.random.default_rng(6)
    critic = critic_init(CriticConfig(hidden=(8, 8), polyak=0.995), 4, rng)
    old_target = {k: v.copy() for k, v in critic.targets[1].items()}
    for v in critic.members[1].values():
        v += 1.0
    critic_update_target(critic)
    for k, v in critic.targets[1].items():
        np.testing.assert_allclose(v, 0.995 * old_target[k] + 0.005 * critic.members[1][k], rtol=1e-6)


@pytest.mark.parametrize("alpha", [1.0, -0.1, float("nan")])
def test_critic_config_refuses_a_target_smoothing_outside_0_1(alpha):
    with pytest.raises(ValueError, match="polyak"):
        CriticConfig(polyak=alpha)
    CriticConfig(polyak=0.0)  # the targets equal the fit: allowed


@pytest.mark.parametrize("aggregate", ["min", "mean"])
def test_critic_value_and_obs_gradient(aggregate):
    rng = np.random.default_rng(7)
    critic = critic_init(CriticConfig(hidden=(8, 6), aggregate=aggregate), 5, rng, dtype=np.float64)
    critic.targets = [_jitter(p, rng) for p in critic.targets]
    obs = rng.normal(size=(2, 3, 5))
    members = critic_member_values(critic, obs, target=True)
    value, cache = critic_value(critic, obs, target=True)
    expected = members.min(axis=0) if aggregate == "min" else members.mean(axis=0)
    np.testing.assert_allclose(value, expected)
    if aggregate == "min":
        assert len(np.unique(np.argmin(members, axis=0))) > 1  # several members are selected
    weights = rng.normal(size=(2, 3))
    dobs = critic_value_backward(critic, cache, weights)
    _fd_check(lambda: float(np.sum(critic_value(critic, obs)[0] * weights)), obs, dobs, rng=rng)


# --------------------------------------------------------------------------------------- discriminator


def _small_disc(rng, **overrides):
    cfg = DiscriminatorConfig(hidden=(12, 10), batch_size=16, replay_size=100, replay_push=10, **overrides)
    disc = discriminator_init(cfg, 5, rng, dtype=np.float64)
    return cfg, disc


def _input_grad_fd(spec, params, x):
    """∇_x D by central differences, row by row."""
    g = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            e = np.zeros_like(x[i])
            e[j] = FD_STEP
            up = mlp_forward(spec, params, x[i] + e)[0][0]
            down = mlp_forward(spec, params, x[i] - e)[0][0]
            g[i, j] = (up - down) / (2 * FD_STEP)
    return g


@pytest.mark.parametrize("gp_on_positive", [True, False])
def test_discriminator_loss_value_and_gradient(gp_on_positive):
    rng = np.random.default_rng(8)
    cfg, disc = _small_disc(rng, gp_on_positive=gp_on_positive)
    params = disc.params
    neg = rng.normal(size=(6, 5))
    loss, grads, info = discriminator_loss(cfg, disc.spec, params, neg)

    # independent value: BCE from probabilities, penalty from finite-difference input gradients
    logit_pos = mlp_forward(disc.spec, params, np.zeros(5))[0][0]
    logit_neg = mlp_forward(disc.spec, params, neg)[0][:, 0]
    bce = 0.5 * (-np.log(1 / (1 + np.exp(-logit_pos))) + np.mean(-np.log(1 - 1 / (1 + np.exp(-logit_neg)))))
    g_neg = _input_grad_fd(disc.spec, params, neg)
    g_pos = _input_grad_fd(disc.spec, params, np.zeros((1, 5)))
    gp_neg = np.mean(np.sum(g_neg**2, axis=1))
    gp = 0.5 * (gp_neg + np.sum(g_pos**2)) if gp_on_positive else gp_neg
    weights_sq = sum(np.sum(params[k] ** 2) for k in ("w0", "w1", "w_out"))
    expected = bce + 0.01 * np.sum(params["w_out"] ** 2) + 1e-4 * weights_sq + 2.0 * gp
    assert loss == pytest.approx(expected, rel=1e-7)
    assert info["grad_penalty"] == pytest.approx(gp, rel=1e-7)

    for k in params:
        _fd_check(lambda: discriminator_loss(cfg, disc.spec, params, neg)[0], params[k], grads[k], rng=rng)


def test_add_reward_and_its_gradient():
    rng = np.random.default_rng(9)
    _, disc = _small_disc(rng)
    spread = np.array([0.1, 1.0, 2.0, 1e-6, 0.5])  # the fourth divisor is floored at 1e-4
    disc.normalizer.update(rng.normal(0, spread, (50, 5)))
    delta = rng.normal(0, 0.5 * spread, (2, 3, 5))
    reward, d_reward = add_reward(disc, delta)
    assert np.all(reward < 2 * REWARD_MAX) and np.all(np.abs(d_reward) > 0)  # not saturated
    logits = discriminator_logits(disc, delta)
    prob = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(reward, -2 * np.log(np.maximum(1 - prob, 1e-4)), rtol=1e-10)
    assert reward.shape == (2, 3) and d_reward.shape == (2, 3, 5)
    weights = rng.normal(size=(2, 3))
    _fd_check(
        lambda: float(np.sum(add_reward(disc, delta, need_grad=False)[0] * weights)),
        delta,
        weights[..., None] * d_reward,
        rng=rng,
    )

    # saturated: reward at its cap 2 ln 1e4, gradient exactly zero
    disc.params["b_out"][:] = 30.0
    reward, d_reward = add_reward(disc, delta)
    np.testing.assert_allclose(reward, 2 * REWARD_MAX)
    assert np.all(d_reward == 0)


def test_tracking_reward_and_its_gradient():
    rng = np.random.default_rng(12)
    _, disc = _small_disc(rng)
    spread = np.array([0.1, 1.0, 2.0, 0.3, 0.5])
    disc.normalizer.update(rng.normal(0, spread, (50, 5)))
    delta = rng.normal(0, 0.5 * spread, (2, 3, 5))
    reward, d_reward = tracking_reward(disc, delta)
    z = delta / np.maximum(disc.normalizer.mean_abs, 1e-4)
    np.testing.assert_allclose(reward, 2 * REWARD_MAX * np.exp(-0.5 * np.mean(z**2, axis=-1)), rtol=1e-10)
    assert reward.shape == (2, 3) and d_reward.shape == (2, 3, 5)
    zero, d_zero = tracking_reward(disc, np.zeros((1, 5)))
    np.testing.assert_allclose(zero, 2 * REWARD_MAX)  # its maximum, ADD's cap, at a perfect match
    assert np.all(d_zero == 0)
    weights = rng.normal(size=(2, 3))
    _fd_check(
        lambda: float(np.sum(tracking_reward(disc, delta, need_grad=False)[0] * weights)),
        delta,
        weights[..., None] * d_reward,
        rng=rng,
    )


def test_add_reward_float32_path():
    rng = np.random.default_rng(10)
    disc = discriminator_init(DiscriminatorConfig(), 317, rng)
    delta = rng.normal(size=(64, 317)).astype(np.float32)
    reward, d_reward = add_reward(disc, delta)
    assert reward.dtype == np.float32 and d_reward.dtype == np.float32
    disc64 = discriminator_init(DiscriminatorConfig(), 317, np.random.default_rng(10), dtype=np.float64)
    r64, d64 = add_reward(disc64, delta.astype(np.float64))
    np.testing.assert_allclose(reward, r64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d_reward, d64, rtol=1e-3, atol=1e-5)


def test_discriminator_update_learns_and_fills_replay():
    rng = np.random.default_rng(11)
    cfg, disc = _small_disc(rng)
    window = rng.normal(1.0, 0.3, (40, 5))
    info = discriminator_update(disc, window, rng)
    assert disc.replay.size == 40  # not full: everything pushed
    assert disc.normalizer.count == 40
    assert info["steps"] == cfg.epochs * 5  # 40 rows / (16 // 2) per step, twice
    first = info["loss"]
    for _ in range(40):
        info = discriminator_update(disc, rng.normal(1.0, 0.3, (40, 5)), rng)
    assert disc.replay.size == 100
    size_before, head_before = disc.replay.size, disc.replay.head
    discriminator_update(disc, rng.normal(1.0, 0.3, (40, 5)), rng)
    assert disc.replay.head == (head_before + 10) % 100 and disc.replay.size == size_before  # full: 10 pushed
    assert info["loss"] < first
    assert info["neg_acc"] > 0.9 and info["pos_acc"] == 1.0
    assert np.mean(add_reward(disc, np.zeros((1, 5)), need_grad=False)[0]) > np.mean(
        add_reward(disc, rng.normal(1.0, 0.3, (100, 5)), need_grad=False)[0]
    )


def test_a_non_finite_discriminator_gradient_never_reaches_the_weights(monkeypatch):
    from bcg.learn import discriminator as module

    rng = np.random.default_rng(12)
    cfg, disc = _small_disc(rng)
    before = {k: v.copy() for k, v in disc.params.items()}
    loss = module.discriminator_loss

    def poisoned(*args):
        value, grads, info = loss(*args)
        return value, {k: np.full_like(g, np.nan) for k, g in grads.items()}, info

    monkeypatch.setattr(module, "discriminator_loss", poisoned)
    info = discriminator_update(disc, rng.normal(1.0, 0.3, (40, 5)), rng)
    assert info["steps"] == 0 and info["skipped_steps"] == cfg.epochs * 5
    for k, v in disc.params.items():
        assert np.array_equal(v, before[k]), k
    monkeypatch.undo()
    info = discriminator_update(disc, rng.normal(1.0, 0.3, (40, 5)), rng)
    assert info["skipped_steps"] == 0 and any(
        not np.array_equal(v, before[k]) for k, v in disc.params.items()
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0 in the output
def test_elu_matches_its_definition_in_float32_and_float64():
    """ELU is computed as max(exp(min(h, 0)) - 1, h): check it against expm1 over its whole range."""
    h = np.concatenate([np.linspace(-30, 5, 2001), [-1e-7, 0.0, 1e-7, -np.inf, np.inf, np.nan]])
    expected = np.where(h > 0, h, np.expm1(np.minimum(h, 0)))
    for dtype, atol in ((np.float64, 1e-15), (np.float32, 2e-7)):
        spec = MLPSpec(1, (h.size,), 1, activation="elu", layer_norm=False)
        params = {
            "w0": np.ones((1, h.size), dtype),
            "b0": h.astype(dtype),
            "w_out": np.eye(h.size, 1, dtype=dtype),
            "b_out": np.zeros(1, dtype),
        }
        _, cache = mlp_forward(spec, params, np.zeros((1, 1), dtype))
        got = cache["inputs"][1][0]
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expected.astype(dtype), rtol=2e-7, atol=atol)
        assert np.isnan(got[-1]) and got[-3] == -1 and got[-2] == np.inf
