"""Open-loop episode lengths (`python -m bcg.studies.openloop`)."""

import numpy as np

from bcg.studies import openloop
from tests.cli import run_module


def test_open_loop_episodes_end_inside_the_windows(ti64):
    """Four environments over two windows: every ended episode is 1-64 steps long, and a = 0 (no
    exploration noise) ends the same episodes when run twice."""
    zero = openloop.episode_lengths("run", "zero", windows=2, envs=4, seed=0)
    assert len(zero) > 0 and np.all((zero >= 1) & (zero <= 64))
    assert np.array_equal(zero, openloop.episode_lengths("run", "zero", windows=2, envs=4, seed=0))


def test_an_unknown_motion_is_a_usage_error():
    res = run_module("bcg.studies.openloop", "--motion", "walk")
    assert res.returncode == 2
    assert "walk.h5: no such motion file" in res.stderr and "Traceback" not in res.stderr


def test_a_policy_that_outputs_zero_is_the_zero_rule(ti64, tmp_path):
    """The policy rule with σ = 0 and a policy whose actor outputs exactly zero ends the same
    episodes as the open-loop ``zero`` rule; its falls are among the ended episodes and its live
    steps cover them."""
    from bcg.learn.policy import load_policy, make_hold_policy

    hold = load_policy(make_hold_policy(tmp_path / "hold.h5", motion="run"))
    lengths, falls, live = openloop.policy_episodes(hold, 0.0, windows=2, envs=4, seed=0)
    assert np.array_equal(lengths, openloop.episode_lengths("run", "zero", windows=2, envs=4, seed=0))
    assert 0 < falls <= len(lengths) and live >= lengths.sum() - 0.5


def test_policy_usage_errors(tmp_path):
    res = run_module("bcg.studies.openloop", "--policy", str(tmp_path / "missing.h5"))
    assert res.returncode == 2 and "missing.h5" in res.stderr and "Traceback" not in res.stderr
    res = run_module("bcg.studies.openloop", "--policy", "policies/run_k300.h5", "--sigma", "0,-1")
    assert res.returncode == 2 and "--sigma" in res.stderr and "Traceback" not in res.stderr
