"""Joint limits: the MJCF's ranges of its limited hinge and slide joints as a one-sided spring-damper.

Past a limit by ``delta`` (rad or m) at velocity ``v`` the joint gets ``f = -(k delta + c v)``
towards the range, never away from it (``f`` is clipped at 0, so the damper does not hold a joint
that moves back into its range), and nothing inside the range. MuJoCo enforces the same ranges as
soft constraints; a penalty is what an explicit, differentiable step can take. On the G1 a spring of
10x the joint's PD stiffness, without a damper, lets the joints past their ranges about as far and
as often as MuJoCo's default limits do (docs/validation.md). Without limits a policy can lean on an
ankle that rolls 0.27 rad past its stop, which MuJoCo and the robot do not allow.

The step is explicit, so the spring and the damper add to what the joint's PD already asks of it:
with stiffness K and damping C in all (PD and limit) on an inertia I, a step of h is stable, and so
is its tangent map, which the reverse pass multiplies over the window, only while
K h^2 / I < 2 (2 - C h / I). The G1's PD already has C h / I = 1.26 on the armature, so a damper of
its PD damping again makes the gradients grow about 2x per substep while a joint presses on a limit
(a training run's gradient norm reached 1e9); the G1's limits have no damper.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bcg.sim.model import JNT_HINGE, JNT_SLIDE, Model


@dataclass(frozen=True)
class JointLimitConfig:
    """The limits' spring and damper (ours: the paper's simulator has no joint limits).

    Attributes:
        stiffness: N m/rad (N/m for a slide joint), k: one number for every limited joint, or
            ``{joint name: k}``, where a limited joint not named gets no limit force.
        damping: N m s/rad (N s/m), c, as ``stiffness``.
    """

    stiffness: float | Mapping[str, float] = 1000.0
    damping: float | Mapping[str, float] = 0.0

    def __post_init__(self):
        for name in ("stiffness", "damping"):
            value = getattr(self, name)
            items = value.items() if isinstance(value, Mapping) else [(None, value)]
            checked = {}
            for joint, x in items:
                if isinstance(x, bool) or not (isinstance(x, numbers.Real) and math.isfinite(x) and x >= 0):
                    where = f"[{joint!r}]" if joint is not None else ""
                    raise ValueError(f"JointLimitConfig.{name}{where} must be a number >= 0, got {x!r}")
                checked[joint] = float(x)
            object.__setattr__(self, name, checked[None] if None in checked else dict(checked))


def limit_tables(model: Model, config: JointLimitConfig) -> dict[str, np.ndarray]:
    """Per dof (nv,): the qpos address of a limited hinge or slide joint's coordinate (0 elsewhere),
    its range (+-inf elsewhere, so no force) and the spring and damper of ``config``.

    Raises:
        KeyError: ``config`` names a joint the model does not have.
        ValueError: it names a joint that is not a limited hinge or slide joint.
    """
    nv = model.nv
    qadr = np.zeros(nv, dtype=np.int32)
    lo, hi = np.full(nv, -np.inf), np.full(nv, np.inf)
    k, c = np.zeros(nv), np.zeros(nv)
    limited = {}
    for j in range(model.njnt):
        if model.jnt_limited[j] and model.jnt_type[j] in (JNT_HINGE, JNT_SLIDE):
            limited[model.jnt_names[j]] = j
    for name, value in (("stiffness", config.stiffness), ("damping", config.damping)):
        if isinstance(value, dict):
            for joint in value:
                model.jnt_id(joint)  # a clear KeyError for an unknown joint
                if joint not in limited:
                    raise ValueError(
                        f"JointLimitConfig.{name}: joint {joint!r} is not a limited hinge or slide joint"
                    )
    for joint, j in limited.items():
        d = int(model.jnt_dofadr[j])
        qadr[d] = int(model.jnt_qposadr[j])
        lo[d], hi[d] = model.jnt_range[j]
        k[d] = _value(config.stiffness, joint)
        c[d] = _value(config.damping, joint)
    return {"qadr": qadr, "lo": lo, "hi": hi, "stiffness": k, "damping": c}


def _value(value, joint: str) -> float:
    return value.get(joint, 0.0) if isinstance(value, dict) else value
