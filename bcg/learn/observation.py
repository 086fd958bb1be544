"""The policy observation: one builder for training, MuJoCo validation and the real robot.

Global-frame observation in the style of MimicKit's DeepMimic environment (``global_obs``,
``root_height_obs``, ``tar_obs_steps = [1, 2, 3]``): the robot's current state followed by the reference
motion at the next three control steps. Rotations use the 6D encoding (R e_x, R e_z); joint rotations
are the rotation of each hinge joint about its axis (read from the MJCF by name); key bodies are given
relative to the root. The paper's 849 dims count 30 joint rotations (its model has a fixed head body);
the shipped MJCF has 29 hinge joints and no head body, so here the size is
``231 + 3 * 198 = 825`` (see :data:`OBSERVATION_LAYOUT`).

Noise (actor only; the critic sees the noise-free observation): each entry of a block gets independent
uniform noise U(-n, n) with the block's n from the paper's table, added to the encoded values (so a
"0.05 rad" root-orientation noise perturbs each 6D component by at most 0.05). The noise is additive
and independent of the state, so :func:`observation_vjp` holds with or without it.

Gradients: the learner differentiates through the observation with :func:`observation_vjp`, which
returns dL/d(root_pos, root_quat, root_lin_vel, root_ang_vel, joint_pos, joint_vel, key_body_pos);
the simulator chains ``key_body_pos`` (and the quaternion's partials) through its own kinematics.

Example::

    refs = reference_states(clip.sample_future(t, steps=REFERENCE_STEPS))   # bcg.core.kinematics
    obs = observation(robot_state, refs, noise_rng=rng)     # actor input (N, 825)
    obs_critic = observation(robot_state, refs)             # critic input, no noise
"""

from __future__ import annotations

from typing import NamedTuple

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import (
    ReferenceState,
    RobotState,
    RobotStateGrad,
    g1_joint_axes,
    hinge_joint_names,
    key_body_frames,
    zero_grad,
)
from bcg.core.rotations import hinge_rot6d, hinge_rot6d_vjp, quat_to_rot6d, quat_to_rot6d_vjp

#: Reference frames observed, in control steps ahead of the current one.
REFERENCE_STEPS: tuple[int, ...] = (1, 2, 3)


class ObsBlock(NamedTuple):
    """One block of the observation: name, number of entries, uniform noise half-width n."""

    name: str
    size: int
    noise: float


def observation_layout(
    num_joints: int = g1.NUM_JOINTS,
    num_key_bodies: int = len(g1.KEY_BODIES),
    reference_steps: tuple[int, ...] = REFERENCE_STEPS,
) -> tuple[ObsBlock, ...]:
    """The observation's blocks in order, with sizes and noise half-widths (units as the paper's table)."""
    blocks = [
        ObsBlock("root_height", 1, 0.0),  # m
        ObsBlock("root_rot", 6, 0.05),  # 6D
        ObsBlock("root_lin_vel", 3, 0.5),  # m/s
        ObsBlock("root_ang_vel", 3, 0.2),  # rad/s
        ObsBlock("joint_rot", 6 * num_joints, 0.01),  # 6D per joint
        ObsBlock("joint_vel", num_joints, 0.5),  # rad/s
        ObsBlock("key_body_pos", 3 * num_key_bodies, 0.01),  # m, relative to the root
    ]
    for k in reference_steps:
        blocks += [
            ObsBlock(f"ref{k}_root_pos", 3, 0.25),  # m: ref xy minus robot xy, ref height
            ObsBlock(f"ref{k}_root_rot", 6, 0.0),
            ObsBlock(f"ref{k}_joint_rot", 6 * num_joints, 0.0),
            ObsBlock(f"ref{k}_key_body_pos", 3 * num_key_bodies, 0.0),  # m, relative to the ref root
        ]
    return tuple(blocks)


def observation_layout_of_model(model: mujoco.MjModel) -> tuple[ObsBlock, ...]:
    """The layout derived from a compiled model: its hinge joints (which must be exactly
    :data:`bcg.core.g1.JOINT_NAMES`) and the key bodies resolved by name."""
    hinges = hinge_joint_names(model)
    if sorted(hinges) != sorted(g1.JOINT_NAMES):
        raise ValueError(
            f"the model's hinge joints {hinges} are not the G1's {g1.JOINT_NAMES}; the observation "
            "is defined for the G1 only"
        )
    ids, _ = key_body_frames(model)
    return observation_layout(num_joints=len(hinges), num_key_bodies=len(ids))


OBSERVATION_LAYOUT: tuple[ObsBlock, ...] = observation_layout()
OBSERVATION_SIZE: int = sum(b.size for b in OBSERVATION_LAYOUT)  # 825 for the G1


def observation_slices(layout: tuple[ObsBlock, ...] = OBSERVATION_LAYOUT) -> dict[str, slice]:
    """Column slice of each named block (works for any sequence of blocks with name and size)."""
    out, start = {}, 0
    for block in layout:
        out[block.name] = slice(start, start + block.size)
        start += block.size
    return out


def observation_noise_scale(layout: tuple[ObsBlock, ...] = OBSERVATION_LAYOUT) -> np.ndarray:
    """Noise half-width n (D,) of every observation entry."""
    return np.concatenate([np.full(b.size, b.noise) for b in layout])


def _check(robot: RobotState, refs: list[ReferenceState]) -> None:
    if len(refs) != len(REFERENCE_STEPS):
        raise ValueError(f"expected {len(REFERENCE_STEPS)} reference frames (t+1..t+3), got {len(refs)}")
    for k, ref in enumerate(refs):
        if ref.batch_size != robot.batch_size:
            raise ValueError(f"reference {k + 1} has batch {ref.batch_size}, the robot {robot.batch_size}")


def observation(
    robot: RobotState,
    refs: list[ReferenceState],
    noise_rng: np.random.Generator | None = None,
    axes: np.ndarray | None = None,
) -> np.ndarray:
    """Policy / critic observation (N, 825) in :data:`OBSERVATION_LAYOUT` order.

    Args:
        robot: the robots' current state (world frame).
        refs: reference frames at t+1, t+2, t+3 (same batch N).
        noise_rng: None for the noise-free (critic, evaluation) observation; a generator to add
            U(-n, n) per entry with each block's n.
        axes: hinge axes (29, 3) in the child frames; default: the G1 model's.

    Returns:
        (N, D) array in the floating dtype of the inputs.
    """
    _check(robot, refs)
    axes = g1_joint_axes() if axes is None else axes
    n = robot.batch_size
    root = robot.root_pos
    parts = [
        root[:, 2:3],
        quat_to_rot6d(robot.root_quat),
        robot.root_lin_vel,
        robot.root_ang_vel,
        hinge_rot6d(robot.joint_pos, axes).reshape(n, -1),
        robot.joint_vel,
        (robot.key_body_pos - root[:, None, :]).reshape(n, -1),
    ]
    for ref in refs:
        parts += [
            ref.root_pos[:, 0:2] - root[:, 0:2],
            ref.root_pos[:, 2:3],
            quat_to_rot6d(ref.root_quat),
            hinge_rot6d(ref.joint_pos, axes).reshape(n, -1),
            (ref.key_body_pos - ref.root_pos[:, None, :]).reshape(n, -1),
        ]
    obs = np.concatenate(parts, axis=1)
    if obs.shape[1] != OBSERVATION_SIZE:
        raise ValueError(f"observation has {obs.shape[1]} entries, the layout {OBSERVATION_SIZE}")
    if noise_rng is not None:
        scale = observation_noise_scale()
        obs = obs + (noise_rng.uniform(-1.0, 1.0, size=obs.shape) * scale).astype(obs.dtype)
    return obs


def observation_vjp(
    robot: RobotState,
    refs: list[ReferenceState],
    g_obs: np.ndarray,
    axes: np.ndarray | None = None,
) -> RobotStateGrad:
    """Vector-Jacobian product of :func:`observation` with respect to the robot's state.

    Args:
        robot, refs, axes: as :func:`observation` (the references are constants).
        g_obs: dL/d(observation) (N, 825).

    Returns:
        dL/d(each RobotState field); ``root_quat`` is the plain partial derivative w.r.t. (w, x, y, z)
        of the unit-quaternion rotation formula :func:`bcg.core.rotations.quat_to_matrix`;
        ``body_pos`` (unused by the observation) is zero, or None when the state has none.
    """
    _check(robot, refs)
    axes = g1_joint_axes() if axes is None else axes
    g_obs = np.asarray(g_obs)
    n = robot.batch_size
    if g_obs.shape != (n, OBSERVATION_SIZE):
        raise ValueError(f"g_obs must have shape ({n}, {OBSERVATION_SIZE}), got {g_obs.shape}")
    s = observation_slices()
    g = zero_grad(robot)
    g["root_pos"][:, 2] += g_obs[:, s["root_height"]][:, 0]
    g["root_quat"] = quat_to_rot6d_vjp(robot.root_quat, g_obs[:, s["root_rot"]])
    g["root_lin_vel"] = g_obs[:, s["root_lin_vel"]].copy()
    g["root_ang_vel"] = g_obs[:, s["root_ang_vel"]].copy()
    g_joint_rot = g_obs[:, s["joint_rot"]].reshape(n, g1.NUM_JOINTS, 6)
    g["joint_pos"] = hinge_rot6d_vjp(robot.joint_pos, axes, g_joint_rot)
    g["joint_vel"] = g_obs[:, s["joint_vel"]].copy()
    g_key = g_obs[:, s["key_body_pos"]].reshape(n, -1, 3)
    g["key_body_pos"] = g_key.copy()
    g["root_pos"] -= g_key.sum(axis=1)
    for k in REFERENCE_STEPS:
        g["root_pos"][:, 0:2] -= g_obs[:, s[f"ref{k}_root_pos"]][:, 0:2]
    return RobotStateGrad(**g)
