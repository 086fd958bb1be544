"""SHAC on bcg.sim with a small differentiable task (a point mass reaching a target), through the same
code as the G1 env; the NaN guard; the TD/bootstrap bookkeeping."""

import dataclasses

import h5py
import numpy as np
import pytest

from bcg.learn.actor import ActorConfig
from bcg.learn.config import TrainConfig
from bcg.learn.critic import CriticConfig
from bcg.learn.env_protocol import StepResult

POINT_MASS = """
<mujoco model="point_mass">
  <option timestep="0.02" gravity="0 0 0"/>
  <worldbody>
    <body name="carriage">
      <joint name="x" type="slide" axis="1 0 0"/>
      <inertial pos="0 0 0" mass="1e-6" diaginertia="1e-8 1e-8 1e-8"/>
      <body name="mass">
        <joint name="y" type="slide" axis="0 1 0"/>
        <inertial pos="0 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""
EPISODE = 30  # control steps


_SIMULATORS = {}


def _simulator(num_envs, horizon):
    """One simulator per shape for the whole module (each new instance compiles its kernels)."""
    import bcg.sim

    key = (num_envs, horizon)
    if key not in _SIMULATORS:
        cfg = bcg.sim.SimConfig(num_envs=num_envs, dt=0.02, substeps=2, max_steps=horizon)
        _SIMULATORS[key] = bcg.sim.Simulator(POINT_MASS, cfg, actuated_joints=("x", "y"), kp=20.0, kd=6.0)
    return _SIMULATORS[key]


class PointMassEnv:
    """Reach a random target: obs (p, v, target), action = PD target, r = -‖p_{k+1} - target‖²."""

    obs_dim, act_dim = 6, 2

    def __init__(self, num_envs, horizon, rng):
        self.sim = _simulator(num_envs, horizon)
        self.num_envs, self.horizon, self.rng = num_envs, horizon, rng
        self.qpos = np.zeros((num_envs, 2))
        self.qvel = np.zeros((num_envs, 2))
        self.target = np.zeros((num_envs, 2))
        self.steps = np.zeros(num_envs, np.int64)
        self.mass = np.ones(num_envs)
        self.needs_reset = np.ones(num_envs, bool)
        self.finished = []

    def request_reset(self, mask):
        self.needs_reset |= mask

    def _obs(self, q, v):
        return np.concatenate([q, v, self.target], axis=1)

    def begin_window(self):
        idx = np.flatnonzero(self.needs_reset)
        self.qpos[idx] = self.rng.uniform(-1, 1, (len(idx), 2))
        self.qvel[idx] = 0.0
        self.target[idx] = self.rng.uniform(-1, 1, (len(idx), 2))
        self.steps[idx] = 0
        self.needs_reset[:] = False
        body_mass = np.zeros((self.num_envs, 3))
        body_mass[:, 1] = 1e-6
        body_mass[:, 2] = self.mass
        if np.all(np.isfinite(body_mass)):
            self.sim.set_params(body_mass=body_mass)
        else:  # set_params refuses a non-finite value: a corrupted parameter is written past it
            self.sim.mdl.body_mass.from_numpy(body_mass.astype(self.sim.np_fp))
        self.sim.set_state(self.qpos, self.qvel)
        self.states = [(self.qpos.copy(), self.qvel.copy())]
        self.alive = np.ones(self.num_envs, bool)
        obs = self._obs(self.qpos, self.qvel)
        return obs, obs

    def step(self, actions):
        self.sim.step(np.asarray(actions, np.float64))
        q, v = self.sim.qpos_now.astype(np.float64), self.sim.qvel_now.astype(np.float64)
        self.states.append((q, v))
        reward = -np.sum((q - self.target) ** 2, axis=1)
        self.steps += self.alive
        truncated = (self.steps >= EPISODE) & self.alive
        nonfinite = ~np.all(np.isfinite(q), axis=1)
        terminated = nonfinite & self.alive
        alive = self.alive.copy()
        self.alive &= ~(terminated | truncated)
        self.needs_reset |= terminated | truncated
        for e in np.flatnonzero(terminated | truncated):
            self.finished.append((int(self.steps[e]), 0.0, bool(terminated[e])))
        obs = self._obs(q, v)
        info = {
            "alive": alive,
            "nonfinite": nonfinite,
            "tracking_error": np.linalg.norm(q - self.target, axis=1),
        }
        return StepResult(obs, obs, reward, terminated, truncated, info)

    def end_window(self):
        self.qpos, self.qvel = (x.copy() for x in self.states[-1])

    def state_vjp(self, k, g_obs, g_reward):
        q, _ = self.states[k]
        gq = np.zeros_like(q)
        gv = np.zeros_like(q)
        if g_obs is not None:
            gq += g_obs[:, 0:2]
            gv += g_obs[:, 2:4]
        if g_reward is not None:
            gq += -2 * g_reward[:, None] * (q - self.target)
        return gq, gv, {}

    def ctrl_vjp(self, k, g_ctrl):
        return {k: np.asarray(g_ctrl, np.float64)}

    def state_dict(self):
        return {"qpos": self.qpos.copy(), "qvel": self.qvel.copy()}

    def load_state_dict(self, d):
        self.qpos, self.qvel = d["qpos"], d["qvel"]


def _config(iterations=30):
    return TrainConfig(
        seed=0,
        iterations=iterations,
        num_envs=32,
        horizon=10,
        actor=ActorConfig(hidden=(32, 32), log_std_init=-1.0),
        critic=CriticConfig(hidden=(32, 32), iterations=4),
        return_normalization=False,
    )


def _learner(ti64, cfg, tmp_path=None):
    from bcg.learn.shac import Shac

    env = PointMassEnv(cfg.num_envs, cfg.horizon, np.random.default_rng(1))
    messages = []
    shac = Shac(cfg, env, None, np.random.default_rng(cfg.seed), log=messages.append, dump_dir=tmp_path)
    return shac, env, messages


def _evaluate(shac, env, episodes=64):
    """Mean reward per step of the deterministic policy over full episodes from fixed starts."""
    from bcg.learn.actor import actor_mean

    rng = np.random.default_rng(123)
    q = rng.uniform(-1, 1, (episodes, 2))
    v = np.zeros_like(q)
    target = rng.uniform(-1, 1, (episodes, 2))
    total = 0.0
    dt, kp, kd = 0.02, 20.0, 6.0
    for _ in range(EPISODE):
        obs = np.concatenate([q, v, target], axis=1)
        a = actor_mean(shac.cfg.actor, shac.actor, shac.obs_rms.normalize(obs))
        for _ in range(2):  # the simulator's semi-implicit Euler on a unit point mass
            v = v + dt * (kp * (a - q) - kd * v)
            q = q + dt * v
        total += float(np.mean(np.sum((q - target) ** 2, axis=1)))
    return -total / EPISODE


def test_shac_learns_point_mass_reaching(ti64):
    shac, env, _ = _learner(ti64, _config())
    before = _evaluate(shac, env)
    rewards = [shac.iteration_step()["reward"] for _ in range(shac.cfg.iterations)]
    after = _evaluate(shac, env)
    assert before < -0.5  # the initial policy asks for the origin: error ~ ‖target‖²
    # better than asking for the target directly (-0.20 on these starts), which a linear feedback beats
    assert after > -0.19, (before, after, rewards[::5])
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5])


def test_nan_state_skips_the_update_and_resets_the_env(ti64, tmp_path):
    shac, env, messages = _learner(ti64, _config(iterations=5), tmp_path)
    first = shac.iteration_step()
    assert first["skipped"] == 0.0
    shac.take_critic_fit()  # the first iteration's fit (otherwise taken after the next rollout)
    actor = {k: v.copy() for k, v in shac.actor.items()}
    critic = [dict((k, v.copy()) for k, v in m.items()) for m in shac.critic.members]
    rms_count = shac.obs_rms.count
    env.mass[3] = np.nan  # a broken parameter makes env 3's state non-finite
    stats = shac.iteration_step()
    assert stats["skipped"] == 1.0 and stats["nan_events"] == 1.0
    for k, v in shac.actor.items():
        assert np.array_equal(v, actor[k]), k
    for member, saved in zip(shac.critic.members, critic, strict=True):
        assert all(np.array_equal(member[k], saved[k]) for k in saved)
    assert shac.obs_rms.count == rms_count
    assert shac.take_critic_fit() == {}  # the skipped iteration's fit is dropped
    for member, saved in zip(shac.critic.members, critic, strict=True):
        assert all(np.array_equal(member[k], saved[k]) for k in saved)
    assert env.needs_reset[3]
    assert len(messages) == 1 and "non-finite" in messages[0] and "[3]" in messages[0]
    dump = shac.guard.last_dump
    assert dump is not None and dump.parent == tmp_path
    with h5py.File(dump) as f:
        qpos = f["qpos"][()]
        assert f["bad_envs"][()].tolist() == [e == 3 for e in range(env.num_envs)]
        assert not np.all(np.isfinite(qpos[:, 3])) and np.all(np.isfinite(qpos[:, :3]))
    env.mass[3] = 1.0
    after = shac.iteration_step()
    assert after["skipped"] == 0.0
    assert np.all(np.isfinite(env.qpos))
    assert any(not np.array_equal(v, actor[k]) for k, v in shac.actor.items())


def test_bootstrap_after_a_timeout_is_the_target_critic(ti64):
    """The actor loss of one window, recomputed by hand from the rollout's rewards and critic values."""
    import copy

    from bcg.learn.critic import critic_value

    cfg = dataclasses.replace(_config(iterations=3), horizon=10)
    shac, env, _ = _learner(ti64, cfg)
    env.steps[:] = EPISODE - 4  # every episode times out at step 3 of the first window
    env.needs_reset[:] = False
    env.qpos[:] = 0.5
    env.target[:] = -0.5
    captured = {}
    rollout = shac.rollout

    def spy(rms):
        w = rollout(rms)
        captured["w"], captured["rms"] = w, rms
        return w

    shac.rollout = spy
    critic = copy.deepcopy(shac.critic)
    stats = shac.iteration_step()
    w = captured["w"]
    assert w.truncated[3].all() and not w.truncated[:3].any()
    gamma, n, h = cfg.gamma, cfg.num_envs, cfg.horizon
    v_end = critic_value(critic, w.obs_critic_hat[4], target=True)[0]
    expected = -(np.sum(gamma ** np.arange(4)[:, None] * w.rewards[:4]) + gamma**4 * np.sum(v_end)) / (n * h)
    assert stats["actor_loss"] == pytest.approx(expected, rel=1e-4)


def test_early_tracking_error_averages_the_first_half_second_of_each_episode_only():
    from types import SimpleNamespace

    from bcg.learn.shac import Shac
    from bcg.learn.window import EARLY_TRACKING_STEPS, Window

    h, n = 4, 3
    first = EARLY_TRACKING_STEPS - 1
    steps = np.array([[first + k, 1 + k, -1] for k in range(h)])  # env 2 does not report its steps
    err = np.array([[0.1, 0.3, 0.5], [0.2, 0.3, 0.5], [9.0, 0.3, 0.5], [9.0, 0.3, 0.5]])
    alive = np.ones((h, n), bool)
    alive[3, 1] = False  # env 1's episode ended before the last step
    w = Window(
        obs_hat=None, obs_critic_hat=None, caches=[], rewards=np.zeros((h, n)), terminated=None,
        truncated=None, alive=alive, noise=None, tracking_error=err, episode_step=steps, delta=None,
        nonfinite=np.zeros(n, bool), obs_raw=None,
    )  # fmt: skip
    stats = Shac._window_stats(SimpleNamespace(env=SimpleNamespace()), w)
    assert stats["tracking_error_early_cm"] == pytest.approx(100 * np.mean([0.1, 0.2, 0.3, 0.3, 0.3]))
    assert stats["tracking_error_cm"] == pytest.approx(100 * err[alive].mean())


def test_a_lost_update_worker_is_reported_and_its_updates_run_here(ti64):
    """The worker process killed while the critic fit is pending: the learner logs it, fits the
    critic itself from the data it kept and goes on without a worker, the same training as one that
    never had a worker (up to float32 round-off)."""
    cfg = _config(iterations=3)
    lost, _, messages = _learner(ti64, cfg)
    lost.iteration_step()
    assert lost._critic_worker is not None and lost._critic_job[0] == "worker"
    lost._critic_worker._proc.kill()
    lost._critic_worker._proc.wait()
    lost.iteration_step()
    lost.iteration_step()
    assert lost._critic_worker is None and lost._critic_job[0] == "here"
    assert len(messages) == 1 and "update worker failed" in messages[0] and "exited" in messages[0]
    here, _, _ = _learner(ti64, dataclasses.replace(cfg, critic_worker=False))
    for _ in range(3):
        here.iteration_step()
    lost.take_critic_fit()
    here.take_critic_fit()
    for a, b in zip(lost.critic.members, here.critic.members, strict=True):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for key in here.actor:
        np.testing.assert_allclose(lost.actor[key], here.actor[key], rtol=1e-5, atol=1e-6, err_msg=key)
