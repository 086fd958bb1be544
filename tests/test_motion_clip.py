"""Sampling a clip, the content checks, and the clips shipped in motions/."""

import dataclasses
import os
import re
from pathlib import Path

import h5py
import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.core.rotations import quat_exp, quat_multiply, quat_normalize
from bcg.motion import MOTIONS_DIR, MotionClip, check, importer, io, kinematics, lafan, select, synthetic
from bcg.motion.__main__ import main

# The source CSVs (the G1 folder of the public LAFAN1_Retargeting_Dataset) are not shipped; point
# BCG_LAFAN1_DIR at them to check that the shipped clips are their frames, bit for bit.
SOURCE_CSV = Path(os.environ["BCG_LAFAN1_DIR"]) if os.environ.get("BCG_LAFAN1_DIR") else None
SHIPPED = {"run": "run1_subject2.csv", "jump": "jumps1_subject1.csv", "fight": "fight1_subject2.csv",
           "dance": "dance1_subject1.csv"}  # fmt: skip


@pytest.fixture(scope="module")
def model():
    return g1.load_model(collisions="none", floor=False)


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory, model):
    folder = tmp_path_factory.mktemp("clip")
    synthetic.write_synthetic_csv(folder / "s.csv", 50, g1.joint_limits(model))
    importer.import_csv(folder / "s.csv", folder / "s.h5", model=model)
    return folder / "s.h5"


@pytest.fixture(scope="module")
def clip(clip_path, model):
    return MotionClip.load(clip_path, model)


def _fields(state):
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def test_frame_times_return_the_frames_exactly(clip):
    times = np.arange(clip.num_frames) / clip.fps
    sampled = _fields(clip.sample(times))
    for name, value in _fields(clip.frames).items():
        assert np.array_equal(sampled[name], value), name


def test_midpoints(clip):
    times = (np.arange(clip.num_frames - 1) + 0.5) / clip.fps
    mid = clip.sample(times)
    f = clip.frames
    np.testing.assert_allclose(mid.joint_pos, 0.5 * (f.joint_pos[:-1] + f.joint_pos[1:]), atol=1e-15)
    np.testing.assert_allclose(
        mid.body_lin_vel_w, 0.5 * (f.body_lin_vel_w[:-1] + f.body_lin_vel_w[1:]), atol=1e-14
    )
    np.testing.assert_allclose(np.linalg.norm(mid.root_quat, axis=-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(mid.body_quat, axis=-1), 1.0, atol=1e-15)
    # the root turns at a constant rate: the slerp midpoint is the analytic orientation half a frame on
    motion = synthetic.SyntheticMotion()
    expected = quat_multiply(
        quat_exp(np.outer(times, motion.root_ang_vel_w)), quat_normalize(motion.root_quat0)
    )
    np.testing.assert_allclose(np.abs(np.sum(mid.root_quat * expected, axis=-1)), 1.0, atol=1e-12)


def test_batched_sampling_clamps_and_futures(clip):
    times = np.array([[-1.0, 0.0, 0.3], [0.7, clip.duration, 99.0]])
    state = clip.sample(times)
    assert state.body_pos.shape == (2, 3, len(clip.body_names), 3)
    assert state.key_body_pos.shape == (2, 3, 5, 3)
    assert np.array_equal(state.joint_pos[0, 0], clip.frames.joint_pos[0])
    assert np.array_equal(state.joint_pos[1, 2], clip.frames.joint_pos[-1])
    assert np.array_equal(state.root_quat[1, 2], clip.frames.root_quat[-1])
    future = clip.sample_future(times, steps=(1, 2, 3), dt=g1.CONTROL_DT)
    assert future.joint_pos.shape == (2, 3, 3, 29)
    direct = clip.sample(times[1, 0] + 2 * g1.CONTROL_DT)
    assert np.array_equal(future.body_quat[1, 0, 1], direct.body_quat)
    start = clip.random_phase(np.random.default_rng(0), 1000)
    assert start.shape == (1000,)
    assert start.min() >= 0.0 and start.max() <= clip.duration - 3 * g1.CONTROL_DT
    assert start.max() > clip.duration - 0.2  # the whole range is used


def test_still_after_end_holds_the_last_frame_with_no_velocity(clip):
    """The lead-out's reference: past the last frame, its pose with every velocity 0; up to the last
    frame (and without the flag), the clip as stored."""
    times = np.array([clip.duration - 0.5, clip.duration, clip.duration + 0.01, clip.duration + 3.0])
    held = clip.sample(times, still_after_end=True)
    plain = clip.sample(times)
    for name in ("root_pos", "root_quat", "joint_pos", "body_pos", "body_quat", "key_body_pos"):
        np.testing.assert_array_equal(getattr(held, name), getattr(plain, name))
    for name in ("root_lin_vel_w", "root_ang_vel_w", "root_ang_vel_b", "joint_vel", "body_lin_vel_w"):
        np.testing.assert_array_equal(getattr(held, name)[:2], getattr(plain, name)[:2])
        assert not np.any(getattr(held, name)[2:]) and np.any(getattr(plain, name)[2:])
    future = clip.sample_future(np.array([clip.duration - 0.02]), still_after_end=True)
    assert np.any(future.joint_vel[0, 0]) and not np.any(future.joint_vel[0, 1:])


def test_a_lead_in_starts_at_rest_and_speeds_up_into_the_clip():
    """with_lead_in: the first frame is the clip's, still; the stored velocities follow the warped
    positions (central differences; the unscaled ones would not); after the lead-in the clip's own
    frames, bit for bit, L / 2 later; the content hash stays the source's."""
    clip = MotionClip.load("run")  # leaves at 2 m/s: a lead-in's case
    lead = clip.with_lead_in(1.0)
    half = round(1.0 * clip.fps / 2)
    assert lead.lead_in == pytest.approx(2 * half / clip.fps) and clip.lead_in == 0.0
    assert lead.duration == pytest.approx(clip.duration + lead.lead_in / 2)
    assert lead.content_hash == clip.content_hash and lead.num_frames == clip.num_frames + half
    fields = ("root_pos", "root_quat", "joint_pos", "body_pos", "body_quat", "key_body_pos")
    velocities = ("root_lin_vel_w", "root_ang_vel_w", "root_ang_vel_b", "joint_vel", "body_lin_vel_w")
    for name in fields + velocities:
        after, source = getattr(lead.frames, name)[2 * half :], getattr(clip.frames, name)[half:]
        np.testing.assert_array_equal(after, source)
    for name in fields:
        first, source = getattr(lead.frames, name)[0], getattr(clip.frames, name)[0]
        np.testing.assert_allclose(first, source, atol=1e-12)
    for name in velocities:
        assert not np.any(getattr(lead.frames, name)[0])
    # velocities against central differences of the positions over the lead-in: as consistent as
    # the clip's own frames are (whose stored velocities have the same check), and far more than
    # the clip's velocities without the rate
    k = np.arange(1, 2 * half)
    fd = (lead.frames.root_pos[k + 1] - lead.frames.root_pos[k - 1]) * clip.fps / 2
    err = np.abs(fd - lead.frames.root_lin_vel_w[k]).max()
    own = (clip.frames.root_pos[2:] - clip.frames.root_pos[:-2]) * clip.fps / 2
    own_err = np.abs(own - clip.frames.root_lin_vel_w[1:-1]).max()
    unscaled = clip.sample(np.arange(2 * half)[k] ** 2 / (clip.fps**2 * 2 * lead.lead_in)).root_lin_vel_w
    assert err <= max(1.5 * own_err, 0.05), (err, own_err)
    assert np.abs(fd - unscaled).max() > 5 * err
    speed = np.linalg.norm(lead.frames.root_lin_vel_w[: 2 * half + 1, :2], axis=1)
    # from rest, at half the clip's pace half-way (Run's first frame leaves at 2 m/s)
    assert speed[0] == 0.0 and speed[half] < 0.6 * np.linalg.norm(clip.frames.root_lin_vel_w[0, :2])
    assert clip.with_lead_in(0.0) is clip and clip.with_lead_in(0.01) is clip  # under a frame: none
    for bad in (-1.0, float("nan"), 2 * clip.duration + 1.0, 2 * clip.duration):
        with pytest.raises(ValueError, match="lead-in"):
            clip.with_lead_in(bad)
    longest = clip.with_lead_in(2 * clip.duration - 2 * clip.dt)  # plays all but the last frame
    assert longest.duration == pytest.approx(clip.duration + longest.lead_in / 2)
    f = lead.frames  # the lead-in's key points sit on its bodies, as the clip's do
    np.testing.assert_allclose(f.key_body_pos, clip._key_positions(f.body_pos, f.body_quat), atol=1e-12)
    with pytest.raises(ValueError, match="already"):
        lead.with_lead_in(1.0)


def test_qpos_qvel_follow_the_model(clip, model):
    state = clip.sample(np.array([0.1, 0.2]))
    qpos, qvel = clip.qpos(state), clip.qvel(state)
    assert qpos.shape == (2, model.nq) and qvel.shape == (2, model.nv)
    assert np.array_equal(qpos[:, g1.joint_qpos_adr(model)], state.joint_pos)
    assert np.array_equal(qvel[:, 3:6], state.root_ang_vel_b)
    np.testing.assert_allclose(np.linalg.norm(qpos[:, 3:7], axis=1), 1.0, atol=1e-15)


def test_check_reports_limits_and_refuses_foreign_kinematics(clip_path, tmp_path, model, capsys):
    assert main(["check", str(clip_path)]) == 0
    out = capsys.readouterr().out
    assert "joint limits  no violation" in out and out.rstrip().endswith("usable")
    over = tmp_path / "over.h5"
    over.write_bytes(clip_path.read_bytes())
    knee = g1.JOINT_NAMES.index("left_knee_joint")
    hi = g1.joint_limits(model)[knee, 1]
    with h5py.File(over, "r+") as f:
        f["joint_pos"][12, knee] = hi + 0.2  # body poses left as they were: kinematics disagree
    report = check.check_clip(MotionClip.load(over, model), model)
    found = {topic: (level, message) for level, topic, message in report.findings}
    assert found["joint limits"][0] == "warn"
    assert "worst 0.200 rad, left_knee_joint at frame 12" in found["joint limits"][1]
    assert found["kinematics"][0] == "fail" and not report.usable
    assert main(["check", str(over)]) == 2
    assert found["velocities"][0] == "fail"  # the edited frame's neighbours' velocities do not follow
    assert "not usable (kinematics, velocities failed)" in capsys.readouterr().err


def test_penetration_is_measured_against_the_foot_spheres(clip_path, tmp_path, model):
    sunk = tmp_path / "sunk.h5"
    sunk.write_bytes(clip_path.read_bytes())
    with h5py.File(sunk, "r+") as f:
        f["root_pos"][:, 2] -= 1.0  # every body 1 m down: body poses shift consistently
        f["body_pos"][:, :, 2] -= 1.0
    clip = MotionClip.load(sunk, model)
    findings = check.check_clip(clip, model).findings
    report = {topic: message for _, topic, message in findings}
    assert ("ok", "kinematics") in [(level, topic) for level, topic, _ in findings]
    assert "(50 of 50 frames)" in report["penetration"]
    data = mujoco.MjData(model)
    depth = []
    for qpos in clip.qpos(clip.frames):
        data.qpos[:] = qpos
        mujoco.mj_kinematics(model, data)
        z = [
            (data.xpos[model.body(b).id] + data.xmat[model.body(b).id].reshape(3, 3) @ o)[2]
            for b, o in g1.FOOT_SPHERES
        ]
        depth.append(g1.FOOT_SPHERE_RADIUS - min(z))
    assert f"max {1e3 * max(depth):.1f} mm" in report["penetration"]
    assert f"mean {1e3 * np.mean(depth):.1f} mm" in report["penetration"]


def _still_clip(folder, model, joint_pos, name, frames=10):
    """A clip that holds ``joint_pos`` (the synthetic motion with 10 mrad joint range)."""
    pose = np.asarray(joint_pos, dtype=float)
    limits = np.stack([pose - 0.01, pose + 0.01], axis=1)
    synthetic.write_synthetic_csv(folder / f"{name}.csv", frames, limits)
    importer.import_csv(folder / f"{name}.csv", folder / f"{name}.h5", model=model)
    return MotionClip.load(folder / f"{name}.h5", model)


def test_self_contact_is_reported_with_the_bodies_involved(tmp_path, model):
    found = lambda clip: {t: (lv, msg) for lv, t, msg in check.check_clip(clip, model).findings}  # noqa: E731
    standing = found(_still_clip(tmp_path, model, g1.DEFAULT_JOINT_POS, "default"))
    assert standing["self-contact"] == ("ok", "no overlapping collision primitives")
    arm_in = np.array(g1.DEFAULT_JOINT_POS, dtype=float)
    arm_in[g1.JOINT_NAMES.index("left_shoulder_roll_joint")] = -1.0  # the left arm swung into the torso
    level, message = found(_still_clip(tmp_path, model, arm_in, "arm_in"))["self-contact"]
    assert level == "warn"
    assert message.startswith("10 of 10 frames, deepest ")
    assert "torso_link/left_elbow_link 10" in message


@pytest.mark.parametrize("accel, level", [(-9.81, "ok"), (-2.0, "warn")])
def test_airborne_phases_are_measured_against_gravity(tmp_path, model, accel, level):
    """A pose (the synthetic root motion with still joints) lifted 10 cm and moved along a parabola:
    every frame is airborne, and the fitted centre-of-mass acceleration is the parabola's plus that of
    the synthetic root's bob (a floating one warns, a ballistic one does not)."""
    still = _still_clip(tmp_path, model, g1.DEFAULT_JOINT_POS, "still30", frames=30)
    lifted = tmp_path / f"lifted{-accel:g}.h5"
    lifted.write_bytes(still.path.read_bytes())
    t = np.arange(still.num_frames) * still.dt
    mid = t[-1] / 2
    height = 0.1 + 0.5 * accel * (t - mid) ** 2 - 0.5 * accel * mid**2  # 10 cm up at both ends
    rate = accel * (t - mid)
    with h5py.File(lifted, "r+") as f:
        f["root_pos"][:, 2] += height
        f["body_pos"][:, :, 2] += height[:, None]
        f["root_lin_vel_w"][:, 2] += rate
        f["body_lin_vel_w"][:, :, 2] += rate[:, None]
    clip = MotionClip.load(lifted, model)
    [(first, end, fitted)] = check.airborne_phases(clip, model)
    assert (first, end) == (0, clip.num_frames)
    bob = 2.0 * np.polyfit(t, check.centre_of_mass(still, model)[:, 2], 2)[0]
    assert abs(bob) < 0.5
    assert fitted == pytest.approx(accel + bob, abs=1e-9)
    findings = {topic: (lv, msg) for lv, topic, msg in check.check_clip(clip, model).findings}
    assert findings["velocities"][0] == "ok"
    assert findings["airborne"][0] == level
    assert f"{accel + bob:.1f} m/s^2 on average" in findings["airborne"][1]


@pytest.mark.parametrize(
    "fall, admissible",
    [
        (1.0, True),
        (select.MIN_FLIGHT_FALL + 0.05, True),
        (select.MIN_FLIGHT_FALL - 0.05, False),
        (0.02, False),
    ],
)
def test_a_floating_flight_makes_its_windows_inadmissible(tmp_path, model, fall, admissible):
    """Frames 15-24 of a still pose lifted 10 cm onto a parabola: a ballistic flight, or one just
    above the threshold, leaves every window admissible; one just below it, or falling at 0.02 g as
    a retargeted kick does, rules out each window that holds any of its frames and no other."""
    accel = -fall * select.GRAVITY
    still = _still_clip(tmp_path, model, g1.DEFAULT_JOINT_POS, "still40", frames=40)
    datasets, attrs = io.read_clip(still.path)
    upright = np.tile([1.0, 0.0, 0.0, 0.0], (40, 1))  # the synthetic root tilts: stand it on its feet
    body_pos, body_quat = kinematics.forward_kinematics(
        model, datasets["root_pos"], upright, datasets["joint_pos"]
    )
    spheres = kinematics.foot_sphere_positions(body_pos, body_quat, tuple(datasets["body_names"]))
    height = kinematics.foot_clearance(spheres).min(axis=1)  # lowest foot bottom on z = 0
    t = np.arange(10) / attrs["fps"]
    mid = t[-1] / 2
    height[15:25] -= 0.1 + 0.5 * accel * ((t - mid) ** 2 - mid**2)
    body_pos[..., 2] -= height[:, None]
    datasets.update(body_pos=body_pos, body_quat=body_quat, root_pos=body_pos[:, 0])
    scores = select.window_scores(datasets, "speed", 8, model, 1.0 / attrs["fps"])
    starts = np.arange(len(scores))
    touching = (starts + 8 > 15) & (starts < 25)
    assert np.all(np.isfinite(scores[~touching]))
    assert np.all(np.isfinite(scores[touching]) == admissible)


def test_centre_of_mass_from_body_poses_is_mujocos(model):
    """The vectorised centre of mass of stored body poses equals MuJoCo's subtree centre of mass."""
    clip = MotionClip.load("fight", model)
    f = clip.frames
    got = kinematics.centre_of_mass(model, f.body_pos[::15], f.body_quat[::15])
    np.testing.assert_allclose(got, check.centre_of_mass(clip, model)[::15], atol=1e-12)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_clip(name, model):
    clip = MotionClip.load(name, model)
    assert clip.path == MOTIONS_DIR / f"{name}.h5"
    assert clip.num_frames == 450 and clip.fps == 30.0
    assert clip.attrs["source_file"] == SHIPPED[name]
    assert check.check_clip(clip, model).usable
    readme = (MOTIONS_DIR / "README.md").read_text()
    start, end = clip.attrs["source_frame_start"], clip.attrs["source_frame_end"]
    assert re.search(rf"`{name}\.h5`.*\b{start}\b.*\b{end}\b", readme), "frame range missing from README"


def _source(name):
    """The shipped clip's source take; skips where BCG_LAFAN1_DIR does not point at the takes."""
    if SOURCE_CSV is None:
        pytest.skip(
            "BCG_LAFAN1_DIR is not set: the source CSVs of the shipped clips are not in the repository"
        )
    return lafan.read_csv(SOURCE_CSV / SHIPPED[name])


CRITERION = {"run": "speed", "jump": "flight", "fight": "joint-speed", "dance": "joint-speed"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_clip_is_the_best_admissible_window_of_its_take(name, model):
    """``select`` on the source take picks the shipped clip's frames again (README's commands)."""
    source = _source(name)
    clip = MotionClip.load(name, model)
    datasets = importer.derive(model, source.root_pos, source.root_quat, source.joint_pos, lafan.FPS)
    window = select.best_window(datasets, CRITERION[name], clip.num_frames, model, 1.0 / lafan.FPS)
    assert (window.start, window.end) == (clip.attrs["source_frame_start"], clip.attrs["source_frame_end"])


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_clip_holds_its_source_frames(name, model):
    source = _source(name)
    clip = MotionClip.load(name, model)
    start, end = clip.attrs["source_frame_start"], clip.attrs["source_frame_end"]
    assert source.sha256 == clip.attrs["source_sha256"]
    assert np.array_equal(clip.frames.joint_pos, source.joint_pos[start:end])
    assert np.array_equal(clip.frames.root_pos, source.root_pos[start:end])
    assert np.array_equal(clip.frames.root_quat, source.root_quat[start:end])
