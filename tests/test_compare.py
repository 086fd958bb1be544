"""Paired comparison of MuJoCo validations (``python -m bcg.robot.compare``) on hand-made files."""

import json

import numpy as np
import pytest
from scipy.stats import wilcoxon

from bcg.robot import g1
from bcg.robot.compare import CompareError, load_validation, main, paired


def _write(path, steps, fell, seeds=None, policy="a.h5", seconds=10.0, motion_hash="abc"):
    seeds = list(range(len(steps))) if seeds is None else seeds
    runs = [{"seed": s, "start_time": 0.1 * s, "steps": n, "fell": f} for s, n, f in zip(seeds, steps, fell)]
    payload = {"policy": policy, "motion_hash": motion_hash, "config": {"seconds": seconds}, "runs": runs}
    path.write_text(json.dumps(payload))
    return path


def test_paired_difference_counts_and_wilcoxon():
    ref = np.array([1.0, 2.0, 3.0, 10.0, 4.0, 5.0])
    other = np.array([2.5, 2.0, 7.0, 10.0, 3.0, 9.0])
    p = paired(ref, other)
    assert (p.longer, p.equal, p.shorter) == (3, 2, 1)
    assert p.mean_difference_s == pytest.approx((1.5 + 4 - 1 + 4) / 6)
    assert p.p_value == pytest.approx(wilcoxon([1.5, 4.0, -1.0, 4.0]).pvalue)
    assert paired(ref, ref).p_value == 1.0


def test_command_prints_the_table_and_the_paired_figures(tmp_path, capsys):
    a = _write(tmp_path / "a.json", [100, 500, 30, 500], [True, False, True, False], policy="/x/base.h5")
    b = _write(tmp_path / "b.json", [300, 500, 60, 500], [True, False, True, False], policy="/x/clear.h5")
    assert main([str(a), str(b), "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "base" in out and "clear" in out
    assert f"{100 * g1.CONTROL_DT:.2f}*" in out  # a fall is starred
    assert "falls 2/4" in out and "longer from 2, equal from 2, shorter from 0 starts" in out
    assert f"{(200 + 30) * g1.CONTROL_DT / 4:+.2f} s on average" in out
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_validation(a).label == "base"


@pytest.mark.parametrize(
    "other, words",
    [
        ({"seeds": [0, 1, 2, 4]}, ["do not start from the same states"]),
        ({"seconds": 5.0}, ["5.0 s episodes"]),
        ({"motion_hash": "def"}, ["different motion clips"]),
    ],
)
def test_files_from_other_starts_are_refused(tmp_path, capsys, other, words):
    a = _write(tmp_path / "a.json", [1, 2, 3, 4], [True] * 4)
    b = _write(tmp_path / "b.json", [1, 2, 3, 4], [True] * 4, **other)
    assert main([str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and all(w in err for w in words) and "Traceback" not in err


def test_unreadable_files_are_refused(tmp_path, capsys):
    a = _write(tmp_path / "a.json", [1, 2], [True, True])
    bad = tmp_path / "bad.json"
    bad.write_text('{"runs": [{"seed": 0}]}')
    for args, word in (
        ([a, bad], "is not a validation written by python -m bcg.robot.sim2sim"),
        ([a, tmp_path / "missing.json"], "cannot read"),
        ([a], "two or more"),
    ):
        assert main([str(x) for x in args]) == 2
        assert word in capsys.readouterr().err
    with pytest.raises(CompareError, match="holds no runs"):
        load_validation(_write(tmp_path / "empty.json", [], []))
