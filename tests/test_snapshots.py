"""A run's policy snapshots in MuJoCo: every snapshot played as sim2sim plays it, in iteration order,
cached so that a second call plays only what is new, and bad folders refused with exit status 2."""

import json
import os

import numpy as np
import pytest

from bcg.learn.policy import load_policy, make_hold_policy
from bcg.validate import snapshots as cli
from bcg.validate.sim2sim import EvalConfig, evaluate_policy, summarize

SHORT = ["--runs", "1", "--seconds", "0.2"]


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "run_k300_s0"
    folder.mkdir()
    for it in (1000, 50, 250):
        make_hold_policy(folder / f"policy_it{it}.h5", motion="run", seed=it)
    make_hold_policy(folder / "policy.h5", motion="run")  # the final policy is not a snapshot
    (folder / "policy_itlast.h5").write_bytes(b"x")  # nor a name without a number
    return folder


def test_snapshots_are_played_in_iteration_order_as_sim2sim_plays_them(run_dir, tmp_path, capsys):
    out, plot = tmp_path / "snapshots.md", tmp_path / "snapshots.png"
    assert cli.main([str(run_dir), *SHORT, "--out", str(out), "--plot", str(plot)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == [50, 250, 1000]  # by number, not by name
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (cache,) = json.loads((run_dir / cli.CACHE).read_text())["evaluations"]
    assert sorted(cache["policies"]) == ["policy_it1000.h5", "policy_it250.h5", "policy_it50.h5"]
    # each summary is the one sim2sim's evaluation of that file gives
    config = EvalConfig(runs=1, seconds=0.2, training_sim="off")
    direct = summarize(evaluate_policy(load_policy(run_dir / "policy_it250.h5"), config, progress=None)[0])
    stored = cache["policies"]["policy_it250.h5"]["summary"]
    assert stored["falls"] == direct["falls"]
    assert stored["e_track_cm"]["mean"] == pytest.approx(direct["e_track_cm"]["mean"], rel=1e-9)
    assert f"{direct['e_track_cm']['mean']:.1f} ± " in rows[1]


def test_a_second_call_plays_only_new_or_changed_snapshots(run_dir):
    config = EvalConfig(runs=1, seconds=0.2, training_sim="off")
    played = []
    cli.evaluate_run(run_dir, config, progress=played.append)
    assert len(played) == 3
    played.clear()
    first = cli.evaluate_run(run_dir, config, progress=played.append)
    assert played == []  # all from the cache
    make_hold_policy(run_dir / "policy_it1250.h5", motion="run")
    path = run_dir / "policy_it250.h5"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a snapshot rewritten
    again = cli.evaluate_run(run_dir, config, progress=played.append)
    assert sorted(p.split()[1] for p in played) == ["policy_it1250.h5", "policy_it250.h5"]
    assert [r["iteration"] for r in again] == [50, 250, 1000, 1250]
    assert again[0] == first[0]
    # other settings: nothing of the cache applies
    played.clear()
    later = cli.evaluate_run(
        run_dir, EvalConfig(runs=1, seconds=0.2, seed=7, training_sim="off"), 250, played.append
    )
    assert [r["iteration"] for r in later] == [250, 1000, 1250] and len(played) == 3


def test_a_damaged_cache_is_played_again_not_an_error(run_dir):
    (run_dir / cli.CACHE).write_text("{not json")
    rows = cli.evaluate_run(run_dir, EvalConfig(runs=1, seconds=0.2, training_sim="off"), progress=None)
    assert len(rows) == 3 and all(np.isfinite(r["e_track_cm"]["mean"]) for r in rows)
    assert json.loads((run_dir / cli.CACHE).read_text())["evaluations"][0]["policies"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such folder"),
        ("empty", "no policy snapshots"),
        ("twice", "given twice"),
        ("late", "from iteration 5000"),
        ("out", "does not exist"),
        ("start", "leaves no room"),
    ],
)
def test_bad_folders_exit_2_with_a_message(case, message, run_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = {
        "missing": [str(tmp_path / "nothing")],
        "empty": [str(empty)],
        "twice": [str(run_dir), str(run_dir / ".." / run_dir.name)],
        "late": [str(run_dir), "--from", "5000"],
        "out": [str(run_dir), "--plot", str(tmp_path / "no" / "plot.png")],
        "start": [str(run_dir), "--start-time", "100"],  # past the clip's end
    }[case]
    assert cli.main(argv + SHORT) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (run_dir / cli.CACHE).exists()  # refused before anything was played


def test_a_fixed_start_is_kept_beside_the_random_starts(run_dir, capsys):
    """``--start-time`` plays every snapshot from one clip time, as sim2sim's ``--start-time`` does,
    and its summaries go into the cache beside the random starts', which a later call still finds."""
    assert cli.main([str(run_dir), *SHORT]) == 0
    random_cache = json.loads((run_dir / cli.CACHE).read_text())["evaluations"]
    assert cli.main([str(run_dir), *SHORT, "--start-time", "10"]) == 0
    assert "Starts at clip time 10 s." in capsys.readouterr().out
    blocks = json.loads((run_dir / cli.CACHE).read_text())["evaluations"]
    assert [b["settings"]["start_time"] for b in blocks] == [None, 10.0]
    assert blocks[0] == random_cache[0]  # the random starts' evaluation is untouched
    direct = summarize(
        evaluate_policy(
            load_policy(run_dir / "policy_it50.h5"),
            EvalConfig(runs=1, seconds=0.2, start_time=10.0, training_sim="off"),
            progress=None,
        )[0]
    )
    fixed = blocks[1]["policies"]["policy_it50.h5"]["summary"]["e_track_cm"]["mean"]
    assert fixed == pytest.approx(direct["e_track_cm"]["mean"], rel=1e-9)
    # a start 10 s into the clip is another episode than seed 0's random start
    assert fixed != blocks[0]["policies"]["policy_it50.h5"]["summary"]["e_track_cm"]["mean"]
    played = []
    cli.evaluate_run(run_dir, EvalConfig(runs=1, seconds=0.2, training_sim="off"), progress=played.append)
    assert played == []  # both settings now come from the cache


def test_a_cache_of_one_evaluation_is_still_read(run_dir):
    """A ``snapshots.json`` written before several settings were kept holds one evaluation at its top
    level; it is read, not played again, and kept when another setting is added."""
    config = EvalConfig(runs=1, seconds=0.2, training_sim="off")
    cli.evaluate_run(run_dir, config, progress=None)
    (block,) = json.loads((run_dir / cli.CACHE).read_text())["evaluations"]
    (run_dir / cli.CACHE).write_text(json.dumps(block))  # the old form
    played = []
    cli.evaluate_run(run_dir, config, progress=played.append)
    assert played == []
    cli.evaluate_run(run_dir, EvalConfig(runs=1, seconds=0.2, seed=3, training_sim="off"), progress=None)
    blocks = json.loads((run_dir / cli.CACHE).read_text())["evaluations"]
    assert [b["settings"]["seed"] for b in blocks] == [0, 3] and blocks[0] == block
