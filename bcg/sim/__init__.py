"""bcg.sim: a batched, differentiable rigid-body simulator written in Taichi.

Load any supported MJCF (free, ball, hinge and slide joints in a tree), simulate N environments with
PD actuation, and get reverse-mode gradients of a rollout with respect to the initial state, the PD
targets and model parameters::

    import numpy as np, bcg.sim
    sim = bcg.sim.Simulator("robot.xml", bcg.sim.SimConfig(num_envs=8, max_steps=10), kp=50.0, kd=2.0)
    sim.set_state(qpos, qvel)
    sim.rollout(targets)            # (T, N, nu) PD targets, one per control step
    grads = sim.backward({sim.substep: dloss_dqpos})
"""

from bcg.sim.bundle import BundleConfig
from bcg.sim.contact_config import ContactConfig
from bcg.sim.model import Model, ModelLoadError, UnsupportedModelError, load_mjcf
from bcg.sim.reverse import Gradients
from bcg.sim.rollout import SimConfig, Simulator
from bcg.sim.runtime import init

__all__ = [
    "BundleConfig",
    "ContactConfig",
    "Gradients",
    "Model",
    "ModelLoadError",
    "SimConfig",
    "Simulator",
    "UnsupportedModelError",
    "init",
    "load_mjcf",
    "make_g1",
]


def make_g1(
    num_envs: int = 1,
    max_steps: int = 32,
    requires_grad: bool = True,
    contact: ContactConfig | None = None,
    bundle: BundleConfig | None = None,
    cpu_threads: int | None = None,
) -> Simulator:
    """The Unitree G1 with its motor armature, PD gains and effort limits from :mod:`bcg.core.g1`,
    dt = 5 ms, 4 substeps per 20 ms control step, in the default standing pose. As for every model,
    its joint limits are not modelled (MuJoCo enforces them in validation; see docs/validation.md).

    Args:
        num_envs: parallel environments.
        max_steps: control steps one window holds.
        requires_grad: allocate gradient buffers.
        contact: foot-sphere ground contact (the 8 spheres of ``g1.FOOT_SPHERES``), or None.
        bundle: bundled contact gradients (needs contact), or None.
        cpu_threads: :attr:`SimConfig.cpu_threads` (on a CPU, the threads a loop over the rows
            is spread over; None: one per 32 environments, up to Taichi's pool).
    """
    from bcg.core import g1

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
        contact=contact, bundle=bundle, warn_unmodelled=False,
    )  # fmt: skip
    sim.set_state(g1.default_qpos(mj)[None], 0.0)
    return sim
