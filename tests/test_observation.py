"""Observation, ADD features and RobotState from MuJoCo, against MuJoCo and finite differences."""

import dataclasses

import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.core import kinematics as K
from bcg.core import rotations as R
from bcg.learn import features as F
from bcg.learn import observation as O


@pytest.fixture(scope="module")
def model():
    return g1.load_model(floor=False, collisions="none")


def random_qpos_qvel(model, rng, n):
    """n random configurations near the default pose, random root orientation and velocities."""
    qpos = np.tile(g1.default_qpos(model), (n, 1))
    qpos[:, 0:3] += rng.normal(scale=0.3, size=(n, 3))
    quat = rng.normal(size=(n, 4))
    qpos[:, 3:7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    qpos[:, g1.joint_qpos_adr(model)] += rng.uniform(-0.6, 0.6, size=(n, g1.NUM_JOINTS))
    qvel = rng.normal(size=(n, model.nv))
    return qpos, qvel


def random_states(model, rng, n=3):
    qpos, qvel = random_qpos_qvel(model, rng, 4 * n)
    s = K.robot_state_from_qpos_qvel(model, qpos, qvel)
    take = [
        dataclasses.replace(s, **{f.name: getattr(s, f.name)[i::4] for f in dataclasses.fields(s)})
        for i in range(4)
    ]
    return take[0], take[1:]


# ---------------------------------------------------------------------------------------------------
# Layout


def test_layout_size_and_noise(model):
    assert O.OBSERVATION_SIZE == sum(b.size for b in O.OBSERVATION_LAYOUT) == 825
    assert O.observation_layout_of_model(model) == O.OBSERVATION_LAYOUT
    blocks = {b.name: b for b in O.OBSERVATION_LAYOUT}
    assert blocks["joint_rot"].size == 6 * 29 and blocks["key_body_pos"].size == 15
    current = sum(b.size for b in O.OBSERVATION_LAYOUT if not b.name.startswith("ref"))
    per_ref = sum(b.size for b in O.OBSERVATION_LAYOUT if b.name.startswith("ref1_"))
    assert (current, per_ref) == (231, 198)
    # the paper's noise table
    expected = {
        "root_height": 0,
        "root_rot": 0.05,
        "root_lin_vel": 0.5,
        "root_ang_vel": 0.2,
        "joint_rot": 0.01,
    }
    expected |= {"joint_vel": 0.5, "key_body_pos": 0.01}
    for k in (1, 2, 3):
        expected |= {f"ref{k}_root_pos": 0.25, f"ref{k}_root_rot": 0, f"ref{k}_joint_rot": 0}
        expected[f"ref{k}_key_body_pos"] = 0
    assert {b.name: b.noise for b in O.OBSERVATION_LAYOUT} == expected


def test_layout_refuses_other_model():
    spec = g1.load_spec()
    spec.joint("left_knee_joint").name = "left_knee_renamed"
    with pytest.raises(ValueError, match="hinge joints"):
        O.observation_layout_of_model(spec.compile())


def test_feature_size(model):
    assert F.FEATURE_SIZE == sum(b.size for b in F.FEATURE_LAYOUT) == 3 + 6 + 174 + 3 * (model.nbody - 2) + 35
    assert F.feature_layout_of_model(model) == F.FEATURE_LAYOUT


# ---------------------------------------------------------------------------------------------------
# Rotation maths against MuJoCo


def test_quat_to_matrix_matches_mujoco():
    rng = np.random.default_rng(1)
    for q in rng.normal(size=(20, 4)):
        q /= np.linalg.norm(q)
        ref = np.zeros(9)
        mujoco.mju_quat2Mat(ref, q)
        np.testing.assert_allclose(R.quat_to_matrix(q), ref.reshape(3, 3), atol=1e-14)
    np.testing.assert_array_equal(R.quat_to_rot6d(np.array([1.0, 0, 0, 0])), [1, 0, 0, 0, 0, 1])


def test_joint_rotation_matches_mujoco_relative_body_orientation(model):
    rng = np.random.default_rng(2)
    qpos, qvel = random_qpos_qvel(model, rng, 4)
    state = K.robot_state_from_qpos_qvel(model, qpos, qvel)
    obs = O.observation(state, [state] * 3)
    joint_rot = obs[:, O.observation_slices()["joint_rot"]].reshape(4, 29, 6)
    data = mujoco.MjData(model)
    for i in range(4):
        data.qpos[:] = qpos[i]
        mujoco.mj_kinematics(model, data)
        for j, name in enumerate(g1.JOINT_NAMES):
            child = model.jnt_bodyid[model.joint(name).id]
            parent = model.body_parentid[child]
            rel = data.xmat[parent].reshape(3, 3).T @ data.xmat[child].reshape(3, 3)
            offset = np.zeros(9)
            mujoco.mju_quat2Mat(offset, model.body_quat[child])
            joint = offset.reshape(3, 3).T @ rel  # remove the fixed parent->child orientation
            np.testing.assert_allclose(joint_rot[i, j], np.r_[joint[:, 0], joint[:, 2]], atol=1e-12)


def test_ang_vel_conversion_round_trip():
    rng = np.random.default_rng(3)
    q = rng.normal(size=(5, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    w = rng.normal(size=(5, 3))
    np.testing.assert_allclose(R.ang_vel_world_to_body(q, R.ang_vel_body_to_world(q, w)), w, atol=1e-14)


# ---------------------------------------------------------------------------------------------------
# RobotState from MuJoCo


def test_robot_state_from_mujoco_against_sites_and_object_velocity(model):
    # independent reference: a site placed at each key point, and MuJoCo's own body velocity
    spec = g1.build_spec(floor=False, collisions="none")
    for name, body, offset in g1.KEY_BODIES:
        spec.body(body).add_site(name=f"key_{name}", pos=list(offset))
    with_sites = spec.compile()
    rng = np.random.default_rng(4)
    qpos, qvel = random_qpos_qvel(with_sites, rng, 3)
    state = K.robot_state_from_qpos_qvel(with_sites, qpos, qvel)
    data = mujoco.MjData(with_sites)
    for i in range(3):
        data.qpos[:], data.qvel[:] = qpos[i], qvel[i]
        mujoco.mj_forward(with_sites, data)
        for k, (name, _, _) in enumerate(g1.KEY_BODIES):
            np.testing.assert_allclose(state.key_body_pos[i, k], data.site(f"key_{name}").xpos, atol=1e-12)
        vel = np.zeros(6)
        mujoco.mj_objectVelocity(with_sites, data, mujoco.mjtObj.mjOBJ_XBODY, 1, vel, 0)
        np.testing.assert_allclose(state.root_ang_vel[i], vel[:3], atol=1e-12)
        np.testing.assert_allclose(state.root_lin_vel[i], vel[3:], atol=1e-12)
        np.testing.assert_allclose(state.body_pos[i], data.xpos[1:], atol=1e-12)
        np.testing.assert_allclose(state.root_pos[i], data.body("pelvis").xpos, atol=1e-12)
    head = state.key_body_pos[:, 2] - state.body_pos[:, model.body("torso_link").id - 1]
    np.testing.assert_allclose(np.linalg.norm(head, axis=1), 0.43, atol=1e-12)
    assert K.body_names(model)[0] == g1.ROOT_BODY and len(K.body_names(model)) == state.body_pos.shape[1]


def test_robot_state_rejects_bad_shapes(model):
    with pytest.raises(ValueError, match="qpos must be"):
        K.robot_state_from_qpos_qvel(model, np.zeros((2, model.nq)), np.zeros((3, model.nv)))
    good = K.robot_state_from_qpos_qvel(model, g1.default_qpos(model)[None], np.zeros((1, model.nv)))
    with pytest.raises(ValueError, match="joint_pos"):
        good.replace(joint_pos=np.zeros((1, 28)))


# ---------------------------------------------------------------------------------------------------
# Observation blocks against direct computation


def test_observation_blocks(model):
    rng = np.random.default_rng(5)
    robot, refs = random_states(model, rng)
    obs = O.observation(robot, refs)
    s = O.observation_slices()
    assert obs.shape == (3, 825) and obs.dtype == np.float64
    np.testing.assert_array_equal(obs[:, s["root_height"]][:, 0], robot.root_pos[:, 2])
    for i in range(3):
        rot = np.zeros(9)
        mujoco.mju_quat2Mat(rot, robot.root_quat[i])
        rot = rot.reshape(3, 3)
        np.testing.assert_allclose(obs[i, s["root_rot"]], np.r_[rot[:, 0], rot[:, 2]], atol=1e-14)
    np.testing.assert_array_equal(obs[:, s["root_lin_vel"]], robot.root_lin_vel)
    np.testing.assert_array_equal(obs[:, s["root_ang_vel"]], robot.root_ang_vel)
    np.testing.assert_array_equal(obs[:, s["joint_vel"]], robot.joint_vel)
    key = obs[:, s["key_body_pos"]].reshape(3, 5, 3)
    np.testing.assert_allclose(key + robot.root_pos[:, None], robot.key_body_pos, atol=1e-14)
    for k, ref in zip((1, 2, 3), refs, strict=True):
        rp = obs[:, s[f"ref{k}_root_pos"]]
        np.testing.assert_allclose(rp[:, :2] + robot.root_pos[:, :2], ref.root_pos[:, :2], atol=1e-14)
        np.testing.assert_array_equal(rp[:, 2], ref.root_pos[:, 2])
        np.testing.assert_allclose(obs[:, s[f"ref{k}_root_rot"]], R.quat_to_rot6d(ref.root_quat))
        alone = O.observation(ref, [ref] * 3)  # the reference's joint rotations as a robot's
        np.testing.assert_array_equal(obs[:, s[f"ref{k}_joint_rot"]], alone[:, s["joint_rot"]])
        rel = obs[:, s[f"ref{k}_key_body_pos"]].reshape(3, 5, 3)
        np.testing.assert_allclose(rel + ref.root_pos[:, None], ref.key_body_pos, atol=1e-14)


def test_observation_dtype_follows_input(model):
    rng = np.random.default_rng(6)
    robot, refs = random_states(model, rng)

    def f32(s):
        return dataclasses.replace(
            s, **{f.name: getattr(s, f.name).astype(np.float32) for f in dataclasses.fields(s)}
        )

    obs32 = O.observation(f32(robot), [f32(r) for r in refs], noise_rng=np.random.default_rng(0))
    assert obs32.dtype == np.float32
    np.testing.assert_allclose(
        obs32, O.observation(robot, refs, noise_rng=np.random.default_rng(0)), atol=1e-5
    )


def test_observation_rejects_wrong_references(model):
    rng = np.random.default_rng(7)
    robot, refs = random_states(model, rng)
    with pytest.raises(ValueError, match="3 reference frames"):
        O.observation(robot, refs[:2])
    one = dataclasses.replace(
        refs[0], **{f.name: getattr(refs[0], f.name)[:1] for f in dataclasses.fields(refs[0])}
    )
    with pytest.raises(ValueError, match="batch"):
        O.observation(robot, [one, refs[1], refs[2]])


# ---------------------------------------------------------------------------------------------------
# Noise


def test_noise_off_is_deterministic_and_on_is_bounded(model):
    rng = np.random.default_rng(8)
    robot, refs = random_states(model, rng, n=200)
    clean = O.observation(robot, refs)
    np.testing.assert_array_equal(clean, O.observation(robot, refs))
    noisy = O.observation(robot, refs, noise_rng=np.random.default_rng(9))
    np.testing.assert_array_equal(noisy, O.observation(robot, refs, noise_rng=np.random.default_rng(9)))
    s = O.observation_slices()
    for block in O.OBSERVATION_LAYOUT:
        diff = np.abs(noisy[:, s[block.name]] - clean[:, s[block.name]])
        if block.noise == 0:
            assert np.all(diff == 0), block.name
        else:
            assert diff.max() <= block.noise * (1 + 1e-9), block.name
            # uniform on [-n, n]: 200 x size draws reach close to the bound and average n / 2
            assert diff.max() > 0.9 * block.noise, block.name
            assert abs(diff.mean() / block.noise - 0.5) < 0.1, block.name


# ---------------------------------------------------------------------------------------------------
# Vector-Jacobian products against central finite differences (float64)

GRAD_FIELDS = (
    "root_pos",
    "root_quat",
    "root_lin_vel",
    "root_ang_vel",
    "joint_pos",
    "joint_vel",
    "key_body_pos",
)


def finite_difference(loss, state, field, eps=1e-6):
    value = getattr(state, field)
    grad = np.zeros_like(value)
    for idx in np.ndindex(value.shape):
        plus, minus = value.copy(), value.copy()
        plus[idx] += eps
        minus[idx] -= eps
        grad[idx] = (loss(state.replace(**{field: plus})) - loss(state.replace(**{field: minus}))) / (2 * eps)
    return grad


def test_observation_vjp_matches_finite_differences(model):
    rng = np.random.default_rng(10)
    robot, refs = random_states(model, rng, n=2)
    weights = rng.normal(size=(2, O.OBSERVATION_SIZE))

    def loss(state):
        return float(np.sum(weights * O.observation(state, refs)))

    grad = O.observation_vjp(robot, refs, weights)
    for field in GRAD_FIELDS:
        np.testing.assert_allclose(
            getattr(grad, field), finite_difference(loss, robot, field), atol=1e-7, rtol=1e-6
        )
    assert np.all(grad.body_pos == 0)
    assert np.abs(grad.root_quat).max() > 1 and np.abs(grad.joint_pos).max() > 1  # non-trivial
    # body positions are not part of the observation: a state without them gives the same
    bare = robot.replace(body_pos=None)
    np.testing.assert_array_equal(O.observation(bare, refs), O.observation(robot, refs))
    bare_grad = O.observation_vjp(bare, refs, weights)
    assert bare_grad.body_pos is None
    np.testing.assert_array_equal(bare_grad.joint_pos, grad.joint_pos)
    with pytest.raises(ValueError, match="g_obs must have shape"):
        O.observation_vjp(robot, refs, weights[:, :-1])


def test_add_features_blocks(model):
    rng = np.random.default_rng(11)
    state, _ = random_states(model, rng)
    f = F.add_features(state)
    s = F.feature_slices()
    assert f.shape == (3, F.FEATURE_SIZE)
    obs = O.observation(state, [state] * 3)
    so = O.observation_slices()
    np.testing.assert_array_equal(f[:, s["root_pos"]], state.root_pos)
    np.testing.assert_array_equal(f[:, s["root_rot"]], obs[:, so["root_rot"]])
    np.testing.assert_array_equal(f[:, s["joint_rot"]], obs[:, so["joint_rot"]])
    rel = f[:, s["body_pos"]].reshape(3, -1, 3)
    np.testing.assert_allclose(rel + state.root_pos[:, None], state.body_pos[:, 1:], atol=1e-14)
    for name in ("root_lin_vel", "root_ang_vel", "joint_vel"):
        np.testing.assert_array_equal(f[:, s[name]], getattr(state, name))
    with pytest.raises(ValueError, match="body_pos"):
        F.add_features(state.replace(body_pos=None))


def test_add_features_vjp_matches_finite_differences(model):
    rng = np.random.default_rng(12)
    state, _ = random_states(model, rng, n=2)
    weights = rng.normal(size=(2, F.FEATURE_SIZE))

    def loss(s):
        return float(np.sum(weights * F.add_features(s)))

    grad = F.add_features_vjp(state, weights)
    for field in GRAD_FIELDS[:-1] + ("body_pos",):
        np.testing.assert_allclose(
            getattr(grad, field), finite_difference(loss, state, field), atol=1e-7, rtol=1e-6
        )
    assert np.all(grad.key_body_pos == 0)


def test_quat_to_matrix_vjp_matches_finite_differences():
    rng = np.random.default_rng(13)
    q = rng.normal(size=(4, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    g = rng.normal(size=(4, 3, 3))
    eps = 1e-6
    fd = np.zeros_like(q)
    for i in range(4):
        step = np.zeros(4)
        step[i] = eps
        fd[:, i] = np.sum(g * (R.quat_to_matrix(q + step) - R.quat_to_matrix(q - step)), axis=(1, 2)) / (
            2 * eps
        )
    np.testing.assert_allclose(R.quat_to_matrix_vjp(q, g), fd, atol=1e-8)


def test_reference_states_from_motion_clip_match_mujoco(model):
    from bcg.motion.clip import MotionClip

    clip = MotionClip.load("run", model=model)
    times = np.array([0.0, 10 * clip.dt, 57 * clip.dt])  # frame times: stored frames, no interpolation
    ref = K.reference_state(clip.sample(times))
    fk = K.robot_state_from_qpos_qvel(model, clip.qpos(clip.sample(times)), clip.qvel(clip.sample(times)))
    for field in ("root_pos", "root_quat", "root_lin_vel", "root_ang_vel", "joint_pos", "joint_vel"):
        np.testing.assert_allclose(getattr(ref, field), getattr(fk, field), atol=1e-9, err_msg=field)
    np.testing.assert_allclose(ref.key_body_pos, fk.key_body_pos, atol=1e-9)
    np.testing.assert_allclose(ref.body_pos, fk.body_pos, atol=1e-9)
    future = K.reference_states(clip.sample_future(times, steps=(1, 2, 3)))
    assert len(future) == 3
    for k, step in enumerate(future, start=1):
        later = K.reference_state(clip.sample(times + k * g1.CONTROL_DT))
        for f in dataclasses.fields(step):
            np.testing.assert_array_equal(getattr(step, f.name), getattr(later, f.name))
    assert O.observation(ref, future).shape == (3, 825)
