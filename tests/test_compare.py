"""Paired comparison of MuJoCo validations (``python -m bcg.validate.compare``) on hand-made files."""

import json

import numpy as np
import pytest
from scipy.stats import wilcoxon

from bcg.core import g1
from bcg.validate.compare import CompareError, load_validation, main, paired

NOISE = {"joint_position": 0.1, "root_height": 0.02}


def _write(path, steps, fell, seeds=None, policy="a.h5", seconds=10.0, motion_hash="abc", reset_noise=NOISE):
    seeds = list(range(len(steps))) if seeds is None else seeds
    runs = [{"seed": s, "start_time": 0.1 * s, "steps": n, "fell": f} for s, n, f in zip(seeds, steps, fell)]
    payload = {"policy": policy, "motion_hash": motion_hash, "config": {"seconds": seconds}, "runs": runs,
               "reset_noise": reset_noise}  # fmt: skip
    path.write_text(json.dumps(payload))
    return path


def test_paired_difference_counts_and_wilcoxon():
    ref = np.array([50, 100, 150, 500, 200, 250])
    other = np.array([125, 100, 350, 500, 150, 450])
    p = paired(ref, other)
    assert (p.longer, p.equal, p.shorter, p.tested) == (3, 2, 1, 4)
    assert p.mean_difference_s == pytest.approx((75 + 200 - 50 + 200) / 6 * g1.CONTROL_DT)
    assert p.p_value == pytest.approx(wilcoxon([75, 200, -50, 200]).pvalue)
    assert paired(ref, ref).p_value == 1.0


def test_equal_differences_tie_in_the_signed_rank_test():
    """Times in seconds (steps × 0.02) do not subtract to equal floats; the ranks come from whole
    steps, so differences of 10, 20 and 5 steps each tie as they should."""
    ref = np.array([425, 318, 256, 135, 154, 21, 38, 9])
    other = np.array([415, 338, 251, 155, 159, 16, 58, 4])
    assert paired(ref, other).p_value == pytest.approx(wilcoxon(other - ref).pvalue)
    assert paired(ref, other).p_value == pytest.approx(0.523, abs=1e-3)


def test_command_prints_the_table_and_the_paired_figures(tmp_path, capsys):
    a = _write(tmp_path / "a.json", [100, 500, 30, 500], [True, False, True, False], policy="/x/base.h5")
    b = _write(tmp_path / "b.json", [300, 500, 60, 500], [True, False, True, False], policy="/x/clear.h5")
    assert main([str(a), str(b), "--plot", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "base" in out and "clear" in out
    assert f"{100 * g1.CONTROL_DT:.2f}*" in out  # a fall is starred
    assert "falls 2/4" in out and "longer from 2, equal from 2, shorter from 0 starts" in out
    assert f"{(200 + 30) * g1.CONTROL_DT / 4:+.2f} s on average" in out
    assert "Wilcoxon p = 0.5 over 2 starts (with 2 starts p cannot fall below 0.5)" in out
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_validation(a).label == "base"


@pytest.mark.parametrize(
    "other, words",
    [
        ({"seeds": [0, 1, 2, 4]}, ["do not start from the same states"]),
        ({"seconds": 5.0}, ["5.0 s episodes"]),
        ({"motion_hash": "def"}, ["different motion clips"]),
        ({"reset_noise": None}, ["different reset noise", "--no-reset-noise"]),
        ({"reset_noise": {**NOISE, "root_height": 0.05}}, ["different reset noise"]),
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
        ([a, bad], "is not a validation written by python -m bcg.validate.sim2sim"),
        ([a, tmp_path / "missing.json"], "cannot read"),
        ([a], "two or more"),
    ):
        assert main([str(x) for x in args]) == 2
        assert word in capsys.readouterr().err
    with pytest.raises(CompareError, match="holds no runs"):
        load_validation(_write(tmp_path / "empty.json", [], []))


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("config", [1], "'config' is not an object"),
        ("policy", 3, "'policy' not a path"),
        ("reset_noise", "yes", "'reset_noise' is not an object"),
        ("steps", float("nan"), "not a whole number"),
        ("steps", -1, "not a whole number"),
        ("steps", 2.5, "not a whole number"),
        ("fell", "false", "'fell' is not true or false"),
    ],
)
def test_malformed_fields_are_refused_without_a_traceback(tmp_path, capsys, field, value, words):
    a = _write(tmp_path / "a.json", [1, 2], [True, True])
    payload = json.loads(a.read_text())
    if field in ("steps", "fell"):
        payload["runs"][1][field] = value
    else:
        payload[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(payload))
    assert main([str(a), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err


def test_files_of_one_name_in_other_folders_are_told_apart(tmp_path, capsys):
    (tmp_path / "base").mkdir()
    (tmp_path / "clear").mkdir()
    a = _write(tmp_path / "base" / "val.json", [1, 2], [True, True], policy=None)
    b = _write(tmp_path / "clear" / "val.json", [3, 2], [True, True], policy=None)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "base/val" in out and "clear/val" in out and "over 1 starts" in out
