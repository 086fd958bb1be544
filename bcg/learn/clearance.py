"""Leg clearance: a reward term that keeps the G1's legs from striking each other.

The training simulator models foot-ground contact only, so nothing stops a foot from passing
through the other leg; in MuJoCo and on the robot the leg is struck and the robot trips (see
docs/validation.md, "a trained policy"). Each leg is approximated by spheres that cover the MJCF's
collision capsules of the foot (six spheres of radius 3.7 cm along its midline) and of the shank
(the knee link's shin and linkage brace, seven spheres on their axes). For each left sphere i and
right sphere j, with centres p_i, p_j and radii r_i, r_j,

    gap_ij = |p_i - p_j| - r_i - r_j,     penalty = Σ_ij max(0, margin - gap_ij)²

(m²), and the environment's reward subtracts ``leg_clearance_weight * penalty``. With the default
margin of 2 cm the shipped clips trigger it in one frame of 1800 (their smallest gaps: Run 3.8 cm,
Jump 5.3 cm, Fight 1.6 cm, Dance 6.8 cm). The spheres are thicker than the 2 cm thin foot, so a
foot passing over the other within about 5 cm also counts as overlap.
The penalty is differentiable in the body poses, and :func:`leg_clearance_vjp` gives its gradient
with respect to the body positions and quaternions the simulator's kinematics VJP takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from bcg.robot import g1
from bcg.robot.kinematics import quat_to_matrix, quat_to_matrix_vjp

FOOT_SPHERES = tuple(((x, 0.0, -0.025), 0.037) for x in (-0.035, -0.005, 0.025, 0.055, 0.085, 0.113))
"""(offset in the ankle-roll link's frame, radius): spheres along the foot's midline that cover the
MJCF's seven parallel foot capsules (radius 1 cm, |y| <= 2.7 cm, x from -5.4 to 13.2 cm)."""

SHANK_SPHERES = tuple(((0.01, 0.0, z), 0.045) for z in (0.0, -0.05, -0.1, -0.15)) + tuple(
    ((0.01, 0.0, z), 0.03) for z in (-0.2, -0.24, -0.28)
)
"""(offset in the knee link's frame, radius): the axes of the MJCF's shin capsule (radius 4.5 cm,
from the knee down 15 cm) and of its linkage brace (radius 3 cm, 20-28 cm down)."""


def leg_spheres(side: str) -> list[tuple[str, tuple[float, float, float], float]]:
    """(body, offset in the body frame, radius) of one leg's spheres."""
    foot = [(f"{side}_ankle_roll_link", o, r) for o, r in FOOT_SPHERES]
    return foot + [(f"{side}_knee_link", o, r) for o, r in SHANK_SPHERES]


@dataclass(frozen=True)
class LegSpheres:
    """Both legs' spheres resolved against a model: body ids, offsets (S, 3), radii (S,)."""

    left_body: np.ndarray
    left_offset: np.ndarray
    left_radius: np.ndarray
    right_body: np.ndarray
    right_offset: np.ndarray
    right_radius: np.ndarray

    @classmethod
    def of(cls, model: mujoco.MjModel) -> LegSpheres:
        out = {}
        for side in ("left", "right"):
            spheres = leg_spheres(side)
            out[f"{side}_body"] = g1.body_ids(model, [b for b, _, _ in spheres])
            out[f"{side}_offset"] = np.array([o for _, o, _ in spheres], dtype=np.float64)
            out[f"{side}_radius"] = np.array([r for _, _, r in spheres], dtype=np.float64)
        return cls(**out)

    def centres(self, xpos: np.ndarray, xquat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World centres (N, S, 3) of the left and right spheres from body poses (N, nbody, 3|4)."""
        return tuple(
            xpos[:, ids] + np.einsum("nsij,sj->nsi", quat_to_matrix(xquat[:, ids]), offset)
            for ids, offset in ((self.left_body, self.left_offset), (self.right_body, self.right_offset))
        )


def _pairs(spheres: LegSpheres, xpos, xquat, margin: float):
    left, right = spheres.centres(xpos, xquat)
    diff = left[:, :, None, :] - right[:, None, :, :]  # (N, L, R, 3)
    dist = np.linalg.norm(diff, axis=-1)
    gap = dist - spheres.left_radius[:, None] - spheres.right_radius[None, :]
    short = np.maximum(0.0, margin - gap)  # (N, L, R)
    return diff, dist, gap, short


def leg_clearance_penalty(spheres: LegSpheres, xpos: np.ndarray, xquat: np.ndarray, margin: float):
    """Penalty (N,) in m² and the smallest gap (N,) in m between the legs' spheres."""
    xpos, xquat = np.asarray(xpos, np.float64), np.asarray(xquat, np.float64)
    _, _, gap, short = _pairs(spheres, xpos, xquat, margin)
    return np.sum(short**2, axis=(1, 2)), gap.min(axis=(1, 2))


def leg_clearance_vjp(
    spheres: LegSpheres, xpos: np.ndarray, xquat: np.ndarray, margin: float, g_penalty: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """dL/d(xpos, xquat) (N, nbody, 3), (N, nbody, 4) from dL/dpenalty (N,)."""
    xpos, xquat = np.asarray(xpos, np.float64), np.asarray(xquat, np.float64)
    diff, dist, _, short = _pairs(spheres, xpos, xquat, margin)
    # d short² / d p_left = -2 short · u, u = (p_left - p_right) / |.|; the right sphere gets +2 short · u
    unit = diff / np.maximum(dist, 1e-12)[..., None]
    coef = (-2.0 * np.asarray(g_penalty, np.float64))[:, None, None] * short  # (N, L, R)
    g_left = np.einsum("nlr,nlri->nli", coef, unit)
    g_right = -np.einsum("nlr,nlri->nri", coef, unit)
    g_xpos, g_xquat = np.zeros_like(xpos), np.zeros_like(xquat)
    for ids, offset, g_p in (
        (spheres.left_body, spheres.left_offset, g_left),
        (spheres.right_body, spheres.right_offset, g_right),
    ):
        g_rot = g_p[:, :, :, None] * offset[None, :, None, :]  # d(R o)/dR = g ⊗ o
        g_q = quat_to_matrix_vjp(xquat[:, ids], g_rot)
        np.add.at(g_xpos, (slice(None), ids), g_p)
        np.add.at(g_xquat, (slice(None), ids), g_q)
    return g_xpos, g_xquat
