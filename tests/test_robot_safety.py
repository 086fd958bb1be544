"""The supervisor's phases, commands, limits and faults, driven tick by tick without a network."""

from types import SimpleNamespace

import numpy as np
import pytest

from bcg.core import g1
from bcg.core.kinematics import g1_model
from bcg.learn.policy import PolicyFileError
from bcg.robot import crc, keyboard
from bcg.robot import dds_types as dt
from bcg.robot.run import policy_lead_in, policy_lead_out
from bcg.robot.safety import Fault, Phase, SafetyConfig, Supervisor, clamp_targets, target_range

LIMITS = g1.joint_limits(g1_model())
TARGETS = target_range(LIMITS, g1.KP)
DT = 0.002


def state_image(q=None, mode_machine=5, buttons=(), quat=(1.0, 0.0, 0.0, 0.0), tick=0, good_crc=True):
    image = np.zeros((), dt.LOW_STATE_LAYOUT)
    image["tick"], image["mode_machine"] = tick, mode_machine
    image["imu_state"]["quaternion"] = quat
    image["motor_state"]["q"][:29] = g1.DEFAULT_JOINT_POS if q is None else q
    image["wireless_remote"] = np.frombuffer(keyboard.remote_with_buttons(buttons), np.uint8)
    image["crc"] = crc.crc32_words(image) ^ (0 if good_crc else 1)
    return image


class FakeDriver:
    """Targets q0 + 0.01 k for request k; finishes after ``steps`` results."""

    control_dt = 0.02

    def __init__(self, steps=5):
        self.steps, self.requests, self.started, self._pending = steps, 0, 0, None

    def start(self, state):
        self.started += 1

    def request(self, state):
        self.requests += 1
        self._pending = (g1.DEFAULT_JOINT_POS + 0.01 * self.requests, self.requests >= self.steps)

    def result(self):
        out, self._pending = self._pending, None
        return out


def make(driver=None, **config):
    return Supervisor(SafetyConfig(**config), LIMITS, g1.DEFAULT_JOINT_POS, g1.KP, g1.KD, driver)


def run_ticks(sup, t, seconds, image_fn=state_image):
    """Feed a fresh state and tick every 2 ms; returns the last command and the time."""
    cmd = None
    for _ in range(round(seconds / DT)):
        t += DT
        sup.on_state_image(image_fn(), t)
        cmd = sup.tick(t)
        if cmd is not None:
            cmd = cmd.copy()
        sup.policy_step(t)
    return cmd, t


def motors(cmd):
    return cmd["motor_cmd"][:29]


def test_no_command_before_state_and_timeout():
    sup = make(first_state_timeout=0.5)
    assert sup.tick(0.0) is None and sup.tick(0.4) is None
    with pytest.raises(Fault, match="no LowState_"):
        sup.tick(0.6)


def test_other_robot_types_are_refused_before_any_command():
    """mode_machine 4 (23 DoF) and 6 (waist locked) lack joints of the 29-joint policy: the first
    such state is a fault and no command is ever sent; 0 (simulators), 5 and codes accepted in the
    config are driven; a code that changes mid-run is a fault under which the robot is damped."""
    for code, words in ((4, "23 DoF"), (6, "waist locked"), (9, "unknown robot type")):
        sup = make()
        with pytest.raises(Fault, match=f"mode_machine {code} .*{words}.*--mode-machine {code}"):
            sup.on_state_image(state_image(mode_machine=code), 0.0)
        sup.stop("fault", fault=True, now=0.0)
        assert sup.phase is Phase.DONE and sup.tick(DT) is None
    for code, config in ((0, {}), (5, {}), (6, {"mode_machines": (0, 5, 6)})):
        sup = make(**config)
        sup.on_state_image(state_image(mode_machine=code), 0.0)
        cmd = sup.tick(DT)
        assert sup.phase is Phase.ZERO_TORQUE and int(cmd["mode_machine"]) == code
    sup, t = held_supervisor()
    with pytest.raises(Fault, match="mode_machine 4"):
        sup.on_state_image(state_image(mode_machine=4), t + DT)
    sup.stop("fault", fault=True, now=t + DT)
    cmd = sup.tick(t + 2 * DT)
    assert sup.phase is Phase.DAMPING and int(cmd["mode_machine"]) == 5
    assert np.all(motors(cmd)["kp"] == 0) and np.all(motors(cmd)["kd"] > 0)


def test_zero_torque_then_stand_up_ramp_and_hold():
    sup = make()
    crouch = g1.DEFAULT_JOINT_POS + 0.4 * np.sign(np.mean(LIMITS, axis=1) - g1.DEFAULT_JOINT_POS + 1e-9)
    crouch = np.clip(crouch, LIMITS[:, 0], LIMITS[:, 1])
    cmd, t = run_ticks(sup, 0.0, 0.1, lambda: state_image(q=crouch))
    assert sup.phase is Phase.ZERO_TORQUE
    assert int(cmd["mode_machine"]) == 5 and np.all(motors(cmd)["mode"] == 1)
    assert np.all(motors(cmd)[["q", "kp", "kd", "tau"]].tolist() == np.zeros(4))
    assert crc.crc32_words(cmd) == int(cmd["crc"]) and np.all(cmd["motor_cmd"][29:]["kp"] == 0)
    sup.on_state_image(state_image(q=crouch, buttons=("start",)), t + DT)
    assert sup.phase is Phase.STAND_UP
    start = t + DT
    # halfway through the 2.5 s move: target halfway between the measured and the default pose,
    # gains fully ramped in after 1 s, at half of them after 0.5 s
    cmd, t = run_ticks(sup, start, 0.5, lambda: state_image(q=crouch))
    np.testing.assert_allclose(motors(cmd)["kp"], 0.5 * g1.KP, rtol=0.01)
    cmd, t = run_ticks(sup, t, 0.75, lambda: state_image(q=crouch))
    np.testing.assert_allclose(motors(cmd)["q"], crouch + 0.5 * (g1.DEFAULT_JOINT_POS - crouch), atol=2e-3)
    np.testing.assert_allclose(motors(cmd)["kp"], g1.KP, rtol=1e-6)
    cmd, t = run_ticks(sup, t, 1.3, lambda: state_image(q=g1.DEFAULT_JOINT_POS))
    assert sup.phase is Phase.HOLD_DEFAULT
    np.testing.assert_allclose(motors(cmd)["q"], g1.DEFAULT_JOINT_POS, atol=1e-6)
    np.testing.assert_allclose(motors(cmd)["kd"], g1.KD, rtol=1e-6)


def held_supervisor(driver=None, **config):
    sup = make(driver, **config)
    _, t = run_ticks(sup, 0.0, 0.02)
    sup.press("start", t)
    _, t = run_ticks(sup, t, 2.6)
    assert sup.phase is Phase.HOLD_DEFAULT
    return sup, t


class JumpDriver(FakeDriver):
    """Every result 1 rad from the default pose on every joint (clipped to the target range later)."""

    def request(self, state):
        self.requests += 1
        self._pending = (g1.DEFAULT_JOINT_POS + 1.0, False)


def test_policy_targets_blend_in_and_never_jump():
    """After A the targets blend from the default pose to the policy's over policy_blend_time, and a
    command's target never moves more than the motor's speed limit times 2 ms from the last one,
    so a 1 rad jump in the policy's output is spread over 14-25 ticks (20-37 rad/s motors)."""
    sup, t = held_supervisor(JumpDriver(), policy_blend_time=0.2)
    sup.press("a", t)
    step = g1.VELOCITY_LIMIT * DT
    goal = clamp_targets(g1.DEFAULT_JOINT_POS + 1.0, g1.DEFAULT_JOINT_POS, g1.KP, TARGETS)
    previous, commands = g1.DEFAULT_JOINT_POS.copy(), []
    for _ in range(150):
        cmd, t = run_ticks(sup, t, DT)
        q = motors(cmd)["q"].astype(np.float64)
        assert np.all(np.abs(q - previous) <= step + 1e-5)
        previous = q
        commands.append(q)
    commands = np.array(commands)
    # at 0.1 s, half-way through the blend: half the way to the policy's target, then clamped
    within = np.clip(g1.DEFAULT_JOINT_POS + 1.0, *TARGETS.T)
    half = clamp_targets(0.5 * (g1.DEFAULT_JOINT_POS + within), g1.DEFAULT_JOINT_POS, g1.KP, TARGETS)
    np.testing.assert_allclose(commands[49], half, atol=0.01)
    np.testing.assert_allclose(commands[-1], goal, atol=1e-5)  # 0.3 s: there
    # without the rate limit (a huge factor) and the blend, the first policy tick jumps
    sup, t = held_supervisor(JumpDriver(), policy_blend_time=0.0, target_rate_factor=1e6)
    sup.press("a", t)
    cmd, t = run_ticks(sup, t, 3 * DT)
    assert np.max(np.abs(motors(cmd)["q"] - g1.DEFAULT_JOINT_POS)) > 0.5


def test_policy_targets_held_then_last_pose_and_select_damps():
    driver = FakeDriver(steps=5)
    sup, t = held_supervisor(driver, policy_blend_time=0.0)
    sup.press("a", t)
    assert sup.phase is Phase.POLICY and driver.started == 1
    cmd, t = run_ticks(sup, t, 0.05)  # requests at 0, 20, 40 ms: results applied one tick later
    assert driver.requests == 3
    np.testing.assert_allclose(motors(cmd)["q"], g1.DEFAULT_JOINT_POS + 0.03, atol=1e-6)
    cmd, t = run_ticks(sup, t, 0.2)
    assert sup.phase is Phase.HOLD_LAST and driver.requests == 5
    np.testing.assert_allclose(motors(cmd)["q"], np.clip(g1.DEFAULT_JOINT_POS + 0.05, *LIMITS.T), atol=1e-6)
    sup.on_state_image(state_image(buttons=("select",)), t + DT)
    assert sup.phase is Phase.DAMPING and not sup.fault and "SELECT" in sup.stop_reason
    frames = 0
    while sup.phase is not Phase.DONE:
        t += DT
        cmd = sup.tick(t)  # damping goes on even though states may stop
        if cmd is not None:
            m = motors(cmd)
            assert np.all(m["kp"] == 0) and np.all(m["kd"] == 8) and np.all(m["q"] == 0)
            assert np.all(m["dq"] == 0) and np.all(m["tau"] == 0) and crc.crc32_words(cmd) == int(cmd["crc"])
            frames += 1
    assert frames == pytest.approx(SafetyConfig().damping_time / DT, abs=2)


def test_the_hold_after_the_motion_keeps_targets_within_the_joint_limits():
    """A last policy target beyond a joint limit (allowed while the policy balances) is brought back
    to the limit, at the rate limit, once the motion ends and the target is held open loop."""
    ankle = g1.JOINT_NAMES.index("left_ankle_pitch_joint")
    beyond = g1.DEFAULT_JOINT_POS.copy()
    beyond[ankle] = LIMITS[ankle, 1] + 0.5
    driver = FakeDriver(steps=3)
    request = driver.request

    def request_beyond(state):
        request(state)
        driver._pending = (beyond, driver._pending[1])

    driver.request = request_beyond
    sup, t = held_supervisor(driver, policy_blend_time=0.0)
    sup.press("a", t)
    seen = []
    for _ in range(60):
        cmd, t = run_ticks(sup, t, DT)
        seen.append((sup.phase, float(motors(cmd)["q"][ankle])))
    policy = [q for phase, q in seen if phase is Phase.POLICY]
    assert max(policy) > LIMITS[ankle, 1] + 0.4  # in force while the policy runs
    assert sup.phase is Phase.HOLD_LAST
    assert seen[-1][1] == pytest.approx(LIMITS[ankle, 1], abs=1e-6)


def test_a_lead_out_policy_keeps_balancing_after_the_motion():
    """With policy_after_end (a policy trained with a lead-out) the policy's targets stay in force
    after the motion ends: results are still requested and applied in HOLD_LAST; without it the last
    target is held and the policy is asked no more."""
    for after_end, requests, offset in ((True, 15, 0.15), (False, 5, 0.05)):
        driver = FakeDriver(steps=5)
        sup, t = held_supervisor(driver, policy_after_end=after_end)
        sup.press("a", t)
        cmd, t = run_ticks(sup, t, 0.3)
        assert sup.phase is Phase.HOLD_LAST and driver.requests == requests, (after_end, driver.requests)
        np.testing.assert_allclose(
            motors(cmd)["q"], np.clip(g1.DEFAULT_JOINT_POS + offset, *LIMITS.T), atol=1e-6
        )
    assert policy_lead_out(SimpleNamespace(config={"env": {"clip_end_hold": 2.0}})) == 2.0
    assert policy_lead_out(SimpleNamespace(config={"env": {}})) == 0.0
    assert policy_lead_in(SimpleNamespace(config={"env": {"clip_lead_in": 1.0}})) == 1.0
    assert policy_lead_in(SimpleNamespace(config={"env": {}})) == 0.0
    with pytest.raises(PolicyFileError, match="clip_lead_in"):
        policy_lead_in(SimpleNamespace(config={"env": {"clip_lead_in": -1.0}}, path="p.h5"))


def test_held_button_acts_once():
    sup, t = held_supervisor(FakeDriver(steps=1000))
    for _ in range(5):  # A held for five frames starts the policy once
        t += DT
        sup.on_state_image(state_image(buttons=("a",)), t)
        sup.tick(t)
        sup.policy_step(t)
    assert sup.driver.started == 1


def test_stale_state_is_a_fault():
    sup, t = held_supervisor()
    assert sup.tick(t + 0.04) is not None
    with pytest.raises(Fault, match="ms old"):
        sup.tick(t + 0.06)
    sup.stop("lost", fault=True, now=t + 0.06)
    assert motors(sup.tick(t + 0.062))["kd"][0] == 8.0


@pytest.mark.parametrize(
    "image, match",
    [
        (lambda: state_image(q=np.full(29, np.nan)), "non-finite q"),
        (lambda: state_image(q=np.where(np.arange(29) == 3, 4.0, g1.DEFAULT_JOINT_POS)), "left_knee_joint"),
        (lambda: state_image(quat=(2.0, 0.0, 0.0, 0.0)), "quaternion norm"),
    ],
)
def test_invalid_measurement_is_a_fault(image, match):
    sup = make()
    with pytest.raises(Fault, match=match):
        sup.on_state_image(image(), 0.0)


def test_bad_crc_dropped_then_streak_is_a_fault():
    sup, t = held_supervisor()
    received = sup.state.received
    for k in range(9):
        sup.on_state_image(state_image(good_crc=False), t + k * DT)
    assert sup.state.received == received  # dropped, not used
    with pytest.raises(Fault, match="10 LowState_ frames in a row with a wrong CRC"):
        sup.on_state_image(state_image(good_crc=False), t + 0.1)


def test_fall_is_a_fault():
    sup, t = held_supervisor()
    tilted = (np.cos(0.6), np.sin(0.6), 0.0, 0.0)  # 69 degrees about x
    sup.on_state_image(state_image(quat=tilted), t + DT)
    with pytest.raises(Fault, match="tilted 69 deg"):
        sup.tick(t + DT)


def test_late_or_bad_policy_is_a_fault():
    class Silent(FakeDriver):
        def result(self):
            return None

    sup, t = held_supervisor(Silent())
    sup.press("a", t)
    run_ticks(sup, t, 0.09)  # up to five control steps late is tolerated
    with pytest.raises(Fault, match="no policy result"):
        run_ticks(sup, t + 0.09, 0.05)
    bad = FakeDriver()
    bad.request = lambda state: setattr(bad, "_pending", (np.full(29, np.inf), False))
    sup, t = held_supervisor(bad)
    sup.press("a", t)
    with pytest.raises(Fault, match="non-finite target"):
        run_ticks(sup, t, 0.01)


def test_clamp_targets():
    kp = g1.KP.copy()
    q_meas = g1.DEFAULT_JOINT_POS.copy()
    far = q_meas + 10.0
    q = clamp_targets(far, q_meas, kp, LIMITS)
    assert np.all(q <= LIMITS[:, 1] + 1e-12)
    assert np.all(kp * np.abs(q - q_meas) <= g1.EFFORT_LIMIT + 1e-9)  # torque-equivalent within limits
    knee = g1.JOINT_NAMES.index("left_knee_joint")
    assert q[knee] == pytest.approx(min(LIMITS[knee, 1], q_meas[knee] + g1.EFFORT_LIMIT[knee] / kp[knee]))
    inside = q_meas + 0.01
    np.testing.assert_allclose(clamp_targets(inside, q_meas, kp, LIMITS), np.clip(inside, *LIMITS.T))


def test_targets_may_pass_a_joint_limit_by_what_adds_torque_at_the_stop():
    """A policy target beyond a joint's limit is kept as far as it adds torque with the joint at its
    stop (effort limit / kp past it), as in training and sim2sim, and clipped beyond that."""
    reach = g1.EFFORT_LIMIT / g1.KP
    np.testing.assert_allclose(TARGETS[:, 0], LIMITS[:, 0] - reach)
    np.testing.assert_allclose(TARGETS[:, 1], LIMITS[:, 1] + reach)
    ankle = g1.JOINT_NAMES.index("left_ankle_pitch_joint")
    at_stop = g1.DEFAULT_JOINT_POS.copy()
    at_stop[ankle] = LIMITS[ankle, 1]
    wanted = at_stop.copy()
    wanted[ankle] += 0.5 * reach[ankle]  # within the band and beyond the limit: passed on
    far = at_stop.copy()
    far[ankle] += 3.0 * reach[ankle]
    for target, expected in ((wanted, wanted[ankle]), (far, TARGETS[ankle, 1])):
        driver = FakeDriver(steps=1000)
        driver.request = lambda state, d=driver, q=target: setattr(d, "_pending", (q, False))
        sup, t = held_supervisor(driver, policy_blend_time=0.0, target_rate_factor=1e6)
        sup.press("a", t)
        cmd, t = run_ticks(sup, t, 0.1, image_fn=lambda: state_image(q=at_stop))
        q = motors(cmd)["q"].astype(np.float64)
        assert q[ankle] == pytest.approx(expected, abs=1e-5)
        torque = g1.KP[ankle] * (q[ankle] - at_stop[ankle])
        assert 0 < torque <= g1.EFFORT_LIMIT[ankle] + 1e-3  # the stop is pushed, within the motor's limit
    # measured past its limit, the effort band alone would allow limit + 0.2 + reach: the range holds
    past = at_stop.copy()
    past[ankle] += 0.2
    driver = FakeDriver(steps=1000)
    driver.request = lambda state, d=driver, q=far: setattr(d, "_pending", (q, False))
    sup, t = held_supervisor(driver, policy_blend_time=0.0, target_rate_factor=1e6)
    sup.press("a", t)
    cmd, t = run_ticks(sup, t, 0.1, image_fn=lambda: state_image(q=past))
    assert float(motors(cmd)["q"][ankle]) == pytest.approx(TARGETS[ankle, 1], abs=1e-5)


# The command loop itself (bcg.robot.run.run_loop) with fake DDS channels, in real time (2 ms ticks).
class _Writer:
    def __init__(self, fail_when=None):
        self.sent, self.fail_when = [], fail_when

    def write(self, image):
        if self.fail_when is not None and self.fail_when(image):
            raise OSError("network is unreachable")
        self.sent.append(image.copy())


class _Reader:
    """Yields image_fn(n) on the n-th take (n from 1); ``hook(n)`` runs first (e.g. sends a signal)."""

    def __init__(self, image_fn, hook=None):
        self.image_fn, self.hook, self.n = image_fn, hook, 0

    def take(self):
        self.n += 1
        if self.hook is not None:
            self.hook(self.n)
        return [self.image_fn(self.n)]


class _Channels:
    def __init__(self, image_fn, hook=None, fail_when=None):
        self.lowstate, self.lowcmd = _Reader(image_fn, hook), _Writer(fail_when)


def _is_damping(image, kd=8.0):
    m = image["motor_cmd"][:29]
    return bool(np.all(m["kp"] == 0) and np.all(m["kd"] == kd) and np.all(m["q"] == 0))


def _loop(image_fn, hook=None, fail_when=None, display=None):
    from bcg.robot import run

    sup = make(None, stale_after=10.0, damping_time=0.5)
    ch = _Channels(image_fn, hook, fail_when)
    stats = run.LoopStats()
    run.run_loop(sup, ch, display=display, stats=stats)
    return sup, ch, stats


def _standing_up(n, bad_from=150, bad=None):
    """A good state, START on the 5th tick, then ``bad(n)`` from tick ``bad_from`` on."""
    if n == 5:
        return state_image(buttons=("start",))
    return state_image() if n < bad_from or bad is None else bad(n)


def _assert_full_damping(ch, stats, seconds=0.5, position=True):
    damping = [i for i, image in enumerate(ch.lowcmd.sent) if _is_damping(image)]
    assert damping and damping[-1] == len(ch.lowcmd.sent) - 1, "the last command is not damping"
    assert damping == list(range(damping[0], len(ch.lowcmd.sent))), "position commands after damping"
    if position:  # the fault came under position control
        assert any(image["motor_cmd"]["kp"][:29].max() > 0 for image in ch.lowcmd.sent[: damping[0]])
    assert stats.wake[damping[-1]] - stats.wake[damping[0]] >= seconds - 0.005


NAN_Q = np.where(np.arange(29) == 3, np.nan, g1.DEFAULT_JOINT_POS)


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda n: state_image(q=NAN_Q), "q"),  # a sensor that stays broken
        (lambda n: state_image(good_crc=False), "CRC"),  # a corrupted link that stays corrupted
    ],
    ids=["nan-state", "crc-streak"],
)
def test_a_fault_that_persists_still_gets_full_damping(bad, reason):
    sup, ch, stats = _loop(lambda n: _standing_up(n, bad=bad))
    assert sup.fault and reason in sup.stop_reason and sup.phase is Phase.DONE
    _assert_full_damping(ch, stats)
    assert sup.damping_notes and all(note.startswith("state:") for note in sup.damping_notes)


def test_a_fault_damps_on_the_same_tick():
    sup, ch, stats = _loop(
        lambda n: _standing_up(n, bad=lambda n: state_image(q=NAN_Q) if n == 150 else state_image())
    )
    assert sup.fault and not sup.damping_notes
    first = next(i for i, image in enumerate(ch.lowcmd.sent) if _is_damping(image))
    assert ch.lowstate.n == len(ch.lowcmd.sent)  # one command per tick, from the first state on
    assert first == 150 - 1  # the faulty tick itself sends damping
    _assert_full_damping(ch, stats)


def test_a_broken_display_never_stops_damping():
    from bcg.robot import run

    class Broken(run.Display):
        def update(self, supervisor):
            if supervisor.phase is Phase.DAMPING:
                raise BrokenPipeError(32, "Broken pipe")
            super().update(supervisor)

    import io

    sup, ch, stats = _loop(lambda n: state_image(buttons=("select",)) if n == 100 else state_image(),
                           display=Broken(io.StringIO()))  # fmt: skip
    assert not sup.fault and "SELECT" in sup.stop_reason
    _assert_full_damping(ch, stats, position=False)


def test_a_command_that_cannot_be_written_while_damping_ends_the_loop():
    from bcg.robot import run

    sup = make(None, stale_after=10.0, damping_time=0.5)
    ch = _Channels(lambda n: _standing_up(n, bad=lambda n: state_image(q=NAN_Q)), fail_when=_is_damping)
    with pytest.raises(run.DampingInterrupted, match="unreachable"):
        run.run_loop(sup, ch)
    assert sup.fault and sup.phase is Phase.DAMPING


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGQUIT", "SIGTSTP", "SIGTERM"])
def test_terminal_and_kill_signals_damp(sig):
    import os
    import signal

    def hook(n):
        if n == 150:
            os.kill(os.getpid(), getattr(signal, sig))

    before = signal.getsignal(getattr(signal, sig))
    sup, ch, stats = _loop(lambda n: _standing_up(n), hook=hook)
    assert not sup.fault and sup.stop_reason == f"{sig} received"
    _assert_full_damping(ch, stats)
    assert signal.getsignal(getattr(signal, sig)) is before  # handlers restored


def test_on_the_robot_a_state_without_crc_is_bad_and_the_simulator_code_is_refused():
    from bcg.robot.run import robot_types

    unsigned = state_image()
    unsigned["crc"] = 0  # simulators send no CRC
    sim = make()
    sim.on_state_image(unsigned, 0.0)
    assert sim.state is not None and sim.bad_crc_run == 0
    robot = make(require_crc=True)
    robot.on_state_image(unsigned, 0.0)
    assert robot.state is None and robot.bad_crc_run == 1
    robot.on_state_image(state_image(), 0.002)  # a signed frame is taken
    assert robot.state is not None and robot.bad_crc_run == 0
    assert robot_types([], on_robot=False) == (0, 5) and robot_types([], on_robot=True) == (5,)
    assert robot_types([6], on_robot=True) == (5, 6)


def test_a_blocked_terminal_never_blocks_the_display_update():
    """The status line goes through a thread of its own: a stream that blocks (Ctrl-S, a stalled SSH
    session) holds that thread, not the caller."""
    import threading

    from bcg.robot.run import Display

    release = threading.Event()

    class Blocked:
        lines = []

        def write(self, text):
            release.wait(10.0)
            self.lines.append(text)

        def flush(self):
            pass

    stream = Blocked()
    display, sup = Display(stream), make()
    done = threading.Event()

    def phases():
        for phase in (Phase.ZERO_TORQUE, Phase.STAND_UP, Phase.HOLD_DEFAULT):
            sup.phase = phase
            display.update(sup)
        done.set()

    threading.Thread(target=phases, daemon=True).start()
    assert done.wait(5.0)  # three updates went through while the stream was blocked
    release.set()
    display.close(timeout=5.0)
    assert sum("HOLD" in line or "hold" in line.lower() for line in stream.lines) >= 1


def test_a_failure_of_the_loop_itself_still_damps(monkeypatch):
    """An exception outside the loop's guarded stages (here the ticker) after commands went out:
    ``emergency_damping`` sends the damping command for the damping time."""
    from bcg.robot import run

    sup = make(damping_time=0.1)
    _, t = run_ticks(sup, 0.0, 0.02)
    sup.press("start", t)
    run_ticks(sup, t, 0.1)
    channels = _Channels(lambda n: state_image())
    note, complete = run.emergency_damping(channels, sup, RuntimeError("ticker broke"))
    assert "damping was sent for 0.1 s from outside it" in note and complete
    sent = channels.lowcmd.sent
    assert len(sent) >= 10  # 0.1 s at up to 500 Hz
    for image in sent:
        m = image["motor_cmd"][:29]
        assert np.all(m["kp"] == 0) and np.all(m["kd"] == 8) and crc.crc32_words(image) == int(image["crc"])
    failing = _Channels(lambda n: state_image(), fail_when=lambda image: True)
    note, complete = run.emergency_damping(failing, sup, RuntimeError("ticker broke"))
    assert "could not be sent" in note and not complete  # the guardian is left to damp
