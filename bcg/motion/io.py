"""Reading and writing motion clip files (see :mod:`bcg.motion.schema`).

:func:`write_clip` writes to a temporary file beside the target and renames it into place, so an
interrupted or failed write never leaves a half-written clip, and it checks the clip as the reader
does first, so no file is written that could not be read back. :func:`read_clip` checks the schema
(datasets, shapes before any is read, dtypes, finiteness, unit quaternions, attribute types and
ranges) and raises :class:`MotionFileError` with the file name and the problem. It does not check
that velocities and body poses agree with the positions: ``python -m bcg.motion check`` does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np

from bcg.core.atomic import atomic_write
from bcg.motion import schema
from bcg.motion.errors import MotionFileError

_COMPRESSION = {"compression": "gzip", "compression_opts": 9, "shuffle": True}


MAX_FPS = 1000.0  # frames per second beyond which a clip's frame rate is taken for a broken file
MIN_FPS = 1.0  # ... and below which
MAX_FRAMES = 1_000_000  # about 9 hours at 30 fps: a larger declared size is a broken or hostile file
MAX_NAMES = 1000  # joint or body names
QUAT_NORM_TOLERANCE = 1e-2  # |norm - 1| of a stored quaternion (source values are kept verbatim)


def write_clip(path: str | Path, datasets: dict[str, np.ndarray], attrs: dict) -> None:
    """Write a clip atomically.

    Args:
        path: target .h5 file; its folder must exist.
        datasets: every entry of :data:`schema.DATASETS` (float64 arrays) and of
            :data:`schema.NAME_DATASETS` (sequences of str).
        attrs: every entry of :data:`schema.ATTRIBUTES` and :data:`schema.ARRAY_ATTRIBUTES`.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise MotionFileError(f"{path}: folder {path.parent} does not exist")
    # the reader's checks, before anything is written: a clip that could not be read back is refused
    checked = {n: tuple(str(x) for x in datasets[n]) for n in schema.NAME_DATASETS}
    checked.update({n: np.asarray(datasets[n], dtype=np.float64) for n in schema.DATASETS})
    _validate(path, checked, {**attrs, **{n: np.asarray(attrs[n]) for n in schema.ARRAY_ATTRIBUTES}})

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            for name in schema.NAME_DATASETS:
                f.create_dataset(name, data=[str(n) for n in datasets[name]], dtype=h5py.string_dtype())
            for name in schema.DATASETS:
                f.create_dataset(name, data=np.asarray(datasets[name], dtype=np.float64), **_COMPRESSION)
            for name, value in attrs.items():
                f.attrs[name] = value

    try:
        atomic_write(path, write)
    except OSError as exc:
        raise MotionFileError(f"{path}: writing in {path.parent} failed ({exc})") from exc


def read_clip(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """Read and validate a clip.

    Returns:
        (datasets, attrs): float64 arrays in the file's own joint and body order, name datasets as
        tuples of str, attributes as Python values (array attributes as numpy arrays).

    Raises:
        MotionFileError: the file is missing, unreadable or breaks the schema.
    """
    path = Path(path)
    if path.is_dir():
        raise MotionFileError(f"{path}: is a folder, not a motion file")
    if not path.is_file():
        raise MotionFileError(f"{path}: no such motion file")
    try:
        with h5py.File(path, "r") as f:
            datasets, attrs = _read(path, f)
    except MotionFileError:
        raise
    except MemoryError:
        raise MotionFileError(f"{path}: a dataset is too large to read") from None
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise MotionFileError(f"{path}: not a readable HDF5 motion file ({exc})") from exc
    _validate(path, datasets, attrs)
    return datasets, attrs


def content_hash(datasets: dict[str, np.ndarray], fps: float) -> str:
    """sha256 (hex) of the motion as played: the frame rate, then every dataset in name order, as
    name, dtype, shape, bytes.

    The hash is of the file's own order (before any reordering by name), so it identifies the file's
    content independently of the model it is later resolved against; the frame rate is part of it,
    so the same frames played faster or slower are another motion.
    """
    digest = hashlib.sha256()
    digest.update(f"fps={float(fps)!r}".encode())
    for name in sorted(datasets):
        value = datasets[name]
        digest.update(name.encode())
        if name in schema.NAME_DATASETS:
            digest.update("\n".join(value).encode())
            continue
        array = np.ascontiguousarray(value, dtype="<f8")
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _read(path: Path, f: h5py.File) -> tuple[dict, dict]:
    missing = [n for n in (*schema.NAME_DATASETS, *schema.DATASETS) if n not in f]
    if missing:
        raise MotionFileError(f"{path}: missing dataset(s) {', '.join(missing)}")
    not_data = [n for n in (*schema.NAME_DATASETS, *schema.DATASETS) if not isinstance(f[n], h5py.Dataset)]
    if not_data:
        raise MotionFileError(f"{path}: {', '.join(not_data)} must be dataset(s), not groups or links")
    datasets: dict = {}
    for name in schema.NAME_DATASETS:  # sizes are checked before anything is read
        shape = f[name].shape
        if shape is None or len(shape) != 1 or not 1 <= shape[0] <= MAX_NAMES:
            raise MotionFileError(f"{path}: dataset {name} must be a 1-D list of 1-{MAX_NAMES} names")
        if f[name].dtype.kind not in "SOU":
            raise MotionFileError(f"{path}: dataset {name} must hold strings, not {f[name].dtype}")
        values = f[name][()]
        datasets[name] = tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values)
    for name, (symbolic, _) in schema.DATASETS.items():
        dset = f[name]
        if dset.shape is None or len(dset.shape) != len(symbolic) or not 0 < dset.shape[0] <= MAX_FRAMES:
            raise MotionFileError(
                f"{path}: dataset {name} has shape {dset.shape}, expected ({', '.join(map(str, symbolic))}) "
                f"with at most {MAX_FRAMES} frames"
            )
        if any(d > MAX_NAMES for d in dset.shape[1:]):
            raise MotionFileError(f"{path}: dataset {name} has shape {dset.shape}")
        if not np.issubdtype(dset.dtype, np.floating):
            raise MotionFileError(f"{path}: dataset {name} has dtype {dset.dtype}, expected float64")
        if dset.dtype != np.float64:
            raise MotionFileError(
                f"{path}: dataset {name} is {dset.dtype}; the schema stores float64 so that frames "
                "round-trip exactly"
            )
        datasets[name] = dset[()]
    missing = [n for n in (*schema.ATTRIBUTES, *schema.ARRAY_ATTRIBUTES) if n not in f.attrs]
    if missing:
        raise MotionFileError(f"{path}: missing attribute(s) {', '.join(missing)}")
    attrs = {}
    for name, kind in schema.ATTRIBUTES.items():
        attrs[name] = _attribute(path, name, f.attrs[name], kind)
    for name in schema.ARRAY_ATTRIBUTES:
        attrs[name] = np.asarray(f.attrs[name])
    return datasets, attrs


def _attribute(path: Path, name: str, value, kind: type):
    """An attribute as ``kind``, strictly: no bool for a number, no fraction for an int, no number
    for a string."""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, np.generic):
        value = value.item()  # plain Python values, in checks and in messages
    if kind is str:
        if not isinstance(value, str):
            raise MotionFileError(f"{path}: attribute {name} must be a string, got {value!r}")
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise MotionFileError(f"{path}: attribute {name}={value!r} is not a {kind.__name__}")
    if kind is int:
        if not (np.isfinite(value) and float(value) == int(value)):
            raise MotionFileError(f"{path}: attribute {name}={value!r} is not an integer")
        return int(value)
    return float(value)


def _validate(path: Path, datasets: dict, attrs: dict) -> None:
    if attrs["schema_version"] != schema.SCHEMA_VERSION:
        raise MotionFileError(
            f"{path}: schema version {attrs['schema_version']}, this reader knows {schema.SCHEMA_VERSION}"
        )
    if attrs["quat_convention"] != schema.QUAT_CONVENTION:
        raise MotionFileError(
            f"{path}: quat_convention {attrs['quat_convention']!r}, expected {schema.QUAT_CONVENTION!r}"
        )
    if not (np.isfinite(attrs["fps"]) and MIN_FPS <= attrs["fps"] <= MAX_FPS):
        raise MotionFileError(f"{path}: fps must be in [{MIN_FPS:g}, {MAX_FPS:g}], got {attrs['fps']}")
    if not (np.isfinite(attrs["spike_threshold"]) and attrs["spike_threshold"] > 0):
        raise MotionFileError(
            f"{path}: spike_threshold must be a positive number, got {attrs['spike_threshold']}"
        )
    for name in schema.NAME_DATASETS:
        names = datasets[name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise MotionFileError(f"{path}: {name} repeats {', '.join(dup)}")
    sizes = {
        "T": len(datasets["joint_pos"]),
        "J": len(datasets["joint_names"]),
        "B": len(datasets["body_names"]),
    }
    if sizes["T"] < schema.MIN_FRAMES:
        raise MotionFileError(f"{path}: {sizes['T']} frames, at least {schema.MIN_FRAMES} needed")
    for name, (shape, _) in schema.DATASETS.items():
        expected = tuple(sizes[a] if isinstance(a, str) else a for a in shape)
        actual = datasets[name].shape
        if actual != expected:
            symbolic = "(" + ", ".join(str(a) for a in shape) + ")"
            raise MotionFileError(
                f"{path}: dataset {name} has shape {actual}, expected {expected} = {symbolic} with "
                f"T = {sizes['T']} frames (joint_pos), J = {sizes['J']} joint names, "
                f"B = {sizes['B']} body names"
            )
        bad = np.argwhere(~np.isfinite(datasets[name]))
        if len(bad):
            raise MotionFileError(
                f"{path}: dataset {name} holds a non-finite value at frame {bad[0][0]} "
                f"(index {tuple(int(i) for i in bad[0])})"
            )
    for name in (n for n in schema.DATASETS if n.endswith("_quat")):
        norms = np.linalg.norm(datasets[name], axis=-1)
        bad = np.argwhere(np.abs(norms - 1.0) > QUAT_NORM_TOLERANCE)
        if len(bad):
            raise MotionFileError(
                f"{path}: dataset {name} holds a quaternion of norm {norms[tuple(bad[0])]:.4g} at frame "
                f"{bad[0][0]} (index {tuple(int(i) for i in bad[0])}); rotations must be unit quaternions"
            )
    frames = attrs["source_frame_end"] - attrs["source_frame_start"]
    if frames != sizes["T"]:
        raise MotionFileError(
            f"{path}: source frame range [{attrs['source_frame_start']}, {attrs['source_frame_end']}) "
            f"holds {frames} frames but the datasets hold {sizes['T']}"
        )
    fixed = attrs["spikes_fixed"]
    if fixed.ndim != 2 or fixed.shape[1] != 2 or attrs["spikes_original"].shape != (fixed.shape[0],):
        raise MotionFileError(f"{path}: spikes_fixed must be (n, 2) and spikes_original (n,)")
    if len(fixed):
        integral = fixed.dtype.kind in "iu" or bool(np.all(np.asarray(fixed, float) == np.round(fixed)))
        frames_ok = np.all(
            (fixed[:, 0] >= attrs["source_frame_start"]) & (fixed[:, 0] < attrs["source_frame_end"])
        )
        joints_ok = np.all((fixed[:, 1] >= 0) & (fixed[:, 1] < sizes["J"]))
        if not (integral and frames_ok and joints_ok and np.all(np.isfinite(attrs["spikes_original"]))):
            raise MotionFileError(
                f"{path}: spikes_fixed must hold (source frame, joint index) pairs inside the clip, and "
                "spikes_original finite values"
            )
