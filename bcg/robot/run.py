"""Run a trained policy on the Unitree G1 over DDS: ``python -m bcg.robot.run policy.h5``.

Before anything reaches the network the policy file is loaded and checked against the G1 module
(joint order, gains, action mapping, 50 Hz control rate, observation layout; see
:func:`bcg.learn.policy.load_policy`) and its reference motion is loaded and checked against the
hash stored in the policy; a mismatch exits with status 2 and no DDS participant is ever created.

Then the client waits for the robot's ``LowState_`` (copying its mode_machine into every command),
sends zero torque until START, stands up to the policy's default pose, holds it until A, runs the
policy at 50 Hz with commands at 500 Hz, holds the last pose at the end of the motion, and damps on
SELECT, Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, Ctrl-Z or any fault (see :mod:`bcg.robot.safety`). Keys ``s`` /
``a`` / ``x`` stand in for START / A / SELECT; ``--control FILE`` reads button names from a file or FIFO;
``--auto-start`` presses START and A by itself (simulation only). A guardian process
(:mod:`bcg.robot.guardian`) damps if this process dies or its command loop stops for ``--stall-ms``. Exit
status: 0 after an operator stop, 1 after a fault (message on stderr), 2 for bad input.

Real robot: ``--interface enp3s0 --domain 0`` (the robot's wired network, see docs/robot.md).
Simulation: the defaults, ``--interface lo --domain 1``, with ``python -m bcg.robot.emulator --band``
(the band holds the emulated robot up until the policy has it standing; see docs/robot.md).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from bcg.core import g1
from bcg.core.kinematics import RobotState, g1_model, reference_states
from bcg.core.rotations import quat_multiply, quat_to_rpy
from bcg.learn.observation import REFERENCE_STEPS, observation
from bcg.learn.policy import Policy, PolicyFileError, load_policy
from bcg.motion.clip import MotionClip
from bcg.motion.errors import MotionFileError
from bcg.robot import crc, dds, keyboard
from bcg.robot.estimator import StateEstimator
from bcg.robot.guardian import Guardian, describe
from bcg.robot.safety import PROMPTS, Commander, Fault, Measured, Phase, SafetyConfig, Supervisor

COMMAND_DT = 0.002  # s, 500 Hz

# Signals that stop the loop into damping: Ctrl-C, kill, a closed terminal or SSH session (SIGHUP),
# Ctrl-\ (SIGQUIT) and Ctrl-Z (SIGTSTP: suspending the loop would leave the last position target in
# force until the operator resumes it).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP)
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP)  # what a terminal sends


def policy_lead_out(policy: Policy) -> float:
    """s of lead-out the policy was trained with (``env.clip_end_hold``; 0 without one): such a
    policy balances on the clip's last frame held still, and the client keeps it running after the
    motion ends."""
    env = (policy.config or {}).get("env", {})
    hold = env.get("clip_end_hold", 0.0) if isinstance(env, dict) else 0.0
    return float(hold) if isinstance(hold, (int, float)) and not isinstance(hold, bool) and hold > 0 else 0.0


def policy_lead_in(policy: Policy) -> float:
    """s of lead-in the policy was trained with (``env.clip_lead_in``; 0 without one): the client
    plays the same reference, at rest on the first frame and speeding up to the clip's pace."""
    env = (policy.config or {}).get("env", {})
    lead = env.get("clip_lead_in", 0.0) if isinstance(env, dict) else 0.0
    if isinstance(lead, bool) or not isinstance(lead, (int, float)) or not 0 <= lead < float("inf"):
        raise PolicyFileError(f"{policy.path}: the stored config's clip_lead_in {lead!r} is not a time in s")
    return float(lead)


class PolicyDriver:
    """Estimator, shared observation builder and policy, in the reference motion's frame.

    At :meth:`start` the robot's estimated frame is aligned with the motion's first frame: the
    robot's heading and horizontal position are mapped onto the reference's (a yaw rotation and a
    horizontal shift), so that the policy sees the offsets it was trained on.

    Args:
        policy: the loaded policy.
        clip: its reference motion.
        estimator: the state estimator.
    """

    def __init__(self, policy: Policy, clip: MotionClip, estimator: StateEstimator):
        self.policy = policy
        self.clip = clip
        self.estimator = estimator
        self.control_dt = policy.control_dt
        self.steps = 0
        self.rotation = np.eye(3)
        self.rotation_quat = np.array([1.0, 0.0, 0.0, 0.0])
        self.shift = np.zeros(3)
        self.last_obs: np.ndarray | None = None
        self.lead_out = policy_lead_out(policy)

    def _estimate(self, state: Measured) -> RobotState:
        return self.estimator.update(state.quat, state.gyro, state.q, state.dq, state.tick * 1e-3)

    def start(self, state: Measured) -> None:
        """Reset the estimator and align the robot's frame with the motion's first frame."""
        self.steps = 0
        self.estimator.reset()
        robot = self._estimate(state)
        ref0 = self.clip.sample(0.0)
        delta = float(quat_to_rpy(ref0.root_quat)[2]) - float(quat_to_rpy(robot.root_quat[0])[2])
        c, s = np.cos(delta), np.sin(delta)
        self.rotation = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        self.rotation_quat = np.array([np.cos(delta / 2), 0.0, 0.0, np.sin(delta / 2)])
        start_xy = np.array([robot.root_pos[0, 0], robot.root_pos[0, 1], 0.0])
        self.shift = np.array([ref0.root_pos[0], ref0.root_pos[1], 0.0]) - self.rotation @ start_xy

    def _to_motion_frame(self, robot: RobotState) -> RobotState:
        r, t = self.rotation, self.shift
        return RobotState(
            root_pos=robot.root_pos @ r.T + t,
            root_quat=quat_multiply(self.rotation_quat, robot.root_quat),
            root_lin_vel=robot.root_lin_vel @ r.T,
            root_ang_vel=robot.root_ang_vel @ r.T,
            joint_pos=robot.joint_pos,
            joint_vel=robot.joint_vel,
            key_body_pos=robot.key_body_pos @ r.T + t,
        )

    def references(self, time_s: float) -> list[RobotState]:
        """Reference frames at t + k dt, k = 1, 2, 3, as batch-1 states (the training env's code);
        past the clip's end, for a policy trained with a lead-out, its last frame held still."""
        future = self.clip.sample_future(
            np.array([time_s]), steps=REFERENCE_STEPS, dt=self.control_dt, still_after_end=self.lead_out > 0
        )
        return reference_states(future)

    def step(self, state: Measured) -> tuple[np.ndarray, bool]:
        """Joint targets (29,) rad for the next control step, and whether the motion has ended."""
        time_s = self.steps * self.control_dt
        robot = self._to_motion_frame(self._estimate(state))
        self.last_obs = observation(robot, self.references(time_s))
        q_target = self.policy.targets(self.policy.act(self.last_obs))[0]
        self.steps += 1
        finished = time_s + 4 * self.control_dt > self.clip.duration
        return q_target, finished


class InlineDriver:
    """The supervisor's driver interface around a :class:`PolicyDriver` in this process: a
    request is computed at once and its result collected on the next tick (tests, dry runs)."""

    def __init__(self, driver: PolicyDriver):
        self.driver = driver
        self.control_dt = driver.control_dt
        self._result = None

    def start(self, state: Measured) -> None:
        self.driver.start(state)

    def request(self, state: Measured) -> None:
        self._result = self.driver.step(state)

    def result(self) -> tuple[np.ndarray, bool] | None:
        out, self._result = self._result, None
        return out


def _worker(conn, policy_path: str, motion: str | None = None) -> None:
    """Policy process: loads the policy itself, answers start / step messages in order."""
    for sig in TERMINAL_SIGNALS:  # sent to the whole process group: the client decides when to stop
        signal.signal(sig, signal.SIG_IGN)
    policy, clip = load_checked(policy_path, motion)
    driver = PolicyDriver(policy, clip, StateEstimator())
    conn.send(("ready", policy.control_dt))
    while True:
        try:
            kind, state = conn.recv()
        except (EOFError, OSError):  # the client is gone
            return
        if kind == "start":
            driver.start(state)
        elif kind == "step":
            conn.send(("target", driver.step(state)))
        else:
            return


class ProcessDriver:
    """The policy in its own process, so that its ~2 ms of numpy per step never delays the 500 Hz
    command loop (Python runs one thread at a time). Requests and results travel over a pipe; the
    worker is started before any DDS participant exists.

    Args:
        policy_path: the (already checked) policy file.
        startup_timeout: s to wait for the worker to load the policy.
        motion: the (already checked) clip file, or None for the one the policy names.
    """

    def __init__(self, policy_path: str, startup_timeout: float = 60.0, motion: str | None = None):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child, str(policy_path), motion), daemon=True)
        self._proc.start()
        child.close()  # the worker holds the only other end: its exit shows as end of file at once
        deadline = time.monotonic() + startup_timeout
        reply = None
        try:
            while reply is None and time.monotonic() < deadline:
                if self._conn.poll(0.05):
                    reply = self._conn.recv()
                elif not self._proc.is_alive():
                    break
        except (EOFError, OSError):
            reply = None
        if reply is None or reply[0] != "ready":
            self._proc.join(1.0)
            self.close()
            if self._proc.exitcode is not None:
                raise RuntimeError(
                    f"the policy process exited while loading (exit code {self._proc.exitcode})"
                )
            raise RuntimeError(f"the policy process did not start within {startup_timeout:g} s")
        self.control_dt = reply[1]
        self.pid = self._proc.pid

    def start(self, state: Measured) -> None:
        self._conn.send(("start", state))

    def request(self, state: Measured) -> None:
        self._conn.send(("step", state))

    def result(self) -> tuple[np.ndarray, bool] | None:
        if not self._proc.is_alive():
            raise RuntimeError(f"the policy process died (exit code {self._proc.exitcode})")
        if self._conn.poll():
            return self._conn.recv()[1]
        return None

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("stop", None))
            except OSError:
                pass
            self._proc.join(2.0)
            if self._proc.is_alive():
                self._proc.terminate()


@dataclass
class LoopStats:
    """Timing of the command loop (perf_counter seconds)."""

    wake: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    state_taken: list[float] = field(default_factory=list)  # when the state a command used was taken

    def period_jitter(self) -> np.ndarray:
        """|period - 2 ms| of consecutive sends, s."""
        return np.abs(np.diff(np.asarray(self.sent)) - COMMAND_DT)


class Display:
    """Shows the phase and the key to press whenever the phase changes.

    The lines are printed by a thread of their own: a terminal that stops taking output (Ctrl-S, a
    stalled SSH session, a ``| tee`` that backs up) blocks that thread, never the command loop."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.phase = None
        self._lines: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._print, name="bcg-display", daemon=True)
        self._thread.start()

    def _print(self) -> None:
        while (line := self._lines.get()) is not None:
            try:
                print(line, file=self.stream, flush=True)
            except Exception:  # e.g. BrokenPipeError once the terminal or a `| tee` is gone
                return

    def update(self, supervisor: Supervisor) -> None:
        if supervisor.phase is not self.phase:
            self.phase = supervisor.phase
            prompt = PROMPTS[self.phase]
            if self.phase is Phase.HOLD_LAST and supervisor.config.policy_after_end:
                prompt = "MOTION FINISHED, the policy holds the last pose. SELECT or 'x' damps and exits"
            self._lines.put(f"[{time.strftime('%H:%M:%S')}] {prompt}")

    def close(self, timeout: float = 0.5) -> None:
        """Print what is queued (waiting at most ``timeout`` s for the terminal) and stop the thread."""
        self._lines.put(None)
        self._thread.join(timeout)


class DampingInterrupted(RuntimeError):
    """A command could not be written while damping: the loop ends early (nothing more can be sent)."""


def _fail(supervisor: Supervisor, exc: BaseException, now: float, where: str) -> None:
    """An error in one stage of a tick: damp; while already damping, note it once and carry on
    (damping needs no new state, input or policy)."""
    if supervisor.phase in (Phase.DAMPING, Phase.DONE):
        note = f"{where}: {exc}" if isinstance(exc, Fault) else f"{where}: {exc!r}"
        if note not in supervisor.damping_notes and len(supervisor.damping_notes) < 5:
            supervisor.damping_notes.append(note)
        return
    supervisor.stop(str(exc) if isinstance(exc, Fault) else f"error: {exc!r}", fault=True, now=now)


def run_loop(
    supervisor: Supervisor,
    channels: dds.Channels,
    keys: keyboard.KeyInput | None = None,
    display: Display | None = None,
    stats: LoopStats | None = None,
    echo_tick: bool = False,
    guardian: Guardian | None = None,
) -> None:
    """The 500 Hz command loop until the supervisor is DONE.

    Each tick has three stages, each guarded on its own: inputs (LowState_, keys, signals), the
    command, the policy. An error in any stage sends the supervisor to damping, and the same tick
    already sends the damping command when the error came before it. Once damping, errors in the
    inputs or the policy (a state that stays bad, a CRC streak, a failing reader) are noted in
    ``supervisor.damping_notes`` and ignored, so damping is sent for its full duration; only a command
    that cannot be written ends the loop early, with :class:`DampingInterrupted`. A failing status
    display (a closed terminal) is switched off, never stops the loop. ``echo_tick`` (benchmarks) puts
    the tick of the state a command answers in the command's ``reserve[0]``. A ``guardian`` is armed with the
    first command and gets a heartbeat every tick; its answers are read every 50 ms: a guardian that has
    exited, stopped answering or cannot reach the robot is a fault.
    """
    signals: list[str] = []
    handlers = {sig: signal.signal(sig, lambda n, _f: signals.append(signal.Signals(n).name)) for sig in
                STOP_SIGNALS}  # fmt: skip
    gc.collect()
    gc.freeze()  # everything built so far is permanent: collections stay short inside the loop
    ticker = dds.Ticker(COMMAND_DT)
    ticks = 0
    try:
        while supervisor.phase is not Phase.DONE:
            now = ticker.wait()
            ticks += 1
            try:
                for image in channels.lowstate.take():
                    supervisor.on_state_image(image, now)
            except Exception as exc:
                _fail(supervisor, exc, now, "state")
            if keys is not None:
                try:
                    for button in keys.poll():
                        supervisor.press(button, now)
                except Exception as exc:
                    _fail(supervisor, exc, now, "keys")
            if signals:
                supervisor.stop(f"{signals[0]} received", fault=False, now=now)
            command = None
            try:
                command = supervisor.tick(now)
                if command is not None:
                    if echo_tick:
                        command["reserve"][0] = supervisor.state.tick
                        command["crc"] = crc.crc32_words(command)
                    channels.lowcmd.write(command)
                    if stats is not None:
                        stats.wake.append(now)
                        stats.sent.append(time.perf_counter())
                        stats.state_taken.append(supervisor.state.received)
            except Exception as exc:
                if supervisor.phase is Phase.DAMPING:
                    raise DampingInterrupted(f"damping command not sent: {exc!r}") from exc
                _fail(supervisor, exc, now, "command")  # damping goes out on the next tick
            if guardian is not None:
                try:
                    if command is not None and not guardian.armed:
                        guardian.arm(int(command["mode_machine"]))
                    guardian.beat()
                    if ticks % 25 == 0:
                        guardian.check(time.monotonic())
                except Exception as exc:
                    _fail(supervisor, exc, now, "guardian")
                    guardian = None  # gone, stopped or deaf: the client damps on its own
            try:
                supervisor.policy_step(now)
            except Exception as exc:
                _fail(supervisor, exc, now, "policy")
            if display is not None:
                try:
                    display.update(supervisor)
                except Exception:  # e.g. BrokenPipeError once the terminal or a `| tee` is gone
                    display = None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def robot_types(extra: list[int], on_robot: bool) -> tuple[int, ...]:
    """The mode_machine codes the client drives: the 29-DoF G1's (5), the simulators' (0) except on
    the robot's domain, and the codes given with ``--mode-machine``."""
    codes = {*SafetyConfig.mode_machines, *extra} - ({0} if on_robot and 0 not in extra else set())
    return tuple(sorted(codes))


def emergency_damping(
    channels: dds.Channels, supervisor: Supervisor, exc: BaseException, guardian: Guardian | None = None
) -> tuple[str, bool]:
    """Send damping for the configured time after the loop itself failed (not one of its guarded
    stages), with the guardian's heartbeat; returns what to report and whether it all went out."""
    commander, cfg = Commander(), supervisor.config
    mode_machine = supervisor.state.mode_machine
    t_end = time.perf_counter() + cfg.damping_time
    try:
        while time.perf_counter() < t_end:
            channels.lowcmd.write(commander.damping(mode_machine, cfg.damping_kd))
            if guardian is not None:
                try:
                    guardian.beat()
                except Exception:  # a guardian that is gone must not cut this damping short
                    guardian = None
            time.sleep(COMMAND_DT)
    except Exception as write_error:
        return f"the command loop failed and damping could not be sent: {write_error!r}", False
    return f"the command loop failed; damping was sent for {cfg.damping_time:.1f} s from outside it", True


def request_realtime(priority: int = 50, pid: int = 0) -> bool:
    """Put a thread or process (default: the calling thread, the command loop) on SCHED_FIFO and,
    for this process, lock its memory (no page faults in the loop); warns and returns False if
    refused."""
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(priority))
        if pid == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
                print("run: mlockall refused; memory not locked", file=sys.stderr)
        return True
    except (PermissionError, OSError, AttributeError) as exc:
        print(f"run: real-time priority refused ({exc}); running at normal priority", file=sys.stderr)
        return False


def load_checked(policy_path: str, motion: str | None = None) -> tuple[Policy, MotionClip]:
    """Load the policy and its motion (``motion``: a shipped clip's name or an .h5 path; None = the
    shipped clip named in the policy); PolicyFileError / MotionFileError if they do not fit the G1 or
    the clip is not the one the policy was trained on."""
    policy = load_policy(policy_path, g1_model())
    if abs(policy.control_dt - g1.CONTROL_DT) > 1e-12:
        raise PolicyFileError(
            f"{policy_path}: control dt {policy.control_dt} s, the robot runs {g1.CONTROL_DT} s"
        )
    try:
        clip = MotionClip.load(motion or policy.motion_name)
    except MotionFileError as exc:
        if motion is not None:
            raise
        raise MotionFileError(
            f"{exc}; the policy was trained on a clip named {policy.motion_name!r}: give its file with "
            "--motion PATH.h5"
        ) from None
    if clip.content_hash != policy.motion_hash:
        raise MotionFileError(
            f"motion {clip.path} is not the clip the policy was trained on ({policy.motion_name!r}, "
            f"hash {policy.motion_hash[:12]}; this clip's is {clip.content_hash[:12]})"
        )
    try:
        return policy, clip.with_lead_in(policy_lead_in(policy))
    except ValueError as exc:
        raise PolicyFileError(f"{policy.path}: the stored clip_lead_in: {exc}") from None


def dry_run(policy: Policy, clip: MotionClip) -> None:
    """One policy step on the estimate of the robot standing in the default pose; no network."""
    driver = PolicyDriver(policy, clip, StateEstimator())
    standing = Measured(0, 0, policy.default_joint_pos.copy(), np.zeros(29), np.array([1.0, 0, 0, 0]),
                        np.zeros(3), np.array([0, 0, 9.81]), frozenset(), 0.0)  # fmt: skip
    driver.start(standing)
    target, _ = driver.step(standing)
    if not np.all(np.isfinite(target)):
        raise PolicyFileError(f"{policy.path}: the policy's first target is not finite")
    lead = f", a {clip.lead_in:g} s lead-in from rest" if clip.lead_in else ""
    print(f"dry run: motion {policy.motion_name!r} ({clip.duration:.2f} s{lead}), "
          f"observation {driver.last_obs.shape[1]}"
          f" dims, first target max |q* - default| = {np.max(np.abs(target - policy.default_joint_pos)):.4f}"
          " rad; no DDS participant was created", file=sys.stderr)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcg.robot.run", description=__doc__.split("\n")[0])
    parser.add_argument("policy", help="policy file (.h5)")
    parser.add_argument("--interface", default=dds.LOOPBACK, help="network interface (robot: e.g. enp3s0)")
    parser.add_argument("--domain", type=int, default=dds.SIM_DOMAIN, help="DDS domain (robot 0, sim 1)")
    parser.add_argument(
        "--motion", default=None,
        help="the clip the policy tracks: a shipped clip's name or an .h5 file (default: the policy's; its "
        "content hash must match the policy's)",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="check the policy and run it once, no network")
    parser.add_argument("--auto-start", action="store_true", help="press START and A automatically (sim)")
    parser.add_argument("--control", default=None, help="file/FIFO of button names (start, a, select)")
    parser.add_argument("--no-keyboard", action="store_true", help="do not read keys from the terminal")
    parser.add_argument("--stand-up-time", type=float, default=2.5, help="s to reach the default pose")
    parser.add_argument(
        "--policy-blend", type=float, default=0.0,
        help="s after A over which the targets blend from the default pose to the policy's "
             "(0-2, default 0: a blend weakens the policy's balance while the clip runs on, see "
             "docs/robot.md; the rate limit still spreads a jump in the targets)",
    )  # fmt: skip
    parser.add_argument("--damping-time", type=float, default=1.0, help="s of damping before exiting")
    parser.add_argument("--first-state-timeout", type=float, default=10.0, help="s to wait for LowState_")
    parser.add_argument("--realtime", action="store_true", help="run the command loop at SCHED_FIFO priority")
    parser.add_argument(
        "--stall-ms", type=float, default=300.0,
        help="ms without a command-loop tick after which the guardian process kills the client and damps "
        "(default 300; at most 1000 on the robot)",
    )  # fmt: skip
    parser.add_argument(
        "--stale-ms", type=float, default=50.0,
        help="ms without a new LowState_ that counts as a lost link (default 50; raise only for emulators "
        "on a loaded machine)",
    )  # fmt: skip
    parser.add_argument(
        "--mode-machine", type=int, action="append", default=[], metavar="CODE",
        help="also accept this robot-type code in LowState_ (default: 5, the G1 with 29 DoF, and 0 from "
        "simulators, not on the robot's domain 0); only for a 29-DoF G1 that reports another code",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if not all(0 <= code <= 255 for code in args.mode_machine):
            raise ValueError(f"--mode-machine must be within 0-255, got {args.mode_machine}")
        if not 2.0 <= args.stand_up_time <= 3.0:
            raise ValueError("--stand-up-time must be within 2-3 s")
        if not 0.0 <= args.policy_blend <= 2.0:
            raise ValueError("--policy-blend must be within 0-2 s")
        if not 0.5 <= args.damping_time <= 10.0:
            raise ValueError("--damping-time must be within 0.5-10 s")
        if not (math.isfinite(args.first_state_timeout) and 0.0 < args.first_state_timeout <= 600.0):
            raise ValueError(f"--first-state-timeout must be within 0-600 s, got {args.first_state_timeout}")
        if args.auto_start and args.domain == dds.ROBOT_DOMAIN:
            raise ValueError("--auto-start is for simulation only; on the robot (domain 0) use the remote")
        dds.participant_config(args.interface, args.domain)
        policy, clip = load_checked(args.policy, args.motion)
    except (ValueError, PolicyFileError, MotionFileError) as exc:
        print(f"run: refused: {exc}", file=sys.stderr)
        return 2
    print(f"run: policy {policy.path} for motion {policy.motion_name!r}, checked against the G1 module",
          file=sys.stderr)  # fmt: skip
    if args.dry_run:
        try:
            dry_run(policy, clip)
        except PolicyFileError as exc:
            print(f"run: refused: {exc}", file=sys.stderr)
            return 2
        return 0
    on_robot = args.domain == dds.ROBOT_DOMAIN
    if not 5.0 <= args.stale_ms <= (100.0 if on_robot else 1000.0):
        print(f"error: --stale-ms must be between 5 and {100 if on_robot else 1000}"
              + (" on the robot (domain 0)" if on_robot else ""), file=sys.stderr)  # fmt: skip
        return 2
    if not 50.0 <= args.stall_ms <= (1000.0 if on_robot else 10000.0):
        print(f"error: --stall-ms must be between 50 and {1000 if on_robot else 10000}"
              + (" on the robot (domain 0)" if on_robot else ""), file=sys.stderr)  # fmt: skip
        return 2
    if args.control is not None and not os.path.exists(args.control):
        print(f"run: refused: --control {args.control}: no such file or FIFO", file=sys.stderr)
        return 2
    config = SafetyConfig(stand_up_time=args.stand_up_time, damping_time=args.damping_time,
                          policy_blend_time=args.policy_blend, policy_after_end=policy_lead_out(policy) > 0,
                          first_state_timeout=args.first_state_timeout, stale_after=args.stale_ms / 1000.0,
                          mode_machines=robot_types(args.mode_machine, on_robot),
                          require_crc=on_robot)  # fmt: skip
    try:
        driver = ProcessDriver(args.policy, motion=str(clip.path))
    except RuntimeError as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 1
    try:  # before the client's own participant: the robot discovers the guardian's writer first
        guardian = Guardian(args.interface, args.domain, args.stall_ms / 1000.0, config.damping_time,
                            config.damping_kd, realtime=args.realtime)  # fmt: skip
    except (RuntimeError, OSError) as exc:
        driver.close()
        print(f"run: {exc}; no DDS participant of the client was created", file=sys.stderr)
        return 1
    limits = g1.joint_limits(g1_model())
    supervisor = Supervisor(config, limits, policy.default_joint_pos, policy.kp, policy.kd, driver,
                            auto_start=args.auto_start)  # fmt: skip
    keys = channels = None
    stats = LoopStats()
    interrupted = None
    crash_note: str | None = None
    damped = False  # the client's own damping went out in full
    guardian_code: int | None = None
    try:
        try:
            keys = keyboard.KeyInput(use_stdin=not args.no_keyboard, control_path=args.control)
            channels = dds.open_channels(args.interface, args.domain, "client")
        except Exception as exc:  # a bad interface, an unreadable control file: before any command
            print(f"run: refused: could not open the inputs or DDS on {args.interface!r}, domain "
                  f"{args.domain}: {exc}; no command was sent", file=sys.stderr)  # fmt: skip
            return 2
        print(f"run: DDS domain {args.domain} on {args.interface}; keys: s = START, a = A, x = SELECT",
              file=sys.stderr)  # fmt: skip
        if args.realtime and request_realtime():
            request_realtime(priority=40, pid=driver.pid)
        display = Display()
        try:
            run_loop(supervisor, channels, keys, display, stats, guardian=guardian)
            damped = True
        except DampingInterrupted as exc:
            interrupted = exc
        except BaseException as exc:  # outside the loop's guarded stages: damp before anything else
            if supervisor.state is None or supervisor.phase is Phase.DONE:
                damped = supervisor.phase is Phase.DONE
                raise
            supervisor.stop(f"error: {exc!r}", fault=True, now=time.perf_counter())
            crash_note, damped = emergency_damping(channels, supervisor, exc, guardian)
        finally:
            # at once, before anything that can wait (a display whose terminal has stopped): not
            # damped in full (and armed), the guardian damps now, with its own participant
            guardian.release(damped)
            display.close()
    finally:
        guardian_code = guardian.close(timeout=config.damping_time + 5.0)
        if keys is not None:
            keys.close()
        if channels is not None:
            channels.close()
        driver.close()
    jitter = stats.period_jitter()
    if jitter.size:
        print(f"run: {len(stats.sent)} commands, period jitter p99 {np.percentile(jitter, 99) * 1e3:.3f} ms, "
              f"{supervisor.policy_steps} policy steps", file=sys.stderr)  # fmt: skip
    if supervisor.state is None:
        sent = "no command was sent"
    elif crash_note is not None:
        sent = crash_note
    elif interrupted is not None:
        sent = f"damping was cut short: {interrupted}"
    else:
        sent = f"damping was sent for {config.damping_time:.1f} s"
    if not damped and guardian.armed:
        sent += "; " + describe(guardian_code)
    if supervisor.damping_notes:
        sent += " (ignored while damping: " + "; ".join(supervisor.damping_notes) + ")"
    if supervisor.fault or interrupted is not None:
        print(f"run: FAULT: {supervisor.stop_reason}; {sent}", file=sys.stderr)
        return 1
    print(f"run: stopped: {supervisor.stop_reason}; {sent}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
