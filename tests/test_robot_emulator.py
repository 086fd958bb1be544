"""The emulator's motor law, CRC handling and LowState_ contents; remote buttons and key input."""

import os

import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.core.rotations import quat_to_rpy
from bcg.robot import crc, keyboard
from bcg.robot.emulator import EmulatorConfig, G1Emulator, parse_schedule, press_times
from bcg.robot.safety import Commander


@pytest.fixture()
def emulator():
    return G1Emulator(EmulatorConfig(band=False))


def test_motor_law_and_effort_clip(emulator):
    rng = np.random.default_rng(0)
    commander = Commander()
    q_t, kp, kd = rng.normal(0, 0.3, 29), rng.uniform(0, 80, 29), rng.uniform(0, 3, 29)
    cmd = commander.position(5, q_t, kp, kd).copy()
    cmd["motor_cmd"]["tau"][:29] = rng.normal(0, 1, 29)
    cmd["motor_cmd"]["dq"][:29] = rng.normal(0, 0.5, 29)
    cmd["motor_cmd"]["mode"][3] = 0  # a disabled motor gives no torque
    cmd["crc"] = crc.crc32_words(cmd)
    emulator.receive([cmd])
    emulator.data.qvel[emulator.dadr] = rng.normal(0, 1, 29)
    q, dq = emulator.data.qpos[emulator.qadr], emulator.data.qvel[emulator.dadr]
    m = {k: cmd["motor_cmd"][k][:29].astype(np.float64) for k in ("q", "dq", "tau", "kp", "kd")}
    expected = m["tau"] + m["kp"] * (m["q"] - q) + m["kd"] * (m["dq"] - dq)
    expected[3] = 0.0
    expected = np.clip(expected, -g1.EFFORT_LIMIT, g1.EFFORT_LIMIT)
    np.testing.assert_allclose(emulator.motor_torque(), expected, rtol=1e-5, atol=1e-5)
    big = commander.position(5, q + 5.0, np.full(29, 1000.0), np.zeros(29)).copy()
    emulator.receive([big])
    np.testing.assert_allclose(np.abs(emulator.motor_torque()), g1.EFFORT_LIMIT)


def test_bad_crc_dropped_and_counted(emulator):
    good = Commander().position(5, g1.DEFAULT_JOINT_POS, g1.KP, g1.KD).copy()
    bad = good.copy()
    bad["crc"] ^= 1
    emulator.receive([good, bad, bad])
    assert emulator.commands == 1 and emulator.bad_crc == 2
    assert int(emulator.cmd["crc"]) == int(good["crc"])  # the bad ones did not take effect
    other = Commander().zero_torque(0).copy()  # valid CRC but the wrong mode_machine: counted
    emulator.receive([other])
    assert emulator.wrong_mode_machine == 1


def test_state_contents(emulator):
    emulator.step(frozenset({"start", "a"}))
    emulator.data.qvel[3:6] = (0.1, -0.2, 0.3)
    qpos, qvel = emulator.data.qpos.copy(), emulator.data.qvel.copy()
    emulator.step()  # publishes the state it starts from
    s = emulator.state
    assert int(s["tick"]) == 4 and int(s["mode_machine"]) == 5
    assert crc.crc32_words(s) == int(s["crc"])
    np.testing.assert_allclose(s["motor_state"]["q"][:29], qpos[emulator.qadr], atol=1e-6)
    np.testing.assert_allclose(s["motor_state"]["dq"][:29], qvel[emulator.dadr], atol=1e-6)
    assert np.all(s["motor_state"]["q"][29:] == 0)
    pelvis_quat = qpos[3:7] / np.linalg.norm(qpos[3:7])
    np.testing.assert_allclose(s["imu_state"]["quaternion"], pelvis_quat, atol=1e-6)
    # gyroscope: the pelvis angular velocity in the pelvis frame (= free joint qvel[3:6])
    np.testing.assert_allclose(s["imu_state"]["gyroscope"], qvel[3:6], atol=1e-5)
    # rpy against MuJoCo's own quaternion-to-matrix conversion
    mat = np.zeros(9)
    mujoco.mju_quat2Mat(mat, pelvis_quat)
    r = mat.reshape(3, 3)
    np.testing.assert_allclose(
        s["imu_state"]["rpy"],
        [np.arctan2(r[2, 1], r[2, 2]), -np.arcsin(r[2, 0]), np.arctan2(r[1, 0], r[0, 0])],
        atol=1e-5,
    )  # fmt: skip
    assert keyboard.buttons_from_remote(s["wireless_remote"].tobytes()) == frozenset()
    emulator.step(frozenset({"select"}))
    assert keyboard.buttons_from_remote(emulator.state["wireless_remote"].tobytes()) == {"select"}


def test_rpy_of_known_rotations():
    half = np.pi / 8
    np.testing.assert_allclose(quat_to_rpy(np.array([np.cos(half), 0, 0, np.sin(half)])), [0, 0, np.pi / 4])
    np.testing.assert_allclose(quat_to_rpy(np.array([np.cos(half), np.sin(half), 0, 0])), [np.pi / 4, 0, 0])


def test_remote_bytes_and_schedule():
    remote = keyboard.remote_with_buttons(["start", "a"])
    assert remote[2:4] == (0b100 | 0b1_0000_0000).to_bytes(2, "little") and len(remote) == 40
    assert keyboard.buttons_from_remote(remote) == {"start", "a"}
    edges = keyboard.ButtonEdges()
    assert edges.update(frozenset({"a"})) == {"a"} and edges.update(frozenset({"a"})) == frozenset()
    assert parse_schedule("start@1.0, a@4") == (("start", 1.0), ("a", 4.0))
    with pytest.raises(ValueError, match="NAME@SECONDS"):
        parse_schedule("jump@1")
    with pytest.raises(ValueError, match="unknown remote button"):
        keyboard.remote_with_buttons(["turbo"])


def test_schedule_from_events_presses_when_they_happen():
    """An operator's timing: START a while after the client's first command, A as the band lets go."""
    schedule = parse_schedule("start@connected+0.5, a@release, x@2")
    assert schedule == (("start", ("connected", 0.5)), ("a", ("release", 0.0)), ("x", 2.0))
    assert press_times(schedule, {}) == [("x", 2.0)]
    assert press_times(schedule, {"connected": 4.2}) == [("start", 4.7), ("x", 2.0)]
    both = {"connected": 4.2, "release": 9.0}
    assert press_times(schedule, both) == [("start", 4.7), ("a", 9.0), ("x", 2.0)]
    for bad in ("a@landed", "a@release+", "a@release+-1", "a@connected+soon"):
        with pytest.raises(ValueError, match="NAME@EVENT"):
            parse_schedule(bad)


def test_key_input_from_control_file(tmp_path):
    path = tmp_path / "keys"
    os.mkfifo(path)
    writer_fd = os.open(path, os.O_RDWR)  # keeps the FIFO open like a script would
    keys = keyboard.KeyInput(use_stdin=False, control_path=str(path))
    try:
        assert keys.poll() == []
        os.write(writer_fd, b"start\nA\nbogus\nsel")
        assert keys.poll() == ["start", "a"]
        os.write(writer_fd, b"ect\n")
        assert keys.poll() == ["select"]  # a line split across writes is joined
    finally:
        keys.close()
        os.close(writer_fd)


def test_key_input_from_terminal(monkeypatch):
    import pty
    import sys
    import termios

    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "r")
    monkeypatch.setattr(sys, "stdin", terminal)
    before = termios.tcgetattr(slave)
    keys = keyboard.KeyInput(use_stdin=True)
    try:
        assert not termios.tcgetattr(slave)[3] & termios.ICANON  # single keys, no Enter needed
        os.write(master, b"s a?X")
        assert keys.poll() == ["start", "select", "a", "select"]
        assert keys.poll() == []
    finally:
        keys.close()
        assert termios.tcgetattr(slave) == before  # the terminal is restored
        terminal.close()
        os.close(master)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--log", "/nonexistent-folder/emu.jsonl"], "--log"),
        (["--duration", "nan"], "--duration"),
        (["--band-release", "-1"], "--band-release"),
    ],
)
def test_bad_arguments_are_refused_before_dds_opens(args, words, capsys):
    from bcg.robot import emulator as cli

    assert cli.main(["--headless", "--duration", "0.1", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and "emulator config" not in err


def test_a_control_file_that_cannot_be_read_stops_the_start_cleanly(tmp_path, capsys):
    from bcg.robot import emulator as cli

    folder = tmp_path / "not-a-file"
    folder.mkdir()
    # domain 3: a domain of its own, as the test files run in parallel (.ci/run)
    config = EmulatorConfig(domain=3, interface="lo", control=str(folder), viewer=False, duration=0.1)
    assert cli.run(config) == 2
    err = capsys.readouterr().err
    assert "cannot start" in err and "Traceback" not in err
