"""End to end on loopback, domain 1: the MuJoCo DDS emulator and the run command as processes.

The stand-in policy is a genuine policy file whose actor outputs zero (it holds the default pose).
It cannot balance the robot by itself, so the emulator keeps its elastic band on (a gantry); the
band only holds the pelvis, and the legs and arms must be brought to the default pose by the
client's commands.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest

from bcg.learn.policy import make_hold_policy
from bcg.robot import dds
from bcg.robot import dds_types as dt

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def hold_policy(tmp_path_factory):
    return make_hold_policy(tmp_path_factory.mktemp("policy") / "hold.h5", motion="run")


class Proc:
    """A child process whose stderr lines are collected as they come."""

    def __init__(self, args):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, text: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} did not appear; output:\n" + "\n".join(self.lines))

    def finish(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(2.0)
        return rc

    def output(self) -> str:
        return "\n".join(self.lines)


def emulator(tmp_path, *extra):
    log = tmp_path / "emu.jsonl"
    control = tmp_path / "remote"
    control.write_text("")
    args = ["bcg.robot.emulator", "--headless", "--domain", "1", "--interface", "lo", "--log", str(log),
            "--control", str(control), *extra]  # fmt: skip
    return Proc(args), log, control


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_client(policy, *extra):
    # The emulator shares 2 cores with the test suite: a 300 ms watchdog keeps a busy machine from
    # reading as a lost link (the 50 ms default is tested in the safety unit tests), and the guardian
    # waits 2 s before it takes a slow loop for a stalled one.
    return Proc(["bcg.robot.run", str(policy), "--interface", "lo", "--domain", "1", "--no-keyboard",
                 "--stale-ms", "300", "--stall-ms", "2000", *extra])  # fmt: skip


def test_stand_hold_policy_and_ctrl_c_damps(tmp_path, hold_policy):
    emu, log, remote = emulator(tmp_path, "--band", "--band-release", "inf", "--duration", "40")
    client = run_client(hold_policy)
    try:
        client.wait_for("ZERO TORQUE", 25)
        time.sleep(0.5)
        zero = read_log(log)[-1]
        assert zero["cmd_modes"] == 29 and zero["cmd_kp_max"] == 0 and zero["cmd_kd_max"] == 0
        with remote.open("a") as f:  # the operator presses START on the remote
            f.write("start\n")
        client.wait_for("HOLDING the default pose", 6)
        time.sleep(1.0)
        with remote.open("a") as f:  # ... and A
            f.write("a\n")
        client.wait_for("RUNNING the policy", 3)
        time.sleep(3.0)
        running = read_log(log)[-1]
        client.proc.send_signal(signal.SIGINT)
        rc = client.finish(10)
        time.sleep(0.3)
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
        emu.proc.send_signal(signal.SIGTERM)
        emu.finish(10)
    out = client.output()
    assert rc == 0, out
    assert "stopped: SIGINT received" in out
    assert "guardian:" not in out  # the client damped: its guardian exits without a command
    # the robot reached the default pose and stayed up under the policy
    assert running["pose_err_mean"] < 0.06 and running["root_z"] > 0.7 and running["upright"] > 0.98, running
    assert running["cmd_kp_max"] > 90 and running["cmd_mode_machine"] == 5
    records = read_log(log)
    final = records[-1]
    assert final["event"] == "exit"
    # Ctrl-C put damping frames on the wire for the damping time (1 s at 500 Hz; a loaded machine
    # delays or loses some, so the span they cover is checked along with their number)
    assert 0.9 < final["damping_s"] < 1.5, final  # the client's 1 s, not the guardian's as well
    assert 250 < final["damping_frames"] < 600, final
    assert final["cmd_kp_max"] == 0 and final["cmd_kd_min"] == 8 and final["cmd_q_abs_max"] == 0
    assert final["bad_crc"] == 0 and final["wrong_mode_machine"] == 0 and final["unused_slots_zero"]


def test_emulator_killed_client_damps_and_fails(tmp_path, hold_policy):
    emu, log, _ = emulator(tmp_path, "--band", "--band-release", "inf", "--duration", "40")
    client = run_client(hold_policy, "--auto-start")
    try:
        client.wait_for("RUNNING the policy", 30)
        time.sleep(0.5)
        emu.proc.kill()
        emu.finish(5)
        killed = time.monotonic()
        rc = client.finish(10)
        elapsed = time.monotonic() - killed
    finally:
        for p in (client.proc, emu.proc):
            if p.poll() is None:
                p.kill()
    out = client.output()
    assert rc == 1, out
    assert "FAULT: LowState_ is" in out and "ms old" in out and "damping was sent" in out, out
    assert 0.9 < elapsed < 5.0  # 50 ms to notice, 1 s of damping, then exit


@contextlib.contextmanager
def running_client(tmp_path, policy):
    """The emulator (band on) and an auto-started client in its policy phase; both are ended after."""
    emu, log, _ = emulator(tmp_path, "--band", "--band-release", "inf", "--duration", "40")
    client = run_client(policy, "--auto-start")
    try:
        client.wait_for("RUNNING the policy", 30)
        yield client, log
    finally:
        for p in (client.proc, emu.proc):
            if p.poll() is None:
                p.kill()
        emu.finish(10)


@pytest.mark.parametrize(
    ("how", "report"),
    [("SIGKILL", "the client exited without stopping the robot"),
     ("SIGSTOP", "the client's command loop stopped for over 2000 ms: client killed")],
)  # fmt: skip
def test_a_killed_or_frozen_client_is_damped_by_its_guardian(tmp_path, hold_policy, how, report):
    """SIGKILL (the client gets no chance to damp) and SIGSTOP (its loop stops: the guardian kills
    it after --stall-ms): the guardian process puts the damping command on the wire for 1 s."""
    with running_client(tmp_path, hold_policy) as (client, log):
        time.sleep(1.0)
        before = read_log(log)[-1]
        client.proc.send_signal(getattr(signal, how))
        rc = client.proc.wait(10)  # SIGSTOP: the guardian's SIGKILL ends it after 2 s
        end = time.monotonic() + 5.0  # the guardian writes to the client's stderr after it
        while time.monotonic() < end and not any("guardian:" in line for line in client.lines):
            time.sleep(0.05)
        time.sleep(0.5)  # the emulator's next summary line
        after = read_log(log)[-1]
    out = client.output()
    assert rc == -signal.SIGKILL, out
    assert before["cmd_kp_max"] > 90 and before["damping_frames"] == 0, before
    assert after["damping_frames"] > 250 and after["damping_s"] > 0.9, after
    assert after["cmd_kp_max"] == 0 and after["cmd_kd_min"] == 8 and after["cmd_q_abs_max"] == 0, after
    assert after["bad_crc"] == 0 and after["wrong_mode_machine"] == 0, after
    assert f"guardian: {report}; damping sent for 1.0 s" in out, out


def _guardian_of(pid: int) -> int:
    """The pid of the guardian process watching client ``pid``."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"bcg.robot.guardian" in args and args[args.index(b"--client") + 1] == str(pid).encode():
            return int(entry)
    raise AssertionError(f"no guardian process of client {pid}")


def test_a_client_whose_guardian_dies_damps_and_fails(tmp_path, hold_policy):
    with running_client(tmp_path, hold_policy) as (client, log):
        os.kill(_guardian_of(client.proc.pid), signal.SIGKILL)
        rc = client.finish(10)
        time.sleep(0.5)
        final = read_log(log)[-1]
    out = client.output()
    assert rc == 1, out
    assert "FAULT: the guardian process" in out and "damping was sent for 1.0 s" in out, out
    assert "ignored while damping" not in out, out
    assert final["damping_frames"] > 250 and final["damping_s"] > 0.9 and final["cmd_kd_min"] == 8, final


def test_a_23_dof_robot_is_refused_without_a_command(tmp_path, hold_policy):
    """The emulator reports mode_machine 4 (the G1 with 23 DoF): the client exits 1 with the reason
    and the robot never receives a command."""
    emu, log, _ = emulator(tmp_path, "--band", "--mode-machine", "4", "--duration", "40")
    client = run_client(hold_policy, "--auto-start")
    try:
        rc = client.finish(40)
        time.sleep(0.5)  # the emulator logs what it received a few times a second
        final = read_log(log)[-1]
    finally:
        for p in (client.proc, emu.proc):
            if p.poll() is None:
                p.kill()
    out = client.output()
    assert rc == 1 and "mode_machine 4" in out and "23 DoF" in out, out
    assert final["commands"] == 0, final


def _mismatched(tmp_path, hold_policy):
    bad = tmp_path / "bad_rate.h5"
    bad.write_bytes(hold_policy.read_bytes())
    with h5py.File(bad, "r+") as f:
        f.attrs["control_dt"] = 0.01  # a 100 Hz policy
    swapped = tmp_path / "bad_order.h5"
    swapped.write_bytes(hold_policy.read_bytes())
    with h5py.File(swapped, "r+") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f["robot/joint_names"][()]]
        names[0], names[1] = names[1], names[0]
        del f["robot/joint_names"]
        f["robot/joint_names"] = np.array(names, dtype=h5py.string_dtype())
    return {"control_dt": bad, "joint names order": swapped}


def test_mismatched_policy_refused_before_any_command(tmp_path, hold_policy):
    channels = dds.open_channels("lo", dds.SIM_DOMAIN, "robot")  # listens on rt/lowcmd
    try:
        state = np.zeros((), dt.LOW_STATE_LAYOUT)
        state["imu_state"]["quaternion"][0] = 1.0
        for what, path in _mismatched(tmp_path, hold_policy).items():
            client = run_client(path, "--auto-start")
            end = time.monotonic() + 20
            while client.proc.poll() is None and time.monotonic() < end:
                channels.lowstate.write(state)  # a robot is there, offering state
                time.sleep(0.01)
            rc = client.finish(5)
            assert rc == 2, client.output()
            assert "refused" in client.output() and what in client.output(), client.output()
            assert "Traceback" not in client.output()
        time.sleep(0.2)
        assert channels.lowcmd.take() == []  # not a single LowCmd_ went out
    finally:
        channels.close()


def test_observation_layout_mismatch_refused_and_dry_run(tmp_path, hold_policy, capsys):
    from bcg.robot import run

    bad = tmp_path / "bad_obs.h5"
    bad.write_bytes(hold_policy.read_bytes())
    with h5py.File(bad, "r+") as f:
        sizes = f["observation/sizes"][()]
        sizes[0] += 1
        f["observation/sizes"][...] = sizes
    assert run.main([str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "observation layout" in err
    assert run.main([str(hold_policy), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "observation 825 dims" in err and "no DDS participant was created" in err
    assert run.main([str(hold_policy), "--auto-start", "--domain", "0"]) == 2  # never on the robot
    assert run.main([str(hold_policy), "--interface", 'eth0"/>']) == 2
    assert run.main([str(hold_policy), "--mode-machine", "256"]) == 2
    assert "--mode-machine must be within 0-255" in capsys.readouterr().err


def test_a_lead_in_policy_plays_its_clip_with_the_lead_in(tmp_path, capsys):
    """A policy trained with env.clip_lead_in gets its clip with that lead-in from the client (a
    reference at rest on the first frame, the clip L / 2 longer); a malformed value is refused."""
    from bcg.robot import run

    plain = run.load_checked(str(make_hold_policy(tmp_path / "plain.h5", motion="run")))[1]
    policy, clip = run.load_checked(str(make_hold_policy(tmp_path / "lead.h5", env={"clip_lead_in": 1.0})))
    assert clip.lead_in == pytest.approx(1.0) and plain.lead_in == 0.0
    assert clip.duration == pytest.approx(plain.duration + 0.5)
    assert not np.any(clip.sample(0.0).root_lin_vel_w) and np.any(plain.sample(0.0).root_lin_vel_w)
    assert run.main([str(policy.path), "--dry-run"]) == 0
    assert "(15.47 s, a 1 s lead-in from rest)" in capsys.readouterr().err
    bad = make_hold_policy(tmp_path / "bad.h5", env={"clip_lead_in": "soon"})
    assert run.main([str(bad), "--dry-run"]) == 2
    assert "clip_lead_in" in capsys.readouterr().err


def test_bad_control_file_and_crashing_policy_process_are_reported(tmp_path, hold_policy, capsys):
    from bcg.robot import run

    assert run.main([str(hold_policy), "--control", str(tmp_path / "missing.fifo")]) == 2
    err = capsys.readouterr().err
    assert "--control" in err and "no such file" in err
    # a worker that dies while loading is reported with its exit code, not as a start-up timeout
    with pytest.raises(RuntimeError, match=r"exited while loading \(exit code 1\)"):
        run.ProcessDriver(str(tmp_path / "gone.h5"), startup_timeout=120.0)


def test_a_policy_trained_on_a_clip_file_runs_with_motion(tmp_path, capsys):
    """A policy trained on ``--motion clip.h5`` names the clip by its stem: the client asks for the
    file, takes it with --motion, and refuses a clip with another content hash."""
    import shutil

    from bcg.motion import MotionClip
    from bcg.robot import run

    shipped = MotionClip.load("run")
    clip_file = tmp_path / "myclip.h5"
    shutil.copyfile(shipped.path, clip_file)
    policy = make_hold_policy(tmp_path / "custom.h5", motion="myclip", motion_hash=shipped.content_hash)
    assert run.main([str(policy), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "--motion PATH.h5" in err and "'myclip'" in err
    assert run.main([str(policy), "--dry-run", "--motion", str(clip_file)]) == 0
    assert "dry run" in capsys.readouterr().err
    assert run.main([str(policy), "--dry-run", "--motion", "jump"]) == 2
    assert "is not the clip the policy was trained on" in capsys.readouterr().err
    assert run.main([str(policy), "--first-state-timeout", "nan"]) == 2
    assert "--first-state-timeout" in capsys.readouterr().err
