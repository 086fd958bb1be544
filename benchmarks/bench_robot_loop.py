"""Command-loop timing of the robot client on loopback (domain 1).

A peer process plays the robot: it publishes ``LowState_`` at 500 Hz (the default pose, upright) and
records when each tick went out and when each ``LowCmd_`` came back. This process runs the real
client loop (:func:`bcg.robot.run.run_loop`) with the stand-in hold policy (a genuine policy file,
its MLP evaluated at 50 Hz through the shared observation code; the motion restarts when it ends),
goes through stand-up and hold, then measures ``--seconds`` of the policy phase. The client writes
the tick of the state each command answers into the command's ``reserve[0]`` (benchmark only), so
that the peer can pair them.

Prints ``name=value`` lines:
    period_jitter_p50_ms / _p99_ms / _max_ms: |send period - 2 ms| of the commands
    command_rate_hz, policy_rate_hz
    latency_median_ms / latency_p99_ms: LowState_ written by the peer -> the LowCmd_ answering it
        arriving at the peer (end to end, both DDS hops; includes the wait, 0-2 ms, for the
        client's next tick: the command loop runs on its own clock, not on state arrival)
    client_latency_median_ms / _p99_ms: state taken by the client -> command written

Usage: ``python benchmarks/bench_robot_loop.py [--seconds 30] [--realtime]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.util import duration

from bcg.core import g1
from bcg.robot import crc, dds
from bcg.robot import dds_types as dt


def peer(seconds: float, realtime: bool) -> None:
    """The robot side: 500 Hz LowState_, pairs each LowCmd_ with the state it answers."""
    if realtime:
        from bcg.robot import run

        run.request_realtime(priority=45)
    channels = dds.open_channels(dds.LOOPBACK, dds.SIM_DOMAIN, "robot", state_depth=16)
    state = np.zeros((), dt.LOW_STATE_LAYOUT)
    state["mode_machine"] = 5
    state["imu_state"]["quaternion"] = (1.0, 0.0, 0.0, 0.0)
    state["imu_state"]["accelerometer"] = (0.0, 0.0, 9.81)
    state["motor_state"]["q"][: g1.NUM_JOINTS] = g1.DEFAULT_JOINT_POS
    published: dict[int, float] = {}
    latencies, tick = [], 0
    done = threading.Event()

    def receive():  # timestamps each command on arrival (not at the next 2 ms tick)
        waitset = WaitSet(channels.participant)
        waitset.attach(
            ReadCondition(channels.lowcmd.reader, SampleState.Any | ViewState.Any | InstanceState.Any)
        )
        while not done.is_set():
            waitset.wait(duration(milliseconds=20))
            now = time.perf_counter()
            for image in channels.lowcmd.take():
                answered = int(image["reserve"][0])
                if answered in published and crc.crc32_words(image) == int(image["crc"]):
                    latencies.append(now - published[answered])

    sys.setswitchinterval(1e-4)  # hand the interpreter to the receiving thread promptly
    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    ticker = dds.Ticker(0.002)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        ticker.wait()
        tick += 2
        state["tick"] = tick
        state["crc"] = crc.crc32_words(state)
        channels.lowstate.write(state)
        published[tick] = time.perf_counter()
    done.set()
    receiver.join()
    channels.close()
    json.dump({"latency": latencies}, sys.stdout)


class LoopingDriver:
    """The client's policy process, with the motion restarted at its end so that the policy runs
    for as long as the benchmark needs."""

    def __init__(self, driver):
        self.driver = driver
        self.control_dt = driver.control_dt

    def start(self, state):
        self.driver.start(state)

    def request(self, state):
        self.last_state = state
        self.driver.request(state)

    def result(self):
        out = self.driver.result()
        if out is not None and out[1]:
            self.driver.start(self.last_state)  # realign and restart the motion
            out = (out[0], False)
        return out


def client(seconds: float, realtime: bool) -> dict[str, float]:
    from bcg.core.kinematics import g1_model
    from bcg.learn.policy import make_hold_policy
    from bcg.robot import run
    from bcg.robot.guardian import Guardian
    from bcg.robot.safety import Phase, SafetyConfig, Supervisor

    tmp = tempfile.TemporaryDirectory()
    path = make_hold_policy(Path(tmp.name) / "hold.h5", motion="run")
    policy, _ = run.load_checked(str(path))
    process_driver = run.ProcessDriver(str(path))
    driver = LoopingDriver(process_driver)
    # a relaxed link watchdog: on a shared machine a starved peer must not end the measurement
    config = SafetyConfig(stand_up_time=2.0, stale_after=0.5)
    supervisor = Supervisor(config, g1.joint_limits(g1_model()), policy.default_joint_pos, policy.kp,
                            policy.kd, driver, auto_start=True)  # fmt: skip
    warmup = config.stand_up_time + 1.5
    proc = subprocess.Popen(
        [sys.executable, __file__, "--peer", str(seconds + warmup + 4.0)]
        + (["--realtime"] if realtime else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    guardian = Guardian(dds.LOOPBACK, dds.SIM_DOMAIN, 2.0, config.damping_time, config.damping_kd)
    channels = dds.open_channels(dds.LOOPBACK, dds.SIM_DOMAIN, "client")
    if realtime and run.request_realtime():
        run.request_realtime(priority=40, pid=process_driver.pid)
        run.request_realtime(priority=45, pid=guardian.pid)
    stats = run.LoopStats()
    measured_from = []

    class Until:  # stops the loop after `seconds` of the policy phase
        def poll(self):
            if supervisor.phase is Phase.POLICY and not measured_from:
                measured_from.append((time.perf_counter(), len(stats.sent), supervisor.policy_steps))
            if measured_from and time.perf_counter() - measured_from[0][0] > seconds:
                return ["select"]
            return []

    print(f"bench: stand-up, then {seconds:.0f} s of the policy phase ...", file=sys.stderr, flush=True)
    try:
        run.run_loop(supervisor, channels, keys=Until(), stats=stats, echo_tick=True, guardian=guardian)
    finally:
        guardian.release(damped=supervisor.phase is Phase.DONE)
        guardian.close()
        channels.close()
        process_driver.close()
        tmp.cleanup()
    out, _ = proc.communicate(timeout=seconds + warmup + 30)
    if supervisor.fault or not measured_from:
        raise SystemExit(f"bench: the client stopped early: {supervisor.stop_reason}")
    t0, first, steps0 = measured_from[0]
    sent = np.asarray(stats.sent)
    policy_window = (sent >= t0) & (sent <= t0 + seconds)
    periods = np.diff(sent[policy_window])
    jitter = np.abs(periods - run.COMMAND_DT)
    client_latency = (sent - np.asarray(stats.state_taken))[policy_window]
    latency = np.asarray(json.loads(out)["latency"])
    return {
        "seconds": seconds,
        "commands": int(policy_window.sum()),
        "command_rate_hz": (policy_window.sum() - 1) / (sent[policy_window][-1] - sent[policy_window][0]),
        "policy_rate_hz": (supervisor.policy_steps - steps0) / seconds,
        "period_jitter_p50_ms": np.percentile(jitter, 50) * 1e3,
        "period_jitter_p99_ms": np.percentile(jitter, 99) * 1e3,
        "period_jitter_max_ms": jitter.max() * 1e3,
        "latency_median_ms": np.median(latency) * 1e3,
        "latency_p99_ms": np.percentile(latency, 99) * 1e3,
        "client_latency_median_ms": np.median(client_latency) * 1e3,
        "client_latency_p99_ms": np.percentile(client_latency, 99) * 1e3,
        "realtime": int(realtime),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="robot command-loop timing on loopback")
    parser.add_argument("--seconds", type=float, default=30.0, help="s of the policy phase to measure")
    parser.add_argument("--realtime", action="store_true", help="SCHED_FIFO for the command loop")
    parser.add_argument("--peer", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer is not None:
        peer(args.peer, args.realtime)
        return 0
    for name, value in client(args.seconds, args.realtime).items():
        print(f"{name}={value:.4f}" if isinstance(value, float) else f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
