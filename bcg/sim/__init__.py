"""bcg.sim: a batched, differentiable rigid-body simulator written in Taichi.

Load any supported MJCF (free, ball, hinge and slide joints in a tree), simulate N environments with
PD actuation (and, optionally, joint limits), and get reverse-mode gradients of a rollout with respect
to the initial state, the PD targets and model parameters::

    import numpy as np, bcg.sim
    sim = bcg.sim.Simulator("robot.xml", bcg.sim.SimConfig(num_envs=8, max_steps=10), kp=50.0, kd=2.0)
    sim.set_state(qpos, qvel)
    sim.rollout(targets)            # (T, N, nu) PD targets, one per control step
    grads = sim.backward({sim.substep: dloss_dqpos})
"""

from bcg.sim.bundle import BundleConfig
from bcg.sim.contact_config import ContactConfig, SelfContactConfig
from bcg.sim.joint_limits import JointLimitConfig
from bcg.sim.model import Model, ModelLoadError, UnsupportedModelError, load_mjcf
from bcg.sim.reverse import Gradients
from bcg.sim.rollout import SimConfig, Simulator
from bcg.sim.runtime import init

__all__ = [
    "BundleConfig",
    "ContactConfig",
    "Gradients",
    "JointLimitConfig",
    "Model",
    "ModelLoadError",
    "SelfContactConfig",
    "SimConfig",
    "Simulator",
    "UnsupportedModelError",
    "init",
    "load_mjcf",
]
