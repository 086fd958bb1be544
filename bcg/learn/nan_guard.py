"""Keeping non-finite values away from the parameters, and recording where they came from.

The learner calls :meth:`NanGuard.record` after every control step (a ring buffer of the last
``ring_size`` steps' states and actions) and :meth:`NanGuard.trip` when a state, reward, loss or
gradient is not finite. The caller then skips every update of the iteration and resets the affected
envs; the guard logs the event and writes the ring buffer to ``nan_dump_<iteration>.h5`` (written to
a temporary file, then renamed), with datasets ``qpos (R, N, nq)``, ``qvel (R, N, nv)``,
``actions (R, N, A)``, ``iteration (R,)``, ``step (R,)`` oldest first, ``bad_envs (N,)`` and the
reason as an attribute.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import h5py
import numpy as np

from bcg.core.atomic import atomic_write


class NanGuard:
    """Ring buffer of recent states and the non-finite event counter.

    Args:
        ring_size: control steps kept.
        dump_dir: folder for dumps (None: log only).
        log: ``log(message)``.
    """

    def __init__(self, ring_size: int, dump_dir: str | Path | None = None, log=print):
        self.ring: collections.deque = collections.deque(maxlen=max(1, int(ring_size)))
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.log = log
        self.count = 0
        self.last_dump: Path | None = None

    def record(
        self, iteration: int, step: int, qpos: np.ndarray, qvel: np.ndarray, actions: np.ndarray
    ) -> None:
        """Keep copies of one control step's state (after the step) and actions."""
        self.ring.append((int(iteration), int(step), np.array(qpos), np.array(qvel), np.array(actions)))

    def trip(self, iteration: int, reason: str, bad_envs: np.ndarray) -> Path | None:
        """Count and log a non-finite event; dump the ring buffer. Returns the dump path, if any."""
        self.count += 1
        bad = np.flatnonzero(bad_envs)
        shown = ", ".join(str(e) for e in bad[:10]) + (" ..." if len(bad) > 10 else "")
        path = (
            self._dump(iteration, reason, np.asarray(bad_envs, bool)) if self.dump_dir is not None else None
        )
        where = f"; recent states in {path}" if path is not None else ""
        self.log(
            f"non-finite value at iteration {iteration}: {reason}; update skipped, "
            f"{len(bad)} env(s) reset [{shown}]{where}"
        )
        return path

    def _dump(self, iteration: int, reason: str, bad_envs: np.ndarray) -> Path | None:
        if not self.ring:
            return None
        path = self.dump_dir / f"nan_dump_{iteration:06d}.h5"
        rows = list(self.ring)
        need = sum(a.nbytes for r in rows for a in r[2:]) + (4 << 20)
        try:  # HDF5 may crash the process on a full disk instead of raising: check the room first
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.dump_dir).free
        except OSError as exc:
            self.log(f"{path.name} not written: {exc}")
            return None
        if free < need:
            self.log(f"{path.name} not written: {free / 2**20:.0f} MB free, {need / 2**20:.0f} MB needed")
            return None

        def write(tmp: Path) -> None:
            with h5py.File(tmp, "w") as f:
                f.create_dataset("iteration", data=np.array([r[0] for r in rows], np.int64))
                f.create_dataset("step", data=np.array([r[1] for r in rows], np.int64))
                for i, name in enumerate(("qpos", "qvel", "actions")):
                    f.create_dataset(name, data=np.stack([r[2 + i] for r in rows]))
                f.create_dataset("bad_envs", data=bad_envs)
                f.attrs["reason"] = reason

        try:
            atomic_write(path, write)
        except OSError as exc:  # a dump is for inspection; training goes on without it
            self.log(f"{path.name} not written: {exc}")
            return None
        self.last_dump = path
        return path
