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
