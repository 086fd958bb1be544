"""The static model of a rigid-body tree, built from MuJoCo's compiled ``mujoco.MjModel``.

Field names follow MuJoCo (``body_parentid``, ``jnt_qposadr``, ``dof_armature``...) so tests can compare
field by field. Arrays are numpy, world body included at index 0, exactly as in ``MjModel``. The
simulator copies them into Taichi fields; the fields that domain randomisation changes
(``body_mass``, ``body_ipos``, ``dof_armature``, ``dof_frictionloss`` and the PD gains) get a leading
environment axis there.

Supported: kinematic trees of free, ball, hinge and slide joints, at most one joint per body, a free
joint only on a child of the world. What the simulator cannot model and would change the motion
(tendons, equality constraints, flexes, several joints on one body, joint springs, mocap bodies,
gravity compensation, fluid forces) raises :class:`UnsupportedModelError` naming the feature. What it
replaces or leaves out by design is listed by :func:`unmodelled` (the simulator warns with it): joint
limits, the MJCF's actuators (the simulator drives joints with its own PD), the MJCF's time step and
integrator. ``<flag gravity="disable"/>`` is honoured (zero gravity).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

_INTEGRATORS = {0: "Euler", 1: "RK4", 2: "implicit", 3: "implicitfast"}

JNT_FREE, JNT_BALL, JNT_SLIDE, JNT_HINGE = 0, 1, 2, 3
JNT_NQ = {JNT_FREE: 7, JNT_BALL: 4, JNT_SLIDE: 1, JNT_HINGE: 1}
JNT_NV = {JNT_FREE: 6, JNT_BALL: 3, JNT_SLIDE: 1, JNT_HINGE: 1}


class UnsupportedModelError(ValueError):
    """The MJCF holds something the simulator does not model."""


class ModelLoadError(ValueError):
    """The MJCF could not be read or compiled."""


@dataclass(frozen=True)
class Model:
    """A rigid-body tree (numpy arrays; shapes in brackets, world body at index 0).

    Attributes:
        nq, nv, nbody, njnt: sizes as in MuJoCo.
        body_parentid: parent body (nbody,).
        body_pos: m, body frame offset in the parent frame (nbody, 3).
        body_quat: body frame rotation in the parent frame, (w, x, y, z) (nbody, 4).
        body_ipos: m, centre of mass in the body frame (nbody, 3).
        body_iquat: principal inertia frame in the body frame (nbody, 4).
        body_mass: kg (nbody,).
        body_inertia: kg m^2, principal inertia (nbody, 3).
        body_jntadr: first joint of the body or -1 (nbody,).
        body_dofadr, body_dofnum: dofs of the body (nbody,).
        body_level: depth in the tree, world = 0 (nbody,).
        jnt_type, jnt_bodyid, jnt_qposadr, jnt_dofadr: (njnt,).
        jnt_axis: joint axis in the body frame (njnt, 3).
        jnt_pos: m, joint anchor in the body frame (njnt, 3).
        jnt_range: joint limits (njnt, 2); jnt_limited (njnt,).
        dof_bodyid, dof_jntid, dof_parentid: (nv,).
        dof_armature: kg m^2 or kg (nv,). dof_damping: N m s/rad (nv,).
        dof_frictionloss: N m (nv,).
        qpos0: reference configuration (nq,).
        gravity: m/s^2 (3,).
        timestep: s, the MJCF's option timestep.
        body_names, jnt_names: names, by index.
    """

    nq: int
    nv: int
    nbody: int
    njnt: int
    body_parentid: np.ndarray
    body_pos: np.ndarray
    body_quat: np.ndarray
    body_ipos: np.ndarray
    body_iquat: np.ndarray
    body_mass: np.ndarray
    body_inertia: np.ndarray
    body_jntadr: np.ndarray
    body_dofadr: np.ndarray
    body_dofnum: np.ndarray
    body_level: np.ndarray
    jnt_type: np.ndarray
    jnt_bodyid: np.ndarray
    jnt_qposadr: np.ndarray
    jnt_dofadr: np.ndarray
    jnt_axis: np.ndarray
    jnt_pos: np.ndarray
    jnt_range: np.ndarray
    jnt_limited: np.ndarray
    dof_bodyid: np.ndarray
    dof_jntid: np.ndarray
    dof_parentid: np.ndarray
    dof_armature: np.ndarray
    dof_damping: np.ndarray
    dof_frictionloss: np.ndarray
    qpos0: np.ndarray
    gravity: np.ndarray
    timestep: float
    body_names: tuple[str, ...]
    jnt_names: tuple[str, ...]

    @property
    def actuated_joints(self) -> tuple[str, ...]:
        """Hinge and slide joints in model order: the joints the PD interface drives."""
        return tuple(n for n, t in zip(self.jnt_names, self.jnt_type) if t in (JNT_HINGE, JNT_SLIDE))

    def body_id(self, name: str) -> int:
        """Index of the body named ``name`` (KeyError naming it if there is none)."""
        try:
            return self.body_names.index(name)
        except ValueError:
            raise KeyError(f"the model has no body named {name!r}") from None

    def jnt_id(self, name: str) -> int:
        """Index of the joint named ``name`` (KeyError naming it if there is none)."""
        try:
            return self.jnt_names.index(name)
        except ValueError:
            raise KeyError(f"the model has no joint named {name!r}") from None


def validate(mj: mujoco.MjModel) -> None:
    """Raise :class:`UnsupportedModelError` naming every feature the simulator does not model."""
    problems = []
    if mj.ntendon:
        problems.append(f"{mj.ntendon} tendon(s)")
    if mj.neq:
        problems.append(f"{mj.neq} equality constraint(s)")
    if getattr(mj, "nflex", 0):
        problems.append(f"{mj.nflex} flex(es)")
    if getattr(mj, "nskin", 0):
        pass  # skins are visual only
    multi = [_name(mj, mujoco.mjtObj.mjOBJ_BODY, b, "body") for b in range(mj.nbody) if mj.body_jntnum[b] > 1]
    if multi:
        problems.append(f"bodies with several joints ({', '.join(multi)})")
    for j in range(mj.njnt):
        t = int(mj.jnt_type[j])
        name = _name(mj, mujoco.mjtObj.mjOBJ_JOINT, j, "joint")
        if t not in JNT_NQ:
            problems.append(f"joint {name!r} of unsupported type {t}")
        if t == JNT_FREE and mj.body_parentid[mj.jnt_bodyid[j]] != 0:
            problems.append(f"free joint {name!r} on a body whose parent is not the world")
        if mj.jnt_stiffness[j] != 0:
            problems.append(f"joint {name!r} with a spring (stiffness)")
    if mj.nmocap:
        problems.append(f"{mj.nmocap} mocap bod(y/ies)")
    if np.any(mj.body_gravcomp != 0):
        problems.append("gravity compensation (gravcomp)")
    if mj.opt.density > 0 or mj.opt.viscosity > 0:
        problems.append(f"fluid forces (option density {mj.opt.density:g}, viscosity {mj.opt.viscosity:g})")
    if problems:
        raise UnsupportedModelError("bcg.sim does not model: " + "; ".join(problems))


def _name(mj: mujoco.MjModel, kind, index: int, prefix: str) -> str:
    """An element's name, or ``<prefix><index>`` for an unnamed one (as :class:`Model` names them)."""
    return mujoco.mj_id2name(mj, kind, index) or f"{prefix}{index}"


def unmodelled(mj: mujoco.MjModel, dt: float | None = None, joint_limits: bool = False) -> list[str]:
    """What of the MJCF the simulator leaves out or replaces by design (empty when nothing is):
    limited joints (unless ``joint_limits``: the simulator was given a ``JointLimitConfig``),
    actuators (it drives the actuated joints with its
    own PD, gains and effort limits given to the simulator), an option timestep other than ``dt``
    and an integrator other than Euler (it steps with its own semi-implicit Euler)."""
    notes = []
    limited = [_name(mj, mujoco.mjtObj.mjOBJ_JOINT, j, "joint") for j in range(mj.njnt) if mj.jnt_limited[j]]
    if limited and not joint_limits:
        shown = ", ".join(limited[:6]) + (f" and {len(limited) - 6} more" if len(limited) > 6 else "")
        notes.append(f"joint limits ({shown}): the joints move past their ranges")
    if mj.nu:
        notes.append(
            f"{mj.nu} actuator(s): the simulator drives the actuated joints with its own PD "
            "(kp, kd, effort_limit given to it), not with the MJCF's actuators"
        )
    if dt is not None and abs(float(mj.opt.timestep) - dt) > 1e-12:
        notes.append(f"the option timestep {mj.opt.timestep:g} s: the simulator steps at dt = {dt:g} s")
    integrator = int(mj.opt.integrator)
    if integrator != 0:
        notes.append(
            f"the {_INTEGRATORS.get(integrator, integrator)} integrator: the simulator steps with its own "
            "semi-implicit Euler"
        )
    return notes


def from_mjmodel(mj: mujoco.MjModel) -> Model:
    """Build a :class:`Model` from a compiled ``mujoco.MjModel``; raises on unsupported features."""
    validate(mj)
    level = np.zeros(mj.nbody, dtype=np.int32)
    for b in range(1, mj.nbody):
        level[b] = level[mj.body_parentid[b]] + 1
    return Model(
        nq=int(mj.nq),
        nv=int(mj.nv),
        nbody=int(mj.nbody),
        njnt=int(mj.njnt),
        body_parentid=mj.body_parentid.astype(np.int32).copy(),
        body_pos=mj.body_pos.copy(),
        body_quat=mj.body_quat.copy(),
        body_ipos=mj.body_ipos.copy(),
        body_iquat=mj.body_iquat.copy(),
        body_mass=mj.body_mass.copy(),
        body_inertia=mj.body_inertia.copy(),
        body_jntadr=mj.body_jntadr.astype(np.int32).copy(),
        body_dofadr=mj.body_dofadr.astype(np.int32).copy(),
        body_dofnum=mj.body_dofnum.astype(np.int32).copy(),
        body_level=level,
        jnt_type=mj.jnt_type.astype(np.int32).copy(),
        jnt_bodyid=mj.jnt_bodyid.astype(np.int32).copy(),
        jnt_qposadr=mj.jnt_qposadr.astype(np.int32).copy(),
        jnt_dofadr=mj.jnt_dofadr.astype(np.int32).copy(),
        jnt_axis=mj.jnt_axis.copy(),
        jnt_pos=mj.jnt_pos.copy(),
        jnt_range=mj.jnt_range.copy(),
        jnt_limited=mj.jnt_limited.astype(bool).copy(),
        dof_bodyid=mj.dof_bodyid.astype(np.int32).copy(),
        dof_jntid=mj.dof_jntid.astype(np.int32).copy(),
        dof_parentid=mj.dof_parentid.astype(np.int32).copy(),
        dof_armature=mj.dof_armature.copy(),
        dof_damping=mj.dof_damping.copy(),
        dof_frictionloss=mj.dof_frictionloss.copy(),
        qpos0=mj.qpos0.copy(),
        gravity=np.zeros(3)
        if mj.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_GRAVITY
        else mj.opt.gravity.copy(),
        timestep=float(mj.opt.timestep),
        body_names=tuple(
            mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_BODY, b) or f"body{b}" for b in range(mj.nbody)
        ),
        jnt_names=tuple(
            mujoco.mj_id2name(mj, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}" for j in range(mj.njnt)
        ),
    )


def load_mjcf(source: str | Path | mujoco.MjModel) -> tuple[Model, mujoco.MjModel]:
    """Load an MJCF file (or XML string, or compiled model) into a :class:`Model`.

    Returns the model and the compiled ``MjModel`` it was built from. Raises :class:`ModelLoadError`
    when MuJoCo cannot read or compile the file, :class:`UnsupportedModelError` when it holds features
    the simulator does not model.
    """
    if isinstance(source, mujoco.MjModel):
        mj = source
    else:
        text = str(source)
        try:
            if text.lstrip().startswith("<"):
                mj = mujoco.MjModel.from_xml_string(text)
            else:
                path = Path(text)
                if not path.is_file():
                    raise ModelLoadError(f"MJCF file not found: {path}")
                mj = mujoco.MjModel.from_xml_path(str(path))
        except ModelLoadError:
            raise
        except Exception as exc:  # MuJoCo raises ValueError with its own parser message
            raise ModelLoadError(f"could not load MJCF {text[:80]!r}: {exc}") from None
    return from_mjmodel(mj), mj


def subtree_lists(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """CSR lists of every body's subtree (itself included): (start (nbody+1,), bodies)."""
    children = [[] for _ in range(model.nbody)]
    for b in range(1, model.nbody):
        children[model.body_parentid[b]].append(b)
    starts, items = [0], []
    for b in range(model.nbody):
        stack, sub = [b], []
        while stack:
            x = stack.pop()
            sub.append(x)
            stack.extend(children[x])
        items.extend(sorted(sub))
        starts.append(len(items))
    return np.array(starts, dtype=np.int32), np.array(items, dtype=np.int32)


def dof_ancestor_lists(model: Model) -> tuple[np.ndarray, np.ndarray]:
    """CSR lists of every dof's ancestor dofs, itself included: (start (nv+1,), dofs)."""
    starts, items = [0], []
    for i in range(model.nv):
        j = i
        while j >= 0:
            items.append(j)
            j = model.dof_parentid[j]
        starts.append(len(items))
    return np.array(starts, dtype=np.int32), np.array(items, dtype=np.int32)
