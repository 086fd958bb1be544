"""Leg clearance geometry: segment distances, the gaps against MuJoCo's own collision detection on
the G1's leg capsules, and the penalty's gradient against central differences."""

import mujoco
import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from bcg.core import g1
from bcg.learn.clearance import (
    LegCapsules,
    clip_gaps,
    closest_points,
    leg_clearance_penalty,
    leg_clearance_vjp,
    leg_gaps,
    main,
)
from bcg.motion import MotionClip


def _reference_distance(p1, q1, p2, q2):
    """Segment distance by a bounded scalar search on the first segment (the distance from a point
    moving along a segment to another segment is convex in its parameter) and the exact clamp on the
    second."""
    d2 = q2 - p2
    e = d2 @ d2

    def dist(s):
        a = p1 + s * (q1 - p1)
        t = np.clip((a - p2) @ d2 / e, 0, 1) if e > 0 else 0.0
        return np.linalg.norm(a - p2 - t * d2)

    best = minimize_scalar(dist, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-12})
    return min(best.fun, dist(0.0), dist(1.0))


def test_closest_points_of_segments_give_the_segment_distance():
    """Random, parallel, crossing and point-like segments: the distance between the returned points
    equals a scalar search's."""
    rng = np.random.default_rng(0)
    cases = [rng.normal(size=(4, 3)) for _ in range(200)]
    p = rng.normal(size=3)
    d = rng.normal(size=3)
    cases += [
        np.array([p, p + d, p + [0, 0, 0.3], p + [0, 0, 0.3] + 2 * d]),  # parallel, overlapping
        np.array([p, p + d, p + 3 * d + [0.1, 0, 0], p + 4 * d]),  # collinear-ish, apart
        np.array([p, p, p + d, p + 2 * d]),  # a point and a segment
        np.array([p + d, p + 2 * d, p, p]),  # a segment and a point
        np.array([p, p, p + d, p + d]),  # two points
        np.array([[0, 0, 0], [1, 0, 0], [0.5, -1, 0], [0.5, 1, 0]]),  # crossing: distance 0
    ]
    p1, q1, p2, q2 = (np.array([c[i] for c in cases], float) for i in range(4))
    s, t = closest_points(p1, q1, p2, q2)
    assert np.all((s >= 0) & (s <= 1) & (t >= 0) & (t <= 1))
    got = np.linalg.norm(p1 + s[:, None] * (q1 - p1) - p2 - t[:, None] * (q2 - p2), axis=1)
    want = np.array([_reference_distance(*c) for c in zip(p1, q1, p2, q2)])
    np.testing.assert_allclose(got, want, atol=1e-9)
    assert got[-1] == pytest.approx(0.0, abs=1e-15)


def _leg_poses(n, seed):
    """Run and Fight frames with the leg joints shaken (hip roll and yaw pulled inwards), so that
    the legs come close or overlap in many of them."""
    rng = np.random.default_rng(seed)
    model = g1.load_model(collisions="none", floor=False)
    clips = [MotionClip.load(name, model) for name in ("run", "fight")]
    qpos = np.concatenate([c.qpos(c.frames)[::9] for c in clips])
    qpos = qpos[rng.integers(0, len(qpos), n)]
    jq = g1.joint_qpos_adr(model)
    for j, name in enumerate(g1.JOINT_NAMES):
        if not any(part in name for part in ("hip", "knee", "ankle")):
            continue
        shake = rng.normal(0.0, 0.25, n)
        if "hip_roll" in name or "hip_yaw" in name:
            shake += (-0.4 if name.startswith("left") else 0.4) * rng.uniform(0, 1, n)
        qpos[:, jq[j]] += shake
    return qpos


def test_gaps_are_mujocos_capsule_distances():
    """Every left-right pair of leg capsules that MuJoCo's collision detection reports within a 10 cm
    margin has the same distance here (to 1e-9 m), and every pair closer than 9 cm here is one MuJoCo
    reports: the gap is MuJoCo's, overlaps (negative gaps) included."""
    model = g1.load_model(collisions="all", floor=False)
    legs = LegCapsules.of(model)
    assert len(legs.left_names) == len(legs.right_names) == 11  # hip, thigh, shin, brace, 7 foot capsules
    left = {mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, n): i for i, n in enumerate(legs.left_names)}
    right = {mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, n): i for i, n in enumerate(legs.right_names)}
    model.geom_margin[list(left) + list(right)] = 0.05  # a pair's margin is the sum: 10 cm
    model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_MIDPHASE  # its boxes leave out the margins
    data = mujoco.MjData(model)
    compared, overlapping = 0, 0
    for qpos in _leg_poses(60, seed=3):
        data.qpos[:] = qpos
        mujoco.mj_kinematics(model, data)
        mujoco.mj_collision(model, data)
        ours = leg_gaps(legs, data.xpos[None], data.xquat[None])[0]
        theirs = np.full_like(ours, np.inf)
        for c in data.contact[: data.ncon]:
            g = tuple(int(x) for x in c.geom)
            for a, b in (g, g[::-1]):
                if a in left and b in right:
                    theirs[left[a], right[b]] = min(theirs[left[a], right[b]], c.dist)
        reported = np.isfinite(theirs)
        np.testing.assert_allclose(ours[reported], theirs[reported], atol=1e-9)
        assert np.all(reported[ours < 0.09])
        compared += int(reported.sum())
        overlapping += int((ours < 0).sum())
    assert compared > 200 and overlapping >= 10, (compared, overlapping)


def test_penalty_gradient_matches_central_differences():
    """d penalty / d(body positions, quaternions) against central differences in float64, at poses
    with many pairs inside a 6 cm margin (touching and overlapping ones among them)."""
    model = g1.load_model(collisions="all", floor=False)
    legs = LegCapsules.of(model)
    data = mujoco.MjData(model)
    xpos, xquat = [], []
    for qpos in _leg_poses(60, seed=5):
        data.qpos[:] = qpos
        mujoco.mj_kinematics(model, data)
        xpos.append(data.xpos.copy())
        xquat.append(data.xquat.copy())
    xpos, xquat = np.array(xpos), np.array(xquat)
    closest = np.argsort(leg_gaps(legs, xpos, xquat).min(axis=(1, 2)))[:4]  # the 4 closest poses
    xpos, xquat = xpos[closest], xquat[closest]
    margin = 0.06
    penalty, smallest = leg_clearance_penalty(legs, xpos, xquat, margin)
    assert np.all(penalty > 0) and smallest.min() < 0 and np.sum(leg_gaps(legs, xpos, xquat) < margin) > 20
    weights = np.array([1.0, -2.0, 0.5, 3.0])
    g_pos, g_quat = leg_clearance_vjp(legs, xpos, xquat, margin, weights)
    rng = np.random.default_rng(0)
    eps = 1e-6
    for _ in range(6):
        d_pos, d_quat = rng.normal(size=xpos.shape), rng.normal(size=xquat.shape)
        d_pos[:, 0] = d_quat[:, 0] = 0.0  # the world body does not move

        plus, _ = leg_clearance_penalty(legs, xpos + eps * d_pos, xquat + eps * d_quat, margin)
        minus, _ = leg_clearance_penalty(legs, xpos - eps * d_pos, xquat - eps * d_quat, margin)
        fd = float(weights @ (plus - minus)) / (2 * eps)
        assert float(np.sum(g_pos * d_pos) + np.sum(g_quat * d_quat)) == pytest.approx(
            fd, rel=1e-6, abs=1e-10
        )


def test_other_collision_shapes_on_a_leg_are_refused():
    spec = g1.build_spec(collisions="all", floor=False)
    geom = next(g for g in spec.geoms if g.name == "left_thigh_collision")
    geom.type = mujoco.mjtGeom.mjGEOM_BOX
    geom.size = [0.05, 0.05, 0.1]
    with pytest.raises(ValueError, match="'left_thigh_collision' is a mjGEOM_BOX"):
        LegCapsules.of(spec.compile())
    with pytest.raises(ValueError, match="no collision geoms on its left leg"):
        LegCapsules.of(g1.load_model(collisions="none", floor=False))


def test_shipped_clips_keep_their_legs_apart(capsys):
    """The reward's 2 cm margin does not fire on the shipped clips (so tracking them exactly costs
    nothing); the command prints each clip's smallest gap."""
    smallest, within = clip_gaps(MotionClip.load("run"))
    assert 0.02 < smallest < 0.05 and within == 0
    assert main(["run", "--margin", "0.03"]) == 0
    out = capsys.readouterr().out
    assert "smallest gap" in out and f"{smallest * 100:.2f}" in out


def test_the_command_refuses_a_missing_clip_and_a_bad_margin(capsys):
    assert main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load motion 'nosuch'") and "Traceback" not in err
    for margin in ("nan", "-0.01"):
        with pytest.raises(SystemExit) as exit_:
            main(["run", "--margin", margin])
        assert exit_.value.code == 2 and "--margin must be a finite number >= 0" in capsys.readouterr().err
