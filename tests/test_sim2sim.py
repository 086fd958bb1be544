"""Sim-to-sim validation: metrics against hand values and MuJoCo, the MuJoCo player against bcg.sim,
gains read from the policy file, the fall detector, command-line errors, the video and the sweep."""

import dataclasses
import json
import re
import subprocess
import sys

import h5py
import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.learn.policy import load_policy, make_hold_policy
from bcg.motion import MotionClip
from bcg.validate import metrics
from bcg.validate import sim2sim as cli
from bcg.validate import sweep as sweep_cli
from bcg.validate.mujoco_runner import (
    MujocoG1,
    PDParams,
    PolicyActions,
    ReferencePD,
    ResetNoise,
    TrainingSimG1,
    initial_state,
    run_episode,
)


@pytest.fixture(scope="module")
def hold_path(tmp_path_factory):
    return make_hold_policy(tmp_path_factory.mktemp("policy") / "hold.h5", motion="run")


@pytest.fixture(scope="module")
def clip():
    return MotionClip.load("run")


def default_start(model):
    """The default standing pose (feet on the ground), at rest, at clip time 1 s."""
    return 1.0, g1.default_qpos(model), np.zeros(model.nv)


# ---------------------------------------------------------------------------------------------------
# Metrics


def test_tracking_errors_hand_computed():
    # two steps, three points; the root is point 0
    ref = np.zeros((2, 3, 3))
    robot = ref.copy()
    robot[0, :, 0] = 0.03  # step 0: everything shifted 3 cm in x -> global 3 cm, root-relative 0
    robot[1, 1, 2] = 0.06  # step 1: point 1 is 6 cm too high -> global 2 cm, root-relative 2 cm
    e_global, e_root = metrics.tracking_errors(robot, ref)
    assert e_global == pytest.approx((3 * 3.0 + 6.0) / 6)
    assert e_root == pytest.approx(6.0 / 6)
    assert all(np.isnan(metrics.tracking_errors(np.zeros((0, 3, 3)), np.zeros((0, 3, 3)))))
    with pytest.raises(ValueError):
        metrics.tracking_errors(robot, ref[:, :2])


def test_first_far_step_hand_computed():
    ref = np.zeros((4, 3, 3))
    robot = ref.copy()
    robot[2, 1, 0] = 0.6  # body 1 is 0.6 m off at step 2
    robot[1, 2, 0] = 5.0  # point 2 is not a body origin (n_bodies = 2): never counted
    assert metrics.first_far_step(robot, ref, 2, 0.5) == 2
    assert metrics.first_far_step(robot, ref, 2, 0.6) is None  # farther than, not as far as
    assert metrics.first_far_step(robot, ref, 2, 0.0) is None  # the rule off
    assert metrics.first_far_step(robot, ref, 3, 1.0) == 1


def test_lost_track_times_are_where_a_body_first_passes_the_pose_termination(clip, capsys):
    """Reference PD from random starts: the clip time at which a body first lies beyond the training's
    pose termination distance, as the metric finds it in the returned episodes, in the runs and the
    summary; none for the rule off or out of reach."""
    config = cli.EvalConfig(runs=2, seconds=1.0, training_sim="off")
    pd = PDParams.from_g1()
    tight = 0.03  # reference PD with reset noise drifts a few cm: some body passes 3 cm
    results, episodes, _ = cli.evaluate(ReferencePD(), pd, clip, config, ResetNoise.of_training(None), 300.0,
                                        progress=None, pose_termination=tight)  # fmt: skip
    nb = MujocoG1(pd).model.nbody - 1
    for r, ep in zip(results, episodes):
        k = metrics.first_far_step(ep.points, ep.ref_points, nb, tight)
        assert k is not None and r.lost_track_time == pytest.approx(ep.times[k])
        assert ep.start_time < r.lost_track_time <= ep.times[-1]
    summary = cli.summarize(results)
    assert summary["lost_track_runs"] == 2
    assert summary["lost_track_clip_times_s"] == pytest.approx(sorted(r.lost_track_time for r in results))
    assert "runs with a body beyond the training's pose termination: 2/2" in cli.format_summary(summary, "s")
    for off in (0.0, 100.0):
        results, _, _ = cli.evaluate(ReferencePD(), pd, clip, config, ResetNoise.of_training(None), 300.0,
                                     progress=None, pose_termination=off)  # fmt: skip
        assert all(r.lost_track_time is None for r in results)
        assert cli.summarize(results)["lost_track_runs"] == 0


def test_training_pose_termination_read_from_the_policy_config():
    assert cli.training_pose_termination(None) == 0.0
    assert cli.training_pose_termination({"env": {"kappa": 300.0}}) == 0.0  # stored before the field
    assert cli.training_pose_termination({"env": {"pose_termination_dist": 1.5}}) == 1.5
    for bad in (-1.0, "1", True, float("inf")):
        with pytest.raises(cli.EvaluationError, match="pose_termination_dist"):
            cli.training_pose_termination({"env": {"pose_termination_dist": bad}})


def test_path_ratio_hand_computed():
    ref = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]])  # 3 m of path
    robot = np.array([[0.0, 0.0], [0.5, 0.0], [0.5, 1.0]])  # 1.5 m: half the reference's
    assert metrics.path_ratio(robot, ref) == pytest.approx(0.5)
    assert metrics.path_ratio(ref + 7.0, ref) == pytest.approx(1.0)  # an offset is not a shortfall
    assert np.isnan(metrics.path_ratio(robot, np.zeros((3, 2))))
    with pytest.raises(ValueError):
        metrics.path_ratio(robot, ref[:2])


def _yaw_quat(deg):
    half = np.radians(deg) / 2.0
    return np.stack([np.cos(half), np.zeros_like(half), np.zeros_like(half), np.sin(half)], axis=-1)


def test_heading_errors_hand_computed_signed_and_wrapped():
    robot = _yaw_quat(np.array([10.0, 170.0, -170.0, 90.0]))
    ref = _yaw_quat(np.array([0.0, -170.0, 170.0, -90.0]))
    # robot - reference, the short way round: 10, 170 - (-170) = 340 -> -20, -340 -> +20, 180 -> -180
    np.testing.assert_allclose(metrics.heading_errors(robot, ref), [10.0, -20.0, 20.0, -180.0], atol=1e-9)
    # a tilt about the root's own x axis leaves the heading as it is
    roll = np.array([np.cos(0.2), np.sin(0.2), 0.0, 0.0])
    w1, v1, w2, v2 = robot[0, 0], robot[0, 1:], roll[0], roll[1:]
    tilted = np.concatenate([[w1 * w2 - v1 @ v2], w1 * v2 + w2 * v1 + np.cross(v1, v2)])
    assert metrics.heading_errors(tilted[None], ref[:1])[0] == pytest.approx(10.0)
    with pytest.raises(ValueError):
        metrics.heading_errors(robot, ref[:2])


def test_penetration_stats_hand_computed():
    depth = np.zeros((4, 8))
    depth[0, 3] = 0.002
    depth[1, 0], depth[1, 5] = 0.001, 0.004
    stats = metrics.penetration_stats(depth)
    assert stats.mean_mm == pytest.approx((2 + 4) / 4)
    assert stats.max_mm == pytest.approx(4.0)
    assert stats.p95_mm == pytest.approx(np.percentile([2, 4, 0, 0], 95))


def test_fall_detector_threshold():
    assert metrics.fell([0.78, 0.5, 0.29])
    assert not metrics.fell([0.78, 0.5, 0.31])
    assert not metrics.fell([0.78, 0.5, 0.29], threshold=0.2)


def test_tracked_points_are_bodies_plus_head(clip):
    model = g1.load_model()
    names = metrics.tracked_point_names(model)
    assert len(names) == 31 and names[0] == g1.ROOT_BODY and names[-1] == "head"
    # at a reference frame the robot's points, read from MuJoCo, equal the clip's (same order, by name)
    from bcg.core.kinematics import reference_state, robot_state_from_mujoco

    ref = clip.sample(np.array([2.0]))
    data = mujoco.MjData(model)
    data.qpos[:] = clip.qpos(ref)[0]
    mujoco.mj_kinematics(model, data)
    extra = metrics.extra_key_points(model)
    robot_points = metrics.tracked_points(robot_state_from_mujoco(model, data), extra)
    ref_points = metrics.tracked_points(reference_state(ref), extra)
    np.testing.assert_allclose(robot_points, ref_points, atol=1e-9)


def test_foot_sphere_depth_matches_mujoco_capsule_contacts():
    """The spheres share the foot capsules' radius and axis height: with the feet flat, sphere depth
    equals MuJoCo's own capsule-plane penetration."""
    model = g1.load_model(collisions="feet")
    data = mujoco.MjData(model)
    spheres = metrics.FootSpheres.of(model)
    for sink in (0.0, 0.004, 0.012):
        data.qpos[:] = g1.default_qpos(model)
        data.qpos[2] -= sink
        mujoco.mj_forward(model, data)
        depth = spheres.depth(data.xpos, data.xmat)
        mujoco_depth = max([0.0] + [-c.dist for c in data.contact[: data.ncon]])
        assert depth.max() == pytest.approx(mujoco_depth, abs=1e-9)
        assert np.ptp(depth) < 1e-9  # flat feet: all eight spheres equally deep
    assert depth.max() > 0.01


def test_mujoco_penetration_is_its_own_contact_depth_also_with_a_tilted_foot(hold_path):
    """With a sole tilted (ankle roll 0.2 rad, as in a stride), the spheres and MuJoCo's capsules
    disagree; the MuJoCo player reports MuJoCo's own contact depth of the state each physics step
    ends in."""
    policy = load_policy(hold_path)
    mj = MujocoG1(PDParams.from_policy(policy), collisions="feet")  # only the feet touch anything
    qpos = g1.default_qpos(mj.model)
    roll = mujoco.mj_name2id(mj.model, mujoco.mjtObj.mjOBJ_JOINT, "left_ankle_roll_joint")
    qpos[mj.model.jnt_qposadr[roll]] += 0.2
    qpos[2] -= 0.01
    mj.reset(qpos, np.zeros(mj.model.nv))
    sub_qpos = mj.control_step(policy.default_joint_pos)
    depths = mj.foot_depths(sub_qpos)
    data = mujoco.MjData(mj.model)
    for q, reported in zip(sub_qpos, depths, strict=True):
        data.qpos[:] = q
        mujoco.mj_forward(mj.model, data)
        assert reported == pytest.approx(max([0.0] + [-c.dist for c in data.contact[: data.ncon]]), abs=1e-12)
    data.qpos[:] = qpos
    mujoco.mj_forward(mj.model, data)
    spheres = metrics.FootSpheres.of(mj.model).depth(data.xpos, data.xmat).max()
    capsules = max(-c.dist for c in data.contact[: data.ncon])
    assert abs(spheres - capsules) > 5e-4  # the stand-in shape would have been off


# ---------------------------------------------------------------------------------------------------
# The player


def test_mujoco_matches_bcg_sim_without_contact(ti64, hold_path, clip):
    """Floor and collisions off: MuJoCo (semi-implicit Euler, PD every 5 ms) and bcg.sim (the same
    integrator and PD) play the same policy to the same trajectory. Both are float64 and differ only
    by rounding (summation order of the dynamics); measured ~5e-15 m over 1 s of free fall with PD
    (the robot drops 5 m), so 1e-9 m leaves six orders of margin and still catches any modelling
    difference (a wrong gain, armature or torque limit moves the state by millimetres)."""
    policy = load_policy(hold_path)
    pd = PDParams.from_policy(policy)
    mj = MujocoG1(pd, collisions="none", floor=False)
    ts = TrainingSimG1(pd)
    start = initial_state(clip, mj.model, np.random.default_rng(4), 1.0, ResetNoise())
    steps = 50
    for source in (PolicyActions(policy), ReferencePD()):
        a = run_episode(mj, source, clip, start, steps, stop_on_fall=False)
        b = run_episode(ts, source, clip, start, steps, stop_on_fall=False)
        assert a.qpos[0, 2] - a.qpos[-1, 2] > 4.0  # it fell freely: the comparison is not trivial
        np.testing.assert_allclose(a.qpos, b.qpos, rtol=0, atol=1e-9)
        np.testing.assert_allclose(a.points, b.points, rtol=0, atol=1e-9)
    assert np.abs(a.targets - a.targets[0]).max() > 0.1  # the reference-PD targets move
    # a 10 % gain difference is far outside that tolerance
    stiffer = MujocoG1(dataclasses.replace(pd, kp=pd.kp * 1.1), collisions="none", floor=False)
    c = run_episode(stiffer, ReferencePD(), clip, start, steps, stop_on_fall=False)
    assert np.abs(c.qpos - b.qpos).max() > 1e-4


def test_motor_actuators_equal_applied_torques(hold_path, clip):
    pd = PDParams.from_policy(load_policy(hold_path))
    start = initial_state(clip, g1.load_model(), np.random.default_rng(1), 1.0, ResetNoise())
    a = run_episode(MujocoG1(pd, actuation="qfrc"), ReferencePD(), clip, start, 15)
    b = run_episode(MujocoG1(pd, actuation="motor"), ReferencePD(), clip, start, 15)
    np.testing.assert_allclose(a.qpos, b.qpos, rtol=0, atol=1e-10)
    assert a.foot_depth.shape == (15 * g1.SUBSTEPS,)


def test_armature_is_the_g1_modules():
    model = MujocoG1(PDParams.from_g1()).model
    np.testing.assert_array_equal(model.dof_armature[g1.joint_dof_adr(model)], g1.ARMATURE)


def test_gains_come_from_the_policy(hold_path, clip):
    """The runner uses the policy's gains: the hold policy stands for 0.6 s from the default pose, the
    same file with kp = kd = 0 (motors unpowered) collapses and the detector ends the episode."""
    policy = load_policy(hold_path)
    powered = MujocoG1(PDParams.from_policy(policy))
    ep = run_episode(powered, PolicyActions(policy), clip, default_start(powered.model), 30)
    assert not ep.fell and ep.root_height.min() > 0.7
    unpowered = dataclasses.replace(policy, kp=policy.kp * 0.0, kd=policy.kd * 0.0)
    backend = MujocoG1(PDParams.from_policy(unpowered))
    ep = run_episode(backend, PolicyActions(unpowered), clip, default_start(backend.model), 100)
    assert ep.fell and ep.fall_time < 1.0
    assert ep.root_height[-1] < g1.FALL_HEIGHT <= ep.root_height[:-1].min()  # stopped at the first crossing
    assert len(ep.times) == round(ep.fall_time / g1.CONTROL_DT)


def test_policy_file_with_other_gains_is_refused(hold_path, tmp_path, capsys):
    bad = tmp_path / "kp.h5"
    bad.write_bytes(hold_path.read_bytes())
    with h5py.File(bad, "r+") as f:
        f["robot/kp"][3] *= 2.0
    assert cli.main([str(bad), "--runs", "1", "--seconds", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "robot/kp" in err and g1.JOINT_NAMES[3] in err and "Traceback" not in err


def test_reset_noise_read_from_the_training_config():
    env = {"reset_noise": True, "reset_root_xy": 0.1, "reset_root_z": 0.2, "reset_root_roll_pitch": 0.3}
    env |= {"reset_root_yaw": 0.4, "reset_joint_pos": 0.5}
    assert ResetNoise.of_training({"env": env}) == ResetNoise(0.1, 0.2, 0.3, 0.4, 0.5)
    assert ResetNoise.of_training({"env": env | {"reset_noise": False}}) == ResetNoise.none()


def test_initial_state_is_the_reference_plus_bounded_noise(clip):
    model = g1.load_model()
    t0, qpos, qvel = initial_state(clip, model, np.random.default_rng(0), 2.0, ResetNoise())
    ref = clip.sample(np.array([t0]))
    assert 0.0 <= t0 <= clip.duration - 2.0
    ref_qpos = clip.qpos(ref)[0]
    assert np.abs(qpos[:2] - ref_qpos[:2]).max() <= 0.05 and abs(qpos[2] - ref_qpos[2]) <= 0.01
    adr = g1.joint_qpos_adr(model)
    assert 0 < np.abs(qpos[adr] - ref_qpos[adr]).max() <= 0.1 + 1e-12
    np.testing.assert_allclose(qvel, clip.qvel(ref)[0])
    _, same, _ = initial_state(clip, model, np.random.default_rng(0), 2.0, ResetNoise.none())
    np.testing.assert_allclose(same, ref_qpos)


def test_initial_state_at_a_given_start_time_keeps_the_seed_s_noise(clip):
    model = g1.load_model()
    t_rand, q_rand, _ = initial_state(clip, model, np.random.default_rng(3), 2.0, ResetNoise())
    t0, qpos, qvel = initial_state(clip, model, np.random.default_rng(3), 2.0, ResetNoise(), start_time=5.5)
    assert t0 == 5.5 and t_rand != 5.5
    ref = clip.sample(np.array([5.5]))
    np.testing.assert_allclose(qvel, clip.qvel(ref)[0])
    ref_rand = clip.qpos(clip.sample(np.array([t_rand])))[0]
    adr = g1.joint_qpos_adr(model)
    # the same noise draws on another phase (away from the joint limits' clipping)
    np.testing.assert_allclose(qpos[:3] - clip.qpos(ref)[0][:3], q_rand[:3] - ref_rand[:3])
    assert np.abs(qpos[adr] - clip.qpos(ref)[0][adr]).max() <= 0.1 + 1e-12
    for bad in (-0.1, clip.duration - 1.0, float("nan")):
        with pytest.raises(cli.EvaluationError, match="leaves no room"):
            initial_state(clip, model, np.random.default_rng(3), 2.0, ResetNoise(), start_time=bad)


def test_standing_start_is_the_default_pose_at_the_reference_s_place_and_heading(clip):
    """--start standing: the robot as A finds it, still in the default pose, on the ground under the
    reference's root and facing its heading; the reset noise draws are the reference start's."""
    model = g1.load_model()
    t0, qpos, qvel = initial_state(clip, model, np.random.default_rng(2), 2.0, ResetNoise.none(), 0.0, True)
    ref = clip.qpos(clip.sample(np.array([0.0])))[0]
    assert t0 == 0.0 and not np.any(qvel)
    np.testing.assert_allclose(qpos[g1.joint_qpos_adr(model)], g1.DEFAULT_JOINT_POS)
    np.testing.assert_allclose(qpos[:2], ref[:2])
    assert qpos[2] == g1.DEFAULT_ROOT_POS[2]
    assert abs(metrics.heading_errors(qpos[None, 3:7], ref[None, 3:7])[0]) < 1e-9
    assert abs(metrics.heading_errors(g1.DEFAULT_ROOT_QUAT[None], ref[None, 3:7])[0]) > 1.0  # a real turn
    np.testing.assert_allclose(np.linalg.norm(qpos[3:7]), 1.0)
    _, noisy, _ = initial_state(clip, model, np.random.default_rng(2), 2.0, ResetNoise(), 0.0, True)
    _, noisy_ref, _ = initial_state(clip, model, np.random.default_rng(2), 2.0, ResetNoise(), 0.0)
    np.testing.assert_allclose(noisy[:3] - qpos[:3], noisy_ref[:3] - ref[:3], atol=1e-12)


def test_a_lead_out_lets_episodes_run_past_the_clip_on_its_last_frame(hold_path, clip):
    """A policy trained with env.clip_end_hold is played past the clip's end, the reference held
    still on its last frame; without a lead-out an episode must end inside the clip."""
    model = g1.load_model()
    seconds = clip.duration + 1.0
    with pytest.raises(cli.EvaluationError, match="do not fit"):
        initial_state(clip, model, np.random.default_rng(0), seconds, ResetNoise())
    t0, _, _ = initial_state(clip, model, np.random.default_rng(0), seconds, ResetNoise(), lead_out=2.0)
    assert 0.0 <= t0 <= 1.0
    with pytest.raises(cli.EvaluationError, match="2 s lead-out"):
        initial_state(clip, model, np.random.default_rng(0), seconds, ResetNoise(), 1.5, lead_out=2.0)
    policy = load_policy(hold_path)
    backend = MujocoG1(PDParams.from_policy(policy))
    rng, near_end = np.random.default_rng(0), clip.duration - 0.1
    start = initial_state(clip, backend.model, rng, 0.4, ResetNoise.none(), near_end, lead_out=2.0)
    episode = run_episode(backend, PolicyActions(policy), clip, start, 20, still_after_end=True)
    last = clip.qpos(clip.sample(np.array([clip.duration])))[0]
    assert len(episode.times) == 20 and episode.times[-1] > clip.duration + 0.2
    past = episode.times > clip.duration + 1e-9
    np.testing.assert_array_equal(episode.ref_qpos[1:][past], np.tile(last, (past.sum(), 1)))
    assert cli.training_lead_out({"env": {"clip_end_hold": 2.0}}) == 2.0
    assert cli.training_lead_out({"env": {}}) == 0.0 and cli.training_lead_out(None) == 0.0
    with pytest.raises(cli.EvaluationError, match="clip_end_hold"):
        cli.training_lead_out({"env": {"clip_end_hold": -1}})
    assert cli.training_lead_in({"env": {"clip_lead_in": 1.0}}) == 1.0
    assert cli.training_lead_in({"env": {}}) == 0.0 and cli.training_lead_in(None) == 0.0
    with pytest.raises(cli.EvaluationError, match="clip_lead_in"):
        cli.training_lead_in({"env": {"clip_lead_in": "1"}})


class _Constant:
    name = "constant targets"

    def __init__(self, target):
        self.target = target

    def targets(self, obs, refs):
        return self.target


def test_policy_blend_ramps_the_targets_from_the_default_pose(hold_path, clip):
    """The first control steps' targets lie between the default pose and the source's, weighted by
    the blend's progress at each step's midpoint, as bcg.robot.run blends after A."""
    backend = MujocoG1(PDParams.from_policy(load_policy(hold_path)))
    model = backend.model
    wanted = g1.DEFAULT_JOINT_POS + 0.05
    blended = run_episode(backend, _Constant(wanted), clip, default_start(model), 20, policy_blend=0.3)
    weights = np.minimum(1.0, (np.arange(20) + 0.5) * g1.CONTROL_DT / 0.3)
    np.testing.assert_allclose(blended.targets, g1.DEFAULT_JOINT_POS + weights[:, None] * 0.05, atol=1e-12)
    plain = run_episode(backend, _Constant(wanted), clip, default_start(model), 3)
    np.testing.assert_allclose(plain.targets, np.tile(wanted, (3, 1)))
    with pytest.raises(cli.EvaluationError, match="policy-blend"):
        cli.EvalConfig(policy_blend=3.0)


# ---------------------------------------------------------------------------------------------------
# Command line


def test_reference_pd_on_run(tmp_path, capsys):
    """Reference-tracking PD on Run, 3 runs of 2 s: a finite E_track in a plausible range. Starting on
    the reference without noise, the first step's error is below 1 cm (the points line up by name)."""
    out = tmp_path / "r.json"
    args = ["--reference-pd", "--motion", "run", "--runs", "3", "--seconds", "2", "--training-sim", "off"]
    assert cli.main(args + ["--json", str(out), "--plot", str(tmp_path / "r.png")]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["runs"] == 3 and len(result["runs"]) == 3
    assert 1.0 < summary["e_track_cm"]["mean"] < 100.0
    assert summary["e_track_root_cm"]["mean"] < summary["e_track_cm"]["mean"]
    assert np.isfinite(summary["penetration_mujoco_mm"]["mean"])
    assert 0.0 <= summary["effort_at_limit_share"]["mean"] <= 1.0
    assert 0.0 < summary["effort_peak_ratio"]["mean"] < np.inf
    assert 0.0 < summary["heading_error_max_deg"]["mean"] <= 180.0
    assert (tmp_path / "r.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "E_track global" in printed and "joint at its effort limit [%]" in printed

    clip = MotionClip.load("run")
    backend = MujocoG1(PDParams.from_g1())
    start = initial_state(clip, backend.model, np.random.default_rng(0), 1.0, ResetNoise.none())
    ep = run_episode(backend, ReferencePD(), clip, start, 1)
    assert metrics.tracking_errors(ep.points, ep.ref_points)[0] < 1.0


def test_a_lead_in_policy_is_evaluated_on_its_lead_in(tmp_path, capsys):
    """sim2sim plays the clip with the lead-in of the policy's training: the run may last the
    lead-in's extra L / 2 (15.3 s of Run's 14.97 s clip with L = 1 s), which the plain clip refuses."""
    lead = make_hold_policy(tmp_path / "lead.h5", motion="run", env={"clip_lead_in": 1.0})
    plain = make_hold_policy(tmp_path / "plain.h5", motion="run")
    args = ["--start-time", "15.2", "--seconds", "0.1", "--runs", "1", "--training-sim", "off"]
    assert cli.main([str(lead), *args]) == 0
    assert "a 1 s lead-in from rest (the training's)" in capsys.readouterr().out
    assert cli.main([str(plain), *args]) == 2
    assert "leaves no room" in capsys.readouterr().err


def test_hold_default_tips_over_the_same_way_in_both_simulators(tmp_path):
    """The default pose held open loop from standing: the passive robot falls in MuJoCo and in the
    training simulator, within a tenth of a second of each other (1.36 and 1.34 s when written)."""
    out = tmp_path / "h.json"
    args = ["--hold-default", "--start", "standing", "--runs", "1", "--seconds", "3", "--no-reset-noise"]
    assert cli.main(args + ["--json", str(out)]) == 0
    r = json.loads(out.read_text())["runs"][0]
    assert r["fell"] and r["training_fell"]
    assert 0.5 < r["fall_time"] < 3.0
    assert abs(r["training_fall_time"] - r["fall_time"]) <= 0.1


def test_two_action_sources_are_a_usage_error(capsys):
    assert cli.main(["--hold-default", "--reference-pd", "--runs", "1"]) == 2
    assert "give one" in capsys.readouterr().err


def test_effort_demand_is_the_pd_torque_before_the_clip_over_the_limit():
    pd = PDParams.from_g1()
    rng = np.random.default_rng(0)
    target, q, qd = rng.normal(0, 0.3, (3, g1.NUM_JOINTS))
    tau, demand = pd.torque_and_demand(target, q, qd)
    raw = pd.kp * (target - q) - pd.kd * qd
    np.testing.assert_allclose(demand, np.abs(raw) / pd.effort_limit)
    np.testing.assert_allclose(tau, np.clip(raw, -pd.effort_limit, pd.effort_limit))
    assert np.array_equal(demand > 1.0, np.abs(tau) < np.abs(raw)) and np.any(demand > 1.0)
    # an episode records every physics step's demand; with limits 1000x lower every step is at one
    clip = MotionClip.load("run")
    weak = dataclasses.replace(pd, effort_limit=pd.effort_limit * 1e-3)
    for params, at_limit in ((pd, None), (weak, 1.0)):
        backend = MujocoG1(params)
        start = initial_state(clip, backend.model, np.random.default_rng(0), 1.0, ResetNoise())
        ep = run_episode(backend, ReferencePD(), clip, start, 3)
        assert ep.effort_demand.shape == (3 * g1.SUBSTEPS, g1.NUM_JOINTS)
        share, peak = cli._effort(ep.effort_demand)
        if at_limit is not None:
            assert share == at_limit and peak > 1.0
        else:
            assert 0.0 <= share < 1.0 and 0.0 < peak


def test_unpowered_robot_falls_every_run(tmp_path, capsys):
    """Without PD the robot collapses in both simulators; the report gives the training simulator's
    falls and fall times beside MuJoCo's, from the same starts."""
    out = tmp_path / "u.json"
    args = ["--reference-pd", "--runs", "2", "--seconds", "1.5", "--kp-scale", "0", "--kd-scale", "0"]
    assert cli.main(args + ["--json", str(out)]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["falls"] == 2 and summary["training_falls"] == 2
    for r in result["runs"]:
        assert r["fell"] and r["fall_time"] < 1.0
        assert r["training_fell"] and r["training_fall_time"] < 1.0
        # the same collapse from the same start: the two simulators' fall times agree closely
        assert abs(r["training_fall_time"] - r["fall_time"]) <= 0.1
        assert r["training_steps"] == round(r["training_fall_time"] / g1.CONTROL_DT)
        # the collapse brings a knee down onto the floor before the pelvis is below the fall height
        floor = [c for c in r["other_contacts"] if c["bodies"][0] == "floor"]
        assert any(c["bodies"][1].endswith("knee_link") for c in floor)
        feet = {body for body, _ in g1.FOOT_SPHERES}
        assert not any(c["bodies"][1] in feet for c in floor)  # feet on the floor are not listed
        assert all(0.0 <= c["first_s"] <= r["fall_time"] and c["steps"] >= 1 for c in r["other_contacts"])
    assert summary["other_contacts_runs"]["floor/left_knee_link"] >= 1
    survival = [r["steps"] * g1.CONTROL_DT for r in result["runs"]]
    assert summary["survival_mujoco_s"]["mean"] == pytest.approx(np.mean(survival))
    for key, fall in (
        ("fall_clip_times_s", "fall_time"),
        ("training_fall_clip_times_s", "training_fall_time"),
    ):
        expected = sorted(r["start_time"] + r[fall] for r in result["runs"])
        assert summary[key] == pytest.approx(expected)
    text = capsys.readouterr().out
    shown = ", ".join(f"{t:.2f}" for t in summary["fall_clip_times_s"])
    assert f"clip times of the falls, MuJoCo [s]: {shown}" in text
    assert "falls in the training sim (same starts): 2/2" in text
    assert "time to fall or end, training sim [s]" in text
    assert "contacts other than feet on the floor: floor/" in text


def test_standing_start_from_the_command_line(hold_path, tmp_path, capsys):
    """--start standing plays from the default pose at clip time 0 in both simulators, says so in the
    header and stores it with the results; the hold policy keeps the standing robot up for 0.5 s."""
    out = tmp_path / "s.json"
    args = [str(hold_path), "--start", "standing", "--runs", "2", "--seconds", "0.5", "--json", str(out)]
    args += ["--policy-blend", "0.5"]
    assert cli.main(args) == 0
    result = json.loads(out.read_text())
    assert result["config"]["start"] == "standing" and result["config"]["policy_blend"] == 0.5
    assert [r["start_time"] for r in result["runs"]] == [0.0, 0.0]
    assert result["summary"]["falls"] == 0 and result["summary"]["training_falls"] == 0
    assert "standing start (targets blended over 0.5 s)" in capsys.readouterr().out


@pytest.mark.parametrize("collisions", ["all", "feet"])
def test_standing_robot_touches_the_floor_with_its_feet_only(hold_path, clip, collisions):
    """Standing in the default pose, only the feet touch the floor, and the contact log (which leaves
    feet on the floor out) lists no floor contact. With every primitive on it may list the hands
    brushing the hips (the default pose holds them there); with the feet alone it is empty."""
    policy = load_policy(hold_path)
    mj = MujocoG1(PDParams.from_policy(policy), collisions=collisions)
    episode = run_episode(mj, PolicyActions(policy), clip, default_start(mj.model), 10)
    assert not episode.fell
    assert not any("floor" in c.bodies for c in episode.other_contacts)
    if collisions == "feet":
        assert episode.other_contacts == ()
    # a knee put on the floor is listed
    start = default_start(mj.model)
    knee = mj.model.body("left_knee_link").id
    mj.reset(start[1], start[2])
    start[1][2] -= float(mj.data.xpos[knee, 2]) - 0.02  # lower the robot until the knee is below z = 0.02
    knee_down = run_episode(mj, PolicyActions(policy), clip, start, 1)
    if collisions == "all":
        assert any(c.bodies == ("floor", "left_knee_link") for c in knee_down.other_contacts)
    else:
        assert knee_down.other_contacts == ()


@pytest.mark.parametrize(
    "case, message",
    [
        ("garbage", "not a readable HDF5 policy file"),
        ("missing", "no such policy file"),
        ("joint_order", "joint names order differs"),
        ("motion", "nosuchmotion"),
        ("no_policy", "give a policy file"),
        ("too_long", "do not fit"),
        ("video_size", "--video-size"),
        ("seconds_nan", "--seconds"),
        ("kappa", "--kappa must be positive"),
        ("depth_correction", "--depth-correction must be in [0, 1)"),
        ("json_folder", "--json"),
        ("plot_folder", "--plot"),
    ],
)
def test_bad_input_exits_2_without_traceback(case, message, hold_path, tmp_path, capsys):
    path = tmp_path / "p.h5"
    path.write_bytes(hold_path.read_bytes())
    args = [str(path), "--runs", "1", "--seconds", "0.1", "--training-sim", "off"]
    if case == "garbage":
        path.write_bytes(b"not hdf5 at all")
    elif case == "missing":
        args[0] = str(tmp_path / "none.h5")
    elif case == "joint_order":
        with h5py.File(path, "r+") as f:
            names = list(f["robot/joint_names"].asstr()[()])
            names[0], names[1] = names[1], names[0]
            del f["robot/joint_names"]
            f.create_dataset("robot/joint_names", data=names, dtype=h5py.string_dtype())
    elif case == "motion":
        args += ["--motion", "nosuchmotion"]
    elif case == "no_policy":
        args = args[1:]
    elif case == "too_long":
        args += ["--seconds", "100"]
    elif case == "seconds_nan":
        args += ["--seconds", "nan"]
    elif case == "kappa":
        args += ["--kappa", "-3"]
    elif case == "depth_correction":
        args += ["--depth-correction", "1.5"]
    elif case == "video_size":
        args += ["--video", str(tmp_path / "v.mp4"), "--video-size", "161x120"]
    elif case in ("json_folder", "plot_folder"):
        args += [message, str(tmp_path / "missing" / "out")]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error:") and message in err and "Traceback" not in err
    if case.endswith("_folder"):
        assert "runs of" not in out  # refused before any episode ran
    assert not (tmp_path / "v.mp4").exists()


def test_video_is_a_valid_mp4_with_one_frame_per_step(tmp_path):
    from bcg.validate.render import RenderError, find_ffmpeg

    try:
        find_ffmpeg()
    except RenderError as exc:
        pytest.skip(f"{exc}")
    import imageio_ffmpeg

    video, out = tmp_path / "v.mp4", tmp_path / "v.json"
    cmd = [sys.executable, "-m", "bcg.validate.sim2sim", "--reference-pd", "--runs", "1", "--seconds", "0.1"]
    cmd += ["--training-sim", "off", "--video", str(video), "--video-size", "160x120", "--video-stride", "1"]
    proc = subprocess.run(cmd + ["--json", str(out)], capture_output=True, text=True, timeout=300)
    if proc.returncode == 2 and "no offscreen OpenGL context" in proc.stderr:
        pytest.skip(f"{proc.stderr.strip()} (run .ci/install-render.sh)")
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(out.read_text())["runs"][0]["steps"]
    header = video.read_bytes()[:12]
    assert header[4:8] == b"ftyp"  # an ISO base media (MP4) file
    frames, seconds = imageio_ffmpeg.count_frames_and_secs(str(video))
    assert frames == steps + 1  # the start state and one frame per control step
    assert seconds == pytest.approx((steps + 1) * g1.CONTROL_DT, abs=0.05)
    gen = imageio_ffmpeg.read_frames(str(video))
    meta = next(gen)
    assert tuple(meta["size"]) == (160, 120)
    first = np.frombuffer(next(gen), np.uint8)
    assert first.std() > 5  # not a blank frame
    gen.close()


# ---------------------------------------------------------------------------------------------------
# Sweep


def test_sweep_writes_both_tables(tmp_path):
    make_hold_policy(tmp_path / "run300.h5", motion="run", kappa=300.0)
    make_hold_policy(tmp_path / "jump50.h5", motion="jump", kappa=50.0)
    make_hold_policy(tmp_path / "again.h5", motion="run", kappa=300.0)
    make_hold_policy(tmp_path / "dance100.h5", motion="dance", motion_hash="0" * 64, kappa=100.0)
    (tmp_path / "broken.h5").write_bytes(b"x")
    out = tmp_path / "tables.md"
    argv = [str(tmp_path), "--runs", "1", "--seconds", "0.2", "--training-sim", "off", "--out", str(out)]
    assert sweep_cli.main(argv) == 0
    text = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    by_key = {(p["kappa"], p["motion"]): p["summary"] for p in data["policies"]}
    assert set(by_key) == {(300.0, "run"), (50.0, "jump"), (100.0, "dance")}
    run300 = by_key[(300.0, "run")]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    assert f"{run300['falls']}/1 (0/5)" in rows["300"] and "(3.1)" in rows["300"]
    assert f"{by_key[(50.0, 'jump')]['falls']}/1 (5/5)" in rows["50"]
    assert f"{run300['e_track_cm']['mean']:.1f} ± {run300['e_track_cm']['std']:.1f}" in rows["Run"]
    assert "34.1 ± 0.4" in rows["Run"] and "42.8 ± 0.7" in rows["Run"]
    path = run300["path_ratio"]
    assert 0 <= path["mean"] < 5 and f"| {path['mean']:.2f} ± {path['std']:.2f} |" in rows["Run"]
    assert "– | – | 18.6 ± 0.4" in rows["Jump"]  # no stiff Jump policy
    assert "again.h5" in text and "broken.h5" in text  # skipped files are listed
    assert "dance100.h5: dance.h5 differs from the clip it was trained on" in text
    assert sweep_cli.main([str(tmp_path / "nothing")]) == 2


def test_training_replay_takes_the_policys_contact_margin():
    assert cli.training_margin(None) is None
    assert cli.training_margin({"env": {"kappa": 300.0}}) is None  # stored before the field existed
    assert cli.training_margin({"env": {"contact_margin": None}}) is None
    assert cli.training_margin({"env": {"contact_margin": 0}}) == 0.0
    assert cli.training_contact(300.0, 0.0).margin == 0.0
    assert cli.training_contact(300.0).margin == pytest.approx(4.6 / 300.0)


def test_training_replay_takes_the_policys_contact_depth_correction():
    assert cli.training_depth_correction(None) == 0.0
    assert cli.training_depth_correction({"env": {"kappa": 300.0}}) == 0.0  # stored before the field
    assert cli.training_depth_correction({"env": {"contact_depth_correction": 0.2}}) == 0.2
    for bad in (1.5, -0.1, "0.2", True):
        with pytest.raises(cli.EvaluationError, match="contact_depth_correction"):
            cli.training_depth_correction({"env": {"contact_depth_correction": bad}})
    assert cli.training_contact(300.0, None, 0.2).depth_correction == 0.2
    assert cli.training_contact(300.0).depth_correction == 0.0


@pytest.mark.slow
def test_training_sim_penetration_grows_as_contact_softens(ti64, hold_path, clip):
    """Standing in the default pose, the training simulator's feet sink deeper at kappa = 50 than at
    kappa = 300, and both deeper than in MuJoCo (whose contact solver keeps them within a millimetre);
    the command line's Δd is the training replay's mean penetration minus MuJoCo's, run by run."""
    policy = load_policy(hold_path)
    pd = PDParams.from_policy(policy)
    mj = MujocoG1(pd)
    start = default_start(mj.model)
    hold = PolicyActions(policy)
    mujoco_depth = metrics.penetration_stats(run_episode(mj, hold, clip, start, 25).foot_depth)
    depth = {}
    for kappa in (50.0, 300.0):
        training = TrainingSimG1(pd, contact=cli.training_contact(kappa))
        episode = run_episode(training, hold, clip, start, 25)
        depth[kappa] = metrics.penetration_stats(episode.foot_depth).mean_mm
    assert mujoco_depth.max_mm < 1.0
    assert depth[50.0] > depth[300.0] > mujoco_depth.mean_mm
    results, _, note = cli.evaluate(
        ReferencePD(), pd, clip, cli.EvalConfig(runs=2, seconds=0.3), ResetNoise(), 300.0, progress=None
    )
    assert note.startswith("bcg.sim with contact")
    for r in results:
        assert r.delta_d_mm == pytest.approx(r.penetration_training.mean_mm - r.penetration_mujoco.mean_mm)


@pytest.mark.parametrize("lead_out", [0.0, 1.0])
def test_too_long_an_episode_is_refused_with_a_length_that_fits(clip, lead_out):
    model, none = g1.load_model(), ResetNoise.none()

    def start(seconds):
        return initial_state(clip, model, np.random.default_rng(0), seconds, none, lead_out=lead_out)

    with pytest.raises(cli.EvaluationError, match="use at most") as info:
        start(clip.duration + 2.0)
    longest = float(re.search(r"use at most ([0-9.]+) s", str(info.value)).group(1))
    start(longest)  # the length suggested fits
    with pytest.raises(cli.EvaluationError):
        start(longest + 0.01)
