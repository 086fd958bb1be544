"""Reading and checking policy files (see :mod:`bcg.learn.policy` for the format).

Every size is checked before anything is read (a small file that declares a huge dataset is refused
from its header), every array must be of a floating type where numbers are stored, and every scalar
must be finite and in range; :func:`bcg.learn.policy.load_policy` then evaluates the actor once and
refuses a policy whose action is not finite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import h5py
import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import KEY_BODY_NAMES, body_names
from bcg.learn.actor import ActorConfig, actor_mlp_spec
from bcg.learn.mlp import Params
from bcg.learn.normalizer import RunningMeanStd
from bcg.learn.observation import OBSERVATION_SIZE, observation_layout_of_model

FORMAT = "bcg-policy"
FORMAT_VERSION = 2  # 2: the checksum covers the actor group's attributes (squash, activation, ...)
READABLE_VERSIONS = (1, 2)
DEFAULT_KAPPA = 300.0  # contact stiffness of the paper's training runs

_ROBOT_ARRAYS = ("default_joint_pos", "action_scale", "kp", "kd", "effort_limit")
_ROOT_ATTRS = (
    "format",
    "format_version",
    "action_mapping",
    "control_dt",
    "physics_dt",
    "kappa",
    "obs_size",
    "motion_name",
    "motion_hash",
    "config_json",
    "bcg_version",
    "git_commit",
    "content_sha256",
)


class PolicyFileError(Exception):
    """A policy file is missing, unreadable, corrupt, or made for another robot description.

    The message names the file and the problem; command lines print it on stderr and exit 2.
    """


_REQUIRED = (
    [
        "actor/hidden",
        "robot/joint_names",
        "robot/key_body_names",
        "robot/key_body_offsets",
        "robot/body_names",
    ]
    + [f"robot/{k}" for k in _ROBOT_ARRAYS]
    + [f"normalizer/{k}" for k in ("mean", "var", "count", "eps")]
    + ["observation/names", "observation/sizes", "observation/noise"]
)


MAX_WIDTH = 16384  # a hidden layer wider than this is a broken file, not a policy
MAX_ELEMENTS = 20_000_000  # the largest dataset read (the paper's actor's largest is 422,400)
_NAME_DATASETS = ("robot/joint_names", "robot/key_body_names", "robot/body_names", "observation/names")
_INTEGER_DATASETS = ("actor/hidden", "observation/sizes")


def _integral(path: Path, what: str, value) -> int:
    """``value`` as an int when it is one exactly (no bool, no fraction, no text)."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyFileError(f"{path}: {what} must be an integer, got {value!r}")
    if float(value) != int(value):
        raise PolicyFileError(f"{path}: {what} must be an integer, got {value!r}")
    return int(value)


def _flag(path: Path, what: str, value) -> bool:
    """A stored boolean: True/False or 0/1, nothing else."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise PolicyFileError(f"{path}: {what} must be a boolean, got {value!r}")


def _dataset(path: Path, name: str, obj: h5py.Dataset) -> Any:
    """A dataset's value, its size and type checked from the header before anything is read."""
    shape = obj.shape
    if shape is None:
        raise PolicyFileError(f"{path}: dataset {name!r} holds no data")
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise PolicyFileError(f"{path}: dataset {name!r} declares shape {shape}, beyond any policy")
    if h5py.check_string_dtype(obj.dtype) is not None:
        if name not in _NAME_DATASETS:
            raise PolicyFileError(f"{path}: dataset {name!r} holds text, numbers were expected")
        return tuple(obj.asstr()[()])
    kind = obj.dtype.kind
    if name in _NAME_DATASETS:
        raise PolicyFileError(f"{path}: dataset {name!r} must hold names, not {obj.dtype}")
    if name in _INTEGER_DATASETS or name == "normalizer/count":
        if kind not in "iuf":
            raise PolicyFileError(f"{path}: dataset {name!r} must hold numbers, not {obj.dtype}")
    elif kind != "f" or obj.dtype.itemsize < 4:
        raise PolicyFileError(f"{path}: dataset {name!r} is {obj.dtype}; float32 or float64 expected")
    value = np.array(obj[()])
    return value.astype(value.dtype.newbyteorder("="), copy=False)  # native byte order


def read_file(path: Path, f: h5py.File) -> tuple[dict[str, Any], dict, dict]:
    """The file's datasets (flat names), root attributes and the actor group's attributes."""
    missing_attrs = [a for a in _ROOT_ATTRS if a not in f.attrs]
    if "format" in f.attrs and f.attrs["format"] != FORMAT:
        raise PolicyFileError(f"{path}: not a bcg policy file (format {f.attrs['format']!r})")
    if missing_attrs:
        raise PolicyFileError(f"{path}: missing attribute(s) {', '.join(missing_attrs)}")
    if _integral(path, "format_version", f.attrs["format_version"]) not in READABLE_VERSIONS:
        raise PolicyFileError(
            f"{path}: format version {f.attrs['format_version']} is not supported "
            f"(this code reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
    for name in _REQUIRED + ["actor/params/w_out", "actor/params/b_out", "actor/params/log_std"]:
        if name not in f:
            raise PolicyFileError(f"{path}: missing dataset {name!r}")
        if not isinstance(f[name], h5py.Dataset):
            raise PolicyFileError(f"{path}: {name!r} must be a dataset")
    flat: dict[str, Any] = {}
    datasets: list[tuple[str, h5py.Dataset]] = []
    f.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    for name, obj in datasets:
        flat[name] = _dataset(path, name, obj)
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    actor_attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["actor"].attrs.items()}
    return flat, attrs, actor_attrs


def _finite_attr(path: Path, attrs: dict, name: str) -> float:
    value = attrs[name]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyFileError(f"{path}: attribute {name} must be a finite number, got {value!r}")
    return float(value)


def check_config(path: Path, attrs: dict) -> dict:
    """The stored training config: a JSON object; kappa finite and positive."""

    try:
        config = json.loads(attrs["config_json"])
    except (ValueError, TypeError, RecursionError) as exc:
        raise PolicyFileError(f"{path}: unreadable config_json: {type(exc).__name__}") from None
    if not isinstance(config, dict):
        raise PolicyFileError(f"{path}: config_json must hold a JSON object, got {type(config).__name__}")
    if not _finite_attr(path, attrs, "kappa") > 0:
        raise PolicyFileError(f"{path}: kappa must be positive, got {attrs['kappa']!r}")
    return config


def same_names(path: Path, what: str, got: tuple[str, ...], expected: tuple[str, ...]) -> None:
    if tuple(got) == tuple(expected):
        return
    if sorted(got) == sorted(expected):
        i = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
        raise PolicyFileError(
            f"{path}: {what} order differs from the G1's: "
            f"position {i} is {got[i]!r}, expected {expected[i]!r}"
        )
    raise PolicyFileError(
        f"{path}: {what} do not match the G1's (file has {len(got)}: "
        f"extra {sorted(set(got) - set(expected))}, missing {sorted(set(expected) - set(got))})"
    )


def check_robot(path: Path, flat: dict, attrs: dict, model: mujoco.MjModel) -> None:
    same_names(path, "joint names", flat["robot/joint_names"], g1.JOINT_NAMES)
    g1.joint_qpos_adr(model)  # the model holds every joint
    same_names(path, "key body names", flat["robot/key_body_names"], KEY_BODY_NAMES)
    same_names(path, "body names", flat["robot/body_names"], body_names(model))
    offsets = np.array([o for _, _, o in g1.KEY_BODIES])
    if np.shape(flat["robot/key_body_offsets"]) != offsets.shape or not np.allclose(
        flat["robot/key_body_offsets"], offsets, rtol=0, atol=1e-9
    ):
        raise PolicyFileError(f"{path}: key body offsets differ from g1.KEY_BODIES")
    if attrs["action_mapping"] != g1.ACTION_MAPPING:
        raise PolicyFileError(
            f"{path}: action mapping {attrs['action_mapping']!r}, the G1 uses {g1.ACTION_MAPPING!r}"
        )
    for name, expected in (("control_dt", g1.CONTROL_DT), ("physics_dt", g1.PHYSICS_DT)):
        if abs(_finite_attr(path, attrs, name) - expected) > 1e-12:
            raise PolicyFileError(f"{path}: {name} is {float(attrs[name])} s, the G1 runs at {expected} s")
    reference = {"action_scale": g1.ACTION_SCALE, "kp": g1.KP, "kd": g1.KD, "effort_limit": g1.EFFORT_LIMIT}
    reference["default_joint_pos"] = g1.DEFAULT_JOINT_POS
    for name, expected in reference.items():
        got = flat[f"robot/{name}"]
        if got.shape != expected.shape:
            raise PolicyFileError(f"{path}: robot/{name} has shape {got.shape}, expected {expected.shape}")
        bad = ~np.isclose(got, expected, rtol=1e-9, atol=1e-12)
        if np.any(bad):
            j = int(np.argmax(bad))
            raise PolicyFileError(
                f"{path}: robot/{name} of {g1.JOINT_NAMES[j]} is {got[j]}, the G1 module has {expected[j]}"
            )
    names, sizes = flat["observation/names"], flat["observation/sizes"]
    layout = observation_layout_of_model(model)
    expected_names = tuple(b.name for b in layout)
    if tuple(names) != expected_names or [int(s) for s in sizes] != [b.size for b in layout]:
        raise PolicyFileError(
            f"{path}: observation layout {list(zip(names, [int(s) for s in sizes], strict=False))} "
            f"differs from this code's {[(b.name, b.size) for b in layout]}"
        )
    noise = flat["observation/noise"]
    if not (np.all(np.isfinite(noise)) and np.all(noise >= 0)):
        raise PolicyFileError(f"{path}: observation/noise must be finite and >= 0")
    if _integral(path, "obs_size", attrs["obs_size"]) != OBSERVATION_SIZE:
        raise PolicyFileError(
            f"{path}: observation size {int(attrs['obs_size'])}, this code builds {OBSERVATION_SIZE}"
        )


def check_actor(path: Path, flat: dict, attrs: dict, actor_attrs: dict, params: Params) -> ActorConfig:
    stored = flat["actor/hidden"]
    if np.ndim(stored) != 1:
        raise PolicyFileError(f"{path}: actor/hidden must be a list of widths, got shape {np.shape(stored)}")
    hidden = tuple(_integral(path, "actor/hidden", h) for h in stored)
    if not all(1 <= h <= MAX_WIDTH for h in hidden):
        raise PolicyFileError(f"{path}: actor/hidden {hidden}: widths must be within 1-{MAX_WIDTH}")
    # files from before PPO all hold LayerNorm actors (SHAC's); the attribute says which
    layer_norm = _flag(path, "actor layer_norm", actor_attrs.get("layer_norm", True))
    actor_config = ActorConfig(
        hidden=hidden,
        squash=_flag(path, "actor squash", actor_attrs.get("squash", False)),
        layer_norm=layer_norm,
    )
    spec = actor_mlp_spec(actor_config, OBSERVATION_SIZE, g1.NUM_JOINTS)
    if actor_attrs.get("activation") != spec.activation:
        raise PolicyFileError(
            f"{path}: actor activation {actor_attrs.get('activation')} differs from this code's "
            f"{spec.activation}"
        )
    expected = _actor_shapes(spec)
    dtypes = {params[name].dtype for name in expected if name in params}
    if len(dtypes) > 1:
        raise PolicyFileError(f"{path}: the actor's arrays mix dtypes {sorted(map(str, dtypes))}")
    for name, shape in expected.items():
        if name not in params:
            raise PolicyFileError(f"{path}: missing dataset 'actor/params/{name}'")
        if params[name].shape != shape:
            raise PolicyFileError(
                f"{path}: actor/params/{name} has shape {params[name].shape}, expected {shape} "
                f"(observation size {OBSERVATION_SIZE}, {g1.NUM_JOINTS} actions, hidden {hidden})"
            )
        if not np.all(np.isfinite(params[name])):
            raise PolicyFileError(f"{path}: actor/params/{name} holds non-finite values")
    extra = sorted(set(params) - set(expected))
    if extra:
        raise PolicyFileError(f"{path}: unexpected actor arrays {extra}")
    return actor_config


def _actor_shapes(spec) -> dict[str, tuple[int, ...]]:
    """The actor's array shapes (:func:`bcg.learn.actor.actor_init`'s), computed, not allocated."""
    shapes: dict[str, tuple[int, ...]] = {}
    fan_in = spec.in_dim
    for i, width in enumerate(spec.hidden):
        shapes[f"w{i}"], shapes[f"b{i}"] = (fan_in, width), (width,)
        if spec.layer_norm:
            shapes[f"ln_gain{i}"], shapes[f"ln_bias{i}"] = (width,), (width,)
        fan_in = width
    shapes["w_out"], shapes["b_out"], shapes["log_std"] = (
        (fan_in, spec.out_dim),
        (spec.out_dim,),
        (spec.out_dim,),
    )
    return shapes


def check_normalizer(path: Path, normalizer: RunningMeanStd) -> None:
    for name in ("mean", "var"):
        value = getattr(normalizer, name)
        if value.shape != (OBSERVATION_SIZE,):
            raise PolicyFileError(
                f"{path}: normalizer/{name} has shape {value.shape}, expected ({OBSERVATION_SIZE},)"
            )
        if not np.all(np.isfinite(value)):
            raise PolicyFileError(f"{path}: normalizer/{name} holds non-finite values")
    if np.any(normalizer.var < 0) or not 0 < normalizer.eps <= 1:
        raise PolicyFileError(f"{path}: normaliser variance must be >= 0 and eps within (0, 1]")
    if not (np.isfinite(normalizer.count) and normalizer.count >= 0):
        raise PolicyFileError(f"{path}: normaliser count must be finite and >= 0, got {normalizer.count}")
