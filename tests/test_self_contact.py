"""Leg-against-leg contact in the simulator (bcg.sim.self_contact): its settings, its pair geometry
against the leg-clearance gaps (themselves checked against MuJoCo's collision detection), the push
it gives crossed legs, and its gradients against central differences in float64."""

import numpy as np
import pytest

from bcg.core import g1
from bcg.sim.contact_config import SelfContactConfig
from tests.numeric import central_difference

ROLL = ("left_hip_roll_joint", "right_hip_roll_joint")


def _crossed(mj, roll, n=2, seed=0, noise=0.02):
    """The standing pose with the hips rolled ``roll`` rad inwards (the legs cross past about 0.13),
    lifted 0.3 m off the ground but for environment 1, plus uniform joint noise of ``noise`` rad."""
    q = np.tile(g1.default_qpos(mj), (n, 1))
    names = list(g1.JOINT_NAMES)
    q[:, 7 + names.index(ROLL[0])] = -roll
    q[:, 7 + names.index(ROLL[1])] = roll
    q[:, 7:] += np.random.default_rng(seed).uniform(-noise, noise, (n, 29))
    q[0, 2] += 0.3
    return q


@pytest.fixture(scope="module")
def legs_sim(ti64):
    import bcg.sim as bs
    from bcg.g1sim import make_g1

    return make_g1(2, max_steps=3, contact=bs.ContactConfig(), self_contact=bs.SelfContactConfig())


def test_settings_refuse_bad_values():
    cap = ("left_knee_link", (0, 0, 0), (0, 0, -0.1), 0.05)
    for bad in (
        {"stiffness": -1.0},
        {"stiffness": float("nan")},
        {"damping": -1.0},
        {"smoothing": 0},
        {"force_limit": 0},
    ):
        with pytest.raises(ValueError, match="SelfContactConfig"):
            SelfContactConfig(**bad)
    for caps in ((), (("left_knee_link", (0, 0), (0, 0, 1), 0.05),), ((1, (0, 0, 0), (0, 0, 1), 0.05),)):
        with pytest.raises(ValueError, match="capsules_a"):
            SelfContactConfig(capsules_a=caps, capsules_b=(cap,))
    with pytest.raises(ValueError, match="positive radius"):
        SelfContactConfig(capsules_a=(cap[:3] + (0.0,),), capsules_b=(cap,))
    assert SelfContactConfig(capsules_a=(cap,), capsules_b=(cap,)).capsules_a[0][1] == (0.0, 0.0, 0.0)
    assert type(SelfContactConfig(stiffness=np.float32(3000.0)).stiffness) is float


def test_simulator_refuses_missing_capsules_and_unknown_bodies(ti64):
    import bcg.sim as bs

    mj = g1.load_model(floor=False, collisions="none")
    with pytest.raises(ValueError, match="capsules_a and capsules_b not given"):
        bs.Simulator(mj, self_contact=bs.SelfContactConfig(), warn_unmodelled=False)
    cap = ("no_such_body", (0, 0, 0), (0, 0, -0.1), 0.05)
    with pytest.raises(KeyError, match="no_such_body"):
        bs.Simulator(mj, self_contact=bs.SelfContactConfig(capsules_a=(cap,), capsules_b=(cap,)))


def test_capsules_of_reads_capsules_and_refuses_other_geoms():
    import mujoco

    from bcg.sim.self_contact import capsules_of

    xml = """<mujoco><worldbody><body name="a"><freejoint/>
      <geom type="capsule" fromto="0 0 0 0 0 0.2" size="0.05"/><geom type="sphere" pos="0 0.1 0" size="0.03"/>
      <geom type="capsule" fromto="0 0 0 1 0 0" size="0.01" contype="0" conaffinity="0"/></body>
      <body name="b"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body></worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)
    (cap, sphere) = capsules_of(model, ["a"])  # the geom that collides with nothing is left out
    assert cap[0] == "a" and cap[3] == pytest.approx(0.05)
    assert sorted([cap[1][2], cap[2][2]]) == pytest.approx([0.0, 0.2])
    assert sphere[1] == sphere[2] == pytest.approx((0.0, 0.1, 0.0)) and sphere[3] == pytest.approx(0.03)
    with pytest.raises(ValueError, match="self-contact handles capsules and spheres only.*BOX"):
        capsules_of(model, ["b"])
    with pytest.raises(KeyError, match="no body named 'c'"):
        capsules_of(model, ["c"])


def test_pair_gaps_match_the_leg_clearance_gaps(legs_sim):
    """Every active pair's gap, r_a + r_b - |a - b|, equals the clearance module's gap of the same two
    capsules, on poses from apart to deeply crossed; no pair within reach is left out."""
    from bcg.learn.clearance import LegCapsules, leg_gaps
    from bcg.sim.self_contact import CUTOFF

    sim, legs = legs_sim, LegCapsules.of()
    mj = g1.load_model(floor=False, collisions="none")
    cfg = sim.self_contact
    active_seen = 0
    for roll in (0.05, 0.12, 0.14, 0.2, 0.3):
        q = _crossed(mj, roll)
        sim.set_state(q, np.zeros((2, sim.nv)))
        sim.step(q[:, 7:])
        # the pairs of the step's last substep were computed at its input state
        qpos = sim.trajectory()[0][sim.substep - 1]
        xpos, xquat = sim.kinematics(qpos)
        want = leg_gaps(legs, xpos, xquat)  # (N, L, R)
        active = sim.selfc.pair_active.to_numpy()[:2]
        pa, pb = sim.selfc.pair_pa.to_numpy()[:2], sim.selfc.pair_pb.to_numpy()[:2]
        radius = sim.selfc.pair_radius.to_numpy()
        for i, (body_a, a0, a1, _) in enumerate(cfg.capsules_a):
            for j, (body_b, b0, b1, _) in enumerate(cfg.capsules_b):
                p = _pair_of(sim, body_a, a0, a1, body_b, b0, b1)
                for e in range(2):
                    if active[e, p]:
                        active_seen += 1
                        got = radius[p] - np.linalg.norm(pa[e, p] - pb[e, p])
                        assert -got == pytest.approx(want[e, i, j], abs=1e-9)
                    else:  # out of reach: the smoothed depth is below its cutoff
                        assert want[e, i, j] > CUTOFF / cfg.smoothing - 1e-9
    assert active_seen > 10


def _pair_of(sim, body_a, a0, a1, body_b, b0, b1) -> int:
    """The simulator's pair index of two capsules (by bodies and axis ends)."""
    f = sim.selfc
    ia, ib = sim.model.body_id(body_a), sim.model.body_id(body_b)
    for p in range(sim.npair):
        if f.pair_body_a[p] == ia and f.pair_body_b[p] == ib:
            ends = [f.pair_a0[p], f.pair_a1[p], f.pair_b0[p], f.pair_b1[p]]
            if all(np.allclose(e.to_numpy(), w) for e, w in zip(ends, (a0, a1, b0, b1))):
                return p
    raise AssertionError("pair not found")


def test_crossed_legs_are_pushed_apart(legs_sim):
    """Legs crossed 1 cm deep at rest in the air, PD holding the pose: the contact turns both hips
    outwards, reports its force, and leaves uncrossed legs alone."""
    sim = legs_sim
    mj = g1.load_model(floor=False, collisions="none")
    names = list(g1.JOINT_NAMES)
    left, right = (6 + names.index(n) for n in ROLL)
    q = _crossed(mj, 0.14, noise=0.0)
    q[1, 2] = q[0, 2]
    sim.set_state(q, np.zeros((2, sim.nv)))
    sim.step(q[:, 7:])
    qv = sim.trajectory()[1][-1]
    assert np.all(sim.self_contact_force() > 20.0)
    assert np.all(qv[:, left] > 0.05) and np.all(qv[:, right] < -0.05)  # left rolls +, right -
    q = _crossed(mj, 0.0)
    sim.set_state(q, np.zeros((2, sim.nv)))
    sim.step(q[:, 7:])
    assert np.all(sim.self_contact_force() == 0.0)


def test_gradients_through_leg_contact_match_finite_differences(legs_sim):
    """A loss after three control steps from crossed legs whose PD targets press them together (the
    contact kicks them apart in the first step and meets them again in environment 1): the reverse
    pass against central differences, on the state and the targets."""
    sim = legs_sim
    mj = g1.load_model(floor=False, collisions="none")
    rng = np.random.default_rng(1)
    q = _crossed(mj, 0.14)
    v = rng.uniform(-0.2, 0.2, (2, sim.nv))
    ctrl = np.tile(_crossed(mj, 0.2)[:, 7:], (3, 1, 1)) + rng.uniform(-0.02, 0.02, (3, 2, 29))
    wq, wv = rng.normal(size=(2, sim.nq)), rng.normal(size=(2, sim.nv))

    def loss(qq, vv, cc, forces=None):
        sim.set_state(qq, vv)
        for c in cc:
            sim.step(c)
            if forces is not None:
                forces.append(sim.self_contact_force())
        qp, qv = sim.trajectory()
        return float((qp[-1] * wq).sum() + (qv[-1] * wv).sum())

    forces = []
    loss(q, v, ctrl, forces)
    forces = np.array(forces)
    assert np.all(forces[0] > 10.0) and np.all(forces[1:, 1] > 1.0), forces
    g = sim.backward({sim.substep: wq}, {sim.substep: wv})

    names = list(g1.JOINT_NAMES)
    hip, knee = 7 + names.index(ROLL[0]), 7 + names.index("right_knee_joint")
    checks = [
        (g.qpos[idx], central_difference(lambda x: loss(x, v, ctrl), q, idx))
        for idx in [(0, 2), (1, 4), (0, hip), (1, knee)]
    ]
    checks += [
        (g.qvel[idx], central_difference(lambda x: loss(q, x, ctrl), v, idx))
        for idx in [(0, 1), (1, hip - 1)]
    ]
    checks += [
        (g.ctrl[idx], central_difference(lambda x: loss(q, v, x), ctrl, idx))
        for idx in [
            (0, 0, names.index(ROLL[0])),
            (2, 1, names.index(ROLL[1])),
            (1, 0, names.index("left_knee_joint")),
        ]
    ]
    for analytic, numeric in checks:
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-5)


def test_training_env_config_switches_leg_contact_on(ti64):
    """``env.leg_contact_stiffness`` > 0 gives the training simulator the G1's 11 x 11 leg pairs with
    its settings; 0, the default, none."""
    from bcg.learn.config import EnvConfig
    from bcg.learn.training_sim import make_g1_sim

    env = EnvConfig(leg_contact_stiffness=3000.0, leg_contact_damping=0.25, leg_contact_limit=150.0)
    sim = make_g1_sim(env, 2, 4)
    assert (sim.npair, sim.nbp) == (121, 16)
    assert (sim.self_contact.stiffness, sim.self_contact.damping, sim.self_contact.force_limit) == (
        3000,
        0.25,
        150,
    )
    assert (sim.selfc.sc_stiffness[None], sim.selfc.sc_limit[None]) == (3000.0, 150.0)
    assert make_g1_sim(EnvConfig(), 2, 4).npair == 0


def test_contact_built_at_zero_stiffness_adds_nothing_until_switched_on(ti64):
    """A simulator built with k = 0 (for a run whose later stage turns the contact on) steps crossed
    legs bit for bit as one without self-contact; after ``set_self_contact`` it steps as one built
    with the new settings. Only the in-place fields change, and bad values are refused."""
    import bcg.sim as bs
    from bcg.g1sim import make_g1

    mj = g1.load_model(floor=False, collisions="none")
    q, v = _crossed(mj, 0.3), np.zeros((2, 35))
    targets = q[:, 7:] + np.random.default_rng(4).uniform(-0.3, 0.3, (2, 29))

    def run(sim):
        sim.set_state(q, v)
        for _ in range(3):
            sim.step(targets)
        return sim.trajectory()[0][-1]

    plain = make_g1(2, max_steps=3, contact=bs.ContactConfig())
    legs_off = bs.SelfContactConfig(stiffness=0.0)
    off = make_g1(2, max_steps=3, contact=bs.ContactConfig(), self_contact=legs_off)
    on = make_g1(
        2,
        max_steps=3,
        contact=bs.ContactConfig(),
        self_contact=bs.SelfContactConfig(stiffness=3000.0, damping=0.2, force_limit=150.0),
    )
    assert np.array_equal(run(off), run(plain))
    assert off.self_contact_force().max() == 0.0
    off.set_self_contact(stiffness=3000.0, damping=0.2, force_limit=150.0)
    switched = run(off)
    assert np.array_equal(switched, run(on)) and not np.array_equal(switched, run(plain))
    assert off.self_contact_force().max() > 0.0
    with pytest.raises(ValueError, match="not smoothing"):
        off.set_self_contact(smoothing=10.0)
    with pytest.raises(ValueError, match="stiffness must be a number >= 0"):
        off.set_self_contact(stiffness=-1.0)
    with pytest.raises(RuntimeError, match="no self-contact"):
        plain.set_self_contact(stiffness=1.0)


def test_stored_configs_and_the_replay_read_the_leg_contact():
    """Off by default and in runs stored before the fields; the MuJoCo check's training-simulator
    replay takes a policy's own setting, and bad values are refused."""
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import ConfigError, apply_overrides, config_from_dict, config_to_dict
    from bcg.validate import sim2sim

    cfg = TrainConfig()
    assert (cfg.env.leg_contact_stiffness, cfg.env.leg_contact_damping, cfg.env.leg_contact_limit) == (
        0.0,
        0.5,
        200.0,
    )
    stored = config_to_dict(apply_overrides(cfg, ["env.leg_contact_stiffness=20000"]))
    assert config_from_dict(stored).env.leg_contact_stiffness == 20000.0
    assert sim2sim.training_leg_contact(stored) == (20000.0, 0.5, 200.0)
    del (
        stored["env"]["leg_contact_stiffness"],
        stored["env"]["leg_contact_damping"],
        stored["env"]["leg_contact_limit"],
    )
    assert config_from_dict(stored).env.leg_contact_stiffness == 0.0
    assert sim2sim.training_leg_contact(stored) == sim2sim.training_leg_contact(None) == (0.0, 0.5, 200.0)
    with pytest.raises(
        ConfigError,
        match="leg_contact_stiffness and env.leg_contact_damping must be >= 0 and env.leg_contact_limit > 0",
    ):
        apply_overrides(cfg, ["env.leg_contact_damping=-1"])
    for bad in (-1.0, "1", True, float("inf")):
        with pytest.raises(sim2sim.EvaluationError, match="leg_contact_stiffness"):
            sim2sim.training_leg_contact({"env": {"leg_contact_stiffness": bad}})
    with pytest.raises(sim2sim.EvaluationError, match="leg_contact_limit 0"):
        sim2sim.training_leg_contact({"env": {"leg_contact_limit": 0}})
    from bcg.learn.config import EnvConfig

    with pytest.raises(ValueError, match="leg_contact_limit > 0, got nan"):
        EnvConfig(leg_contact_stiffness=float("nan"))


def test_deeply_crossed_legs_stay_stable(legs_sim):
    """Legs crossed up to 12 cm deep with random joint velocities and random PD targets for 1 s: the
    bounded force keeps every state finite and the joint speeds where they are without the contact
    (the unbounded force with its damping blew up from such states)."""
    sim = legs_sim
    mj = g1.load_model(floor=False, collisions="none")
    rng = np.random.default_rng(2)
    worst = 0.0
    for roll in (0.2, 0.3, 0.45):
        q = _crossed(mj, roll, noise=0.1)
        v = rng.uniform(-2.0, 2.0, (2, sim.nv))
        v[:, :6] = 0.0
        for _ in range(17):  # 51 control steps, three per window
            sim.set_state(q, v)
            for _ in range(3):
                sim.step(q[:, 7:] + rng.uniform(-0.5, 0.5, (2, 29)))
            qp, qv = sim.trajectory()
            q, v = qp[-1], qv[-1]
            assert np.all(np.isfinite(q)) and np.all(np.isfinite(v))
            worst = max(worst, float(np.abs(v[:, 6:]).max()))
    assert worst < 30.0
