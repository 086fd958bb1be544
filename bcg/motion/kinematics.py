"""Forward kinematics, finite-difference velocities, foot clearance, centre of mass and airborne
phases of a motion.

Body poses come from MuJoCo's own forward kinematics (``mujoco.mj_kinematics``) of the G1 model, so
they agree with the simulator and the MuJoCo validation by construction. Velocities are central
finite differences over the frame spacing ``dt`` (second order, one-sided second-order differences
at the two end frames); the root orientation is differentiated on the sphere through the log map of
the relative rotation between the neighbouring frames.
"""

from __future__ import annotations

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_conjugate, quat_log, quat_multiply, quat_normalize, quat_rotate


def model_body_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of the model's bodies in body-id order, without the world body (nbody - 1,)."""
    return tuple(model.body(i).name for i in range(1, model.nbody))


def forward_kinematics(
    model: mujoco.MjModel, root_pos: np.ndarray, root_quat: np.ndarray, joint_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """World poses of every body for each frame.

    Args:
        model: compiled G1 model.
        root_pos: m (T, 3), world.
        root_quat: (T, 4) w, x, y, z (MuJoCo normalises it internally).
        joint_pos: rad (T, 29) in :data:`g1.JOINT_NAMES` order.

    Returns:
        body_pos: m (T, nbody - 1, 3) and body_quat: (T, nbody - 1, 4) w, x, y, z, world frame, in the
        model's body-id order without the world body (see :func:`model_body_names`).
    """
    data = mujoco.MjData(model)
    free = model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, g1.FREE_JOINT)]
    adr = g1.joint_qpos_adr(model)
    num_frames = len(root_pos)
    body_pos = np.empty((num_frames, model.nbody - 1, 3))
    body_quat = np.empty((num_frames, model.nbody - 1, 4))
    for t in range(num_frames):
        data.qpos[:] = model.qpos0
        data.qpos[free : free + 3] = root_pos[t]
        data.qpos[free + 3 : free + 7] = root_quat[t]
        data.qpos[adr] = joint_pos[t]
        mujoco.mj_kinematics(model, data)
        body_pos[t] = data.xpos[1:]
        body_quat[t] = data.xquat[1:]
    return body_pos, body_quat


def point_positions(
    body_pos: np.ndarray, body_quat: np.ndarray, body_index: np.ndarray, offsets: np.ndarray
) -> np.ndarray:
    """World positions of points fixed to bodies.

    Args:
        body_pos: m (..., nbody, 3); body_quat: (..., nbody, 4) world poses.
        body_index: (npoint,) index into the body axis for each point.
        offsets: m (npoint, 3) point positions in their body's frame.

    Returns:
        m (..., npoint, 3).
    """
    return body_pos[..., body_index, :] + quat_rotate(body_quat[..., body_index, :], offsets)


def finite_difference(x: np.ndarray, dt: float) -> np.ndarray:
    """Time derivative along axis 0 by central differences (one-sided second order at the ends).

    Args:
        x: (T, ...) samples at spacing ``dt`` seconds, T >= 3.

    Returns:
        (T, ...) derivative in units of x per second.
    """
    return np.gradient(np.asarray(x, dtype=float), dt, axis=0, edge_order=2)


def angular_velocity(q: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Angular velocity of an orientation track by central differences on the sphere.

    Interior frames use ``w_w(t) = log(q(t+1) ⊗ q(t-1)*) / (2 dt)``, exact for a constant angular
    velocity; the end frames use the second-order one-sided combination of the relative rotations to
    the next two (previous two) frames. The body-frame value is ``R(q(t))^T w_w(t)``, which is what
    MuJoCo's free joint stores in ``qvel[3:6]``.

    Args:
        q: (T, 4) w, x, y, z orientation track, T >= 3 (normalised here; sign flips are harmless).
        dt: s, frame spacing.

    Returns:
        (ang_vel_w, ang_vel_b): rad/s (T, 3) in the world frame and in the body frame.
    """
    q = quat_normalize(q)
    ang_vel_w = np.empty((len(q), 3))
    ang_vel_w[1:-1] = quat_log(quat_multiply(q[2:], quat_conjugate(q[:-2]))) / (2.0 * dt)
    # one-sided: w ≈ (4 log(q1 q0*) - log(q2 q0*)) / (2 dt), the rotation-vector analogue of
    # (-3 x0 + 4 x1 - x2) / (2 dt)
    d1 = quat_log(quat_multiply(q[1], quat_conjugate(q[0])))
    d2 = quat_log(quat_multiply(q[2], quat_conjugate(q[0])))
    ang_vel_w[0] = (4.0 * d1 - d2) / (2.0 * dt)
    d1 = quat_log(quat_multiply(q[-1], quat_conjugate(q[-2])))
    d2 = quat_log(quat_multiply(q[-1], quat_conjugate(q[-3])))
    ang_vel_w[-1] = (4.0 * d1 - d2) / (2.0 * dt)
    ang_vel_b = quat_rotate(quat_conjugate(q), ang_vel_w)
    return ang_vel_w, ang_vel_b


def foot_sphere_positions(
    body_pos: np.ndarray, body_quat: np.ndarray, body_names: tuple[str, ...]
) -> np.ndarray:
    """Centres of the 8 foot contact spheres of :data:`g1.FOOT_SPHERES` (left foot first).

    Args:
        body_pos: m (..., B, 3); body_quat: (..., B, 4); body_names: (B,) names of the body axis.

    Returns:
        m (..., 8, 3), world.
    """
    index = np.array([body_names.index(body) for body, _ in g1.FOOT_SPHERES])
    offsets = np.array([offset for _, offset in g1.FOOT_SPHERES], dtype=float)
    return point_positions(body_pos, body_quat, index, offsets)


def foot_clearance(sphere_pos: np.ndarray) -> np.ndarray:
    """Height (m) of each foot's lowest sphere bottom above z = 0, (..., 2) for left and right.

    Args:
        sphere_pos: m (..., 8, 3) from :func:`foot_sphere_positions`.
    """
    bottom = sphere_pos[..., 2] - g1.FOOT_SPHERE_RADIUS
    return np.stack([bottom[..., :4].min(axis=-1), bottom[..., 4:].min(axis=-1)], axis=-1)


def centre_of_mass(model: mujoco.MjModel, body_pos: np.ndarray, body_quat: np.ndarray) -> np.ndarray:
    """World position of the whole robot's centre of mass, m (..., 3).

    Args:
        model: the model whose bodies (without the world body, in body-id order) the poses are of.
        body_pos: m (..., nbody - 1, 3); body_quat: (..., nbody - 1, 4) w, x, y, z, world frame.
    """
    mass = model.body_mass[1:]
    inertial = point_positions(body_pos, body_quat, np.arange(model.nbody - 1), model.body_ipos[1:])
    return np.einsum("b,...bk->...k", mass, inertial) / mass.sum()


def airborne_phases(
    model: mujoco.MjModel,
    body_pos: np.ndarray,
    body_quat: np.ndarray,
    body_names: tuple[str, ...],
    dt: float,
    clearance: float,
    min_frames: int,
) -> list[tuple[int, int, float]]:
    """Runs of at least ``min_frames`` frames in which both feet are more than ``clearance`` above
    the ground: (first frame, end frame, vertical acceleration of the centre of mass in m/s^2, the
    curvature of a parabola fitted to its height over the run). Nothing but gravity acts on an
    airborne robot, so a physical flight has -9.81.

    Args:
        model: the G1 model the poses are of.
        body_pos, body_quat: the poses of every body but the world (T, B, ...), ``body_names`` their
            B names in any order (matched to the model's by name).
        dt: the frame spacing, s.
        clearance: m, the height above the ground from which a foot's lowest sphere bottom is off it.
        min_frames: the shortest run of airborne frames reported.
    """
    order = [body_names.index(name) for name in model_body_names(model)]
    body_pos, body_quat = body_pos[:, order], body_quat[:, order]
    spheres = foot_sphere_positions(body_pos, body_quat, model_body_names(model))
    airborne = np.all(foot_clearance(spheres) > clearance, axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], airborne.astype(int), [0]])))
    runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2]) if b - a >= min_frames]
    out = []
    for a, b in runs:
        height = centre_of_mass(model, body_pos[a:b], body_quat[a:b])[:, 2]
        t = np.arange(b - a) * dt
        out.append((a, b, float(2.0 * np.polyfit(t, height, 2)[0])))
    return out
