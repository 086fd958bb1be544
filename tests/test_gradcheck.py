"""The end-to-end policy-gradient check (`python -m bcg.learn.gradcheck`)."""

import copy

import h5py
import numpy as np
import pytest

from bcg.learn import gradcheck
from tests.cli import run_module


class _Quadratic:
    """A stand-in learner: L(θ) = Σ c·θ² + sin(θ), with the right gradient or a wrong one."""

    def __init__(self, wrong: bool):
        rng = np.random.default_rng(0)
        self.actor = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4)}
        self.wrong = wrong
        self.calls = 0

    def state_dict(self):
        return {"actor": copy.deepcopy(self.actor)}

    def load_state_dict(self, d):
        self.actor = copy.deepcopy(d["actor"])

    def iteration_step(self, update=True):
        assert not update
        self.calls += 1
        loss = sum(float(np.sum(0.5 * v**2 + np.sin(v))) for v in self.actor.values())
        grads = {k: v + np.cos(v) for k, v in self.actor.items()}
        if self.wrong:
            grads["b"] = -grads["b"]  # a sign error in one layer's adjoint
        return {"actor_loss": loss, "actor_grads": grads}


@pytest.mark.parametrize("wrong", [False, True])
def test_check_finds_a_wrong_gradient_and_restores_the_learner(wrong):
    learner = _Quadratic(wrong)
    before = copy.deepcopy(learner.actor)
    result = gradcheck.check(learner, [1e-5, 1e-3])
    ratio = result["rows"][0][4]
    assert learner.calls == 5
    assert (abs(ratio - 1) > 0.1) if wrong else (abs(ratio - 1) < 1e-6)
    for k in before:
        np.testing.assert_array_equal(learner.actor[k], before[k])
    assert "ratio" in gradcheck.format_report(result)


CONTACT = [
    "--set",
    "env.contact=true",
    "--set",
    "env.bcg_threshold=100",
    "--set",
    "env.bcg_common_noise=true",
]


@pytest.mark.parametrize("contact", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_gradient_of_a_training_window_agrees_with_its_loss(tmp_path, contact):
    """A real (small) G1 run: one iteration, then the check on its checkpoint; with contact, bundles
    open (threshold lowered) and draw common noise."""
    small = [
        "--envs", "4", "--iterations", "1", "--seed", "7", "--set", "horizon=4", "--set", "actor.hidden=16",
        "--set", "critic.hidden=16", "--set", "critic.iterations=2", "--set", "disc.hidden=16,8",
        *(CONTACT if contact else ["--set", "env.contact=false"]),
    ]  # fmt: skip
    out = run_module("bcg.learn.train", *small, "--out", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    if contact:
        log = (tmp_path / "run" / "log.csv").read_text().splitlines()
        rate = float(log[1].split(",")[log[0].split(",").index("bcg_trigger_rate")])
        assert rate > 0, "the check should run through bundles"
    check = run_module(
        "bcg.learn.gradcheck", tmp_path / "run", "--alphas", "1e-3", "1e-2", "--tolerance", "0.02"
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "agrees" in check.stdout and "eta" in check.stderr
    missing = run_module("bcg.learn.gradcheck", tmp_path / "nothing")
    assert missing.returncode == 2 and "cannot check" in missing.stderr
    with h5py.File(tmp_path / "run" / "checkpoint.h5", "r+") as f:
        f.attrs["motion_hash"] = "0" * 64  # as if the clip had changed since
    changed = run_module("bcg.learn.gradcheck", tmp_path / "run")
    assert changed.returncode == 2 and "changed since the checkpoint" in changed.stderr, changed.stderr
