"""The client's safety layer: phases, command shaping, limits, state checks and the watchdog.

Phases (the operator's remote button, or keyboard key, in brackets)::

    WAIT_STATE -> ZERO_TORQUE --[START / s]--> STAND_UP (2.5 s from the measured pose to the
    policy's default pose, gains ramped in over 1 s) -> HOLD_DEFAULT --[A / a]--> POLICY (50 Hz
    policy, 500 Hz commands, each target held until the next; optionally blended from the default
    pose to the policy's targets over the first seconds) -> HOLD_LAST (end of motion: the last safe
    targets) ... any phase --[SELECT / x / Ctrl-C / SIGTERM / fault]--> DAMPING (kp = 0, kd = 8,
    q = dq = tau = 0 for 1 s) -> DONE

Faults: no new LowState_ for 50 ms, a non-finite or out-of-range measurement, a streak of LowState_
frames with a bad CRC, a pelvis tilted past 60 degrees while the robot is under position control,
a non-finite policy output, or any exception. Every position command moves each joint target by at
most the motor's speed limit times the 2 ms tick from the previous command (a jump in the policy's
output is spread over a few ticks, never a step), then clamps it to the target range (the joint
limits widened by the distance at which the loop's torque at a stop reaches the motor's effort
limit, see :func:`target_range`) and to the band where the position loop's torque ``kp |q* - q|``
stays within the motor's effort limit (this clamp wins over the rate limit); feed-forward torque
is zero. Unused motor slots 29-34 get mode 0 and zero gains.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from bcg.core import g1
from bcg.core.rotations import tilt
from bcg.robot import crc, keyboard
from bcg.robot import dds_types as dt

N = g1.NUM_JOINTS


class Phase(enum.Enum):
    WAIT_STATE = "waiting for LowState_"
    ZERO_TORQUE = "zero torque"
    STAND_UP = "standing up"
    HOLD_DEFAULT = "holding the default pose"
    POLICY = "running the policy"
    HOLD_LAST = "motion finished, holding the last pose"
    DAMPING = "damping"
    DONE = "done"


#: What the operator sees for each phase: what happens and the button / key to press.
PROMPTS: dict[Phase, str] = {
    Phase.WAIT_STATE: "waiting for the robot's LowState_ ...",
    Phase.ZERO_TORQUE: "ZERO TORQUE. Press START (remote) or 's' to stand up; SELECT or 'x' quits",
    Phase.STAND_UP: "STANDING UP to the default pose ... SELECT or 'x' damps",
    Phase.HOLD_DEFAULT: (
        "HOLDING the default pose. Press A (remote) or 'a' to run the policy; SELECT/'x' damps"
    ),
    Phase.POLICY: "RUNNING the policy. SELECT or 'x' (or Ctrl-C) damps",
    Phase.HOLD_LAST: "MOTION FINISHED, holding the last pose. SELECT or 'x' damps and exits",
    Phase.DAMPING: "DAMPING (kp = 0, kd = 8) ...",
    Phase.DONE: "done",
}


@dataclass(frozen=True)
class SafetyConfig:
    """Safety thresholds and timings.

    Attributes:
        stale_after: s without a new LowState_ that counts as a lost link.
        first_state_timeout: s to wait for the first LowState_ before giving up (no command sent).
        stand_up_time: s of the move from the measured pose to the default pose.
        gain_ramp_time: s over which the gains rise from 0 on entering position control.
        damping_kd: N m s/rad of the damping command.
        damping_time: s of damping commands before exiting.
        bad_crc_streak: consecutive LowState_ frames with a wrong CRC that count as a fault.
        joint_margin: rad beyond the joint limits at which a measured position is invalid.
        velocity_factor: measured joint speed above this times the motor's speed limit is invalid.
        max_tilt: rad of pelvis tilt from upright that is a fall under position control.
        policy_blend_time: s after A over which the commanded targets blend linearly from the
            default pose to the policy's (0: the policy's from the first tick).
        policy_after_end: keep running the policy once the motion has ended (HOLD_LAST), its
            targets in force, for a policy trained with a lead-out (``env.clip_end_hold``) that
            balances on the clip's last frame held still; False holds the last target open-loop.
        target_rate_factor: a position command's target moves at most this times the motor's
            speed limit (:data:`bcg.core.g1.VELOCITY_LIMIT`) times ``command_dt`` per tick.
        command_dt: s between commands (500 Hz).
        require_crc: a LowState_ without a CRC (0, which simulators send) counts as a bad frame; set
            on the real robot's domain.
        mode_machines: robot-type codes (LowState_ ``mode_machine``) the client drives: 5, the G1
            with 29 DoF, and 0, which simulators send. The G1's other codes (4: 23 DoF, 6: 29 DoF
            with the waist locked) lack joints that a 29-joint policy commands and observes: a
            state with a code not listed is a fault, before any command when it is the first.
    """

    stale_after: float = 0.05
    first_state_timeout: float = 10.0
    stand_up_time: float = 2.5
    gain_ramp_time: float = 1.0
    damping_kd: float = 8.0
    damping_time: float = 1.0
    bad_crc_streak: int = 10
    joint_margin: float = 0.35
    velocity_factor: float = 2.0
    max_tilt: float = np.deg2rad(60.0)
    policy_blend_time: float = 0.0  # a blend made the Dance policy fall after A (docs/robot.md)
    policy_after_end: bool = False
    target_rate_factor: float = 1.0
    command_dt: float = 0.002
    require_crc: bool = False
    mode_machines: tuple[int, ...] = (0, 5)


#: The G1's robot-type codes (PROTOCOL: G1 rev 1.0) and what they mean, for messages.
ROBOT_TYPES = {
    0: "a simulator",
    4: "a G1 with 23 DoF",
    5: "a G1 with 29 DoF",
    6: "a G1 with 29 DoF, waist locked",
}


class Fault(Exception):
    """A condition that sends the robot to damping and the client to a non-zero exit."""


@dataclass
class Measured:
    """One LowState_, decoded. Joint arrays in :data:`g1.JOINT_NAMES` order.

    Attributes:
        tick: ms, the robot's clock.
        mode_machine: robot-type code to echo in every command.
        q: rad (29,); dq: rad/s (29,).
        quat: (4,) pelvis IMU orientation (w, x, y, z); gyro: rad/s (3,) body frame;
        acc: m/s^2 (3,) body frame.
        buttons: remote buttons held.
        received: s (monotonic) when the client took it.
    """

    tick: int
    mode_machine: int
    q: np.ndarray
    dq: np.ndarray
    quat: np.ndarray
    gyro: np.ndarray
    acc: np.ndarray
    buttons: frozenset[str]
    received: float


def decode_state(image: np.ndarray, received: float) -> Measured:
    """:class:`Measured` of a LowState_ C image."""
    motors = image["motor_state"][:N]
    imu = image["imu_state"]
    return Measured(
        tick=int(image["tick"]),
        mode_machine=int(image["mode_machine"]),
        q=motors["q"].astype(np.float64),
        dq=motors["dq"].astype(np.float64),
        quat=imu["quaternion"].astype(np.float64),
        gyro=imu["gyroscope"].astype(np.float64),
        acc=imu["accelerometer"].astype(np.float64),
        buttons=keyboard.buttons_from_remote(image["wireless_remote"].tobytes()),
        received=received,
    )


def state_crc_ok(image: np.ndarray, require: bool = False) -> bool:
    """True if a LowState_ image's CRC is right, or absent (0: simulators that do not fill it) unless
    ``require`` (the real robot always fills it)."""
    return (int(image["crc"]) == 0 and not require) or crc.crc32_words(image) == int(image["crc"])


def check_state(state: Measured, limits: np.ndarray, config: SafetyConfig) -> str | None:
    """Why a measurement is invalid (None if it is fine).

    Args:
        limits: joint limits (29, 2) rad.
    """
    if state.mode_machine not in config.mode_machines:
        kind = ROBOT_TYPES.get(state.mode_machine, "an unknown robot type")
        return (
            f"LowState_ reports mode_machine {state.mode_machine} ({kind}); this client drives a G1 with "
            f"29 DoF (mode_machine 5; 0 from simulators). If this robot is one, accept its code with "
            f"--mode-machine {state.mode_machine}"
        )
    for name in ("q", "dq", "quat", "gyro", "acc"):
        if not np.all(np.isfinite(getattr(state, name))):
            return f"non-finite {name} in LowState_"
    outside = (state.q < limits[:, 0] - config.joint_margin) | (state.q > limits[:, 1] + config.joint_margin)
    if np.any(outside):
        j = int(np.argmax(outside))
        return f"{g1.JOINT_NAMES[j]} at {state.q[j]:.3f} rad, beyond its limits {limits[j].round(3).tolist()}"
    fast = np.abs(state.dq) > config.velocity_factor * g1.VELOCITY_LIMIT
    if np.any(fast):
        j = int(np.argmax(fast))
        return f"{g1.JOINT_NAMES[j]} speed {state.dq[j]:.1f} rad/s is implausible"
    norm = float(np.linalg.norm(state.quat))
    if abs(norm - 1.0) > 0.1:
        return f"IMU quaternion norm {norm:.3f}"
    return None


def target_range(limits: np.ndarray, kp: np.ndarray) -> np.ndarray:
    """The range (29, 2) rad a position target may take: the joint limits widened on each side by
    ``effort limit / kp``.

    The policies were trained, and are checked in sim2sim, with the PD torque ``kp (q* - q)`` clipped
    to the effort limit and no bound on q*: near a joint's limit they set q* beyond it to push with
    more torque (ankle pitch up to 0.9 rad beyond; ``python -m bcg.studies.client_lockstep``). Clipped
    to the joint limits themselves, that torque is lost and the shipped Jump falls 5.5 s after A. A
    target further out than ``effort limit / kp`` adds no torque even with the joint at its stop, so
    this range bounds what reaches the motor without changing what the policy was trained on.
    """
    reach = g1.EFFORT_LIMIT / np.maximum(kp, 1e-9)
    return np.column_stack([limits[:, 0] - reach, limits[:, 1] + reach])


def clamp_targets(q_target: np.ndarray, q_meas: np.ndarray, kp: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Joint targets (29,) clipped to ``limits`` (the client passes :func:`target_range`), then to
    where kp |q* - q| <= effort limit."""
    q = np.clip(q_target, limits[:, 0], limits[:, 1])
    reach = g1.EFFORT_LIMIT / np.maximum(kp, 1e-9)
    return np.clip(q, q_meas - reach, q_meas + reach)


class Commander:
    """Fills the LowCmd_ C image for each kind of command (mode_pr 0, slots 29-34 off, CRC set)."""

    def __init__(self):
        self.image = np.zeros((), dt.LOW_CMD_LAYOUT)

    def _finish(self, mode_machine: int) -> np.ndarray:
        self.image["mode_pr"] = 0
        self.image["mode_machine"] = mode_machine
        self.image["motor_cmd"][N:] = 0
        self.image["crc"] = crc.crc32_words(self.image)
        return self.image

    def zero_torque(self, mode_machine: int) -> np.ndarray:
        """Motors enabled, every gain and target zero: the robot is limp."""
        m = self.image["motor_cmd"]
        m[:N] = 0
        m["mode"][:N] = 1
        return self._finish(mode_machine)

    def damping(self, mode_machine: int, kd: float) -> np.ndarray:
        """kp = 0, kd on every joint, q = dq = tau = 0: a slow, safe collapse."""
        m = self.image["motor_cmd"]
        m[:N] = 0
        m["mode"][:N] = 1
        m["kd"][:N] = kd
        return self._finish(mode_machine)

    def position(self, mode_machine: int, q: np.ndarray, kp: np.ndarray, kd: np.ndarray) -> np.ndarray:
        """Position control to q (29,) rad with gains kp, kd (29,); dq = tau = 0."""
        m = self.image["motor_cmd"]
        m[:N] = 0
        m["mode"][:N] = 1
        m["q"][:N] = q
        m["kp"][:N] = kp
        m["kd"][:N] = kd
        return self._finish(mode_machine)


class Supervisor:
    """The phase machine: turns measurements, button presses and policy targets into commands.

    Args:
        config: thresholds and timings.
        limits: joint limits (29, 2) rad: the state check's; targets are clipped to :func:`target_range`.
        default_pose: rad (29,), the policy's default pose.
        kp, kd: (29,) position-loop gains (the policy's).
        driver: the policy side (see :class:`bcg.robot.run.InlineDriver`): ``control_dt``,
            ``start(state)``, ``request(state)`` (non-blocking) and ``result()`` -> None or
            ``(q_target (29,), finished)``; None runs to HOLD_DEFAULT only.
        auto_start: press START at once and A 0.5 s after the default pose is reached (scripts).
    """

    def __init__(self, config, limits, default_pose, kp, kd, driver=None, auto_start: bool = False):
        self.config = config
        self.limits = np.asarray(limits, dtype=np.float64)  # for the state check
        self.default_pose = np.asarray(default_pose, dtype=np.float64)
        self.kp = np.asarray(kp, dtype=np.float64)
        self.kd = np.asarray(kd, dtype=np.float64)
        self.target_limits = target_range(self.limits, self.kp)
        self.driver = driver
        self.auto_start = auto_start
        self.commander = Commander()
        self.edges = keyboard.ButtonEdges()
        self.phase = Phase.WAIT_STATE
        self.phase_since = None
        self.state: Measured | None = None
        self.stop_reason: str | None = None
        self.fault = False
        self.damping_notes: list[str] = []  # errors met (and ignored) while damping
        self.started = None
        self.stand_from = None
        self.target = None  # the position target in force (POLICY, HOLD_LAST)
        self.policy_due = None
        self.policy_pending_since: float | None = None
        self.bad_crc_run = 0
        self.policy_steps = 0
        self.last_q: np.ndarray | None = None  # the previous position command's targets
        self.policy_since: float | None = None

    # inputs -------------------------------------------------------------------------------------
    def on_state_image(self, image: np.ndarray, now: float) -> None:
        """A LowState_ image as taken: CRC checked (bad frames dropped, a streak is a fault)."""
        if not state_crc_ok(image, self.config.require_crc):
            self.bad_crc_run += 1
            if self.bad_crc_run >= self.config.bad_crc_streak:
                raise Fault(f"{self.bad_crc_run} LowState_ frames in a row with a wrong CRC")
            return
        self.bad_crc_run = 0
        state = decode_state(image, now)
        reason = check_state(state, self.limits, self.config)
        if reason is not None:
            raise Fault(reason)
        self.state = state
        for button in self.edges.update(state.buttons):
            self.press(button, now)

    def press(self, button: str, now: float) -> None:
        """An operator button (remote or keyboard): start, a, select."""
        if button == "select":
            self.stop("operator pressed SELECT", fault=False, now=now)
        elif button == "start" and self.phase is Phase.ZERO_TORQUE:
            self._enter(Phase.STAND_UP, now)
            self.stand_from = self.state.q.copy()
        elif button == "a" and self.phase is Phase.HOLD_DEFAULT:
            self._enter(Phase.POLICY, now)
            self.policy_since = now
            self.target = self.default_pose.copy()
            if self.driver is not None:
                self.driver.start(self.state)
                self.policy_due = now

    def stop(self, reason: str, fault: bool, now: float) -> None:
        """Go to damping (or, before any state, straight to DONE) for ``reason``."""
        if self.phase in (Phase.DAMPING, Phase.DONE):
            return
        self.stop_reason, self.fault = reason, fault
        self._enter(Phase.DONE if self.state is None else Phase.DAMPING, now)

    def _enter(self, phase: Phase, now: float) -> None:
        self.phase, self.phase_since = phase, now

    # outputs ------------------------------------------------------------------------------------
    def tick(self, now: float) -> np.ndarray | None:
        """The command for this 2 ms tick (None while no state has arrived or when DONE)."""
        if self.started is None:
            self.started = now
        cfg = self.config
        if self.phase is Phase.WAIT_STATE:
            if self.state is None:
                if now - self.started > cfg.first_state_timeout:
                    raise Fault(f"no LowState_ received within {cfg.first_state_timeout:g} s")
                return None
            self._enter(Phase.ZERO_TORQUE, now)
            if self.auto_start:
                self.press("start", now)
        if self.phase is Phase.DONE:
            return None
        mm = self.state.mode_machine
        if self.phase is Phase.DAMPING:
            if now - self.phase_since >= cfg.damping_time:
                self._enter(Phase.DONE, now)
            return self.commander.damping(mm, cfg.damping_kd)
        age = now - self.state.received
        if age > cfg.stale_after:
            raise Fault(f"LowState_ is {age * 1e3:.0f} ms old (link lost or robot stopped publishing)")
        if self.phase is Phase.ZERO_TORQUE:
            self.last_q = None
            return self.commander.zero_torque(mm)
        if self.phase in (Phase.HOLD_DEFAULT, Phase.POLICY, Phase.HOLD_LAST):
            angle = tilt(self.state.quat)
            if angle > cfg.max_tilt:
                raise Fault(f"pelvis tilted {np.rad2deg(angle):.0f} deg from upright (fall)")
        elapsed = now - self.phase_since
        if self.phase is Phase.STAND_UP:
            alpha = min(1.0, elapsed / cfg.stand_up_time)
            gain = min(1.0, elapsed / cfg.gain_ramp_time)
            q = self.stand_from + alpha * (self.default_pose - self.stand_from)
            if alpha >= 1.0:
                self._enter(Phase.HOLD_DEFAULT, now)
            return self._position(q, gain)
        if self.phase is Phase.HOLD_DEFAULT:
            if self.auto_start and elapsed >= 0.5:
                self.press("a", now)
            return self._position(self.default_pose, 1.0)
        q = self.target  # POLICY, HOLD_LAST
        if cfg.policy_blend_time > 0 and self.policy_since is not None:
            beta = min(1.0, (now - self.policy_since) / cfg.policy_blend_time)
            q = self.default_pose + beta * (q - self.default_pose)
        return self._position(q, 1.0)

    def _position(self, q: np.ndarray, gain: float) -> np.ndarray:
        kp, kd = gain * self.kp, gain * self.kd
        start = self.state.q if self.last_q is None else self.last_q  # from the measured pose at first
        step = self.config.target_rate_factor * g1.VELOCITY_LIMIT * self.config.command_dt
        q = clamp_targets(np.clip(q, start - step, start + step), self.state.q, kp, self.target_limits)
        self.last_q = q
        return self.commander.position(self.state.mode_machine, q, kp, kd)

    def policy_step(self, now: float) -> None:
        """Collect a policy result and request the next one when due (every ``control_dt``).

        Call after sending the tick's command. A result takes effect from the next tick on and is
        held until the next result; one late by more than five control steps is a fault.
        """
        after_end = self.phase is Phase.HOLD_LAST and self.config.policy_after_end
        running = self.phase is Phase.POLICY or after_end
        if not running or self.driver is None:
            return
        result = self.driver.result()
        if result is not None:
            self.policy_pending_since = None
            q_target, finished = result
            if not np.all(np.isfinite(q_target)):
                raise Fault("the policy produced a non-finite target")
            self.target = np.clip(q_target, self.target_limits[:, 0], self.target_limits[:, 1])
            self.policy_steps += 1
            if finished and self.phase is Phase.POLICY:
                self._enter(Phase.HOLD_LAST, now)
                if not self.config.policy_after_end:
                    # held open loop until SELECT: no lasting push into a stop (rate-limited move)
                    self.target = np.clip(self.target, self.limits[:, 0], self.limits[:, 1])
                return
        dt = self.driver.control_dt
        if self.policy_pending_since is None and now >= self.policy_due:
            self.driver.request(self.state)
            self.policy_pending_since = now
            self.policy_due = max(self.policy_due + dt, now - dt)  # no burst after a delay
        elif self.policy_pending_since is not None and now - self.policy_pending_since > 5 * dt:
            raise Fault(f"no policy result for {(now - self.policy_pending_since) * 1e3:.0f} ms")
