"""Rotation maths on numpy arrays, MuJoCo convention: quaternions, rotation matrices, the 6D encoding.

Quaternions are ``(w, x, y, z)`` with the scalar FIRST, Hamilton product, and ``q`` maps body-frame
vectors to the world frame (``v_w = q ⊗ v_b ⊗ q*``), as ``mujoco.MjData.xquat`` and the free joint's
``qpos[3:7]``. Every function broadcasts over leading axes: shapes are ``(..., 4)`` for quaternions
and ``(..., 3)`` for vectors. Rotation vectors (axis times angle, rad) are the exponential
coordinates used for angular velocities. The 6D encoding of a rotation matrix R is (R e_x, R e_z),
the "tangent" and "normal" columns, 6 numbers. The ``*_vjp`` functions are vector-Jacobian products
of the function they name, differentiated as written.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_SMALL_ANGLE = 1e-8  # rad; below this the series forms of exp / log are exact to float64


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a ⊗ b`` (..., 4)."""
    aw, ax, ay, az = np.moveaxis(np.asarray(a, dtype=float), -1, 0)
    bw, bx, by, bz = np.moveaxis(np.asarray(b, dtype=float), -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conjugate(q: np.ndarray) -> np.ndarray:
    """Conjugate (the inverse of a unit quaternion) (..., 4)."""
    return np.asarray(q, dtype=float) * np.array([1.0, -1.0, -1.0, -1.0])


def quat_normalize(q: np.ndarray) -> np.ndarray:
    """Unit quaternion (..., 4)."""
    q = np.asarray(q, dtype=float)
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate vectors ``v`` (..., 3) by unit quaternions ``q`` (..., 4): ``R(q) v``."""
    q = np.asarray(q, dtype=float)
    v = np.asarray(v, dtype=float)
    w = q[..., :1]
    u = q[..., 1:]
    t = 2.0 * np.cross(u, v)
    return v + w * t + np.cross(u, t)


def quat_exp(rotvec: np.ndarray) -> np.ndarray:
    """Unit quaternion (..., 4) of a rotation vector (..., 3) in rad."""
    rotvec = np.asarray(rotvec, dtype=float)
    angle = np.linalg.norm(rotvec, axis=-1, keepdims=True)
    half = 0.5 * angle
    small = angle < _SMALL_ANGLE
    # sin(angle/2)/angle, with its Taylor series near zero
    scale = np.where(small, 0.5 - angle**2 / 48.0, np.sin(half) / np.where(small, 1.0, angle))
    return np.concatenate([np.cos(half), scale * rotvec], axis=-1)


def quat_log(q: np.ndarray) -> np.ndarray:
    """Rotation vector (..., 3) in rad of unit quaternions (..., 4), on the shortest path.

    ``q`` and ``-q`` give the same result (angle in [0, pi]).
    """
    q = np.asarray(q, dtype=float)
    q = np.where(q[..., :1] < 0.0, -q, q)
    w = q[..., :1]
    u = q[..., 1:]
    s = np.linalg.norm(u, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(s, w)
    small = s < _SMALL_ANGLE
    scale = np.where(small, 2.0 / np.where(w == 0.0, 1.0, w), angle / np.where(small, 1.0, s))
    return scale * u


def quat_slerp(q0: np.ndarray, q1: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Spherical linear interpolation on the shortest arc.

    Args:
        q0, q1: quaternions (..., 4), unit up to rounding.
        alpha: interpolation fraction (...) in [0, 1].

    Returns:
        (..., 4): exactly ``q0`` where ``alpha == 0`` and exactly ``q1`` where ``alpha == 1`` (bit for
        bit, so sampling at frame times returns the stored frames); unit quaternions in between.
    """
    q0 = np.asarray(q0, dtype=float)
    q1 = np.asarray(q1, dtype=float)
    a = np.asarray(alpha, dtype=float)[..., None]
    n0 = quat_normalize(q0)
    n1 = quat_normalize(q1)
    dot = np.sum(n0 * n1, axis=-1, keepdims=True)
    n1 = np.where(dot < 0.0, -n1, n1)
    dot = np.clip(np.abs(dot), -1.0, 1.0)
    theta = np.arccos(dot)
    sin_theta = np.sin(theta)
    near = sin_theta < 1e-9
    safe = np.where(near, 1.0, sin_theta)
    w0 = np.where(near, 1.0 - a, np.sin((1.0 - a) * theta) / safe)
    w1 = np.where(near, a, np.sin(a * theta) / safe)
    out = quat_normalize(w0 * n0 + w1 * n1)
    out = np.where(a == 0.0, q0, out)
    return np.where(a == 1.0, q1, out)


def quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) of unit quaternions (..., 4) in (w, x, y, z) order.

    Uses R = I + 2 w [v]x + 2 [v]x^2 with v = (x, y, z), i.e. diagonal entries 1 - 2(y^2 + z^2): the
    formula assumes a unit quaternion and is differentiated as written by :func:`quat_to_matrix_vjp`.
    """
    q = np.asarray(quat)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    r = np.empty(q.shape[:-1] + (3, 3), dtype=np.result_type(q.dtype, np.float32))
    r[..., 0, 0] = 1 - 2 * (y * y + z * z)
    r[..., 0, 1] = 2 * (x * y - w * z)
    r[..., 0, 2] = 2 * (x * z + w * y)
    r[..., 1, 0] = 2 * (x * y + w * z)
    r[..., 1, 1] = 1 - 2 * (x * x + z * z)
    r[..., 1, 2] = 2 * (y * z - w * x)
    r[..., 2, 0] = 2 * (x * z - w * y)
    r[..., 2, 1] = 2 * (y * z + w * x)
    r[..., 2, 2] = 1 - 2 * (x * x + y * y)
    return r


def quat_to_matrix_vjp(quat: np.ndarray, g_matrix: np.ndarray) -> np.ndarray:
    """Partial derivatives (..., 4) of sum(g_matrix * quat_to_matrix(quat)) w.r.t. (w, x, y, z)."""
    q = np.asarray(quat)
    g = np.asarray(g_matrix)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    gw = 2 * (-z * g[..., 0, 1] + y * g[..., 0, 2] + z * g[..., 1, 0] - x * g[..., 1, 2])
    gw += 2 * (-y * g[..., 2, 0] + x * g[..., 2, 1])
    gx = 2 * (y * g[..., 0, 1] + z * g[..., 0, 2] + y * g[..., 1, 0] - 2 * x * g[..., 1, 1])
    gx += 2 * (-w * g[..., 1, 2] + z * g[..., 2, 0] + w * g[..., 2, 1] - 2 * x * g[..., 2, 2])
    gy = 2 * (-2 * y * g[..., 0, 0] + x * g[..., 0, 1] + w * g[..., 0, 2] + x * g[..., 1, 0])
    gy += 2 * (z * g[..., 1, 2] - w * g[..., 2, 0] + z * g[..., 2, 1] - 2 * y * g[..., 2, 2])
    gz = 2 * (-2 * z * g[..., 0, 0] - w * g[..., 0, 1] + x * g[..., 0, 2] + w * g[..., 1, 0])
    gz += 2 * (-2 * z * g[..., 1, 1] + y * g[..., 1, 2] + x * g[..., 2, 0] + y * g[..., 2, 1])
    return np.stack([gw, gx, gy, gz], axis=-1)


def quat_to_rot6d(quat: np.ndarray) -> np.ndarray:
    """6D encoding (..., 6) = (R e_x, R e_z) of quaternions (..., 4)."""
    r = quat_to_matrix(quat)
    return np.concatenate([r[..., :, 0], r[..., :, 2]], axis=-1)


def quat_to_rot6d_vjp(quat: np.ndarray, g_rot6d: np.ndarray) -> np.ndarray:
    """Partial derivatives (..., 4) of sum(g_rot6d * quat_to_rot6d(quat)) w.r.t. the quaternion."""
    g = np.asarray(g_rot6d)
    g_matrix = np.zeros(g.shape[:-1] + (3, 3), dtype=g.dtype)
    g_matrix[..., :, 0] = g[..., 0:3]
    g_matrix[..., :, 2] = g[..., 3:6]
    return quat_to_matrix_vjp(quat, g_matrix)


def _hinge_terms(axes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For unit axes a (J, 3): base columns (6,), K c (J, 6) and K^2 c (J, 6) with K = [a]x, c = e_x|e_z
    (read-only arrays, computed once per set of axes: the observation asks for them every step)."""
    a = np.asarray(axes, dtype=np.float64)
    return _hinge_terms_cached(a.tobytes(), a.shape)


@lru_cache(maxsize=64)
def _hinge_terms_cached(data: bytes, shape: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.frombuffer(data, dtype=np.float64).reshape(shape)
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    ex = np.broadcast_to(np.array([1.0, 0.0, 0.0]), a.shape)
    ez = np.broadcast_to(np.array([0.0, 0.0, 1.0]), a.shape)
    k1 = np.concatenate([np.cross(a, ex), np.cross(a, ez)], axis=-1)
    k2 = np.concatenate([np.cross(a, np.cross(a, ex)), np.cross(a, np.cross(a, ez))], axis=-1)
    terms = (np.array([1.0, 0.0, 0.0, 0.0, 0.0, 1.0]), k1, k2)
    for t in terms:
        t.flags.writeable = False
    return terms


def hinge_rot6d(angle: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """6D encoding (N, J, 6) of rotations by ``angle`` rad (N, J) about unit ``axes`` (J, 3).

    Rodrigues: R = I + sin(q) K + (1 - cos(q)) K^2, K = [a]x; the axis is the joint axis in the child
    body's frame (MuJoCo ``jnt_axis``), so R is the joint's own rotation, child relative to parent
    after removing the fixed ``body_quat`` offset.
    """
    q = np.asarray(angle)[..., None]
    dtype = np.result_type(q.dtype, np.float32)
    base, k1, k2 = (t.astype(dtype) for t in _hinge_terms(axes))
    return base + np.sin(q) * k1 + (1.0 - np.cos(q)) * k2


def hinge_rot6d_vjp(angle: np.ndarray, axes: np.ndarray, g_rot6d: np.ndarray) -> np.ndarray:
    """Derivative (N, J) of sum(g_rot6d * hinge_rot6d(angle, axes)) w.r.t. ``angle``."""
    _, k1, k2 = _hinge_terms(axes)
    q = np.asarray(angle)[..., None]
    return np.sum(np.asarray(g_rot6d) * (np.cos(q) * k1 + np.sin(q) * k2), axis=-1)


def ang_vel_body_to_world(quat: np.ndarray, ang_vel_body: np.ndarray) -> np.ndarray:
    """World-frame angular velocity (..., 3) from MuJoCo's free-joint body-frame ``qvel[3:6]``."""
    return np.einsum("...ij,...j->...i", quat_to_matrix(quat), ang_vel_body)


def ang_vel_world_to_body(quat: np.ndarray, ang_vel_world: np.ndarray) -> np.ndarray:
    """Body-frame angular velocity (..., 3), the free joint's ``qvel[3:6]``, from a world-frame one."""
    return np.einsum("...ji,...j->...i", quat_to_matrix(quat), ang_vel_world)


def quat_to_rpy(quat: np.ndarray) -> np.ndarray:
    """Roll, pitch, yaw (rad, ZYX convention) of a (w, x, y, z) quaternion."""
    w, x, y, z = quat
    roll = np.arctan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = np.arcsin(np.clip(2 * (w * y - z * x), -1.0, 1.0))
    yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return np.array([roll, pitch, yaw])


def rpy_to_quat(roll: np.ndarray, pitch: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """Quaternions (n, 4) of R = Rz(yaw) Ry(pitch) Rx(roll)."""
    rx = quat_exp(np.stack([roll, 0 * roll, 0 * roll], -1))
    ry = quat_exp(np.stack([0 * pitch, pitch, 0 * pitch], -1))
    rz = quat_exp(np.stack([0 * yaw, 0 * yaw, yaw], -1))
    return quat_multiply(rz, quat_multiply(ry, rx))


def tilt(quat: np.ndarray) -> float:
    """Angle (rad) between the body z axis and the world's vertical."""
    w, x, y, z = quat / np.linalg.norm(quat)
    return float(np.arccos(np.clip(1.0 - 2.0 * (x * x + y * y), -1.0, 1.0)))
