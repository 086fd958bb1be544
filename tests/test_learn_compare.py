"""``python -m bcg.learn.compare`` on hand-made run folders: curves against iterations, environment
samples (iterations × environments × horizon) and wall-clock time."""

import json

import numpy as np
import pytest

from bcg.learn.compare import load_run, main, samples_per_iteration, x_values
from bcg.learn.runlog import LOG_COLUMNS, append_log


def _run(folder, iterations, num_envs, horizon, seconds_per_iteration, algo=None):
    folder.mkdir()
    config = {"num_envs": num_envs, "horizon": horizon} | ({"algo": algo} if algo else {})
    (folder / "config.json").write_text(json.dumps({"config": config}))
    for i in range(1, iterations + 1):
        row = {c: 0.0 for c in LOG_COLUMNS} | {
            "iteration": i,
            "wall_time": i * seconds_per_iteration,
            "episode_length": 20.0 + i,
        }
        append_log(folder / "log.csv", row)
    return folder


def test_samples_are_iterations_times_envs_times_horizon(tmp_path):
    shac = _run(tmp_path / "shac", 4, 64, 32, 2.5)
    ppo = _run(tmp_path / "ppo", 3, 256, 24, 10.0, algo="ppo")
    assert samples_per_iteration(shac) == 2048
    assert samples_per_iteration(ppo / "log.csv") == 6144
    cols = load_run(ppo)
    np.testing.assert_array_equal(x_values(cols, "samples", 6144), [6144, 12288, 18432])
    np.testing.assert_array_equal(x_values(cols, "seconds"), [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(x_values(cols, "iteration"), [1, 2, 3])


def test_a_run_without_its_config_is_refused_for_samples(tmp_path, capsys):
    run = _run(tmp_path / "r", 2, 8, 4, 1.0)
    (run / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="num_envs and horizon"):
        samples_per_iteration(run)
    assert main([str(run), "--x", "samples", "--out", str(tmp_path / "c.png")]) == 2
    assert "num_envs and horizon" in capsys.readouterr().err
    # the iteration axis needs no config
    assert main([str(run), "--out", str(tmp_path / "c.png")]) == 0


def test_the_command_plots_against_samples(tmp_path, capsys):
    shac = _run(tmp_path / "shac", 6, 64, 32, 2.5)
    ppo = _run(tmp_path / "ppo", 6, 256, 24, 10.0, algo="ppo")
    out = tmp_path / "cmp.png"
    assert main([str(shac), str(ppo), "--x", "samples", "--window", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.stat().st_size > 0
    lines = [line for line in text.splitlines() if "environment samples at the end" in line]
    assert [line.split()[0] for line in lines] == ["shac", "ppo"]
    assert [float(line.split()[-1]) for line in lines] == [6 * 2048, 6 * 6144]
