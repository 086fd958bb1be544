"""Unitree G1 (29 DoF, rev 1.0): the single source of the robot's constants.

Everything that the simulator, the learner, the MuJoCo validation and the robot client must agree on
lives here: joint order, motor data, PD gains, the action mapping, the default pose, the foot contact
spheres and the key bodies. Joint and body indices are always resolved *by name* against a compiled
``mujoco.MjModel`` (see :func:`joint_qpos_adr`), never assumed from position.

Sources: motor data from Unitree's published rotor inertias and gear stages (as used by mjlab, see
``bcg/assets/unitree_g1/README.md``); gains kp = armature * w^2, kd = 2 * zeta * armature * w with
w = 2 pi 10 rad/s and zeta = 2 (critically over-damped second-order joint, explicit PD stable at
dt = 5 ms because 2 zeta w dt = 1.26 < 2).
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from bcg.core.rotations import quat_exp, quat_rotate

MJCF_PATH = Path(__file__).resolve().parents[1] / "assets" / "unitree_g1" / "g1.xml"

ROOT_BODY = "pelvis"
FREE_JOINT = "floating_base_joint"

#: The 29 actuated joints in motor order (indices 0-28 of the low-level protocol, the motion CSVs
#: and the MJCF after its free joint).
JOINT_NAMES: tuple[str, ...] = (
    "left_hip_pitch_joint", "left_hip_roll_joint", "left_hip_yaw_joint", "left_knee_joint",
    "left_ankle_pitch_joint", "left_ankle_roll_joint",
    "right_hip_pitch_joint", "right_hip_roll_joint", "right_hip_yaw_joint", "right_knee_joint",
    "right_ankle_pitch_joint", "right_ankle_roll_joint",
    "waist_yaw_joint", "waist_roll_joint", "waist_pitch_joint",
    "left_shoulder_pitch_joint", "left_shoulder_roll_joint", "left_shoulder_yaw_joint",
    "left_elbow_joint", "left_wrist_roll_joint", "left_wrist_pitch_joint", "left_wrist_yaw_joint",
    "right_shoulder_pitch_joint", "right_shoulder_roll_joint", "right_shoulder_yaw_joint",
    "right_elbow_joint", "right_wrist_roll_joint", "right_wrist_pitch_joint", "right_wrist_yaw_joint",
)  # fmt: skip
NUM_JOINTS = len(JOINT_NAMES)
#: Motor slots in the DDS messages; slots 29-34 are unused on the 29-DoF robot.
NUM_MOTOR_SLOTS = 35

#: Motor types: (armature kg m^2, effort limit N m, velocity limit rad/s).
MOTORS: dict[str, tuple[float, float, float]] = {
    "7520-14": (0.010178, 88.0, 32.0),
    "7520-22": (0.025102, 139.0, 20.0),
    "5020": (0.0036097, 25.0, 37.0),
    "4010": (0.00425, 5.0, 22.0),
    "2x5020": (2 * 0.0036097, 50.0, 37.0),
}


def _motor_of(joint: str) -> str:
    if "hip_pitch" in joint or "hip_yaw" in joint or joint == "waist_yaw_joint":
        return "7520-14"
    if "hip_roll" in joint or "knee" in joint:
        return "7520-22"
    if "ankle" in joint or joint in ("waist_roll_joint", "waist_pitch_joint"):
        return "2x5020"
    if "wrist_pitch" in joint or "wrist_yaw" in joint:
        return "4010"
    return "5020"  # shoulders, elbow, wrist roll


MOTOR_TYPE: tuple[str, ...] = tuple(_motor_of(j) for j in JOINT_NAMES)
ARMATURE = np.array([MOTORS[m][0] for m in MOTOR_TYPE])  # kg m^2 (29,)
EFFORT_LIMIT = np.array([MOTORS[m][1] for m in MOTOR_TYPE])  # N m (29,)
VELOCITY_LIMIT = np.array([MOTORS[m][2] for m in MOTOR_TYPE])  # rad/s (29,)

NATURAL_FREQUENCY = 2.0 * np.pi * 10.0  # rad/s
DAMPING_RATIO = 2.0
KP = ARMATURE * NATURAL_FREQUENCY**2  # N m / rad (29,)
KD = 2.0 * DAMPING_RATIO * ARMATURE * NATURAL_FREQUENCY  # N m s / rad (29,)

#: Action mapping (BeyondMimic): q_target = DEFAULT_JOINT_POS + ACTION_SCALE * action. A unit action
#: asks for a quarter of the motor's effort limit from the position loop.
ACTION_SCALE = 0.25 * EFFORT_LIMIT / KP  # rad (29,)
ACTION_MAPPING = "default_plus_scale"

PHYSICS_DT = 0.005  # s, PD rate 200 Hz
SUBSTEPS = 4
CONTROL_DT = PHYSICS_DT * SUBSTEPS  # s, policy rate 50 Hz

_DEFAULT = {
    "hip_pitch": -0.1, "knee": 0.3, "ankle_pitch": -0.2,
    "shoulder_pitch": 0.2, "elbow": 1.28,
}  # fmt: skip
DEFAULT_JOINT_POS = np.array(
    [
        next((v for k, v in _DEFAULT.items() if k in j), 0.0)
        + (0.2 if j == "left_shoulder_roll_joint" else -0.2 if j == "right_shoulder_roll_joint" else 0.0)
        for j in JOINT_NAMES
    ]
)  # rad (29,)
DEFAULT_ROOT_POS = np.array([0.0, 0.0, 0.7837])  # m; feet touch z = 0 in this pose
DEFAULT_ROOT_QUAT = np.array([1.0, 0.0, 0.0, 0.0])  # (w, x, y, z)

#: Foot contact spheres: 4 per ankle-roll link at the sole's corners. The MJCF models each sole by
#: seven 1 cm capsules whose axes lie at z = -0.025 m in the ankle-roll frame, spanning
#: x in [-0.054, 0.132] and |y| <= 0.026. The spheres share the capsules' radius and axis height, so
#: their lowest points lie on the same sole plane (z = -0.035 m), at the heel (x = -0.05,
#: |y| = 0.025) and toe (x = 0.12, |y| = 0.03) corners used by Unitree's g1_29dof model.
FOOT_SPHERE_RADIUS = 0.01  # m
FOOT_SPHERES: tuple[tuple[str, tuple[float, float, float]], ...] = tuple(
    (f"{side}_ankle_roll_link", pos)
    for side in ("left", "right")
    for pos in ((-0.05, 0.025, -0.025), (-0.05, -0.025, -0.025), (0.12, 0.03, -0.025), (0.12, -0.03, -0.025))
)
SOLE_HEIGHT = 0.035  # m, from the ankle-roll origin down to the sole plane

#: Key bodies of the observation: (name, body it is fixed to, offset in that body's frame). The MJCF
#: has no head body: the head point is the centre of the torso's head collision sphere.
KEY_BODIES: tuple[tuple[str, str, tuple[float, float, float]], ...] = (
    ("left_ankle_roll_link", "left_ankle_roll_link", (0.0, 0.0, 0.0)),
    ("right_ankle_roll_link", "right_ankle_roll_link", (0.0, 0.0, 0.0)),
    ("head", "torso_link", (0.0, 0.0, 0.43)),
    ("left_wrist_yaw_link", "left_wrist_yaw_link", (0.0, 0.0, 0.0)),
    ("right_wrist_yaw_link", "right_wrist_yaw_link", (0.0, 0.0, 0.0)),
)
FALL_HEIGHT = 0.3  # m, root height below which an episode counts as a fall


def action_to_target(action: np.ndarray, default_joint_pos: np.ndarray = DEFAULT_JOINT_POS) -> np.ndarray:
    """Map policy actions (..., 29) to joint position targets in rad (..., 29)."""
    return default_joint_pos + ACTION_SCALE * np.asarray(action)


def target_to_action(target: np.ndarray, default_joint_pos: np.ndarray = DEFAULT_JOINT_POS) -> np.ndarray:
    """Inverse of :func:`action_to_target`."""
    return (np.asarray(target) - default_joint_pos) / ACTION_SCALE


def load_spec(path: str | Path = MJCF_PATH) -> mujoco.MjSpec:
    """The G1 MJCF as an editable ``mujoco.MjSpec`` (meshes resolved next to the file)."""
    return mujoco.MjSpec.from_file(str(path))


COLLISION_SETS = ("feet", "all", "no-leg-pairs", "none")
LEG_BODY_PARTS = ("_hip_", "_knee_", "_ankle_")  # names of the leg bodies (both sides)


def build_spec(
    floor: bool = True,
    collisions: str = "feet",
    armature: bool = True,
    actuators: bool = False,
    path: str | Path = MJCF_PATH,
) -> mujoco.MjSpec:
    """The G1 prepared for simulation in MuJoCo.

    Args:
        floor: add a ground plane at z = 0.
        collisions: "feet" keeps the 14 foot capsules only (as in training), "all" keeps every
            collision primitive (a fall looks like a fall), "no-leg-pairs" keeps every primitive
            but lets the leg bodies (hip, knee, ankle links) pass through each other, "none"
            disables contact.
        armature: set each joint's motor armature (reflected rotor inertia).
        actuators: add one motor (torque) actuator per joint with the motor's effort limit as
            control range, in :data:`JOINT_NAMES` order.
    """
    if collisions not in COLLISION_SETS:
        raise ValueError(f"collisions must be one of {', '.join(COLLISION_SETS)}, got {collisions!r}")
    spec = load_spec(path)
    spec.option.timestep = PHYSICS_DT
    joints = {j.name: j for j in spec.joints}
    for name, arm in zip(JOINT_NAMES, ARMATURE):
        if armature:
            joints[name].armature = float(arm)
    for geom in spec.geoms:
        if geom.contype == 0 and geom.conaffinity == 0:
            continue
        keep = collisions in ("all", "no-leg-pairs") or (collisions == "feet" and "_foot" in geom.name)
        if not keep:
            geom.contype = 0
            geom.conaffinity = 0
    if collisions == "no-leg-pairs":
        # a pair collides when (contype_a & conaffinity_b) or (contype_b & conaffinity_a): leg geoms
        # of type 2 (left) or 4 (right) with affinity 1 meet the floor and the rest of the body
        # (type 1, affinity 1) but not one another
        for body in spec.bodies:
            side = next((s for s in ("left", "right") if body.name.startswith(s + "_")), None)
            if side is None or not any(part in body.name for part in LEG_BODY_PARTS):
                continue
            for geom in body.geoms:
                if geom.contype or geom.conaffinity:
                    geom.contype, geom.conaffinity = (2 if side == "left" else 4), 1
    if floor:
        spec.worldbody.add_geom(
            name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.4, 0.45, 0.5, 1]
        )
    if actuators:
        for name, limit in zip(JOINT_NAMES, EFFORT_LIMIT):
            act = spec.add_actuator(name=name.replace("_joint", ""), target=name)
            act.trntype = mujoco.mjtTrn.mjTRN_JOINT
            act.ctrlrange = [-float(limit), float(limit)]
            act.ctrllimited = True
    return spec


def load_model(**kwargs) -> mujoco.MjModel:
    """Compiled ``mujoco.MjModel`` of the G1; keyword arguments as :func:`build_spec`."""
    return build_spec(**kwargs).compile()


def joint_qpos_adr(model: mujoco.MjModel, names: tuple[str, ...] = JOINT_NAMES) -> np.ndarray:
    """qpos addresses of the named hinge joints in a compiled model (by name)."""
    return np.array([model.jnt_qposadr[_id(model, mujoco.mjtObj.mjOBJ_JOINT, n)] for n in names])


def joint_dof_adr(model: mujoco.MjModel, names: tuple[str, ...] = JOINT_NAMES) -> np.ndarray:
    """qvel (dof) addresses of the named hinge joints in a compiled model (by name)."""
    return np.array([model.jnt_dofadr[_id(model, mujoco.mjtObj.mjOBJ_JOINT, n)] for n in names])


def body_ids(model: mujoco.MjModel, names) -> np.ndarray:
    """Body ids of the named bodies in a compiled model (by name)."""
    return np.array([_id(model, mujoco.mjtObj.mjOBJ_BODY, n) for n in names])


def _id(model: mujoco.MjModel, kind, name: str) -> int:
    idx = mujoco.mj_name2id(model, kind, name)
    if idx < 0:
        raise KeyError(f"the model has no {kind.name[6:].lower()} named {name!r}")
    return idx


def default_qpos(model: mujoco.MjModel) -> np.ndarray:
    """Full qpos (nq,) of the default standing pose for a compiled G1 model."""
    qpos = model.qpos0.copy()
    qpos[0:3] = DEFAULT_ROOT_POS
    qpos[3:7] = DEFAULT_ROOT_QUAT
    qpos[joint_qpos_adr(model)] = DEFAULT_JOINT_POS
    return qpos


def standing_qpos(ref_qpos: np.ndarray, free: int, joint_adr: np.ndarray) -> np.ndarray:
    """qpos (..., nq) of the robot standing still in the default pose on the ground under each
    reference configuration's root, facing its heading: where ``bcg.robot.run`` starts a policy.

    Args:
        ref_qpos: (..., nq) reference configurations.
        free: qpos address of the free joint; joint_adr: (29,) qpos addresses of the hinges.
    """
    ref_qpos = np.asarray(ref_qpos, dtype=float)
    x_axis = quat_rotate(ref_qpos[..., free + 3 : free + 7], np.array([1.0, 0.0, 0.0]))
    yaw = np.arctan2(x_axis[..., 1], x_axis[..., 0])
    out = np.zeros_like(ref_qpos)
    out[..., free : free + 2] = ref_qpos[..., free : free + 2]
    out[..., free + 2] = DEFAULT_ROOT_POS[2]
    out[..., free + 3 : free + 7] = quat_exp(np.stack([np.zeros_like(yaw), np.zeros_like(yaw), yaw], axis=-1))
    out[..., joint_adr] = DEFAULT_JOINT_POS
    return out


def joint_limits(model: mujoco.MjModel) -> np.ndarray:
    """Joint position limits (29, 2) in rad, read from the model in :data:`JOINT_NAMES` order."""
    ids = [_id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in JOINT_NAMES]
    return model.jnt_range[ids].copy()
