"""Leg clearance: a reward term that keeps the G1's legs from striking each other.

The training simulator models foot-ground contact only by default (leg-against-leg contact,
:mod:`bcg.sim.self_contact`, is ``env.leg_contact_stiffness``), so nothing stops a foot from passing
through the other leg; in MuJoCo and on the robot the leg is struck and the robot trips (see
docs/validation.md, "a trained policy"). The term uses the MJCF's own collision capsules of both
legs (hip, thigh, shin, linkage brace and the seven foot capsules of each side: the capsules and
spheres of every body whose name holds one of :data:`bcg.core.g1.LEG_BODY_PARTS`). For each left
capsule i and right capsule j, with axis segments A_i, B_j and radii r_i, r_j,

    gap_ij = min |a - b| over a in A_i, b in B_j  -  r_i - r_j,
    penalty = Σ_ij max(0, margin - gap_ij)²

(m²), and the environment's reward subtracts ``leg_clearance_weight * penalty`` (bounded under
``leg_clearance_cap``, :class:`bcg.learn.config.EnvConfig`). The gap is MuJoCo's
own capsule-capsule distance (``tests/test_clearance.py`` checks it against ``mj_collision``), so a
negative gap is a contact MuJoCo would report. The shipped clips keep outside the default margin
of 2 cm but for one frame of Fight (their smallest gaps: Run 2.59 cm, Jump 3.70 cm, Fight 1.48 cm,
Dance 7.02 cm; ``python -m bcg.learn.clearance``).

The penalty is differentiable in the body poses, and :func:`leg_clearance_vjp` gives its gradient
with respect to the body positions and quaternions the simulator's kinematics VJP takes: at the
closest points a = A(s), b = B(t), d gap / d a = u = (a - b) / |a - b| and the derivatives through
s and t vanish (a minimum over the segments, the envelope theorem), so the segment ends get
(1 - s) u, s u and -(1 - t) u, -t u.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.geoms import geom_capsule
from bcg.core.rotations import quat_to_matrix, quat_to_matrix_vjp
from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError

_EPS = 1e-12


def leg_geoms(model: mujoco.MjModel, side: str) -> list[int]:
    """Ids of one leg's collision geoms (non-zero contype or conaffinity) in ``model``."""
    ids = []
    for gid in range(model.ngeom):
        body = model.body(model.geom_bodyid[gid]).name
        if not body.startswith(side + "_") or not any(part in body for part in g1.LEG_BODY_PARTS):
            continue
        if model.geom_contype[gid] or model.geom_conaffinity[gid]:
            ids.append(gid)
    return ids


@dataclass(frozen=True)
class LegCapsules:
    """Both legs' collision capsules: per side the body ids (C,), the two ends of each capsule's
    axis in its body's frame (C, 3) each, the radii (C,) and the geom names."""

    left_body: np.ndarray
    left_a: np.ndarray
    left_b: np.ndarray
    left_radius: np.ndarray
    left_names: tuple[str, ...]
    right_body: np.ndarray
    right_a: np.ndarray
    right_b: np.ndarray
    right_radius: np.ndarray
    right_names: tuple[str, ...]

    @classmethod
    def of(cls, model: mujoco.MjModel | None = None) -> LegCapsules:
        """The capsules of a model loaded with its collision primitives on (default: the shipped
        G1, ``g1.load_model(collisions="all")``); its body ids are those of every G1 model the
        package loads, whatever its collision set. Spheres count as capsules of length 0; a leg
        collision geom of another type is refused (its distance is not modelled here)."""
        if model is None:
            model = g1.load_model(collisions="all", floor=False)
        out = {}
        for side in ("left", "right"):
            geoms = leg_geoms(model, side)
            if not geoms:
                raise ValueError(f"the model has no collision geoms on its {side} leg's bodies")
            ends_a, ends_b, radii = [], [], []
            for gid in geoms:
                try:
                    end_a, end_b, radius = geom_capsule(model, gid)
                except ValueError as exc:
                    raise ValueError(f"leg clearance handles {exc}") from None
                ends_a.append(end_a)
                ends_b.append(end_b)
                radii.append(radius)
            out[f"{side}_body"] = model.geom_bodyid[geoms].astype(np.int64)
            out[f"{side}_a"] = np.array(ends_a)
            out[f"{side}_b"] = np.array(ends_b)
            out[f"{side}_radius"] = np.array(radii)
            out[f"{side}_names"] = tuple(model.geom(g).name for g in geoms)
        return cls(**out)

    def ends(self, xpos: np.ndarray, xquat: np.ndarray) -> dict[str, np.ndarray]:
        """World positions (N, C, 3) of the capsule ends, keyed left_a, left_b, right_a, right_b,
        from body poses (N, nbody, 3|4)."""
        out = {}
        for side in ("left", "right"):
            ids = getattr(self, f"{side}_body")
            rot = quat_to_matrix(xquat[:, ids])
            for end in ("a", "b"):
                offset = getattr(self, f"{side}_{end}")
                out[f"{side}_{end}"] = xpos[:, ids] + np.einsum("ncij,cj->nci", rot, offset)
        return out


def closest_points(p1, q1, p2, q2):
    """Parameters s, t in [0, 1] of the closest points p1 + s (q1 - p1), p2 + t (q2 - p2) of pairs of
    segments (broadcast over leading axes; Ericson, Real-Time Collision Detection, 5.1.9)."""
    d1, d2, r = q1 - p1, q2 - p2, p1 - p2
    a = np.einsum("...i,...i->...", d1, d1)
    e = np.einsum("...i,...i->...", d2, d2)
    f = np.einsum("...i,...i->...", d2, r)
    c = np.einsum("...i,...i->...", d1, r)
    b = np.einsum("...i,...i->...", d1, d2)
    point1, point2 = a <= _EPS, e <= _EPS
    safe_a, safe_e = np.where(point1, 1.0, a), np.where(point2, 1.0, e)
    denom = a * e - b * b
    # the general case: s on the line pair (0 when parallel), t from s, both clamped in turn
    s = np.where(denom > _EPS * a * e, np.clip((b * f - c * e) / np.where(denom > 0, denom, 1.0), 0, 1), 0.0)
    t = (b * s + f) / safe_e
    s = np.where(t < 0, np.clip(-c / safe_a, 0, 1), np.where(t > 1, np.clip((b - c) / safe_a, 0, 1), s))
    t = np.clip(t, 0, 1)
    # degenerate segments (spheres)
    s = np.where(point1, 0.0, np.where(point2, np.clip(-c / safe_a, 0, 1), s))
    t = np.where(point2, 0.0, np.where(point1, np.clip(f / safe_e, 0, 1), t))
    return s, t


def _pairs(legs: LegCapsules, xpos, xquat, margin: float):
    e = legs.ends(xpos, xquat)
    p1, q1 = e["left_a"][:, :, None, :], e["left_b"][:, :, None, :]  # (N, L, 1, 3)
    p2, q2 = e["right_a"][:, None, :, :], e["right_b"][:, None, :, :]  # (N, 1, R, 3)
    s, t = closest_points(p1, q1, p2, q2)  # (N, L, R)
    diff = (p1 + s[..., None] * (q1 - p1)) - (p2 + t[..., None] * (q2 - p2))
    dist = np.linalg.norm(diff, axis=-1)
    gap = dist - legs.left_radius[:, None] - legs.right_radius[None, :]
    short = np.maximum(0.0, margin - gap)  # (N, L, R)
    return s, t, diff, dist, gap, short


def leg_gaps(legs: LegCapsules, xpos: np.ndarray, xquat: np.ndarray) -> np.ndarray:
    """Gaps (N, L, R) in m between every left and every right capsule (negative: overlapping)."""
    xpos, xquat = np.asarray(xpos, np.float64), np.asarray(xquat, np.float64)
    return _pairs(legs, xpos, xquat, 0.0)[4]


def leg_clearance_penalty(legs: LegCapsules, xpos: np.ndarray, xquat: np.ndarray, margin: float):
    """Penalty (N,) in m² and the smallest gap (N,) in m between the legs' capsules."""
    xpos, xquat = np.asarray(xpos, np.float64), np.asarray(xquat, np.float64)
    *_, gap, short = _pairs(legs, xpos, xquat, margin)
    return np.sum(short**2, axis=(1, 2)), gap.min(axis=(1, 2))


def leg_clearance_vjp(
    legs: LegCapsules, xpos: np.ndarray, xquat: np.ndarray, margin: float, g_penalty: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """dL/d(xpos, xquat) (N, nbody, 3), (N, nbody, 4) from dL/dpenalty (N,)."""
    xpos, xquat = np.asarray(xpos, np.float64), np.asarray(xquat, np.float64)
    s, t, diff, dist, _, short = _pairs(legs, xpos, xquat, margin)
    # d short² / d(left closest point) = -2 short · u, u = (left - right) / |.|;
    # the right one gets +2 short · u
    unit = diff / np.maximum(dist, _EPS)[..., None]
    g_left = ((-2.0 * np.asarray(g_penalty, np.float64))[:, None, None] * short)[
        ..., None
    ] * unit  # (N, L, R, 3)
    grads = {
        "left_a": np.einsum("nlr,nlri->nli", 1.0 - s, g_left),
        "left_b": np.einsum("nlr,nlri->nli", s, g_left),
        "right_a": -np.einsum("nlr,nlri->nri", 1.0 - t, g_left),
        "right_b": -np.einsum("nlr,nlri->nri", t, g_left),
    }
    g_xpos, g_xquat = np.zeros_like(xpos), np.zeros_like(xquat)
    for key, g_p in grads.items():
        side, end = key.split("_")
        ids, offset = getattr(legs, f"{side}_body"), getattr(legs, f"{side}_{end}")
        g_rot = g_p[:, :, :, None] * offset[None, :, None, :]  # d(R o)/dR = g ⊗ o
        np.add.at(g_xpos, (slice(None), ids), g_p)
        np.add.at(g_xquat, (slice(None), ids), quat_to_matrix_vjp(xquat[:, ids], g_rot))
    return g_xpos, g_xquat


def clip_gaps(clip, legs: LegCapsules | None = None, margin: float = 0.02) -> tuple[float, int]:
    """The smallest gap (m) between the legs over a motion clip's frames, and the frames within
    ``margin``."""
    legs = legs or LegCapsules.of()
    pos, quat = clip.frames.body_pos, clip.frames.body_quat  # the model's bodies without the world
    world_pos, world_quat = np.zeros((len(pos), 1, 3)), np.tile([1.0, 0.0, 0.0, 0.0], (len(pos), 1, 1))
    xpos, xquat = np.concatenate([world_pos, pos], 1), np.concatenate([world_quat, quat], 1)
    gaps = leg_gaps(legs, xpos, xquat).min(axis=(1, 2))
    return float(gaps.min()), int(np.sum(gaps < margin))


def main(argv: list[str] | None = None) -> int:
    """``python -m bcg.learn.clearance [CLIP ...]``: the legs' smallest gap in motion clips."""

    parser = argparse.ArgumentParser(prog="python -m bcg.learn.clearance", description=main.__doc__)
    parser.add_argument("clips", nargs="*", default=["run", "jump", "fight", "dance"],
                        help="shipped clip names or HDF5 motion files "
                             "(default: the four shipped clips)")  # fmt: skip
    parser.add_argument("--margin", type=float, default=0.02, help="m (default: 0.02, the reward's)")
    args = parser.parse_args(argv)
    if not (np.isfinite(args.margin) and args.margin >= 0):
        parser.error(f"--margin must be a finite number >= 0, not {args.margin}")
    legs = LegCapsules.of()
    print(f"{'clip':>8} {'frames':>7} {'smallest gap [cm]':>18} {'frames within margin':>21}")
    for name in args.clips:
        try:
            clip = MotionClip.load(name)
        except (MotionFileError, OSError) as exc:
            sys.stderr.write(f"error: cannot load motion {name!r}: {exc}\n")
            return 2
        smallest, within = clip_gaps(clip, legs, args.margin)
        print(f"{name:>8} {clip.num_frames:>7} {smallest * 100:>18.2f} {within:>21}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
