"""The G1 motion-tracking environment on the differentiable simulator, with its reverse pass.

One instance drives ``num_envs`` G1 robots in one :class:`bcg.sim.Simulator` through SHAC windows of
``horizon`` control steps (:class:`bcg.learn.env_protocol.DifferentiableEnv` is the interface the
learners rely on).

Per control step k (state s_k = (qpos, qvel) at substep 4k):

    o_k   = observation(s_k, reference at t_k + 1, 2, 3 steps) (+ uniform noise for the actor)
    ctrl  = q_default + offset + ACTION_SCALE * a_{k - latency}    (g1.action_to_target)
    s_k+1 = simulator step (4 substeps), plus a push now and then
    Δ_k   = f(reference at t_k + 1 step) - f(s_k+1)                (ADD features, 305 dims)
    r_k   = r_ADD(Δ_k) - w ‖m_k - m_k-1‖²                           (w = 0.8)

where m_k is the policy's mean action μ_θ(o_k) (``EnvConfig.action_rate_on = "mean"``, the default)
or the sampled action a_k (``"sample"``). Choice [R], measured: with the paper's initial action std of
1.0 the sampled actions' rate term alone is about -0.8 · 2 · 29 ≈ -46 per step while r_ADD lies in
[0, 18.4]; every step alive then costs reward, and since a fall ends the episode with a zero
bootstrap, the actor is taught to fall. On the mean, the term penalises what the policy chooses (a
jerky μ_θ), not its exploration noise.

Episodes start from the reference at a random phase plus the paper's reset noise, and end on a fall
(root height < 0.3 m, a non-finite state, or an observation entry beyond ``OBS_LIMIT`` = 1e6 in
magnitude, as in SHAC: early termination) or when the clip has no reference
frames left for the observation (timeout). Choice [R]: episodes are reset only at window
boundaries; an env whose episode ended inside a window waits for the window's end, and the learner
ignores its later steps (``alive`` mask). The simulator's window therefore never needs a per-env
state overwrite, and the reverse pass stays a plain chain. While it waits, the env is held out of the
simulation (``Simulator.step(hold=...)``: its state stands still, it costs nothing and opens no
bundle; ``EnvConfig.hold_ended_episodes``); about 30 % of a window's env-steps are such waits in
early training.

Domain randomisation (each item switchable in :class:`EnvConfig`) is drawn per episode: ground friction
(when the simulator has contact), base mass offset, link mass (and inertia) scale, CoM offset, PD gain
scale, armature scale, joint friction scale, default joint offset, action latency of 0 or 1 control
step, and pushes every U(1, 3) s. A push changes the root velocity by Δv through an applied
generalized force held over one control step, qfrc = M[:, :6] Δv / Δt (M at the step's start, treated
as a constant in the reverse pass), which keeps the step differentiable. The force acts over the
control step's four substeps, so the root velocity changes by Δv over the step; the joints' PD
response changes the angular part by up to about a fifth.

Reverse pass: :meth:`G1TrackingEnv.state_vjp` turns dL/d(observation at s_k) and dL/dr_{k-1} into
dL/d(qpos_k, qvel_k) (observation and feature VJPs, then the simulator's kinematics VJP for the body
positions) plus the action-rate terms' dL/da; :meth:`G1TrackingEnv.ctrl_vjp` maps dL/dctrl to dL/da.
"""

from __future__ import annotations

import mujoco
import numpy as np

import bcg.sim
from bcg.core import g1
from bcg.core.kinematics import RobotState, RobotStateGrad, g1_joint_axes, reference_states
from bcg.core.rotations import (
    quat_multiply,
    quat_normalize,
    quat_to_matrix,
    quat_to_matrix_vjp,
    rpy_to_quat,
)
from bcg.learn.clearance import LegCapsules, leg_clearance_penalty, leg_clearance_vjp
from bcg.learn.config import EnvConfig
from bcg.learn.discriminator import Discriminator, add_reward, tracking_reward
from bcg.learn.env_protocol import StepResult
from bcg.learn.features import FEATURE_SIZE, add_features, add_features_vjp
from bcg.learn.mlp import rng_from_state, rng_state
from bcg.learn.observation import OBSERVATION_SIZE, REFERENCE_STEPS, observation, observation_vjp
from bcg.learn.shaping import bounded_cost, bounded_cost_slope
from bcg.learn.start_phases import FailurePhases
from bcg.learn.training_sim import make_g1_sim
from bcg.motion import MotionClip

OBS_LIMIT = 1e6  # an observation entry beyond this ends the episode (SHAC's early termination)


class G1TrackingEnv:
    """Motion tracking of one reference clip by ``num_envs`` G1 robots (see the module docstring).

    Args:
        cfg: environment config.
        num_envs: N.
        horizon: control steps per window (the simulator's ``max_steps``).
        disc: the ADD discriminator, read (never modified) for the reward.
        rng: draws resets, randomisation and observation noise.
        clip: reference motion; default ``MotionClip.load(cfg.motion)`` (``cfg.clip_lead_in`` added).
        sim: simulator; default :func:`make_g1_sim`.
    """

    def __init__(
        self,
        cfg: EnvConfig,
        num_envs: int,
        horizon: int,
        disc: Discriminator,
        rng: np.random.Generator,
        clip: MotionClip | None = None,
        sim: bcg.sim.Simulator | None = None,
    ):
        self.cfg = cfg
        self.num_envs, self.horizon = int(num_envs), int(horizon)
        self.disc = disc
        self.rng = rng
        self.clip = (clip if clip is not None else MotionClip.load(cfg.motion)).with_lead_in(cfg.clip_lead_in)
        self.sim = sim if sim is not None else make_g1_sim(cfg, num_envs, horizon)
        if self.sim.num_envs != self.num_envs or self.sim.max_steps < self.horizon:
            raise ValueError(
                f"simulator holds {self.sim.num_envs} envs x {self.sim.max_steps} steps, "
                f"need {self.num_envs} x {self.horizon}"
            )
        self.obs_dim, self.act_dim = OBSERVATION_SIZE, g1.NUM_JOINTS
        self.feature_dim = FEATURE_SIZE
        self.has_contact = getattr(self.sim, "contact", None) is not None
        # a simulator without gradients (PPO's) has no reverse pass: skip the reward's VJP data
        self.requires_grad = bool(getattr(getattr(self.sim, "config", None), "requires_grad", True))
        model = g1.load_model(floor=False, collisions="none")
        self._jq, self._jd = g1.joint_qpos_adr(model), g1.joint_dof_adr(model)
        self._joint_limits = g1.joint_limits(model)  # (29, 2): the reset noise stays within them
        free = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, g1.FREE_JOINT)
        self._fq, self._fd = int(model.jnt_qposadr[free]), int(model.jnt_dofadr[free])
        self._key_ids = g1.body_ids(model, [body for _, body, _ in g1.KEY_BODIES])
        self._key_offsets = np.array([o for _, _, o in g1.KEY_BODIES])
        self._pelvis = int(g1.body_ids(model, [g1.ROOT_BODY])[0])
        self._legs = LegCapsules.of()  # the same bodies as model, with collision primitives
        self._axes = g1_joint_axes()
        self._base = {name: self.sim.get_param(name)[0].copy() for name in self._param_names()}
        n = self.num_envs
        self.qpos = np.zeros((n, self.sim.nq))
        self.qvel = np.zeros((n, self.sim.nv))
        self.time = np.zeros(n)
        self.latency = np.zeros(n, np.int64)
        self.default_pos = np.tile(g1.DEFAULT_JOINT_POS, (n, 1))
        self.prev_action = np.zeros((n, self.act_dim))
        self.prev_rate_action = np.zeros((n, self.act_dim))  # m_{k-1} of the action-rate term
        self._means_given: bool | None = None
        self.push_countdown = np.full(n, np.inf)
        self.params = {k: np.tile(v, (n,) + (1,) * v.ndim) for k, v in self._base.items()}
        self.friction = np.full(n, 1.0)
        self.episode_length = np.zeros(n, np.int64)
        self.episode_return = np.zeros(n)
        self.needs_reset = np.ones(n, bool)
        # an episode ends where the clip leaves no observed frames, or after the lead-out
        hold = cfg.clip_end_hold
        self._episode_end = (
            self.clip.duration + hold
            if hold > 0
            else (self.clip.duration - len(REFERENCE_STEPS) * g1.CONTROL_DT)
        )
        self.start_phases = FailurePhases(
            self.clip,
            cfg.start_failure_mix,
            cfg.start_failure_lead,
            cfg.start_failure_memory,
            begin_mix=cfg.start_clip_begin_mix,
        )
        # (length, return, terminated, lost track and did not fall) of the episodes that ended
        self.finished: list[tuple[int, float, bool, bool]] = []
        # the action-rate term's weight now: the learner ramps it in (TrainConfig.action_rate_ramp)
        self.action_rate_weight = float(cfg.action_rate_weight)

    # ------------------------------------------------------------------ resets and randomisation
    @staticmethod
    def _param_names() -> tuple[str, ...]:
        return ("body_mass", "body_ipos", "body_inertia", "dof_armature", "dof_frictionloss", "kp", "kd")

    def request_reset(self, mask: np.ndarray) -> None:
        """Reset these envs (N,) bool at the next window start (e.g. after a non-finite state)."""
        self.needs_reset |= np.asarray(mask, bool)

    def _randomise(self, idx: np.ndarray) -> None:
        cfg, rng, m = self.cfg, self.rng, len(idx)
        nb, nv, nu = self._base["body_mass"].shape[0], self._base["dof_armature"].shape[0], self.act_dim
        u = lambda r, shape: rng.uniform(r[0], r[1], shape)  # noqa: E731
        mass = np.tile(self._base["body_mass"], (m, 1))
        inertia = np.tile(self._base["body_inertia"], (m, 1, 1))
        if cfg.dr_link_mass:
            scale = u(cfg.link_mass_scale, (m, nb))
            mass, inertia = mass * scale, inertia * scale[..., None]
        if cfg.dr_base_mass:
            mass[:, self._pelvis] += u(cfg.base_mass_offset, m)
        ipos = np.tile(self._base["body_ipos"], (m, 1, 1))
        if cfg.dr_com:
            ipos[:, 1:] += rng.uniform(-cfg.com_offset, cfg.com_offset, (m, nb - 1, 3))
        gains = u(cfg.pd_gain_scale, (m, nu)) if cfg.dr_pd_gains else np.ones((m, nu))
        arm = u(cfg.armature_scale, (m, nv)) if cfg.dr_armature else np.ones((m, nv))
        fric_scale = u(cfg.joint_friction_scale, (m, nv)) if cfg.dr_joint_friction else np.ones((m, nv))
        frictionloss = (
            self._base["dof_frictionloss"] + cfg.joint_friction * (np.arange(nv) >= 6)
        ) * fric_scale
        self.params["body_mass"][idx] = mass
        self.params["body_inertia"][idx] = inertia
        self.params["body_ipos"][idx] = ipos
        self.params["kp"][idx] = self._base["kp"] * gains
        self.params["kd"][idx] = self._base["kd"] * gains
        self.params["dof_armature"][idx] = self._base["dof_armature"] * arm
        self.params["dof_frictionloss"][idx] = frictionloss
        self.friction[idx] = u(cfg.friction, m) if cfg.dr_friction else 1.0
        offset = cfg.default_joint_offset
        self.default_pos[idx] = g1.DEFAULT_JOINT_POS + (
            rng.uniform(-offset, offset, (m, nu)) if cfg.dr_default_offset else 0.0
        )
        self.latency[idx] = rng.integers(0, cfg.max_latency + 1, m) if cfg.dr_latency else 0
        self.push_countdown[idx] = u(cfg.push_interval, m) if cfg.dr_push else np.inf

    def _reset(self, idx: np.ndarray) -> None:
        cfg, rng, m = self.cfg, self.rng, len(idx)
        t0 = self.start_phases.sample(rng, m)
        # no draw when off: the same random numbers as before the option
        standing = rng.random(m) < cfg.start_standing_mix if cfg.start_standing_mix > 0.0 else None
        if standing is not None:
            t0[standing] = 0.0
        ref = self.clip.sample(t0)
        qpos, qvel = self.clip.qpos(ref), self.clip.qvel(ref)
        if standing is not None and standing.any():
            qpos[standing], qvel[standing] = g1.standing_qpos(qpos[standing], self._fq, self._jq), 0.0
        if cfg.reset_noise:
            fq = self._fq
            qpos[:, fq : fq + 2] += rng.uniform(-cfg.reset_root_xy, cfg.reset_root_xy, (m, 2))
            qpos[:, fq + 2] += rng.uniform(-cfg.reset_root_z, cfg.reset_root_z, m)
            rp, yaw = cfg.reset_root_roll_pitch, cfg.reset_root_yaw
            dq = rpy_to_quat(rng.uniform(-rp, rp, m), rng.uniform(-rp, rp, m), rng.uniform(-yaw, yaw, m))
            qpos[:, fq + 3 : fq + 7] = quat_normalize(quat_multiply(dq, qpos[:, fq + 3 : fq + 7]))
            q_ref = qpos[:, self._jq]
            noisy = q_ref + rng.uniform(-cfg.reset_joint_pos, cfg.reset_joint_pos, (m, self.act_dim))
            lo, hi = self._joint_limits[:, 0], self._joint_limits[:, 1]
            # within the joint limits (MuJoCo enforces them, bcg.sim does not), or no further
            # beyond one than the reference is
            qpos[:, self._jq] = np.clip(noisy, np.minimum(lo, q_ref), np.maximum(hi, q_ref))
        self.qpos[idx], self.qvel[idx], self.time[idx] = qpos, qvel, t0
        self.episode_length[idx] = 0
        self.episode_return[idx] = 0.0
        self._randomise(idx)  # draws default_pos, which the hold action is relative to
        if cfg.reset_action == "hold":
            hold = (qpos[:, self._jq] - self.default_pos[idx]) / g1.ACTION_SCALE
        else:
            hold = 0.0
        self.prev_action[idx] = hold
        self.prev_rate_action[idx] = hold

    # ------------------------------------------------------------------ state helpers
    def robot_state(
        self, qpos: np.ndarray, qvel: np.ndarray, xpos: np.ndarray, xquat: np.ndarray
    ) -> RobotState:
        """RobotState (world frame, with all body origins) of simulator state and kinematics."""
        fq, fd = self._fq, self._fd
        root_quat = qpos[:, fq + 3 : fq + 7]
        key_rot = quat_to_matrix(xquat[:, self._key_ids])
        key = xpos[:, self._key_ids] + np.einsum("nkij,kj->nki", key_rot, self._key_offsets)
        return RobotState(
            root_pos=qpos[:, fq : fq + 3],
            root_quat=root_quat,
            root_lin_vel=qvel[:, fd : fd + 3],
            root_ang_vel=np.einsum("nij,nj->ni", quat_to_matrix(root_quat), qvel[:, fd + 3 : fd + 6]),
            joint_pos=qpos[:, self._jq],
            joint_vel=qvel[:, self._jd],
            key_body_pos=key,
            body_pos=xpos[:, 1:],
        )

    def _observe(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Observation of the stored state k (actor, critic), with fresh references."""
        held = self.cfg.clip_end_hold > 0  # the lead-out: the last frame held still
        refs = reference_states(self.clip.sample_future(self.time, REFERENCE_STEPS, still_after_end=held))
        self._refs[k] = refs
        obs_critic = observation(self._robots[k], refs, axes=self._axes)
        if self.cfg.obs_noise:
            obs = observation(self._robots[k], refs, noise_rng=self.rng, axes=self._axes)
        else:
            obs = obs_critic
        return obs, obs_critic

    def _xpos(self, k: int) -> np.ndarray:
        """Body origins (N, nbody, 3) of the stored state k (the world body first)."""
        body_pos = self._robots[k].body_pos
        return np.concatenate([np.zeros((body_pos.shape[0], 1, 3)), body_pos], axis=1)

    def _record_state(self, k: int) -> RobotState:
        qpos, qvel = self.sim.qpos_now.astype(np.float64), self.sim.qvel_now.astype(np.float64)
        xpos, xquat = self.sim.kinematics()
        robot = self.robot_state(qpos, qvel, xpos.astype(np.float64), xquat.astype(np.float64))
        self._qpos[k], self._qvel[k], self._xquat[k], self._robots[k] = qpos, qvel, xquat, robot
        return robot

    # ------------------------------------------------------------------ the window
    def begin_window(self) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs that need it, start the simulator's window, observe s_0.

        Returns:
            obs (N, D) for the actor and obs_critic (N, D) without noise.
        """
        self.start_phases.decay()
        idx = np.flatnonzero(self.needs_reset)
        if len(idx):
            self._reset(idx)
        self.needs_reset[:] = False
        fp = self.sim.np_fp
        self.sim.set_params(**{k: v.astype(fp) for k, v in self.params.items()})
        if self.has_contact and self.cfg.dr_friction:
            self.sim.set_params(friction=self.friction.astype(fp))
        self.sim.set_state(self.qpos, self.qvel)
        if hasattr(self.sim, "reset_stats"):
            self.sim.reset_stats()  # bundle trigger counts per window
        t = self.horizon + 1
        self._qpos, self._qvel, self._xquat = [None] * t, [None] * t, [None] * t
        self._robots, self._refs = [None] * t, [None] * t
        self._actions: list[np.ndarray] = []
        self._dr_ddelta: list[np.ndarray] = []
        self._sunk: list[np.ndarray] = []
        self._leg_penalty: list[np.ndarray] = []
        self._tilt: list[np.ndarray] = []
        self._rot_err: list[np.ndarray] = []
        self._drift: list[np.ndarray] = []
        self._rate_actions: list[np.ndarray] = []
        self._start_action = self.prev_action.copy()
        self._start_rate_action = self.prev_rate_action.copy()
        self._means_given: bool | None = None  # set by the window's first step
        self.alive = np.ones(self.num_envs, bool)
        self.k = 0
        self._record_state(0)
        return self._observe(0)

    def _leg_clearance_cost(self, penalty: np.ndarray) -> np.ndarray:
        """The reward's leg-clearance cost of a penalty (N,) in m² (:func:`bounded_cost`): crossed
        legs never cost a step more than the cap, while the slope still pushes deeply crossed legs
        apart (see EnvConfig)."""
        return bounded_cost(self.cfg.leg_clearance_weight, self.cfg.leg_clearance_cap, penalty)

    def _leg_clearance_slope(self, penalty: np.ndarray) -> np.ndarray:
        """d cost / d penalty (N,) of :meth:`_leg_clearance_cost`."""
        return bounded_cost_slope(self.cfg.leg_clearance_weight, self.cfg.leg_clearance_cap, penalty)

    def _action(self, j: int) -> np.ndarray:
        return self._actions[j] if j >= 0 else self._start_action

    def _rate_action(self, j: int) -> np.ndarray:
        return self._rate_actions[j] if j >= 0 else self._start_rate_action

    @property
    def wants_mean_actions(self) -> bool:
        """:meth:`step` uses ``mean_actions`` for the action-rate term (``cfg.action_rate_on``)."""
        return self.cfg.action_rate_on == "mean"

    @property
    def rate_on_mean(self) -> bool:
        """This window's action-rate term read mean actions given to :meth:`step`, so its gradient
        (:meth:`state_vjp`) is with respect to them; False: with respect to the sampled actions."""
        return bool(self._means_given)

    def _push_force(self) -> np.ndarray | None:
        if not self.cfg.dr_push:  # also when pushes were switched off on a restored state (--init-from)
            return None
        self.push_countdown -= g1.CONTROL_DT
        pushed = (self.push_countdown <= 0) & self.alive
        if not pushed.any():
            return None
        cfg, rng, m = self.cfg, self.rng, int(pushed.sum())
        self.push_countdown[pushed] = rng.uniform(*cfg.push_interval, m)
        dv = np.zeros((self.num_envs, 6))
        half = np.array([cfg.push_lin_vel_xy, cfg.push_lin_vel_xy, cfg.push_lin_vel_z])
        half_ang = np.array([cfg.push_ang_vel_roll_pitch, cfg.push_ang_vel_roll_pitch, cfg.push_ang_vel_yaw])
        dv[pushed, :3] = rng.uniform(-half, half, (m, 3))
        dv[pushed, 3:] = rng.uniform(-half_ang, half_ang, (m, 3))
        mass_matrix = self.sim.forward()["qM"].astype(np.float64)
        fd = self._fd
        return np.einsum("nij,nj->ni", mass_matrix[:, :, fd : fd + 6], dv) / g1.CONTROL_DT

    def step(self, actions: np.ndarray, mean_actions: np.ndarray | None = None) -> StepResult:
        """Advance all envs one control step with actions a_k (N, 29).

        Args:
            actions: the sampled actions a_k, what the robot receives.
            mean_actions: μ_θ(o_k) (N, 29), for the action-rate term when ``cfg.action_rate_on`` is
                "mean"; None: ``actions`` (a deterministic policy).
        """
        k = self.k
        if k >= self.horizon:
            raise RuntimeError(f"the window holds {self.horizon} steps; call begin_window()")
        actions = np.asarray(actions, np.float64)
        given = self.wants_mean_actions and mean_actions is not None
        if self._means_given is None:
            self._means_given = given
        elif given != self._means_given:
            raise ValueError("pass mean_actions at every step of a window or at none")
        if given:
            rate_actions = np.asarray(mean_actions, np.float64)
            if rate_actions.shape != actions.shape:
                raise ValueError(f"mean_actions shape {rate_actions.shape} != actions shape {actions.shape}")
        else:
            rate_actions = actions
        prev = self._action(k - 1)
        prev_rate = self._rate_action(k - 1)
        self._actions.append(actions)
        self._rate_actions.append(rate_actions)
        applied = np.where(self.latency[:, None] >= 1, prev, actions)
        ctrl = self.default_pos + g1.ACTION_SCALE * applied
        qfrc = self._push_force()
        # always written: the simulator keeps a step's applied force slot until it is overwritten
        hold = ~self.alive if self.cfg.hold_ended_episodes else None
        self.sim.step(ctrl, np.zeros((self.num_envs, self.sim.nv)) if qfrc is None else qfrc, hold=hold)
        self.k = k + 1
        self.time = self.time + g1.CONTROL_DT
        robot = self._record_state(k + 1)
        ref = self._refs[k][0]
        delta = add_features(ref, self._axes) - add_features(robot, self._axes)
        imitation = tracking_reward if self.cfg.imitation_reward == "tracking" else add_reward
        r_add, dr_ddelta = imitation(self.disc, delta, need_grad=self.requires_grad)
        if self.requires_grad:
            self._dr_ddelta.append(np.asarray(dr_ddelta, np.float64))
        rate = np.sum((rate_actions - prev_rate) ** 2, axis=1)
        reward = np.asarray(r_add, np.float64) + self.cfg.alive_reward - self.action_rate_weight * rate
        leg_penalty, leg_gap = leg_clearance_penalty(
            self._legs, self._xpos(k + 1), self._xquat[k + 1], self.cfg.leg_clearance_margin
        )
        if self.cfg.leg_clearance_weight:
            reward = reward - self._leg_clearance_cost(leg_penalty)
            if self.requires_grad:
                self._leg_penalty.append(leg_penalty)
        # the height and tilt terms are computed only when on, and kept for the reverse pass only
        # when there is one (the PPO path has none)
        if self.cfg.height_weight:
            # how far the root sank below the reference beyond the tolerance (m)
            sunk = np.maximum(ref.root_pos[:, 2] - robot.root_pos[:, 2] - self.cfg.height_tolerance, 0.0)
            reward = reward - self.cfg.height_weight * sunk**2
            if self.requires_grad:
                self._sunk.append(sunk)
        if self.cfg.upright_weight:
            # the world's up axis in the root's frame (R^T e_z, R's last row), against the reference's
            tilt = quat_to_matrix(robot.root_quat)[:, 2, :] - quat_to_matrix(ref.root_quat)[:, 2, :]
            reward = reward - self.cfg.upright_weight * np.sum(tilt**2, axis=1)
            if self.requires_grad:
                self._tilt.append(tilt)
        if self.cfg.root_rotation_weight:
            # ‖R - R_ref‖²_F = 4 (1 - cos θ), θ the angle between the root's rotation and the reference's:
            # unlike the ADD reward's 6 of 305 features, a dense pull on the heading as well as the tilt
            rot_err = quat_to_matrix(robot.root_quat) - quat_to_matrix(ref.root_quat)
            w, cap = self.cfg.root_rotation_weight, self.cfg.root_rotation_cap
            reward = reward - bounded_cost(w, cap, np.sum(rot_err**2, axis=(1, 2)))
            if self.requires_grad:
                self._rot_err.append(rot_err)
        if self.cfg.root_position_weight:
            # the root's horizontal offset from the reference's: the ADD features hold the root's
            # position in 3 of 305, and a robot that drifts off the clip's path loses the world frame
            drift = robot.root_pos[:, :2] - ref.root_pos[:, :2]
            w, cap = self.cfg.root_position_weight, self.cfg.root_position_cap
            reward = reward - bounded_cost(w, cap, np.sum(drift**2, axis=1))
            if self.requires_grad:
                self._drift.append(drift)
        nonfinite = ~(np.all(np.isfinite(self._qpos[k + 1]), 1) & np.all(np.isfinite(self._qvel[k + 1]), 1))
        obs, obs_critic = self._observe(k + 1)
        body_dist = np.linalg.norm(robot.body_pos - ref.body_pos, axis=-1)  # (N, nbody) m, world frame
        pose_dist = self.cfg.pose_termination_dist
        with np.errstate(invalid="ignore"):
            fell = robot.root_pos[:, 2] < self.cfg.fall_height
            blown_up = np.any(np.abs(obs_critic) > OBS_LIMIT, axis=1)  # SHAC's early termination
            far = body_dist.max(axis=1) > pose_dist if pose_dist > 0 else np.zeros(len(fell), bool)
        lost = far & self.alive  # MimicKit's pose termination
        terminated = (fell | lost | nonfinite | blown_up) & self.alive
        truncated = (self.time > self._episode_end + 1e-9) & self.alive
        truncated &= ~terminated
        self.start_phases.record(self.time[terminated])
        err = body_dist.mean(axis=1)
        alive_before = self.alive.copy()
        self.episode_length += alive_before
        self.episode_return += np.where(alive_before, np.nan_to_num(reward), 0.0)
        ended = terminated | truncated
        for e in np.flatnonzero(ended):
            self.finished.append(
                (
                    int(self.episode_length[e]),
                    float(self.episode_return[e]),
                    bool(terminated[e]),
                    bool(lost[e] & ~fell[e]),
                )
            )
        self.alive = alive_before & ~ended
        self.needs_reset |= ended
        info = {"tracking_error": err, "delta": delta, "nonfinite": nonfinite, "alive": alive_before}
        info["lost_track"] = lost
        info["episode_step"] = self.episode_length.copy()  # 1 at an episode's first step
        info["leg_gap"] = leg_gap  # m, smallest gap between the legs (bcg.learn.clearance)
        info |= {"qpos": self._qpos[k + 1], "qvel": self._qvel[k + 1]}
        return StepResult(obs, obs_critic, reward, terminated, truncated, info)

    def end_window(self) -> None:
        """Keep the final state (start of the next window) and the last action."""
        self.qpos = self._qpos[self.k].copy()
        self.qvel = self._qvel[self.k].copy()
        self.prev_action = self._action(self.k - 1).copy()
        self.prev_rate_action = self._rate_action(self.k - 1).copy()
        bad = ~(np.all(np.isfinite(self.qpos), 1) & np.all(np.isfinite(self.qvel), 1))
        self.needs_reset |= bad

    # ------------------------------------------------------------------ reverse pass
    def _state_grad_to_sim(
        self, k: int, g: RobotStateGrad, g_bodies: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """dL/d(qpos_k, qvel_k) from dL/d(RobotState at s_k) and, when given, dL/d(xpos, xquat)."""
        fq, fd = self._fq, self._fd
        qpos, qvel, xquat = self._qpos[k], self._qvel[k], self._xquat[k].astype(np.float64)
        n = self.num_envs
        gq, gv = np.zeros((n, self.sim.nq)), np.zeros((n, self.sim.nv))
        gq[:, fq : fq + 3] += g.root_pos
        gq[:, fq + 3 : fq + 7] += g.root_quat
        gq[:, self._jq] += g.joint_pos
        gv[:, fd : fd + 3] += g.root_lin_vel
        gv[:, self._jd] += g.joint_vel
        root_quat, omega_b = qpos[:, fq + 3 : fq + 7], qvel[:, fd + 3 : fd + 6]
        gv[:, fd + 3 : fd + 6] += np.einsum("nji,nj->ni", quat_to_matrix(root_quat), g.root_ang_vel)
        gq[:, fq + 3 : fq + 7] += quat_to_matrix_vjp(
            root_quat, g.root_ang_vel[:, :, None] * omega_b[:, None, :]
        )
        g_xpos = np.zeros((n, self.sim.nbody, 3))
        g_xquat = np.zeros((n, self.sim.nbody, 4))
        if g.body_pos is not None:
            g_xpos[:, 1:] += g.body_pos
        if g_bodies is not None:
            g_xpos += g_bodies[0]
            g_xquat += g_bodies[1]
        for i, b in enumerate(self._key_ids):
            g_key = g.key_body_pos[:, i]
            g_xpos[:, b] += g_key
            g_xquat[:, b] += quat_to_matrix_vjp(
                xquat[:, b], g_key[:, :, None] * self._key_offsets[i][None, None, :]
            )
        gq += self.sim.kinematics_vjp(qpos.astype(self.sim.np_fp), g_xpos, g_xquat).astype(np.float64)
        return gq, gv

    def state_vjp(
        self, k: int, g_obs: np.ndarray | None, g_reward: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Gradient at the state s_k of this window (1 <= k <= steps taken).

        Args:
            k: state index.
            g_obs: dL/d(observation o_k) (N, D), raw (unnormalised); None for none.
            g_reward: dL/dr_{k-1} (N,) of the reward of the step that produced s_k; None for none.

        Returns:
            dL/dqpos_k (N, nq), dL/dqvel_k (N, nv), and {j: dL/dm_j (N, 29)} of the reward's
            action-rate term (j = k-1 and k-2; actions from before the window are left out); m_j is
            the mean action when :attr:`rate_on_mean`, else the sampled action.
        """
        parts: list[RobotStateGrad] = []
        g_actions: dict[int, np.ndarray] = {}
        g_bodies = None
        robot = self._robots[k]
        if g_obs is not None:
            parts.append(
                observation_vjp(robot, self._refs[k], np.asarray(g_obs, np.float64), axes=self._axes)
            )
        if g_reward is not None:
            g_reward = np.asarray(g_reward, np.float64)
            g_delta = g_reward[:, None] * self._dr_ddelta[k - 1]
            parts.append(add_features_vjp(robot, -g_delta, axes=self._axes))
            diff = self._rate_actions[k - 1] - self._rate_action(k - 2)
            g_rate = (-2.0 * self.action_rate_weight) * g_reward[:, None] * diff
            g_actions[k - 1] = g_rate
            if k - 2 >= 0:
                g_actions[k - 2] = -g_rate
            if self.cfg.leg_clearance_weight:
                g_bodies = leg_clearance_vjp(
                    self._legs,
                    self._xpos(k),
                    self._xquat[k],
                    self.cfg.leg_clearance_margin,
                    -self._leg_clearance_slope(self._leg_penalty[k - 1]) * g_reward,
                )
        if not parts:
            return np.zeros((self.num_envs, self.sim.nq)), np.zeros((self.num_envs, self.sim.nv)), g_actions
        total = {name: sum(getattr(p, name) for p in parts) for name in parts[0].__dataclass_fields__}
        gq, gv = self._state_grad_to_sim(k, RobotStateGrad(**total), g_bodies)
        if g_reward is not None and self.cfg.height_weight:
            # d(-w sunk²)/dh = 2 w sunk: the root's height is qpos's z of the free joint
            gq[:, self._fq + 2] += g_reward * 2.0 * self.cfg.height_weight * self._sunk[k - 1]
        if g_reward is not None and (self.cfg.upright_weight or self.cfg.root_rotation_weight):
            g_matrix = np.zeros((self.num_envs, 3, 3))
            if self.cfg.upright_weight:
                g_matrix[:, 2, :] = (-2.0 * self.cfg.upright_weight) * g_reward[:, None] * self._tilt[k - 1]
            if self.cfg.root_rotation_weight:
                rot_err = self._rot_err[k - 1]
                slope = bounded_cost_slope(
                    self.cfg.root_rotation_weight, self.cfg.root_rotation_cap, np.sum(rot_err**2, axis=(1, 2))
                )
                g_matrix += (-2.0 * slope * g_reward)[:, None, None] * rot_err
            fq = self._fq
            gq[:, fq + 3 : fq + 7] += quat_to_matrix_vjp(self._robots[k].root_quat, g_matrix)
        if g_reward is not None and self.cfg.root_position_weight:
            drift = self._drift[k - 1]
            w, cap = self.cfg.root_position_weight, self.cfg.root_position_cap
            slope = bounded_cost_slope(w, cap, np.sum(drift**2, axis=1))
            gq[:, self._fq : self._fq + 2] += (-2.0 * slope * g_reward)[:, None] * drift
        return gq, gv, g_actions

    def ctrl_vjp(self, k: int, g_ctrl: np.ndarray) -> dict[int, np.ndarray]:
        """{j: dL/da_j} from dL/dctrl_k (N, 29): a_k without latency, a_{k-1} with one step."""
        g_a = np.asarray(g_ctrl, np.float64) * g1.ACTION_SCALE
        delayed = self.latency[:, None] >= 1
        out = {k: np.where(delayed, 0.0, g_a)}
        if k >= 1:
            out[k - 1] = np.where(delayed, g_a, 0.0)
        return out

    # ------------------------------------------------------------------ diagnostics and checkpoints
    def bundle_trigger_rate(self) -> float:
        """Fraction of env-steps that triggered a bundle in the current window (nan without contact)."""
        stats = getattr(self.sim, "bundle_stats", None)
        if stats is None or not self.has_contact:
            return float("nan")
        value = stats()
        if isinstance(value, dict):
            value = value.get("trigger_rate", float("nan"))
        return float(value)

    def state_dict(self) -> dict:
        """Everything needed to continue the episodes exactly (arrays only)."""
        return {
            "rng": rng_state(self.rng),
            "qpos": self.qpos.copy(),
            "qvel": self.qvel.copy(),
            "time": self.time.copy(),
            "latency": self.latency.copy(),
            "default_pos": self.default_pos.copy(),
            "prev_action": self.prev_action.copy(),
            "prev_rate_action": self.prev_rate_action.copy(),
            "push_countdown": self.push_countdown.copy(),
            "friction": self.friction.copy(),
            "episode_length": self.episode_length.copy(),
            "episode_return": self.episode_return.copy(),
            "needs_reset": self.needs_reset.copy(),
            "params": {k: v.copy() for k, v in self.params.items()},
            "start_phases": self.start_phases.state_dict(),
        } | self._sim_rng_state()

    def _sim_rng_state(self) -> dict:
        # the simulator draws its bundle perturbations from its own generator
        sim_rng = getattr(self.sim, "_rng", None)
        out = {"sim_rng": rng_state(sim_rng)} if isinstance(sim_rng, np.random.Generator) else {}
        if hasattr(self.sim, "_noise_window"):  # the key of common-noise draws (BundleConfig)
            out["sim_noise_window"] = np.int64(self.sim._noise_window)
        return out

    def load_state_dict(self, d: dict) -> None:
        self.rng = rng_from_state(d["rng"])
        names = ("qpos", "qvel", "time", "latency", "default_pos", "prev_action", "push_countdown")
        for name in names + ("prev_rate_action",):
            if name == "prev_rate_action" and name not in d:  # checkpoints from before the field
                value = np.array(d["prev_action"])
            else:
                value = np.array(d[name])
            if value.shape != getattr(self, name).shape:
                raise ValueError(f"env state '{name}': stored {value.shape} != {getattr(self, name).shape}")
            setattr(self, name, value)
        self.friction = np.array(d["friction"])
        self.episode_length = np.array(d["episode_length"])
        self.episode_return = np.array(d["episode_return"])
        self.needs_reset = np.array(d["needs_reset"], bool)
        self.params = {k: np.array(v) for k, v in d["params"].items()}
        if "start_phases" in d:  # checkpoints from before the field have an empty histogram
            self.start_phases.load_state_dict(d["start_phases"])
        if "sim_rng" in d and isinstance(getattr(self.sim, "_rng", None), np.random.Generator):
            self.sim._rng = rng_from_state(d["sim_rng"])
        if "sim_noise_window" in d and hasattr(self.sim, "_noise_window"):
            self.sim._noise_window = int(d["sim_noise_window"])
