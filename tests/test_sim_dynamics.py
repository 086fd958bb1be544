"""bcg.sim kinematics and dynamics against MuJoCo, in float64, on the G1 and two test models."""

import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.sim.model import JNT_BALL, JNT_FREE, JNT_HINGE, JNT_SLIDE
from tests.models import CHAIN, FLOATING

N_STATES = 100


def random_states(mj, n, rng):
    """Random configurations (random base pose, joints within range, unit quaternions), velocities
    up to +-5 rad/s and torques."""
    qpos = np.zeros((n, mj.nq))
    qvel = rng.uniform(-5, 5, (n, mj.nv))
    for j in range(mj.njnt):
        a, t = mj.jnt_qposadr[j], mj.jnt_type[j]
        if t == JNT_FREE:
            qpos[:, a : a + 3] = rng.uniform(-2, 2, (n, 3))
            q = rng.normal(size=(n, 4))
            qpos[:, a + 3 : a + 7] = q / np.linalg.norm(q, axis=1, keepdims=True)
        elif t == JNT_BALL:
            q = rng.normal(size=(n, 4))
            qpos[:, a : a + 4] = q / np.linalg.norm(q, axis=1, keepdims=True)
        elif mj.jnt_limited[j]:
            qpos[:, a] = rng.uniform(*mj.jnt_range[j], n)
        else:
            qpos[:, a] = rng.uniform(-np.pi, np.pi, n) if t == JNT_HINGE else rng.uniform(-0.3, 0.3, n)
    tau = rng.uniform(-20, 20, (n, mj.nv))
    return qpos, qvel, tau


def compare_with_mujoco(mj, seed=0):
    from bcg.sim.rollout import SimConfig, Simulator

    rng = np.random.default_rng(seed)
    qpos, qvel, tau = random_states(mj, N_STATES, rng)
    sim = Simulator(mj, SimConfig(num_envs=N_STATES, max_steps=1))
    out = sim.forward(qpos, qvel, qfrc_applied=tau)
    data = mujoco.MjData(mj)
    full = np.zeros((mj.nv, mj.nv))
    worst = dict(xpos=0.0, xquat=0.0, qM=0.0, bias=0.0, qacc=0.0)
    for e in range(N_STATES):
        data.qpos[:], data.qvel[:], data.qfrc_applied[:] = qpos[e], qvel[e], tau[e]
        mujoco.mj_forward(mj, data)
        mujoco.mj_fullM(mj, data, full)
        # quaternions are defined up to sign
        dq = np.minimum(
            np.abs(out["xquat"][e] - data.xquat).max(axis=1), np.abs(out["xquat"][e] + data.xquat).max(axis=1)
        )
        worst["xpos"] = max(worst["xpos"], np.abs(out["xpos"][e] - data.xpos).max())
        worst["xquat"] = max(worst["xquat"], dq.max())
        worst["qM"] = max(worst["qM"], np.abs(out["qM"][e] - full).max() / np.abs(full).max())
        worst["bias"] = max(
            worst["bias"], np.abs(out["qfrc_bias"][e] - data.qfrc_bias).max() / np.abs(data.qfrc_bias).max()
        )
        worst["qacc"] = max(worst["qacc"], np.abs(out["qacc"][e] - data.qacc).max() / np.abs(data.qacc).max())
    return worst


@pytest.mark.parametrize("name", ["g1", "chain", "floating"])
def test_dynamics_match_mujoco(ti64, name):
    mj = {
        "g1": lambda: g1.load_model(floor=False, collisions="none"),
        "chain": lambda: mujoco.MjModel.from_xml_string(CHAIN),
        "floating": lambda: mujoco.MjModel.from_xml_string(FLOATING),
    }[name]()
    if name == "chain":
        assert set(mj.jnt_type) == {JNT_HINGE, JNT_SLIDE}
    if name == "floating":
        assert set(mj.jnt_type) == {JNT_FREE, JNT_BALL, JNT_HINGE}
    worst = compare_with_mujoco(mj)
    assert worst["xpos"] < 1e-9 and worst["xquat"] < 1e-9, worst
    assert worst["qM"] < 1e-8 and worst["bias"] < 1e-8, worst
    assert worst["qacc"] < 1e-7, worst


@pytest.mark.parametrize("name", ["g1", "floating"])
def test_mass_matrix_factor_and_solve(ti64, name):
    """The stored factor is lower triangular with a positive diagonal and reproduces M = L L^T, and
    the solve matches a dense one."""
    from bcg.sim.rollout import SimConfig, Simulator

    mj = (
        g1.load_model(floor=False, collisions="none")
        if name == "g1"
        else mujoco.MjModel.from_xml_string(FLOATING)
    )
    rng = np.random.default_rng(5)
    qpos, qvel, tau = random_states(mj, 8, rng)
    sim = Simulator(mj, SimConfig(num_envs=8, max_steps=1))
    out = sim.forward(qpos, qvel, qfrc_applied=tau)
    chol = sim.dyn.chol.to_numpy()[:8]
    for e in range(8):
        m = out["qM"][e]
        lower = np.tril(chol[e])
        assert np.all(np.diag(lower) > 0)
        np.testing.assert_allclose(lower @ lower.T, m, rtol=0, atol=1e-10 * np.abs(m).max())
        rhs = tau[e] - out["qfrc_bias"][e]
        np.testing.assert_allclose(out["qacc"][e], np.linalg.solve(m, rhs), rtol=1e-9, atol=1e-9)


def test_pd_rollout_matches_mujoco_euler(ti64):
    """1 s with gravity and PD, no contact: the same semi-implicit Euler as MuJoCo's Euler."""
    from bcg.sim.rollout import SimConfig, Simulator

    mj = g1.load_model(floor=False, collisions="none")
    mj.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    steps = 50  # control steps of 20 ms: 1 s
    sim = Simulator(
        mj, SimConfig(num_envs=1, max_steps=steps), actuated_joints=g1.JOINT_NAMES, kp=g1.KP, kd=g1.KD,
        effort_limit=g1.EFFORT_LIMIT,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    qpos = g1.default_qpos(mj)
    qvel = rng.uniform(-0.5, 0.5, mj.nv)
    ctrl = g1.DEFAULT_JOINT_POS + 0.3 * np.sin(np.linspace(0, 6, steps))[:, None] * rng.uniform(-1, 1, 29)
    sim.set_state(qpos[None], qvel[None])
    traj, _ = sim.rollout(ctrl[:, None, :])
    data = mujoco.MjData(mj)
    data.qpos[:], data.qvel[:] = qpos, qvel
    qa, da = g1.joint_qpos_adr(mj), g1.joint_dof_adr(mj)
    worst = 0.0
    for c in range(steps):
        for _ in range(4):
            tau = g1.KP * (ctrl[c] - data.qpos[qa]) - g1.KD * data.qvel[da]
            data.qfrc_applied[:] = 0
            data.qfrc_applied[da] = np.clip(tau, -g1.EFFORT_LIMIT, g1.EFFORT_LIMIT)
            mujoco.mj_step(mj, data)
        worst = max(worst, np.abs(traj[c + 1, 0, :3] - data.qpos[:3]).max())
    assert abs(data.qpos[2] - qpos[2]) > 1.0  # it fell under gravity: the test is not trivial
    assert worst < 1e-6, worst
