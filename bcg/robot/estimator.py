"""State estimation on the real G1: the full :class:`RobotState` from IMU and joint encoders.

The robot measures the pelvis IMU (orientation, gyroscope, accelerometer) and the 29 joints. The
policy's observation also needs the root height, the root's linear velocity, its horizontal
position and the key bodies. Choices:

- Root orientation: the IMU quaternion (the IMU site is not rotated in the pelvis frame), and the
  world-frame angular velocity is R * gyro.
- Forward kinematics: the G1 MuJoCo model with the root at the origin, the IMU orientation and the
  measured joints (``mj_kinematics``), read through :func:`bcg.core.kinematics.robot_state_from_mujoco`,
  the same code that builds the training state.
- Root height: the lowest of the eight foot contact spheres (:data:`g1.FOOT_SPHERES`) is taken to
  touch the ground, z = 0 (flat ground assumed).
- Root linear velocity, by stance-leg kinematics: the stance foot (the foot with the lowest sphere)
  is taken as fixed on the ground, so ``v_root = -d/dt (p_foot - p_root)``, the world-frame
  vector from the root to that foot differentiated between updates (the same foot at both times, so
  a change of stance foot does not give a jump), then a first-order low-pass filter with time
  constant ``velocity_tau`` (default 40 ms) against encoder and IMU noise.
- Horizontal root position: the filtered velocity integrated from (0, 0) at reset (dead reckoning;
  it drifts slowly, which the policy sees only through reference-minus-robot offsets).
"""

from __future__ import annotations

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import RobotState, robot_state_from_mujoco


class StateEstimator:
    """Estimates the :class:`RobotState` (batch of 1) from pelvis IMU and joint measurements.

    Args:
        model: G1 MuJoCo model for the kinematics (default: no floor, no contacts).
        velocity_tau: s, time constant of the root-velocity low-pass filter.
    """

    def __init__(self, model: mujoco.MjModel | None = None, velocity_tau: float = 0.04):
        self.model = model if model is not None else g1.load_model(floor=False, collisions="none")
        self.data = mujoco.MjData(self.model)
        self.velocity_tau = velocity_tau
        self.qadr = g1.joint_qpos_adr(self.model)
        self.dadr = g1.joint_dof_adr(self.model)
        self.sphere_body = g1.body_ids(self.model, [body for body, _ in g1.FOOT_SPHERES])
        self.sphere_pos = np.array([pos for _, pos in g1.FOOT_SPHERES])
        self.reset()

    def reset(self) -> None:
        """Forget the history: position back to (0, 0), velocity to zero."""
        self.xy = np.zeros(2)
        self.velocity = np.zeros(3)
        self.prev_feet: np.ndarray | None = None  # (2, 3) foot points relative to the root, world axes
        self.prev_time: float | None = None

    def update(self, quat, gyro, joint_pos, joint_vel, time: float) -> RobotState:
        """Estimate from one measurement.

        Args:
            quat: (4,) pelvis orientation (w, x, y, z), body to world.
            gyro: rad/s (3,) pelvis angular velocity, body frame.
            joint_pos: rad (29,), joint_vel: rad/s (29,), in :data:`g1.JOINT_NAMES` order.
            time: s, the measurement's time (robot tick or monotonic clock).
        """
        quat = np.asarray(quat, dtype=np.float64)
        quat = quat / np.linalg.norm(quat)
        data = self.data
        data.qpos[0:3] = 0.0
        data.qpos[3:7] = quat
        data.qpos[self.qadr] = joint_pos
        data.qvel[:] = 0.0
        data.qvel[3:6] = gyro
        data.qvel[self.dadr] = joint_vel
        mujoco.mj_kinematics(self.model, data)
        centres = data.xpos[self.sphere_body] + np.einsum(
            "kij,kj->ki", data.xmat[self.sphere_body].reshape(-1, 3, 3), self.sphere_pos
        )
        bottoms = centres[:, 2] - g1.FOOT_SPHERE_RADIUS
        height = -float(np.min(bottoms))
        feet = np.stack([centres[:4].mean(axis=0), centres[4:].mean(axis=0)])  # (2, 3) left, right
        stance = 0 if np.min(bottoms[:4]) <= np.min(bottoms[4:]) else 1
        if self.prev_feet is not None and time > self.prev_time:
            dt = time - self.prev_time
            raw = -(feet[stance] - self.prev_feet[stance]) / dt
            alpha = dt / (self.velocity_tau + dt)
            self.velocity = self.velocity + alpha * (raw - self.velocity)
            self.xy = self.xy + self.velocity[:2] * dt
        self.prev_feet, self.prev_time = feet, time
        root = np.array([self.xy[0], self.xy[1], height])
        # the shared builder reads qpos/qvel/xpos; put the root where it is estimated to be
        data.qpos[0:3] = root
        data.qvel[0:3] = self.velocity
        data.xpos[1:] += root
        return robot_state_from_mujoco(self.model, data)
