"""Evaluate a folder of policies in MuJoCo and write the paper's two validation tables.

Usage::

    python -m bcg.validate.sweep DIR [--runs 5] [--seconds 10] [--out DIR/validation.md]

Every ``*.h5`` policy file in DIR (and its immediate subfolders) is read; each is identified by the
contact stiffness kappa and the motion stored in it. The grid is kappa in {50, 100, 300} times the four
motions (Run, Jump, Fight, Dance); a missing cell is shown as "–", a second file for the same cell is
reported and ignored. Each policy is evaluated as :mod:`bcg.validate.sim2sim` does (same runs, seeds and
metrics). The output is Markdown with two tables, our value first and the paper's in brackets:

1. falls over the runs and Δd (mean foot penetration, training simulator minus MuJoCo, mm) per kappa
   and motion;
2. E_track (global, cm, mean ± std over runs) of the stiff (kappa = 300) policies, beside the paper's
   SHAC-Stiff + BCG and PPO numbers.

A JSON file with every evaluation's summary is written beside the Markdown.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bcg.learn.policy import Policy, PolicyFileError, load_policy  # noqa: E402
from bcg.motion import MotionClip, MotionFileError  # noqa: E402
from bcg.validate.mujoco_runner import EvaluationError  # noqa: E402
from bcg.validate.sim2sim import (  # noqa: E402
    EvalConfig,
    evaluate_policy,
    exit_status,
    summarize,
    write_json,
    write_text,
)

KAPPAS: tuple[float, ...] = (50.0, 100.0, 300.0)
MOTIONS: tuple[str, ...] = ("run", "jump", "fight", "dance")
STIFF_KAPPA = 300.0

#: The paper's table of falls (out of 5 runs) and Δd [mm] after transfer to MuJoCo.
PAPER_FALLS: dict[float, dict[str, int]] = {
    50.0: {"run": 5, "jump": 5, "fight": 5, "dance": 5},
    100.0: {"run": 5, "jump": 4, "fight": 3, "dance": 4},
    300.0: {"run": 0, "jump": 0, "fight": 0, "dance": 0},
}
PAPER_DELTA_D_MM: dict[float, dict[str, float]] = {
    50.0: {"run": 10.6, "jump": 12.6, "fight": 13.3, "dance": 13.5},
    100.0: {"run": 8.1, "jump": 10.8, "fight": 9.1, "dance": 9.5},
    300.0: {"run": 3.1, "jump": 3.3, "fight": 3.4, "dance": 2.9},
}
PAPER_RUNS = 5
#: The paper's E_track [cm] (mean, std over 5 runs) in MuJoCo: SHAC-Stiff + BCG and PPO.
PAPER_E_TRACK_CM: dict[str, tuple[float, float]] = {
    "run": (34.1, 0.4), "jump": (18.6, 0.4), "fight": (13.5, 0.3), "dance": (18.5, 0.8),
}  # fmt: skip
PAPER_PPO_E_TRACK_CM: dict[str, tuple[float, float]] = {
    "run": (42.8, 0.7), "jump": (18.0, 0.2), "fight": (34.3, 1.4), "dance": (19.0, 0.1),
}  # fmt: skip


def motion_key(name: str) -> str:
    """ "run", "motions/run.h5" and "Run" all name the Run motion."""
    return Path(name).stem.lower()


def find_policies(folder: Path) -> tuple[dict[tuple[float, str], Policy], list[str]]:
    """Policies by (kappa, motion) and notes on the files skipped (unreadable, outside the grid, repeated)."""
    files = sorted(set(folder.glob("*.h5")) | set(folder.glob("*/*.h5")))
    grid: dict[tuple[float, str], Policy] = {}
    notes: list[str] = []
    for path in files:
        try:
            policy = load_policy(path)
        except PolicyFileError as exc:
            notes.append(f"skipped {path}: {exc}")
            continue
        key = (float(policy.kappa), motion_key(policy.motion_name))
        if key[0] not in KAPPAS or key[1] not in MOTIONS:
            notes.append(f"skipped {path}: kappa {key[0]:g} / motion {key[1]!r} is outside the paper's grid")
        elif key in grid:
            notes.append(f"skipped {path}: {grid[key].path} already covers kappa {key[0]:g}, {key[1]}")
        else:
            grid[key] = policy
    return grid, notes


def _fmt(mean: float, std: float | None = None, digits: int = 1) -> str:
    if not np.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def tables_markdown(summaries: dict[tuple[float, str], dict], runs: int, notes: list[str]) -> str:
    """The two tables as Markdown (ours, then the paper's value in brackets)."""
    head = " | ".join(f"{m.capitalize()} falls ↓ | {m.capitalize()} Δd [mm] ↓" for m in MOTIONS)
    lines = [
        "# Sim-to-sim validation in MuJoCo",
        "",
        f"Ours over {runs} runs per policy, the paper's ({PAPER_RUNS} runs) in brackets; "
        "– where no policy (or no training-simulator replay) exists.",
        "",
        "## Falls and Δd (mean foot penetration, training simulator − MuJoCo)",
        "",
        f"| κ | {head} |",
        "|---|" + "---|---|" * len(MOTIONS),
    ]
    for kappa in KAPPAS:
        cells = []
        for m in MOTIONS:
            s = summaries.get((kappa, m))
            falls = f"{s['falls']}/{s['runs']}" if s else "–"
            delta = _fmt(s["delta_d_mm"]["mean"]) if s and "delta_d_mm" in s else "–"
            cells += [
                f"{falls} ({PAPER_FALLS[kappa][m]}/{PAPER_RUNS})",
                f"{delta} ({PAPER_DELTA_D_MM[kappa][m]:.1f})",
            ]
        lines.append(f"| {kappa:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## E_track [cm] of the stiff (κ = {STIFF_KAPPA:g}) policies, mean ± std over runs",
        "",
        "| Motion | ours | ours, root-relative | root path covered, ours / clip | paper SHAC-Stiff + BCG "
        "| paper PPO |",
        "|---|---|---|---|---|---|",
    ]
    for m in MOTIONS:
        s = summaries.get((STIFF_KAPPA, m))
        ours = _fmt(s["e_track_cm"]["mean"], s["e_track_cm"]["std"]) if s else "–"
        rel = _fmt(s["e_track_root_cm"]["mean"], s["e_track_root_cm"]["std"]) if s else "–"
        # a policy that keeps the pose but runs slower than the clip falls behind its path
        path = s.get("path_ratio") if s else None
        covered = f"{path['mean']:.2f} ± {path['std']:.2f}" if path and np.isfinite(path["mean"]) else "–"
        paper, ppo = PAPER_E_TRACK_CM[m], PAPER_PPO_E_TRACK_CM[m]
        lines.append(f"| {m.capitalize()} | {ours} | {rel} | {covered} | {_fmt(*paper)} | {_fmt(*ppo)} |")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def sweep(folder: Path, config: EvalConfig, out: Path, progress=print) -> dict:
    """Evaluate every policy of the grid found in ``folder``; write ``out`` (.md) and ``out`` .json."""
    grid, notes = find_policies(folder)
    if not grid:
        raise EvaluationError(f"{folder}: no policy files of the paper's grid (kappa x motion) found")
    summaries, records = {}, []
    began = time.perf_counter()
    for i, (key, policy) in enumerate(sorted(grid.items())):
        kappa, motion = key
        progress(f"[{i + 1}/{len(grid)}] kappa {kappa:g}, {motion}: {policy.path}")
        try:
            clip = MotionClip.load(policy.motion_name)
        except MotionFileError as exc:
            notes.append(f"skipped {policy.path}: its motion cannot be loaded: {exc}")
            continue
        if clip.content_hash != policy.motion_hash:
            notes.append(f"{policy.path}: {clip.path.name} differs from the clip it was trained on")
        try:
            results, _, note = evaluate_policy(policy, config, progress, clip=clip)
        except EvaluationError as exc:  # a config the evaluation cannot reproduce: this policy alone
            notes.append(f"skipped {exc}")
            continue
        if not note.startswith("bcg.sim") and not any(n.startswith("training simulator") for n in notes):
            notes.append(f"training simulator replay {note}: Δd not measured")
        summaries[key] = summarize(results)
        records.append(
            {"policy": str(policy.path), "kappa": kappa, "motion": motion, "summary": summaries[key]}
        )
        elapsed = time.perf_counter() - began
        progress(f"  done in {elapsed:.0f} s, ETA {elapsed / (i + 1) * (len(grid) - i - 1):.0f} s")
    text = tables_markdown(summaries, config.runs, notes)
    json_path = out.with_suffix(".json")
    write_json(json_path, {"config": asdict(config), "policies": records})
    write_text(out, text)
    progress(f"wrote {out} and {json_path}")
    return summaries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bcg.validate.sweep",
        description="Evaluate a folder of policies in MuJoCo and write the paper's two tables.",
    )
    p.add_argument("folder", type=Path, help="folder holding the policy files (.h5)")
    p.add_argument("--runs", type=int, default=EvalConfig.runs)
    p.add_argument("--seconds", type=float, default=EvalConfig.seconds)
    p.add_argument("--seed", type=int, default=EvalConfig.seed)
    p.add_argument("--training-sim", choices=("on", "off"), default="on")
    p.add_argument("--out", type=Path, help="Markdown output (default: FOLDER/validation.md)")
    args = p.parse_args(argv)

    def run():
        if not args.folder.is_dir():
            raise EvaluationError(f"{args.folder}: no such folder")
        config = EvalConfig(
            runs=args.runs, seconds=args.seconds, seed=args.seed, training_sim=args.training_sim
        )
        sweep(args.folder, config, args.out or args.folder / "validation.md")

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
