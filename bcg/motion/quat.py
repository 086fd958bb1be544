"""Quaternion maths on numpy arrays, MuJoCo convention.

Quaternions are ``(w, x, y, z)`` with the scalar FIRST, Hamilton product, and ``q`` maps body-frame
vectors to the world frame (``v_w = q ⊗ v_b ⊗ q*``), as ``mujoco.MjData.xquat`` and the free joint's
``qpos[3:7]``. Every function broadcasts over leading axes: shapes are ``(..., 4)`` for quaternions
and ``(..., 3)`` for vectors. Rotation vectors (axis times angle, rad) are the exponential
coordinates used for angular velocities.
"""

from __future__ import annotations

import numpy as np

_SMALL_ANGLE = 1e-8  # rad; below this the series forms of exp / log are exact to float64


def multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
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


def conjugate(q: np.ndarray) -> np.ndarray:
    """Conjugate (the inverse of a unit quaternion) (..., 4)."""
    return np.asarray(q, dtype=float) * np.array([1.0, -1.0, -1.0, -1.0])


def normalize(q: np.ndarray) -> np.ndarray:
    """Unit quaternion (..., 4)."""
    q = np.asarray(q, dtype=float)
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate vectors ``v`` (..., 3) by unit quaternions ``q`` (..., 4): ``R(q) v``."""
    q = np.asarray(q, dtype=float)
    v = np.asarray(v, dtype=float)
    w = q[..., :1]
    u = q[..., 1:]
    t = 2.0 * np.cross(u, v)
    return v + w * t + np.cross(u, t)


def exp(rotvec: np.ndarray) -> np.ndarray:
    """Unit quaternion (..., 4) of a rotation vector (..., 3) in rad."""
    rotvec = np.asarray(rotvec, dtype=float)
    angle = np.linalg.norm(rotvec, axis=-1, keepdims=True)
    half = 0.5 * angle
    small = angle < _SMALL_ANGLE
    # sin(angle/2)/angle, with its Taylor series near zero
    scale = np.where(small, 0.5 - angle**2 / 48.0, np.sin(half) / np.where(small, 1.0, angle))
    return np.concatenate([np.cos(half), scale * rotvec], axis=-1)


def log(q: np.ndarray) -> np.ndarray:
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


def slerp(q0: np.ndarray, q1: np.ndarray, alpha: np.ndarray) -> np.ndarray:
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
    n0 = normalize(q0)
    n1 = normalize(q1)
    dot = np.sum(n0 * n1, axis=-1, keepdims=True)
    n1 = np.where(dot < 0.0, -n1, n1)
    dot = np.clip(np.abs(dot), -1.0, 1.0)
    theta = np.arccos(dot)
    sin_theta = np.sin(theta)
    near = sin_theta < 1e-9
    safe = np.where(near, 1.0, sin_theta)
    w0 = np.where(near, 1.0 - a, np.sin((1.0 - a) * theta) / safe)
    w1 = np.where(near, a, np.sin(a * theta) / safe)
    out = normalize(w0 * n0 + w1 * n1)
    out = np.where(a == 0.0, q0, out)
    return np.where(a == 1.0, q1, out)
