"""Synthetic G1 motions with known derivatives, written in the LAFAN1 G1 CSV format.

The motion is analytic, so its velocities are known exactly:

- root position ``p(t) = p0 + v t + (0, 0, a_z sin(w_z t))``;
- root orientation ``q(t) = exp(omega t) ⊗ q0``: a constant world-frame angular velocity ``omega``
  (whose body-frame value ``R(q0)^T omega`` is constant too, since ``omega`` is its own axis);
- joint ``j``: ``c_j + A_j sin(w_j t + phi_j)``, centred in its limits.

Values are written with 17 significant digits, so reading the CSV gives the float64 values back
exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_conjugate, quat_exp, quat_multiply, quat_normalize, quat_rotate
from bcg.motion import lafan


@dataclass(frozen=True)
class SyntheticMotion:
    """An analytic motion; see the module docstring for the formulas. Units: m, rad, s."""

    root_pos0: tuple[float, float, float] = (0.1, -0.2, 0.78)
    root_lin_vel: tuple[float, float, float] = (1.5, 0.3, 0.0)
    root_bob: tuple[float, float] = (0.02, 2 * np.pi * 1.5)  # amplitude m, angular frequency rad/s
    root_quat0: tuple[float, float, float, float] = (0.9, 0.1, -0.2, 0.3)  # normalised on use
    root_ang_vel_w: tuple[float, float, float] = (0.4, -0.7, 1.3)
    joint_amplitude: float = 0.3  # fraction of each joint's half range
    joint_frequency: float = 2 * np.pi * 0.8  # rad/s, the first joint's; later joints faster

    def evaluate(self, times: np.ndarray, joint_limits: np.ndarray) -> dict[str, np.ndarray]:
        """Positions and exact velocities at ``times`` (T,) for joint limits (29, 2) rad.

        Returns:
            root_pos (T, 3), root_quat (T, 4) w x y z, joint_pos (T, 29), root_lin_vel_w (T, 3),
            root_ang_vel_w (T, 3), root_ang_vel_b (T, 3), joint_vel (T, 29).
        """
        t = np.asarray(times, dtype=float)[:, None]
        amp_z, w_z = self.root_bob
        bob = np.array([0.0, 0.0, 1.0])
        root_pos = (
            np.asarray(self.root_pos0) + np.asarray(self.root_lin_vel) * t + bob * amp_z * np.sin(w_z * t)
        )
        root_lin_vel = np.asarray(self.root_lin_vel) + bob * amp_z * w_z * np.cos(w_z * t)
        omega = np.asarray(self.root_ang_vel_w)
        q0 = quat_normalize(np.asarray(self.root_quat0))
        root_quat = quat_multiply(quat_exp(omega * t), q0)
        centre = joint_limits.mean(axis=1)
        amplitude = self.joint_amplitude * 0.5 * (joint_limits[:, 1] - joint_limits[:, 0])
        freq = self.joint_frequency * (1.0 + 0.05 * np.arange(len(centre)))
        phase = 0.37 * np.arange(len(centre))
        joint_pos = centre + amplitude * np.sin(freq * t + phase)
        joint_vel = amplitude * freq * np.cos(freq * t + phase)
        return {
            "root_pos": root_pos,
            "root_quat": root_quat,
            "joint_pos": joint_pos,
            "root_lin_vel_w": root_lin_vel,
            "root_ang_vel_w": np.broadcast_to(omega, root_pos.shape).copy(),
            "root_ang_vel_b": np.broadcast_to(quat_rotate(quat_conjugate(q0), omega), root_pos.shape).copy(),
            "joint_vel": joint_vel,
        }


def write_csv(path: str | Path, root_pos: np.ndarray, root_quat: np.ndarray, joint_pos: np.ndarray) -> None:
    """Write frames in the LAFAN1 G1 CSV format (quaternion reordered to x, y, z, w).

    Args:
        root_pos: m (T, 3); root_quat: (T, 4) w, x, y, z; joint_pos: rad (T, 29) in
            :data:`g1.JOINT_NAMES` order.
    """
    if joint_pos.shape[1] != g1.NUM_JOINTS:
        raise ValueError(f"joint_pos has {joint_pos.shape[1]} joints, the G1 has {g1.NUM_JOINTS}")
    frames = np.concatenate([root_pos, root_quat[:, [1, 2, 3, 0]], joint_pos], axis=1)
    np.savetxt(path, frames, delimiter=",", fmt="%.17g")


def write_synthetic_csv(
    path: str | Path, num_frames: int, joint_limits: np.ndarray, motion: SyntheticMotion = SyntheticMotion()
) -> dict[str, np.ndarray]:
    """Write ``num_frames`` frames of ``motion`` at :data:`lafan.FPS`; returns its exact values."""
    values = motion.evaluate(np.arange(num_frames) / lafan.FPS, joint_limits)
    write_csv(path, values["root_pos"], values["root_quat"], values["joint_pos"])
    return values
