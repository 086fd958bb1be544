"""Episode player for sim-to-sim validation: a policy tracks a motion clip in MuJoCo (or bcg.sim).

One episode, the same for every action source and both simulators:

1. start from the reference at a random phase plus the training reset noise (reference state
   initialisation, :func:`initial_state`);
2. every control step (``g1.CONTROL_DT``): build the robot state, the reference frames at t+1..t+3
   and the noise-free observation with the training code (:func:`bcg.learn.observation.observation`),
   ask the action source for joint targets, then run ``g1.SUBSTEPS`` physics steps of ``g1.PHYSICS_DT``
   with the joint PD ``tau = clip(kp (q* - q) - kd qdot, +-effort_limit)`` recomputed every step;
3. record the tracked points against the reference, the foot-sphere depths at every physics step and
   the root height; stop at a fall (root below ``g1.FALL_HEIGHT``).

The PD gains, torque limits and default pose come from the policy file (:class:`PDParams`), the
armature and the action mapping from :mod:`bcg.core.g1`; no robot constant is repeated here. The MuJoCo G1
(:class:`MujocoG1`) keeps MuJoCo's own contact on every collision primitive (foot capsules and the
rest of the body) and its default semi-implicit Euler integrator; :class:`TrainingSimG1` replays the
same loop in the differentiable simulator :mod:`bcg.sim`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import (
    ReferenceState,
    RobotState,
    body_names,
    reference_state,
    reference_states,
    robot_state_from_mujoco,
)
from bcg.core.rotations import quat_exp, quat_multiply, quat_normalize
from bcg.learn.config import EnvConfig
from bcg.learn.observation import REFERENCE_STEPS, observation
from bcg.learn.policy import Policy
from bcg.motion import MotionClip
from bcg.validate.metrics import FootSpheres, extra_key_points, floor_contact_depth, tracked_points


class EvaluationError(Exception):
    """The evaluation cannot run as asked (mismatched model, clip too short, bad option)."""


# ---------------------------------------------------------------------------------------------------
# PD parameters and action sources


@dataclass(frozen=True)
class PDParams:
    """Joint PD of the evaluation, in :data:`g1.JOINT_NAMES` order.

    Attributes:
        kp: N m/rad (29,).
        kd: N m s/rad (29,).
        effort_limit: N m (29,), torque clip.
        source: where the values came from (for reports).
    """

    kp: np.ndarray
    kd: np.ndarray
    effort_limit: np.ndarray
    source: str

    @classmethod
    def from_policy(cls, policy: Policy, kp_scale: float = 1.0, kd_scale: float = 1.0) -> PDParams:
        """The gains and limits stored in a policy file, optionally scaled."""
        return cls(
            kp=np.asarray(policy.kp, dtype=np.float64) * kp_scale,
            kd=np.asarray(policy.kd, dtype=np.float64) * kd_scale,
            effort_limit=np.asarray(policy.effort_limit, dtype=np.float64),
            source=f"policy file {policy.path}" + _scale_note(kp_scale, kd_scale),
        )

    @classmethod
    def from_g1(cls, kp_scale: float = 1.0, kd_scale: float = 1.0) -> PDParams:
        """The G1 module's gains and limits (for action sources without a policy file)."""
        return cls(
            kp=g1.KP * kp_scale,
            kd=g1.KD * kd_scale,
            effort_limit=g1.EFFORT_LIMIT.copy(),
            source="bcg.core.g1" + _scale_note(kp_scale, kd_scale),
        )

    def torque(self, target: np.ndarray, joint_pos: np.ndarray, joint_vel: np.ndarray) -> np.ndarray:
        """Clipped PD torque N m (29,)."""
        return self.torque_and_demand(target, joint_pos, joint_vel)[0]

    def torque_and_demand(
        self, target: np.ndarray, joint_pos: np.ndarray, joint_vel: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Clipped PD torque N m (29,) and the demand (29,): the PD torque before the clip over the
        effort limit (1 or more: the joint is at its limit)."""
        tau = self.kp * (target - joint_pos) - self.kd * joint_vel
        return np.clip(tau, -self.effort_limit, self.effort_limit), np.abs(tau) / self.effort_limit


def _scale_note(kp_scale: float, kd_scale: float) -> str:
    return "" if kp_scale == kd_scale == 1.0 else f" (kp x{kp_scale:g}, kd x{kd_scale:g})"


class ActionSource(Protocol):
    """Gives joint targets rad (29,) from the observation (825,) and the reference frames t+1..t+3."""

    name: str

    def targets(self, obs: np.ndarray, refs: list[ReferenceState]) -> np.ndarray: ...


@dataclass(frozen=True)
class PolicyActions:
    """The policy's deterministic action (actor mean), mapped to targets with the file's default pose."""

    policy: Policy
    name: str = "policy"

    def targets(self, obs: np.ndarray, refs: list[ReferenceState]) -> np.ndarray:
        return self.policy.targets(self.policy.act(obs[None])[0])


@dataclass(frozen=True)
class ReferencePD:
    """A stand-in for a trained policy: the targets are the reference joint angles at t+1."""

    name: str = "reference-pd"

    def targets(self, obs: np.ndarray, refs: list[ReferenceState]) -> np.ndarray:
        return np.asarray(refs[0].joint_pos[0], dtype=np.float64)


@dataclass(frozen=True, eq=False)
class DefaultPose:
    """A stand-in for a trained policy: the targets are a default pose (29,) rad, held open loop (the
    robot client holds the policy's before A); by default the G1's."""

    pose: np.ndarray = field(default_factory=lambda: g1.DEFAULT_JOINT_POS.copy())
    name: str = "default-pose"

    def targets(self, obs: np.ndarray, refs: list[ReferenceState]) -> np.ndarray:
        return np.array(self.pose, dtype=np.float64)


# ---------------------------------------------------------------------------------------------------
# Simulators


@dataclass(frozen=True)
class ContactRecord:
    """Contact between two bodies other than a foot on the floor, during one episode.

    Attributes:
        bodies: the two body names, sorted ("floor" for the ground plane).
        steps: physics steps with at least one contact between them.
        first_s: s after the episode's start of the first such step.
    """

    bodies: tuple[str, str]
    steps: int
    first_s: float


class Backend(Protocol):
    """A G1 simulator driven one control step at a time."""

    model: mujoco.MjModel  # kinematics model whose qpos/qvel layout the backend uses

    def reset(self, qpos: np.ndarray, qvel: np.ndarray) -> None: ...

    def control_step(self, target: np.ndarray) -> np.ndarray:
        """Hold ``target`` for one control step; returns qpos (SUBSTEPS, nq) after each physics step."""
        ...

    def state(self) -> RobotState: ...

    def foot_depths(self, sub_qpos: np.ndarray) -> np.ndarray:
        """Deepest foot penetration m (SUBSTEPS,) after each physics step of the last control step
        (``sub_qpos``: what :meth:`control_step` returned), by the backend's own contact geometry."""
        ...


def check_armature(model: mujoco.MjModel) -> None:
    """Refuse a model whose joint armature is not the G1 module's (by joint name)."""
    got = model.dof_armature[g1.joint_dof_adr(model)]
    bad = ~np.isclose(got, g1.ARMATURE, rtol=1e-12, atol=0.0)
    if np.any(bad):
        j = int(np.argmax(bad))
        raise EvaluationError(
            f"armature of {g1.JOINT_NAMES[j]} is {got[j]} in the model, the G1 module has {g1.ARMATURE[j]}"
        )


class MujocoG1:
    """The G1 in MuJoCo with the training PD recomputed at every physics step.

    Args:
        pd: gains and torque limits.
        collisions: "all" (default: foot capsules and every other collision primitive), "feet",
            "no-leg-pairs" or "none" (see :func:`g1.build_spec`).
        floor: add the ground plane.
        actuation: "qfrc" writes the PD torque into ``qfrc_applied``; "motor" drives one MuJoCo motor
            actuator per joint whose control range is the G1's effort limit (must equal ``pd``'s).
    """

    def __init__(self, pd: PDParams, collisions: str = "all", floor: bool = True, actuation: str = "qfrc"):
        if actuation not in ("qfrc", "motor"):
            raise EvaluationError(f"actuation must be 'qfrc' or 'motor', got {actuation!r}")
        self.pd, self.actuation = pd, actuation
        self.model = g1.load_model(
            floor=floor, collisions=collisions, armature=True, actuators=actuation == "motor"
        )
        check_armature(self.model)
        if abs(self.model.opt.timestep - g1.PHYSICS_DT) > 1e-15:
            raise EvaluationError(
                f"model timestep {self.model.opt.timestep} s, the G1 runs at {g1.PHYSICS_DT} s"
            )
        self.data = mujoco.MjData(self.model)
        self.qadr, self.dadr = g1.joint_qpos_adr(self.model), g1.joint_dof_adr(self.model)
        # contact log: pairs of bodies (index a * nbody + b, a <= b; body 0 is the world, i.e. the
        # floor) other than a foot body on the floor, which is the contact training models
        feet = g1.body_ids(self.model, sorted({body for body, _ in g1.FOOT_SPHERES}))
        self._foot_floor = {int(b) for b in feet}  # key of (world, foot) = 0 * nbody + foot
        self._feet = np.array(sorted(self._foot_floor))
        self.last_foot_depth = np.zeros(g1.SUBSTEPS)
        self.last_effort_demand = np.zeros((g1.SUBSTEPS, g1.NUM_JOINTS))
        self._contact_steps: dict[int, int] = {}
        self._contact_first: dict[int, float] = {}
        if actuation == "motor":
            self.act_id = self._actuators_by_joint()
            ctrl_range = self.model.actuator_ctrlrange[self.act_id]
            if not np.allclose(ctrl_range[:, 1], pd.effort_limit, rtol=1e-12, atol=0.0):
                raise EvaluationError("motor control ranges differ from the policy's effort limits")

    def _actuators_by_joint(self) -> np.ndarray:
        joint_of = {int(self.model.actuator_trnid[a, 0]): a for a in range(self.model.nu)}
        ids = []
        for name in g1.JOINT_NAMES:
            jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
            if jid not in joint_of:
                raise EvaluationError(f"the model has no actuator on joint {name!r}")
            ids.append(joint_of[jid])
        return np.array(ids)

    def reset(self, qpos: np.ndarray, qvel: np.ndarray) -> None:
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:] = qpos
        self.data.qvel[:] = qvel
        mujoco.mj_forward(self.model, self.data)
        self._contact_steps, self._contact_first = {}, {}

    def control_step(self, target: np.ndarray) -> np.ndarray:
        out = np.empty((g1.SUBSTEPS, self.model.nq))
        for s in range(g1.SUBSTEPS):
            q, qd = self.data.qpos[self.qadr], self.data.qvel[self.dadr]
            tau, self.last_effort_demand[s] = self.pd.torque_and_demand(target, q, qd)
            if self.actuation == "qfrc":
                self.data.qfrc_applied[self.dadr] = tau
            else:
                self.data.ctrl[self.act_id] = tau
            mujoco.mj_step(self.model, self.data)
            out[s] = self.data.qpos
            self._log_contacts()
            # the new state's contacts (mj_step's are those of the state it started from)
            mujoco.mj_kinematics(self.model, self.data)
            mujoco.mj_collision(self.model, self.data)
            self.last_foot_depth[s] = floor_contact_depth(self.model, self.data, self._feet)
        return out

    def foot_depths(self, sub_qpos: np.ndarray) -> np.ndarray:
        """Deepest foot penetration m after each physics step of the last control step: MuJoCo's own
        contact depth of its foot geometry on the floor."""
        return self.last_foot_depth.copy()

    def effort_demands(self) -> np.ndarray:
        """(SUBSTEPS, 29) the PD torque before the clip over the effort limit in each physics step of
        the last control step."""
        return self.last_effort_demand.copy()

    def state(self) -> RobotState:
        return robot_state_from_mujoco(self.model, self.data)

    def _log_contacts(self) -> None:
        n = self.data.ncon
        if n == 0:
            return
        geoms = self.data.contact.geom[:n]
        bodies = np.sort(self.model.geom_bodyid[geoms], axis=1)
        for key in np.unique(bodies[:, 0] * self.model.nbody + bodies[:, 1]).tolist():
            if key in self._foot_floor:
                continue
            self._contact_steps[key] = self._contact_steps.get(key, 0) + 1
            # data.contact is the state at the start of the step just taken, data.time its end
            self._contact_first.setdefault(key, float(self.data.time - self.model.opt.timestep))

    def other_contacts(self) -> list[ContactRecord]:
        """Contacts since the last :meth:`reset` other than a foot on the floor (self-collisions,
        knees or hands on the floor), most frequent first."""
        records = []
        for key, steps in self._contact_steps.items():
            a, b = divmod(key, self.model.nbody)
            names = tuple(
                "floor" if i == 0 else mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_BODY, i)
                for i in (a, b)
            )
            records.append(ContactRecord(tuple(sorted(names)), steps, round(self._contact_first[key], 6)))
        return sorted(records, key=lambda r: (-r.steps, r.first_s, r.bodies))


class TrainingSimG1:
    """The same player on the differentiable simulator :mod:`bcg.sim` (no gradients).

    Args:
        pd: gains (set per joint in the simulator; the effort limit must be the G1 module's, which
            :func:`bcg.g1sim.make_g1` uses).
        contact: a ``bcg.sim`` contact configuration, or None (no ground: free fall).
        window: control steps per buffer window (the window is restarted when full).
        leg_contact: (k N/m, c s/m, L N) of the legs' contact with each other (k = 0: none).
        joint_limits: (spring, damper) of the joint limits as ratios to the G1's PD gains
            (:func:`bcg.g1sim.joint_limits`; 0: none).
    """

    def __init__(
        self,
        pd: PDParams,
        contact=None,
        window: int = 50,
        leg_contact=(0.0, 0.5, 200.0),
        joint_limits=(0.0, 0.0),
    ):
        # Taichi, slow to import, loads only when the replay is asked for
        from bcg import g1sim
        from bcg.sim import SelfContactConfig  # (Taichi too)

        if not np.allclose(pd.effort_limit, g1.EFFORT_LIMIT, rtol=1e-12, atol=0.0):
            raise EvaluationError("bcg.sim's G1 uses the G1 module's effort limits; the policy's differ")
        legs = None
        if leg_contact[0] > 0:
            legs = SelfContactConfig(
                stiffness=leg_contact[0], damping=leg_contact[1], force_limit=leg_contact[2]
            )
        kwargs = {"self_contact": legs} if contact is None else {"contact": contact, "self_contact": legs}
        kwargs["joint_limits"] = g1sim.joint_limits(*joint_limits) if joint_limits[0] > 0 else None
        self.sim = g1sim.make_g1(num_envs=1, max_steps=window, requires_grad=False, **kwargs)
        self.sim.set_params(kp=pd.kp, kd=pd.kd)
        self.model = g1.load_model(floor=False, collisions="none")
        if (self.sim.nq, self.sim.nv) != (self.model.nq, self.model.nv):
            raise EvaluationError("bcg.sim's G1 and the MuJoCo G1 have different state sizes")
        self.data = mujoco.MjData(self.model)
        self._spheres, self._kin_data = FootSpheres.of(self.model), mujoco.MjData(self.model)

    def reset(self, qpos: np.ndarray, qvel: np.ndarray) -> None:
        self.sim.set_state(qpos[None], qvel[None])
        self._sync()

    def _sync(self) -> None:
        self.data.qpos[:] = self.sim.qpos_now[0]
        self.data.qvel[:] = self.sim.qvel_now[0]
        mujoco.mj_kinematics(self.model, self.data)

    def control_step(self, target: np.ndarray) -> np.ndarray:
        if self.sim.substep // self.sim.substeps >= self.sim.max_steps:
            self.sim.reset_window()
        start = self.sim.substep
        self.sim.step(np.asarray(target)[None])
        qpos, _ = self.sim.trajectory()
        self._sync()
        return qpos[start + 1 :, 0].astype(np.float64)

    def state(self) -> RobotState:
        return robot_state_from_mujoco(self.model, self.data)

    def foot_depths(self, sub_qpos: np.ndarray) -> np.ndarray:
        """Deepest foot-sphere penetration m after each physics step: the spheres are this
        simulator's contact geometry."""
        spheres, data = self._spheres, self._kin_data
        out = np.empty(len(sub_qpos))
        for s, q in enumerate(sub_qpos):
            data.qpos[:] = q
            mujoco.mj_kinematics(self.model, data)
            out[s] = spheres.depth(data.xpos, data.xmat).max()
        return out


# ---------------------------------------------------------------------------------------------------
# Reference state initialisation


@dataclass(frozen=True)
class ResetNoise:
    """Uniform noise U(-n, n) added to the reference start state.

    Build it with :meth:`of_training` (the training run's values); the defaults are the paper's reset
    table, the fallback when neither the policy file nor the training code provides them.

    Attributes:
        root_xy: m, root position x and y.
        root_z: m, root height.
        roll_pitch: rad, root roll and pitch (applied in the world frame).
        yaw: rad, root yaw.
        joint_pos: rad, every joint (clipped to the joint range).
    """

    root_xy: float = 0.05
    root_z: float = 0.01
    roll_pitch: float = 0.1
    yaw: float = 0.2
    joint_pos: float = 0.1

    @classmethod
    def none(cls) -> ResetNoise:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0)

    @classmethod
    def of_training(cls, config: dict | None) -> ResetNoise:
        """The reset noise of a training run: the ``reset_*`` entries of its resolved config (as stored
        in the policy file, at the top level or under "env"), else the training environment's
        defaults (:class:`bcg.learn.config.EnvConfig`), else this class's defaults (the paper's)."""
        keys = {
            "root_xy": "reset_root_xy", "root_z": "reset_root_z", "roll_pitch": "reset_root_roll_pitch",
            "yaw": "reset_root_yaw", "joint_pos": "reset_joint_pos",
        }  # fmt: skip
        for section in (config or {}, (config or {}).get("env", {})):
            if isinstance(section, dict) and all(k in section for k in keys.values()):
                if section.get("reset_noise") is False:
                    return cls.none()
                values = {name: section[key] for name, key in keys.items()}
                if not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                    for v in values.values()
                ):
                    raise EvaluationError(f"the policy's stored config has malformed reset noise {values}")
                return cls(**{name: float(v) for name, v in values.items()})
        env = EnvConfig()
        return cls(**{name: float(getattr(env, key)) for name, key in keys.items()})


def initial_state(
    clip: MotionClip,
    model: mujoco.MjModel,
    rng: np.random.Generator,
    seconds: float,
    noise: ResetNoise,
    start_time: float | None = None,
    standing: bool = False,
    lead_out: float = 0.0,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Start time s, qpos (nq,) and qvel (nv,): the reference at a random phase plus reset noise.

    The phase is uniform on [0, duration - seconds - 3 control steps] so that the whole episode and
    its observed future frames lie inside the clip, or ``start_time`` (s) when given (the phase is
    still drawn, so a seed's noise is the same either way). With ``standing`` the robot stands
    still in the default pose instead, at the reference's root position on the ground and its
    heading, as the robot does when A starts the policy (``bcg.robot.run``); the noise is the same.
    With a ``lead_out`` (s; a policy trained with ``env.clip_end_hold``) an episode may run past the
    clip's last frame by that much, on the frame held still, and the phase is uniform on [0,
    duration + lead_out - seconds].
    """
    horizon = seconds + max(REFERENCE_STEPS) * g1.CONTROL_DT
    room = clip.duration + lead_out - seconds if lead_out > 0.0 else clip.duration - horizon
    if room <= 0.0 if lead_out == 0.0 else room < 0.0:
        raise EvaluationError(
            f"{clip.path.name} lasts {clip.duration:.2f} s"
            + (f" with a {lead_out:g} s lead-out" if lead_out else "")
            + f": episodes of {seconds:g} s"
            + ("" if lead_out else f" (plus {max(REFERENCE_STEPS)} observed frames)")
            + f" do not fit; use at most {_longest(seconds + room, strict=not lead_out):.2f} s"
        )
    if lead_out > 0.0:
        t0 = float(rng.uniform(0.0, room))  # one draw, as random_phase makes
    else:
        t0 = float(clip.random_phase(rng, 1, horizon=horizon)[0])
    if start_time is not None:
        if not 0.0 <= start_time <= room:
            extra = f"a {lead_out:g} s lead-out" if lead_out else f"{max(REFERENCE_STEPS)} observed frames"
            raise EvaluationError(
                f"a start at {start_time:g} s leaves no room for {seconds:g} s in {clip.path.name} "
                f"({clip.duration:.2f} s with {extra}): start between 0 and {room:.2f} s"
            )
        t0 = float(start_time)
    ref = clip.sample(np.array([t0]), still_after_end=lead_out > 0.0)
    qpos, qvel = clip.qpos(ref)[0], clip.qvel(ref)[0]
    free = model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, g1.FREE_JOINT)]
    if standing:
        qpos, qvel = g1.standing_qpos(qpos, free, g1.joint_qpos_adr(model)), np.zeros(model.nv)
    qpos[free : free + 2] += rng.uniform(-noise.root_xy, noise.root_xy, 2)
    qpos[free + 2] += rng.uniform(-noise.root_z, noise.root_z)
    angles = rng.uniform(-1.0, 1.0, 3) * np.array([noise.roll_pitch, noise.roll_pitch, noise.yaw])
    # roll about x, pitch about y, yaw about z, composed as a world-frame rotation of the root
    q_noise = quat_multiply(
        quat_exp(np.array([0.0, 0.0, angles[2]])),
        quat_multiply(quat_exp(np.array([0.0, angles[1], 0.0])), quat_exp(np.array([angles[0], 0.0, 0.0]))),
    )
    qpos[free + 3 : free + 7] = quat_normalize(quat_multiply(q_noise, qpos[free + 3 : free + 7]))
    adr = g1.joint_qpos_adr(model)
    limits = g1.joint_limits(model)
    joints = qpos[adr] + rng.uniform(-noise.joint_pos, noise.joint_pos, g1.NUM_JOINTS)
    qpos[adr] = np.clip(joints, limits[:, 0], limits[:, 1])
    return t0, qpos, qvel


# ---------------------------------------------------------------------------------------------------
# Episodes


@dataclass
class Episode:
    """Record of one episode.

    Attributes:
        start_time: s, clip time of the start state.
        times: s (K,), clip time after each control step.
        qpos: (K + 1, nq) at the control-step boundaries, the start state first.
        ref_qpos: (K + 1, nq) reference configurations at the same times.
        points: m (K, P, 3) tracked points (:func:`bcg.validate.metrics.tracked_points`) after each step.
        ref_points: m (K, P, 3) the reference's at the same times.
        foot_depth: m (K * SUBSTEPS,) deepest foot penetration after every physics step, by the
            backend's own contact geometry (MuJoCo: its contacts of the foot capsules on the floor;
            bcg.sim: its foot spheres).
        targets: rad (K, 29) joint targets of each control step.
        fell: the root dropped below the fall height; fall_time: s after the start, or None.
        other_contacts: contacts other than a foot on the floor (MuJoCo only; None where the
            simulator models foot contact alone).
        effort_demand: (K * SUBSTEPS, 29) the PD torque before the clip over the joint's effort
            limit, every physics step (MuJoCo only; 1 or more: the joint is at its limit).
    """

    start_time: float
    times: np.ndarray
    qpos: np.ndarray
    ref_qpos: np.ndarray
    points: np.ndarray
    ref_points: np.ndarray
    foot_depth: np.ndarray
    targets: np.ndarray
    fell: bool
    fall_time: float | None = None
    other_contacts: tuple[ContactRecord, ...] | None = None
    effort_demand: np.ndarray | None = None

    @property
    def root_height(self) -> np.ndarray:
        """m (K + 1,)."""
        return self.qpos[:, 2]


def check_clip(clip: MotionClip, model: mujoco.MjModel) -> None:
    """Refuse a clip whose bodies are not the model's (in the model's order, by name)."""
    if tuple(clip.body_names) != body_names(model) or tuple(clip.joint_names) != g1.JOINT_NAMES:
        raise EvaluationError(f"{clip.path}: the clip's bodies or joints are not the evaluation model's")


def run_episode(
    backend: Backend,
    source: ActionSource,
    clip: MotionClip,
    start: tuple[float, np.ndarray, np.ndarray],
    steps: int,
    stop_on_fall: bool = True,
    policy_blend: float = 0.0,
    still_after_end: bool = False,
) -> Episode:
    """Play ``steps`` control steps from ``start`` = (clip time s, qpos, qvel).

    The observation is the training code's, noise-free (deterministic evaluation). With
    ``policy_blend`` (s) the targets blend linearly from the default pose to the source's over that
    time, as ``bcg.robot.run`` does after A (the weight at each control step's midpoint). With
    ``still_after_end`` the reference past the clip's last frame is that frame held still (a lead-out).
    """
    model = backend.model
    check_clip(clip, model)
    extra = extra_key_points(model)
    t0, qpos0, qvel0 = start
    backend.reset(qpos0, qvel0)
    qpos, ref_qpos, points, ref_points, depth, targets, times = [qpos0.copy()], [], [], [], [], [], []
    demands = [] if hasattr(backend, "effort_demands") else None
    held = still_after_end
    ref_qpos.append(clip.qpos(clip.sample(np.array([t0]), still_after_end=held))[0])
    fall_time = None
    for k in range(steps):
        t = t0 + k * g1.CONTROL_DT
        robot = backend.state()
        refs = reference_states(clip.sample_future(np.array([t]), REFERENCE_STEPS, still_after_end=held))
        obs = observation(robot, refs)[0]
        target = np.asarray(source.targets(obs, refs), dtype=np.float64)
        if target.shape != (g1.NUM_JOINTS,) or not np.all(np.isfinite(target)):
            raise EvaluationError(f"{source.name} gave targets of shape {target.shape} or non-finite values")
        if policy_blend > 0.0:
            weight = min(1.0, (k + 0.5) * g1.CONTROL_DT / policy_blend)
            target = g1.DEFAULT_JOINT_POS + weight * (target - g1.DEFAULT_JOINT_POS)
        sub_qpos = backend.control_step(target)
        depth.extend(backend.foot_depths(sub_qpos))
        if demands is not None:
            demands.extend(backend.effort_demands())
        now = backend.state()
        ref_now = clip.sample(np.array([t + g1.CONTROL_DT]), still_after_end=held)
        points.append(tracked_points(now, extra)[0])
        ref_points.append(tracked_points(reference_state(ref_now), extra)[0])
        qpos.append(sub_qpos[-1].copy())
        ref_qpos.append(clip.qpos(ref_now)[0])
        targets.append(target)
        times.append(t + g1.CONTROL_DT)
        # a non-finite state counts as a fall (NaN < threshold is False), as training terminates it
        if fall_time is None and not now.root_pos[0, 2] >= g1.FALL_HEIGHT:
            fall_time = (k + 1) * g1.CONTROL_DT
            if stop_on_fall:
                break
    return Episode(
        start_time=t0,
        times=np.array(times),
        qpos=np.array(qpos),
        ref_qpos=np.array(ref_qpos),
        points=np.array(points).reshape(len(points), -1, 3),
        ref_points=np.array(ref_points).reshape(len(ref_points), -1, 3),
        foot_depth=np.array(depth, dtype=np.float64),
        targets=np.array(targets).reshape(-1, g1.NUM_JOINTS),
        fell=fall_time is not None,
        fall_time=fall_time,
        other_contacts=tuple(backend.other_contacts()) if hasattr(backend, "other_contacts") else None,
        effort_demand=None if demands is None else np.array(demands).reshape(-1, g1.NUM_JOINTS),
    )


def _longest(limit: float, strict: bool) -> float:
    """The longest episode in whole hundredths of a second that fits ``limit`` (below it if
    ``strict``), so that the figure an error message suggests is accepted when given back."""
    hundredths = math.floor(limit * 100.0 + (-1e-6 if strict else 1e-9))
    return hundredths / 100.0
