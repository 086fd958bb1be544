"""Evaluate a training run's policy snapshots in MuJoCo: its learning curve where the policy is judged.

Usage::

    python -m bcg.validate.snapshots RUN_DIR [RUN_DIR ...] [--runs 10] [--seconds 10] [--seed 0]
        [--start-time S] [--start reference|standing] [--training-sim off] [--from N]
        [--plot snapshots.png] [--out snapshots.md]

Every ``policy_it<N>.h5`` a run folder holds (``--set policy_every=N`` in training) is played as
:mod:`bcg.validate.sim2sim` plays one policy (the same starts, seeds, contact, reset noise and metrics,
taken from the policy's stored training config). The training's own curves say how the policy does in
the simulator it learns in; these say how it does where it is judged, which is what decides when a
run has a policy worth keeping.

``--start-time S`` starts every run at one clip time, to follow a segment a line of snapshots fails
on (for example ``--start-time 10 --runs 3 --seconds 3``), and ``--start standing`` from rest, as
the robot starts.

Each folder's evaluations are kept in ``RUN_DIR/snapshots.json``, keyed by the evaluation's settings
(one entry per set of settings, so a check from a fixed start does not discard the random starts')
and each file's size and modification time, so calling the command again while the run goes on plays
only the snapshots that are new. It prints one table per run and writes, when asked, the tables as
Markdown and a plot of falls and tracking error over the iterations of every run given.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

from bcg.core.atomic import write_figure_png  # noqa: E402
from bcg.learn.policy import load_policy  # noqa: E402
from bcg.learn.runfolder import SNAPSHOTS  # noqa: E402
from bcg.validate import sim2sim  # noqa: E402
from bcg.validate.mujoco_runner import EvaluationError  # noqa: E402
from bcg.validate.sim2sim import EvalConfig  # noqa: E402

CACHE = "snapshots.json"


def snapshot_files(folder: Path, first: int = 0) -> list[tuple[int, Path]]:
    """The folder's ``policy_it<N>.h5`` files with N >= ``first``, by N (not by name: 1000 after 250)."""
    found = []
    for path in folder.glob(SNAPSHOTS):
        number = path.stem.removeprefix("policy_it")
        if number.isdigit() and int(number) >= first:
            found.append((int(number), path))
    return sorted(found)


def _stamp(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _read_evaluations(path: Path) -> list[dict]:
    """Every cached evaluation, ``[{"settings": ..., "policies": {file name: entry}}, ...]``; [] when
    there are none or the file cannot be read (it is rewritten, so a damaged cache costs a
    re-evaluation, nothing else). A cache of one evaluation, the form before several were kept, is
    read as a list of one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if isinstance(data, dict) and "evaluations" not in data:
        data = {"evaluations": [data]}
    blocks = data.get("evaluations") if isinstance(data, dict) else None
    if not isinstance(blocks, list):
        return []
    return [
        b for b in blocks
        if isinstance(b, dict) and isinstance(b.get("settings"), dict) and isinstance(b.get("policies"), dict)
    ]  # fmt: skip


def evaluate_run(folder: Path, config: EvalConfig, first: int = 0, progress=print) -> list[dict]:
    """Summaries (:func:`bcg.validate.sim2sim.summarize`) of the folder's snapshots, each with its
    ``iteration`` and ``file``; new or changed snapshots are evaluated, the rest come from the cache."""
    if not folder.is_dir():
        raise EvaluationError(f"{folder}: no such folder")
    files = snapshot_files(folder, first)
    if not files:
        raise EvaluationError(
            f"{folder}: no policy snapshots (policy_it<N>.h5) there"
            + (f" from iteration {first}" if first else "")
            + "; a training writes them with --set policy_every=N"
        )
    settings = asdict(config)
    cache_path = folder / CACHE
    # read once: the other settings' evaluations are written back as they were, this one's grows
    evaluations = _read_evaluations(cache_path)
    others = [b for b in evaluations if b["settings"] != settings]
    cached = next((b["policies"] for b in evaluations if b["settings"] == settings), {})
    # stamped before reading: a file replaced meanwhile is evaluated again next time
    stamps = {path.name: _stamp(path) for _, path in files}
    todo = sum(1 for name, stamp in stamps.items() if cached.get(name, {}).get("stamp") != stamp)
    rows, began, played = [], time.perf_counter(), 0
    for iteration, path in files:
        entry, stamp = cached.get(path.name), stamps[path.name]
        if entry is None or entry.get("stamp") != stamp:
            policy = load_policy(path)
            results, _, _ = sim2sim.evaluate_policy(policy, config, progress=None)
            entry = {"iteration": iteration, "stamp": stamp, "summary": sim2sim.summarize(results)}
            cached[path.name] = entry
            played += 1
            elapsed = time.perf_counter() - began
            eta = elapsed / played * (todo - played)
            if progress:
                progress(
                    f"{folder.name}: {path.name} {entry['summary']['falls']}/{config.runs} falls, "
                    f"E_track {entry['summary']['e_track_cm']['mean']:.1f} cm "
                    f"[{played}/{todo}, {played / elapsed:.2f} files/s, ETA {eta:.0f} s]"
                )
            # written after every file: an interrupted call keeps what it has played
            sim2sim.write_json(
                cache_path, {"evaluations": [*others, {"settings": settings, "policies": cached}]}
            )
        rows.append({"iteration": iteration, "file": path.name, **entry["summary"]})
    return rows


def _ms(stat: dict | None, digits: int = 1) -> str:
    if not stat or stat.get("mean") is None or stat["mean"] != stat["mean"]:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def table_markdown(name: str, rows: list[dict], runs: int, starts: str = "") -> str:
    """One run's snapshots as a Markdown table, under a line saying where the runs start."""
    with_dd = any("delta_d_mm" in r for r in rows)
    head = ["iteration", "falls", "E_track global [cm]", "root-relative [cm]", "path covered"]
    head += ["largest heading error [deg]"] + (["Δd [mm]"] if with_dd else [])
    head += ["clip times of the falls [s]"]
    lines = [f"### {name}", ""] + ([starts.capitalize() + ".", ""] if starts else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        times = r.get("fall_clip_times_s") or []
        cells = [
            str(r["iteration"]),
            f"{r['falls']}/{runs}",
            _ms(r.get("e_track_cm")),
            _ms(r.get("e_track_root_cm")),
            _ms(r.get("path_ratio"), 2),
            _ms(r.get("heading_error_max_deg"), 0),
        ]
        if with_dd:
            cells.append(_ms(r.get("delta_d_mm"), 2))
        cells.append(f"{min(times):.1f}-{max(times):.1f}" if times else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _starts(config: EvalConfig) -> str:
    """Where the runs start, in words, for the tables and the plot's title."""
    if config.start == "standing":
        return f"standing at clip time {config.start_time or 0:g} s"
    if config.start_time is None:
        return "starts at random clip times"
    return f"starts at clip time {config.start_time:g} s"


def write_plot(path: Path, runs: dict[str, list[dict]], config: EvalConfig) -> None:
    """Falls and world-frame E_track (root-relative dashed) over the iterations, one colour per run."""
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, (ax_f, ax_e) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for i, (name, rows) in enumerate(runs.items()):
        # past ten runs the colours repeat; the marker tells the repeats apart
        colour, marker = f"C{i % 10}", "osD^v"[(i // 10) % 5]
        its = [r["iteration"] for r in rows]
        ax_f.plot(its, [r["falls"] for r in rows], marker + "-", color=colour, label=name)
        ax_e.plot(its, [r["e_track_cm"]["mean"] for r in rows], marker + "-", color=colour)
        ax_e.plot(its, [r["e_track_root_cm"]["mean"] for r in rows], "--", color=colour, alpha=0.7)
    ax_f.set_ylabel(f"falls in {config.runs} MuJoCo runs")
    ax_f.set_ylim(-0.3, config.runs + 0.3)
    ax_f.legend(fontsize=7)
    ax_e.set_ylabel("E_track [cm] (dashed: root-relative)")
    ax_e.set_yscale("log")
    ax_e.set_xlabel("training iteration")
    fig.suptitle(
        f"policy snapshots in MuJoCo: {config.runs} runs of {config.seconds:g} s from seeds "
        f"{config.seed}-{config.seed + config.runs - 1}, {_starts(config)}",
        fontsize=9,
    )
    write_figure_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bcg.validate.snapshots",
        description="Evaluate the policy snapshots of training runs in MuJoCo, as sim2sim does, "
        "and print (and plot) falls and tracking error over the iterations.",
    )
    p.add_argument("runs_", nargs="+", type=Path, metavar="RUN_DIR", help="training run folders")
    p.add_argument("--runs", type=int, default=10, help="MuJoCo runs per snapshot (default 10)")
    p.add_argument("--seconds", type=float, default=EvalConfig.seconds)
    p.add_argument("--seed", type=int, default=EvalConfig.seed)
    p.add_argument(
        "--start-time", type=float, default=None, metavar="S",
        help="start every run at this clip time (s) instead of a random one, as sim2sim does",
    )  # fmt: skip
    p.add_argument(
        "--start", choices=("reference", "standing"), default="reference",
        help="start state: the reference's (default) or standing still, as the robot starts",
    )  # fmt: skip
    p.add_argument(
        "--training-sim", choices=("on", "off"), default="off",
        help="replay each run in bcg.sim too, for Δd (slower; default off)",
    )  # fmt: skip
    p.add_argument(
        "--from", dest="first", type=int, default=0, metavar="N", help="only snapshots from iteration N"
    )
    p.add_argument("--out", type=Path, help="write the tables as Markdown")
    p.add_argument("--plot", type=Path, help="write a PNG of falls and E_track over the iterations")
    args = p.parse_args(argv)
    return sim2sim.exit_status(lambda: run(args))


def run(args) -> dict[str, list[dict]]:
    """The command's work on its parsed arguments: each run's rows, by the name its table has."""
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None and not path.resolve().parent.is_dir():
            raise EvaluationError(f"{flag} {path}: folder {path.resolve().parent} does not exist")
    config = EvalConfig(
        runs=args.runs, seconds=args.seconds, seed=args.seed, start_time=args.start_time,
        start=args.start, training_sim=args.training_sim,
    )  # fmt: skip
    folders = [f.resolve() for f in args.runs_]
    if len(set(folders)) != len(folders):
        raise EvaluationError("a run folder is given twice")
    # a run is named by its folder, or by its whole path where two folders share a name
    short = [f.name for f in folders]
    names = [n if short.count(n) == 1 else str(f) for n, f in zip(short, folders)]
    results = {name: evaluate_run(folder, config, args.first) for name, folder in zip(names, folders)}
    text = "\n".join(
        table_markdown(name, rows, config.runs, _starts(config)) for name, rows in results.items()
    )
    print(text)
    for path, write in (
        (args.out, lambda p: sim2sim.write_text(p, text)),
        (args.plot, lambda p: write_plot(p, results, config)),
    ):
        if path is not None:
            write(path)
            print(f"wrote {path}")
    return results


if __name__ == "__main__":
    sys.exit(main())
