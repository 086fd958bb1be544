"""The G1 tracking environment: reward and observation gradients through the simulator against central
finite differences (float64), resets, terminations and domain randomisation."""

import dataclasses
import types

import numpy as np
import pytest

from bcg.core import g1
from bcg.core.rotations import tilt
from bcg.learn.config import EnvConfig
from bcg.learn.discriminator import DiscriminatorConfig, add_reward, discriminator_init, tracking_reward
from bcg.learn.features import FEATURE_SIZE, add_features
from bcg.learn.observation import OBSERVATION_SIZE
from bcg.motion import MotionClip
from bcg.validate.metrics import heading_errors

STEPS = 3


@pytest.fixture(scope="module")
def clip():
    return MotionClip.load("run")


def _disc(rng):
    disc = discriminator_init(DiscriminatorConfig(hidden=(32, 16)), FEATURE_SIZE, rng, dtype=np.float64)
    disc.normalizer.mean_abs[:] = 0.05  # differentials of a few cm / cents of a radian map to O(1)
    return disc


_SIMULATORS = {}


def _env(ti64, clip, cfg, num_envs=2, steps=STEPS, seed=3):
    """A fresh env; simulators are shared per shape (each new instance compiles its kernels)."""
    from bcg.g1sim import make_g1
    from bcg.learn.env import G1TrackingEnv

    sim = _SIMULATORS.get((num_envs, steps))
    if sim is None:
        sim = _SIMULATORS[(num_envs, steps)] = make_g1(num_envs, max_steps=steps)
    rng = np.random.default_rng(seed)
    return G1TrackingEnv(cfg, num_envs, steps, _disc(rng), rng, clip=clip, sim=sim)


def _rollout(env, start, actions, latency, weights_r, weights_obs, means=None):
    """L = Σ_k w_r[k] · r_k + Σ_k <W_k, o_k> (k = 1..T) for open-loop actions (T, N, 29) (and
    mean actions for the action-rate term, None: the actions)."""
    env.load_state_dict(start)
    env.begin_window()
    env.latency[:] = latency
    loss = 0.0
    for k, a in enumerate(actions):
        res = env.step(a, mean_actions=None if means is None else means[k])
        loss += float(weights_r[k] @ res.reward) + float(np.sum(weights_obs[k + 1] * res.obs_critic))
    return loss


def _check_reward_gradient(env, start, actions, rng):
    """The gradient of L = Σ_k w_k · r_k (random weights, no latency) with respect to open-loop
    actions (T, N, 29), from the reverse pass, against central differences along random directions."""
    from bcg.learn.window import window_backward

    n = env.num_envs
    w_r = rng.normal(0.0, 1.0, (STEPS, n))
    w_obs = {k: np.zeros((n, OBSERVATION_SIZE)) for k in range(1, STEPS + 1)}
    latency = np.zeros(n, np.int64)
    _rollout(env, start, actions, latency, w_r, w_obs)
    g_actions = np.zeros_like(actions)

    def policy_vjp(k, g_a, g_mean=None):
        g_actions[k] = g_a if g_mean is None else g_a + g_mean
        return None

    window_backward(env, w_r, w_obs, policy_vjp)
    eps = 1e-6
    for d in [rng.normal(size=actions.shape) for _ in range(3)]:
        plus = _rollout(env, start, actions + eps * d, latency, w_r, w_obs)
        minus = _rollout(env, start, actions - eps * d, latency, w_r, w_obs)
        fd = (plus - minus) / (2 * eps)
        assert float(np.sum(g_actions * d)) == pytest.approx(fd, rel=2e-5, abs=1e-6), fd


def test_return_gradient_matches_finite_differences(ti64, clip):
    from bcg.learn.window import window_backward

    cfg = dataclasses.replace(EnvConfig().without_randomisation(), dr_latency=True)
    env = _env(ti64, clip, cfg)
    rng = np.random.default_rng(0)
    n = env.num_envs
    start = env.state_dict()
    actions = rng.normal(0.0, 0.3, (STEPS, n, g1.NUM_JOINTS))
    latency = np.array([0, 1])  # one env acts immediately, the other one step late
    w_r = rng.normal(0.0, 1.0, (STEPS, n))
    w_obs = {k: rng.normal(0.0, 0.2, (n, OBSERVATION_SIZE)) for k in range(1, STEPS + 1)}

    loss = _rollout(env, start, actions, latency, w_r, w_obs)
    g_actions = np.zeros_like(actions)

    def policy_vjp(k, g_a, g_mean=None):
        g_actions[k] = g_a if g_mean is None else g_a + g_mean  # mean = action here
        return None

    window_backward(env, w_r, w_obs, policy_vjp)
    assert np.all(np.isfinite(g_actions)) and np.abs(g_actions).max() > 0
    # the late env's last action only enters the action-rate term
    assert np.allclose(
        g_actions[-1, 1], -2 * cfg.action_rate_weight * w_r[-1, 1] * (actions[-1, 1] - actions[-2, 1])
    )

    eps = 1e-6
    directions = [rng.normal(size=actions.shape) for _ in range(2)]
    for index in [(0, 0, 3), (0, 1, 9), (1, 0, 0), (1, 1, 14), (2, 0, 20)]:
        d = np.zeros_like(actions)
        d[index] = 1.0
        directions.append(d)
    for d in directions:
        plus = _rollout(env, start, actions + eps * d, latency, w_r, w_obs)
        minus = _rollout(env, start, actions - eps * d, latency, w_r, w_obs)
        fd = (plus - minus) / (2 * eps)
        analytic = float(np.sum(g_actions * d))
        assert analytic == pytest.approx(fd, rel=2e-5, abs=1e-6 * (1 + abs(loss))), (fd, analytic)


def test_action_rate_on_the_mean_action_takes_its_gradient_to_the_mean(ti64, clip):
    """With ``action_rate_on="mean"`` the rate term reads the mean actions m_k: its gradient reaches
    the policy through m (FD in m), and a change of the sampled actions alone leaves it unchanged."""
    from bcg.learn.window import window_backward

    cfg = EnvConfig().without_randomisation()
    assert cfg.action_rate_on == "mean"
    env = _env(ti64, clip, cfg)
    rng = np.random.default_rng(1)
    n = env.num_envs
    start = env.state_dict()
    actions = rng.normal(0.0, 0.3, (STEPS, n, g1.NUM_JOINTS))
    means = actions + rng.normal(0.0, 0.5, actions.shape)  # what a noisy sample is drawn around
    latency = np.array([0, 1])  # the rate term reads the means whatever the actuation delay
    w_r = rng.normal(0.0, 1.0, (STEPS, n))
    w_obs = {k: np.zeros((n, OBSERVATION_SIZE)) for k in range(1, STEPS + 1)}
    loss = _rollout(env, start, actions, latency, w_r, w_obs, means)
    g_a, g_m = np.zeros_like(actions), np.zeros_like(actions)

    def policy_vjp(k, ga, gm=None):
        assert gm is not None  # the env asks for the mean's gradient separately
        g_a[k], g_m[k] = ga, gm
        return None

    window_backward(env, w_r, w_obs, policy_vjp)
    # the last step's mean enters only the rate term, with the means' difference
    assert np.allclose(g_m[-1], -2 * cfg.action_rate_weight * w_r[-1][:, None] * (means[-1] - means[-2]))
    eps = 1e-6
    for d in [rng.normal(size=means.shape) for _ in range(2)]:
        plus = _rollout(env, start, actions, latency, w_r, w_obs, means + eps * d)
        minus = _rollout(env, start, actions, latency, w_r, w_obs, means - eps * d)
        fd = (plus - minus) / (2 * eps)
        assert float(np.sum(g_m * d)) == pytest.approx(fd, rel=1e-6, abs=1e-8 * (1 + abs(loss)))
    # the sampled action reaches the loss only through the dynamics and ADD, never the rate term
    sample = dataclasses.replace(cfg, action_rate_on="sample")
    env_s = _env(ti64, clip, sample)
    loss_s = _rollout(env_s, start, actions, latency, w_r, w_obs)
    loss_m = _rollout(env, start, actions, latency, w_r, w_obs, actions)
    assert loss_s == pytest.approx(loss_m, rel=1e-12)
    with pytest.raises(ValueError, match="action_rate_on"):
        EnvConfig(action_rate_on="noise")
    # no means given: the rate reads the actions and its gradient goes to them
    _rollout(env, start, actions, latency, w_r, w_obs)
    assert env.wants_mean_actions and not env.rate_on_mean
    env.load_state_dict(start)
    env.begin_window()
    env.step(actions[0], mean_actions=means[0])
    with pytest.raises(ValueError, match="every step of a window or at none"):
        env.step(actions[1])


def test_reset_draws_reference_states_with_the_paper_noise(ti64, clip):
    cfg = EnvConfig().without_randomisation()
    env = _env(ti64, clip, cfg)
    env.begin_window()
    # without noise the start is the reference state at the drawn phase
    ref = clip.sample(env.time)
    assert np.allclose(env.qpos, clip.qpos(ref)) and np.allclose(env.qvel, clip.qvel(ref))
    assert np.all(env.time >= 0) and np.all(env.time <= clip.duration - 3 * g1.CONTROL_DT)

    noisy = _env(ti64, clip, dataclasses.replace(cfg, reset_noise=True), num_envs=32)
    noisy.begin_window()
    ref = clip.sample(noisy.time)
    q_ref = clip.qpos(ref)
    dxy = noisy.qpos[:, :2] - q_ref[:, :2]
    dz = noisy.qpos[:, 2] - q_ref[:, 2]
    jq = g1.joint_qpos_adr(g1.load_model(floor=False, collisions="none"))
    dj = noisy.qpos[:, jq] - q_ref[:, jq]
    assert 0.03 < np.abs(dxy).max() <= 0.05 and 0.005 < np.abs(dz).max() <= 0.01
    assert 0.08 < np.abs(dj).max() <= 0.1
    # the joint noise stays within the joint limits (or no further beyond one than the reference):
    # with a 1 rad noise many joints reach a limit, none passes it
    wide = _env(ti64, clip, dataclasses.replace(cfg, reset_noise=True, reset_joint_pos=1.0), num_envs=32)
    wide.begin_window()
    limits = g1.joint_limits(g1.load_model(floor=False, collisions="none"))
    q, qr = wide.qpos[:, jq], clip.qpos(clip.sample(wide.time))[:, jq]
    lo, hi = np.minimum(limits[:, 0], qr), np.maximum(limits[:, 1], qr)
    assert np.all(q >= lo - 1e-12) and np.all(q <= hi + 1e-12)
    assert np.sum((q == lo) | (q == hi)) > 50
    # orientation noise: the angle between the two root frames is at most |(0.1, 0.1, 0.2)|
    dot = np.abs(np.sum(noisy.qpos[:, 3:7] * q_ref[:, 3:7], axis=1))
    angle = 2 * np.arccos(np.clip(dot, -1, 1))
    assert angle.max() <= np.linalg.norm([0.1, 0.1, 0.2]) + 1e-9 and angle.max() > 0.05


@pytest.mark.parametrize("imitation", ["add", "tracking"])
def test_reward_is_imitation_minus_action_rate_and_falls_end_the_episode(ti64, clip, imitation):
    # the paper's literal reward: no alive reward, no height term (tested on their own below)
    literal = dataclasses.replace(EnvConfig().without_randomisation(), alive_reward=0.0, height_weight=0.0)
    cfg = dataclasses.replace(literal, imitation_reward=imitation)
    env = _env(ti64, clip, cfg, num_envs=2, steps=STEPS)
    env.begin_window()
    a0 = np.full((2, g1.NUM_JOINTS), 0.1)
    hold = env.prev_action.copy()  # the action whose target is the start pose (env.reset_action)
    jq = g1.joint_qpos_adr(g1.load_model(floor=False, collisions="none"))
    assert np.allclose(hold, (env.qpos[:, jq] - g1.DEFAULT_JOINT_POS) / g1.ACTION_SCALE)
    res = env.step(a0)
    robot = env._robots[1]
    ref = clip.sample(env.time)
    delta = add_features(env._refs[0][0], env._axes) - add_features(robot, env._axes)
    assert np.allclose(env._refs[0][0].root_pos, ref.root_pos)
    r_imitation, _ = (add_reward if imitation == "add" else tracking_reward)(env.disc, delta)
    assert np.allclose(res.reward, r_imitation - 0.8 * np.sum((a0 - hold) ** 2, axis=1))
    zero = _env(ti64, clip, dataclasses.replace(cfg, reset_action="zero"), num_envs=2, steps=STEPS)
    zero.begin_window()
    assert np.all(zero.prev_action == 0) and np.all(zero.prev_rate_action == 0)
    if imitation == "tracking":
        return
    assert np.allclose(res.info["delta"], delta)
    # without contact the robot falls: root height below 0.3 m ends the episode as a termination
    env2 = _env(ti64, clip, cfg)
    ended_at, count = None, 0
    for _ in range(10):  # windows of three steps; the episodes go on across window starts
        env2.begin_window()
        for k in range(STEPS):
            res = env2.step(np.zeros((2, g1.NUM_JOINTS)))
            count += 1
            assert np.all(res.info["episode_step"] == count)  # counted across window starts
            if res.terminated.any():
                ended_at = k
                break
        if ended_at is not None:
            break
        env2.end_window()
    assert ended_at is not None and np.all(env2._robots[ended_at + 1].root_pos[res.terminated, 2] < 0.3)
    assert not res.truncated.any()
    assert np.all(env2.needs_reset[res.terminated]) and not env2.alive[res.terminated].any()


def test_clip_end_is_a_timeout(ti64, clip):
    env = _env(ti64, clip, EnvConfig().without_randomisation())
    env.begin_window()
    env.time[:] = clip.duration - 3 * g1.CONTROL_DT - 1.5 * g1.CONTROL_DT  # two steps of reference left
    out = [env.step(np.zeros((2, g1.NUM_JOINTS))) for _ in range(2)]
    assert not out[0].truncated.any() and out[1].truncated.all()
    assert not out[1].terminated.any()


def test_an_observation_beyond_the_limit_ends_the_episode_as_a_termination(ti64, clip, monkeypatch):
    from bcg.learn.env import OBS_LIMIT

    env = _env(ti64, clip, EnvConfig().without_randomisation())
    env.begin_window()
    observe = env._observe

    def blown_up(k):  # env 1's state observed with one entry just past the limit
        obs, obs_critic = observe(k)
        obs_critic = obs_critic.copy()
        obs_critic[1, 7] = -1.001 * OBS_LIMIT
        return obs, obs_critic

    monkeypatch.setattr(env, "_observe", blown_up)
    res = env.step(np.zeros((2, g1.NUM_JOINTS)))
    assert res.terminated.tolist() == [False, True] and not res.truncated.any()
    assert env.alive.tolist() == [True, False] and env.needs_reset.tolist() == [False, True]
    assert not res.info["nonfinite"].any()  # the state is finite: an ordinary termination, not a NaN event
    assert env.finished == [(1, float(res.reward[1]), True, False)]
    # for the rest of the window env 1 is held out of the simulation: its state stands still
    monkeypatch.setattr(env, "_observe", observe)
    before = env.sim.qpos_now.copy()
    env.step(np.zeros((2, g1.NUM_JOINTS)))
    after = env.sim.qpos_now
    np.testing.assert_array_equal(after[1], before[1])
    assert np.abs(after[0] - before[0]).max() > 1e-6


def test_a_body_farther_than_the_pose_termination_distance_ends_the_episode(ti64, clip):
    from bcg.learn.window import window_stats

    base = EnvConfig().without_randomisation()
    for dist, ends in ((0.0, False), (10.0, False), (1e-4, True)):
        env = _env(ti64, clip, dataclasses.replace(base, pose_termination_dist=dist))
        env.begin_window()
        res = env.step(np.zeros((2, g1.NUM_JOINTS)))
        # one step off the reference start: every body is within centimetres of its reference
        far = np.linalg.norm(env._robots[1].body_pos - env._refs[0][0].body_pos, axis=-1).max(axis=1)
        assert np.all(far > 1e-4) and np.all(far < 0.1)
        assert res.terminated.tolist() == [ends, ends] and not res.truncated.any()
        assert res.info["lost_track"].tolist() == [ends, ends]
        assert [f[2:] for f in env.finished] == ([(True, True)] * 2 if ends else [])
        if ends:
            w = types.SimpleNamespace(
                alive=np.ones((1, 2), bool),
                nonfinite=np.zeros(2, bool),
                tracking_error=np.zeros((1, 2)),
                episode_step=np.ones((1, 2)),
                rewards=np.zeros((1, 2)),
                leg_gap=None,
            )
            stats = window_stats(env, w)
            assert stats["fall_rate"] == 1.0 and stats["lost_track_rate"] == 1.0
    with pytest.raises(ValueError, match="pose_termination_dist"):
        dataclasses.replace(base, pose_termination_dist=-1.0)


def test_early_ends_are_recorded_for_the_failure_weighted_start_phases(ti64, clip):
    base = EnvConfig().without_randomisation()
    env = _env(ti64, clip, dataclasses.replace(base, pose_termination_dist=1e-4, start_failure_mix=1.0))
    env.begin_window()
    t_end = env.time + g1.CONTROL_DT
    env.step(np.zeros((2, g1.NUM_JOINTS)))  # both envs lose track on the first step
    bins = (t_end / env.start_phases.bin_width).astype(int)
    expected = np.zeros_like(env.start_phases.counts)
    np.add.at(expected, bins, 1.0)
    np.testing.assert_array_equal(env.start_phases.counts, expected)
    assert np.array_equal(env.state_dict()["start_phases"]["counts"], expected)
    # the next window forgets a little and starts both resets within the lead before those times
    env.end_window()
    env.begin_window()
    np.testing.assert_allclose(env.start_phases.counts, expected * base.start_failure_memory)
    lo = bins * env.start_phases.bin_width - base.start_failure_lead
    hi = (bins + 1) * env.start_phases.bin_width
    assert all(np.any((t >= lo) & (t <= hi)) for t in env.time)
    # a timeout is no failure
    env2 = _env(ti64, clip, dataclasses.replace(base, start_failure_mix=1.0))
    env2.begin_window()
    env2.time[:] = clip.duration - 3 * g1.CONTROL_DT - 0.5 * g1.CONTROL_DT
    assert env2.step(np.zeros((2, g1.NUM_JOINTS))).truncated.all()
    assert env2.start_phases.counts.sum() == 0.0
    with pytest.raises(ValueError, match="start_failure_mix"):
        dataclasses.replace(base, start_failure_mix=2.0)


def test_the_clip_begin_mix_starts_episodes_at_the_first_frame(ti64, clip):
    base = EnvConfig().without_randomisation()
    env = _env(ti64, clip, dataclasses.replace(base, start_clip_begin_mix=1.0))
    env.begin_window()
    np.testing.assert_array_equal(env.time, 0.0)
    np.testing.assert_allclose(env.qpos, clip.qpos(clip.sample(np.zeros(2))), atol=1e-12)
    with pytest.raises(ValueError, match="start_clip_begin_mix"):
        dataclasses.replace(base, start_clip_begin_mix=1.5)


def test_the_standing_mix_starts_episodes_still_in_the_default_pose(ti64, clip):
    """The robot as bcg.robot.run starts it: still, in the default pose, on the ground under the
    clip's first root position and facing its heading, at clip time 0."""
    base = EnvConfig().without_randomisation()
    env = _env(ti64, clip, dataclasses.replace(base, start_standing_mix=1.0))
    env.begin_window()
    ref = clip.qpos(clip.sample(np.zeros(2)))
    np.testing.assert_array_equal(env.time, 0.0)
    np.testing.assert_array_equal(env.qvel, 0.0)
    np.testing.assert_allclose(env.qpos[:, env._jq], np.tile(g1.DEFAULT_JOINT_POS, (2, 1)))
    np.testing.assert_allclose(env.qpos[:, :2], ref[:, :2])
    np.testing.assert_allclose(env.qpos[:, 2], g1.DEFAULT_ROOT_POS[2])
    np.testing.assert_allclose(heading_errors(env.qpos[:, 3:7], ref[:, 3:7]), 0.0, atol=1e-9)
    assert max(tilt(q) for q in env.qpos[:, 3:7]) < 1e-6
    with pytest.raises(ValueError, match="start_standing_mix"):
        dataclasses.replace(base, start_standing_mix=-0.5)


def test_the_lead_in_starts_episodes_at_the_first_frame_on_a_reference_at_rest(ti64, clip):
    """With env.clip_lead_in the env plays the clip with its lead-in: a start at the first frame
    sees a reference at rest that speeds up, and the episodes can run L / 2 longer."""
    base = EnvConfig().without_randomisation()
    cfg = dataclasses.replace(base, clip_lead_in=0.5, start_clip_begin_mix=1.0)
    env = _env(ti64, clip, cfg)
    assert env.clip.lead_in == pytest.approx(0.5, abs=clip.dt) and clip.lead_in == 0.0
    assert env.clip.duration == pytest.approx(clip.duration + env.clip.lead_in / 2)
    plain = _env(ti64, clip, dataclasses.replace(cfg, clip_lead_in=0.0))
    assert env._episode_end == pytest.approx(plain._episode_end + env.clip.lead_in / 2)
    env.begin_window()
    assert np.all(env.time == 0.0) and not np.any(env.qvel)  # at rest, as the reference is
    refs = env._refs[0]
    assert 0 < np.abs(refs[0].joint_vel).max() < np.abs(refs[2].joint_vel).max()
    with pytest.raises(ValueError, match="clip_lead_in"):
        dataclasses.replace(base, clip_lead_in=-1.0)


def test_the_lead_out_runs_episodes_past_the_clip_on_its_held_last_frame(ti64, clip):
    """With env.clip_end_hold an episode goes on after the clip's last frame, its reference held
    still, and ends (truncated) after the lead-out; without it, it ends with the clip."""
    base = EnvConfig().without_randomisation()
    for hold, end in ((0.0, clip.duration - 3 * g1.CONTROL_DT), (0.1, clip.duration + 0.1)):
        env = _env(ti64, clip, dataclasses.replace(base, clip_end_hold=hold), steps=8)
        env.begin_window()
        start = end - 5.5 * g1.CONTROL_DT  # the 6th step passes the end
        env.time[:] = start
        env._observe(0)
        truncated_at = None
        for k in range(8):
            result = env.step(np.zeros((2, g1.NUM_JOINTS)))
            if result.truncated.any():
                truncated_at = k
                break
        assert truncated_at == 5, (hold, truncated_at)
        if hold:
            refs = env._refs[4]
            assert not np.any(refs[0].joint_vel) and not np.any(refs[0].root_lin_vel)
    with pytest.raises(ValueError, match="clip_end_hold"):
        dataclasses.replace(base, clip_end_hold=-1.0)


def test_domain_randomisation_ranges_and_switches(ti64, clip):
    cfg = EnvConfig()
    env = _env(ti64, clip, cfg, num_envs=32)
    env.begin_window()
    base = env._base
    pelvis = env._pelvis
    scale = env.params["kp"] / base["kp"]
    assert np.allclose(scale, env.params["kd"] / base["kd"])
    assert 0.8 <= scale.min() < 0.85 and 1.15 < scale.max() <= 1.2
    arm = env.params["dof_armature"][:, 6:] / base["dof_armature"][6:]
    assert 0.75 <= arm.min() < 0.8 and 1.2 < arm.max() <= 1.25
    others = np.delete(np.arange(len(base["body_mass"])), [0, pelvis])
    mass_scale = env.params["body_mass"][:, others] / base["body_mass"][others]
    assert 0.8 <= mass_scale.min() < 0.85 and 1.15 < mass_scale.max() <= 1.2
    com = env.params["body_ipos"][:, 1:] - base["body_ipos"][1:]
    assert 0.025 < np.abs(com).max() <= 0.03
    offset = env.default_pos - g1.DEFAULT_JOINT_POS
    assert 0.008 < np.abs(offset).max() <= 0.01
    assert set(np.unique(env.latency)) == {0, 1}
    assert np.all((env.push_countdown >= 1.0) & (env.push_countdown <= 3.0))
    # the simulator received the drawn parameters
    assert np.allclose(env.sim.get_param("kp"), env.params["kp"])
    assert np.allclose(env.sim.get_param("body_mass"), env.params["body_mass"])

    off = _env(ti64, clip, cfg.without_randomisation())
    off.begin_window()
    assert np.allclose(off.params["kp"], base["kp"]) and np.allclose(
        off.params["body_ipos"], base["body_ipos"]
    )
    assert np.all(off.latency == 0) and np.all(np.isinf(off.push_countdown))


def test_push_changes_the_root_velocity_by_the_drawn_amount(ti64, clip):
    cfg = dataclasses.replace(EnvConfig().without_randomisation(), dr_push=True, push_interval=(0.01, 0.01))
    env = _env(ti64, clip, cfg)
    env.begin_window()
    rng_copy = np.random.default_rng(0)
    rng_copy.bit_generator.state = env.rng.bit_generator.state
    rng_copy.uniform(0.01, 0.01, 2)  # the next countdown
    expected = np.concatenate([rng_copy.uniform(-1, 1, (2, 3)), rng_copy.uniform(-1, 1, (2, 3))], axis=1)
    a = np.zeros((2, g1.NUM_JOINTS))
    env.step(a)
    pushed = env._qvel[1][:, :6]
    plain = _env(ti64, clip, EnvConfig().without_randomisation())  # same simulator
    plain.begin_window()
    assert np.allclose(env.qpos, plain.qpos)
    plain.step(a)
    dv = pushed - plain._qvel[1][:, :6]
    half = np.array([0.5, 0.5, 0.2, 0.52, 0.52, 0.78])
    assert np.all(np.abs(dv) <= half * 1.05)
    # the linear velocity change is the drawn one; the angular one is coupled with the joints' PD
    # response over the four substeps of the step
    assert np.allclose(dv[:, :3], (expected * half)[:, :3], atol=0.03)
    assert np.allclose(dv[:, 3:], (expected * half)[:, 3:], atol=0.4)
    assert np.abs(dv[:, 3:]).max() > 0.1


def test_bundle_settings_in_the_env_config_default_to_the_simulator_s():
    """EnvConfig repeats BundleConfig's defaults (the config module stays free of Taichi): they agree."""
    from bcg.sim import BundleConfig

    env, bundle = EnvConfig(), BundleConfig()
    pairs = {"threshold": "bcg_threshold", "size": "bcg_size", "horizon": "bcg_horizon"}
    pairs |= {"sigma_pos": "bcg_sigma_pos", "sigma_vel": "bcg_sigma_vel", "jacobian_damping": "bcg_damping"}
    pairs |= {"common_noise": "bcg_common_noise", "sampling": "bcg_sampling"}
    for sim_name, env_name in pairs.items():
        assert getattr(env, env_name) == getattr(bundle, sim_name), env_name
    from bcg.learn.config import BCG_SAMPLINGS
    from bcg.sim.bundle import SAMPLINGS

    assert BCG_SAMPLINGS == SAMPLINGS


@pytest.mark.parametrize("cap", [0.0, 30.0])  # w P is about 34 here
def test_leg_clearance_term_and_its_gradient_match_finite_differences(ti64, clip, cap):
    """With the left leg swung across the right one, the reward loses w · Σ max(0, margin - gap)²
    (c x / (1 + x), x = w P / c, under a cap c, here in its curved part), the env reports the legs'
    smallest gap, and the return's gradient (through the simulator's kinematics) matches central
    finite differences."""
    from bcg.learn.clearance import LegCapsules, leg_clearance_penalty

    base = dataclasses.replace(EnvConfig().without_randomisation(), obs_noise=False, leg_clearance_weight=0.0)
    weight = 2000.0
    on = _env(ti64, clip, dataclasses.replace(base, leg_clearance_weight=weight, leg_clearance_cap=cap))
    off = _env(ti64, clip, base)
    start = on.state_dict()
    model = g1.load_model(floor=False, collisions="none")
    roll = g1.JOINT_NAMES.index("left_hip_roll_joint")
    pose = np.array(g1.DEFAULT_JOINT_POS, dtype=float)
    pose[roll] = -0.45  # the left leg swung into the right one (default pose otherwise)
    start["qpos"][:] = g1.default_qpos(model)
    start["qpos"][:, on._jq] = pose
    start["qvel"][:] = 0.0
    start["needs_reset"][:] = False  # begin_window keeps this state
    rng = np.random.default_rng(1)
    n = on.num_envs
    actions = rng.normal(0.0, 0.05, (STEPS, n, g1.NUM_JOINTS))
    actions[:, :, roll] += (pose[roll] - g1.DEFAULT_JOINT_POS[roll]) / np.broadcast_to(
        g1.ACTION_SCALE, pose.shape
    )[roll]
    rewards = {}
    for name, env in (("on", on), ("off", off)):
        env.load_state_dict(start)
        env.begin_window()
        rewards[name] = [env.step(a) for a in actions]
    legs = LegCapsules.of()
    for k, (r_on, r_off) in enumerate(zip(rewards["on"], rewards["off"])):
        xpos = on._xpos(k + 1)
        penalty, gap = leg_clearance_penalty(legs, xpos, on._xquat[k + 1], base.leg_clearance_margin)
        assert np.all(gap < 0) and np.allclose(r_on.info["leg_gap"], gap)
        cost = cap * weight * penalty / (cap + weight * penalty) if cap else weight * penalty
        if cap:
            assert np.all(cost < cap) and np.all(cost < 0.95 * weight * penalty)  # the bound bites
        np.testing.assert_allclose(r_off.reward - r_on.reward, cost, rtol=1e-9)
    _check_reward_gradient(on, start, actions, rng)


@pytest.mark.parametrize("rot_cap", [0.0, 0.2])
def test_alive_height_upright_and_root_pose_terms_and_their_gradient_match_finite_differences(
    ti64, clip, rot_cap
):
    """The alive reward adds a constant; the height term costs w_h max(0, h_ref - h - tol)², the
    upright term w_u ‖u - u_ref‖², the root-rotation term w_r ‖R - R_ref‖² and the root-position term
    w_p ‖p_xy - p_ref,xy‖²; the return's gradient through them matches central differences, the last
    two also bounded as c x / (1 + x), x = w ‖.‖² / c."""

    base = dataclasses.replace(
        EnvConfig().without_randomisation(), obs_noise=False, alive_reward=0.0, height_weight=0.0
    )
    w_h, w_u, w_r, w_p, alive = 50.0, 5.0, 3.0, 4.0, 2.0
    terms = {"height_weight": w_h, "upright_weight": w_u, "alive_reward": alive}
    terms |= {"root_rotation_weight": w_r, "root_rotation_cap": rot_cap}
    pos_cap = 1.5 * rot_cap  # its own cap, so that reading the rotation term's would fail
    terms |= {"root_position_weight": w_p, "root_position_cap": pos_cap}
    on = _env(ti64, clip, dataclasses.replace(base, **terms))
    off = _env(ti64, clip, base)
    start = on.state_dict()
    on.load_state_dict(start)
    on.begin_window()  # draws the episodes' start states
    start = on.state_dict()
    start["needs_reset"][:] = False  # begin_window keeps this state
    start["qpos"][:, on._fq + 2] -= 0.12  # the root sunk below the reference, beyond the tolerance
    start["qpos"][:, on._fq : on._fq + 2] += [0.3, -0.2]  # and off the clip's path
    tip = np.array([np.cos(0.15), np.sin(0.15), 0.0, 0.0])  # and tipped 0.3 rad about its x axis
    q = start["qpos"][:, on._fq + 3 : on._fq + 7]
    w0, v0 = q[:, :1], q[:, 1:]
    start["qpos"][:, on._fq + 3 : on._fq + 7] = np.concatenate(
        [w0 * tip[0] - v0 @ tip[1:, None], w0 * tip[1:] + tip[0] * v0 + np.cross(v0, tip[1:])], axis=1
    )
    rng = np.random.default_rng(2)
    n = on.num_envs
    actions = rng.normal(0.0, 0.1, (STEPS, n, g1.NUM_JOINTS))
    steps = {}
    for name, env in (("on", on), ("off", off)):
        env.load_state_dict(start)
        env.begin_window()
        steps[name] = [env.step(a) for a in actions]
    for k, (r_on, r_off) in enumerate(zip(steps["on"], steps["off"])):
        sunk, tilt, rot = on._sunk[k], on._tilt[k], np.sum(on._rot_err[k] ** 2, axis=(1, 2))
        assert np.all(sunk > 0.01) and np.all(np.sum(tilt**2, axis=1) > 0.01) and np.all(rot > 0.05)
        drift = np.sum(on._drift[k] ** 2, axis=1)
        ref_xy = on._refs[k][0].root_pos[:, :2]
        np.testing.assert_allclose(drift, np.sum((on._robots[k + 1].root_pos[:, :2] - ref_xy) ** 2, 1))
        assert np.all(drift > 0.05)
        # ‖R - R_ref‖² = 4 (1 - cos θ), θ the angle between the two rotations
        robot, ref = on._robots[k + 1], on._refs[k][0]
        cos = (np.abs(np.sum(robot.root_quat * ref.root_quat, axis=1)) ** 2) * 2 - 1
        np.testing.assert_allclose(rot, 4 * (1 - cos), rtol=1e-9)
        rot_cost = rot_cap * (w_r * rot / rot_cap) / (1 + w_r * rot / rot_cap) if rot_cap else w_r * rot
        pos_cost = pos_cap * (w_p * drift / pos_cap) / (1 + w_p * drift / pos_cap) if pos_cap else w_p * drift
        if rot_cap:
            assert np.all(rot_cost < 0.9 * w_r * rot) and np.all(
                pos_cost < 0.9 * w_p * drift
            )  # the bound bites
        expected = alive - w_h * sunk**2 - w_u * np.sum(tilt**2, axis=1) - rot_cost - pos_cost
        np.testing.assert_allclose(r_on.reward - r_off.reward, expected, rtol=1e-9)
    _check_reward_gradient(on, start, actions, rng)
