"""Robot state for the observation and the ADD features, and MuJoCo helpers.

:class:`RobotState` is the one container that the training simulator, the MuJoCo validation, the
robot client and the motion clips all fill in before calling :func:`bcg.learn.observation.observation`
or :func:`bcg.learn.features.add_features`. Every field is in the *world* frame; in particular the
root angular velocity is world-frame, whereas MuJoCo's free-joint ``qvel[3:6]`` is body-frame
(convert with :func:`bcg.core.rotations.ang_vel_body_to_world`). Quaternions are (w, x, y, z); the
rotation maths are in :mod:`bcg.core.rotations`.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from types import SimpleNamespace

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.rotations import ang_vel_body_to_world

KEY_BODY_NAMES: tuple[str, ...] = tuple(name for name, _, _ in g1.KEY_BODIES)


@dataclasses.dataclass(frozen=True)
class RobotState:
    """Kinematic state of N robots (or N reference frames), world frame.

    Attributes:
        root_pos: m (N, 3), pelvis origin.
        root_quat: (N, 4) pelvis orientation, (w, x, y, z), unit norm.
        root_lin_vel: m/s (N, 3), pelvis origin velocity.
        root_ang_vel: rad/s (N, 3), pelvis angular velocity in the WORLD frame.
        joint_pos: rad (N, 29), hinge angles in :data:`bcg.core.g1.JOINT_NAMES` order.
        joint_vel: rad/s (N, 29), same order.
        key_body_pos: m (N, 5, 3), key points in :data:`bcg.core.g1.KEY_BODIES` order.
        body_pos: m (N, nbody, 3), origins of all model bodies except the world body, in body-id order
            (body id b at index b - 1, see :func:`body_names`); needed by the ADD features only, may be
            None for the observation.
    """

    root_pos: np.ndarray
    root_quat: np.ndarray
    root_lin_vel: np.ndarray
    root_ang_vel: np.ndarray
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    key_body_pos: np.ndarray
    body_pos: np.ndarray | None = None

    def __post_init__(self):
        n = np.shape(self.root_pos)[0] if np.ndim(self.root_pos) == 2 else -1
        expected = {
            "root_pos": (n, 3),
            "root_quat": (n, 4),
            "root_lin_vel": (n, 3),
            "root_ang_vel": (n, 3),
            "joint_pos": (n, g1.NUM_JOINTS),
            "joint_vel": (n, g1.NUM_JOINTS),
            "key_body_pos": (n, len(g1.KEY_BODIES), 3),
        }
        for name, shape in expected.items():
            got = np.shape(getattr(self, name))
            if got != shape:
                raise ValueError(f"RobotState.{name} must have shape {shape} (N = batch), got {got}")
        if self.body_pos is not None:
            got = np.shape(self.body_pos)
            if len(got) != 3 or got[0] != n or got[2] != 3:
                raise ValueError(f"RobotState.body_pos must have shape ({n}, nbody, 3), got {got}")

    @property
    def batch_size(self) -> int:
        return int(np.shape(self.root_pos)[0])

    def replace(self, **changes) -> RobotState:
        return dataclasses.replace(self, **changes)


#: A reference frame of a motion clip: the same fields as the robot's state.
ReferenceState = RobotState


@dataclasses.dataclass(frozen=True)
class RobotStateGrad(RobotState):
    """Gradient of a scalar loss with respect to the fields of a :class:`RobotState` (same shapes).

    ``root_quat`` holds the plain partial derivatives with respect to the four components (w, x, y, z)
    as they enter :func:`bcg.core.rotations.quat_to_matrix` (no projection onto the unit sphere's
    tangent space).
    ``body_pos`` is None when the state's ``body_pos`` is None.
    """


def zero_grad(state: RobotState) -> dict[str, np.ndarray | None]:
    """Zero arrays shaped like each field of ``state`` (a dict, to be filled then wrapped)."""
    return {
        f.name: None if getattr(state, f.name) is None else np.zeros(np.shape(getattr(state, f.name)))
        for f in dataclasses.fields(RobotState)
    }


# ---------------------------------------------------------------------------------------------------
# Quantities read from a compiled model, always by name.


def joint_axes(model: mujoco.MjModel, names: tuple[str, ...] = g1.JOINT_NAMES) -> np.ndarray:
    """Unit hinge axes (J, 3) in the child body frame of the named joints; refuses non-hinge joints."""
    axes = []
    for name in names:
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            raise KeyError(f"the model has no joint named {name!r}")
        if model.jnt_type[jid] != mujoco.mjtJoint.mjJNT_HINGE:
            raise ValueError(f"joint {name!r} is not a hinge joint")
        axes.append(model.jnt_axis[jid] / np.linalg.norm(model.jnt_axis[jid]))
    return np.array(axes)


def hinge_joint_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of all hinge joints of a model, in model order."""
    return tuple(
        model.joint(j).name for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_HINGE
    )


def body_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """Names of all bodies except the world body, in body-id order (the order of ``body_pos``)."""
    return tuple(model.body(b).name for b in range(1, model.nbody))


def key_body_frames(model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    """Body ids (5,) and offsets in m (5, 3) of :data:`bcg.core.g1.KEY_BODIES`, resolved by name."""
    ids = g1.body_ids(model, [body for _, body, _ in g1.KEY_BODIES])
    offsets = np.array([offset for _, _, offset in g1.KEY_BODIES], dtype=np.float64)
    return ids, offsets


@lru_cache(maxsize=1)
def g1_model() -> mujoco.MjModel:
    """The G1 model used for kinematic quantities (no floor, no contacts); compiled once."""
    return g1.load_model(floor=False, collisions="none")


@lru_cache(maxsize=1)
def g1_joint_axes() -> np.ndarray:
    """Hinge axes (29, 3) of :data:`bcg.core.g1.JOINT_NAMES` in the G1 model."""
    axes = joint_axes(g1_model())
    axes.flags.writeable = False
    return axes


# ---------------------------------------------------------------------------------------------------
# ReferenceState from a motion clip sample.


def reference_state(sample) -> ReferenceState:
    """ReferenceState (N) of a motion sample with batch shape (N,).

    ``sample`` is a :class:`bcg.motion.clip.MotionState` (or any object with its fields: root_pos,
    root_quat, root_lin_vel_w, root_ang_vel_w, joint_pos, joint_vel, key_body_pos, body_pos, already
    in :data:`bcg.core.g1.JOINT_NAMES` and model body order). The root quaternion is normalised.
    """
    quat = np.asarray(sample.root_quat)
    return ReferenceState(
        root_pos=np.asarray(sample.root_pos),
        root_quat=quat / np.linalg.norm(quat, axis=-1, keepdims=True),
        root_lin_vel=np.asarray(sample.root_lin_vel_w),
        root_ang_vel=np.asarray(sample.root_ang_vel_w),
        joint_pos=np.asarray(sample.joint_pos),
        joint_vel=np.asarray(sample.joint_vel),
        key_body_pos=np.asarray(sample.key_body_pos),
        body_pos=np.asarray(sample.body_pos),
    )


def reference_states(future) -> list[ReferenceState]:
    """One ReferenceState (N) per step of a sample with batch shape (N, K), e.g.
    ``clip.sample_future(t, steps=(1, 2, 3))``: the ``refs`` argument of the observation."""
    fields = ("root_pos", "root_quat", "root_lin_vel_w", "root_ang_vel_w", "joint_pos", "joint_vel")
    fields += ("key_body_pos", "body_pos")
    steps = np.shape(future.root_pos)[1]
    return [
        reference_state(SimpleNamespace(**{f: np.asarray(getattr(future, f))[:, k] for f in fields}))
        for k in range(steps)
    ]


# ---------------------------------------------------------------------------------------------------
# RobotState from MuJoCo.


def robot_state_from_mujoco(model: mujoco.MjModel, data: mujoco.MjData) -> RobotState:
    """RobotState (batch of 1) of a MuJoCo simulation whose kinematics are current.

    Reads ``data.qpos``/``data.qvel`` and the body poses ``data.xpos``/``data.xmat`` (call
    ``mujoco.mj_kinematics`` or ``mj_step`` first). Joints and bodies are resolved by name.
    """
    free = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, g1.FREE_JOINT)
    if free < 0:
        raise KeyError(f"the model has no free joint named {g1.FREE_JOINT!r}")
    qa, da = model.jnt_qposadr[free], model.jnt_dofadr[free]
    quat = data.qpos[qa + 3 : qa + 7].copy()
    ids, offsets = key_body_frames(model)
    xmat = data.xmat[ids].reshape(-1, 3, 3)
    key = data.xpos[ids] + np.einsum("kij,kj->ki", xmat, offsets)
    return RobotState(
        root_pos=data.qpos[qa : qa + 3].copy()[None],
        root_quat=quat[None],
        root_lin_vel=data.qvel[da : da + 3].copy()[None],
        root_ang_vel=ang_vel_body_to_world(quat, data.qvel[da + 3 : da + 6])[None],
        joint_pos=data.qpos[g1.joint_qpos_adr(model)].copy()[None],
        joint_vel=data.qvel[g1.joint_dof_adr(model)].copy()[None],
        key_body_pos=key[None],
        body_pos=data.xpos[1:].copy()[None],
    )


def robot_state_from_qpos_qvel(model: mujoco.MjModel, qpos: np.ndarray, qvel: np.ndarray) -> RobotState:
    """RobotState (N) of N configurations qpos (N, nq) and velocities qvel (N, nv), by mj_kinematics."""
    qpos = np.atleast_2d(np.asarray(qpos, dtype=np.float64))
    qvel = np.atleast_2d(np.asarray(qvel, dtype=np.float64))
    bad = qpos.shape[0] == 0 or qpos.shape[0] != qvel.shape[0]
    if bad or qpos.shape[1] != model.nq or qvel.shape[1] != model.nv:
        raise ValueError(
            f"qpos must be (N, {model.nq}) and qvel (N, {model.nv}) with the same N >= 1, "
            f"got {qpos.shape} and {qvel.shape}"
        )
    data = mujoco.MjData(model)
    rows = []
    for qp, qv in zip(qpos, qvel, strict=True):
        data.qpos[:] = qp
        data.qvel[:] = qv
        mujoco.mj_kinematics(model, data)
        rows.append(robot_state_from_mujoco(model, data))
    return RobotState(
        **{
            f.name: np.concatenate([getattr(r, f.name) for r in rows], axis=0)
            for f in dataclasses.fields(RobotState)
        }
    )
