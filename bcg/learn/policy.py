"""The self-describing policy file (``policy.h5``) and deterministic inference.

One file carries everything that the MuJoCo validation and the robot client need, and everything
that lets them refuse a policy made for another robot description:

===============================  ==============================================================
``actor/params/<name>``          actor arrays (MLP keys of :mod:`bcg.learn.mlp` plus ``log_std``)
``actor/hidden``                 hidden widths; attrs ``squash``, ``activation``, ``layer_norm``
``normalizer/{mean,var,count,eps}``  observation normaliser (:class:`RunningMeanStd` state)
``robot/joint_names``            joint order of actions and observations (:data:`g1.JOINT_NAMES`)
``robot/key_body_names``         key bodies; ``robot/key_body_offsets`` (5, 3) m
``robot/body_names``             model bodies without the world body
``robot/{default_joint_pos,action_scale,kp,kd,effort_limit}``  (29,) each, SI units
``observation/{names,sizes,noise}``  observation layout (:data:`OBSERVATION_LAYOUT`)
root attributes                  format, format_version, action_mapping, control_dt, physics_dt,
                                 kappa, obs_size, motion_name, motion_hash, config_json,
                                 bcg_version, git_commit, content_sha256; optional
                                 ``trained_iterations`` (SHAC iterations behind the weights)
===============================  ==============================================================

``content_sha256`` is a digest of every dataset, every root attribute and (format version 2; version
1 files, which lack it, still load) the actor group's attributes, so flipped bytes that HDF5 would
still read, or a flipped ``squash``, are caught. A dataset or attribute of the wrong type or shape is
refused with :class:`PolicyFileError` like any other bad file. :func:`save_policy` writes a temporary
file, loads it back through :func:`load_policy` and only then renames it into place: a failed save
leaves no file and no saved file is unloadable.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import mujoco
import numpy as np

import bcg
from bcg.core import g1
from bcg.core.atomic import atomic_write
from bcg.core.kinematics import KEY_BODY_NAMES, body_names, g1_model
from bcg.learn.actor import ActorConfig, actor_init, actor_mean, actor_mlp_spec
from bcg.learn.config import TrainConfig
from bcg.learn.config_io import config_to_dict
from bcg.learn.mlp import Params
from bcg.learn.normalizer import RunningMeanStd
from bcg.learn.observation import OBSERVATION_LAYOUT, OBSERVATION_SIZE
from bcg.learn.policy_checks import (  # PolicyFileError is re-exported: callers import it from here
    DEFAULT_KAPPA,
    FORMAT,
    FORMAT_VERSION,
    PolicyFileError,
    check_actor,
    check_config,
    check_normalizer,
    check_robot,
    read_file,
)
from bcg.learn.runfolder import CHECKPOINT, UsageError, load_checkpoint, room_for
from bcg.learn.stages import config_at
from bcg.motion.clip import MotionClip
from bcg.motion.errors import MotionFileError


@dataclass(frozen=True)
class Policy:
    """A loaded policy: deterministic actions and joint targets.

    Attributes:
        path: the file read.
        actor_config: network shape (hidden widths, squash).
        params: actor arrays (read-only).
        normalizer: observation statistics (mean, var (825,), count, eps).
        default_joint_pos: rad (29,), pose that action 0 asks for.
        action_scale, kp, kd, effort_limit: (29,) rad, N m/rad, N m s/rad, N m.
        control_dt, physics_dt: s.
        kappa: contact stiffness the policy was trained with.
        motion_name, motion_hash: the reference motion and the sha256 of its clip's arrays.
        config: the training run's full resolved config.
        bcg_version, git_commit: code that wrote the file.
        trained_iterations: SHAC iterations behind the weights (None: not recorded, e.g. a hold
            policy or a file written before the attribute existed).
    """

    path: Path
    actor_config: ActorConfig
    params: Params
    normalizer: RunningMeanStd
    default_joint_pos: np.ndarray
    action_scale: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    effort_limit: np.ndarray
    control_dt: float
    physics_dt: float
    kappa: float
    motion_name: str
    motion_hash: str
    config: dict
    bcg_version: str
    git_commit: str
    trained_iterations: int | None = None

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic action (..., 29) from raw observations (..., 825): normalise, actor mean.

        Uses the training code's own :meth:`RunningMeanStd.normalize` and :func:`actor_mean`.
        """
        obs = np.asarray(obs)
        if obs.shape[-1:] != (OBSERVATION_SIZE,):
            raise ValueError(f"observation must end in ({OBSERVATION_SIZE},), got {obs.shape}")
        normalized = self.normalizer.normalize(obs, dtype=self.params["w_out"].dtype)
        return actor_mean(self.actor_config, self.params, normalized)

    def targets(self, action: np.ndarray) -> np.ndarray:
        """Joint position targets in rad (..., 29) of actions (..., 29), with the stored default pose."""
        return g1.action_to_target(action, self.default_joint_pos)


# ---------------------------------------------------------------------------------------------------
# Writing


def git_commit() -> str:
    """Commit hash of the source tree this package runs from ("unknown" outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(bcg.__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _json_default(value: Any):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"config value {value!r} of type {type(value).__name__} is not JSON serialisable")


def _config_json(config) -> str:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = config_to_dict(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or a dataclass instance, got {type(config).__name__}")
    return json.dumps(config, sort_keys=True, default=_json_default)


def _actor_attrs(actor_config: ActorConfig) -> dict:
    """The attributes of the ``actor`` group: how the network's numbers are to be used."""
    spec = actor_mlp_spec(actor_config, 1, 1)
    return {
        "squash": bool(actor_config.squash),
        "activation": spec.activation,
        "layer_norm": bool(spec.layer_norm),
    }


def _digest(flat: dict[str, Any], attrs: dict, actor_attrs: dict | None = None) -> str:
    """sha256 over every dataset (name, dtype, shape and bytes; strings as their text), every root
    attribute but the digest itself and (from format version 2 on) the ``actor`` group's attributes
    (as text)."""
    h = hashlib.sha256()
    for name in sorted(set(attrs) - {"content_sha256"}):
        h.update(f"{name}={attrs[name]}".encode() + b"\0")
    for name in sorted(actor_attrs or {}):
        value = actor_attrs[name]
        value = value.decode() if isinstance(value, bytes) else value
        value = bool(value) if isinstance(value, np.bool_) else value
        h.update(f"actor@{name}={value}".encode() + b"\0")
    for name in sorted(flat):
        value = flat[name]
        h.update(name.encode() + b"\0")
        if isinstance(value, tuple):
            h.update("\0".join(value).encode() + b"\1")
        else:
            value = np.ascontiguousarray(value)
            h.update(f"{value.dtype.str}{value.shape}".encode())
            h.update(value.tobytes())
    return h.hexdigest()


def save_policy(
    path: str | Path,
    *,
    actor_config: ActorConfig,
    actor_params: Params,
    normalizer: RunningMeanStd,
    motion_name: str,
    motion_hash: str,
    config,
    kappa: float = DEFAULT_KAPPA,
    default_joint_pos: np.ndarray = g1.DEFAULT_JOINT_POS,
    trained_iterations: int | None = None,
) -> Path:
    """Write a policy file atomically (temporary file, validated by :func:`load_policy`, renamed).

    Args:
        path: target ``.h5`` file; its folder must exist.
        actor_config: the actor's config (hidden widths, squash).
        actor_params: actor arrays from :func:`bcg.learn.actor.actor_init` / training.
        normalizer: the observation normaliser's current statistics.
        motion_name: reference motion name (e.g. "run").
        motion_hash: ``MotionClip.content_hash`` of that motion.
        config: the full resolved training config (dataclass instance or dict), stored as JSON.
        kappa: contact stiffness trained with.
        default_joint_pos: rad (29,), the pose of action 0.
        trained_iterations: SHAC iterations behind the weights, stored when given.

    Returns:
        The path written.

    Raises:
        PolicyFileError: the arguments do not make a valid policy (nothing is written).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise PolicyFileError(f"{path}: folder {path.parent} does not exist")
    try:
        config_json = _config_json(config)
    except (TypeError, ValueError) as exc:
        raise PolicyFileError(f"{path}: config cannot be stored as JSON ({exc})") from exc
    flat: dict[str, Any] = {f"actor/params/{k}": np.asarray(v) for k, v in actor_params.items()}
    flat["actor/hidden"] = np.asarray(actor_config.hidden, dtype=np.int64)
    flat |= {f"normalizer/{k}": np.asarray(v) for k, v in normalizer.state_dict().items()}
    flat["robot/joint_names"] = tuple(g1.JOINT_NAMES)
    flat["robot/key_body_names"] = KEY_BODY_NAMES
    flat["robot/key_body_offsets"] = np.array([o for _, _, o in g1.KEY_BODIES], dtype=np.float64)
    flat["robot/body_names"] = body_names(g1_model())
    robot = dict(
        default_joint_pos=default_joint_pos,
        action_scale=g1.ACTION_SCALE,
        kp=g1.KP,
        kd=g1.KD,
        effort_limit=g1.EFFORT_LIMIT,
    )
    flat |= {f"robot/{k}": np.asarray(v, dtype=np.float64) for k, v in robot.items()}
    flat["observation/names"] = tuple(b.name for b in OBSERVATION_LAYOUT)
    flat["observation/sizes"] = np.array([b.size for b in OBSERVATION_LAYOUT], dtype=np.int64)
    flat["observation/noise"] = np.array([b.noise for b in OBSERVATION_LAYOUT], dtype=np.float64)
    attrs = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "action_mapping": g1.ACTION_MAPPING,
        "control_dt": float(g1.CONTROL_DT),
        "physics_dt": float(g1.PHYSICS_DT),
        "kappa": float(kappa),
        "obs_size": OBSERVATION_SIZE,
        "motion_name": str(motion_name),
        "motion_hash": str(motion_hash),
        "config_json": config_json,
        "bcg_version": bcg.__version__,
        "git_commit": git_commit(),
    }
    if trained_iterations is not None:
        if int(trained_iterations) != trained_iterations or trained_iterations < 0:
            raise PolicyFileError(f"{path}: trained_iterations must be a count, got {trained_iterations!r}")
        attrs["trained_iterations"] = int(trained_iterations)
    attrs["content_sha256"] = _digest(flat, attrs, _actor_attrs(actor_config))

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            _write(f, flat, attrs, actor_config)
        load_policy(tmp)  # read back before it replaces anything

    try:
        atomic_write(path, write)
    except PolicyFileError as exc:
        raise PolicyFileError(f"{path}: not saved, the policy is invalid: {exc}") from exc
    return path


def _write(f: h5py.File, flat: dict[str, Any], attrs: dict, actor_config: ActorConfig) -> None:
    for name, value in flat.items():
        if isinstance(value, tuple):
            f.create_dataset(name, data=list(value), dtype=h5py.string_dtype())
        else:
            f.create_dataset(name, data=value)
    for name, value in _actor_attrs(actor_config).items():
        f["actor"].attrs[name] = value
    for name, value in attrs.items():
        f.attrs[name] = value


# ---------------------------------------------------------------------------------------------------
# Reading and validation


def load_policy(path: str | Path, model: mujoco.MjModel | None = None) -> Policy:
    """Read a policy file and check it against the G1 module and ``model``.

    Args:
        path: the ``.h5`` file.
        model: compiled G1 model to check joint and body names against (default: the shipped G1).

    Raises:
        PolicyFileError: missing, truncated or corrupt file, missing dataset or attribute, or a
            file that disagrees with the G1 module or the model (joint order, key bodies, bodies,
            gains, action mapping, control rate, observation layout or size).
    """
    path = Path(path)
    if path.is_dir():
        raise PolicyFileError(f"{path}: is a folder, not a policy file")
    if not path.is_file():
        raise PolicyFileError(f"{path}: no such policy file")
    try:
        with h5py.File(path, "r") as f:
            flat, attrs, actor_attrs = read_file(path, f)
    except PolicyFileError:
        raise
    except MemoryError:
        raise PolicyFileError(f"{path}: a dataset is too large to read") from None
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise PolicyFileError(
            f"{path}: not a readable HDF5 policy file (corrupt or truncated?): {exc}"
        ) from exc
    try:
        check_robot(path, flat, attrs, model if model is not None else g1_model())
        prefix = "actor/params/"
        raw_params = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
        actor_config = check_actor(path, flat, attrs, actor_attrs, raw_params)
        config = check_config(path, attrs)
        try:
            normalizer = RunningMeanStd.from_state_dict(
                {k: flat[f"normalizer/{k}"] for k in ("mean", "var", "count", "eps")}
            )
        except (KeyError, ValueError) as exc:
            raise PolicyFileError(f"{path}: unreadable normaliser: {exc}") from exc
        check_normalizer(path, normalizer)
        # last, so that a consistent file made for another robot description gets the specific message
        covered = actor_attrs if int(attrs["format_version"]) >= 2 else None
        if attrs["content_sha256"] != _digest(flat, attrs, covered):
            raise PolicyFileError(f"{path}: content checksum mismatch, the file is corrupt")
        scalars = {k: float(attrs[k]) for k in ("control_dt", "physics_dt", "kappa")}
        trained = attrs.get("trained_iterations")
        if trained is not None:
            if not isinstance(trained, (int, np.integer)) or trained < 0:
                raise PolicyFileError(f"{path}: trained_iterations must be a count, got {trained!r}")
            trained = int(trained)
    except PolicyFileError:
        raise
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        # a dataset or attribute of the wrong type or shape, e.g. gains stored as text
        raise PolicyFileError(f"{path}: malformed policy file: {type(exc).__name__}: {exc}") from exc
    for array in raw_params.values():
        array.flags.writeable = False
    policy = Policy(
        path=path,
        actor_config=actor_config,
        params=raw_params,
        normalizer=normalizer,
        default_joint_pos=flat["robot/default_joint_pos"],
        action_scale=flat["robot/action_scale"],
        kp=flat["robot/kp"],
        kd=flat["robot/kd"],
        effort_limit=flat["robot/effort_limit"],
        control_dt=scalars["control_dt"],
        physics_dt=scalars["physics_dt"],
        kappa=scalars["kappa"],
        motion_name=str(attrs["motion_name"]),
        motion_hash=str(attrs["motion_hash"]),
        config=config,
        bcg_version=str(attrs["bcg_version"]),
        git_commit=str(attrs["git_commit"]),
        trained_iterations=trained,
    )
    # finite weights can still overflow: the action at the normaliser's mean and at zero must be finite
    with np.errstate(all="ignore"):
        probe = policy.act(np.stack([normalizer.mean, np.zeros(OBSERVATION_SIZE)]).astype(np.float64))
    if not np.all(np.isfinite(probe)):
        raise PolicyFileError(f"{path}: the actor's action is not finite (its weights overflow)")
    return policy


# ---------------------------------------------------------------------------------------------------
# The hold policy


def make_hold_policy(
    path: str | Path,
    motion: str = "run",
    motion_hash: str | None = None,
    kappa: float = DEFAULT_KAPPA,
    seed: int = 0,
    env: dict | None = None,
) -> Path:
    """Write a genuine policy file whose actor outputs exactly zero: it holds the default pose.

    The stand-in used by the robot client and the MuJoCo validation before a trained policy exists.
    The hidden layers are initialised as for training; the output layer is zero.

    Args:
        path: target ``.h5`` file.
        motion: motion name recorded in the file.
        motion_hash: that clip's content hash; default: read from ``MotionClip.load(motion)``.
        kappa: contact stiffness recorded in the file.
        seed: seed of the hidden layers' initialisation.
        env: training env settings to record (e.g. ``{"clip_lead_in": 1.0}``), which the consumers
            of a policy read from its config as from a trained one's.
    """
    if motion_hash is None:
        motion_hash = MotionClip.load(motion).content_hash
    actor_config = ActorConfig()
    params = actor_init(actor_config, OBSERVATION_SIZE, g1.NUM_JOINTS, np.random.default_rng(seed))
    params["w_out"][:] = 0.0
    params["b_out"][:] = 0.0
    config = {"kind": "hold", "actor": dataclasses.asdict(actor_config), "seed": seed, "motion": motion}
    if env is not None:
        config["env"] = dict(env)
    return save_policy(
        path,
        actor_config=actor_config,
        actor_params=params,
        normalizer=RunningMeanStd.new(OBSERVATION_SIZE),
        motion_name=motion,
        motion_hash=motion_hash,
        config=config,
        kappa=kappa,
    )


def export_policy(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the policy of a training run's latest checkpoint, finished or not.

    Training writes ``policy.h5`` only when it reaches its last iteration; this gives the policy of
    any checkpoint (a run stopped with ``--stop-after`` or Ctrl-C, or one still training) for the
    MuJoCo validation or the robot, recording the iterations behind it (``trained_iterations``).

    Args:
        run: a run folder (its ``checkpoint.h5`` is read) or a checkpoint file.
        out: the policy file to write; default ``policy_it<iteration>.h5`` beside the checkpoint.
            An existing file is not replaced.

    Raises:
        PolicyFileError: no readable checkpoint, an existing ``out``, or a checkpoint whose actor or
            normaliser does not make a valid policy (non-finite weights, other shapes); nothing is
            written then.
    """
    run = Path(run)
    path = run / CHECKPOINT if run.is_dir() else run
    try:
        state, cfg, motion_hash = load_checkpoint(path, action="export")
    except UsageError as exc:
        raise PolicyFileError(str(exc)) from None
    try:
        iteration = int(state["iteration"])
        params = {k: np.asarray(v) for k, v in state["actor"].items()}
        normalizer = RunningMeanStd.from_state_dict(state["obs_rms"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PolicyFileError(f"cannot export: {path} lacks the actor or its normaliser ({exc!r})") from None
    out = Path(out) if out is not None else path.parent / f"policy_it{iteration}.h5"
    if out.exists():
        raise PolicyFileError(f"cannot export: {out} exists (choose another file with --out)")
    return save_run_policy(out, cfg, params, normalizer, motion_hash, iteration)


def save_run_policy(
    path, cfg, actor_params: Params, normalizer: RunningMeanStd, motion_hash: str, iteration: int
):
    """:func:`save_policy` for a training run: actor shape, motion, kappa and config from its
    :class:`bcg.learn.config.TrainConfig`, with the iterations behind the weights and the
    environment their last iteration trained in (``env_stages``)."""
    cfg = config_at(cfg, iteration - 1)
    return save_policy(
        path,
        actor_config=cfg.actor,
        actor_params=actor_params,
        normalizer=normalizer,
        motion_name=Path(cfg.env.motion).stem,
        motion_hash=motion_hash,
        config=config_to_dict(cfg),
        kappa=cfg.env.contact.kappa,
        trained_iterations=iteration,
    )


def save_snapshot(out: Path, shac, cfg: TrainConfig, motion_hash: str, log=None) -> Path | None:
    """Write the actor as it is now to ``policy_it<N>.h5`` (``TrainConfig.policy_every``); a failed
    write (a full disk) is logged and training goes on, with no partial file left."""
    path = out / f"policy_it{shac.iteration}.h5"
    need = sum(np.asarray(v).nbytes for v in shac.actor.values()) * 2 + (16 << 20)
    if not room_for(out, need, f"policy snapshot {path.name}", "", log):
        return None
    try:
        return save_run_policy(path, cfg, shac.actor, shac.obs_rms, motion_hash, shac.iteration)
    except (OSError, PolicyFileError) as exc:
        (log or (lambda m: sys.stderr.write(m + "\n")))(f"policy snapshot {path.name} not written: {exc}")
        return None


def describe(policy: Policy) -> str:
    """A short human-readable summary of a loaded policy."""
    n_params = sum(int(v.size) for v in policy.params.values())
    return "\n".join(
        [
            f"policy {policy.path}",
            f"  actor: hidden {list(policy.actor_config.hidden)}, squash {policy.actor_config.squash}, "
            f"{n_params} parameters",
            f"  observation: {OBSERVATION_SIZE} dims, normaliser count {policy.normalizer.count:g}",
            f"  motion: {policy.motion_name} ({policy.motion_hash[:12]})",
            f"  control dt {policy.control_dt} s, physics dt {policy.physics_dt} s, kappa {policy.kappa:g}",
            f"  written by bcg {policy.bcg_version}, commit {policy.git_commit[:12]}",
            *(
                [f"  trained for {policy.trained_iterations} iterations"]
                if policy.trained_iterations is not None
                else []
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bcg.learn.policy {hold,show,export} ...``: write a hold policy, describe a file, or
    write the policy of a training run's checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m bcg.learn.policy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    hold = sub.add_parser("hold", help="write a policy that holds the default pose")
    hold.add_argument("path", type=Path)
    hold.add_argument("--motion", default="run", help="motion name recorded in the file (default: run)")
    hold.add_argument("--motion-hash", default=None, help="content hash (default: read the clip)")
    hold.add_argument("--kappa", type=float, default=DEFAULT_KAPPA)
    show = sub.add_parser("show", help="validate a policy file and print a summary")
    show.add_argument("path", type=Path)
    export = sub.add_parser("export", help="write the policy of a run's checkpoint (finished or not)")
    export.add_argument("run", type=Path, help="run folder (or its checkpoint.h5)")
    export.add_argument("--out", type=Path, help="policy file (default: policy_it<iteration>.h5 in the run)")
    args = parser.parse_args(argv)
    try:
        if args.command == "hold":
            written = make_hold_policy(args.path, args.motion, args.motion_hash, args.kappa)
            print(describe(load_policy(written)))
        elif args.command == "export":
            print(describe(load_policy(export_policy(args.run, args.out))))
        else:
            print(describe(load_policy(args.path)))
    except (PolicyFileError, MotionFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
