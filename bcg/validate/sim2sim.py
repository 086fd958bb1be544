"""Sim-to-sim validation: play a policy in MuJoCo and report the paper's metrics.

Usage::

    python -m bcg.validate.sim2sim policy.h5 [--runs 5] [--motion run] [--seconds 10] [--json out.json]
        [--plot out.png] [--video out.mp4] [--kp-scale 1] [--kd-scale 1]
    python -m bcg.validate.sim2sim --reference-pd --motion run     # targets = reference joints
    python -m bcg.validate.sim2sim --hold-default --start standing # targets = the default pose

Each run starts from the reference at a random phase plus the training reset noise (seeded, run i uses
seed + i), then plays ``--seconds`` with the deterministic policy (actor mean, noise-free observation)
in MuJoCo with contact on every collision primitive. Reported per run and as mean and standard
deviation over runs: falls (root below ``g1.FALL_HEIGHT``), E_track global and root-relative (cm),
foot penetration in MuJoCo (mm) and, when the differentiable simulator has contact, the same episode
replayed there from the same start state with the policy's kappa, and Δd = training - MuJoCo (mm).
See :mod:`bcg.validate.metrics` for the definitions.

``--reference-pd`` replaces the policy's action by the reference joint angles at t+1 (same runner,
same PD, only the action source differs); with a policy file its gains and motion are used, without
one the G1 module's gains. ``--hold-default`` holds the G1's default pose instead, open loop (how
long the robot stands on its own, in both simulators). Errors in the input (bad policy file,
unknown motion, mismatched joint order, impossible options) print one line on stderr and exit with
status 2.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: offscreen rendering

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bcg.core import g1  # noqa: E402
from bcg.core.atomic import atomic_write  # noqa: E402
from bcg.learn.policy import DEFAULT_KAPPA, Policy, PolicyFileError, load_policy  # noqa: E402
from bcg.motion import MotionClip, MotionFileError  # noqa: E402
from bcg.validate.metrics import (  # noqa: E402
    Penetration,
    first_far_step,
    heading_errors,
    mean_std,
    path_ratio,
    penetration_stats,
    tracking_errors,
)
from bcg.validate.mujoco_runner import (  # noqa: E402
    ActionSource,
    ContactRecord,
    DefaultPose,
    Episode,
    EvaluationError,
    MujocoG1,
    PDParams,
    PolicyActions,
    ReferencePD,
    ResetNoise,
    TrainingSimG1,
    initial_state,
    run_episode,
)
from bcg.validate.render import RenderError, VideoConfig, find_ffmpeg, write_episode_video  # noqa: E402
from bcg.validate.stored_config import (
    training_contact,
    training_depth_correction,
    training_joint_limits,
    training_lead_in,
    training_lead_out,
    training_leg_contact,
    training_margin,
    training_pose_termination,
)


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation.

    Attributes:
        runs: episodes (the paper: 5).
        seconds: s per episode (it ends earlier on a fall).
        seed: run i draws its start from ``numpy.random.default_rng(seed + i)``.
        start_time: s; every run starts at this phase of the clip (with its seed's noise) instead of
            a random one: for a segment a policy fails on.
        start: "reference" (the reference's state, as training starts its episodes) or "standing"
            (still, in the default pose, at clip time ``start_time`` or 0, as the robot starts:
            ``bcg.robot.run`` after A).
        policy_blend: s over which a standing start's targets blend from the default pose to the
            policy's (``bcg.robot.run --policy-blend``, 0 by default there too).
        kp_scale, kd_scale: factors on the policy's PD gains (1 = as trained; 0 = motors off).
        actuation: "qfrc" (PD torque as applied joint force) or "motor" (MuJoCo motor actuators).
        collisions: MuJoCo collision set, "all" (default), "feet" or "no-leg-pairs" (every
            primitive, but the legs pass through each other; see :func:`g1.build_spec`).
        reset_noise: add the training reset noise to the start state.
        training_sim: "on" (replay each run in bcg.sim with contact, for Δd) or "off".
        kappa: contact stiffness of the training-simulator replay; None = the policy file's.
    """

    runs: int = 5
    seconds: float = 10.0
    seed: int = 0
    start_time: float | None = None
    start: str = "reference"
    policy_blend: float = 0.0
    kp_scale: float = 1.0
    kd_scale: float = 1.0
    actuation: str = "qfrc"
    collisions: str = "all"
    reset_noise: bool = True
    training_sim: str = "on"
    kappa: float | None = None

    def __post_init__(self):
        if self.runs < 1:
            raise EvaluationError(f"--runs must be at least 1, got {self.runs}")
        if not (np.isfinite(self.seconds) and round(self.seconds / g1.CONTROL_DT) >= 1):
            raise EvaluationError(
                f"--seconds must be at least one control step ({g1.CONTROL_DT} s), got {self.seconds}"
            )
        if (
            not (np.isfinite(self.kp_scale) and np.isfinite(self.kd_scale))
            or self.kp_scale < 0
            or self.kd_scale < 0
        ):
            raise EvaluationError("--kp-scale and --kd-scale must be >= 0")
        if self.kappa is not None and not (np.isfinite(self.kappa) and self.kappa > 0):
            raise EvaluationError(f"--kappa must be positive, got {self.kappa}")
        if self.start not in ("reference", "standing"):
            raise EvaluationError(f"start must be 'reference' or 'standing', got {self.start!r}")
        if not 0.0 <= self.policy_blend <= 2.0:
            raise EvaluationError(f"--policy-blend must be within 0-2 s, got {self.policy_blend}")
        if self.training_sim not in ("on", "off"):
            raise EvaluationError(f"training_sim must be on or off, got {self.training_sim!r}")
        if self.collisions not in ("all", "feet", "no-leg-pairs"):
            raise EvaluationError(
                f"collisions must be 'all', 'feet' or 'no-leg-pairs', got {self.collisions!r}"
            )

    @property
    def steps(self) -> int:
        return int(round(self.seconds / g1.CONTROL_DT))


@dataclass
class RunResult:
    """Metrics of one run (lengths in the units named)."""

    seed: int
    start_time: float
    steps: int
    fell: bool
    fall_time: float | None
    e_track_cm: float
    e_track_root_cm: float
    penetration_mujoco: Penetration
    penetration_training: Penetration | None
    delta_d_mm: float | None
    training_steps: int | None = None
    training_fell: bool | None = None
    training_fall_time: float | None = None
    other_contacts: list[ContactRecord] | None = None
    path_ratio: float | None = None  # root path length, robot over reference (metrics.path_ratio)
    # share of MuJoCo's physics steps in which some joint's PD torque is at its effort limit, and
    # the largest PD torque over its limit (before the clip)
    effort_at_limit: float | None = None
    effort_peak: float | None = None
    # the largest |root heading - the reference's| over the run (metrics.heading_errors), deg
    heading_error_max_deg: float | None = None
    # clip time s at which a body first lies farther from its reference than the training's pose
    # termination distance (metrics.first_far_step); None if never or without the rule
    lost_track_time: float | None = None


def evaluate(
    source: ActionSource,
    pd: PDParams,
    clip: MotionClip,
    config: EvalConfig,
    reset_noise: ResetNoise,
    kappa: float,
    progress=print,
    margin: float | None = None,
    depth_correction: float = 0.0,
    pose_termination: float = 0.0,
    lead_out: float = 0.0,
    leg_contact: tuple[float, float, float] = (0.0, 0.5, 200.0),
    joint_limits: tuple[float, float] = (0.0, 0.0),
) -> tuple[list[RunResult], list[Episode], str]:
    """Play ``config.runs`` episodes in MuJoCo (and in bcg.sim when possible) and measure them.
    ``pose_termination`` (m, 0 = off) is the training's rule for :attr:`RunResult.lost_track_time`;
    ``lead_out`` (s) lets the episodes run on past the clip's last frame, held still, that long.
    ``leg_contact`` (k, c, L) and ``joint_limits`` (ratios) are the training simulator's (0: none).

    Returns:
        per-run results, the MuJoCo episodes, and a note on the training-simulator replay.
    """
    backend = MujocoG1(pd, collisions=config.collisions, actuation=config.actuation)
    training = None
    note = "off"
    if config.training_sim == "on":
        contact = training_contact(kappa, margin, depth_correction)
        training = TrainingSimG1(pd, contact=contact, leg_contact=leg_contact, joint_limits=joint_limits)
        note = (
            f"bcg.sim with contact, kappa {kappa:g}"
            + (f", depth correction {depth_correction:g}" if depth_correction else "")
            + (f", leg contact {leg_contact[0]:g} N/m" if leg_contact[0] > 0 else "")
            + (f", joint limits {joint_limits[0]:g}x kp" if joint_limits[0] > 0 else "")
        )
    noise = reset_noise if config.reset_noise else ResetNoise.none()
    standing = config.start == "standing"
    start_time = 0.0 if standing and config.start_time is None else config.start_time
    blend = config.policy_blend if standing else 0.0
    results, episodes = [], []
    began = time.perf_counter()
    for i in range(config.runs):
        seed = config.seed + i
        rng = np.random.default_rng(seed)  # the start's phase and noise
        start = initial_state(clip, backend.model, rng, config.seconds, noise, start_time, standing, lead_out)
        held = lead_out > 0.0
        episode = run_episode(
            backend, source, clip, start, config.steps, policy_blend=blend, still_after_end=held
        )
        e_global, e_root = tracking_errors(episode.points, episode.ref_points)
        far = first_far_step(episode.points, episode.ref_points, backend.model.nbody - 1, pose_termination)
        pen_mj = penetration_stats(episode.foot_depth)
        pen_tr, delta, replay = None, None, None
        if training is not None:
            replay = run_episode(
                training, source, clip, start, config.steps, policy_blend=blend, still_after_end=held
            )
            pen_tr = penetration_stats(replay.foot_depth)
            delta = pen_tr.mean_mm - pen_mj.mean_mm
        results.append(
            RunResult(
                seed,
                episode.start_time,
                len(episode.times),
                episode.fell,
                episode.fall_time,
                e_global,
                e_root,
                pen_mj,
                pen_tr,
                delta,
                None if replay is None else len(replay.times),
                None if replay is None else replay.fell,
                None if replay is None else replay.fall_time,
                None if episode.other_contacts is None else list(episode.other_contacts),
                path_ratio(episode.qpos[:, :2], episode.ref_qpos[:, :2]),
                *_effort(episode.effort_demand),
                float(np.abs(_heading_error(episode)).max()),
                None if far is None else float(episode.times[far]),
            )  # fmt: skip
        )
        episodes.append(episode)
        elapsed = time.perf_counter() - began
        done_steps = sum(r.steps for r in results)
        eta = elapsed / (i + 1) * (config.runs - i - 1)
        if progress:
            progress(
                f"run {i + 1}/{config.runs}: {len(episode.times)} steps, "
                + (f"FELL at {episode.fall_time:.2f} s, " if episode.fell else "no fall, ")
                + f"E_track {e_global:.1f} cm, penetration {pen_mj.mean_mm:.2f} mm"
                + (f", Δd {delta:+.2f} mm" if delta is not None else "")
                + (
                    ""
                    if replay is None
                    else f"; bcg.sim: {f'fell at {replay.fall_time:.2f} s' if replay.fell else 'no fall'}"
                )
                + f"  [{done_steps / elapsed:.0f} steps/s, ETA {eta:.0f} s]"
            )
        if progress and episode.other_contacts:
            progress("  contacts other than feet on the floor: " + format_contacts(episode.other_contacts))
    return results, episodes, note


def evaluate_policy(
    policy: Policy, config: EvalConfig, progress=print, clip: MotionClip | None = None
) -> tuple[list[RunResult], list[Episode], str]:
    """:func:`evaluate` a policy file as it was trained: on its clip (or ``clip``) with the training's
    lead-in, with its gains, reset noise, contact margin, position term, pose termination and
    lead-out, at ``config.kappa`` or the policy's own stiffness."""
    stored = policy.config
    if clip is None:
        clip = MotionClip.load(policy.motion_name)
    try:
        clip = clip.with_lead_in(training_lead_in(stored))
    except ValueError as exc:
        raise EvaluationError(f"{policy.path}: its clip_lead_in: {exc}") from None
    return evaluate(
        PolicyActions(policy), PDParams.from_policy(policy, config.kp_scale, config.kd_scale), clip, config,
        ResetNoise.of_training(stored), config.kappa if config.kappa is not None else policy.kappa, progress,
        margin=training_margin(stored), depth_correction=training_depth_correction(stored),
        pose_termination=training_pose_termination(stored), lead_out=training_lead_out(stored),
        leg_contact=training_leg_contact(stored), joint_limits=training_joint_limits(stored),
    )  # fmt: skip


def _heading_error(episode: Episode) -> np.ndarray:
    """deg (K + 1,) the root's heading minus the reference's at the control-step boundaries."""
    return heading_errors(episode.qpos[:, 3:7], episode.ref_qpos[:, 3:7])


def _effort(demand: np.ndarray | None) -> tuple[float | None, float | None]:
    """(share of physics steps with a joint at its effort limit, peak demand) of an episode."""
    if demand is None or len(demand) == 0:
        return None, None
    return float(np.mean(np.any(demand >= 1.0, axis=1))), float(demand.max())


def summarize(results: list[RunResult]) -> dict:
    """Falls, and mean and std over runs of each metric (NaNs from empty runs are ignored)."""
    falls = sum(r.fell for r in results)

    def ms(values):
        mean, std = mean_std(values)
        return {"mean": mean, "std": std}

    out = {
        "runs": len(results),
        "falls": falls,
        "e_track_cm": ms(r.e_track_cm for r in results),
        "e_track_root_cm": ms(r.e_track_root_cm for r in results),
        "path_ratio": ms(np.nan if r.path_ratio is None else r.path_ratio for r in results),
        "heading_error_max_deg": ms(
            np.nan if r.heading_error_max_deg is None else r.heading_error_max_deg for r in results
        ),
        "penetration_mujoco_mm": ms(r.penetration_mujoco.mean_mm for r in results),
        "penetration_mujoco_p95_mm": ms(r.penetration_mujoco.p95_mm for r in results),
        "penetration_mujoco_max_mm": ms(r.penetration_mujoco.max_mm for r in results),
    }
    # where in the clip the falls come (start + time up): falls that gather at one clip time point
    # at a segment of the motion the policy has not learned, not at the simulators
    out["fall_clip_times_s"] = sorted(r.start_time + r.fall_time for r in results if r.fell)
    # where a training episode would have been ended by its pose termination
    out["lost_track_runs"] = sum(r.lost_track_time is not None for r in results)
    out["lost_track_clip_times_s"] = sorted(
        r.lost_track_time for r in results if r.lost_track_time is not None
    )
    if all(r.effort_at_limit is not None for r in results):
        out["effort_at_limit_share"] = ms(r.effort_at_limit for r in results)
        out["effort_peak_ratio"] = ms(r.effort_peak for r in results)
    if all(r.penetration_training is not None for r in results):
        out["penetration_training_mm"] = ms(r.penetration_training.mean_mm for r in results)
        out["delta_d_mm"] = ms(r.delta_d_mm for r in results)
    if all(r.training_fell is not None for r in results):
        # the same policy from the same start in the training simulator: a policy that stands
        # there and falls in MuJoCo points at the simulators' difference, not at the policy
        out["training_falls"] = sum(bool(r.training_fell) for r in results)
        out["training_fall_clip_times_s"] = sorted(
            r.start_time + r.training_fall_time for r in results if r.training_fell
        )
        out["survival_mujoco_s"] = ms(r.steps * g1.CONTROL_DT for r in results)
        out["survival_training_s"] = ms(r.training_steps * g1.CONTROL_DT for r in results)
    if all(r.other_contacts is not None for r in results):
        # in how many runs each pair of bodies touched (a foot on the floor excluded)
        runs: dict[str, int] = {}
        for r in results:
            for c in r.other_contacts:
                key = "/".join(c.bodies)
                runs[key] = runs.get(key, 0) + 1
        out["other_contacts_runs"] = dict(sorted(runs.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def format_contacts(records, limit: int = 4) -> str:
    """``a/b N steps from T s, ...`` for the ``limit`` most frequent pairs."""
    parts = [f"{'/'.join(c.bodies)} {c.steps} steps from {c.first_s:.2f} s" for c in records[:limit]]
    more = len(records) - limit
    return ", ".join(parts) + (f" and {more} more pairs" if more > 0 else "")


def format_summary(summary: dict, header: str) -> str:
    lines = [header, f"  falls: {summary['falls']}/{summary['runs']}"]
    if "training_falls" in summary:
        lines.append(
            f"  falls in the training sim (same starts): {summary['training_falls']}/{summary['runs']}"
        )
    for key, label in (
        ("e_track_cm", "E_track global [cm]"),
        ("e_track_root_cm", "E_track root-relative [cm]"),
        ("path_ratio", "root path covered, robot / reference"),
        ("heading_error_max_deg", "largest root heading error [deg]"),
        ("penetration_mujoco_mm", "penetration MuJoCo, mean [mm]"),
        ("penetration_mujoco_p95_mm", "penetration MuJoCo, p95 [mm]"),
        ("penetration_mujoco_max_mm", "penetration MuJoCo, max [mm]"),
        ("penetration_training_mm", "penetration training sim, mean [mm]"),
        ("delta_d_mm", "Δd training - MuJoCo [mm]"),
        ("survival_mujoco_s", "time to fall or end, MuJoCo [s]"),
        ("survival_training_s", "time to fall or end, training sim [s]"),
        ("effort_peak_ratio", "peak PD torque over the effort limit, MuJoCo"),
    ):
        if key in summary:
            lines.append(f"  {label}: {summary[key]['mean']:.2f} ± {summary[key]['std']:.2f}")
    if summary.get("lost_track_runs"):
        lines.append(
            f"  runs with a body beyond the training's pose termination: {summary['lost_track_runs']}/"
            f"{summary['runs']}"
        )
    for key, label in (
        ("fall_clip_times_s", "clip times of the falls, MuJoCo [s]"),
        ("lost_track_clip_times_s", "clip times a body first passes the pose termination, MuJoCo [s]"),
        ("training_fall_clip_times_s", "clip times of the falls, training sim [s]"),
    ):
        if summary.get(key):
            lines.append(f"  {label}: " + ", ".join(f"{t:.2f}" for t in summary[key]))
    if "effort_at_limit_share" in summary:  # a share of a percent matters: print it in percent
        share = summary["effort_at_limit_share"]
        lines.append(
            "  MuJoCo steps with a joint at its effort limit [%]: "
            f"{100 * share['mean']:.2f} ± {100 * share['std']:.2f}"
        )
    if "other_contacts_runs" in summary:
        pairs = summary["other_contacts_runs"]
        listed = ", ".join(f"{k} {v}" for k, v in list(pairs.items())[:8]) or "none"
        lines.append(f"  runs with contacts other than feet on the floor, by pair: {listed}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Outputs (each written to a temporary file and renamed)


def _atomic(path: Path, write) -> None:
    if not path.parent.is_dir():
        raise EvaluationError(f"{path}: folder {path.parent} does not exist")
    atomic_write(path, write)


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temporary file in the same folder, then rename)."""
    _atomic(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, payload: dict) -> None:
    write_text(path, json.dumps(payload, indent=2) + "\n")


def write_plot(path: Path, episodes: list[Episode], title: str) -> None:
    """Root height, per-step tracking error and root heading error of every run against time."""
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, (ax_h, ax_e, ax_y) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for i, ep in enumerate(episodes):
        t = np.concatenate([[0.0], ep.times - ep.start_time])
        ax_h.plot(t, ep.root_height, label=f"run {i + 1}")
        heading = _heading_error(ep)
        heading[1:][np.abs(np.diff(heading)) > 180.0] = np.nan  # no line across the ±180° wrap
        ax_y.plot(t, heading)
        if len(ep.times):
            err = np.linalg.norm(ep.points - ep.ref_points, axis=-1).mean(axis=1) * 100.0
            ax_e.plot(ep.times - ep.start_time, err)
    ax_h.axhline(g1.FALL_HEIGHT, color="k", ls="--", lw=1, label="fall height")
    ax_h.set_ylabel("root height [m]")
    ax_h.legend(fontsize=7, ncol=3)
    ax_e.set_ylabel("mean body position error [cm]")
    ax_y.set_ylabel("root heading error [deg]")
    ax_y.set_ylim(-180, 180)
    ax_y.set_yticks([-180, -90, 0, 90, 180])
    ax_y.set_xlabel("time since start [s]")
    fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    try:
        _atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format=path.suffix.lstrip(".") or "png"))
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bcg.validate.sim2sim",
        description="Play a bcg policy in MuJoCo and report falls, tracking error and foot penetration.",
    )
    p.add_argument(
        "policy", nargs="?", type=Path, help="policy file (.h5); optional with --reference-pd, --hold-default"
    )
    p.add_argument("--reference-pd", action="store_true", help="targets = reference joint angles at t+1")
    p.add_argument("--hold-default", action="store_true", help="targets = the G1's default pose, open loop")
    p.add_argument("--runs", type=int, default=EvalConfig.runs, help="episodes (default: %(default)s)")
    p.add_argument("--motion", help="motion name or .h5 path (default: the policy's motion)")
    p.add_argument(
        "--seconds", type=float, default=EvalConfig.seconds, help="s per episode (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=EvalConfig.seed, help="run i uses seed + i (default: %(default)s)"
    )
    p.add_argument(
        "--start-time",
        type=float,
        metavar="S",
        help="start every run at this clip time (s) instead of a random one (default: random)",
    )
    p.add_argument(
        "--start", choices=("reference", "standing"), default=EvalConfig.start,
        help="start state: the reference's (as in training, default) or standing still in the default "
        "pose at clip time --start-time or 0, as the robot starts (bcg.robot.run after A)",
    )  # fmt: skip
    p.add_argument(
        "--policy-blend", type=float, default=EvalConfig.policy_blend, metavar="S",
        help="with --start standing: s over which the targets blend from the default pose to the "
        "policy's, as bcg.robot.run (default: %(default)s)",
    )  # fmt: skip
    p.add_argument("--kp-scale", type=float, default=1.0, help="factor on the policy's kp (default: 1)")
    p.add_argument("--kd-scale", type=float, default=1.0, help="factor on the policy's kd (default: 1)")
    p.add_argument("--actuation", choices=("qfrc", "motor"), default=EvalConfig.actuation)
    p.add_argument(
        "--collisions", choices=("all", "feet", "no-leg-pairs"), default=EvalConfig.collisions,
        help="MuJoCo's collision primitives: all (default), the feet only, or all but leg against leg",
    )  # fmt: skip
    p.add_argument("--no-reset-noise", action="store_true", help="start exactly on the reference")
    p.add_argument(
        "--training-sim", choices=("on", "off"), default="on",
        help="replay each run in bcg.sim with contact, for Δd (default: on)",
    )  # fmt: skip
    p.add_argument("--kappa", type=float, help="contact stiffness of the replay (default: the policy's)")
    p.add_argument(
        "--depth-correction",
        type=float,
        help="the replay's contact position term beta in [0, 1) (bcg.sim.ContactConfig.depth_correction; "
        "default: the policy's, 0 without a policy)",
    )
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--plot", type=Path, help="write a PNG of root height and tracking error")
    p.add_argument("--video", type=Path, help="write an MP4 of run 1 (reference as a ghost)")
    p.add_argument(
        "--video-size", default="480x360", help="WIDTHxHEIGHT, even numbers (default: %(default)s)"
    )
    p.add_argument(
        "--video-stride", type=int, default=2, help="control steps per frame (default: %(default)s)"
    )
    return p


def load_source(args) -> tuple[ActionSource, PDParams, Policy | None]:
    """The action source and PD gains the command line asks for."""
    policy = load_policy(args.policy) if args.policy is not None else None
    if args.reference_pd and args.hold_default:
        raise EvaluationError("--reference-pd and --hold-default are two action sources: give one")
    if policy is None and not (args.reference_pd or args.hold_default):
        raise EvaluationError("give a policy file, or --reference-pd or --hold-default")
    if policy is not None:
        pd = PDParams.from_policy(policy, args.kp_scale, args.kd_scale)
    else:
        pd = PDParams.from_g1(args.kp_scale, args.kd_scale)
    if args.reference_pd:
        source = ReferencePD()
    elif args.hold_default:  # the pose the robot client would hold for this policy
        source = DefaultPose() if policy is None else DefaultPose(policy.default_joint_pos)
    else:
        source = PolicyActions(policy)
    return source, pd, policy


def run(args) -> dict:
    if args.depth_correction is not None and not 0 <= args.depth_correction < 1:
        raise EvaluationError(f"--depth-correction must be in [0, 1), got {args.depth_correction}")
    source, pd, policy = load_source(args)
    motion = args.motion or (policy.motion_name if policy is not None else "run")
    clip = MotionClip.load(motion)
    if policy is not None and clip.content_hash != policy.motion_hash:
        print(
            f"warning: {clip.path.name} is not the clip the policy was trained on "
            f"({policy.motion_name}, {policy.motion_hash[:12]})",
            file=sys.stderr,
        )
    lead_in = training_lead_in(policy.config if policy is not None else None)
    try:
        clip = clip.with_lead_in(lead_in)
    except ValueError as exc:
        raise EvaluationError(f"the policy's clip_lead_in: {exc}") from None
    config = EvalConfig(
        runs=args.runs, seconds=args.seconds, seed=args.seed, start_time=args.start_time,
        start=args.start, policy_blend=args.policy_blend, kp_scale=args.kp_scale, kd_scale=args.kd_scale,
        actuation=args.actuation, collisions=args.collisions, reset_noise=not args.no_reset_noise,
        training_sim=args.training_sim, kappa=args.kappa,
    )  # fmt: skip
    for flag, path in (("--json", args.json), ("--plot", args.plot), ("--video", args.video)):
        if path is not None and not Path(path).resolve().parent.is_dir():
            # fail before the evaluation, not after it
            raise EvaluationError(f"{flag} {path}: folder {Path(path).resolve().parent} does not exist")
    video_size = None
    if args.video:
        video_size = _video_size(args.video_size)
        find_ffmpeg()  # fail before the evaluation, not after it
    kappa = args.kappa if args.kappa is not None else (policy.kappa if policy is not None else DEFAULT_KAPPA)
    noise = ResetNoise.of_training(policy.config if policy is not None else None)
    lead_out = training_lead_out(policy.config if policy is not None else None)
    header = (
        f"{source.name} on {clip.path.name}: {config.runs} runs of {config.seconds:g} s, "
        f"PD from {pd.source}, actuation {config.actuation}, collisions {config.collisions}"
        + (
            ", standing start"
            + (f" (targets blended over {config.policy_blend:g} s)" if config.policy_blend else "")
            if config.start == "standing"
            else ""
        )
        + (f", a {clip.lead_in:g} s lead-in from rest (the training's)" if clip.lead_in else "")
        + (f", a {lead_out:g} s lead-out past the clip's end (the training's)" if lead_out else "")
    )
    print(header)
    stored = policy.config if policy is not None else None
    beta = args.depth_correction if args.depth_correction is not None else training_depth_correction(stored)
    results, episodes, note = evaluate(
        source, pd, clip, config, noise, kappa, margin=training_margin(stored), depth_correction=beta,
        pose_termination=training_pose_termination(stored), lead_out=lead_out,
        leg_contact=training_leg_contact(stored), joint_limits=training_joint_limits(stored),
    )  # fmt: skip
    summary = summarize(results)
    print(format_summary(summary, f"summary ({note} for the training simulator):"))
    payload = {
        "policy": str(policy.path) if policy is not None else None,
        "action_source": source.name,
        "motion": str(clip.path),
        "motion_hash": clip.content_hash,
        "kappa": kappa,
        "depth_correction": beta,
        "policy_motion": policy.motion_name if policy is not None else None,
        "pd_source": pd.source,
        "reset_noise": asdict(noise) if config.reset_noise else None,
        "config": asdict(config),
        "training_sim": note,
        "summary": summary,
        "runs": [asdict(r) for r in results],
    }
    if args.json:
        write_json(args.json, payload)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, episodes, header)
        print(f"wrote {args.plot}")
    if args.video:
        width, height = video_size
        video = VideoConfig(width=width, height=height, stride=args.video_stride)
        began = time.perf_counter()
        frames = write_episode_video(
            args.video,
            MujocoG1(pd, collisions=config.collisions).model,
            episodes[0].qpos,
            episodes[0].ref_qpos,
            video,
        )
        print(f"wrote {args.video}: {frames} frames in {time.perf_counter() - began:.0f} s")
    return payload


def _video_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise EvaluationError(f"--video-size must be WIDTHxHEIGHT, got {text!r}") from None
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise EvaluationError(f"--video-size needs positive even numbers, got {text!r}")
    return width, height


def exit_status(action, errors: tuple = (PolicyFileError, MotionFileError, EvaluationError)) -> int:
    """0 after ``action()``; 2, with the message on stderr, when it refuses its input (a bad policy,
    motion or setting): the validation commands end with a line, not a traceback."""
    try:
        action()
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def checked_run():
        if args.video_stride < 1:
            raise EvaluationError(f"--video-stride must be >= 1, got {args.video_stride}")
        run(args)

    return exit_status(checked_run, (PolicyFileError, MotionFileError, EvaluationError, RenderError))


if __name__ == "__main__":
    sys.exit(main())
