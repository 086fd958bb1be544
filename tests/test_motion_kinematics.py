"""Quaternion maths, finite-difference velocities and spike detection against independent references."""

import mujoco
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from bcg.core import g1
from bcg.core.rotations import (
    quat_conjugate,
    quat_exp,
    quat_log,
    quat_multiply,
    quat_normalize,
    quat_rotate,
    quat_slerp,
)
from bcg.motion import MotionClip, importer, kinematics, lafan, spikes, synthetic
from bcg.motion.__main__ import main


@pytest.fixture(scope="module")
def model():
    return g1.load_model(collisions="none", floor=False)


def _scipy(q):
    return Rotation.from_quat(q, scalar_first=True)


def test_quaternion_maths_matches_scipy():
    rng = np.random.default_rng(0)
    a = quat_normalize(rng.normal(size=(50, 4)))
    b = quat_normalize(rng.normal(size=(50, 4)))
    v = rng.normal(size=(50, 3))
    np.testing.assert_allclose(quat_rotate(a, v), _scipy(a).apply(v), atol=1e-12)
    product = _scipy(quat_multiply(a, b)).as_matrix()
    np.testing.assert_allclose(product, (_scipy(a) * _scipy(b)).as_matrix(), atol=1e-12)
    rotvec = rng.normal(size=(50, 3))
    np.testing.assert_allclose(
        _scipy(quat_exp(rotvec)).as_matrix(), Rotation.from_rotvec(rotvec).as_matrix(), atol=1e-12
    )
    np.testing.assert_allclose(quat_log(a), _scipy(a).as_rotvec(), atol=1e-12)
    np.testing.assert_allclose(quat_log(-a), _scipy(a).as_rotvec(), atol=1e-12)  # sign is free
    tiny = np.array([[1e-10, -2e-10, 3e-10]])
    np.testing.assert_allclose(quat_log(quat_exp(tiny)), tiny, rtol=1e-6)


def test_slerp_is_unit_and_halves_the_angle():
    rng = np.random.default_rng(1)
    q0 = quat_normalize(rng.normal(size=(100, 4)))
    q1 = quat_normalize(rng.normal(size=(100, 4)))
    mid = quat_slerp(q0, q1, np.full(100, 0.5))
    np.testing.assert_allclose(np.linalg.norm(mid, axis=1), 1.0, atol=1e-14)
    to_start = np.linalg.norm(quat_log(quat_multiply(quat_conjugate(q0), mid)), axis=1)
    to_end = np.linalg.norm(quat_log(quat_multiply(quat_conjugate(mid), q1)), axis=1)
    whole = np.linalg.norm(quat_log(quat_multiply(quat_conjugate(q0), q1)), axis=1)
    np.testing.assert_allclose(to_start, 0.5 * whole, atol=1e-12)
    np.testing.assert_allclose(to_end, 0.5 * whole, atol=1e-12)
    # against scipy's Slerp at a quarter
    for i in range(5):
        expected = Rotation.from_quat(np.stack([q0[i], q1[i]]), scalar_first=True)
        from scipy.spatial.transform import Slerp

        ref = Slerp([0.0, 1.0], expected)([0.25]).as_matrix()[0]
        np.testing.assert_allclose(_scipy(quat_slerp(q0[i], q1[i], 0.25)).as_matrix(), ref, atol=1e-12)
    # bit for bit at the ends, even for a quaternion that is unit only to 1e-6
    rough = q0 * (1.0 + 1e-6)
    assert np.array_equal(quat_slerp(rough, q1, np.zeros(100)), rough)
    assert np.array_equal(quat_slerp(rough, q1, np.ones(100)), q1)


def test_velocities_of_an_analytic_motion(tmp_path, model):
    csv = tmp_path / "analytic.csv"
    exact = synthetic.write_synthetic_csv(csv, 30, g1.joint_limits(model))
    out = tmp_path / "analytic.h5"
    importer.import_csv(csv, out, model=model)
    frames = MotionClip.load(out, model).frames
    h = 1.0 / lafan.FPS
    # constant angular velocity: the log-map difference is exact at every frame, ends included
    np.testing.assert_allclose(frames.root_ang_vel_w, exact["root_ang_vel_w"], atol=1e-12)
    np.testing.assert_allclose(frames.root_ang_vel_b, exact["root_ang_vel_b"], atol=1e-12)
    # a central difference of A sin(w t + p) is exactly A w cos(w t + p) sin(w h) / (w h)
    motion = synthetic.SyntheticMotion()
    limits = g1.joint_limits(model)
    amplitude = motion.joint_amplitude * 0.5 * (limits[:, 1] - limits[:, 0])
    freq = motion.joint_frequency * (1.0 + 0.05 * np.arange(29))
    t = np.arange(30)[:, None] * h
    central = amplitude * freq * np.cos(freq * t + 0.37 * np.arange(29)) * np.sin(freq * h) / (freq * h)
    np.testing.assert_allclose(frames.joint_vel[1:-1], central[1:-1], atol=1e-12)
    # one-sided second order at the ends: error below h^2/3 max|x'''|
    bound = h**2 / 3 * amplitude * freq**3
    assert np.all(np.abs(frames.joint_vel[[0, -1]] - exact["joint_vel"][[0, -1]]) <= bound)
    # root: constant velocity plus a vertical sinusoid
    amp_z, w_z = motion.root_bob
    vz = amp_z * w_z * np.cos(w_z * t[1:-1, 0]) * np.sin(w_z * h) / (w_z * h)
    np.testing.assert_allclose(frames.root_lin_vel_w[1:-1, :2], exact["root_lin_vel_w"][1:-1, :2], atol=1e-12)
    np.testing.assert_allclose(frames.root_lin_vel_w[1:-1, 2], vz, atol=1e-12)


def test_velocities_match_mujoco_at_a_fine_step(model):
    """At 4 kHz the finite differences agree with MuJoCo's analytic body velocities."""
    fps = 4000.0
    values = synthetic.SyntheticMotion().evaluate(np.arange(41) / fps, g1.joint_limits(model))
    derived = importer.derive(model, values["root_pos"], values["root_quat"], values["joint_pos"], fps)
    data = mujoco.MjData(model)
    names = kinematics.model_body_names(model)
    for t in (0, 20, 40):
        data.qpos[:7] = np.concatenate([values["root_pos"][t], values["root_quat"][t]])
        data.qpos[g1.joint_qpos_adr(model)] = values["joint_pos"][t]
        data.qvel[:3] = derived["root_lin_vel_w"][t]
        data.qvel[3:6] = derived["root_ang_vel_b"][t]
        data.qvel[g1.joint_dof_adr(model)] = derived["joint_vel"][t]
        mujoco.mj_forward(model, data)
        velocity = np.zeros(6)
        for b, name in enumerate(names):
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_XBODY, model.body(name).id, velocity, 0)
            np.testing.assert_allclose(derived["body_lin_vel_w"][t, b], velocity[3:], atol=2e-5)
        # MuJoCo's own finite difference of the free joint: body-frame angular velocity
        if 0 < t < 40:
            qvel = np.zeros(model.nv)
            q0 = np.concatenate(
                [values["root_pos"][t - 1], values["root_quat"][t - 1], values["joint_pos"][t - 1]]
            )
            q1 = np.concatenate(
                [values["root_pos"][t + 1], values["root_quat"][t + 1], values["joint_pos"][t + 1]]
            )
            mujoco.mj_differentiatePos(model, qvel, 2.0 / fps, q0, q1)
            np.testing.assert_allclose(derived["root_ang_vel_b"][t], qvel[3:6], atol=1e-9)


def test_spike_is_found_and_fixed(tmp_path, model, capsys):
    limits = g1.joint_limits(model)
    exact = synthetic.SyntheticMotion().evaluate(np.arange(60) / lafan.FPS, limits)
    joint_pos = exact["joint_pos"].copy()
    joint = g1.JOINT_NAMES.index("right_wrist_roll_joint")
    joint_pos[33, joint] += 0.6
    # a fast but real movement: one joint turns 1.2 rad in one frame and stays there
    step_joint = g1.JOINT_NAMES.index("left_elbow_joint")
    joint_pos[40:, step_joint] += 1.2
    csv = tmp_path / "spiky.csv"
    synthetic.write_csv(csv, exact["root_pos"], exact["root_quat"], joint_pos)
    assert spikes.find_spikes(joint_pos).tolist() == [[33, joint]]
    assert spikes.find_spikes(exact["joint_pos"]).tolist() == []

    raw = tmp_path / "raw.h5"
    assert main(["import", str(csv), "--out", str(raw), "--start", "5", "--end", "55"]) == 0
    assert (
        "spike found (use --fix-spikes to repair): source frame 33, right_wrist_roll_joint"
        in capsys.readouterr().out
    )
    kept = MotionClip.load(raw, model)
    assert kept.frames.joint_pos[28, joint] == joint_pos[33, joint]  # verbatim without the flag
    assert len(kept.attrs["spikes_fixed"]) == 0
    assert main(["check", str(raw)]) == 0
    assert "1 single-frame spikes (right_wrist_roll_joint@28)" in capsys.readouterr().out

    fixed = tmp_path / "fixed.h5"
    assert main(["import", str(csv), "--out", str(fixed), "--start", "5", "--end", "55", "--fix-spikes"]) == 0
    assert "spike fixed: source frame 33" in capsys.readouterr().out
    repaired = MotionClip.load(fixed, model)
    assert repaired.attrs["spikes_fixed"].tolist() == [[33, joint]]
    assert repaired.attrs["spikes_original"].tolist() == [joint_pos[33, joint]]
    assert abs(repaired.frames.joint_pos[28, joint] - exact["joint_pos"][33, joint]) < 2e-3
    others = np.ones(repaired.frames.joint_pos.shape, dtype=bool)
    others[28, joint] = False
    assert np.array_equal(repaired.frames.joint_pos[others], kept.frames.joint_pos[others])
    assert main(["check", str(fixed)]) == 0
    assert "none above 0.25 rad (1 fixed on import)" in capsys.readouterr().out
