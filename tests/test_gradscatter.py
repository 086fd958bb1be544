"""The scatter of a training window's policy gradient over nearby start states
(`python -m bcg.studies.gradscatter`)."""

import numpy as np
import pytest

from bcg.studies import gradscatter
from tests.cli import run_module


def test_scatter_of_equal_and_of_noisy_gradients():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=50)
    same = gradscatter.scatter(np.tile(mean, (4, 1)), np.tile(mean[:6], (4, 1)))
    assert same["rel"] == 0.0 and same["nsr"] == 0.0
    np.testing.assert_allclose(same["cos"], 1.0)
    np.testing.assert_allclose(same["norm"], np.linalg.norm(mean))

    # g_k = m + e_k with the e_k summing to zero: the mean is m, the scatter |e| / |m| exactly
    e = rng.normal(size=(2, 50))
    e = np.concatenate([e, -e])
    g = mean + e
    s = gradscatter.scatter(g, g)
    expected = np.sqrt(np.mean(np.sum(e**2, axis=1))) / np.linalg.norm(mean)
    np.testing.assert_allclose(s["rel"], expected, rtol=1e-12)
    np.testing.assert_allclose(s["nsr"], np.sum(e**2) / 4 / np.sum(mean**2), rtol=1e-12)
    np.testing.assert_allclose(s["cos"], (g @ mean) / np.linalg.norm(g, axis=1) / np.linalg.norm(mean))
    with pytest.raises(ValueError, match="K >= 2"):
        gradscatter.scatter(mean[None])


def _value(stdout: str, name: str) -> float:
    line = next(line for line in stdout.splitlines() if line.startswith(name + "="))
    return float(line.split("=", 1)[1])


def test_repeated_windows_agree_and_moved_ones_do_not(tmp_path):
    """A real (small) G1 run, then the measurement on its checkpoint: with no offset the K windows
    are one window repeated (the learner restored between them), so their gradients agree to
    round-off; moved start states change them."""
    small = [
        "--envs", "4", "--iterations", "1", "--seed", "3", "--set", "horizon=4", "--set", "actor.hidden=16",
        "--set", "critic.hidden=16", "--set", "critic.iterations=2", "--set", "disc.hidden=16,8",
        "--set", "env.contact=false",
    ]  # fmt: skip
    out = run_module("bcg.learn.train", *small, "--out", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    args = ["--modes", "none", "gaussian", "--windows", "3"]
    still = run_module("bcg.studies.gradscatter", tmp_path / "run", *args, "--offset", "0")
    assert still.returncode == 0, still.stdout + still.stderr
    assert _value(still.stdout, "gradscatter_rel_none") < 1e-6
    assert _value(still.stdout, "gradscatter_nsr_none") < 1e-10
    assert "eta" in still.stderr
    assert "gaussian: skipped, the simulator has no contact" in still.stderr  # no bundles to measure
    assert "gradscatter_rel_gaussian" not in still.stdout
    moved = run_module(
        "bcg.studies.gradscatter", tmp_path / "run", *args, "--offset", "0.01", "--plot", tmp_path / "s.png"
    )
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert _value(moved.stdout, "gradscatter_rel_none") > 1e-4
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_module("bcg.studies.gradscatter", tmp_path / "run", "--windows", "1")
    assert bad.returncode == 2 and "at least 2" in bad.stderr
    resized = run_module("bcg.studies.gradscatter", tmp_path / "run", "--set", "num_envs=8")
    assert resized.returncode == 2 and "num_envs (checkpoint 4, now 8) cannot change" in resized.stderr
    missing = run_module("bcg.studies.gradscatter", tmp_path / "nothing")
    assert missing.returncode == 2 and "cannot measure" in missing.stderr, missing.stderr
