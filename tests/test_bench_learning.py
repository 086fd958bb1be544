"""The learning benchmark's training command and its summary (benchmarks/bench_learning.py)."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_learning.py"
_SPEC = importlib.util.spec_from_file_location("bench_learning", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_default_runs_the_first_iterations_of_the_trainings_schedule():
    # the learning rates decay over the training's 3000 iterations, not over the benchmark's 100
    args = bench.parse_args(["--iterations", "100"])
    cmd = bench.train_command(1, Path("/tmp/x"), args)
    assert _flag(cmd, "--stop-after") == "100"
    assert _flag(cmd, "--iterations") is None
    assert _flag(cmd, "--seed") == "1"


def test_schedule_sets_the_decay_length():
    args = bench.parse_args(["--iterations", "100", "--schedule", "100", "--set", "env.alive_reward=0"])
    cmd = bench.train_command(0, Path("/tmp/x"), args)
    assert _flag(cmd, "--iterations") == "100"
    assert _flag(cmd, "--stop-after") == "100"
    assert _flag(cmd, "--set") == "env.alive_reward=0"


def test_schedule_shorter_than_the_run_is_a_usage_error():
    with pytest.raises(SystemExit):
        bench.parse_args(["--iterations", "100", "--schedule", "50"])


def test_summary_ratio_and_reward_figures():
    rows = [
        {"episode_length": str(30.0 if i < 25 else 60.0), "fall_rate": "1", "tracking_error_early_cm": "20",
         "reward": str(-1.0 if i < 10 else (0.5 if i != 40 else -0.1)), "wall_time": str(2.0 * i)}
        for i in range(60)
    ]  # fmt: skip
    out = bench.summarise(rows, 25)
    assert out["episode_length_first"] == 30.0
    assert out["episode_length_last"] == 60.0
    assert out["episode_length_ratio"] == 2.0
    assert out["negative_reward_fraction"] == pytest.approx(1 / 50)
    assert out["min_reward_after_10"] == pytest.approx(-0.1)
    assert out["seconds_per_iteration"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 50"):
        bench.summarise(rows[:40], 25)
