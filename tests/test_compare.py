"""python -m bcg.learn.compare: early/late averages of training logs and their plot."""

import numpy as np
import pytest

from bcg.learn import compare
from bcg.learn.train import write_log


def _run(tmp_path, name, error, length):
    folder = tmp_path / name
    folder.mkdir()
    rows = [
        dict(iteration=i + 1, tracking_error_cm=e, episode_length=n, fall_rate=0.5, episode_return=-e,
             bcg_trigger_rate=0.1, time_iteration=2.0)
        for i, (e, n) in enumerate(zip(error, length, strict=True))
    ]  # fmt: skip
    write_log(folder / "log.csv", rows)
    return folder


def test_summary_and_plot(tmp_path, capsys):
    error = np.linspace(30.0, 20.0, 40)
    a = _run(tmp_path, "bcg", error, np.linspace(10, 50, 40))
    b = _run(tmp_path, "plain", error + 5.0, np.full(40, 12.0))
    s = compare.summary(compare.load_run(a), window=10)
    assert s["tracking_error_cm"][0] == pytest.approx(error[:10].mean())
    assert s["tracking_error_cm"][1] == pytest.approx(error[-10:].mean())
    out = tmp_path / "cmp.png"
    assert compare.main([str(a), str(b), "--window", "10", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tracking error" in text and "plain" in text and f"{error[-10:].mean():10.3f}" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_run_is_refused(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nowhere")]) == 2
    assert "no log.csv" in capsys.readouterr().err


def test_runs_with_the_same_folder_name_stay_apart(tmp_path, capsys):
    (tmp_path / "bcg").mkdir()
    (tmp_path / "plain").mkdir()
    a = _run(tmp_path / "bcg", "run", np.full(20, 30.0), np.full(20, 10.0))
    b = _run(tmp_path / "plain", "run", np.full(20, 40.0), np.full(20, 20.0))
    assert compare.run_labels([str(a), str(b)]) == ["bcg/run", "plain/run"]
    assert compare.main([str(a), str(b), "--window", "5", "--out", str(tmp_path / "cmp.png")]) == 0
    text = capsys.readouterr().out
    assert "bcg/run" in text and "plain/run" in text and f"{40.0:10.3f}" in text


def test_bad_arguments_are_refused_before_any_work(tmp_path, capsys):
    a = _run(tmp_path, "a", np.full(20, 30.0), np.full(20, 10.0))
    assert compare.main([str(a), str(a)]) == 2
    assert "more than once" in capsys.readouterr().err
    assert compare.main([str(a), "--out", str(tmp_path / "missing" / "cmp.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
