"""ADD discriminator features f(s) and their vector-Jacobian product.

Global features as MimicKit's ``compute_disc_obs`` with ``global_obs`` for the G1 (the ADD reward's input):
[root pos 3, root rot 6D 6, joint rots 6D 6 J, body positions minus root 3 (nbody - 1), root lin vel 3,
root ang vel 3 (world), joint vel J]. Unlike MimicKit the root position is not detached. With the
shipped MJCF (29 hinge joints, 30 bodies) F = 3 + 6 + 174 + 87 + 3 + 3 + 29 = 305. The learner forms
the differential Delta = f(reference) - f(simulated) and normalises it.
"""

from __future__ import annotations

from typing import NamedTuple

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import RobotState, RobotStateGrad, body_names, g1_joint_axes, g1_model, zero_grad
from bcg.core.rotations import hinge_rot6d, hinge_rot6d_vjp, quat_to_rot6d, quat_to_rot6d_vjp
from bcg.learn.observation import observation_slices


class FeatureBlock(NamedTuple):
    """One block of the ADD features: name and number of entries."""

    name: str
    size: int


def feature_layout(num_bodies: int, num_joints: int = g1.NUM_JOINTS) -> tuple[FeatureBlock, ...]:
    """Blocks of f(s) in order; ``num_bodies`` counts the model's bodies without the world body."""
    return (
        FeatureBlock("root_pos", 3),
        FeatureBlock("root_rot", 6),
        FeatureBlock("joint_rot", 6 * num_joints),
        FeatureBlock("body_pos", 3 * (num_bodies - 1)),
        FeatureBlock("root_lin_vel", 3),
        FeatureBlock("root_ang_vel", 3),
        FeatureBlock("joint_vel", num_joints),
    )


def feature_layout_of_model(model: mujoco.MjModel) -> tuple[FeatureBlock, ...]:
    """The feature layout of a compiled G1 model (body count read from the model)."""
    return feature_layout(num_bodies=len(body_names(model)))


#: Bodies of the G1 model without the world body (the length of ``RobotState.body_pos``).
NUM_BODIES: int = len(body_names(g1_model()))
FEATURE_LAYOUT: tuple[FeatureBlock, ...] = feature_layout(NUM_BODIES)
FEATURE_SIZE: int = sum(b.size for b in FEATURE_LAYOUT)  # 305 for the shipped G1 MJCF


def feature_slices(layout: tuple[FeatureBlock, ...] = FEATURE_LAYOUT) -> dict[str, slice]:
    """Column slice of each named block."""
    return observation_slices(layout)


def _body_pos(state: RobotState) -> np.ndarray:
    if state.body_pos is None:
        raise ValueError("the ADD features need RobotState.body_pos (all body origins); it is None")
    if state.body_pos.shape[1] != NUM_BODIES:
        raise ValueError(
            f"RobotState.body_pos has {state.body_pos.shape[1]} bodies, the G1 model {NUM_BODIES}"
        )
    return state.body_pos


def add_features(state: RobotState, axes: np.ndarray | None = None) -> np.ndarray:
    """ADD features f(s) (N, F) of a robot or reference state, :data:`FEATURE_LAYOUT` order.

    The body positions relative to the root skip ``body_pos[:, 0]`` (the root body itself) and
    subtract ``root_pos``.
    """
    axes = g1_joint_axes() if axes is None else axes
    n = state.batch_size
    body_pos = _body_pos(state)
    return np.concatenate(
        [
            state.root_pos,
            quat_to_rot6d(state.root_quat),
            hinge_rot6d(state.joint_pos, axes).reshape(n, -1),
            (body_pos[:, 1:] - state.root_pos[:, None, :]).reshape(n, -1),
            state.root_lin_vel,
            state.root_ang_vel,
            state.joint_vel,
        ],
        axis=1,
    )


def add_features_vjp(
    state: RobotState, g_features: np.ndarray, axes: np.ndarray | None = None
) -> RobotStateGrad:
    """Vector-Jacobian product of :func:`add_features`: dL/d(each state field) from dL/df (N, F).

    ``root_quat`` gets the plain partial derivative w.r.t. (w, x, y, z) of
    :func:`bcg.core.rotations.quat_to_matrix`; ``key_body_pos`` (unused by f) gets zero.
    """
    axes = g1_joint_axes() if axes is None else axes
    n = state.batch_size
    body_pos = _body_pos(state)
    g_features = np.asarray(g_features)
    if g_features.shape != (n, FEATURE_SIZE):
        raise ValueError(f"g_features must have shape ({n}, {FEATURE_SIZE}), got {g_features.shape}")
    s = feature_slices()
    g = zero_grad(state)
    g_body = g_features[:, s["body_pos"]].reshape(n, body_pos.shape[1] - 1, 3)
    g["root_pos"] = g_features[:, s["root_pos"]] - g_body.sum(axis=1)
    g["root_quat"] = quat_to_rot6d_vjp(state.root_quat, g_features[:, s["root_rot"]])
    g_joint_rot = g_features[:, s["joint_rot"]].reshape(n, g1.NUM_JOINTS, 6)
    g["joint_pos"] = hinge_rot6d_vjp(state.joint_pos, axes, g_joint_rot)
    g["body_pos"][:, 1:] = g_body
    g["root_lin_vel"] = g_features[:, s["root_lin_vel"]].copy()
    g["root_ang_vel"] = g_features[:, s["root_ang_vel"]].copy()
    g["joint_vel"] = g_features[:, s["joint_vel"]].copy()
    return RobotStateGrad(**g)
