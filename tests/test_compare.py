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
