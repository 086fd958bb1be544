"""The gradient-variance study command (float64, small sizes)."""

import dataclasses

import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.studies import contact_gradient as study
from tests.g1_sims import ENVS, g1_contact_sim

SAMPLES, LEAD, STEPS = 6, 2, 1
assert SAMPLES == ENVS  # the tests below run on the contact tests' shared simulators (tests.g1_sims)


@pytest.mark.slow  # its own float64 simulator: about 50 s of compiling from a cold cache
def test_command_prints_the_table_and_writes_the_plot(ti64, tmp_path, capsys):
    out = tmp_path / "study.png"
    argv = ["--samples", str(SAMPLES), "--lead", str(LEAD), "--steps", str(STEPS), "--kappas", "50", "300"]
    assert study.main([*argv, "--precision", "float64", "--offset", "0.002", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines() if line.split()[:1] in (["50"], ["300"])]
    assert [(r[0], r[1]) for r in rows] == [("50", "off"), ("50", "on"), ("300", "off"), ("300", "on")]
    for r in rows:
        assert np.isfinite(float(r[2])) and float(r[3]) > 0.0  # nearby states give different gradients
    assert "eta" in captured.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def quiet_sim(ti64):
    """A simulator of SAMPLES environments whose bundles perturb nothing (sigma = 0) and open above
    150 N: its bundles are B identical copies of the nominal step (the shared size-2 simulator of
    :mod:`tests.g1_sims`, set for each test)."""
    import bcg.sim as bs

    return g1_contact_sim(bundle=bs.BundleConfig(size=2, threshold=150.0, sigma_pos=0.0, sigma_vel=0.0))


def test_plain_gradient_is_the_finite_difference_of_the_forward_velocity(quiet_sim):
    """d vz / d z0 reported by the study against a central difference of the forward vz."""
    base = study.jump_scene(SAMPLES // 3, STEPS, offset=0.002, lead=LEAD)
    eps = 1e-5
    qpos = np.repeat(base.qpos0, 3, axis=0)
    qpos[:, 2] += np.tile([0.0, eps, -eps], base.samples)
    scene = dataclasses.replace(
        base,
        qpos0=qpos,
        qvel0=np.repeat(base.qvel0, 3, axis=0),
        ctrl=np.repeat(base.ctrl, 3, axis=1),
        offsets=np.repeat(base.offsets, 3),
    )
    result = study.run_setting(quiet_sim, scene, kappa=50.0, bundle=False)
    vz = result.vz.reshape(-1, 3)
    finite_difference = (vz[:, 1] - vz[:, 2]) / (2 * eps)
    reported = result.gradient.reshape(-1, 3)[:, 0]
    assert np.all(np.abs(reported) > 0.1), "the touchdown should couple height and later velocity"
    np.testing.assert_allclose(reported, finite_difference, rtol=1e-4, atol=1e-5)


def test_noise_free_bundles_give_the_plain_gradient_when_bundles_overlap(quiet_sim):
    """With sigma = 0 every copy is the nominal step, so BCG must return the plain gradient exactly,
    also when one environment opens its bundle while another's is still open (staggered landings)."""
    scene = study.jump_scene(SAMPLES, STEPS, offset=0.002, lead=LEAD)
    qpos = scene.qpos0.copy()
    qpos[SAMPLES // 2 :, 2] += 0.01  # these land about a control step later
    scene = dataclasses.replace(scene, qpos0=qpos)
    plain = study.run_setting(quiet_sim, scene, kappa=300.0, bundle=False)
    onsets = _bundle_onsets(quiet_sim, scene)
    assert len(set(onsets.values())) > 1, f"the landings should open bundles at different steps: {onsets}"
    bundled = study.run_setting(quiet_sim, scene, kappa=300.0, bundle=True)
    np.testing.assert_allclose(bundled.vz, plain.vz, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(bundled.gradient, plain.gradient, rtol=1e-7, atol=1e-9)


def test_noise_free_bundles_report_the_plain_contact_forces_at_every_step(quiet_sim):
    """contact_force() of a bundled environment is its copies' mean, also in the step that closes the
    bundle: with sigma = 0 it equals the unbundled force at every control step."""
    scene = study.jump_scene(SAMPLES, STEPS, offset=0.002, lead=LEAD)

    def forces(bundle):
        quiet_sim.set_kappa(300.0)
        quiet_sim.set_bundling(bundle)
        quiet_sim.set_state(scene.qpos0, scene.qvel0)
        out = []
        for c in range(scene.steps):
            quiet_sim.step(scene.ctrl[c])
            out.append(quiet_sim.contact_force())
        return np.array(out), quiet_sim.bundle_stats()["trigger_rate"]

    plain, _ = forces(False)
    bundled, rate = forces(True)
    assert rate > 0 and plain.max() > 150.0
    np.testing.assert_allclose(bundled, plain, rtol=1e-8, atol=1e-6)


def test_common_noise_gives_identical_states_identical_bundled_gradients(quiet_sim):
    """Copies of one state: with common random numbers their bundles draw the same perturbations and
    give the same gradient; with each bundle's own draws the gradients scatter (Monte-Carlo noise)."""
    scene = study.jump_scene(SAMPLES, STEPS, offset=0.002, lead=LEAD)
    scene = dataclasses.replace(
        scene,
        qpos0=np.repeat(scene.qpos0[:1], SAMPLES, axis=0),
        qvel0=np.repeat(scene.qvel0[:1], SAMPLES, axis=0),
        ctrl=np.repeat(scene.ctrl[:, :1], SAMPLES, axis=1),
        offsets=np.zeros(SAMPLES),
    )
    quiet_sim.set_bundle_config(dataclasses.replace(quiet_sim.bundle, sigma_pos=0.01, sigma_vel=0.02))
    plain = study.run_setting(quiet_sim, scene, kappa=300.0, bundle=False)
    own = study.run_setting(quiet_sim, scene, kappa=300.0, bundle=True)
    common = study.run_setting(quiet_sim, scene, kappa=300.0, bundle=True, common_noise=True)
    assert np.ptp(plain.gradient) < 1e-9 and own.trigger_rate > 0 and common.common_noise
    assert np.std(own.gradient) > 1e-3 * (1 + abs(plain.gradient[0]))
    np.testing.assert_allclose(common.gradient, common.gradient[0], rtol=1e-9)
    assert abs(common.gradient[0] - plain.gradient[0]) > 1e-6  # the perturbed copies did change it
    assert study.table([plain, own, common], scene).splitlines()[-1].split()[:2] == ["300", "crn"]


def _bundle_onsets(sim, scene) -> dict:
    """Control step at which each environment first crosses the trigger threshold (BCG off)."""
    sim.set_bundling(False)
    sim.set_state(scene.qpos0, scene.qvel0)
    onsets = {}
    for c in range(scene.steps):
        sim.step(scene.ctrl[c])
        for e in np.flatnonzero(sim.contact_force().max(axis=1) > sim.bundle.threshold):
            onsets.setdefault(int(e), c)
    return onsets


def test_touchdown_puts_the_lowest_foot_sphere_on_the_ground():
    """At each touchdown the reference's lowest sphere point (MuJoCo's kinematics) is at z = 0, and
    60 ms before it the feet are clear of the ground."""
    from bcg.motion.clip import MotionClip

    model = g1.load_model(floor=False, collisions="none")
    clip = MotionClip.load("jump", model)
    times = study.touchdowns(clip)
    assert len(times) >= 2
    data = mujoco.MjData(model)

    def lowest(t):
        data.qpos[:] = clip.qpos(clip.sample(np.array(t)))
        mujoco.mj_kinematics(model, data)
        z = [
            (data.xpos[model.body(body).id] + data.xmat[model.body(body).id].reshape(3, 3) @ pos)[2]
            for body, pos in g1.FOOT_SPHERES
        ]
        return min(z) - g1.FOOT_SPHERE_RADIUS

    for t in times[:3]:
        assert abs(lowest(t)) < 2e-3
        assert lowest(t - 3 * g1.CONTROL_DT) > 5e-3


@pytest.mark.parametrize(
    "command, argv, words",
    [
        ("study", ["--samples", "1"], "--samples"),
        ("study", ["--touchdown", "99"], "touchdown"),
        ("study", ["--time", "14.9"], "leaves the clip"),
        ("study", ["--out", "plot.txt"], ".png"),
        ("study", ["--activation-margin", "-0.001"], "--activation-margin"),
        ("study", ["--bundle-size", "0"], "--bundle-size"),
        ("study", ["--bundle-size", "5", "--sampling", "antithetic"], "even"),
        ("study", ["--bundle-horizon", "0"], "--bundle-horizon"),
        ("study", ["--depth-correction", "1"], "--depth-correction"),
        ("penetration", ["--seconds", "0"], "--seconds"),
        ("penetration", ["--activation-margin", "-0.001"], "--activation-margin"),
        ("penetration", ["--depth-correction", "-0.1"], "--depth-correction"),
        ("penetration", ["--depth-correction", "1.0"], "--depth-correction"),
    ],
)
def test_bad_input_is_refused_with_a_message(command, argv, words, capsys):
    """``python -m bcg.studies.contact_gradient`` and ``python -m bcg.studies.penetration`` exit 2 with a
    message."""
    from bcg.studies import penetration

    main = study.main if command == "study" else penetration.main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_estimator_study_on_clips_and_rollouts(tmp_path, capsys):
    """`python -m bcg.studies.estimator`: on Dance's frames the estimator's velocity beats taking
    the robot as still; on Jump's, whose retargeted feet skate, it does not (0.95 against 0.92 m/s
    when written). On a rollout in MuJoCo (here the hold policy for 0.6 s from standing, before it
    tips over) the errors are those of physical contact: the robot barely moves, so the velocity
    error is small and the height, from the lowest foot, within a centimetre."""
    from bcg.learn.policy import make_hold_policy
    from bcg.motion import MotionClip
    from bcg.studies import estimator

    dance = estimator.estimator_errors(MotionClip.load("dance"))
    jump = estimator.estimator_errors(MotionClip.load("jump"))
    assert dance["velocity_error_mean"] < 0.75 * dance["speed_mean"]
    assert jump["velocity_error_mean"] > 0.9 * jump["speed_mean"]
    assert 0 < dance["height_error_median"] < 0.015
    assert estimator.main(["dance"]) == 0 and "| dance | 0.37 / 1.20 | 0.54 |" in capsys.readouterr().out
    hold = make_hold_policy(tmp_path / "hold.h5", motion="dance")
    rollout = estimator.rollout_errors(str(hold), seconds=0.6)
    assert rollout["fell"] == 0.0 and rollout["seconds"] == 0.6
    assert rollout["velocity_error_mean"] < 0.2 and rollout["height_error_p95"] < 0.01
    assert estimator.main(["walk"]) == 2 and "no such motion file" in capsys.readouterr().err
    assert estimator.main(["--policy", str(tmp_path / "missing.h5")]) == 2
    with pytest.raises(SystemExit):
        estimator.main(["dance", "--policy", str(hold)])
