"""Reverse-mode gradients of multi-step rollouts against central finite differences (float64)."""

import os
import subprocess
import sys
import textwrap

import mujoco
import numpy as np
import pytest

from bcg.core import g1
from tests.models import CHAIN, FLOATING
from tests.sim_reference import tree_reference

EPS = 1e-6
RTOL = 1e-5


class Problem:
    """loss = <wq, qpos[T]> + <wv, qvel[T]> + sum_t <wm, qpos[t]> after 2 control steps (8 substeps)."""

    def __init__(self, mj, actuated, kp, kd, limit, seed=0, n=2):
        from bcg.sim.rollout import SimConfig, Simulator

        self.sim = Simulator(
            mj, SimConfig(num_envs=n, max_steps=2), actuated_joints=actuated, kp=kp, kd=kd, effort_limit=limit
        )
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.wq = rng.normal(size=(n, mj.nq))
        self.wv = rng.normal(size=(n, mj.nv))
        self.wm = rng.normal(size=(n, mj.nq)) * 0.1

    def loss(self, qpos, qvel, ctrl, mass=None):
        sim = self.sim
        if mass is not None:
            sim.set_params(body_mass=mass)
        sim.set_state(qpos, qvel)
        sim.rollout(ctrl)
        qp, qv = sim.trajectory()
        return float((qp[-1] * self.wq).sum() + (qv[-1] * self.wv).sum() + (qp * self.wm).sum())

    def grads(self, qpos, qvel, ctrl):
        self.loss(qpos, qvel, ctrl)
        T = self.sim.substep
        gq = np.broadcast_to(self.wm, (T + 1, *self.wm.shape)).copy()
        gq[T] += self.wq
        return self.sim.backward(gq, {T: self.wv})


def fd(f, x, idx):
    xp, xm = x.copy(), x.copy()
    xp[idx] += EPS
    xm[idx] -= EPS
    return (f(xp) - f(xm)) / (2 * EPS)


def check(name, analytic, numeric):
    assert abs(analytic - numeric) <= RTOL * max(abs(numeric), 1.0), f"{name}: {analytic} vs {numeric}"


def test_g1_gradients_match_finite_differences(ti64):
    mj = g1.load_model(floor=False, collisions="none")
    p = Problem(mj, g1.JOINT_NAMES, g1.KP, g1.KD, g1.EFFORT_LIMIT)
    rng = p.rng
    qpos = np.tile(g1.default_qpos(mj), (2, 1))
    qpos[:, 7:] += rng.uniform(-0.2, 0.2, (2, 29))
    qpos[:, 3:7] = [0.97, 0.1, -0.15, 0.12]
    qpos[:, 3:7] /= np.linalg.norm(qpos[:, 3:7], axis=1, keepdims=True)
    qvel = rng.uniform(-1, 1, (2, mj.nv))
    ctrl = np.tile(g1.DEFAULT_JOINT_POS, (2, 2, 1)) + rng.uniform(-0.3, 0.3, (2, 2, 29))
    g = p.grads(qpos, qvel, ctrl)
    # base position, base orientation, leg and arm joints
    for idx in [(0, 0), (0, 2), (1, 3), (0, 5), (0, 10), (1, 25)]:
        check(f"qpos{idx}", g.qpos[idx], fd(lambda x: p.loss(x, qvel, ctrl), qpos, idx))
    # base linear and angular velocity, joints
    for idx in [(0, 1), (1, 4), (0, 9), (1, 30)]:
        check(f"qvel{idx}", g.qvel[idx], fd(lambda x: p.loss(qpos, x, ctrl), qvel, idx))
    for idx in [(0, 0, 3), (1, 1, 20), (1, 0, 10)]:
        check(f"ctrl{idx}", g.ctrl[idx], fd(lambda x: p.loss(qpos, qvel, x), ctrl, idx))
    mass = np.tile(mj.body_mass, (2, 1))
    for idx in [(0, 1), (1, 5), (0, 20)]:
        check(f"mass{idx}", g.params["body_mass"][idx], fd(lambda x: p.loss(qpos, qvel, ctrl, x), mass, idx))
    p.sim.set_params(body_mass=mass)


def test_ball_joint_model_gradients(ti64):
    mj = mujoco.MjModel.from_xml_string(FLOATING)
    p = Problem(mj, ("tip_hinge",), np.array([5.0]), np.array([0.3]), np.array([1.0]), seed=4)
    rng = p.rng
    qpos = np.tile(mj.qpos0, (2, 1))
    q = rng.normal(size=(2, 4))
    qpos[:, 7:11] = q / np.linalg.norm(q, axis=1, keepdims=True)
    qvel = rng.uniform(-2, 2, (2, mj.nv))
    ctrl = rng.uniform(-0.5, 0.5, (2, 2, 1))
    g = p.grads(qpos, qvel, ctrl)
    for idx in [(0, 2), (1, 4), (0, 8), (1, 11)]:
        check(f"qpos{idx}", g.qpos[idx], fd(lambda x: p.loss(x, qvel, ctrl), qpos, idx))
    for idx in [(0, 3), (1, 7), (0, 9)]:
        check(f"qvel{idx}", g.qvel[idx], fd(lambda x: p.loss(qpos, x, ctrl), qvel, idx))
    check("ctrl", g.ctrl[1, 0, 0], fd(lambda x: p.loss(qpos, qvel, x), ctrl, (1, 0, 0)))


def test_detach_cuts_the_gradient(ti64):
    from bcg.sim.rollout import SimConfig, Simulator

    mj = g1.load_model(floor=False, collisions="none")
    sim = Simulator(
        mj, SimConfig(num_envs=1, max_steps=4), actuated_joints=g1.JOINT_NAMES, kp=g1.KP, kd=g1.KD
    )
    sim.set_state(g1.default_qpos(mj)[None], np.zeros((1, mj.nv)))
    ctrl = np.tile(g1.DEFAULT_JOINT_POS + 0.1, (4, 1, 1))
    sim.step(ctrl[0])
    sim.step(ctrl[1])
    sim.detach()
    sim.step(ctrl[2])
    sim.step(ctrl[3])
    g = sim.backward({sim.substep: np.ones((1, mj.nq))})
    full = sim.state.ctrl.grad.to_numpy()
    assert np.all(full[:2] == 0.0)  # exactly zero across the cut
    assert np.abs(full[2:4]).max() > 1e-3
    assert np.abs(g.qpos).max() > 1e-3  # the gradient reaches the cut


VALIDATION_SCRIPT = textwrap.dedent(
    """
    import numpy as np, taichi as ti
    from bcg.sim import runtime
    runtime.init(precision="float64", debug=True, cache_dir=CACHE)
    from bcg.sim.rollout import Simulator, SimConfig
    from bcg.core import g1
    from tests.sim_reference import tree_reference
    mj = g1.load_model(floor=False, collisions="none")
    sim = Simulator(
        mj, SimConfig(num_envs=1, max_steps=1), actuated_joints=g1.JOINT_NAMES, kp=g1.KP, kd=g1.KD
    )
    sim.set_state(g1.default_qpos(mj)[None] + 0.01, np.ones((1, mj.nv)) * 0.3)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.kernel
    def total():
        for e, i in ti.ndrange(1, mj.nv):
            loss[None] += sim.dyn.qfrc_bias[e, i] * (i + 1) + sim.dyn.mass[e, i, i] + sim.dyn.qfrc_total[e, i]

    sim._set_rows(sim._main_rows)
    ref = tree_reference(sim)
    parts = ref.dynamics_parts(0, 0)
    ref.zero_composites()
    with ti.ad.Tape(loss=loss, validation=True):
        for kernel, args in parts:
            kernel(*args)
        total()
    g = sim.state.qpos.grad.to_numpy()[0]
    assert np.isfinite(g).all() and np.abs(g).max() > 0
    print("validated", np.abs(g).max())
    """
)


def test_tape_validation_in_debug_mode(tmp_path):
    """Taichi's own autodiff validation (debug mode) over every differentiated dynamics kernel."""
    from bcg.sim.runtime import default_cache_dir

    script = "CACHE = " + repr(str(default_cache_dir() / "debug")) + "\n" + VALIDATION_SCRIPT
    env = dict(os.environ, TI_SKIP_VERSION_CHECK="ON")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / "validate.py"
    path.write_text(script)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=root, timeout=900
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "validated" in out.stdout


@pytest.mark.parametrize(
    "xml, words",
    [
        ("<mujoco><worldbody><body><joint/><geom size='.1'/></body>", "could not load"),
        (
            "<mujoco><worldbody><body><joint name='a'/><joint name='b' axis='1 0 0'/><geom size='.1'/></body>"
            "</worldbody></mujoco>",
            "several joints",
        ),
        (
            "<mujoco><worldbody><body><joint name='a'/><geom size='.1'/><site name='s1'/></body>"
            "<site name='s2' pos='0 0 1'/></worldbody><tendon><spatial><site site='s1'/><site site='s2'/>"
            "</spatial></tendon></mujoco>",
            "tendon",
        ),
        (
            "<mujoco><worldbody><body name='a'><freejoint/><geom size='.1'/></body>"
            "<body name='b' pos='1 0 0'><freejoint/><geom size='.1'/></body></worldbody>"
            "<equality><weld body1='a' body2='b'/></equality></mujoco>",
            "equality",
        ),
        ("/nonexistent/robot.xml", "not found"),
    ],
)
def test_bad_mjcf_gives_a_clear_error(xml, words):
    from bcg.sim.model import ModelLoadError, UnsupportedModelError, load_mjcf

    with pytest.raises((ModelLoadError, UnsupportedModelError)) as err:
        load_mjcf(xml)
    assert words in str(err.value)


_TREE_SIMS = {}


def _tree_model(model):
    """A stepped simulator of ``model``, one per model for the module (each compiles its kernels)."""
    from bcg.sim.rollout import SimConfig, Simulator

    cfg = SimConfig(num_envs=2, max_steps=1)
    if model not in _TREE_SIMS:
        if model == "g1":
            mj = g1.load_model(floor=False, collisions="none")
            sim = Simulator(mj, cfg, actuated_joints=g1.JOINT_NAMES, kp=g1.KP, kd=g1.KD)
        elif model == "floating":
            mj = mujoco.MjModel.from_xml_string(FLOATING)
            sim = Simulator(mj, cfg, actuated_joints=("tip_hinge",), kp=np.array([5.0]), kd=np.array([0.3]))
        else:
            sim = Simulator(mujoco.MjModel.from_xml_string(CHAIN), cfg)
        _TREE_SIMS[model] = sim
    sim = _TREE_SIMS[model]
    mj = sim.mjmodel
    qpos = np.tile(g1.default_qpos(mj) if model == "g1" else mj.qpos0, (2, 1))
    rng = np.random.default_rng(7)
    first = 0 if model == "chain" else 7  # the joints after the floating base
    qpos[:, first:] += rng.uniform(-0.4, 0.4, qpos[:, first:].shape)
    if model != "chain":
        qpos[:, 3:7] = [0.9, 0.2, -0.3, 0.25]  # not unit: the normalisation is differentiated too
    sim.set_state(qpos, rng.uniform(-1.5, 1.5, (2, mj.nv)))
    sim.step(np.zeros((2, sim.nu)))  # the fields now hold the intermediates of the last substep
    return sim, rng


@pytest.mark.parametrize("stage", ["kinematics", "velocity", "mass_bias"])
@pytest.mark.parametrize("model", ["g1", "floating", "chain"])
def test_hand_written_tree_adjoints_match_the_generated_ones(ti64, model, stage):
    """The reverse pass uses hand-written adjoints of the kinematics and body-velocity recursions (all
    tree levels in one launch) and of the stages from body inertias to the mass matrix and bias
    forces (one launch), without atomics; Taichi's generated adjoints of the per-level and per-stage
    kernels must give the same partials, on the G1 (free and hinge joints), a floating model with a
    ball joint and a fixed-base chain of hinge and slide joints."""
    sim, rng = _tree_model(model)
    s = sim.substep - 1
    if stage == "kinematics":
        outputs = [sim.dyn.xpos, sim.dyn.xanchor, sim.dyn.xaxis, sim.dyn.xquat, sim.dyn.xmat]
        inputs = [sim.state.qpos]
        generated, hand = tree_reference(sim).fk, sim.fk_adjoint
    elif stage == "velocity":
        outputs = [sim.dyn.cvel_ang, sim.dyn.cvel_lin, sim.dyn.cacc_ang, sim.dyn.cacc_lin]
        inputs = [sim.state.qvel, sim.dyn.cdof_ang, sim.dyn.cdof_lin]
        generated, hand = tree_reference(sim).velocity, sim.velocity_adjoint
    else:
        outputs = [sim.dyn.mass, sim.dyn.qfrc_bias]
        d, m = sim.dyn, sim.mdl
        inputs = [d.xpos, d.xmat, d.cdof_ang, d.cdof_lin, d.cvel_ang, d.cvel_lin, d.cacc_ang]
        inputs += [d.cacc_lin, m.body_mass, m.body_ipos, m.body_inertia, m.dof_armature]
        inputs += [d.body_m, d.body_h, d.body_rot_inertia, d.crb_m, d.crb_h, d.crb_rot_inertia]
        inputs += [d.dof_f_ang, d.dof_f_lin, d.cfrc_ang, d.cfrc_lin, d.sub_frc_ang, d.sub_frc_lin]
    upstream = [rng.normal(size=f.grad.to_numpy().shape) for f in outputs]
    results = []
    for run in ("generated", "hand"):
        for f in inputs:
            f.grad.fill(0)
        for f, u in zip(outputs, upstream):
            f.grad.from_numpy(u)
        if stage == "mass_bias":
            if run == "generated":
                for kernel in reversed(tree_reference(sim).mass_bias_stages()):
                    kernel.grad()
            else:
                sim.mass_bias_adjoint()
        elif run == "generated":
            for off, cnt in reversed(sim._levels):
                generated.grad(s, off, cnt)
        else:
            hand(s)
        results.append([f.grad.to_numpy() for f in inputs + outputs])
    for f, gen, mine in zip(inputs + outputs, *results):
        scale = max(np.abs(gen).max(), 1e-12)
        np.testing.assert_allclose(mine, gen, rtol=0, atol=1e-12 * scale, err_msg=str(f))
    first = results[1][0] if stage == "mass_bias" else results[1][0][s]
    assert np.abs(first).max() > 0.1  # the first input's gradient is not trivially zero
