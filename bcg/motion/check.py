"""Content checks of a motion clip: is it a usable reference for the G1?

:func:`check_clip` returns a :class:`Report`: a list of findings, each ``ok``, ``warn`` (the clip is
usable, the figure deserves a look) or ``fail`` (the clip is not usable). A clip fails when its
stored body poses disagree with the model's forward kinematics of its joint positions (made for
another model, or edited), when its stored velocities are not the finite differences of its
positions (inside the clip, where both neighbours of a frame are stored), when a quaternion is far
from unit norm, or when a frame-to-frame jump is physically impossible. Joint-limit violations, foot
penetration, foot skating, self-contact (two of the robot's collision primitives overlapping, e.g. a hand
inside a hip), velocities above the motor limits, spikes and airborne phases whose centre of mass does not
fall as gravity makes it (a kinematic retarget can float) are reported as warnings: retargeted human
motion holds some of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_conjugate, quat_log, quat_multiply, quat_normalize
from bcg.motion import kinematics, select, spikes
from bcg.motion.clip import MotionClip

FK_TOLERANCE = 1e-6  # m, stored body positions against MuJoCo's forward kinematics
QUAT_NORM_TOLERANCE = 1e-3  # |‖q‖ - 1| above this fails
MAX_ROOT_SPEED = 15.0  # m/s; a frame-to-frame root step faster than this is a discontinuity (fail)
MAX_ROOT_TURN_RATE = 50.0  # rad/s; likewise for the root orientation
CONTACT_CLEARANCE = 0.01  # m; a foot whose lowest sphere bottom is this low counts as on the ground
VELOCITY_TOLERANCE = 1e-4  # stored velocity against the finite difference, relative to max(1, |v|max)
GRAVITY = select.GRAVITY
MIN_AIRBORNE_FRAMES = select.MIN_AIRBORNE_FRAMES
FLOAT_TOLERANCE = 0.5  # an airborne centre of mass falling slower than this fraction of g floats (warn)


@dataclass
class Report:
    """Findings of :func:`check_clip`: (level, topic, message) with level ok / warn / fail."""

    findings: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, level: str, topic: str, message: str) -> None:
        self.findings.append((level, topic, message))

    @property
    def usable(self) -> bool:
        return all(level != "fail" for level, _, _ in self.findings)

    def lines(self) -> list[str]:
        width = max((len(t) for _, t, _ in self.findings), default=0)
        return [f"{level:4s}  {topic:{width}s}  {message}" for level, topic, message in self.findings]


def check_clip(
    clip: MotionClip, model: mujoco.MjModel, collision_model: mujoco.MjModel | None = None
) -> Report:
    """Run every check on a loaded clip (see the module docstring for what fails).

    ``collision_model`` is the model whose collision primitives the self-contact check tests, with
    the clip's joints (default: the shipped G1 with every primitive on and no floor; ``model`` is
    usually loaded without collisions)."""
    report = Report()
    frames = clip.frames
    _names(clip, report)
    _forward_kinematics(clip, model, report)
    _velocity_consistency(clip, report)
    _quaternions(frames, report)
    _joint_limits(clip, model, report)
    _feet(clip, report)
    _airborne(clip, model, report)
    _self_contact(clip, collision_model, report)
    _velocities(clip, report)
    _discontinuities(clip, report)
    return report


def _names(clip: MotionClip, report: Report) -> None:
    joints = "same order as the model" if clip.file_joint_order_matches else "reordered by name to the model"
    bodies = "same order as the model" if clip.file_body_order_matches else "reordered by name to the model"
    report.add("ok", "joints", f"{len(clip.joint_names)} joints, {joints}")
    report.add("ok", "bodies", f"{len(clip.body_names)} bodies, {bodies}")


def _velocity_consistency(clip: MotionClip, report: Report) -> None:
    """Interior frames: the stored velocities against the schema's central differences of the
    stored positions (the first and last frame may use source frames outside the clip)."""
    f, dt = clip.frames, clip.dt
    ang_w, ang_b = kinematics.angular_velocity(f.root_quat, dt)
    derived = {
        "joint_vel": kinematics.finite_difference(f.joint_pos, dt),
        "root_lin_vel_w": kinematics.finite_difference(f.root_pos, dt),
        "root_ang_vel_w": ang_w,
        "root_ang_vel_b": ang_b,
        "body_lin_vel_w": kinematics.finite_difference(f.body_pos, dt),
    }
    worst, where = 0.0, ""
    for name, value in derived.items():
        stored, value = getattr(f, name)[1:-1], value[1:-1]
        error = float(np.max(np.abs(stored - value), initial=0.0)) / max(
            1.0, float(np.max(np.abs(value), initial=0.0))
        )
        if error > worst:
            worst, where = error, name
    level = "fail" if worst > VELOCITY_TOLERANCE else "ok"
    detail = f" (worst: {where})" if worst > 0 else ""
    report.add(
        level, "velocities", f"stored vs finite differences of the positions: {worst:.1e} relative{detail}"
    )


def _forward_kinematics(clip: MotionClip, model: mujoco.MjModel, report: Report) -> None:
    f = clip.frames
    body_pos, body_quat = kinematics.forward_kinematics(model, f.root_pos, f.root_quat, f.joint_pos)
    pos_err = float(np.abs(body_pos - f.body_pos).max())
    relative = quat_multiply(quat_normalize(body_quat), quat_conjugate(quat_normalize(f.body_quat)))
    ang_err = float(np.linalg.norm(quat_log(relative), axis=-1).max())
    level = "ok" if pos_err <= FK_TOLERANCE and ang_err <= 1e-5 else "fail"
    report.add(level, "kinematics", f"stored body poses vs MuJoCo FK: {pos_err:.1e} m, {ang_err:.1e} rad")


def _quaternions(f, report: Report) -> None:
    root = float(np.abs(np.linalg.norm(f.root_quat, axis=-1) - 1.0).max())
    body = float(np.abs(np.linalg.norm(f.body_quat, axis=-1) - 1.0).max())
    level = "ok" if max(root, body) <= QUAT_NORM_TOLERANCE else "fail"
    report.add(level, "quaternions", f"max |norm - 1|: root {root:.1e}, bodies {body:.1e}")


def _joint_limits(clip: MotionClip, model: mujoco.MjModel, report: Report) -> None:
    limits = g1.joint_limits(model)
    q = clip.frames.joint_pos
    excess = np.maximum(limits[:, 0] - q, q - limits[:, 1])
    frames = int(np.any(excess > 0.0, axis=1).sum())
    if frames == 0:
        report.add("ok", "joint limits", "no violation")
        return
    t, j = np.unravel_index(np.argmax(excess), excess.shape)
    joints = int(np.any(excess > 0.0, axis=0).sum())
    report.add(
        "warn",
        "joint limits",
        f"{frames} frames outside the limits ({joints} joints); worst {excess[t, j]:.3f} rad, "
        f"{clip.joint_names[j]} at frame {t}",
    )


def _feet(clip: MotionClip, report: Report) -> None:
    f = clip.frames
    spheres = kinematics.foot_sphere_positions(f.body_pos, f.body_quat, clip.body_names)
    depth = np.maximum(0.0, g1.FOOT_SPHERE_RADIUS - spheres[..., 2]).max(axis=1) * 1e3  # mm (T,)
    level = "ok" if depth.max() < 10.0 else "warn"
    report.add(
        level,
        "penetration",
        f"foot spheres below z=0: mean {depth.mean():.1f} mm, p95 {np.percentile(depth, 95):.1f} mm, "
        f"max {depth.max():.1f} mm ({int((depth > 0).sum())} of {len(depth)} frames)",
    )
    clearance = kinematics.foot_clearance(spheres)  # (T, 2)
    bottom = spheres[..., 2] - g1.FOOT_SPHERE_RADIUS  # (T, 8)
    speed = np.linalg.norm(kinematics.finite_difference(spheres[..., :2], clip.dt), axis=-1)  # (T, 8)
    slide = speed[bottom < CONTACT_CLEARANCE]
    if len(slide) == 0:
        report.add("warn", "skating", "no foot sphere ever within 1 cm of the ground")
        return
    level = "ok" if np.percentile(slide, 95) < 0.5 else "warn"
    report.add(
        level,
        "skating",
        f"horizontal speed of foot spheres within {CONTACT_CLEARANCE * 100:.0f} cm of the ground: mean "
        f"{slide.mean():.2f} m/s, median {np.median(slide):.2f}, p95 {np.percentile(slide, 95):.2f} m/s "
        f"({len(slide)} sphere-frames)",
    )
    flight = int(np.all(clearance > 0.03, axis=1).sum())
    report.add("ok", "flight", f"{flight} frames with both feet more than 3 cm above the ground")


def centre_of_mass(clip: MotionClip, model: mujoco.MjModel) -> np.ndarray:
    """World position of the whole robot's centre of mass in every frame, m (T, 3), by MuJoCo's
    kinematics of the clip's joint positions: the reference that :func:`kinematics.centre_of_mass`
    of the stored body poses is tested against."""
    data = mujoco.MjData(model)
    com = np.empty((clip.num_frames, 3))
    for t, qpos in enumerate(clip.qpos(clip.frames)):
        data.qpos[:] = qpos
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        com[t] = data.subtree_com[0]
    return com


def airborne_phases(clip: MotionClip, model: mujoco.MjModel) -> list[tuple[int, int, float]]:
    """The clip's airborne phases: (first frame, end frame, fitted vertical acceleration of the centre
    of mass in m/s^2) for each run of at least :data:`MIN_AIRBORNE_FRAMES` frames in which both feet
    are more than ``select.FLIGHT_CLEARANCE`` above the ground (:func:`kinematics.airborne_phases`)."""
    f = clip.frames
    return kinematics.airborne_phases(
        model,
        f.body_pos,
        f.body_quat,
        tuple(clip.body_names),
        clip.dt,
        select.FLIGHT_CLEARANCE,
        MIN_AIRBORNE_FRAMES,
    )


def _airborne(clip: MotionClip, model: mujoco.MjModel, report: Report) -> None:
    """Airborne phases in which the centre of mass falls slower than gravity: a robot cannot follow
    them; to stay as long in the air it must rise higher than the reference, by (g - |a|) T² / 8 at
    the apex of a phase of T seconds with fitted acceleration a."""
    phases = airborne_phases(clip, model)
    if not phases:
        report.add("ok", "airborne", f"no airborne phase of {MIN_AIRBORNE_FRAMES} frames or more")
        return
    floating = [(a, b, acc) for a, b, acc in phases if acc > -FLOAT_TOLERANCE * GRAVITY]
    a, b, acc = max(phases, key=lambda p: (p[2], p[0]))
    seconds = (b - a) * clip.dt
    gap = (GRAVITY + acc) * seconds**2 / 8.0
    report.add(
        "warn" if floating else "ok",
        "airborne",
        f"{len(phases)} phases with both feet off the ground, centre of mass accelerating "
        f"{np.mean([p[2] for p in phases]):.1f} m/s^2 on average (gravity -{GRAVITY:.2f}); "
        f"{len(floating)} fall slower than {FLOAT_TOLERANCE:g} g; the slowest: {a * clip.dt:.2f}-"
        f"{b * clip.dt:.2f} s, {acc:.1f} m/s^2 (a flight of that length peaks {100 * gap:.0f} cm higher)",
    )


def _self_contact(clip: MotionClip, model: mujoco.MjModel | None, report: Report) -> None:
    """Frames in which two of the robot's own collision primitives overlap (MuJoCo's collision
    detection on the G1 with every primitive on; parent and child bodies are excluded, as MuJoCo
    does). A policy that tracks such a frame drives one link into another on a robot that has
    self-collision (MuJoCo, the real G1), and the training simulator models it between the legs
    alone, and only when asked (``env.leg_contact_stiffness``)."""
    if model is None:
        model = g1.load_model(collisions="all", floor=False)
    data = mujoco.MjData(model)
    pair_frames: dict[tuple[str, str], int] = {}
    frames, deepest = 0, 0.0
    for qpos in clip.qpos(clip.frames):
        data.qpos[:] = qpos
        mujoco.mj_kinematics(model, data)
        mujoco.mj_collision(model, data)
        n = data.ncon
        dist = data.contact.dist[:n]
        touching = dist < 0.0
        if not np.any(touching):
            continue
        frames += 1
        deepest = max(deepest, float(-dist[touching].min()))
        bodies = np.sort(model.geom_bodyid[data.contact.geom[:n][touching]], axis=1)
        for a, b in {tuple(row) for row in bodies.tolist()}:
            key = (model.body(a).name, model.body(b).name)
            pair_frames[key] = pair_frames.get(key, 0) + 1
    if frames == 0:
        report.add("ok", "self-contact", "no overlapping collision primitives")
        return
    worst = sorted(pair_frames.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    pairs = ", ".join(f"{a}/{b} {n}" for (a, b), n in worst)
    report.add(
        "warn",
        "self-contact",
        f"{frames} of {clip.num_frames} frames, deepest {1e3 * deepest:.1f} mm (frames by pair: {pairs})",
    )


def _velocities(clip: MotionClip, report: Report) -> None:
    f = clip.frames
    peak = np.abs(f.joint_vel).max(axis=0)
    j = int(np.argmax(peak / g1.VELOCITY_LIMIT))
    over = [clip.joint_names[i] for i in np.flatnonzero(peak > g1.VELOCITY_LIMIT)]
    report.add(
        "warn" if over else "ok",
        "joint speed",
        f"peak {np.abs(f.joint_vel).max():.1f} rad/s; closest to its limit: {clip.joint_names[j]} "
        f"{peak[j]:.1f} of {g1.VELOCITY_LIMIT[j]:.0f} rad/s"
        + (f"; above the motor limit: {', '.join(over)}" if over else ""),
    )
    lin = np.linalg.norm(f.root_lin_vel_w, axis=-1)
    ang = np.linalg.norm(f.root_ang_vel_w, axis=-1)
    report.add(
        "ok",
        "root speed",
        f"linear peak {lin.max():.2f} m/s "
        f"(horizontal mean {np.linalg.norm(f.root_lin_vel_w[:, :2], axis=-1).mean():.2f}), "
        f"angular peak {ang.max():.2f} rad/s; "
        f"height {f.root_pos[:, 2].min():.3f}-{f.root_pos[:, 2].max():.3f} m",
    )


def _discontinuities(clip: MotionClip, report: Report) -> None:
    f = clip.frames
    step = np.abs(np.diff(f.joint_pos, axis=0))
    t, j = np.unravel_index(np.argmax(step), step.shape)
    jumps = int(np.sum(step > g1.VELOCITY_LIMIT * clip.dt))
    report.add(
        "warn" if jumps else "ok",
        "joint steps",
        f"largest frame-to-frame step {step[t, j]:.3f} rad ({clip.joint_names[j]}, frames {t}-{t + 1}); "
        f"{jumps} steps faster than the motor limit",
    )
    found = spikes.find_spikes(f.joint_pos, float(clip.attrs["spike_threshold"]))
    fixed = len(clip.attrs["spikes_fixed"])
    if len(found):
        where = ", ".join(f"{clip.joint_names[jj]}@{tt}" for tt, jj in found[:5])
        report.add(
            "warn", "spikes", f"{len(found)} single-frame spikes ({where}); re-import with --fix-spikes"
        )
    else:
        report.add(
            "ok", "spikes", f"none above {clip.attrs['spike_threshold']} rad ({fixed} fixed on import)"
        )
    root_step = np.linalg.norm(np.diff(f.root_pos, axis=0), axis=1) / clip.dt
    q = quat_normalize(f.root_quat)
    turn = np.linalg.norm(quat_log(quat_multiply(q[1:], quat_conjugate(q[:-1]))), axis=1) / clip.dt
    level = "ok" if root_step.max() <= MAX_ROOT_SPEED and turn.max() <= MAX_ROOT_TURN_RATE else "fail"
    report.add(
        level,
        "root steps",
        f"fastest frame-to-frame root motion {root_step.max():.2f} m/s, {turn.max():.2f} rad/s "
        f"(limits {MAX_ROOT_SPEED:.0f} m/s, {MAX_ROOT_TURN_RATE:.0f} rad/s)",
    )
