"""Stages of one training run: reward, termination and start settings that change at set iterations.

``TrainConfig.env_stages`` holds them as one string, ``"N:field=value,field=value;M:field=value"``:
after iteration N the environment's named fields take those values, after M the next ones (on top
of the earlier stages). For example::

    python -m bcg.learn.train --motion run --kappa 300 \\
        --set "env_stages=450:pose_termination_dist=1.5,root_position_weight=5"

trains the default for 450 iterations, then with pose termination at 1.5 m and the root-position
term. One command thus runs what otherwise takes a run and ``--init-from`` stages after it, with no
second process, the learning-rate schedule unbroken and every random generator carried through.
The early iterations, where a robot learns to stand at all, keep the default (which the learning
benchmark measures); the path terms, which slow that, come in once it stands (docs/learning.md).

Only fields the environment reads at every step or reset may change: the reward's terms, the
termination rules, the start-phase mixes, and the strength of the leg-against-leg contact and of the
joint limits (a run with a stage that turns one on builds its simulator with it from the first
iteration, at k = 0 until then, which adds no force). The simulator's other settings (ground
contact, bundles, the clip, randomisation ranges) are built into the compiled simulator and cannot.
"""

from __future__ import annotations

import dataclasses

from bcg.learn.config import EnvConfig
from bcg.learn.config_io import ConfigError, apply_override

STAGE_FIELDS = tuple(
    """alive_reward height_weight height_tolerance upright_weight root_rotation_weight
    root_rotation_cap root_position_weight root_position_cap leg_clearance_weight leg_clearance_margin
    leg_clearance_cap fall_height pose_termination_dist start_failure_mix start_failure_lead
    start_failure_memory start_clip_begin_mix start_standing_mix leg_contact_stiffness
    leg_contact_damping leg_contact_limit joint_limit_kp_ratio joint_limit_kd_ratio""".split()
)
"""The :class:`EnvConfig` fields a stage may set: those the environment reads at each step or reset
(the start-phase fields through its start sampler, the leg contact's and the joint limits' through
its simulator, which
:func:`set_env_config` updates). The
action-rate weight is left out: ``TrainConfig.action_rate_ramp`` already sets it per iteration."""


# The stages a motion's run trains with unless ``--set env_stages=...`` says otherwise
# (``--set env_stages=`` for none). Run's: the default alone until it stays up (about iteration
# 1250), then the path terms that hold it to the clip (docs/learning.md, "What is left").
MOTION_STAGES = {
    "run": "1250:pose_termination_dist=1.5,leg_clearance_cap=0,root_rotation_weight=1,root_rotation_cap=1,"
    "start_failure_mix=0.3,root_position_weight=5,root_position_cap=1;2500:root_rotation_cap=0",
}


LEG_CONTACT = ("leg_contact_stiffness", "leg_contact_damping", "leg_contact_limit")


def leg_contact_later(cfg) -> bool:
    """Whether a stage of ``cfg`` (a :class:`bcg.learn.config.TrainConfig`) turns the leg contact
    on, so that its simulator must be built with it (:func:`bcg.learn.env.make_g1_sim`)."""
    text = getattr(cfg, "env_stages", "")
    return any(env_at(cfg.env, text, after).leg_contact_stiffness > 0 for after, _ in parse_stages(text))


JOINT_LIMITS = ("joint_limit_kp_ratio", "joint_limit_kd_ratio")


def joint_limits_later(cfg) -> bool:
    """Whether a stage of ``cfg`` turns the joint limits on (as :func:`leg_contact_later`)."""
    text = getattr(cfg, "env_stages", "")
    return any(env_at(cfg.env, text, after).joint_limit_kp_ratio > 0 for after, _ in parse_stages(text))


def motion_stages(motion: str, iterations: int, fixed=()) -> str:
    """The default ``env_stages`` of a run on ``motion`` (:data:`MOTION_STAGES`; "" for a motion
    without them), less the stages that would not start within ``iterations`` (so that a shorter
    run, the learning benchmark's ``--schedule``, trains the default as before) and less the
    ``fixed`` env fields, which the command sets itself (``--set env.FIELD=...`` holds throughout)."""
    parts = []
    for after, settings in parse_stages(MOTION_STAGES.get(motion, "")):
        kept = [f"{name}={value}" for name, value in settings.items() if name not in fixed]
        if after < iterations and kept:
            parts.append(f"{after}:{','.join(kept)}")
    return ";".join(parts)


class StageError(ValueError):
    """An ``env_stages`` string that cannot be read, or names a field no stage may change."""


def parse_stages(text: str, iterations: int | None = None) -> tuple[tuple[int, dict[str, str]], ...]:
    """``((N, {field: value text}), ...)`` in increasing N from an ``env_stages`` string.

    Raises:
        StageError: a malformed stage, an unknown or unchangeable field, iterations not increasing,
            or (with ``iterations``) a stage at or after the run's last iteration, which would never
            take effect.
    """
    stages: list[tuple[int, dict[str, str]]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        head, sep, body = part.partition(":")
        try:
            after = int(head)
        except ValueError:
            after = -1
        if not sep or after < 0:
            raise StageError(f"env_stages: {part!r} is not of the form ITERATION:field=value[,field=value]")
        settings: dict[str, str] = {}
        for item in (i.strip() for i in body.split(",")):
            name, eq, value = item.partition("=")
            name = name.strip().removeprefix("env.")
            if not eq or not value.strip():
                raise StageError(f"env_stages: {item!r} (after iteration {after}) is not field=value")
            if name not in STAGE_FIELDS:
                raise StageError(
                    f"env_stages: {name!r} cannot change during a run; a stage may set "
                    + ", ".join(STAGE_FIELDS)
                )
            settings[name] = value.strip()
        if stages and after <= stages[-1][0]:
            raise StageError(f"env_stages: iteration {after} does not follow {stages[-1][0]}")
        if iterations is not None and after >= iterations:
            raise StageError(
                f"env_stages: a stage after iteration {after} never starts in a run of {iterations}"
            )
        stages.append((after, settings))
    return tuple(stages)


def env_at(env: EnvConfig, text: str, iteration: int) -> EnvConfig:
    """The environment's config for the iteration after ``iteration`` completed ones: ``env`` with
    every stage at or before ``iteration`` applied in order."""
    for after, settings in parse_stages(text):
        if after > iteration:
            break
        for name, value in settings.items():
            try:
                env = apply_override(env, name, value, "env.")
            except ConfigError as exc:
                raise StageError(f"env_stages, after iteration {after}: {exc}") from None
    return env


def check_stages(env: EnvConfig, text: str, iterations: int) -> None:
    """Raise :class:`StageError` unless every stage reads and yields a valid config."""
    stages = parse_stages(text, iterations)
    if stages:
        env_at(env, text, stages[-1][0])


def config_at(cfg, iteration: int):
    """A :class:`bcg.learn.config.TrainConfig` with ``env`` as its stages make it after
    ``iteration``; any other config (PPO's, which has no stages) as it is."""
    text = getattr(cfg, "env_stages", "")
    return dataclasses.replace(cfg, env=env_at(cfg.env, text, iteration)) if text else cfg


def changed_fields(old: EnvConfig, new: EnvConfig) -> dict[str, object]:
    """``{field: new value}`` for the fields where ``new`` differs from ``old``."""
    return {
        f.name: getattr(new, f.name)
        for f in dataclasses.fields(EnvConfig)
        if getattr(old, f.name) != getattr(new, f.name)
    }


def set_env_config(env, cfg: EnvConfig) -> dict[str, object]:
    """Give a built :class:`bcg.learn.env.DifferentiableEnv` the stage's settings ``cfg`` from its next
    step on (its start sampler keeps its failure histogram); returns the fields that changed.

    Raises:
        ValueError: ``cfg`` differs in a field outside :data:`STAGE_FIELDS` (the simulator was built
            with it).
    """
    changed = changed_fields(env.cfg, cfg)
    fixed = sorted(set(changed) - set(STAGE_FIELDS))
    if fixed:
        raise ValueError(f"cannot change {', '.join(fixed)} of a built environment")
    stiffness, damping, limit = (getattr(cfg, name) for name in LEG_CONTACT)
    # damping or limit changed while the contact stays off: nothing to give a simulator without it
    if set(changed) & set(LEG_CONTACT) and (env.sim.self_contact is not None or stiffness > 0):
        if env.sim.self_contact is None:
            raise ValueError(
                "cannot turn on the leg contact of a simulator built without it "
                "(make_g1_sim(..., leg_contact_later=True) builds it for a later stage)"
            )
        env.sim.set_self_contact(stiffness=stiffness, damping=damping, force_limit=limit)
    ratio = cfg.joint_limit_kp_ratio
    if set(changed) & set(JOINT_LIMITS) and (env.sim.joint_limits is not None or ratio > 0):
        if env.sim.joint_limits is None:
            raise ValueError(
                "cannot turn on the joint limits of a simulator built without them "
                "(make_g1_sim(..., joint_limits_later=True) builds them for a later stage)"
            )
        from bcg.g1sim import joint_limits  # Taichi, which this module does not need otherwise

        new = joint_limits(ratio, cfg.joint_limit_kd_ratio if ratio > 0 else 0.0)
        env.sim.set_joint_limits(stiffness=new.stiffness, damping=new.damping)
    env.cfg = cfg
    phases = env.start_phases
    phases.mix, phases.lead = cfg.start_failure_mix, cfg.start_failure_lead
    phases.memory, phases.begin_mix = cfg.start_failure_memory, cfg.start_clip_begin_mix
    return changed
