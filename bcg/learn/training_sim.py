"""The training's simulator: the G1 of :mod:`bcg.g1sim` built with an environment config's contact,
bundles, leg-against-leg contact and joint limits."""

from __future__ import annotations

import dataclasses

import bcg.sim
from bcg.g1sim import joint_limits, make_g1
from bcg.learn.config import EnvConfig


def make_g1_sim(
    cfg: EnvConfig,
    num_envs: int,
    horizon: int,
    bundle_seed: int = 0,
    cpu_threads: int | None = None,
    requires_grad: bool = True,
    leg_contact_later: bool = False,
    joint_limits_later: bool = False,
) -> bcg.sim.Simulator:
    """The G1 simulator for ``cfg``: with contact (``cfg.contact``) unless it is off, and bundling
    (``cfg.bundle``) when on; ``bundle_seed`` seeds the bundles' perturbation noise; ``cpu_threads``
    is :attr:`bcg.sim.SimConfig.cpu_threads`; ``requires_grad=False`` (PPO) allocates no gradient
    buffers, and the env built on it keeps no reverse-pass data. With ``cfg.leg_contact_stiffness``
    > 0 the legs' capsules meet each other (:mod:`bcg.sim.self_contact`); ``leg_contact_later``
    builds that contact at the stiffness given (0: no force) for a run's stage to turn on. With
    ``cfg.joint_limit_kp_ratio`` > 0 the joints meet their ranges (:func:`bcg.g1sim.joint_limits`);
    ``joint_limits_later`` builds them likewise at the ratio given."""
    k, c, limit = cfg.leg_contact_stiffness, cfg.leg_contact_damping, cfg.leg_contact_limit
    on = k > 0 or leg_contact_later
    legs = bcg.sim.SelfContactConfig(stiffness=k, damping=c, force_limit=limit) if on else None
    limits = None
    if cfg.joint_limit_kp_ratio > 0 or joint_limits_later:
        ratio = cfg.joint_limit_kp_ratio  # 0 (a later stage's): no spring and no damper until then
        limits = joint_limits(ratio, cfg.joint_limit_kd_ratio if ratio > 0 else 0.0)
    kwargs = dict(max_steps=horizon, cpu_threads=cpu_threads, requires_grad=requires_grad, self_contact=legs)
    kwargs["joint_limits"] = limits
    if not cfg.contact.on:
        return make_g1(num_envs, **kwargs)
    contact = bcg.sim.ContactConfig(**_sim_settings(cfg.contact))
    bundle = (
        bcg.sim.BundleConfig(**_sim_settings(cfg.bundle), seed=int(bundle_seed)) if cfg.bundle.on else None
    )
    return make_g1(num_envs, contact=contact, bundle=bundle, **kwargs)


def _sim_settings(group) -> dict:
    """The simulator's settings of a :class:`bcg.learn.config.ContactConfig` or ``BundleConfig``:
    its fields but the switch, which have the simulator's names."""
    return {f.name: getattr(group, f.name) for f in dataclasses.fields(group) if f.name != "on"}
