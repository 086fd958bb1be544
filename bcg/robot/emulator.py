"""MuJoCo G1 behind the robot's DDS interface: ``python -m bcg.robot.emulator``.

It behaves like Unitree's unitree_mujoco bridge, plus what the real robot also does:

- publishes ``LowState_`` on ``rt/lowstate`` at 500 Hz (one 2 ms physics step per state) with tick in
  milliseconds, mode_machine (5 = 29-DoF G1, as the real robot reports), the pelvis IMU
  (quaternion, gyroscope, accelerometer from the MJCF's ``imu_in_pelvis`` sensors, rpy), the 29
  motor states and a valid CRC;
- applies the newest ``LowCmd_`` as ``tau + kp (q - q_meas) + kd (dq - dq_meas)`` per motor with
  mode 1, clipped to the motor's effort limit (:data:`bcg.core.g1.EFFORT_LIMIT`); it drops and
  counts commands whose CRC is wrong; slots 29-34 are ignored;
- emulates the wireless remote from a schedule (``--buttons start@1,a@4``) or a control file/FIFO
  (one button name per line);
- optionally holds the pelvis in an elastic band for start-up (``--band``, as unitree_mujoco's
  ElasticBand): a spring-damper on the pelvis position (10 kN/m, 1 kN s/m) to the standing height
  and on its orientation (500 N m/rad, 50 N m s/rad). It lets go by itself once all 29 motors have
  held one fixed pose (mode 1, kp > 0, targets and gains unchanged) for ``--band-release`` seconds,
  i.e. once the client has stood the robot up and holds it; ``--band-release inf`` keeps it on
  (a gantry: needed by a stand-in policy that only holds the default pose, which cannot balance).

The model is ``g1.load_model(collisions="all", actuators=False)`` (floor, every collision
primitive, motor armature) at a 2 ms time step. A JSON-lines log (``--log``) records the robot's
height, uprightness, pose error and the last command's gains every 0.1 s, and a summary on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_to_rpy
from bcg.robot import crc, dds, keyboard
from bcg.robot import dds_types as dt

TIMESTEP = 0.002  # s, one physics step per published state (500 Hz)
BAND_KP, BAND_KD = 10000.0, 1000.0  # N/m, N s/m
BAND_ROT_KP, BAND_ROT_KD = 500.0, 50.0  # N m/rad, N m s/rad


@dataclass(frozen=True)
class EmulatorConfig:
    """Emulator settings.

    Attributes:
        domain: DDS domain id (1 = simulation).
        interface: network interface (``lo`` for tests).
        mode_machine: robot-type code reported in LowState_ (5 = G1 29 DoF).
        band: hold the pelvis in an elastic band until the motors hold the robot.
        band_release: s of steady position control (all 29 motors, fixed targets and gains) after
            which the band lets go.
        duration: s of wall time to run (None: until SIGINT/SIGTERM).
        buttons: remote schedule, e.g. ``(("start", 1.0), ("a", 4.0))``: button held 0.1 s at t (s
            after the start, or ``(event, s)`` after an event, see :func:`parse_schedule`).
        control: file or FIFO with one button name per line, pressed when read.
        log: JSON-lines log path (None: no log).
        viewer: open MuJoCo's passive viewer.
    """

    domain: int = dds.SIM_DOMAIN
    interface: str = dds.LOOPBACK
    mode_machine: int = 5
    band: bool = False
    band_release: float = 1.0
    duration: float | None = None
    buttons: tuple = ()
    control: str | None = None
    log: str | None = None
    viewer: bool = False


class G1Emulator:
    """The simulated robot: MuJoCo state, command application and LowState_ images."""

    def __init__(self, config: EmulatorConfig):
        self.config = config
        self.model = g1.load_model(collisions="all", actuators=False)
        self.model.opt.timestep = TIMESTEP
        self.data = mujoco.MjData(self.model)
        self.data.qpos[:] = g1.default_qpos(self.model)
        mujoco.mj_forward(self.model, self.data)
        self.qadr = g1.joint_qpos_adr(self.model)
        self.dadr = g1.joint_dof_adr(self.model)
        self.pelvis = int(g1.body_ids(self.model, [g1.ROOT_BODY])[0])
        sensor = {self.model.sensor(i).name: i for i in range(self.model.nsensor)}
        self.gyro_adr = self.model.sensor_adr[sensor["imu_ang_vel"]]
        self.acc_adr = self.model.sensor_adr[sensor["imu_lin_acc"]]
        self.cmd = np.zeros((), dt.LOW_CMD_LAYOUT)  # the command in force (none yet: zero torque)
        self.state = np.zeros((), dt.LOW_STATE_LAYOUT)
        self.state["mode_machine"] = config.mode_machine
        self.band_on = config.band
        self.band_anchor = g1.DEFAULT_ROOT_POS.copy()
        self.steady_for = 0.0
        self._prev_targets = np.zeros((2, g1.NUM_JOINTS))
        self.steps = 0
        self.commands = 0
        self.bad_crc = 0
        self.wrong_mode_machine = 0
        self.damping_frames = 0
        self._damping_span = None  # monotonic receipt times of the first and the latest damping frame

    def receive(self, images: list[np.ndarray]) -> None:
        """Check the CRC of received LowCmd_ images; the newest valid one takes effect."""
        for image in images:
            if crc.crc32_words(image) != int(image["crc"]):
                self.bad_crc += 1
                continue
            self.commands += 1
            m = image["motor_cmd"][: g1.NUM_JOINTS]
            zero = (m["q"] == 0) & (m["dq"] == 0) & (m["tau"] == 0) & (m["kp"] == 0)
            if np.all(zero & (m["kd"] == 8.0) & (m["mode"] == 1)):
                self.damping_frames += 1
                now = time.monotonic()
                self._damping_span = (self._damping_span or (now, now))[0], now
            if int(image["mode_machine"]) != self.config.mode_machine:
                self.wrong_mode_machine += 1
            self.cmd = image

    def motor_torque(self) -> np.ndarray:
        """Joint torques (29,) N m from the command in force, clipped to the effort limits."""
        m = self.cmd["motor_cmd"][: g1.NUM_JOINTS]
        q, dq = self.data.qpos[self.qadr], self.data.qvel[self.dadr]
        tau = m["tau"] + m["kp"] * (m["q"] - q) + m["kd"] * (m["dq"] - dq)
        tau = np.where(m["mode"] == 1, tau, 0.0)
        return np.clip(tau, -g1.EFFORT_LIMIT, g1.EFFORT_LIMIT)

    def _band_wrench(self) -> np.ndarray:
        pos, vel = self.data.qpos[0:3], self.data.qvel[0:3]
        force = BAND_KP * (self.band_anchor - pos) - BAND_KD * vel
        up = self.data.xmat[self.pelvis].reshape(3, 3)[:, 2]
        tilt_axis = np.cross(up, [0.0, 0.0, 1.0])  # |.| = sin(tilt), towards upright
        omega_world = self.data.xmat[self.pelvis].reshape(3, 3) @ self.data.qvel[3:6]
        torque = BAND_ROT_KP * tilt_axis - BAND_ROT_KD * omega_world
        return np.concatenate([force, torque])

    def step(self, buttons: frozenset[str] = frozenset()) -> None:
        """Publish-and-advance one time step: the LowState_ image is refreshed from the current
        state (positions, velocities, gyroscope from ``mj_step1``), the motors' torques are computed
        from the same state, then ``mj_step2`` integrates. The accelerometer, an acceleration-stage
        sensor, is the previous step's (2 ms old)."""
        if self.band_on:
            m = self.cmd["motor_cmd"][: g1.NUM_JOINTS]
            targets = np.stack([m["q"], m["kp"]])
            steady = np.all((m["mode"] == 1) & (m["kp"] > 0)) and np.allclose(
                targets, self._prev_targets, atol=1e-4
            )
            self._prev_targets = targets
            self.steady_for = self.steady_for + TIMESTEP if steady else 0.0
            self.band_on = self.steady_for < self.config.band_release
        mujoco.mj_step1(self.model, self.data)
        self.steps += 1
        self._fill_state(buttons)
        self.data.qfrc_applied[:] = 0.0
        self.data.qfrc_applied[self.dadr] = self.motor_torque()
        self.data.xfrc_applied[self.pelvis] = self._band_wrench() if self.band_on else 0.0
        mujoco.mj_step2(self.model, self.data)

    def _fill_state(self, buttons: frozenset[str]) -> None:
        s = self.state
        s["tick"] = (self.steps * 2) & 0xFFFFFFFF  # ms
        imu = s["imu_state"]
        quat = self.data.xquat[self.pelvis]  # the IMU site is not rotated in the pelvis frame
        imu["quaternion"] = quat
        imu["gyroscope"] = self.data.sensordata[self.gyro_adr : self.gyro_adr + 3]
        imu["accelerometer"] = self.data.sensordata[self.acc_adr : self.acc_adr + 3]
        imu["rpy"] = quat_to_rpy(quat)
        imu["temperature"] = 40
        motors = s["motor_state"]
        motors["mode"][: g1.NUM_JOINTS] = 1
        motors["q"][: g1.NUM_JOINTS] = self.data.qpos[self.qadr]
        motors["dq"][: g1.NUM_JOINTS] = self.data.qvel[self.dadr]
        motors["ddq"][: g1.NUM_JOINTS] = self.data.qacc[self.dadr]
        motors["tau_est"][: g1.NUM_JOINTS] = self.motor_torque()
        s["wireless_remote"] = np.frombuffer(keyboard.remote_with_buttons(buttons), np.uint8)
        s["crc"] = crc.crc32_words(s)

    def summary(self) -> dict:
        """Robot condition and link statistics (for the log)."""
        upright = float(self.data.xmat[self.pelvis].reshape(3, 3)[2, 2])
        m = self.cmd["motor_cmd"][: g1.NUM_JOINTS]
        q = self.data.qpos[self.qadr]
        return {
            "t": round(self.steps * TIMESTEP, 3),
            "root_z": round(float(self.data.qpos[2]), 4),
            "upright": round(upright, 4),
            "pose_err": round(float(np.max(np.abs(q - g1.DEFAULT_JOINT_POS))), 4),
            "pose_err_mean": round(float(np.mean(np.abs(q - g1.DEFAULT_JOINT_POS))), 4),
            "band": self.band_on,
            "commands": self.commands,
            "bad_crc": self.bad_crc,
            "damping_frames": self.damping_frames,
            # s from the first damping frame received to the latest (frames can be late or lost
            # on a loaded machine; the span shows how long damping was sent)
            "damping_s": round(self._damping_span[1] - self._damping_span[0], 3)
            if self._damping_span
            else 0.0,
            "wrong_mode_machine": self.wrong_mode_machine,
            "cmd_mode_machine": int(self.cmd["mode_machine"]),
            "cmd_modes": int(np.sum(m["mode"])),
            "cmd_kp_max": round(float(np.max(m["kp"])), 3),
            "cmd_kd_min": round(float(np.min(m["kd"])), 3),
            "cmd_kd_max": round(float(np.max(m["kd"])), 3),
            "cmd_q_abs_max": round(float(np.max(np.abs(m["q"]))), 4),
            "cmd_tau_abs_max": round(float(np.max(np.abs(m["tau"]))), 4),
            "unused_slots_zero": bool(np.all(self.cmd["motor_cmd"][g1.NUM_JOINTS :]["kp"] == 0)),
        }


SCHEDULE_EVENTS = ("connected", "release")  # the first LowCmd_ received; the band letting go


def parse_schedule(text: str) -> tuple[tuple[str, float | tuple[str, float]], ...]:
    """``"start@1.0,a@4"`` -> (("start", 1.0), ("a", 4.0)): seconds after the start. A time may
    also count from an event, ``EVENT+SECONDS`` (or the event alone): ``start@connected+0.5`` presses
    START 0.5 s after the first LowCmd_ arrives, ``a@release`` presses A as the band lets go, the
    way an operator does; such an item is (name, (event, seconds)). ValueError on bad input."""
    out: list = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, at = item.partition("@")
        event, plus, offset = at.partition("+")
        bad = not sep or name.lower() not in keyboard.BUTTON_BITS
        try:
            if event.strip() in SCHEDULE_EVENTS:
                when = (event.strip(), float(offset) if plus else 0.0)
                bad = bad or when[1] < 0
            else:
                when = float(at)
        except ValueError:
            bad = True
        if bad:
            raise ValueError(
                f"bad button schedule item {item!r}; expected NAME@SECONDS or NAME@EVENT[+SECONDS] "
                f"with EVENT one of {', '.join(SCHEDULE_EVENTS)}, e.g. start@1.5 or a@release"
            )
        out.append((name.lower(), when))
    return tuple(out)


def press_times(buttons: tuple, events: dict[str, float]) -> list[tuple[str, float]]:
    """The schedule's presses whose time is known: (name, seconds after the start), given the
    times at which events have happened so far."""
    out = []
    for name, when in buttons:
        if isinstance(when, tuple):
            event, offset = when
            if event in events:
                out.append((name, events[event] + offset))
        else:
            out.append((name, when))
    return out


def run(config: EmulatorConfig) -> int:
    """Serve the emulated robot until the duration ends or SIGINT/SIGTERM; returns an exit code."""
    emulator = G1Emulator(config)
    channels = keys = log = None
    try:
        channels = dds.open_channels(config.interface, config.domain, "robot", state_depth=8)
        keys = keyboard.KeyInput(use_stdin=False, control_path=config.control) if config.control else None
        log = open(config.log, "a", buffering=1) if config.log else None  # noqa: SIM115
    except Exception as exc:  # a bad interface, an unreadable control or log file
        for opened in (keys, channels):
            if opened is not None:
                opened.close()
        print(
            f"emulator: cannot start on {config.interface!r}, domain {config.domain}: {exc}", file=sys.stderr
        )
        return 2
    viewer = _open_viewer(emulator) if config.viewer else None
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    ticker = dds.Ticker(TIMESTEP)
    t0 = time.perf_counter()
    held_until: dict[str, float] = {}
    events: dict[str, float] = {}
    print(
        f"emulator: G1 on domain {config.domain} via {config.interface}, 500 Hz"
        + (", elastic band on" if config.band else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        while not stop and (config.duration is None or time.perf_counter() - t0 < config.duration):
            now = ticker.wait() - t0
            if emulator.commands and "connected" not in events:
                events["connected"] = now
            if config.band and not emulator.band_on and "release" not in events:
                events["release"] = now
            for name, at in press_times(config.buttons, events):
                if at <= now < at + 0.1:
                    held_until[name] = at + 0.1
            if keys is not None:
                for name in keys.poll():
                    held_until[name] = now + 0.1
            held = frozenset(n for n, until in held_until.items() if now < until)
            emulator.receive(channels.lowcmd.take())
            emulator.step(held)
            channels.lowstate.write(emulator.state)
            if log is not None and emulator.steps % 50 == 0:
                log.write(json.dumps(emulator.summary()) + "\n")
            if viewer is not None and emulator.steps % 17 == 0:
                viewer.sync()
    finally:
        summary = {"event": "exit", **emulator.summary(), "overruns": ticker.overruns}
        if log is not None:
            log.write(json.dumps(summary) + "\n")
            log.close()
        if keys is not None:
            keys.close()
        channels.close()
    print(f"emulator: stopped after {summary['t']:.1f} s, {summary['commands']} commands, "
          f"{summary['bad_crc']} bad CRC", file=sys.stderr)  # fmt: skip
    return 0


def _open_viewer(emulator: G1Emulator):
    try:  # the viewer loads only when asked for: its import can fail without a display
        import mujoco.viewer

        return mujoco.viewer.launch_passive(emulator.model, emulator.data)
    except Exception as exc:  # no display, no GL: keep running headless
        print(f"emulator: no viewer ({exc}); running headless", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcg.robot.emulator", description=__doc__.split("\n")[0])
    parser.add_argument("--domain", type=int, default=dds.SIM_DOMAIN, help="DDS domain id (default 1)")
    parser.add_argument("--interface", default=dds.LOOPBACK, help="network interface (default lo)")
    parser.add_argument("--headless", action="store_true", help="no MuJoCo viewer")
    parser.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    parser.add_argument("--mode-machine", type=int, default=5, help="robot-type code to report (default 5)")
    parser.add_argument("--band", action="store_true", help="hold the pelvis in an elastic band at start-up")
    parser.add_argument("--band-release", type=float, default=1.0, help="s of steady pose holding to let go")
    parser.add_argument(
        "--buttons", default="",
        help="remote schedule, e.g. start@1.0,a@4.0, or from events: start@connected+0.5,a@release "
        "(START 0.5 s after the client's first command, A as the band lets go)",
    )  # fmt: skip
    parser.add_argument("--control", default=None, help="file/FIFO with button names, one per line")
    parser.add_argument("--log", default=None, help="JSON-lines log of the robot's condition")
    args = parser.parse_args(argv)
    try:
        buttons = parse_schedule(args.buttons)
        if args.domain == dds.ROBOT_DOMAIN:
            raise ValueError("the emulator refuses domain 0, the real robot's domain; use 1")
        dds.participant_config(args.interface, args.domain)
        if args.control is not None and not os.path.exists(args.control):
            raise ValueError(f"control file {args.control!r} does not exist")
        if not 0 <= args.mode_machine <= 255:
            raise ValueError("--mode-machine must be 0..255")
        for flag, value in (("--duration", args.duration), ("--band-release", args.band_release)):
            if value is not None and not value >= 0:  # inf is fine: never
                raise ValueError(f"{flag} must be a number >= 0, got {value}")
        if args.log is not None and not Path(args.log).resolve().parent.is_dir():
            raise ValueError(f"--log {args.log}: folder {Path(args.log).resolve().parent} does not exist")
    except ValueError as exc:
        print(f"emulator: {exc}", file=sys.stderr)
        return 2
    config = EmulatorConfig(
        domain=args.domain, interface=args.interface, mode_machine=args.mode_machine, band=args.band,
        band_release=args.band_release, duration=args.duration, buttons=buttons, control=args.control,
        log=args.log, viewer=not args.headless,
    )  # fmt: skip
    print("emulator config: " + json.dumps(asdict(config)), file=sys.stderr)
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
