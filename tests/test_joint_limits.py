"""Joint limits in the simulator (bcg.sim.joint_limits): their settings, the balance a joint pushed
past its range settles at, a damper that never pulls outwards, gradients against central
differences in float64, switching them on in place, and the training's and the replay's settings."""

import numpy as np
import pytest

from bcg.core import g1
from tests.models import LIMITED_ARM
from tests.numeric import central_difference

ANKLE_ROLL = ("left_ankle_roll_joint", "right_ankle_roll_joint")


def _hinges(limits, kp=10.0, max_steps=20):
    import bcg.sim as bs

    cfg = bs.SimConfig(num_envs=1, max_steps=max_steps, dt=0.005, substeps=4, requires_grad=False)
    return bs.Simulator(LIMITED_ARM, cfg, kp=kp, kd=0.5, joint_limits=limits, warn_unmodelled=False)


def test_settings_refuse_bad_values_and_unknown_joints(ti64):
    import bcg.sim as bs
    from bcg.sim.joint_limits import limit_tables

    for bad in ({"stiffness": -1.0}, {"stiffness": float("nan")}, {"damping": True}, {"damping": {"a": -2}}):
        with pytest.raises(ValueError, match="JointLimitConfig"):
            bs.JointLimitConfig(**bad)
    assert bs.JointLimitConfig(stiffness={"a": np.float32(3)}).stiffness == {"a": 3.0}
    model = _hinges(None).model
    with pytest.raises(KeyError):
        limit_tables(model, bs.JointLimitConfig(stiffness={"no_such_joint": 1.0}))
    with pytest.raises(ValueError, match="'free_hinge' is not a limited hinge"):
        limit_tables(model, bs.JointLimitConfig(damping={"free_hinge": 1.0}))
    t = limit_tables(model, bs.JointLimitConfig(stiffness=200.0, damping=2.0))
    assert t["lo"][0] == -0.5 and t["hi"][0] == 0.5 and np.isinf(t["hi"][1])
    assert list(t["stiffness"]) == [200.0, 0.0] and list(t["damping"]) == [2.0, 0.0]


def test_a_joint_pushed_past_its_range_settles_where_spring_and_pd_balance(ti64):
    """A PD target 1 rad past the range: with the limit the joint rests where k (q - 0.5) = kp (1.5 -
    q); without it, at the target. The unlimited joint is left alone."""
    import bcg.sim as bs

    for k, expect in ((400.0, (10 * 1.5 + 400 * 0.5) / 410), (None, 1.5)):
        sim = _hinges(None if k is None else bs.JointLimitConfig(stiffness=k, damping=2.0), max_steps=400)
        sim.set_state(np.zeros((1, 2)), np.zeros((1, 2)))
        for _ in range(400):  # 8 s
            sim.step(np.array([[1.5, 0.3]]))
        q = sim.qpos_now[0]
        assert q[0] == pytest.approx(expect, abs=2e-3), (k, q)
        assert q[1] == pytest.approx(0.3, abs=2e-3)


def test_the_damper_never_pulls_a_joint_outwards(ti64):
    """A joint past its limit moving back into the range faster than the spring pushes it: the limit
    adds nothing (the clip at 0), so the step equals the one without limits; moving outwards, it
    brakes."""
    import bcg.sim as bs

    def step(limits, v):
        sim = _hinges(limits, kp=0.0)
        sim.set_state(np.array([[0.52, 0.0]]), np.array([[v, 0.0]]))
        sim.step(np.zeros((1, 2)))
        return sim.qvel_now[0, 0]

    damped = bs.JointLimitConfig(stiffness=10.0, damping=50.0)  # k delta = 0.2, c v = 100 at v = -2
    assert step(damped, -2.0) == step(None, -2.0)
    assert step(damped, 2.0) < step(None, 2.0) - 0.5


def test_gradients_through_joint_limits_match_finite_differences(ti64):
    """The G1 in the air with both ankles rolled past their ranges (0.262 rad) and PD targets
    further out, which the limits push back: the reverse pass against central differences, on the
    state and the targets."""
    import bcg.sim as bs
    from bcg.g1sim import joint_limits, make_g1

    sim = make_g1(2, max_steps=3, contact=bs.ContactConfig(), joint_limits=joint_limits())
    mj = g1.load_model(floor=False, collisions="none")
    names = list(g1.JOINT_NAMES)
    rolls = [names.index(j) for j in ANKLE_ROLL]
    rng = np.random.default_rng(3)
    q = np.tile(g1.default_qpos(mj), (2, 1))
    q[:, 2] += 0.3
    q[:, 7 + rolls[0]], q[:, 7 + rolls[1]] = 0.3, -0.33
    q[:, 7:] += rng.uniform(-0.01, 0.01, (2, 29))
    v = rng.uniform(-0.3, 0.3, (2, sim.nv))
    ctrl = np.tile(q[:, 7:], (3, 1, 1)) + rng.uniform(-0.02, 0.02, (3, 2, 29))
    ctrl[:, :, rolls[0]] += 0.4
    ctrl[:, :, rolls[1]] -= 0.4
    wq, wv = rng.normal(size=(2, sim.nq)), rng.normal(size=(2, sim.nv))

    def loss(qq, vv, cc):
        sim.set_state(qq, vv)
        for c in cc:
            sim.step(c)
        qp, qv = sim.trajectory()
        return float((qp[-1] * wq).sum() + (qv[-1] * wv).sum())

    loss(q, v, ctrl)
    g = sim.backward({sim.substep: wq}, {sim.substep: wv})

    checks = [
        (g.qpos[i], central_difference(lambda x: loss(x, v, ctrl), q, i))
        for i in [(0, 7 + rolls[0]), (1, 7 + rolls[1]), (0, 2)]
    ]
    checks += [
        (g.qvel[i], central_difference(lambda x: loss(q, x, ctrl), v, i))
        for i in [(0, 6 + rolls[0]), (1, 6 + rolls[1])]
    ]
    checks += [
        (g.ctrl[i], central_difference(lambda x: loss(q, v, x), ctrl, i))
        for i in [(0, 0, rolls[0]), (2, 1, rolls[1])]
    ]
    for analytic, numeric in checks:
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-5)
    plain = make_g1(2, max_steps=3, contact=bs.ContactConfig())
    plain.set_state(q, v)
    for c in ctrl:
        plain.step(c)
    assert not np.allclose(plain.qpos_now, sim.qpos_now)  # the limits acted


def test_limits_built_at_zero_add_nothing_until_switched_on(ti64):
    """Built with k = c = 0 (for a run whose later stage turns them on) the simulator steps as one
    without limits; after ``set_joint_limits`` as one built with them. The MJCF note on joint limits
    is left out once the simulator has them."""
    import bcg.sim as bs
    from bcg.sim.model import unmodelled

    def run(sim):
        sim.set_state(np.array([[0.45, 0.0]]), np.zeros((1, 2)))
        for _ in range(20):
            sim.step(np.array([[1.5, 0.0]]))
        return sim.qpos_now[0].copy()

    off = _hinges(bs.JointLimitConfig(stiffness=0.0, damping=0.0))
    assert np.array_equal(run(off), run(_hinges(None)))
    off.set_joint_limits(stiffness=400.0, damping=2.0)
    assert np.array_equal(run(off), run(_hinges(bs.JointLimitConfig(stiffness=400.0, damping=2.0))))
    with pytest.raises(ValueError, match="JointLimitConfig.stiffness"):
        off.set_joint_limits(stiffness=-1.0)
    with pytest.raises(RuntimeError, match="no joint limits"):
        _hinges(None).set_joint_limits(stiffness=1.0)
    mj = off.mjmodel
    assert "joint limits" in "; ".join(unmodelled(mj))
    assert "joint limits" not in "; ".join(unmodelled(mj, joint_limits=True))


def test_the_training_and_its_stages_build_and_switch_the_limits(ti64):
    """``env.joint_limit_kp_ratio`` > 0 gives the training simulator the G1's limits (10x kp on the
    ankle: 285 N m/rad, no damper); a stage turns them on in a simulator built for it and is refused in one
    built without; bad ratios are refused."""
    from bcg.learn.config import EnvConfig, TrainConfig
    from bcg.learn.stages import joint_limits_later, set_env_config
    from bcg.learn.training_sim import make_g1_sim

    roll = g1.JOINT_NAMES.index("left_ankle_roll_joint") + 6
    sim = make_g1_sim(EnvConfig(joint_limit_kp_ratio=10.0), 1, 2)
    assert sim.limits.lim_stiffness[roll] == pytest.approx(10 * g1.KP[roll - 6])
    assert sim.limits.lim_damping[roll] == 0.0  # no damper (test_gradients_stay_bounded_...)
    assert make_g1_sim(EnvConfig(), 1, 2).joint_limits is None
    later = TrainConfig(env_stages="100:joint_limit_kp_ratio=10")
    assert joint_limits_later(later) and not joint_limits_later(TrainConfig(env_stages=""))
    built = make_g1_sim(EnvConfig(), 1, 2, joint_limits_later=True)
    assert built.limits.lim_stiffness.to_numpy().max() == 0 and built.limits.lim_damping.to_numpy().max() == 0

    class Env:  # what set_env_config reads of an environment
        def __init__(self, sim):
            self.sim, self.cfg = sim, EnvConfig()
            self.start_phases = type("Phases", (), {})()

    env = Env(built)
    assert set_env_config(env, EnvConfig(joint_limit_kp_ratio=10.0)) == {"joint_limit_kp_ratio": 10.0}
    assert built.limits.lim_stiffness[roll] == pytest.approx(10 * g1.KP[roll - 6])
    with pytest.raises(ValueError, match="cannot turn on the joint limits"):
        set_env_config(Env(make_g1_sim(EnvConfig(), 1, 2)), EnvConfig(joint_limit_kp_ratio=10.0))
    with pytest.raises(ValueError, match="joint_limit_kp_ratio and env.joint_limit_kd_ratio must be"):
        EnvConfig(joint_limit_kd_ratio=-1.0)


def test_stored_configs_and_the_replay_read_the_limits(ti64):
    """Off by default and in runs stored before the fields; the MuJoCo check's training-simulator
    replay takes a policy's own setting, and bad values are refused."""
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import apply_overrides, config_to_dict
    from bcg.validate import mujoco_runner as mr
    from bcg.validate.stored_config import EvaluationError, training_joint_limits

    stored = config_to_dict(apply_overrides(TrainConfig(), ["env.joint_limit_kp_ratio=10"]))
    assert training_joint_limits(stored) == (10.0, 0.0)
    assert training_joint_limits(None) == training_joint_limits({"env": {}}) == (0.0, 0.0)
    for bad in (-1.0, "1", True, float("inf")):
        with pytest.raises(EvaluationError, match="joint_limit_kp_ratio"):
            training_joint_limits({"env": {"joint_limit_kp_ratio": bad}})
    pd = mr.PDParams(kp=g1.KP, kd=g1.KD, effort_limit=g1.EFFORT_LIMIT, source="test")
    replay = mr.TrainingSimG1(pd, joint_limits=training_joint_limits(stored))
    assert replay.sim.joint_limits is not None
    assert mr.TrainingSimG1(pd).sim.joint_limits is None


def test_gradients_stay_bounded_while_joints_press_on_their_limits(ti64):
    """Every joint of the G1 in the air pressed 0.5 rad past a limit for a 32-step window: with the
    G1's limits the gradients of the final pose keep the size they have without limits, where a
    damper of the PD damping on top makes the explicit step's tangent map unstable and them grow
    (a training run's gradient norm reached 1e9 with it)."""
    from bcg.g1sim import joint_limits, make_g1

    mj = g1.load_model(floor=False, collisions="none")
    lim = g1.joint_limits(mj)
    q = g1.default_qpos(mj)[None].copy()
    w = np.random.default_rng(0).normal(size=(1, q.shape[1]))
    w[0, :7] = 0.0
    ctrl = np.tile(q[:, 7:], (32, 1, 1))
    ctrl[:, 0] = np.where(np.arange(29) % 2 == 0, lim[:, 1] + 0.5, lim[:, 0] - 0.5)

    def largest_gradient(limits):
        sim = make_g1(1, max_steps=32, joint_limits=limits)
        sim.set_state(q, np.zeros((1, sim.nv)))
        for c in ctrl:
            sim.step(c)
        g = sim.backward({sim.substep: w})
        return max(np.abs(g.qpos).max(), np.abs(g.ctrl).max())

    free = largest_gradient(None)
    assert largest_gradient(joint_limits()) < 3 * free
    assert largest_gradient(joint_limits(damping_ratio=1.0)) > 20 * free
