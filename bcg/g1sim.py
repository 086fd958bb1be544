"""Where the G1 meets the simulator: :func:`make_g1` builds a :class:`bcg.sim.Simulator` of the G1
from its description in :mod:`bcg.core.g1` (:mod:`bcg.sim` itself knows no robot)."""

from __future__ import annotations

import dataclasses

from bcg.core import g1
from bcg.sim import BundleConfig, ContactConfig, JointLimitConfig, SelfContactConfig, SimConfig, Simulator
from bcg.sim.self_contact import capsules_of


def make_g1(
    num_envs: int = 1,
    max_steps: int = 32,
    requires_grad: bool = True,
    contact: ContactConfig | None = None,
    bundle: BundleConfig | None = None,
    cpu_threads: int | None = None,
    self_contact: SelfContactConfig | None = None,
    joint_limits: JointLimitConfig | None = None,
) -> Simulator:
    """The Unitree G1 with its motor armature, PD gains and effort limits from :mod:`bcg.core.g1`,
    dt = 5 ms, 4 substeps per 20 ms control step, in the default standing pose. As for every model,
    its joint limits are not modelled (MuJoCo enforces them in validation; see docs/validation.md).

    Args:
        num_envs: parallel environments.
        max_steps: control steps one window holds.
        requires_grad: allocate gradient buffers.
        contact: foot-sphere ground contact, or None; its spheres and radius default to the 8 spheres
            of ``g1.FOOT_SPHERES`` and ``g1.FOOT_SPHERE_RADIUS``.
        bundle: bundled contact gradients (needs contact), or None.
        cpu_threads: :attr:`SimConfig.cpu_threads` (on a CPU, the threads a loop over the rows
            is spread over; None: one per 32 environments, up to Taichi's pool).
        self_contact: penalty contact between the robot's capsules, or None; its capsule sets
            default to the MJCF's collision capsules of the left and the right leg (:func:`leg_capsules`),
            the pairs MuJoCo's ``collisions="all"`` lets strike each other.
        joint_limits: the MJCF's joint ranges as a one-sided spring-damper (:func:`joint_limits`
            gives the G1's), or None: the joints move past their ranges.
    """
    if self_contact is not None and self_contact.capsules_a is None and self_contact.capsules_b is None:
        left, right = leg_capsules()
        self_contact = dataclasses.replace(self_contact, capsules_a=left, capsules_b=right)
    if contact is not None:  # the G1's feet unless the caller gave other spheres
        contact = dataclasses.replace(
            contact,
            spheres=g1.FOOT_SPHERES if contact.spheres is None else contact.spheres,
            radius=g1.FOOT_SPHERE_RADIUS if contact.radius is None else contact.radius,
        )
    mj = g1.load_model(floor=False, collisions="none")
    cfg = SimConfig(
        num_envs=num_envs,
        dt=g1.PHYSICS_DT,
        substeps=g1.SUBSTEPS,
        max_steps=max_steps,
        requires_grad=requires_grad,
        cpu_threads=cpu_threads,
    )
    sim = Simulator(
        mj, cfg, actuated_joints=g1.JOINT_NAMES, kp=g1.KP, kd=g1.KD, effort_limit=g1.EFFORT_LIMIT,
        contact=contact, bundle=bundle, warn_unmodelled=False, self_contact=self_contact,
        joint_limits=joint_limits,
    )  # fmt: skip
    sim.set_state(g1.default_qpos(mj)[None], 0.0)
    return sim


def joint_limits(stiffness_ratio: float = 10.0, damping_ratio: float = 0.0) -> JointLimitConfig:
    """The G1's joint limits: per joint a spring of ``stiffness_ratio`` times its PD stiffness and a
    damper of ``damping_ratio`` times its PD damping. At 10 and 0 the joints of a Run policy pass their
    ranges about as far and as often as in MuJoCo with its default limits (docs/validation.md), and
    the explicit step and its gradients stay stable on the armature alone; a damper above about 0.15
    of the PD damping, or a spring above 14x, does not (:mod:`bcg.sim.joint_limits`)."""
    return JointLimitConfig(
        stiffness={j: stiffness_ratio * float(k) for j, k in zip(g1.JOINT_NAMES, g1.KP)},
        damping={j: damping_ratio * float(c) for j, c in zip(g1.JOINT_NAMES, g1.KD)},
    )


def leg_capsules() -> tuple[tuple, tuple]:
    """The G1's collision capsules of the left and of the right leg (the bodies named with
    :data:`bcg.core.g1.LEG_BODY_PARTS`), as :class:`bcg.sim.SelfContactConfig` takes them."""
    model = g1.load_model(collisions="all", floor=False)
    names = [model.body(b).name for b in range(model.nbody)]
    sides = []
    for side in ("left", "right"):
        bodies = [n for n in names if n.startswith(side + "_") and any(p in n for p in g1.LEG_BODY_PARTS)]
        sides.append(capsules_of(model, bodies))
    return sides[0], sides[1]
