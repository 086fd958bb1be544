"""What a policy's stored training config says its evaluation must reproduce.

sim2sim, the sweep and the estimator study read these from ``Policy.config`` (the training run's
resolved config); each refuses a malformed value with an :class:`EvaluationError`, and gives the
training's default where a config predates the field.
"""

from __future__ import annotations

import math

from bcg.validate.mujoco_runner import EvaluationError


def training_margin(config: dict | None) -> float | None:
    """The contact activation margin a training run used (``env.contact_margin`` of its stored
    config), None for the simulator's default."""
    env = (config or {}).get("env", {})
    margin = env.get("contact_margin") if isinstance(env, dict) else None
    if margin is None:
        return None
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise EvaluationError(f"the policy's stored config has contact_margin {margin!r}, not a margin in m")
    return float(margin)


def training_pose_termination(config: dict | None) -> float:
    """The pose termination distance a training run used (``env.pose_termination_dist`` of its
    stored config), 0 (off) for runs stored before the field existed."""
    env = (config or {}).get("env", {})
    dist = env.get("pose_termination_dist", 0.0) if isinstance(env, dict) else 0.0
    if isinstance(dist, bool) or not isinstance(dist, (int, float)) or not 0 <= dist < math.inf:
        raise EvaluationError(
            f"the policy's stored config has pose_termination_dist {dist!r}, not a distance in m"
        )
    return float(dist)


def training_lead_out(config: dict | None) -> float:
    """The lead-out a training run used (``env.clip_end_hold`` of its stored config, s): the policy
    was trained to stop on the clip's last frame held still for that long; 0 for runs without one."""
    return _seconds(config, "clip_end_hold")


def training_lead_in(config: dict | None) -> float:
    """The lead-in a training run put in front of its clip (``env.clip_lead_in`` of its stored
    config, s; :meth:`MotionClip.with_lead_in`): the policy starts from rest on a reference that
    speeds up, and is evaluated on the same; 0 for runs without one."""
    return _seconds(config, "clip_lead_in")


def _seconds(config: dict | None, name: str) -> float:
    """``env.<name>`` of a stored config as seconds >= 0 (0 where absent)."""
    env = (config or {}).get("env", {})
    value = env.get(name, 0.0) if isinstance(env, dict) else 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise EvaluationError(f"the policy's stored config has {name} {value!r}, not a time in s")
    return float(value)


def training_depth_correction(config: dict | None) -> float:
    """The contact position term a training run used (``env.contact_depth_correction`` of its
    stored config), 0 for runs stored before the field existed."""
    env = (config or {}).get("env", {})
    beta = env.get("contact_depth_correction", 0.0) if isinstance(env, dict) else 0.0
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
        raise EvaluationError(
            f"the policy's stored config has contact_depth_correction {beta!r}, not a number in [0, 1)"
        )
    return float(beta)


def training_leg_contact(config: dict | None) -> tuple[float, float, float]:
    """(k in N/m, c in s/m, L in N) of the leg-against-leg contact of a training run's simulator
    (``env.leg_contact_stiffness``, ``env.leg_contact_damping``, ``env.leg_contact_limit``); k = 0:
    none, as for every run stored before the fields existed."""
    env = (config or {}).get("env", {})
    env = env if isinstance(env, dict) else {}
    out = []
    for name, default in (
        ("leg_contact_stiffness", 0.0),
        ("leg_contact_damping", 0.5),
        ("leg_contact_limit", 200.0),
    ):
        value = env.get(name, default)
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and value < math.inf
        if not (number and (value > 0 if name == "leg_contact_limit" else value >= 0)):
            raise EvaluationError(f"the policy's stored config has {name} {value!r}, out of range")
        out.append(float(value))
    return out[0], out[1], out[2]


def training_joint_limits(config: dict | None) -> tuple[float, float]:
    """(spring, damper) of the joint limits of a training run's simulator as ratios to the PD gains
    (``env.joint_limit_kp_ratio``, ``env.joint_limit_kd_ratio``); 0: none, as for every run stored
    before the fields existed."""
    env = (config or {}).get("env", {})
    env = env if isinstance(env, dict) else {}
    out = []
    for name, default in (("joint_limit_kp_ratio", 0.0), ("joint_limit_kd_ratio", 0.0)):
        value = env.get(name, default)
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and value < math.inf
        if not (number and value >= 0):
            raise EvaluationError(f"the policy's stored config has {name} {value!r}, out of range")
        out.append(float(value))
    return out[0], out[1]


def training_contact(kappa: float, margin: float | None = None, depth_correction: float = 0.0):
    """The training simulator's contact configuration with stiffness ``kappa``, activation margin
    ``margin`` (None = its default) and position term ``depth_correction``."""
    from bcg.sim import ContactConfig  # Taichi, slow to import, loads only when the replay is asked for

    return ContactConfig(kappa=kappa, activation_margin=margin, depth_correction=depth_correction)
