"""PPO: GAE against hand-computed values, the losses' gradients against central differences
(float64), the adaptive learning rate, the forward-only environment against the differentiable one,
and a tiny run's resume (bit for bit) and policy file in MuJoCo and the robot client."""

import dataclasses
import json
import shutil

import h5py
import numpy as np
import pytest

from bcg.learn.config import PPOConfig, TrainConfig
from bcg.learn.config_io import apply_overrides, config_from_dict, config_to_dict
from bcg.learn.gae import gae
from bcg.learn.ppo_loss import (
    adaptive_lr,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
    normalize_advantages,
    surrogate_loss,
    value_loss,
)
from tests.test_train import _checkpoint, _train

# ---------------------------------------------------------------------------------------------------
# GAE


def _window():
    """Three envs over three steps, γ = λ = 0.5: env 0 runs through, env 1 falls at step 1 and
    waits (masked) at step 2, env 2 times out at step 0 and waits for two steps."""
    rewards = np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 5.0], [3.0, 99.0, 5.0]])
    values = np.array([[0.5, 2.0, 1.0], [1.0, 2.0, 3.0], [1.5, 7.0, 3.0]])
    next_values = np.array([[1.0, 2.0, 4.0], [1.5, 4.0, 3.0], [2.0, 7.0, 3.0]])
    terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    truncated = np.array([[0, 0, 1], [0, 0, 0], [0, 0, 0]], bool)
    valid = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    return rewards, values, next_values, terminated, truncated, valid


def test_gae_matches_hand_computed_values_with_a_fall_a_time_out_and_masked_steps():
    advantages, returns = gae(*_window(), gamma=0.5, lam=0.5)
    # env 0: δ = (1 + .5·1 - .5, 2 + .5·1.5 - 1, 3 + .5·2 - 1.5) = (1, 1.75, 2.5); A_k = δ_k + .25 A_k+1
    # env 1: falls at step 1 (no value after it): δ_1 = 1 - 2 = -1, δ_0 = 1 + .5·2 - 2 = 0
    # env 2: times out at step 0, bootstrapped from V(o_1) = 4: δ_0 = 1 + .5·4 - 1 = 2
    expected_a = np.array([[1.59375, -0.25, 2.0], [2.375, -1.0, 0.0], [2.5, 0.0, 0.0]])
    expected_r = np.array([[2.09375, 1.75, 3.0], [3.375, 1.0, 0.0], [4.0, 0.0, 0.0]])
    np.testing.assert_allclose(advantages, expected_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(returns, expected_r, rtol=0, atol=1e-12)


def test_gae_equals_rsl_rls_recursion_where_their_inputs_meet():
    """rsl_rl folds a time-out's bootstrap into the reward and marks it done; with the same values
    its recursion gives ours on every valid step."""
    rng = np.random.default_rng(0)
    h, n, gamma, lam = 7, 5, 0.97, 0.9
    rewards, values = rng.normal(size=(2, h, n))
    # a window's next values are its values one step on (envs reset only at its end), then V(o_h)
    next_values = np.concatenate([values[1:], rng.normal(size=(1, n))])
    ended_at = np.array([2, 6, 0, 4, 6])
    terminated = np.zeros((h, n), bool)
    truncated = np.zeros((h, n), bool)
    terminated[ended_at[:3], np.arange(3)] = True
    truncated[ended_at[3], 3] = True
    valid = np.arange(h)[:, None] <= ended_at[None, :]
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, valid, gamma, lam)
    # rsl_rl's compute_returns on the valid steps of each env (next_values = values[k + 1] inside)
    for e in range(n):
        steps = int(ended_at[e]) + 1
        r = rewards[:steps, e] + gamma * next_values[:steps, e] * truncated[:steps, e]
        dones = (terminated | truncated)[:steps, e].astype(float)
        advantage = 0.0
        for k in reversed(range(steps)):
            nxt = next_values[k, e] if k == steps - 1 else values[k + 1, e]
            delta = r[k] + (1 - dones[k]) * gamma * nxt - values[k, e]
            advantage = delta + (1 - dones[k]) * gamma * lam * advantage
            assert advantages[k, e] == pytest.approx(advantage, abs=1e-12)
            assert returns[k, e] == pytest.approx(advantage + values[k, e], abs=1e-12)
    assert np.all(advantages[~valid] == 0) and np.all(returns[~valid] == 0)


# ---------------------------------------------------------------------------------------------------
# losses and their gradients


def _central(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        g[i] = (f(up) - f(down)) / (2 * eps)
    return g


def test_surrogate_gradient_matches_central_differences_through_the_gaussian():
    """L_surr as a function of the policy's mean (n, A) and log std (A,), ratios inside and outside
    the clip range and advantages of both signs."""
    rng = np.random.default_rng(1)
    n, a, clip = 12, 3, 0.2
    mean, log_std = rng.normal(size=(n, a)), rng.normal(scale=0.3, size=a)
    actions = mean + np.exp(log_std) * rng.normal(size=(n, a))
    # old log-probabilities that put the ratios at 0.5 .. 1.5, away from the kinks at 0.8 and 1.2
    ratios = np.tile([0.5, 0.7, 0.9, 1.1, 1.3, 1.5], 2)
    old = gaussian_log_prob(actions, mean, log_std)[0] - np.log(ratios)
    adv = np.where(np.arange(n) % 4 < 2, 1.0, -1.0) * rng.uniform(0.5, 2.0, n)

    def loss(mean_, log_std_):
        return surrogate_loss(gaussian_log_prob(actions, mean_, log_std_)[0], old, adv, clip)[0]

    log_prob, d_mean, d_log_std = gaussian_log_prob(actions, mean, log_std)
    value, d_log_prob, clipped = surrogate_loss(log_prob, old, adv, clip)
    expected = np.mean(np.maximum(-adv * ratios, -adv * np.clip(ratios, 1 - clip, 1 + clip)))
    assert value == pytest.approx(expected, rel=1e-12)
    assert 0 < clipped < 1  # both branches are exercised
    np.testing.assert_allclose(d_log_prob[:, None] * d_mean, _central(lambda m: loss(m, log_std), mean),
                               rtol=1e-6, atol=1e-9)  # fmt: skip
    np.testing.assert_allclose(np.sum(d_log_prob[:, None] * d_log_std, axis=0),
                               _central(lambda s: loss(mean, s), log_std), rtol=1e-6, atol=1e-9)  # fmt: skip


def test_log_prob_and_entropy_are_the_gaussians():
    from scipy.stats import norm

    rng = np.random.default_rng(2)
    mean, log_std, actions = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(4, 3))
    expected = norm.logpdf(actions, mean, np.exp(log_std)).sum(axis=1)
    np.testing.assert_allclose(gaussian_log_prob(actions, mean, log_std)[0], expected, rtol=1e-12)
    assert gaussian_entropy(log_std) == pytest.approx(norm.entropy(0, np.exp(log_std)).sum(), rel=1e-12)


def test_clipped_value_loss_gradient_matches_central_differences():
    """Values moved inside and beyond the clip range, on either side of the target."""
    old = np.zeros(8)
    values = np.array([0.1, -0.1, 0.5, -0.5, 0.5, -0.5, 0.15, 0.35])
    returns = np.array([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -2.0, 0.1])
    loss, grad = value_loss(values, old, returns, 0.2)
    unclipped = (values - returns) ** 2
    clipped = (np.clip(values, -0.2, 0.2) - returns) ** 2
    assert loss == pytest.approx(np.mean(np.maximum(unclipped, clipped)), rel=1e-12)
    np.testing.assert_allclose(
        grad, _central(lambda v: value_loss(v, old, returns, 0.2)[0], values), atol=1e-9
    )
    assert grad[2] == 0 and grad[3] == 0  # clipped beyond the range towards the target: no gradient
    plain, grad_plain = value_loss(values, old, returns, None)
    assert plain == pytest.approx(np.mean(unclipped)) and np.allclose(grad_plain, 2 * (values - returns) / 8)


def test_kl_of_gaussians_and_advantage_normalisation():
    m0, s0, m1, s1 = (
        np.array([[0.3, -1.0]]),
        np.array([0.5, 2.0]),
        np.array([[0.1, 0.0]]),
        np.array([1.0, 1.5]),
    )
    exact = np.sum(np.log(s1 / s0) + (s0**2 + (m0 - m1) ** 2) / (2 * s1**2) - 0.5)
    assert gaussian_kl(m0, s0, m1, s1)[0] == pytest.approx(exact, abs=1e-4)  # rsl_rl's 1e-5 in the log
    assert abs(gaussian_kl(m0, s0, m0, s0)[0]) < 1e-4
    adv = np.array([1.0, 2.0, 3.0, 6.0])
    np.testing.assert_allclose(normalize_advantages(adv), (adv - 3.0) / (np.std(adv, ddof=1) + 1e-8))


@pytest.mark.parametrize(
    "lr, kl, expected",
    [
        (1e-3, 0.03, 1e-3 / 1.5),  # above 2 KL*
        (1e-3, 0.02, 1e-3),  # at 2 KL*: unchanged
        (1e-3, 0.01, 1e-3),
        (1e-3, 0.004, 1.5e-3),  # below KL* / 2
        (1e-3, 0.0, 1e-3),  # a zero KL (nothing moved) leaves it
        (1.2e-5, 0.5, 1e-5),  # clamped below
        (8e-3, 1e-4, 1e-2),  # clamped above
    ],
)
def test_adaptive_learning_rate_is_rsl_rls_rule(lr, kl, expected):
    assert adaptive_lr(lr, kl, 0.01, 1e-5, 1e-2) == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------------------------------
# config


def test_ppo_config_has_the_papers_settings_and_round_trips():
    cfg = PPOConfig()
    assert (cfg.num_envs, cfg.horizon, cfg.iterations, cfg.lr, cfg.desired_kl) == (4096, 24, 3000, 1e-3, 0.01)
    assert (cfg.epochs, cfg.minibatches, cfg.clip, cfg.value_coef, cfg.entropy_coef) == (5, 4, 0.2, 1.0, 0.0)
    assert cfg.max_grad_norm == 1.0 and cfg.clipped_value_loss and cfg.obs_normalization
    assert np.exp(cfg.actor.log_std_init) == pytest.approx(0.3) and not cfg.actor.layer_norm
    assert cfg.actor.hidden == (512, 256, 128) and cfg.critic_hidden == (256, 256)
    assert cfg.env.kappa == 300.0 and not cfg.env.bcg
    changed = apply_overrides(cfg, ["desired_kl=none", "critic_hidden=64,32", "env.motion=jump"])
    assert config_from_dict(json.loads(json.dumps(config_to_dict(changed)))) == changed
    # SHAC's config is untouched: no algo field, and a stored one still reads as SHAC's
    assert "algo" not in config_to_dict(TrainConfig()) and TrainConfig().actor.layer_norm
    stored = config_to_dict(TrainConfig())
    del stored["actor"]["layer_norm"]  # a config written before the field existed
    assert config_from_dict(stored) == TrainConfig()
    with pytest.raises(ValueError, match="env.bcg"):
        dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, bcg=True))


# ---------------------------------------------------------------------------------------------------
# the environment without gradients


def test_forward_only_env_steps_exactly_as_the_differentiable_one(ti64):
    """One code path: the same observations, rewards and terminations on a simulator without
    gradients, which keeps no reward VJP data (actions that move the robot, latency and pushes
    as drawn)."""
    from bcg.g1sim import make_g1
    from bcg.learn.config import EnvConfig
    from bcg.learn.discriminator import DiscriminatorConfig, discriminator_init
    from bcg.learn.env import G1TrackingEnv
    from bcg.learn.features import FEATURE_SIZE
    from bcg.motion import MotionClip

    clip, cfg, steps = MotionClip.load("run"), EnvConfig(contact=False), 3
    results = []
    for requires_grad in (True, False):
        rng = np.random.default_rng(5)
        disc = discriminator_init(DiscriminatorConfig(hidden=(32, 16)), FEATURE_SIZE, rng, dtype=np.float64)
        sim = make_g1(2, max_steps=steps, requires_grad=requires_grad)
        env = G1TrackingEnv(cfg, 2, steps, disc, rng, clip=clip, sim=sim)
        assert env.requires_grad is requires_grad
        out = [env.begin_window()[1]]
        for k in range(steps):
            res = env.step(np.full((2, 29), 0.1 * k))
            out += [res.obs, res.obs_critic, res.reward, res.terminated, res.truncated]
        assert len(env._dr_ddelta) == (steps if requires_grad else 0)
        results.append(out)
    # equal up to float64 round-off: the kernels of a simulator without gradient fields compile apart
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------
# the command: resume, run folder, policy file

SMALL = [
    "--algo", "ppo", "--envs", "4", "--iterations", "2", "--seed", "7",
    "--set", "horizon=4", "--set", "actor.hidden=16", "--set", "critic_hidden=16", "--set", "minibatches=2",
    "--set", "epochs=2", "--set", "disc.hidden=16,8", "--set", "checkpoint_every=1",
]  # fmt: skip


@pytest.mark.parametrize("contact", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_ppo_resume_continues_exactly_and_writes_the_run_files(tmp_path, contact):
    """2 PPO iterations in one go against 1 + 1 with a stop and --resume: the same state, bit for bit
    (the adapted learning rate included); SHAC's flags and folders stay apart."""
    from bcg.learn.policy import load_policy

    whole, split = tmp_path / "whole", tmp_path / "split"
    small = [*SMALL, "--set", f"env.contact={contact}"]
    out = _train(*small, "--out", whole)
    assert out.returncode == 0, out.stderr
    assert "2/2" in out.stderr and "ETA" in out.stderr
    first = _train(*small, "--out", split, "--stop-after", "1")
    assert first.returncode == 0 and "stopped at iteration 1" in first.stderr, first.stderr
    hint = first.stderr.split("resume with: ")[1].split(" (its policy so far")[0]
    assert "--algo ppo" in hint
    shac = _train(*[a for a in small if a not in ("--algo", "ppo")][:6], "--out", split, "--resume")
    assert shac.returncode == 2 and "ppo run" in shac.stderr, shac.stderr
    second = _train(*small, "--out", split, "--resume")
    assert second.returncode == 0, second.stderr

    a, b = _checkpoint(whole / "checkpoint.h5"), _checkpoint(split / "checkpoint.h5")
    assert set(a) == set(b) and int(a["iteration"]) == 2
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
    assert {"lr", "optimizer/step", "critic/w_out", "disc/replay/data"} <= set(a)
    assert "actor/ln_gain0" not in a  # PPO's actor has no LayerNorm
    rows = (whole / "log.csv").read_text().splitlines()
    log = [dict(zip(rows[0].split(","), r.split(","), strict=True)) for r in rows[1:]]
    assert len(log) == 2 and all(float(r["kl"]) >= 0 and float(r["time_update"]) > 0 for r in log)
    assert float(log[1]["lr_actor"]) == float(a["lr"])
    assert (whole / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((whole / "config.json").read_text())["config"]
    assert config["algo"] == "ppo" and config["critic_hidden"] == [16] and not config["env"]["bcg"]
    policy = load_policy(whole / "policy.h5")
    assert policy.trained_iterations == 2 and not policy.actor_config.layer_norm
    for key, value in policy.params.items():
        assert np.array_equal(value, a[f"actor/{key}"]), key
    bad = _train(*small, "--bcg", "--out", tmp_path / "bad")
    assert bad.returncode == 2 and "--bcg is for SHAC" in bad.stderr and not (tmp_path / "bad").exists()


def test_default_run_folders_of_ppo_and_shac_differ():
    from bcg.learn.train import default_run_dir, parse_args, resolve_config

    ppo = resolve_config(parse_args(["--algo", "ppo", "--motion", "run", "--kappa", "300"]))
    shac = resolve_config(parse_args(["--motion", "run", "--kappa", "300"]))
    from bcg.learn.stages import MOTION_STAGES

    assert isinstance(ppo, PPOConfig) and isinstance(shac, TrainConfig)
    assert shac == TrainConfig(env_stages=MOTION_STAGES["run"])  # Run's recipe of stages
    assert (
        str(default_run_dir(ppo)) == "runs/run_k300_s0_ppo"
        and str(default_run_dir(shac)) == "runs/run_k300_s0"
    )


@pytest.fixture(scope="module")
def ppo_policy(tmp_path_factory):
    run = tmp_path_factory.mktemp("ppo") / "run"
    out = _train(*SMALL, "--set", "env.contact=false", "--set", "actor.hidden=32,16", "--out", run)
    assert out.returncode == 0, out.stderr
    return run / "policy.h5"


def test_a_ppo_policy_runs_in_mujoco_and_in_the_robot_client(ppo_policy, tmp_path, capsys):
    from bcg.robot import run
    from bcg.validate import sim2sim as cli

    out = tmp_path / "r.json"
    args = [str(ppo_policy), "--runs", "1", "--seconds", "0.5", "--training-sim", "off", "--json", str(out)]
    assert cli.main(args) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["runs"] == 1 and np.isfinite(summary["e_track_cm"]["mean"])
    capsys.readouterr()
    assert run.main([str(ppo_policy), "--dry-run"]) == 0
    assert "observation 825 dims" in capsys.readouterr().err
    # the layer-norm attribute is what the loader goes by: flipped, the arrays no longer fit
    flipped = tmp_path / "flipped.h5"
    shutil.copyfile(ppo_policy, flipped)
    with h5py.File(flipped, "r+") as f:
        f["actor"].attrs["layer_norm"] = True
    from bcg.learn.policy import PolicyFileError, load_policy

    with pytest.raises(PolicyFileError, match="ln_gain0"):
        load_policy(flipped)
