"""State estimator against motion-capture ground truth: the clips give the root pose and velocity
that the robot cannot measure; the estimator sees only what the robot measures (IMU orientation,
gyro, joint angles and speeds)."""

import numpy as np
import pytest

from bcg.motion.clip import MotionClip
from bcg.robot.estimator import StateEstimator


def estimate_clip(name):
    clip = MotionClip.load(name)
    f = clip.frames
    est = StateEstimator()
    rows = [
        est.update(f.root_quat[i], f.root_ang_vel_b[i], f.joint_pos[i], f.joint_vel[i], i * clip.dt)
        for i in range(clip.num_frames)
    ]
    return clip, rows


@pytest.mark.parametrize("name", ["run", "dance"])
def test_estimator_against_motion_capture(name):
    clip, rows = estimate_clip(name)
    f = clip.frames
    root = np.array([r.root_pos[0] for r in rows])
    # key bodies relative to the root: forward kinematics of the measured joints, exact
    rel = np.array([r.key_body_pos[0] - r.root_pos[0] for r in rows])
    np.testing.assert_allclose(rel, f.key_body_pos - f.root_pos[:, None, :], atol=1e-9)
    # orientation and angular velocity straight from the IMU
    np.testing.assert_allclose(np.array([r.root_quat[0] for r in rows]), f.root_quat, atol=1e-6)
    np.testing.assert_allclose(np.array([r.root_ang_vel[0] for r in rows]), f.root_ang_vel_w, atol=1e-5)
    # height from the lowest foot on flat ground: within 1.5 cm most of the time
    assert np.median(np.abs(root[:, 2] - f.root_pos[:, 2])) < 0.015
    # horizontal velocity by stance-leg kinematics: well better than assuming the robot stands still
    vel = np.array([r.root_lin_vel[0, :2] for r in rows])
    err = np.linalg.norm(vel - f.root_lin_vel_w[:, :2], axis=1).mean()
    still = np.linalg.norm(f.root_lin_vel_w[:, :2], axis=1).mean()
    assert err < 0.75 * still and err < 0.75, (err, still)


def test_estimator_reset_and_stationary():
    clip = MotionClip.load("dance")
    f = clip.frames
    est = StateEstimator()
    for k in range(20):  # the same measurement over and over: no motion
        state = est.update(f.root_quat[0], np.zeros(3), f.joint_pos[0], np.zeros(29), k * 0.02)
    np.testing.assert_allclose(state.root_lin_vel[0], 0.0, atol=1e-12)
    np.testing.assert_allclose(state.root_pos[0, :2], 0.0, atol=1e-12)
    est.reset()
    assert est.prev_feet is None and np.all(est.xy == 0)
