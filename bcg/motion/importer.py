"""Import a window of a LAFAN1 G1 CSV into a motion clip file.

The kept frames are the source's values (root quaternion reordered to w, x, y, z), unless
``fix_spikes`` repairs single-frame joint spikes, which the file then records. Velocities and body
poses are derived as described in :mod:`bcg.motion.schema`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from bcg.core import g1
from bcg.motion import kinematics, lafan, schema, spikes
from bcg.motion.errors import MotionFileError
from bcg.motion.io import write_clip

_PAD = 2  # neighbouring source frames used for velocities and spike tests at the window's edges


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_csv` did.

    Attributes:
        path: the clip written.
        num_frames: frames kept.
        spikes: (n, 2) (source frame, joint index) of the spikes found in the window.
        fixed: whether they were repaired.
    """

    path: Path
    num_frames: int
    spikes: np.ndarray
    fixed: bool


def derive(
    model: mujoco.MjModel,
    root_pos: np.ndarray,
    root_quat: np.ndarray,
    joint_pos: np.ndarray,
    fps: float,
) -> dict[str, np.ndarray]:
    """Every dataset of the schema from the frames (joints in :data:`g1.JOINT_NAMES` order).

    Args:
        model: compiled G1 model.
        root_pos: m (T, 3); root_quat: (T, 4) w, x, y, z; joint_pos: rad (T, 29).
        fps: frames per second.

    Returns:
        name -> array, for every name of :data:`schema.DATASETS` and :data:`schema.NAME_DATASETS`.
    """
    dt = 1.0 / fps
    body_pos, body_quat = kinematics.forward_kinematics(model, root_pos, root_quat, joint_pos)
    ang_w, ang_b = kinematics.angular_velocity(root_quat, dt)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow shows as non-finite: write_clip refuses it
        return _derived(model, root_pos, root_quat, joint_pos, dt, body_pos, body_quat, ang_w, ang_b)


def _derived(model, root_pos, root_quat, joint_pos, dt, body_pos, body_quat, ang_w, ang_b) -> dict:
    return {
        "joint_names": g1.JOINT_NAMES,
        "body_names": kinematics.model_body_names(model),
        "joint_pos": joint_pos,
        "joint_vel": kinematics.finite_difference(joint_pos, dt),
        "root_pos": root_pos,
        "root_quat": root_quat,
        "root_lin_vel_w": kinematics.finite_difference(root_pos, dt),
        "root_ang_vel_w": ang_w,
        "root_ang_vel_b": ang_b,
        "body_pos": body_pos,
        "body_quat": body_quat,
        "body_lin_vel_w": kinematics.finite_difference(body_pos, dt),
    }


def import_csv(
    csv_path: str | Path,
    out: str | Path,
    start: int = 0,
    end: int | None = None,
    fix_spikes: bool = False,
    spike_threshold: float = spikes.DEFAULT_THRESHOLD,
    model: mujoco.MjModel | None = None,
) -> ImportResult:
    """Convert source frames ``[start, end)`` of a LAFAN1 G1 CSV into a clip file.

    Args:
        csv_path: the source CSV.
        out: the .h5 file to write (written only if everything succeeds).
        start: first source frame kept (0-based, inclusive).
        end: end of the kept range (exclusive); None keeps every frame to the end.
        fix_spikes: repair detected spikes by interpolation and record them in the file.
        spike_threshold: rad, see :mod:`bcg.motion.spikes`.
        model: compiled G1 model; default ``g1.load_model(collisions="none", floor=False)``.

    Raises:
        MotionFileError: unreadable or malformed CSV, or a bad frame range.
    """
    if not (np.isfinite(spike_threshold) and spike_threshold > 0):
        raise MotionFileError(f"the spike threshold must be a positive number of rad, got {spike_threshold}")
    out = Path(out)
    if out.suffix != ".h5":
        raise MotionFileError(f"{out}: a clip file is written as .h5")
    if out.exists() and Path(csv_path).exists() and out.resolve() == Path(csv_path).resolve():
        raise MotionFileError(f"{out}: the output would overwrite the source CSV")
    source = lafan.read_csv(csv_path)
    total = len(source.joint_pos)
    end = total if end is None else end
    if not (0 <= start < end <= total):
        raise MotionFileError(
            f"{csv_path}: frame range [{start}, {end}) is outside the take's {total} frames"
        )
    if end - start < schema.MIN_FRAMES:
        raise MotionFileError(
            f"{csv_path}: frame range [{start}, {end}) has fewer than {schema.MIN_FRAMES} frames"
        )
    model = model if model is not None else g1.load_model(collisions="none", floor=False)
    lo, hi = max(0, start - _PAD), min(total, end + _PAD)
    inner = slice(start - lo, end - lo)
    joint_pos = source.joint_pos[lo:hi]
    found = spikes.find_spikes(joint_pos, spike_threshold)
    found = found[(found[:, 0] >= inner.start) & (found[:, 0] < inner.stop)]
    original = joint_pos[found[:, 0], found[:, 1]]
    if fix_spikes and len(found):
        joint_pos = spikes.fix_spikes(joint_pos, found)
    padded = derive(model, source.root_pos[lo:hi], source.root_quat[lo:hi], joint_pos, lafan.FPS)
    datasets = {
        name: value if name in schema.NAME_DATASETS else value[inner].copy() for name, value in padded.items()
    }
    found_source = found + np.array([lo, 0])
    fixed = found_source if fix_spikes else np.zeros((0, 2), dtype=np.int64)
    attrs = {
        "schema_version": schema.SCHEMA_VERSION,
        "fps": lafan.FPS,
        "quat_convention": schema.QUAT_CONVENTION,
        "source_file": source.path.name,
        "source_sha256": source.sha256,
        "source_frame_start": start,
        "source_frame_end": end,
        "spikes_fixed": fixed.astype(np.int64).reshape(-1, 2),
        "spikes_original": (original if fix_spikes else np.zeros(0)).astype(np.float64),
        "spike_threshold": float(spike_threshold),
        "velocity_method": schema.VELOCITY_METHOD,
        "licence": lafan.LICENCE,
        "attribution": lafan.ATTRIBUTION,
    }
    write_clip(out, datasets, attrs)
    return ImportResult(path=Path(out), num_frames=end - start, spikes=found_source, fixed=fix_spikes)
