"""Training configuration: frozen dataclasses with the paper's hyperparameters, and ``--set`` overrides.

:class:`TrainConfig` holds everything one training run depends on; it nests the environment
(:class:`EnvConfig`, with the paper's domain-randomisation table, every item switchable) and the
network configs of :mod:`bcg.learn.actor`, :mod:`bcg.learn.critic` and :mod:`bcg.learn.discriminator`.
Values are the paper's unless marked [R]: our reconstruction where the paper is silent (the README's
"How it works" says what we chose and why).

The environment nests its contact (:class:`ContactConfig`) and bundle (:class:`BundleConfig`)
settings, which fill the simulator's configs of the same names; stored configs, overrides and
attribute reads also name them flat, as before the groups existed (:data:`FLAT_NAMES`:
``env.kappa`` is ``env.contact.kappa``, ``env.bcg_size`` is ``env.bundle.size``).

Overrides address fields by dotted name, e.g. ``env.dr_push=false``, ``actor.lr=1e-3``,
``critic.hidden=128,128``; :func:`apply_overrides` parses each value with the type of the field's
current value, and refuses unknown names and unparsable values with a clear message.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from bcg.learn.actor import ActorConfig
from bcg.learn.critic import CriticConfig
from bcg.learn.discriminator import DiscriminatorConfig

Range = tuple[float, float]


# the bundle draw schemes (:data:`bcg.sim.bundle.SAMPLINGS`; repeated so that this module stays free of
# Taichi, and checked against it by the tests)
BCG_SAMPLINGS = ("gaussian", "antithetic", "latin", "phase")


@dataclass(frozen=True)
class ContactConfig:
    """Foot-ground contact of the training simulator: the training's settings of
    :class:`bcg.sim.ContactConfig`, whose fields of the same names they fill (bcg.g1sim adds the
    feet's spheres; this module stays free of Taichi).

    Attributes:
        on: simulate foot-ground contact (when the simulator provides it); stored as ``env.contact``.
        kappa: contact stiffness κ (1/m) of the smoothed contact model; ``env.kappa``.
        activation_margin: m, gap below which a foot sphere enters the contact solver; None = 4.6 / κ,
            where s_κ = 0.01 [R]; 0 = only touching spheres, as in Schwarke's code, where the impulse
            scale jumps from 0 to 1/2 at touchdown (see docs/gradient_study.md); ``env.contact_margin``.
        depth_correction: β in [0, 1), the contact's position term [R]: 0.2 (the default) keeps
            standing penetration within 2.3 mm of MuJoCo's and costs the learning benchmark nothing
            (docs/learning.md); 0 = the paper's model, which sinks while a foot is loaded;
            ``env.contact_depth_correction``.
    """

    on: bool = True
    kappa: float = 300.0
    activation_margin: float | None = None
    depth_correction: float = 0.2

    def __post_init__(self):
        # the simulator takes the numbers as floats (a stored or given int would pass as one)
        object.__setattr__(self, "kappa", float(self.kappa))
        object.__setattr__(self, "depth_correction", float(self.depth_correction))
        if self.kappa <= 0:
            raise ValueError(f"env.kappa must be positive, got {self.kappa}")
        if self.activation_margin is not None and not 0 <= self.activation_margin < 1:
            raise ValueError(f"env.contact_margin must be None or in [0, 1) m, got {self.activation_margin}")
        if not 0 <= self.depth_correction < 1:
            raise ValueError(f"env.contact_depth_correction must be in [0, 1), got {self.depth_correction}")


@dataclass(frozen=True)
class BundleConfig:
    """Bundled contact gradients: the training's settings of :class:`bcg.sim.BundleConfig`, whose
    fields of the same names they fill (the seed comes from the run's seed).

    Attributes:
        on: bundled contact gradients on (used when the simulator provides contact); ``env.bcg``.
        threshold, size, horizon, sigma_pos, sigma_vel, jacobian_damping: the bundle's tau (N), B,
            H (control steps), sigma_p (m), sigma_v (m/s) and lambda_J (the paper's values);
            ``env.bcg_threshold``, ``env.bcg_size``, ``env.bcg_horizon``, ``env.bcg_sigma_pos``,
            ``env.bcg_sigma_vel``, ``env.bcg_damping``.
        common_noise: common random numbers across environments bundled at the same step [R; off, as
            in the paper]; ``env.bcg_common_noise``.
        sampling: how a bundle's draws are spread: "gaussian" (the paper's), "antithetic", "latin" or
            "phase" (copies shifted in time over one physics step) [R]; ``env.bcg_sampling``.
    """

    on: bool = True
    threshold: float = 400.0
    size: int = 10
    horizon: int = 2
    sigma_pos: float = 0.01
    sigma_vel: float = 0.02
    jacobian_damping: float = 1e-4
    common_noise: bool = False
    sampling: str = "gaussian"

    def __post_init__(self):
        if self.sampling not in BCG_SAMPLINGS:
            raise ValueError(
                f"env.bcg_sampling must be one of {', '.join(BCG_SAMPLINGS)}, got {self.sampling!r}"
            )
        if self.sampling == "antithetic" and self.size % 2:
            raise ValueError(f"env.bcg_sampling antithetic needs an even env.bcg_size, got {self.size}")
        if self.size < 1 or self.horizon < 1:
            raise ValueError(
                f"env.bcg_size and env.bcg_horizon must be >= 1, got {self.size}, {self.horizon}"
            )
        if min(self.threshold, self.sigma_pos, self.sigma_vel, self.jacobian_damping) < 0:
            raise ValueError("env.bcg_threshold, bcg_sigma_pos, bcg_sigma_vel and bcg_damping must be >= 0")


FLAT_NAMES = {
    "contact": ("contact", "on"),
    "kappa": ("contact", "kappa"),
    "contact_margin": ("contact", "activation_margin"),
    "contact_depth_correction": ("contact", "depth_correction"),
    "bcg": ("bundle", "on"),
    "bcg_threshold": ("bundle", "threshold"),
    "bcg_size": ("bundle", "size"),
    "bcg_horizon": ("bundle", "horizon"),
    "bcg_sigma_pos": ("bundle", "sigma_pos"),
    "bcg_sigma_vel": ("bundle", "sigma_vel"),
    "bcg_damping": ("bundle", "jacobian_damping"),
    "bcg_common_noise": ("bundle", "common_noise"),
    "bcg_sampling": ("bundle", "sampling"),
}
"""The flat names of :class:`EnvConfig`'s contact and bundle settings, {flat: (group, field)}: the
names stored configs hold them by, which ``--set env.<flat>=...``, ``EnvConfig(<flat>=...)`` and
``cfg.env.<flat>`` accept too."""

ENV_GROUPS = {"contact": ContactConfig, "bundle": BundleConfig}


@dataclass(frozen=True)
class EnvConfig:
    """The G1 tracking environment [paper tables unless marked].

    Attributes:
        motion: reference clip, a name in ``motions/`` ("run", "jump", "fight", "dance") or an .h5 path.
        contact: foot-ground contact (:class:`ContactConfig`).
        bundle: bundled contact gradients (:class:`BundleConfig`).
        imitation_reward: "add" (the paper's adversarial differential discriminator, default) or
            "tracking" (:func:`bcg.learn.discriminator.tracking_reward`: a fixed exp(-error²) reward on
            the same normalised feature differentials, no discriminator training) [R].
        action_rate_weight: w in r = r_imitation + c_alive - w ‖a_t - a_{t-1}‖².
        alive_reward: c_alive, a constant reward for every step of an episode [R; 0 is the paper's
            literal reward]. With a fall ending the episode at a zero bootstrap, a per-step reward
            that is negative makes the critic value states near a fall highest; both references
            keep it positive while alive (DiffRL's humanoid earns about +2 a step upright,
            MimicKit's ADD reward is >= 0 and has no action-rate term). See docs/learning.md.
        height_weight, height_tolerance: w (1/m²) and tolerance (m) of the root-height term
            r -= w max(0, h_ref - h - tolerance)², a differentiable push away from a fall before it
            happens [R; 0 is the paper's literal reward; DiffRL's humanoid has one, -200 (h - h_band)²
            below its band]: a fall ends the episode and carries no gradient in a first-order method.
        upright_weight: w of the tilt term r -= w ‖u - u_ref‖², u the world's up axis in the root's
            frame (u_ref the reference's), a differentiable push against tipping over before the
            root sinks [R; off by default; DiffRL's humanoids reward the torso's up axis].
        root_rotation_weight: w of the root-orientation term r -= w ‖R - R_ref‖²_F = 4 w (1 - cos θ),
            θ the angle between the root's rotation and the reference's [R; off by default;
            DeepMimic-style trackers reward the root's orientation]: the ADD reward holds the root's
            rotation in 6 of its 305 features, and Run's policies turn the wrong way round in the
            clip's U-turn (docs/learning.md).
        root_rotation_cap: c, a bound on that cost per step as for the leg-clearance term: r -= c x /
            (1 + x), x = w ‖R - R_ref‖² / c; 0 = no bound.
        root_position_weight: w (1/m²) of the root-position term r -= w ‖p_xy - p_ref,xy‖², the root's
            horizontal offset from the reference's in the world frame [R; off by default; DeepMimic-style
            trackers reward the root's position]: the ADD reward holds it in 3 of its 305 features, and
            Fight's policies keep the pose (about 7 cm root-relative) but drift off the clip's path
            (30-40 cm in the world frame). Measured on Fight as a late stage: no effect (docs/learning.md).
        root_position_cap: c, a bound on that cost per step as for the leg-clearance term; 0 = no bound.
        leg_clearance_weight, leg_clearance_margin: w (1/m²) and margin (m) of the leg-clearance
            term r -= w Σ max(0, margin - gap)² over the gaps between the two legs' collision
            capsules (:mod:`bcg.learn.clearance`) [R; the paper has no such term, 0 switches it off]:
            the training simulator has no leg-leg contact by default (``leg_contact_stiffness``), and
            legs that cross trip the robot in MuJoCo. Default w = 1000 (every shipped policy's) and
            margin 2 cm.
        leg_clearance_cap: c, a bound on that cost per step: r -= c x / (1 + x), x = w P / c (P the
            sum above), which is w P while w P is small against c and whose slope w / (1 + x)²
            falls off slowly enough to keep pushing deeply crossed legs apart [R]; 0 = no bound
            (w P, as every run before the field). The default c = 2 is the alive reward: legs
            crossed however deep cost a step no more than staying alive earns, so they never make
            falling (value zero) the better deal.
        leg_contact_stiffness, leg_contact_damping, leg_contact_limit: k (N/m), c (s/m) and the
            force limit L (N) of leg-against-leg contact in the training simulator, between the
            same capsules (:mod:`bcg.sim.self_contact`) [R; k = 0, off, by default, as in the
            paper's simulator]: a foot that strikes the other leg is pushed off it as in MuJoCo,
            instead of passing through.
        joint_limit_kp_ratio, joint_limit_kd_ratio: the joint limits of the training simulator, a
            one-sided spring of this ratio times each joint's PD stiffness and a damper of that ratio
            times its PD damping past the joint's range (:func:`bcg.g1sim.joint_limits`) [R; 0, off,
            by default, as in the paper's simulator]: without them a policy leans on ankles that roll
            past their stops, which MuJoCo and the robot do not allow (docs/validation.md). At 10 and
            0 the joints pass their ranges about as far as in MuJoCo; a damper makes the gradients
            explode (:mod:`bcg.sim.joint_limits`).
        reset_action: the previous action an episode starts with, which the action-rate term
            and an action latency of one step read: "hold" (default) the action whose PD target is
            the start pose, (q_0 - q_default) / action scale, as if the robot had been tracking;
            "zero" the default pose's, which costs 0.8 |a|² ≈ 60-100 on the first step of an
            episode started on the clips (and pulls the joints to the default pose for a step
            under latency), as runs before the field did [R; the paper is silent].
        fall_height: m, root height below which the episode ends (early termination).
        pose_termination_dist: m; the episode also ends (early termination) when any body is
            farther than this from its reference position in the world frame, as MimicKit's ADD
            G1 environment does (``pose_termination``, 1.0 m) [R; 0, off, is the paper's literal
            reading, which ends an episode on a fall only]. It bounds the drift off the clip's path
            that the world-frame E_track measures.
        start_failure_mix: fraction of the resets that start U(0, ``start_failure_lead``) s before a
            clip time at which recent episodes fell or lost track, drawn from a histogram of those
            times that decays by ``start_failure_memory`` per window (:mod:`bcg.learn.start_phases`)
            [R; 0, the paper's uniform reference state initialisation, by default]. For a policy that
            fails on one segment of its clip.
        start_failure_lead: s, see ``start_failure_mix``.
        start_failure_memory: factor in [0, 1) on the failure histogram per window.
        start_clip_begin_mix: fraction of the resets that start at the clip's first frame (with the
            usual reset noise), drawn independently of ``start_failure_mix`` [R; 0, the paper's
            uniform initialisation, by default]. Uniform starts practise the clip's first second
            least, and a deployed robot always starts there (:mod:`bcg.learn.start_phases`).
        start_standing_mix: fraction of the resets that start as the robot does when
            :mod:`bcg.robot.run` starts the policy: still, in the default pose (with the usual reset
            noise) under the reference's root and facing its heading, at the clip's first frame
            [R; 0 by default]. The reference is mid-motion there, so these episodes practise
            catching up with it from rest (``sim2sim --start standing`` measures it in MuJoCo).
        clip_lead_in: s of lead-in in front of the clip (:meth:`MotionClip.with_lead_in`): the
            reference starts at rest on the first frame and speeds up to the clip's pace over that
            time, so that a robot that starts still, as on the real robot, is not asked to jump
            into a clip that starts at speed [R; 0, the clip as it is, by default]. Every consumer
            of a policy (sim2sim, the sweep, the robot client) plays the same lead-in.
        clip_end_hold: s of lead-out after the clip's last frame, on which the reference holds that
            frame still (every velocity 0; :meth:`MotionClip.sample` ``still_after_end``) and the
            episodes go on, so that the policy learns to stop where the clip ends instead of
            falling once it ends [R; 0, episodes end with the clip, by default].
        hold_ended_episodes: leave an environment whose episode ended inside a window out of the
            simulation until the window ends (its steps are ignored either way; it costs nothing and
            opens no bundle) [R]. False simulates it on, as runs before the field existed did.
        obs_noise: add the observation table's uniform noise to the actor's observation.
        reset_noise: add the reset noise below to the reference state at a reset.
        reset_root_xy / reset_root_z: m, half-widths of the root position noise.
        reset_root_roll_pitch / reset_root_yaw: rad, half-widths of the root orientation noise.
        reset_joint_pos: rad, half-width of the joint position noise.
        dr_friction, friction: ground friction μ ~ U(range) per env (needs contact in the simulator).
        dr_base_mass, base_mass_offset: kg added to the pelvis mass.
        dr_link_mass, link_mass_scale: factor on every body's mass and inertia, per body [R: inertia
            scaled with the mass].
        dr_com, com_offset: m, per-axis offset of every body's centre of mass.
        dr_pd_gains, pd_gain_scale: factor on k_p and k_d, per joint.
        dr_armature, armature_scale: factor on the joint armature, per joint.
        dr_joint_friction, joint_friction_scale: factor on the joint friction loss, per joint.
        joint_friction: N m, nominal joint friction loss that the scale applies to [R: the shipped MJCF
            has none, so 0 makes the scale a no-op].
        dr_default_offset, default_joint_offset: rad, half-width of a per-env offset of the default
            joint position used by the action mapping.
        dr_latency, max_latency: action latency drawn per episode from {0, ..., max_latency} control steps.
        dr_push, push_interval: s between pushes ~ U(range).
        push_lin_vel_xy / push_lin_vel_z: m/s, half-widths of the pushed root velocity change.
        push_ang_vel_roll_pitch / push_ang_vel_yaw: rad/s, half-widths of the angular velocity change.

    The contact and bundle settings also go by their flat names (:data:`FLAT_NAMES`), the names that
    stored configs hold them by: ``EnvConfig(kappa=50, bcg=False)``, ``cfg.kappa``.
    """

    motion: str = "run"
    contact: ContactConfig = field(default_factory=ContactConfig)
    bundle: BundleConfig = field(default_factory=BundleConfig)
    imitation_reward: str = "add"
    action_rate_weight: float = 0.8
    alive_reward: float = 2.0
    action_rate_on: str = "mean"
    height_weight: float = 50.0
    height_tolerance: float = 0.05
    upright_weight: float = 0.0
    root_rotation_weight: float = 0.0
    root_rotation_cap: float = 0.0
    root_position_weight: float = 0.0
    root_position_cap: float = 0.0
    leg_clearance_weight: float = 1000.0
    leg_clearance_margin: float = 0.02
    leg_clearance_cap: float = 2.0
    leg_contact_stiffness: float = 0.0
    leg_contact_damping: float = 0.5
    leg_contact_limit: float = 200.0
    joint_limit_kp_ratio: float = 0.0
    joint_limit_kd_ratio: float = 0.0
    reset_action: str = "hold"
    fall_height: float = 0.3
    pose_termination_dist: float = 0.0
    start_failure_mix: float = 0.0
    start_failure_lead: float = 1.0
    start_failure_memory: float = 0.97
    start_clip_begin_mix: float = 0.0
    start_standing_mix: float = 0.0
    clip_lead_in: float = 0.0
    clip_end_hold: float = 0.0
    hold_ended_episodes: bool = True
    obs_noise: bool = True
    reset_noise: bool = True
    reset_root_xy: float = 0.05
    reset_root_z: float = 0.01
    reset_root_roll_pitch: float = 0.1
    reset_root_yaw: float = 0.2
    reset_joint_pos: float = 0.1
    dr_friction: bool = True
    friction: Range = (0.3, 1.2)
    dr_base_mass: bool = True
    base_mass_offset: Range = (-3.0, 3.0)
    dr_link_mass: bool = True
    link_mass_scale: Range = (0.8, 1.2)
    dr_com: bool = True
    com_offset: float = 0.03
    dr_pd_gains: bool = True
    pd_gain_scale: Range = (0.8, 1.2)
    dr_armature: bool = True
    armature_scale: Range = (0.75, 1.25)
    dr_joint_friction: bool = True
    joint_friction_scale: Range = (0.5, 1.5)
    joint_friction: float = 0.0
    dr_default_offset: bool = True
    default_joint_offset: float = 0.01
    dr_latency: bool = True
    max_latency: int = 1
    dr_push: bool = True
    push_interval: Range = (1.0, 3.0)
    push_lin_vel_xy: float = 0.5
    push_lin_vel_z: float = 0.2
    push_ang_vel_roll_pitch: float = 0.52
    push_ang_vel_yaw: float = 0.78

    def __init__(self, **values):
        # the dataclass's own __init__, plus the flat names of the groups' settings (FLAT_NAMES),
        # applied on top of the groups given or their defaults; "contact" names the group when
        # given a ContactConfig and its switch when given a bool (so dataclasses.replace(cfg,
        # contact=False) starts from the default contact settings: replace cfg.contact to keep them)
        flat = {}
        for name in list(values):
            if name in FLAT_NAMES and not isinstance(values[name], ContactConfig):
                flat[name] = values.pop(name)
        fields = dataclasses.fields(self)
        unknown = sorted(set(values) - {f.name for f in fields})
        if unknown:
            raise TypeError(f"EnvConfig got unexpected keyword arguments {', '.join(unknown)}")
        for f in fields:
            if f.name in values:
                value = values[f.name]
            else:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            object.__setattr__(self, f.name, value)
        for group in ENV_GROUPS:
            changes = {name: flat[k] for k, (g, name) in FLAT_NAMES.items() if g == group and k in flat}
            if changes:
                object.__setattr__(self, group, dataclasses.replace(getattr(self, group), **changes))
        self.__post_init__()

    def __post_init__(self):
        ranges = ("friction", "base_mass_offset", "link_mass_scale", "pd_gain_scale", "armature_scale")
        for name in ranges + ("joint_friction_scale", "push_interval"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"env.{name}: lower bound {lo} exceeds upper bound {hi}")
        if self.push_interval[0] <= 0:
            raise ValueError(f"env.push_interval must be positive, got {self.push_interval}")
        if self.max_latency < 0 or self.max_latency > 1:
            raise ValueError(f"env.max_latency must be 0 or 1 control steps, got {self.max_latency}")
        if self.imitation_reward not in ("add", "tracking"):
            raise ValueError(
                f'env.imitation_reward must be "add" or "tracking", got {self.imitation_reward!r}'
            )
        legs = (self.leg_contact_stiffness, self.leg_contact_damping, self.leg_contact_limit)
        if not all(map(math.isfinite, legs)) or min(legs[:2]) < 0 or legs[2] <= 0:
            raise ValueError(
                "env.leg_contact_stiffness and env.leg_contact_damping must be >= 0 and "
                f"env.leg_contact_limit > 0, got {self.leg_contact_stiffness}, {self.leg_contact_damping}, "
                f"{self.leg_contact_limit}"
            )
        limits = (self.joint_limit_kp_ratio, self.joint_limit_kd_ratio)
        if not all(map(math.isfinite, limits)) or min(limits) < 0:
            raise ValueError(
                "env.joint_limit_kp_ratio and env.joint_limit_kd_ratio must be numbers >= 0, got "
                f"{self.joint_limit_kp_ratio}, {self.joint_limit_kd_ratio}"
            )
        if min(self.leg_clearance_weight, self.leg_clearance_margin, self.leg_clearance_cap) < 0:
            raise ValueError(
                "env.leg_clearance_weight, env.leg_clearance_margin and env.leg_clearance_cap must be "
                f">= 0, got {self.leg_clearance_weight}, {self.leg_clearance_margin}, "
                f"{self.leg_clearance_cap}"
            )
        for name in (
            "height_weight",
            "height_tolerance",
            "upright_weight",
            "root_rotation_weight",
            "root_rotation_cap",
            "root_position_weight",
            "root_position_cap",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"env.{name} must be >= 0, got {getattr(self, name)}")
        if not self.pose_termination_dist >= 0:
            raise ValueError(
                f"env.pose_termination_dist must be >= 0 (0 = off), got {self.pose_termination_dist}"
            )
        if not (
            0 <= self.start_failure_mix <= 1
            and self.start_failure_lead >= 0
            and 0 <= self.start_failure_memory < 1
            and 0 <= self.start_clip_begin_mix <= 1
            and 0 <= self.start_standing_mix <= 1
        ):
            raise ValueError(
                "env.start_failure_mix must lie in [0, 1], env.start_failure_lead be >= 0, "
                "env.start_failure_memory lie in [0, 1), env.start_clip_begin_mix and "
                "env.start_standing_mix in [0, 1], got "
                f"{self.start_failure_mix}, {self.start_failure_lead}, {self.start_failure_memory}, "
                f"{self.start_clip_begin_mix}, {self.start_standing_mix}"
            )
        if not (math.isfinite(self.clip_lead_in) and self.clip_lead_in >= 0):
            raise ValueError(f"env.clip_lead_in must be finite seconds >= 0, got {self.clip_lead_in}")
        if not (math.isfinite(self.clip_end_hold) and self.clip_end_hold >= 0):
            raise ValueError(f"env.clip_end_hold must be finite seconds >= 0, got {self.clip_end_hold}")
        if self.reset_action not in ("hold", "zero"):
            raise ValueError(f'env.reset_action must be "hold" or "zero", got {self.reset_action!r}')
        if self.action_rate_on not in ("mean", "sample"):
            raise ValueError(f'env.action_rate_on must be "mean" or "sample", got {self.action_rate_on!r}')

    def without_randomisation(self) -> EnvConfig:
        """The same environment with every domain randomisation and all noise switched off."""
        off = {f.name: False for f in dataclasses.fields(self) if f.name.startswith("dr_")}
        return dataclasses.replace(self, obs_noise=False, reset_noise=False, **off)


def _flat_setting(group: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, group), name), doc=f"``{group}.{name}``")


# cfg.kappa, cfg.bcg_size, ...: the flat names read the groups' settings (not cfg.contact, the group)
for _flat, (_group, _name) in FLAT_NAMES.items():
    if _flat not in ENV_GROUPS:
        setattr(EnvConfig, _flat, _flat_setting(_group, _name))
del _flat, _group, _name


@dataclass(frozen=True)
class TrainConfig:
    """One SHAC + ADD training run [paper table unless marked].

    Attributes:
        seed: seeds every random generator of the run.
        iterations: SHAC epochs (paper: 3000).
        num_envs: parallel environments (paper: 64 with BCG, 128 without).
        horizon: control steps per differentiable window.
        gamma: discount γ.
        lam: TD(λ) parameter.
        lr_end: learning rate at the last iteration (linear decay from each network's ``lr``).
        return_normalization: scale rewards by SHAC's running return statistics.
        obs_normalization: normalise observations by running mean and variance.
        obs_rms_count: prior count of the observation statistics (SHAC: 1e-4).
        checkpoint_every: iterations between checkpoints (0: only at the end).
        policy_every: iterations between policy snapshots, each a ``policy_it<N>.h5`` in the run
            folder (as ``python -m bcg.learn.policy export`` writes; 0: none).
        checkpoint_replay: store the discriminator's replay buffer in checkpoints (up to 200k x 305
            float32, 244 MB); without it a resumed run starts with an empty buffer.
        nan_ring_size: recent states kept for the NaN dump.
        drop_nonfinite_env_grads: cut an env's actor gradient where the simulator's reverse pass turns
            non-finite, instead of skipping the whole update [R].
        action_rate_ramp: iterations over which the action-rate weight grows linearly from 0 to
            ``env.action_rate_weight`` [R; 0: the full weight from the start, the paper's literal
            reading]. Early on, the term teaches a random policy to ignore its observations (their
            noise moves its mean action) before the imitation reward has taught it anything, and
            the episodes get shorter; IsaacLab's locomotion tasks bring such penalties in by a
            curriculum for the same reason. See docs/learning.md.
        env_stages: reward, termination and start settings of ``env`` that change after set
            iterations, ``"N:field=value,...;M:field=value"`` (:mod:`bcg.learn.stages`) [R; "" keeps
            ``env`` throughout]; checked by :func:`bcg.learn.stages.check_stages` when a run starts. A stored
            policy holds the stage its last iteration trained in.
        critic_worker: run the critic fit and the discriminator's SGD steps in a child process
            while the reverse pass and the next rollout run (:mod:`bcg.learn.critic_worker`), this
            process's BLAS on one thread meanwhile; the same updates up to float32 round-off.
        actor, critic, disc, env: nested configs.
    """

    seed: int = 0
    iterations: int = 3000
    num_envs: int = 64
    horizon: int = 32
    gamma: float = 0.99
    lam: float = 0.95
    lr_end: float = 1e-5
    return_normalization: bool = True
    obs_normalization: bool = True
    obs_rms_count: float = 1e-4
    checkpoint_every: int = 50
    policy_every: int = 0
    checkpoint_replay: bool = True
    nan_ring_size: int = 64
    drop_nonfinite_env_grads: bool = True
    critic_worker: bool = True
    action_rate_ramp: int = 0
    env_stages: str = ""
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    disc: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    def __post_init__(self):
        if self.iterations < 1 or self.num_envs < 1 or self.horizon < 1:
            raise ValueError(
                f"iterations, num_envs and horizon must be positive: {self.iterations}, "
                f"{self.num_envs}, {self.horizon}"
            )
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.lam < 1.0:
            raise ValueError(f"need 0 < gamma <= 1 and 0 <= lam < 1, got {self.gamma}, {self.lam}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.policy_every < 0:
            raise ValueError(f"policy_every must be >= 0, got {self.policy_every}")
        if self.action_rate_ramp < 0:
            raise ValueError(f"action_rate_ramp must be >= 0, got {self.action_rate_ramp}")


def _ppo_actor() -> ActorConfig:
    return ActorConfig(
        hidden=(512, 256, 128), log_std_init=math.log(0.3), lr=1e-3, betas=(0.9, 0.999), layer_norm=False
    )


def _ppo_env() -> EnvConfig:
    return EnvConfig(bundle=BundleConfig(on=False))


@dataclass(frozen=True)
class PPOConfig:
    """One PPO + ADD training run on the same environment [paper's PPO table unless marked].

    The formulas are rsl_rl's (``rsl_rl/algorithms/ppo.py``); :mod:`bcg.learn.ppo` says where we
    differ and why.

    Attributes:
        algo: always "ppo": marks a stored config as PPO's (a config without it is SHAC's).
        seed: seeds every random generator of the run.
        iterations: PPO iterations, one rollout of ``horizon`` steps and one update each.
        num_envs: parallel environments.
        horizon: control steps per rollout (rsl_rl's ``num_steps_per_env``).
        gamma: discount γ.
        lam: GAE parameter λ.
        lr: initial learning rate of the one Adam over actor and critic (adapted, see ``desired_kl``).
        desired_kl: KL* of the adaptive rule: after each minibatch's KL(π_old ‖ π), lr /= 1.5 above
            2 KL*, lr *= 1.5 below KL* / 2, within [``lr_min``, ``lr_max``]; None keeps ``lr``.
        lr_min, lr_max: bounds of the adapted learning rate.
        epochs: passes over a rollout per update.
        minibatches: minibatches per pass.
        clip: ε of the clipped surrogate and of the clipped value loss.
        value_coef: weight of the value loss.
        clipped_value_loss: clip the value change as rsl_rl does.
        entropy_coef: weight of the policy's entropy bonus.
        max_grad_norm: global gradient-norm limit over actor and critic together.
        obs_normalization: normalise observations by running mean and variance (empirical).
        critic_hidden: value network widths (ELU, no LayerNorm).
        checkpoint_every, policy_every, checkpoint_replay, nan_ring_size: as in :class:`TrainConfig`.
        actor: the policy (widths, initial std 0.3 as log_std_init, no LayerNorm; its ``lr``,
            ``betas`` and ``grad_clip`` are unused: ``lr``, Adam's torch defaults (0.9, 0.999) and
            ``max_grad_norm`` above apply).
        disc: the ADD discriminator, trained on PPO's samples by the same update as SHAC's.
        env: the environment; bundles off (PPO takes no gradient through the simulator).
    """

    algo: str = "ppo"
    seed: int = 0
    iterations: int = 3000
    num_envs: int = 4096
    horizon: int = 24
    gamma: float = 0.99
    lam: float = 0.95
    lr: float = 1e-3
    desired_kl: float | None = 0.01
    lr_min: float = 1e-5
    lr_max: float = 1e-2
    epochs: int = 5
    minibatches: int = 4
    clip: float = 0.2
    value_coef: float = 1.0
    clipped_value_loss: bool = True
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    obs_normalization: bool = True
    critic_hidden: tuple[int, ...] = (256, 256)
    checkpoint_every: int = 50
    policy_every: int = 0
    checkpoint_replay: bool = True
    nan_ring_size: int = 64
    actor: ActorConfig = field(default_factory=_ppo_actor)
    disc: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
    env: EnvConfig = field(default_factory=_ppo_env)

    def __post_init__(self):
        if self.algo != "ppo":
            raise ValueError(f'algo must be "ppo", got {self.algo!r}')
        if min(self.iterations, self.num_envs, self.horizon, self.epochs, self.minibatches) < 1:
            raise ValueError(
                "iterations, num_envs, horizon, epochs and minibatches must be positive: "
                f"{self.iterations}, {self.num_envs}, {self.horizon}, {self.epochs}, {self.minibatches}"
            )
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"need 0 < gamma <= 1 and 0 <= lam <= 1, got {self.gamma}, {self.lam}")
        if not 0 < self.lr_min <= self.lr <= self.lr_max:
            raise ValueError(f"need 0 < lr_min <= lr <= lr_max, got {self.lr_min}, {self.lr}, {self.lr_max}")
        if self.desired_kl is not None and self.desired_kl <= 0:
            raise ValueError(f"desired_kl must be positive or None, got {self.desired_kl}")
        if self.clip <= 0 or self.max_grad_norm <= 0 or self.value_coef < 0 or self.entropy_coef < 0:
            raise ValueError("clip and max_grad_norm must be positive, value_coef and entropy_coef >= 0")
        if self.checkpoint_every < 0 or self.policy_every < 0:
            raise ValueError("checkpoint_every and policy_every must be >= 0")
        if self.env.bundle.on:
            raise ValueError("env.bcg must be false for PPO: bundles smooth gradients, and PPO takes none")
