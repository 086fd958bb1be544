"""The robot client against the MuJoCo emulator in simulated time, each of its differences from
sim2sim switchable.

    python -m bcg.studies.client_lockstep POLICY [--variants client,true-state,...] [--seconds S]

sim2sim plays a policy on the true state with the PD torque clipped to the effort limit. The robot
client (:mod:`bcg.robot.run`) differs in four ways that this study switches: the state comes from
its estimator (:class:`bcg.robot.estimator.StateEstimator`), each joint target moves at most the motor's speed
limit per 2 ms tick, targets are clipped to a range (:func:`bcg.robot.safety.target_range`: the
joint limits widened by ``effort limit / kp``), and each target is clamped to the band where
``kp |q* - q|`` stays within the effort limit. Here the client's own supervisor and policy driver
run tick by tick against :class:`bcg.robot.emulator.G1Emulator`, without DDS or a wall clock, as an
operator runs it on the gantry: START once the first command arrives, the band lets go after a
second of steady holding, A at its release. Each variant changes one difference (``bare``: all four
off; ``joint-range``: targets clipped to the joint limits themselves, as the client did before
2026-12-05), and the table gives how long each stays up after A, so that a fall through the client
can be traced to its cause. Deterministic: no noise, one run per variant, and as chaotic as any
single rollout (a small change can move a fall). Left as they are, not switched: the emulator's
physics (2 ms steps, the PD at 500 Hz; sim2sim 5 ms, 200 Hz), the stand-up and band release before
A, and an ideal link (each state taken on the tick it is published, each command applied on the
next; ``--latency`` delays the policy's results).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.kinematics import RobotState, g1_model, robot_state_from_mujoco
from bcg.core.rotations import tilt
from bcg.learn.policy import PolicyFileError
from bcg.motion.errors import MotionFileError
from bcg.robot.emulator import TIMESTEP, EmulatorConfig, G1Emulator
from bcg.robot.estimator import StateEstimator
from bcg.robot.run import InlineDriver, PolicyDriver, load_checked
from bcg.robot.safety import Fault, Phase, SafetyConfig, Supervisor

#: variant -> (estimator, rate limit, target range: "widened" / "joint" / "none", effort band)
VARIANTS: dict[str, tuple[bool, bool, str, bool]] = {
    "client": (True, True, "widened", True),
    "joint-range": (True, True, "joint", True),
    "true-state": (False, True, "widened", True),
    "no-rate-limit": (True, False, "widened", True),
    "no-range-clip": (True, True, "none", True),
    "no-effort-band": (True, True, "widened", False),
    "bare": (False, False, "none", False),
}
START_AFTER_CONNECT = 0.5  # s, as the shipped instructions' button schedule
BUTTON_HOLD = 0.1  # s


@dataclass
class Outcome:
    variant: str
    up_for: float | None  # s of policy control after A (None: A was never pressed)
    policy_steps: int
    clip_steps: int
    end: str  # why it ended: "motion finished", a fault's message, or "time"
    fell: bool  # the tilt fault, or the root below 0.4 m at the end
    end_tilt: float  # deg, the pelvis from upright at the last tick
    end_height: float  # m, the root's height at the last tick
    beyond: tuple[str, float, float]  # the joint whose raw targets pass its limit most: rad, share of steps
    up_after_end: float | None = None  # s upright after MOTION FINISHED (``after_end``; None: not asked)


class TrueState(StateEstimator):
    """The emulator's true state in place of the estimate (same interface)."""

    def __init__(self, emulator: G1Emulator):
        super().__init__()
        self.emulator = emulator
        self.truth = mujoco.MjData(emulator.model)

    def capture(self) -> None:
        """Take the state the emulator is about to publish (call before its step)."""
        self.truth.qpos[:] = self.emulator.data.qpos
        self.truth.qvel[:] = self.emulator.data.qvel

    def update(self, quat, gyro, joint_pos, joint_vel, time: float) -> RobotState:
        mujoco.mj_kinematics(self.emulator.model, self.truth)
        return robot_state_from_mujoco(self.emulator.model, self.truth)


class StudySupervisor(Supervisor):
    """The client's supervisor with its target range and effort band switchable."""

    def __init__(self, *args, target_clip: str = "widened", effort_band: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        if target_clip == "joint":
            self.target_limits = self.limits.copy()
        elif target_clip == "none":
            self.target_limits = np.column_stack(
                [np.full(len(self.limits), -np.inf), np.full(len(self.limits), np.inf)]
            )
        self.effort_band = effort_band

    def _position(self, q: np.ndarray, gain: float) -> np.ndarray:
        if self.effort_band:
            return super()._position(q, gain)
        kp, kd = gain * self.kp, gain * self.kd
        start = self.state.q if self.last_q is None else self.last_q
        step = self.config.target_rate_factor * g1.VELOCITY_LIMIT * self.config.command_dt
        q = np.clip(
            np.clip(q, start - step, start + step), self.target_limits[:, 0], self.target_limits[:, 1]
        )
        self.last_q = q
        return self.commander.position(self.state.mode_machine, q, kp, kd)


class DelayedDriver(InlineDriver):
    """A policy result that takes ``ticks`` command ticks (>= 1) to arrive: the policy process's
    compute time and the link's delay, which the in-process driver leaves out."""

    def __init__(self, driver: PolicyDriver, ticks: int):
        super().__init__(driver)
        self.ticks, self._age = ticks, 0
        self.targets: list[np.ndarray] = []  # the policy's raw targets, as returned

    def request(self, state) -> None:
        super().request(state)
        self._age = 0

    def result(self):
        if self._result is None:
            return None
        self._age += 1
        if self._age < self.ticks:
            return None
        out = super().result()
        self.targets.append(out[0])
        return out


def run_variant(
    policy,
    clip,
    variant: str,
    seconds: float | None = None,
    latency: float = 0.0,
    after_end: float = 0.0,
    policy_after_end: bool = False,
) -> Outcome:
    """Stand up on the band, press A at its release and play until the motion ends, a fault, or
    ``seconds`` after A (default: the clip's duration plus 1 s). ``latency`` (s, rounded to 2 ms
    ticks) delays each policy result beyond the next tick's.

    With ``after_end`` > 0 the play goes on past MOTION FINISHED for up to that many seconds, or
    until the pelvis tilts past 30° or the root drops below 0.5 m (``Outcome.up_after_end``): with
    the client's open-loop hold of the last target, or with ``policy_after_end`` the policy kept
    running against the clip's last frame held still (what the client does for a policy trained
    with a lead-out)."""
    estimated, rate_limit, target_clip, band = VARIANTS[variant]
    emulator = G1Emulator(EmulatorConfig(band=True))
    estimator = StateEstimator() if estimated else TrueState(emulator)
    config = SafetyConfig(target_rate_factor=1.0 if rate_limit else 1e9, policy_after_end=policy_after_end)
    inner = PolicyDriver(policy, clip, estimator)
    if policy_after_end:
        inner.lead_out = max(inner.lead_out, after_end)  # its references past the end: the last frame, still
    driver = DelayedDriver(inner, 1 + int(round(latency / TIMESTEP)))
    limits = g1.joint_limits(g1_model())
    sup = StudySupervisor(config, limits, policy.default_joint_pos, policy.kp, policy.kd, driver,
                          target_clip=target_clip, effort_band=band)  # fmt: skip
    play = (clip.duration + 1.0) if seconds is None else seconds
    presses: dict[str, float] = {}
    command, a_at, end, end_at, up_after_end = None, None, "time", None, None
    ticks = int(round((config.stand_up_time + 10.0 + play + after_end) / TIMESTEP))
    for k in range(ticks):
        now = k * TIMESTEP
        if command is not None:
            emulator.receive([command])
            presses.setdefault("start", now + START_AFTER_CONNECT)
        if not emulator.band_on and "a" not in presses:
            presses["a"] = now
        held = frozenset(b for b, at in presses.items() if at <= now < at + BUTTON_HOLD)
        if isinstance(estimator, TrueState):
            estimator.capture()
        emulator.step(held)
        try:
            sup.on_state_image(emulator.state.copy(), now)
            out = sup.tick(now)
            command = None if out is None else out.copy()  # DDS copies; the commander reuses its image
            sup.policy_step(now)
        except Fault as exc:
            end = str(exc)
            if end_at is not None:  # a fault after the motion's end (the tilt fault): down then
                up_after_end = now - end_at
            break
        if sup.phase is Phase.POLICY and a_at is None:
            a_at = now
        if sup.phase is Phase.HOLD_LAST:
            end = "motion finished"
            if after_end <= 0:
                break
            end_at = now if end_at is None else end_at
            down = tilt(emulator.data.qpos[3:7]) > np.deg2rad(30.0) or emulator.data.qpos[2] < 0.5
            if down or now - end_at >= after_end:
                up_after_end = now - end_at
                break
        elif a_at is not None and now - a_at >= play:
            break
    height = float(emulator.data.qpos[2])
    raw = np.array(driver.targets).reshape(-1, g1.NUM_JOINTS)
    past = np.maximum(raw - limits[:, 1], 0.0) + np.maximum(limits[:, 0] - raw, 0.0)
    j = int(np.argmax(past.max(axis=0, initial=0.0)))
    beyond = (
        g1.JOINT_NAMES[j],
        float(past[:, j].max(initial=0.0)),
        float(np.mean(past[:, j] > 0)) if len(past) else 0.0,
    )
    return Outcome(
        variant,
        None if a_at is None else (now if end_at is None else end_at) - a_at,
        sup.policy_steps,
        int(np.floor(clip.duration / policy.control_dt)),
        end,
        end.startswith("pelvis tilted") or height < 0.4,
        float(np.rad2deg(tilt(emulator.data.qpos[3:7]))),
        height,
        beyond,
        up_after_end,
    )


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bcg.studies.client_lockstep", description=doc)
    parser.add_argument("policy", help="policy file (.h5)")
    names = ", ".join(VARIANTS)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {names} (default: all)"
    )
    parser.add_argument("--seconds", type=float, default=None, help="s after A (default: the clip + 1 s)")
    parser.add_argument(
        "--latency", type=float, default=0.0, help="ms more for each policy result (default 0)"
    )
    parser.add_argument(
        "--after-end",
        type=float,
        default=0.0,
        metavar="S",
        help="play on up to S s past MOTION FINISHED: open-loop hold, then the policy kept running",
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if args.seconds is not None and not args.seconds > 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    if not 0.0 <= args.after_end <= 60.0:
        parser.error(f"--after-end must be within 0-60 s, got {args.after_end}")
    if not 0.0 <= args.latency <= 100.0:
        parser.error(
            f"--latency must be within 0-100 ms (the client faults past 5 control steps), got {args.latency}"
        )
    try:
        policy, clip = load_checked(args.policy)
    except (PolicyFileError, MotionFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.policy}: {policy.motion_name}, clip {clip.duration:.1f} s (lead-in {clip.lead_in:g} s), "
          f"policy results {args.latency:g} ms late")  # fmt: skip
    header = "| variant | up after A [s] | policy steps | end | tilt, height at end | most past a limit |"
    print(header)
    print("|---|---|---|---|---|---|")
    for variant in variants:
        began = time.perf_counter()
        o = run_variant(policy, clip, variant, args.seconds, args.latency / 1000.0)
        up = "never started" if o.up_for is None else f"{o.up_for:.2f}"
        fell = " (fell)" if o.fell else ""
        pose = f"{o.end_tilt:.0f}°, {o.end_height:.2f} m"
        joint, rad, share = o.beyond
        most = f"{joint} {rad:.2f} rad, {100 * share:.0f} % of steps"
        print(
            f"| {variant} | {up} | {o.policy_steps}/{o.clip_steps} | {o.end}{fell} | {pose} | {most} |",
            flush=True,
        )
        print(f"  ({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    if args.after_end > 0:
        print(
            f"\nAfter MOTION FINISHED (up to {args.after_end:g} s; down: tilt past 30° or root below 0.5 m):"
        )
        print("| variant | open-loop hold (the client's) [s] | policy kept running on the last frame [s] |")
        print("|---|---|---|")
        for variant in variants:
            up = []
            for keep in (False, True):
                o = run_variant(
                    policy, clip, variant, args.seconds, args.latency / 1000.0, args.after_end, keep
                )
                up.append("motion did not finish" if o.up_after_end is None else f"{o.up_after_end:.2f}")
            print(f"| {variant} | {up[0]} | {up[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
