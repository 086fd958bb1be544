"""Reader for the LAFAN1 clips retargeted to the G1 (Unitree's "LAFAN1_Retargeting_Dataset").

Format (the dataset's README): no header, comma separated, 30 frames per second,
36 columns per frame: root position x, y, z (m, world, z up), root quaternion x, y, z, w (scalar
LAST), then the 29 joint angles (rad) in :data:`bcg.core.g1.JOINT_NAMES` order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bcg.core import g1
from bcg.motion.errors import MotionFileError
from bcg.motion.io import QUAT_NORM_TOLERANCE
from bcg.motion.schema import MIN_FRAMES

FPS = 30.0  # frames per second of every LAFAN1 G1 clip
NUM_COLUMNS = 7 + g1.NUM_JOINTS
MAX_ABS_VALUE = 1e3  # m or rad: a larger value in a take is a broken file
JOINT_NAMES = g1.JOINT_NAMES  # the CSV's joint order
ATTRIBUTION = (
    "LAFAN1 by Ubisoft La Forge (Harvey, Yurick, Nowrouzezahrai, Pal, 'Robust Motion In-betweening', "
    "ACM TOG (SIGGRAPH) 2020), retargeted to the Unitree G1 by Unitree Robotics "
    "(LAFAN1_Retargeting_Dataset)"
)
LICENCE = (
    "CC BY-NC-ND 4.0 (non-commercial, no derivatives; verbatim copies and format conversions allowed "
    "with attribution)"
)


@dataclass(frozen=True)
class SourceFrames:
    """The frames of one CSV, verbatim.

    Attributes:
        root_pos: m (T, 3), world.
        root_quat: (T, 4) reordered to w, x, y, z (the CSV stores x, y, z, w); values unchanged.
        joint_pos: rad (T, 29) in the CSV's (= :data:`JOINT_NAMES`) order.
        sha256: hex digest of the whole CSV file.
        path: the file read.
    """

    root_pos: np.ndarray
    root_quat: np.ndarray
    joint_pos: np.ndarray
    sha256: str
    path: Path


def read_csv(path: str | Path) -> SourceFrames:
    """Read every frame of a LAFAN1 G1 CSV; raise :class:`MotionFileError` when it is malformed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MotionFileError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    rows = [line for line in raw.decode("utf-8", errors="replace").splitlines() if line.strip()]
    if not rows:
        raise MotionFileError(f"{path}: empty file, expected {NUM_COLUMNS} comma-separated columns")
    values = []
    for number, line in enumerate(rows, start=1):
        cells = line.split(",")
        if len(cells) != NUM_COLUMNS:
            raise MotionFileError(
                f"{path}: line {number} has {len(cells)} columns, expected {NUM_COLUMNS} "
                "(root x y z, quaternion x y z w, 29 joint angles)"
            )
        try:
            values.append([float(c) for c in cells])
        except ValueError as exc:
            raise MotionFileError(f"{path}: line {number}: {exc}") from exc
    frames = np.array(values, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(frames))
    if len(bad):
        line, col = bad[0]
        raise MotionFileError(f"{path}: line {line + 1} column {col} is not finite ({frames[line, col]})")
    bad = np.argwhere(np.abs(frames) > MAX_ABS_VALUE)
    if len(bad):
        line, col = bad[0]
        raise MotionFileError(
            f"{path}: line {line + 1} column {col} holds {frames[line, col]:g}, beyond +-{MAX_ABS_VALUE:g} "
            "(metres or radians)"
        )
    if len(frames) < MIN_FRAMES:
        raise MotionFileError(f"{path}: {len(frames)} frame(s), at least {MIN_FRAMES} needed")
    norms = np.linalg.norm(frames[:, 3:7], axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > QUAT_NORM_TOLERANCE)
    if len(bad):
        raise MotionFileError(
            f"{path}: line {bad[0] + 1}: the root quaternion (columns 3-6) has norm {norms[bad[0]]:.4g}; "
            "rotations must be unit quaternions"
        )
    return SourceFrames(
        root_pos=frames[:, 0:3].copy(),
        root_quat=frames[:, [6, 3, 4, 5]].copy(),
        joint_pos=frames[:, 7:].copy(),
        sha256=hashlib.sha256(raw).hexdigest(),
        path=path,
    )
