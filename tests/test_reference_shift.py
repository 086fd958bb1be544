"""A step in the reference's position, in MuJoCo (bcg.studies.reference_shift)."""

from pathlib import Path

import numpy as np
import pytest

from bcg.learn.policy import make_hold_policy
from bcg.robot.run import load_checked
from bcg.studies import reference_shift

POLICIES = Path(__file__).resolve().parents[1] / "policies"


def test_a_policy_that_ignores_its_observation_does_not_follow(tmp_path):
    """The hold policy's actions do not depend on the observation: the shifted runs are the
    unshifted ones, step for step, so nothing of the shift is followed (0.5 s after it, before
    the hold tips over)."""
    policy, clip = load_checked(str(make_hold_policy(tmp_path / "hold.h5", motion="dance")))
    fractions, falls = reference_shift.followed(policy, clip, 0.2, 0.1, 0.7, runs=1, seed=0, every=0.5)
    for d, f in fractions.items():
        assert f.shape == (1, 1) and f[0, 0] == 0.0, d
    assert falls["+x"] == falls["none"]


def test_the_shipped_jump_follows_a_moved_reference():
    """Jump's policy moves its root after a reference moved 0.2 m: on average over the four directions more
    than 0.6 of it within 2 s (all of it in 2-3 s over five runs, where Fight's follows a third), and
    some of it in every direction within 3 s."""
    policy, clip = load_checked(str(POLICIES / "jump_k300.h5"))
    fractions, falls = reference_shift.followed(policy, clip, 0.2, after=1.0, seconds=4.0, runs=1, seed=0)
    assert sum(falls.values()) == 0
    at_2s = np.mean([f[0, 1] for f in fractions.values()])
    assert at_2s > 0.6, fractions
    assert all(f[0, 2] > 0.3 for f in fractions.values()), fractions


def test_usage_errors(capsys):
    with pytest.raises(SystemExit):
        reference_shift.main([str(POLICIES / "jump_k300.h5"), "--shift", "0"])
    assert "--shift" in capsys.readouterr().err
    assert reference_shift.main([str(POLICIES / "missing.h5")]) == 2
    assert "missing.h5" in capsys.readouterr().err


def test_the_command_prints_a_table_per_policy_and_draws_the_plot(tmp_path, capsys):
    out = tmp_path / "shift.png"
    jump = str(POLICIES / "jump_k300.h5")
    args = [jump, jump, "--runs", "1", "--after", "0.5", "--seconds", "2", "--plot", str(out)]
    assert reference_shift.main(args) == 0
    text = capsys.readouterr().out
    assert text.count("| 1 | ") == 2 and "| 2 | " not in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_gain_of_one_is_the_policy_as_trained(tmp_path):
    """Gain 1 plays the policy unchanged (the sim2sim episode, step for step); the hold policy ignores
    its observation, so every gain gives it the same runs."""
    from bcg.validate import mujoco_runner as mr
    from bcg.validate.metrics import tracking_errors

    policy, clip = load_checked(str(POLICIES / "jump_k300.h5"))
    sweep = reference_shift.gain_sweep(policy, clip, [1.0], seconds=1.0, runs=1, seed=3)
    backend = mr.MujocoG1(mr.PDParams.from_policy(policy))
    noise = mr.ResetNoise.of_training(policy.config)
    start = mr.initial_state(clip, backend.model, np.random.default_rng(3), 1.0, noise)
    ep = mr.run_episode(backend, mr.PolicyActions(policy), clip, start, 50)
    assert sweep[1.0][1][0] == tracking_errors(ep.points, ep.ref_points)[0]
    hold, hclip = load_checked(str(make_hold_policy(tmp_path / "hold.h5", motion="dance")))
    flat = reference_shift.gain_sweep(hold, hclip, [0.0, 1.0, 3.0], seconds=0.5, runs=1, seed=0)
    assert len({float(e[0]) for _, e in flat.values()}) == 1


def test_bad_gains_are_usage_errors(capsys):
    with pytest.raises(SystemExit):
        reference_shift.main([str(POLICIES / "jump_k300.h5"), "--gains", "1,x"])
    assert "--gains" in capsys.readouterr().err
