"""Sim-to-sim metrics of the paper's MuJoCo validation: tracking error, foot penetration, falls.

Definitions:

- **E_track** (global): the mean over control steps t and tracked points b of ``|p_b(t) - p_hat_b(t)|``,
  world-frame positions, reported in cm. The tracked points are the origins of every model body except
  the world body (30 for the shipped MJCF) plus every key point of :data:`g1.KEY_BODIES` that is not a
  body origin (the head point on the torso): 31 points, as in the paper's 31-body G1.
- **E_track, root-relative** (MimicKit's variant): the same with ``p_b - p_root`` against
  ``p_hat_b - p_hat_root`` (translation only).
- **Foot penetration**: for each foot sphere i of :data:`g1.FOOT_SPHERES` with radius
  :data:`g1.FOOT_SPHERE_RADIUS`, ``d_i = max(0, -(z_i - rho))`` against the ground plane z = 0; per
  episode the mean over physics steps of ``max_i d_i``, its 95th percentile and its maximum, in mm.
- **Fall**: the root height drops below :data:`g1.FALL_HEIGHT`; the episode ends there.
- **Lost track**: the first control step at which some body origin is farther than a distance from
  its reference in the world frame, the training's pose termination (``env.pose_termination_dist``);
  the episode goes on (MuJoCo has no such rule), but a training episode would have ended there.

Every function takes plain arrays; bodies and spheres are resolved by name against the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import KEY_BODY_NAMES, RobotState, body_names
from bcg.core.rotations import quat_to_rpy

M_TO_CM = 100.0
M_TO_MM = 1000.0


# ---------------------------------------------------------------------------------------------------
# Tracked points and tracking error


def extra_key_points(model: mujoco.MjModel) -> tuple[int, ...]:
    """Indices into :data:`g1.KEY_BODIES` of the key points that are not a body origin of ``model``
    (the head point, for the shipped MJCF)."""
    names = set(body_names(model))
    return tuple(
        i
        for i, (name, body, offset) in enumerate(g1.KEY_BODIES)
        if name not in names or body != name or any(o != 0.0 for o in offset)
    )


def tracked_point_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of the tracked points (bodies without the world body, then the extra key points)."""
    return body_names(model) + tuple(KEY_BODY_NAMES[i] for i in extra_key_points(model))


def tracked_points(state: RobotState, extra: tuple[int, ...]) -> np.ndarray:
    """World positions m (N, P, 3) of the tracked points of a robot or reference state.

    Args:
        state: a state with ``body_pos`` (N, nbody - 1, 3) and ``key_body_pos`` (N, 5, 3).
        extra: :func:`extra_key_points` of the model.
    """
    if state.body_pos is None:
        raise ValueError("tracked_points needs a state with body_pos")
    return np.concatenate([state.body_pos, state.key_body_pos[:, list(extra)]], axis=1)


def first_far_step(points: np.ndarray, ref_points: np.ndarray, n_bodies: int, dist: float) -> int | None:
    """The first step (row) at which one of the first ``n_bodies`` points (the body origins of
    :func:`tracked_points`) is more than ``dist`` m from its reference; None if none is, or for
    ``dist`` <= 0 (the rule off)."""
    if dist <= 0 or len(points) == 0:
        return None
    far = np.linalg.norm(points[:, :n_bodies] - ref_points[:, :n_bodies], axis=-1).max(axis=1) > dist
    return int(np.argmax(far)) if far.any() else None


def tracking_errors(points: np.ndarray, ref_points: np.ndarray, root_index: int = 0) -> tuple[float, float]:
    """E_track in cm: (global, root-relative) over all steps and points.

    Args:
        points: m (T, P, 3) robot positions, one row per control step.
        ref_points: m (T, P, 3) reference positions at the same times.
        root_index: the root body's index among the points (the pelvis is body 1, index 0).

    Returns:
        (mean |p - p_hat|, mean |(p - p_root) - (p_hat - p_hat_root)|) in cm; NaN for T = 0.
    """
    points, ref_points = np.asarray(points), np.asarray(ref_points)
    if points.shape != ref_points.shape or points.ndim != 3 or points.shape[-1] != 3:
        raise ValueError(
            f"points and ref_points must both be (T, P, 3), got {points.shape} and {ref_points.shape}"
        )
    if points.shape[0] == 0:
        return float("nan"), float("nan")
    global_error = np.linalg.norm(points - ref_points, axis=-1).mean()
    rel = points - points[:, root_index : root_index + 1]
    ref_rel = ref_points - ref_points[:, root_index : root_index + 1]
    relative_error = np.linalg.norm(rel - ref_rel, axis=-1).mean()
    return float(global_error * M_TO_CM), float(relative_error * M_TO_CM)


def path_ratio(root_xy: np.ndarray, ref_root_xy: np.ndarray) -> float:
    """Horizontal distance the root travelled over the reference root's, along their paths.

    A policy that tracks the pose but runs slower than the clip covers less ground (ratio below 1)
    and falls behind; this is what makes the world-frame E_track grow while the root-relative one
    stays small.

    Args:
        root_xy: m (T, 2) the robot's root positions at the control-step boundaries.
        ref_root_xy: m (T, 2) the reference root's at the same times.

    Returns:
        the ratio of the two path lengths; NaN when the reference does not move or T < 2.
    """
    root_xy, ref_root_xy = np.asarray(root_xy, float), np.asarray(ref_root_xy, float)
    if root_xy.shape != ref_root_xy.shape or root_xy.ndim != 2 or root_xy.shape[-1] != 2:
        raise ValueError(
            f"root_xy and ref_root_xy must both be (T, 2), got {root_xy.shape} and {ref_root_xy.shape}"
        )
    robot = np.linalg.norm(np.diff(root_xy, axis=0), axis=1).sum()
    ref = np.linalg.norm(np.diff(ref_root_xy, axis=0), axis=1).sum()
    return float(robot / ref) if ref > 0 else float("nan")


def heading_errors(root_quat: np.ndarray, ref_root_quat: np.ndarray) -> np.ndarray:
    """The root's heading minus the reference's, in degrees wrapped to [-180, 180).

    The heading is the yaw of the root's x axis about the world's z axis. A signed error shows which
    way round a policy turns: one that turns against the reference in a U-turn shows an error that
    grows through ±90° while the reference's stays small.

    Args:
        root_quat: (T, 4) the robot's root quaternions (w, x, y, z, body to world).
        ref_root_quat: (T, 4) the reference's at the same times.

    Returns:
        deg (T,).
    """
    root_quat, ref_root_quat = np.asarray(root_quat, float), np.asarray(ref_root_quat, float)
    if root_quat.shape != ref_root_quat.shape or root_quat.ndim != 2 or root_quat.shape[-1] != 4:
        raise ValueError(
            "root_quat and ref_root_quat must both be (T, 4), "
            f"got {root_quat.shape} and {ref_root_quat.shape}"
        )
    # the yaw of the ZYX roll-pitch-yaw angles is the heading of the root's x axis
    diff = np.degrees(quat_to_rpy(root_quat.T)[2] - quat_to_rpy(ref_root_quat.T)[2])
    return (diff + 180.0) % 360.0 - 180.0


# ---------------------------------------------------------------------------------------------------
# Foot penetration


@dataclass(frozen=True)
class FootSpheres:
    """The foot spheres resolved against a model: body ids (8,), local centres m (8, 3), radius m."""

    body_id: np.ndarray
    local_pos: np.ndarray
    radius: float

    @classmethod
    def of(cls, model: mujoco.MjModel) -> FootSpheres:
        ids = g1.body_ids(model, [body for body, _ in g1.FOOT_SPHERES])
        local = np.array([pos for _, pos in g1.FOOT_SPHERES], dtype=np.float64)
        return cls(body_id=ids, local_pos=local, radius=float(g1.FOOT_SPHERE_RADIUS))

    def centres(self, xpos: np.ndarray, xmat: np.ndarray) -> np.ndarray:
        """World centres m (8, 3) from MuJoCo's body poses ``data.xpos`` (nbody, 3), ``data.xmat``
        (nbody, 9)."""
        rot = np.asarray(xmat)[self.body_id].reshape(-1, 3, 3)
        return np.asarray(xpos)[self.body_id] + np.einsum("kij,kj->ki", rot, self.local_pos)

    def depth(self, xpos: np.ndarray, xmat: np.ndarray) -> np.ndarray:
        """Penetration depth m (8,) of each sphere below the plane z = 0: max(0, -(z - rho))."""
        return np.maximum(0.0, -(self.centres(xpos, xmat)[:, 2] - self.radius))


def floor_contact_depth(model: mujoco.MjModel, data: mujoco.MjData, bodies) -> float:
    """Deepest penetration m (>= 0) of MuJoCo's own contacts between ``bodies`` (ids) and the world
    body's geoms (the floor), from ``data.contact`` as last computed: what MuJoCo's collision
    geometry (the G1's foot capsules) penetrates, not a stand-in shape."""
    n = data.ncon
    if n == 0:
        return 0.0
    geom_body = model.geom_bodyid[data.contact.geom[:n]]
    mask = ((geom_body[:, 0] == 0) & np.isin(geom_body[:, 1], bodies)) | (
        (geom_body[:, 1] == 0) & np.isin(geom_body[:, 0], bodies)
    )
    if not mask.any():
        return 0.0
    return float(max(0.0, -np.min(data.contact.dist[:n][mask])))


@dataclass(frozen=True)
class Penetration:
    """Foot penetration of one episode, mm: mean over physics steps of the deepest sphere, its 95th
    percentile and its maximum."""

    mean_mm: float
    p95_mm: float
    max_mm: float


def penetration_stats(depth: np.ndarray) -> Penetration:
    """Statistics of foot depths m, one row per physics step: (S,) the deepest point, or (S, k) per
    sphere or contact (the deepest is taken); NaN for S = 0."""
    depth = np.asarray(depth)
    if depth.ndim not in (1, 2):
        raise ValueError(f"depth must be (steps,) or (steps, spheres), got {depth.shape}")
    if depth.shape[0] == 0:
        return Penetration(float("nan"), float("nan"), float("nan"))
    deepest = (depth if depth.ndim == 1 else depth.max(axis=1)) * M_TO_MM
    return Penetration(float(deepest.mean()), float(np.percentile(deepest, 95)), float(deepest.max()))


# ---------------------------------------------------------------------------------------------------
# Falls and aggregation


def fell(root_height: np.ndarray, threshold: float = g1.FALL_HEIGHT) -> bool:
    """Whether any root height m (T,) is below the fall threshold."""
    return bool(np.any(np.asarray(root_height) < threshold))


def mean_std(values) -> tuple[float, float]:
    """Mean and population standard deviation of the finite values (NaN, NaN when there are none)."""
    values = np.asarray(list(values), dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    return float(values.mean()), float(values.std())
