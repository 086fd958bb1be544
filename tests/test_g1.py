"""The G1 constants agree with the compiled MJCF."""

import mujoco
import numpy as np
import pytest

from bcg.core import g1


@pytest.fixture(scope="module")
def model():
    return g1.load_model(actuators=True)


def test_joint_order_matches_mjcf(model):
    names = [model.joint(i).name for i in range(model.njnt)]
    assert names[0] == g1.FREE_JOINT
    assert tuple(names[1:]) == g1.JOINT_NAMES
    assert np.all(np.diff(g1.joint_qpos_adr(model)) == 1)


def test_armature_and_gains(model):
    dof = g1.joint_dof_adr(model)
    np.testing.assert_allclose(model.dof_armature[dof], g1.ARMATURE)
    # hand-computed: 7520-22 (knee) kp = 0.025102 * (20 pi)^2, kd = 4 * 0.025102 * 20 pi
    knee = g1.JOINT_NAMES.index("left_knee_joint")
    assert g1.KP[knee] == pytest.approx(0.025102 * (20 * np.pi) ** 2)
    assert g1.KD[knee] == pytest.approx(4 * 0.025102 * 20 * np.pi)
    assert g1.EFFORT_LIMIT[knee] == 139.0
    wrist = g1.JOINT_NAMES.index("right_wrist_yaw_joint")
    assert g1.MOTOR_TYPE[wrist] == "4010" and g1.EFFORT_LIMIT[wrist] == 5.0
    np.testing.assert_allclose(model.actuator_ctrlrange[:, 1], g1.EFFORT_LIMIT)


def test_default_pose_within_limits_and_feet_on_ground(model):
    lim = g1.joint_limits(model)
    assert np.all(g1.DEFAULT_JOINT_POS >= lim[:, 0]) and np.all(g1.DEFAULT_JOINT_POS <= lim[:, 1])
    data = mujoco.MjData(model)
    data.qpos[:] = g1.default_qpos(model)
    mujoco.mj_kinematics(model, data)
    lows = []
    for body, pos in g1.FOOT_SPHERES:
        b = g1.body_ids(model, [body])[0]
        centre = data.xpos[b] + data.xmat[b].reshape(3, 3) @ np.array(pos)
        lows.append(centre[2] - g1.FOOT_SPHERE_RADIUS)
    assert np.max(np.abs(lows)) < 2e-3  # the default pose stands on the floor


def test_action_mapping_round_trip():
    a = np.linspace(-1, 1, g1.NUM_JOINTS)
    np.testing.assert_allclose(g1.target_to_action(g1.action_to_target(a)), a)


def test_foot_spheres_on_sole_plane(model):
    # the spheres' lowest points lie on the foot capsules' lowest plane
    for body, pos in g1.FOOT_SPHERES:
        caps = [
            model.geom(i)
            for i in range(model.ngeom)
            if model.geom(i).name.startswith(body.split("_")[0] + "_foot")
        ]
        assert caps
        low = min(c.pos[2] - c.size[0] for c in caps)
        assert pos[2] - g1.FOOT_SPHERE_RADIUS == pytest.approx(low, abs=1e-9)


def test_collision_modes():
    feet = g1.load_model(collisions="feet")
    active = [
        feet.geom(i).name for i in range(feet.ngeom) if feet.geom_contype[i] or feet.geom_conaffinity[i]
    ]
    assert set(active) - {"floor"} and all("_foot" in n for n in set(active) - {"floor"})
    with pytest.raises(ValueError):
        g1.load_model(collisions="hands")


def _collides(model, a: int, b: int) -> bool:
    """MuJoCo's filter: (contype_a & conaffinity_b) or (contype_b & conaffinity_a)."""
    t, c = model.geom_contype, model.geom_conaffinity
    return bool((t[a] & c[b]) or (t[b] & c[a]))


def test_no_leg_pairs_lets_only_the_legs_pass_through_each_other():
    full = g1.load_model(collisions="all")
    apart = g1.load_model(collisions="no-leg-pairs")
    assert full.ngeom == apart.ngeom
    names = [full.body(int(b)).name for b in full.geom_bodyid]
    legs = {"left": set(), "right": set()}
    for i, body in enumerate(names):
        for side in legs:
            if body.startswith(side + "_") and any(p in body for p in ("_hip_", "_knee_", "_ankle_")):
                legs[side].add(i)
    active = [i for i in range(full.ngeom) if full.geom_contype[i] or full.geom_conaffinity[i]]
    assert {names[i] for i in legs["left"] if i in active} >= {"left_knee_link", "left_ankle_roll_link"}
    left, right = legs["left"] & set(active), legs["right"] & set(active)
    for a in active:
        for b in active:
            if a >= b or full.geom_bodyid[a] == full.geom_bodyid[b]:
                continue
            legs_only = {a, b} <= left | right
            # the full set: every active pair passes the filter; without leg pairs: all but leg-leg
            assert _collides(full, a, b)
            assert _collides(apart, a, b) == (not legs_only), (names[a], names[b])
    # a foot still meets the floor, a knee a hand
    floor = full.geom("floor").id
    assert _collides(apart, floor, apart.geom("left_foot1_collision").id)
    wrist = next(i for i in active if names[i] == "right_wrist_yaw_link")
    assert _collides(apart, wrist, next(iter(legs["right"] & set(active))))
