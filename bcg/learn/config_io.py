"""``--set`` overrides and the dictionaries a run folder and a policy file store of a config.

The config classes themselves are in :mod:`bcg.learn.config`; this module turns them into plain
dictionaries and back (old run folders and policy files included), and applies ``--set
group.field=value`` overrides with a clear error for an unknown field or a wrong type.
"""

from __future__ import annotations

import dataclasses
import math

from bcg.learn.config import (
    ENV_GROUPS,
    FLAT_NAMES,
    ActorConfig,
    ContactConfig,
    CriticConfig,
    DiscriminatorConfig,
    EnvConfig,
    PPOConfig,
    TrainConfig,
)


class ConfigError(ValueError):
    """A ``--set`` override names no field or holds a value of the wrong type."""


def _parse_scalar(text: str, like, name: str):
    text = text.strip()
    if isinstance(like, bool):
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {text!r}")
    try:
        if isinstance(like, int):
            return int(text)
        if isinstance(like, float):
            value = float(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a {type(like).__name__}, got {text!r}") from None
    if isinstance(like, float):
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a finite number, got {text!r}")
        return value
    return text


def _parse_value(text: str, current, name: str):
    if isinstance(current, tuple):
        like = current[0] if current else 0.0
        parts = [p for p in text.replace("(", "").replace(")", "").split(",") if p.strip()]
        return tuple(_parse_scalar(p, like, name) for p in parts)
    return _parse_scalar(text, current, name)


def apply_override(config, path: str, text: str, _prefix: str = "", _shown: str | None = None):
    """A copy of the (nested) frozen dataclass ``config`` with the field at dotted ``path`` set to
    ``text`` parsed with the type of the current value. In an :class:`EnvConfig` a flat name
    (:data:`FLAT_NAMES`, e.g. ``kappa``) sets its group's field, and messages name it as given."""
    head, _, rest = path.partition(".")
    if isinstance(config, EnvConfig) and not rest and head in FLAT_NAMES:
        group, name = FLAT_NAMES[head]
        return apply_override(config, f"{group}.{name}", text, _prefix, _prefix + path)
    full = _shown or _prefix + path
    names = {f.name for f in dataclasses.fields(config)}
    if head not in names:
        names |= set(FLAT_NAMES) if isinstance(config, EnvConfig) else set()
        raise ConfigError(
            f"unknown config field {full!r}; {type(config).__name__} has {', '.join(sorted(names))}"
        )
    current = getattr(config, head)
    if rest:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"config field {_prefix + head!r} has no sub-fields (in {full!r})")
        value = apply_override(current, rest, text, f"{_prefix}{head}.", _shown)
    elif dataclasses.is_dataclass(current):
        raise ConfigError(f"{full!r} is a group of fields; set one of them, e.g. {full}.<field>=...")
    elif "None" in str(next(f.type for f in dataclasses.fields(config) if f.name == head)):
        # an optional number: "none" clears it, anything else is a float
        value = None if text.strip().lower() in ("none", "null") else _parse_scalar(text, 0.0, full)
    else:
        value = _parse_value(text, current, full)
    try:
        return dataclasses.replace(config, **{head: value})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{full}={text}: {exc}") from exc


def apply_overrides(config: TrainConfig, items: list[str]) -> TrainConfig:
    """Apply ``field=value`` strings in order (see the module docstring)."""
    for item in items:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            raise ConfigError(f"override {item!r} is not of the form field=value")
        config = apply_override(config, path.strip(), text)
    return config


def _env_to_dict(env: EnvConfig) -> dict:
    """The environment's stored layout: the contact and bundle settings under their flat names, in
    the places they held before the groups existed."""
    out = {}
    for key, value in dataclasses.asdict(env).items():
        if key in ENV_GROUPS:
            out |= {flat: value[name] for flat, (group, name) in FLAT_NAMES.items() if group == key}
        else:
            out[key] = value
    return out


def config_to_dict(config) -> dict:
    """The resolved config as plain JSON-able data. The environment's contact and bundle settings
    keep their flat names (:data:`FLAT_NAMES`), the layout every stored run has, so that stored
    configs stay readable by every version and by the validation's readers (:mod:`bcg.validate`)."""
    if isinstance(config, EnvConfig):
        return _env_to_dict(config)
    data = dataclasses.asdict(config)
    if isinstance(getattr(config, "env", None), EnvConfig):
        data["env"] = _env_to_dict(config.env)
    return data


def _build(cls, data: dict):
    kwargs = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    if cls is EnvConfig and "action_rate_on" not in data:
        # configs stored before the field existed penalised the sampled action: keep their reward
        kwargs["action_rate_on"] = "sample"
    if cls is EnvConfig and "reset_action" not in data:
        kwargs["reset_action"] = "zero"  # runs stored before it started episodes from a zero action
    if cls is EnvConfig and "hold_ended_episodes" not in data:
        kwargs["hold_ended_episodes"] = False  # runs stored before it simulated ended episodes on
    if cls is EnvConfig and "alive_reward" not in data:
        kwargs["alive_reward"] = 0.0  # runs stored before the alive reward had none
    if cls is EnvConfig and "height_weight" not in data:
        kwargs["height_weight"] = 0.0  # nor the height term
    if (
        cls is EnvConfig
        and "contact_depth_correction" not in data
        and not isinstance(data.get("contact"), dict)
    ):
        kwargs["contact_depth_correction"] = 0.0  # nor the contact's position term (flat layout)
    if cls is EnvConfig and "leg_clearance_weight" not in data:
        kwargs["leg_clearance_weight"] = 0.0  # runs stored before the leg-clearance term had none
    if cls is EnvConfig and "leg_clearance_cap" not in data:
        kwargs["leg_clearance_cap"] = 0.0  # and the term's runs had its unbounded form
    if cls is ContactConfig and "depth_correction" not in data:
        kwargs["depth_correction"] = 0.0  # the same in the nested layout
    nested = _NESTED.get(cls, {})
    for name, value in data.items():
        if name not in hints and not (cls is EnvConfig and name in FLAT_NAMES):
            raise ConfigError(f"stored config has unknown field {cls.__name__}.{name}")
        default = getattr(cls(), name) if name not in nested else None
        if name in nested and isinstance(value, dict):
            kwargs[name] = _build(nested[name], value)
        elif name in nested and name not in FLAT_NAMES:
            raise ConfigError(f"stored config field {cls.__name__}.{name} must hold its group's fields")
        elif isinstance(default, tuple):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


_NESTED = {
    TrainConfig: {
        "actor": ActorConfig,
        "critic": CriticConfig,
        "disc": DiscriminatorConfig,
        "env": EnvConfig,
    },
    PPOConfig: {"actor": ActorConfig, "disc": DiscriminatorConfig, "env": EnvConfig},
    EnvConfig: ENV_GROUPS,  # stored flat (a bool "contact" is the switch), read either way
}


def config_from_dict(data: dict) -> TrainConfig | PPOConfig:
    """Inverse of :func:`config_to_dict` (checkpoints store the resolved config): a
    :class:`PPOConfig` where ``algo`` is "ppo", else a :class:`TrainConfig` (SHAC's, which has no
    ``algo``)."""
    return _build(PPOConfig if data.get("algo") == "ppo" else TrainConfig, data)
