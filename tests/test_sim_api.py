"""bcg.sim as a library for other robots: what it refuses, what it warns about, and the errors a
caller gets for input of the wrong shape or with non-finite values."""

import warnings

import mujoco
import numpy as np
import pytest

from bcg.sim import ContactConfig, SimConfig, Simulator, UnsupportedModelError, load_mjcf
from bcg.sim.model import unmodelled
from tests.models import CHAIN, FLOATING

PENDULUM = """<mujoco><option timestep="0.005" {option}/>{top}<worldbody>
<body name="link" pos="0 0 1"><joint name="h" type="hinge" axis="0 1 0" {joint}/>
<geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.02" mass="1"/></body></worldbody>{bottom}</mujoco>"""


def pendulum(option="", top="", joint="", bottom=""):
    return PENDULUM.format(option=option, top=top, joint=joint, bottom=bottom)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"num_envs": 0}, "num_envs"), ({"substeps": 0}, "substeps"), ({"max_steps": 0}, "max_steps"),
     ({"dt": -0.005}, "dt"), ({"dt": float("nan")}, "dt"), ({"friction_velocity": 0.0}, "friction_velocity"),
     ({"cpu_threads": 0}, "cpu_threads"), ({"cpu_threads": 1.5}, "cpu_threads")],
)  # fmt: skip
def test_sim_config_refuses_sizes_and_steps_that_cannot_work(kwargs, field):
    with pytest.raises(ValueError, match=f"SimConfig.{field}"):
        SimConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spheres": (("link", (0.1, 0.2)),), "radius": 0.02}, "body name, \\(x, y, z\\)"),
        ({"spheres": (("link", (0, 0, 0, 1)),), "radius": 0.02}, "body name, \\(x, y, z\\)"),
        ({"spheres": (("link", (0, np.nan, 0)),), "radius": 0.02}, "finite"),
        ({"spheres": (), "radius": 0.02}, "empty"),
        ({"radius": -0.02}, "radius must be a positive"),
        ({"kappa": 0.0}, "kappa must be a positive"),
        ({"iterations": 0}, "iterations"),
        ({"friction": -0.1}, "friction"),
        ({"activation_margin": -0.01}, "activation_margin"),
        ({"depth_correction": -0.1}, "depth_correction"),
        ({"depth_correction": 1.0}, "depth_correction"),
        ({"depth_correction": "0.2"}, "depth_correction"),
    ],
)
def test_contact_config_refuses_malformed_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ContactConfig(**kwargs)


def test_contact_config_normalises_sphere_positions():
    cfg = ContactConfig(spheres=[("link", np.array([0, 0, 0.1]))], radius=0.02)
    assert cfg.spheres == (("link", (0.0, 0.0, 0.1)),)


def test_what_the_simulator_leaves_out_is_listed_and_what_it_cannot_model_refused():
    mj = mujoco.MjModel.from_xml_string(
        pendulum(
            option='integrator="RK4"',
            joint='range="-0.5 0.3"',
            bottom='<actuator><motor joint="h"/></actuator>',
        )
    )
    notes = "; ".join(unmodelled(mj, dt=0.002))
    assert "joint limits (h)" in notes and "1 actuator(s)" in notes
    assert "option timestep 0.005 s" in notes and "RK4 integrator" in notes
    assert unmodelled(mujoco.MjModel.from_xml_string(pendulum()), dt=0.005) == []
    with pytest.raises(UnsupportedModelError, match="fluid forces"):
        load_mjcf(pendulum(option='density="1000"'))
    # an unnamed element is named by its index, as the model names it
    with pytest.raises(UnsupportedModelError, match=r"several joints \(body1\)"):
        load_mjcf("<mujoco><worldbody><body><joint/><joint/><geom size='.1'/></body></worldbody></mujoco>")
    model, _ = load_mjcf(pendulum(top='<option><flag gravity="disable"/></option>'))
    assert np.all(model.gravity == 0)  # the MJCF's flag is honoured


def test_models_the_simulator_cannot_drive_are_refused_before_any_field(ti64):
    with pytest.raises(UnsupportedModelError, match="no joints"):
        Simulator("<mujoco><worldbody><body><geom size='.1' mass='1'/></body></worldbody></mujoco>")
    with pytest.raises(ValueError, match="'ball' is not a hinge or slide"):
        Simulator(FLOATING, actuated_joints=("ball",))
    with pytest.raises(ValueError, match="more than once"):
        Simulator(CHAIN, actuated_joints=("h0", "h0"))
    with pytest.raises(KeyError, match="no joint named 'nope'"):
        Simulator(CHAIN, actuated_joints=("nope",))
    with pytest.raises(ValueError, match="ContactConfig.spheres and radius not given"):
        Simulator(CHAIN, contact=ContactConfig())
    with pytest.raises(ValueError, match="kp: expected shape"):
        Simulator(CHAIN, kp=[1.0, 2.0])
    with pytest.raises(ValueError, match="effort_limit: expected one value or 5"):
        Simulator(CHAIN, effort_limit=[1.0, 2.0])
    # a refused construction leaves the runtime usable
    assert Simulator(CHAIN, SimConfig(num_envs=2, max_steps=2), warn_unmodelled=False).nu == 5


def test_a_model_with_limits_and_actuators_warns_once_per_simulator(ti64):
    xml = pendulum(joint='range="-0.5 0.3"', bottom='<actuator><position joint="h" kp="100"/></actuator>')
    with pytest.warns(UserWarning, match=r"does not model joint limits \(h\).*1 actuator\(s\)"):
        sim = Simulator(xml, SimConfig(num_envs=1, max_steps=1), kp=100.0)
    assert sim.get_param("kp")[0, 0] == 100.0  # the simulator's own PD, with the gains it was given
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Simulator(xml, SimConfig(num_envs=1, max_steps=1), warn_unmodelled=False)


@pytest.fixture(scope="module")
def floating(ti64):
    return Simulator(FLOATING, SimConfig(num_envs=2, max_steps=3), kp=20.0, kd=1.0)


def test_state_and_controls_of_the_wrong_shape_or_not_finite_are_refused(floating):
    sim = floating
    qpos0 = np.broadcast_to(sim.model.qpos0, (2, sim.nq)).copy()
    with pytest.raises(
        ValueError, match=r"set_state: qpos: expected shape \(2, 12\) or \(12,\), got \(2, 3\)"
    ):
        sim.set_state(np.zeros((2, 3)), 0.0)
    bad = qpos0.copy()
    bad[1, 3:7] = 0.0  # the free joint's quaternion
    with pytest.raises(ValueError, match="quaternion of joint 'root'.*norm 0"):
        sim.set_state(bad, 0.0)
    sim.set_state(qpos0, 0.0)
    with pytest.raises(ValueError, match=r"step: ctrl: expected shape \(2, 1\)"):
        sim.step(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"step: ctrl holds non-finite values \(environments \[1\]\)"):
        sim.step(np.array([[0.0], [np.nan]]))
    with pytest.raises(ValueError, match="step: qfrc_applied holds non-finite"):
        sim.step(np.zeros((2, 1)), np.full((2, sim.nv), np.inf))
    with pytest.raises(ValueError, match="set_params: kd holds non-finite"):
        sim.set_params(kd=np.nan)
    assert sim.substep == 0  # nothing was stepped


def test_gradient_seeds_outside_the_window_are_refused(floating):
    sim = floating
    sim.set_state(sim.model.qpos0, 0.0)
    sim.rollout(np.zeros((2, 2, 1)))
    t = sim.substep
    for seed in ({t + 1: np.ones(sim.nq)}, {-1: np.ones(sim.nq)}):
        with pytest.raises(ValueError, match=f"outside this window's substeps 0..{t}"):
            sim.backward(seed)
    with pytest.raises(ValueError, match=f"one row per substep of the window, \\({t + 1}, 2, 12\\)"):
        sim.backward(np.ones((t, 2, sim.nq)))
    with pytest.raises(ValueError, match=rf"qvel_grad\[{t}\]: expected shape \(2, {sim.nv}\)"):
        sim.backward(qvel_grad={t: np.ones((2, 4))})
    grads = sim.backward({t: np.ones(sim.nq)})
    assert np.all(np.isfinite(grads.ctrl)) and np.any(grads.ctrl != 0)


def test_a_non_finite_torque_stays_non_finite(floating):
    """The effort clip passes a NaN on (a min/max clip would turn it into the finite limit, and a
    diverged controller would look like a finite explosion)."""
    sim = floating
    sim.set_state(sim.model.qpos0, 0.0)
    sim.mdl.kp.from_numpy(np.full(sim.mdl.kp.shape, np.nan))  # past set_params' check, as a kernel bug would
    try:
        sim.step(np.zeros((2, 1)))
        assert np.all(np.isnan(sim.qvel_now[:, -1]))
    finally:
        sim.set_params(kp=20.0)
