"""Optimisers, normalisers, TD(λ) targets and exact save/restore of the learner's state."""

import math

import h5py
import numpy as np
import pytest

from bcg.learn.actor import ActorConfig, actor_backward, actor_forward, actor_init
from bcg.learn.adam import (
    AdamState,
    SGDState,
    accumulate_grads,
    adam_init,
    adam_step,
    clip_grad_norm,
    grad_norm,
    linear_lr,
    sgd_init,
    sgd_step,
)
from bcg.learn.critic import CriticConfig, critic_fit, critic_init
from bcg.learn.discriminator import DiscriminatorConfig, discriminator_init, discriminator_update
from bcg.learn.mlp import read_tree_h5, rng_from_state, rng_state, write_tree_h5
from bcg.learn.normalizer import DiffNormalizer, ReturnNormalizer, RunningMeanStd
from bcg.learn.td import td_lambda_targets

# --------------------------------------------------------------------------------------- optimisers


def test_adam_two_steps_match_hand_computation():
    params = {"p": np.array([1.0, -2.0])}
    state = adam_init(params)
    adam_step(state, params, {"p": np.array([0.5, -0.1])}, lr=0.1, betas=(0.7, 0.95), eps=1e-8)
    # step 1: m/(1-b1) = g, v/(1-b2) = g^2, so p moves by lr * sign(g) (up to eps)
    np.testing.assert_allclose(params["p"], [0.9, -1.9], atol=1e-7)
    adam_step(state, params, {"p": np.array([0.1, 0.2])}, lr=0.1, betas=(0.7, 0.95), eps=1e-8)
    # step 2 by hand: m = 0.7*0.3*g1 + 0.3*g2 = [0.135, 0.039]; v = 0.95*0.05*g1^2 + 0.05*g2^2
    # = [0.012375, 0.002475]; bias corrections 1-0.7^2 = 0.51, 1-0.95^2 = 0.0975
    np.testing.assert_allclose(state.m["p"], [0.135, 0.039], rtol=1e-12)
    np.testing.assert_allclose(state.v["p"], [0.012375, 0.002475], rtol=1e-12)
    step = 0.1 * (np.array([0.135, 0.039]) / 0.51) / np.sqrt(np.array([0.012375, 0.002475]) / 0.0975)
    np.testing.assert_allclose(params["p"], np.array([0.9, -1.9]) - step, atol=1e-7)
    np.testing.assert_allclose(params["p"], [0.8256992, -1.9479965], atol=1e-6)
    assert state.step == 2


def test_sgd_momentum_weight_decay_match_hand_computation():
    params = {"p": np.array([1.0, -2.0])}
    state = sgd_init(params)
    g = {"p": np.array([0.5, -0.1])}
    sgd_step(state, params, g, lr=0.1, momentum=0.9, weight_decay=0.1)
    # g' = g + 0.1 p = [0.6, -0.3] = buffer; p = p - 0.1 * buffer
    np.testing.assert_allclose(params["p"], [0.94, -1.97], rtol=1e-12)
    sgd_step(state, params, g, lr=0.1, momentum=0.9, weight_decay=0.1)
    # g' = [0.5 + 0.094, -0.1 - 0.197]; buffer = 0.9 [0.6, -0.3] + g' = [1.134, -0.567]
    np.testing.assert_allclose(state.momentum_buffer["p"], [1.134, -0.567], rtol=1e-12)
    np.testing.assert_allclose(params["p"], [0.8266, -1.9133], rtol=1e-12)


def test_float32_state_stays_float32():
    params = {"w": np.ones((3, 2), np.float32)}
    state = adam_init(params)
    adam_step(state, params, {"w": np.full((3, 2), 0.5, np.float32)}, lr=np.float64(0.1))
    assert params["w"].dtype == state.m["w"].dtype == state.v["w"].dtype == np.float32
    sgd = sgd_init(params)
    sgd_step(sgd, params, {"w": np.ones((3, 2), np.float32)}, lr=np.float64(0.1), weight_decay=1e-4)
    assert params["w"].dtype == sgd.momentum_buffer["w"].dtype == np.float32


def test_accumulate_grads():
    a = {"w": np.array([1.0, 2.0])}
    total = accumulate_grads(None, a)
    total = accumulate_grads(total, {"w": np.array([0.5, -1.0])})
    np.testing.assert_array_equal(total["w"], [1.5, 1.0])
    np.testing.assert_array_equal(a["w"], [1.0, 2.0])  # the first summand is copied, not aliased
    with pytest.raises(ValueError, match="gradient keys"):
        accumulate_grads(total, {"v": np.zeros(2)})


def test_optimisers_reject_mismatched_keys():
    params = {"a": np.zeros(2)}
    with pytest.raises(ValueError, match="gradient keys"):
        adam_step(adam_init(params), params, {"b": np.zeros(2)}, lr=0.1)
    with pytest.raises(ValueError, match="gradient keys"):
        sgd_step(sgd_init(params), params, {"b": np.zeros(2)}, lr=0.1)


def test_clip_grad_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    assert grad_norm(grads) == pytest.approx(5.0)
    assert clip_grad_norm(grads, 10.0) == pytest.approx(5.0)
    np.testing.assert_array_equal(grads["a"], [3.0, 0.0])  # under the limit: untouched
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grads["b"], [[0.8]], rtol=1e-6)
    bad = {"a": np.array([np.nan, 1.0])}
    assert math.isnan(clip_grad_norm(bad, 1.0))
    assert bad["a"][1] == 1.0
    # float32: the sum of squares runs in float32, but finite entries whose squares overflow it
    # still give a finite norm (and get clipped), and rounding stays at float32 level
    huge = {"a": np.array([3e20, 0.0], np.float32), "b": np.array([[4e20]], np.float32)}
    assert clip_grad_norm(huge, 1.0) == pytest.approx(5e20, rel=1e-6)
    np.testing.assert_allclose(huge["a"], [0.6, 0.0], rtol=1e-6)
    assert math.isinf(grad_norm({"a": np.array([np.inf, 1.0], np.float32)}))
    many = np.random.default_rng(0).normal(size=300_000).astype(np.float32)
    assert grad_norm({"a": many}) == pytest.approx(np.linalg.norm(many.astype(np.float64)), rel=1e-6)


def test_linear_lr():
    assert linear_lr(5e-3, 0, 2000) == 5e-3
    assert linear_lr(5e-3, 2000, 2000) == pytest.approx(1e-5)
    assert linear_lr(5e-3, 1000, 2000) == pytest.approx(0.5 * (5e-3 + 1e-5))
    with pytest.raises(ValueError):
        linear_lr(5e-3, 0, 0)


# --------------------------------------------------------------------------------------- normalisers


def test_running_mean_std_matches_numpy_over_chunks():
    rng = np.random.default_rng(1)
    data = rng.normal(3.0, 2.0, (1000, 5)) * np.arange(1, 6)
    rms = RunningMeanStd.new(5)
    for chunk in np.array_split(data, [1, 7, 300, 301, 777]):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(rms.var, data.var(axis=0), rtol=1e-10)
    assert rms.count == 1000
    x = data[:3].astype(np.float32)
    expected = (data[:3] - data.mean(axis=0)) / np.sqrt(data.var(axis=0) + 1e-5)
    out = rms.normalize(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        rms.normalize_grad(np.ones((2, 5))), np.broadcast_to(1 / np.sqrt(data.var(0) + 1e-5), (2, 5))
    )
    np.testing.assert_allclose(rms.denormalize(rms.normalize(x, np.float64)), x, rtol=1e-6)
    with pytest.raises(ValueError, match="does not end"):
        rms.update(np.zeros((3, 4)))


def test_return_normalizer_matches_explicit_returns():
    rng = np.random.default_rng(2)
    gamma = 0.9
    rewards = rng.normal(1.0, 0.5, (20, 3))
    dones = rng.random((20, 3)) < 0.15
    norm = ReturnNormalizer.new(3, gamma)
    for r, d in zip(rewards, dones, strict=True):
        norm.observe(r, d)
    seen = []
    for e in range(3):
        g = 0.0
        for t in range(20):
            g = gamma * g + rewards[t, e]
            seen.append(g)
            if dones[t, e]:
                g = 0.0
    np.testing.assert_allclose(norm.rms.var, np.var(seen), rtol=1e-10)
    assert norm.scale() == pytest.approx(1 / np.sqrt(np.var(seen) + 1e-6))


def test_diff_normalizer_mean_abs():
    rng = np.random.default_rng(3)
    data = rng.normal(0, [1e-6, 0.5, 3.0], (500, 3))
    norm = DiffNormalizer.new(3)
    np.testing.assert_array_equal(norm.scale(np.float64), [1.0, 1.0, 1.0])  # before any data
    for chunk in np.array_split(data, 4):
        norm.update(chunk)
    mean_abs = np.abs(data).mean(axis=0)
    np.testing.assert_allclose(norm.mean_abs, mean_abs, rtol=1e-12)
    assert mean_abs[0] < 1e-4  # this feature's divisor is floored at 1e-4
    np.testing.assert_allclose(norm.normalize(data[:2], np.float64), data[:2] / np.maximum(mean_abs, 1e-4))


# --------------------------------------------------------------------------------------- TD(λ)


def test_td_lambda_hand_computed():
    # gamma = lam = 0.5, r = [1, 2, 3], V_{i+1} = [10, 20, 30], no dones (the last is forced):
    # y2 = 3 + .5*30 = 18; y1 = 2 + .5*(.5*20 + .5*18) = 11.5; y0 = 1 + .5*(.5*10 + .5*11.5) = 6.375
    r = np.array([[1.0], [2.0], [3.0]])
    v = np.array([[10.0], [20.0], [30.0]])
    y = td_lambda_targets(r, v, np.zeros((3, 1)), gamma=0.5, lam=0.5)
    np.testing.assert_allclose(y[:, 0], [6.375, 11.5, 18.0])
    # early termination at step 0 (bootstrap 0): y0 = r0 only; the later segment is unchanged
    y = td_lambda_targets(r, np.array([[0.0], [20.0], [30.0]]), np.array([[1], [0], [0]]), gamma=0.5, lam=0.5)
    np.testing.assert_allclose(y[:, 0], [1.0, 11.5, 18.0])
    # a timeout at step 1 bootstraps from V_2 = 20 there: y1 = 2 + .5*20 = 12; y0 = 1 + .5*(5 + 6) = 6.5
    y = td_lambda_targets(r, v, np.array([[0], [1], [0]]), gamma=0.5, lam=0.5)
    np.testing.assert_allclose(y[:, 0], [6.5, 12.0, 18.0])


def _lambda_return_reference(r, v, d, gamma, lam):
    """Explicit weighted sum of n-step returns up to each segment end, one env and step at a time."""
    h, n_env = r.shape
    d = d.astype(bool).copy()
    d[-1] = True
    y = np.zeros((h, n_env))
    for e in range(n_env):
        for i in range(h):
            end = i
            while not d[end, e]:
                end += 1
            k_max = end - i + 1
            n_step = []
            for n in range(1, k_max + 1):
                g = sum(gamma**k * r[i + k, e] for k in range(n)) + gamma**n * v[i + n - 1, e]
                n_step.append(g)
            y[i, e] = (1 - lam) * sum(lam ** (n - 1) * n_step[n - 1] for n in range(1, k_max)) + lam ** (
                k_max - 1
            ) * n_step[-1]
    return y


def test_td_lambda_matches_n_step_reference():
    rng = np.random.default_rng(4)
    h, n_env = 12, 5
    r = rng.normal(size=(h, n_env))
    v = rng.normal(size=(h, n_env))
    d = rng.random((h, n_env)) < 0.2
    expected = _lambda_return_reference(r, v, d, 0.99, 0.95)
    np.testing.assert_allclose(td_lambda_targets(r, v, d, 0.99, 0.95), expected, rtol=1e-10, atol=1e-10)
    y32 = td_lambda_targets(r.astype(np.float32), v.astype(np.float32), d, 0.99, 0.95)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, expected, rtol=1e-5, atol=1e-5)


def test_td_lambda_rejects_bad_input():
    with pytest.raises(ValueError, match="shapes differ"):
        td_lambda_targets(np.zeros((3, 2)), np.zeros((3, 1)), np.zeros((3, 2)), 0.99, 0.95)
    with pytest.raises(ValueError, match="lam"):
        td_lambda_targets(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), 0.99, 1.0)


# --------------------------------------------------------------------------------------- save / restore


def _learner(seed):
    rng = np.random.default_rng(seed)
    actor_cfg = ActorConfig(hidden=(16, 8))
    actor = actor_init(actor_cfg, 12, 3, rng)
    critic = critic_init(CriticConfig(hidden=(8, 8), iterations=2), 12, rng)
    disc = discriminator_init(
        DiscriminatorConfig(hidden=(16, 8), replay_size=50, replay_push=7, batch_size=8), 6, rng
    )
    return (
        rng,
        actor_cfg,
        actor,
        adam_init(actor),
        critic,
        disc,
        RunningMeanStd.new(12),
        ReturnNormalizer.new(4, 0.99),
    )


def _train_epoch(rng, actor_cfg, actor, actor_opt, critic, disc, obs_rms, ret_norm):
    obs = rng.normal(size=(4, 12))
    obs_rms.update(obs)
    a, cache = actor_forward(
        actor_cfg, actor, obs_rms.normalize(obs), rng.normal(size=(4, 3)).astype(np.float32)
    )
    grads, _ = actor_backward(actor, cache, a, need_dobs=False)
    adam_step(actor_opt, actor, grads, 1e-3)
    ret_norm.observe(rng.normal(size=4), rng.random(4) < 0.3)
    critic_fit(critic, obs_rms.normalize(obs), rng.normal(size=4), 1e-3, rng)
    discriminator_update(disc, rng.normal(size=(20, 6)), rng)


def _tree(rng, actor, actor_opt, critic, disc, obs_rms, ret_norm):
    return {
        "rng": rng_state(rng),
        "actor": dict(actor),
        "actor_opt": actor_opt.state_dict(),
        "critic": critic.state_dict(),
        "disc": disc.state_dict(),
        "obs_rms": obs_rms.state_dict(),
        "ret_norm": ret_norm.state_dict(),
    }


def _assert_trees_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_trees_equal(a[k], b[k])
        else:
            assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype, k
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_state_roundtrip_through_hdf5_resumes_exactly(tmp_path):
    rng, actor_cfg, actor, actor_opt, critic, disc, obs_rms, ret_norm = _learner(5)
    for _ in range(3):
        _train_epoch(rng, actor_cfg, actor, actor_opt, critic, disc, obs_rms, ret_norm)
    saved = _tree(rng, actor, actor_opt, critic, disc, obs_rms, ret_norm)
    path = tmp_path / "state.h5"
    with h5py.File(path, "w") as f:
        write_tree_h5(f.create_group("learner"), saved)
    with h5py.File(path, "r") as f:
        loaded = read_tree_h5(f["learner"])
    _assert_trees_equal(saved, loaded)

    # a fresh learner restored from the file continues exactly like the original
    _, _, actor2, _, critic2, disc2, _, _ = _learner(99)
    rng2 = rng_from_state(loaded["rng"])
    actor2 = {k: np.array(v) for k, v in loaded["actor"].items()}
    actor_opt2 = AdamState.from_state_dict(loaded["actor_opt"])
    critic2.load_state_dict(loaded["critic"])
    disc2.load_state_dict(loaded["disc"])
    obs_rms2 = RunningMeanStd.from_state_dict(loaded["obs_rms"])
    ret_norm2 = ReturnNormalizer.from_state_dict(loaded["ret_norm"])
    for _ in range(2):
        _train_epoch(rng, actor_cfg, actor, actor_opt, critic, disc, obs_rms, ret_norm)
        _train_epoch(rng2, actor_cfg, actor2, actor_opt2, critic2, disc2, obs_rms2, ret_norm2)
    _assert_trees_equal(
        _tree(rng, actor, actor_opt, critic, disc, obs_rms, ret_norm),
        _tree(rng2, actor2, actor_opt2, critic2, disc2, obs_rms2, ret_norm2),
    )
    assert disc.replay.size == 50  # full: the wrap-around was exercised
    assert SGDState.from_state_dict(loaded["disc"]["optimizer"]).momentum_buffer.keys() == disc.params.keys()


def test_restore_rejects_wrong_shapes():
    _, _, _, _, critic, disc, _, _ = _learner(6)
    other = critic_init(CriticConfig(hidden=(9, 8)), 12, np.random.default_rng(0))
    with pytest.raises(ValueError, match="stored"):
        critic.load_state_dict(other.state_dict())
    other_disc = discriminator_init(DiscriminatorConfig(hidden=(16, 4)), 6, np.random.default_rng(0))
    with pytest.raises(ValueError, match="stored"):
        disc.load_state_dict(other_disc.state_dict())


@pytest.mark.parametrize(
    "item",
    [
        "env.height_weight=-1",
        "env.height_tolerance=-0.1",
        "env.upright_weight=-2",
        "env.root_rotation_weight=-1",
        "env.root_position_weight=-1",
        "env.root_position_cap=-0.5",
        "action_rate_ramp=-5",
    ],
)
def test_reward_term_settings_below_zero_are_refused_with_the_field_named(item):
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import ConfigError, apply_overrides

    name = item.split("=")[0].split(".")[-1]
    with pytest.raises(ConfigError, match=name):
        apply_overrides(TrainConfig(), [item])


def test_shac_segments_and_loss_seeds_match_hand_computation():
    """Two envs over h = 3 steps, γ = 0.5, return scale 2: env 0 falls at step 1 (no bootstrap), env 1
    runs through the window and bootstraps from o_3; the loss's coefficients by hand."""
    from bcg.learn.shac_loss import actor_loss, actor_loss_seeds, bootstrap_obs_grads, segments

    terminated = np.array([[False, False], [True, False], [False, False]])
    seg = segments(terminated, np.zeros((3, 2), bool))
    assert seg.end.tolist() == [1, 2] and seg.bootstrap.tolist() == [False, True]
    assert seg.live.tolist() == [[True, True], [True, True], [False, True]]
    g_rewards, d_v = actor_loss_seeds(seg, gamma=0.5, scale=2.0)
    # -γ^k · scale / (N h) on the live steps, -γ^(k_end+1) / (N h) on a bootstrapped end
    np.testing.assert_allclose(g_rewards, [[-1 / 3, -1 / 3], [-1 / 6, -1 / 6], [0.0, -1 / 12]])
    np.testing.assert_allclose(d_v, [0.0, -0.125 / 6])
    rewards = np.array([[1.0, 2.0], [3.0, 4.0], [np.nan, 5.0]])  # env 0's step 2 lies past its fall
    loss = actor_loss(rewards, np.array([7.0, 8.0]), g_rewards, d_v, seg.live)
    assert loss == pytest.approx(-(1 + 2) / 3 - (3 + 4) / 6 - 5 / 12 - 8 * 0.125 / 6)
    g_obs = bootstrap_obs_grads(np.array([[1.0, 1.0], [2.0, 2.0]]), seg.end)
    assert sorted(g_obs) == [2, 3]
    assert g_obs[2].tolist() == [[1.0, 1.0], [0.0, 0.0]] and g_obs[3].tolist() == [[0.0, 0.0], [2.0, 2.0]]
