"""The run folder: what a training run writes into it, the checkpoint written and read back and
checked against a fresh learner, the policy snapshots it holds (:func:`bcg.learn.policy.save_snapshot`
writes them), the folder's lock, and the checks a resume or an ``--init-from`` makes of a stored
config (used by :mod:`bcg.learn.train`)."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import shlex
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np

from bcg.core.atomic import atomic_write, temporary_name_pattern
from bcg.learn.config import TrainConfig
from bcg.learn.config_io import ConfigError, config_from_dict, config_to_dict
from bcg.learn.mlp import flatten_tree, read_tree_h5, rng_from_state, write_tree_h5

CHECKPOINT = "checkpoint.h5"


class UsageError(Exception):
    """A command-line problem reported on stderr with exit status 2."""


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Delete the temporary files a killed run left in ``out`` (``.<name>.<random>.tmp`` beside the
    files of :data:`RUN_FILES`, the policy snapshots and the NaN dumps); returns them."""
    names = (*RUN_FILES, SNAPSHOTS, NAN_DUMPS)
    stale = [p for name in names for p in out.glob(temporary_name_pattern(name))]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


_LOCKS: dict[Path, object] = {}  # the open lock files by folder: a lock lasts while its file is open


def lock_run_folder(out: Path) -> None:
    """Take ``out/train.lock`` (an exclusive ``flock``, released by the OS when the process ends) or
    refuse: a second process on one folder would delete the first one's half-written temporaries and
    interleave their logs and checkpoints. Also checks that the folder is writable."""

    if out.resolve() in _LOCKS:
        return
    try:
        f = (out / LOCK_FILE).open("a")
    except OSError as exc:
        raise UsageError(f"cannot write in the run folder {out}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise UsageError(
            f"{out} is in use by another training process (it holds {out / LOCK_FILE})"
        ) from None
    _LOCKS[out.resolve()] = f


def resume_command(argv: list[str], out: Path) -> str:
    """The command line that resumes this run: this call's arguments without ``--overwrite``,
    ``--init-from``, ``--stop-after`` and ``--resume``, with ``--resume`` and ``--out``."""

    keep, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in ("--overwrite", "--resume"):
            continue
        if name in ("--init-from", "--stop-after", "--out"):
            skip = 0 if "=" in arg else 1
            continue
        keep.append(arg)
    return shlex.join(["python", "-m", "bcg.learn.train", *keep, "--out", str(out), "--resume"])


def write_config(out: Path, cfg: TrainConfig, extra: dict) -> None:
    text = json.dumps({"config": config_to_dict(cfg)} | extra, indent=2, sort_keys=True)
    atomic_write(out / "config.json", lambda p: p.write_text(text + "\n"))


def room_for(out: Path, need: int, what: str, note: str, log=None) -> bool:
    """Whether ``out``'s disk has ``need`` bytes free; if not, say that ``what`` is skipped. HDF5 may
    crash the process on a full disk instead of raising, so writers check first."""
    free = shutil.disk_usage(out).free
    if free >= need:
        return True
    message = f"{what} skipped: {free / 2**20:.0f} MB free in {out}, {need / 2**20:.0f} MB needed {note}"
    (log or (lambda m: sys.stderr.write(m + "\n")))(message.rstrip())
    return False


def save_checkpoint(out: Path, shac, cfg: TrainConfig, motion_hash: str, log=None) -> Path | None:
    """Write the checkpoint atomically. Skipped with a message (None), the previous checkpoint kept,
    when the state holds a non-finite parameter (a resume would refuse it), when the disk lacks room
    for it (HDF5 may crash the process on a full disk instead of raising) or when the write fails."""

    path = out / CHECKPOINT
    state = shac.state_dict(include_replay=cfg.checkpoint_replay)
    leaves = flatten_tree(state)
    what = f"checkpoint at iteration {shac.iteration}"
    say = log or (lambda m: sys.stderr.write(m + "\n"))
    bad = [
        name
        for name, value in leaves.items()
        if name.startswith(_FINITE) and np.asarray(value).dtype.kind == "f" and not np.all(np.isfinite(value))
    ]
    if bad:
        say(f"{what} skipped: {', '.join(bad[:3])} hold non-finite values (the previous checkpoint is kept)")
        return None
    need = sum(np.asarray(v).nbytes for v in leaves.values()) + (16 << 20)
    if not room_for(out, need, what, "(the previous checkpoint is kept)", log):
        return None

    def write(tmp: Path):
        with h5py.File(tmp, "w") as f:
            write_tree_h5(f, state)
            f.attrs["config_json"] = json.dumps(config_to_dict(cfg), sort_keys=True)
            f.attrs["motion_hash"] = motion_hash

    try:
        atomic_write(path, write)
    except OSError as exc:
        say(f"{what} not written: {exc} (the previous checkpoint is kept)")
        return None
    return path


def snapshots_after(out: Path, iteration: int) -> list[Path]:
    """The run's policy snapshots (``policy_it<N>.h5``) with N above ``iteration``."""
    later = []
    for path in out.glob(SNAPSHOTS):
        number = path.stem.removeprefix("policy_it")
        if number.isdigit() and int(number) > iteration:
            later.append(path)
    return sorted(later)


def load_checkpoint(path: Path, action: str = "resume") -> tuple[dict, TrainConfig, str]:
    """The state tree, config and motion hash of a checkpoint; UsageError ("cannot <action>: ...")
    when it is missing or unreadable."""

    if not path.is_file():
        raise UsageError(f"cannot {action}: {path} does not exist")
    try:
        with h5py.File(path, "r") as f:
            state = read_tree_h5(f)
            cfg = config_from_dict(json.loads(f.attrs["config_json"]))
            motion_hash = str(f.attrs["motion_hash"])
    except (OSError, KeyError, ValueError, TypeError, AttributeError, RecursionError, ConfigError) as exc:
        raise UsageError(f"cannot {action}: {path} is not a readable checkpoint ({exc!r})") from None
    except MemoryError:
        raise UsageError(f"cannot {action}: {path} holds a dataset too large to read") from None
    return state, cfg, motion_hash


# what a run writes into its folder (besides nan_dump_* files and the snapshots SNAPSHOTS matches)
RUN_FILES = (CHECKPOINT, "log.csv", "policy.h5", "curves.png", "config.json")
SNAPSHOTS = "policy_it*.h5"  # TrainConfig.policy_every's files, named as `policy export` names them
NAN_DUMPS = "nan_dump_*"  # bcg.learn.nan_guard's dumps of the states around a non-finite event
LOCK_FILE = "train.lock"  # lock_run_folder

# checkpoint leaves whose length may differ from a fresh learner's: the replay buffer's rows
_VARIABLE_LENGTH = {"disc/replay/data"}
# leaves a checkpoint may lack: the count of NaN events, the previous rate action and the failure
# histogram of the start phases (older checkpoints), the replay buffer (``checkpoint_replay=false``),
# the simulator's generators
_OPTIONAL = {
    "nan_events", "disc/replay", "env/prev_rate_action", "env/sim_rng", "env/sim_noise_window",
    "env/start_phases",
}  # fmt: skip
# the learned numbers, which must be finite (the environment's state may hold NaN markers)
_FINITE = (
    "actor/", "actor_opt/", "critic/", "disc/params/", "disc/optimizer/", "obs_rms/", "ret_norm/",
    "optimizer/",  # PPO's one Adam over actor and critic
)  # fmt: skip


def check_checkpoint_state(stored: dict, fresh: dict, prefix: str = "") -> list[str]:
    """Problems of a checkpoint's state tree against a freshly built learner's: missing groups or
    arrays, other shapes or kinds of number, non-finite floats (an empty list when it fits)."""
    problems = []
    for key, ref in fresh.items():
        name = prefix + key
        if key not in stored:
            if name not in _OPTIONAL:
                problems.append(f"{name} is missing")
            continue
        got = stored[key]
        if isinstance(ref, dict):
            if not isinstance(got, dict):
                problems.append(f"{name} is not a group")
            else:
                problems += check_checkpoint_state(got, ref, name + "/")
            continue
        if isinstance(got, dict):
            problems.append(f"{name} is a group, expected an array")
            continue
        ref, got = np.asarray(ref), np.asarray(got)
        if key in ("rng", "sim_rng"):  # a generator's state: JSON text of its own length
            try:
                rng_from_state(got)
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
                problems.append(f"{name} is not a generator state")
            continue
        same_shape = got.shape == ref.shape or (
            name in _VARIABLE_LENGTH and got.ndim == ref.ndim and got.shape[1:] == ref.shape[1:]
        )
        if not same_shape:
            problems.append(f"{name} has shape {got.shape}, expected {ref.shape}")
        elif got.dtype.kind != ref.dtype.kind and not {got.dtype.kind, ref.dtype.kind} <= {"i", "u"}:
            problems.append(f"{name} holds {got.dtype}, expected {ref.dtype}")
        elif got.dtype.kind == "f" and name.startswith(_FINITE) and not np.all(np.isfinite(got)):
            problems.append(f"{name} holds non-finite values")
    replay = (
        stored.get("disc", {}).get("replay") if not prefix and isinstance(stored.get("disc"), dict) else None
    )
    if isinstance(replay, dict) and not problems:
        rows, capacity = np.shape(replay.get("data"))[0], int(replay.get("capacity", -1))
        if not (
            int(replay.get("size", -1)) == rows <= capacity
            and 0 <= int(replay.get("head", -1)) < max(capacity, 1)
        ):
            problems.append(f"disc/replay: size, head and capacity disagree with its {rows} rows")
    return problems


def algo_name(cfg) -> str:
    """ "ppo" for a :class:`bcg.learn.config.PPOConfig`, "shac" for a :class:`TrainConfig`."""
    return getattr(cfg, "algo", "shac")


def _check_resume_config(stored: TrainConfig, requested: TrainConfig) -> None:
    if algo_name(stored) != algo_name(requested):
        raise UsageError(
            f"cannot resume: the checkpoint is of a {algo_name(stored)} run, not {algo_name(requested)} "
            f"(pass --algo {algo_name(stored)})"
        )
    diffs = config_changes(stored, requested)
    if diffs:
        flags = [f"--set {key}={_flag_value(old)}" for key, old, _ in _differences(stored, requested)]
        raise UsageError(
            "cannot resume with a different config: " + "; ".join(diffs)
            + ". To resume the run as it was trained (a default may have changed since), add: "
            + " ".join(flags)
        )  # fmt: skip


def _flag_value(value) -> str:
    """``value`` as ``--set`` parses it back (:func:`bcg.learn.config_io.apply_overrides`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_flag_value(v) for v in value)
    return str(value)


# fields that say how long to run, what to write and where to compute, not how to learn: a resume
# may change them
BOOKKEEPING = ("iterations", "checkpoint_every", "policy_every", "critic_worker")
# fields an --init-from cannot change: the random generators and every array come from the checkpoint
FIXED_ON_INIT = (
    "seed",
    "num_envs",
    "horizon",
    "actor.hidden",
    "critic.hidden",
    "critic.ensemble_size",
    "disc.hidden",
)


def config_changes(stored: TrainConfig, requested: TrainConfig) -> list[str]:
    """``field (checkpoint A, now B)`` for every config field but the :data:`BOOKKEEPING` ones that
    differs."""
    return [f"{key} (checkpoint {a!r}, now {b!r})" for key, a, b in _differences(stored, requested)]


def _differences(stored: TrainConfig, requested: TrainConfig) -> list[tuple[str, object, object]]:
    """(dotted field, stored value, requested value) for every field :func:`config_changes` reports."""
    kept = {k: getattr(requested, k) for k in BOOKKEEPING if hasattr(requested, k) and hasattr(stored, k)}
    a = config_to_dict(dataclasses.replace(stored, **kept))
    b = config_to_dict(requested)
    diffs = []

    def walk(x, y, prefix):
        for key in x:
            if isinstance(x[key], dict):
                walk(x[key], y[key], f"{prefix}{key}.")
            elif x[key] != y[key]:
                diffs.append((f"{prefix}{key}", x[key], y[key]))

    walk(a, b, "")
    return diffs
