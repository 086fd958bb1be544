"""The run client's guardian process: it damps the robot when the client dies or its loop stalls.

The message protocol is tested on a plain pipe; the process itself on loopback, DDS domain 4 (a
domain of this file's own, so that test files running side by side do not hear each other), with
this test process as the robot reading rt/lowcmd. Domain 6 has no robot: a guardian there is deaf.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bcg.robot import crc, dds
from bcg.robot.guardian import DAMPED, HEARTBEAT, NOT_DELIVERED, Guardian, describe, watch
from bcg.robot.safety import Fault

DOMAIN = 4
NO_ROBOT = 6


def _pipe_with(data: bytes, close: bool) -> int:
    r, w = os.pipe()
    os.write(w, data)
    if close:
        os.close(w)
    return r


@pytest.mark.parametrize(
    ("data", "close", "expected"),
    [
        (b"arm 5\n" + HEARTBEAT * 3 + b"done\n", False, ("done", 5)),
        (b"", True, ("gone", None)),  # the client died before its first command: nothing to do
        (HEARTBEAT * 2, True, ("gone", None)),
        (b"arm 5\n" + HEARTBEAT, True, ("gone", 5)),
        (b"arm 0\n" + HEARTBEAT + b"ar", True, ("gone", 0)),  # a torn last line is not a message
    ],
)
def test_watch_reads_the_clients_messages(data, close, expected):
    fd = _pipe_with(data, close)
    try:
        assert watch(fd, stall_after=5.0) == expected
    finally:
        os.close(fd)


def test_watch_reports_a_stall_only_when_armed():
    r, w = os.pipe()
    try:
        # unarmed (the client waits for the robot's first state): silence is no stall
        # t0 before the timer starts: taken after, it ran late by the start's own time and the
        # elapsed time came out under 0.6 s (0.598 s once, on a loaded machine)
        t0 = time.monotonic()
        threading.Timer(0.5, os.write, (w, b"arm 5\n")).start()
        assert watch(r, stall_after=0.1) == ("stalled", 5)
        # 0.5 s unarmed, then 0.1 s without a heartbeat; the upper bound is loose because a loaded
        # machine (two trainings beside the suite) delays the timer thread by a second or more
        assert 0.6 <= time.monotonic() - t0 < 5.0
    finally:
        os.close(r)
        os.close(w)


@pytest.fixture(scope="module")
def robot():
    """This process as the robot: a reader of rt/lowcmd deep enough to keep 1.5 s of commands."""
    channels = dds.open_channels(dds.LOOPBACK, DOMAIN, "robot", state_depth=1000)
    yield channels
    channels.close()


def _commands(robot, wait: float) -> list[np.ndarray]:
    out, end = [], time.monotonic() + wait
    while time.monotonic() < end:
        out += robot.lowcmd.take(1000)
        time.sleep(0.05)
    return out


def _assert_damping(frames, mode_machine):
    assert len(frames) > 400, len(frames)  # 1 s at 500 Hz
    for image in frames[:: max(len(frames) // 20, 1)]:
        m = image["motor_cmd"][:29]
        assert image["mode_machine"] == mode_machine
        assert np.all(m["kp"] == 0) and np.all(m["kd"] == 8.0) and np.all(m["mode"] == 1)
        assert np.all(m["q"] == 0) and np.all(m["dq"] == 0) and np.all(m["tau"] == 0)
        assert image["crc"] == crc.crc32_words(image)


def _guardian(domain=DOMAIN, **kw):
    return Guardian(
        dds.LOOPBACK, domain, stall_after=kw.pop("stall_after", 5.0), damping_time=1.0, kd=8.0, **kw
    )


def _beat_for(guardian, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        guardian.beat()
        guardian.check(time.monotonic())
        time.sleep(0.01)


def test_guardian_exits_quietly_when_the_client_has_damped(robot):
    guardian = _guardian()
    guardian.arm(5)
    _beat_for(guardian, 0.3)
    guardian.release(damped=True)
    assert guardian.close() == 0
    assert _commands(robot, 0.3) == []


def test_guardian_sends_nothing_when_never_armed(robot):
    guardian = _guardian()
    guardian.beat()
    assert guardian.close() == 0
    assert _commands(robot, 0.3) == []


def test_guardian_damps_when_the_client_goes_without_damping(robot):
    guardian = _guardian()
    guardian.arm(5)
    _beat_for(guardian, 0.3)  # it answers, and its writer reaches the robot
    assert guardian.close() == DAMPED  # the client's input end closes, as when it is killed
    assert "sent damping" in describe(DAMPED)
    _assert_damping(_commands(robot, 0.5), 5)


def test_guardian_kills_a_stalled_client_and_damps(robot):
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        guardian = _guardian(stall_after=0.3, client_pid=client.pid)
        guardian.arm(0)
        guardian.beat()  # ... and no more: the client's loop has stopped
        assert client.wait(10) == -9  # SIGKILL: only the guardian writes from now on
        assert guardian.close(timeout=5.0) == DAMPED
        _assert_damping(_commands(robot, 0.5), 0)
    finally:
        if client.poll() is None:
            client.kill()


def test_a_stopped_or_exited_guardian_is_a_fault_for_the_client():
    guardian = _guardian(stall_after=0.6)  # margin for a loaded machine: it answers every 10 ms
    try:
        guardian.arm(5)
        _beat_for(guardian, 0.2)
        os.kill(guardian.pid, signal.SIGSTOP)  # it no longer answers
        with pytest.raises(Fault, match="has not answered for"):
            _beat_for(guardian, 3.0)
        os.kill(guardian.pid, signal.SIGKILL)
        guardian.proc.wait(5)
        with pytest.raises(Fault, match="exited|is gone"):
            _beat_for(guardian, 0.5)
    finally:
        if guardian.proc.poll() is None:
            guardian.proc.kill()
        guardian.close()


def test_a_guardian_the_robot_cannot_hear_is_a_fault_and_reports_it():
    guardian = _guardian(domain=NO_ROBOT)  # no reader of rt/lowcmd on this domain
    guardian.arm(5)
    with pytest.raises(Fault, match="reaches no reader"):
        _beat_for(guardian, 3.0)
    assert guardian.close() == NOT_DELIVERED
    assert "could NOT deliver" in describe(NOT_DELIVERED) and "failed" in describe(1)
