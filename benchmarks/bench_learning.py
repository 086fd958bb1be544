"""The learning benchmark: does the default training learn to stay up?

Runs ``python -m bcg.learn.train`` (the default configuration: Run, kappa = 300, BCG, ADD, 64
environments) for its first ``--iterations`` iterations on each of ``--seeds`` seeds, one after the
other, each in a fresh run folder under a temporary directory, and reads each run's ``log.csv``.
The runs stop early (``--stop-after``) on the default run's learning-rate schedule, which decays
linearly over its 3000 iterations, so the benchmark sees what the main job's first iterations do.
``--schedule N`` decays the rates over N iterations instead (``--schedule`` equal to
``--iterations`` is how the benchmark ran before 2026-12-05: its last iterations then learn at a
quarter of the default's rate or less). Decide learner changes with it: run it before and after
the change, in the same conditions (``--set`` passes overrides to the training, e.g. ``--set
env.alive_reward=0`` for the literal reading).

Prints ``name=value`` lines, per seed (``seed<S>_...``) and their mean over seeds:
    episode_length_first / episode_length_last: mean episode length [control steps] over the
        first and the last 25 iterations (``--window``)
    episode_length_ratio: last / first (the target is >= 2)
    fall_rate_first / fall_rate_last: the fraction of ended episodes that ended in a fall
    tracking_error_early_first / _last: the tracking error over each episode's first 0.5 s [cm]
    negative_reward_fraction: fraction of iterations after the first 10 whose mean reward per
        env-step is negative (the target is 0)
    min_reward_after_10: the smallest mean reward per env-step after the first 10 iterations
    seconds_per_iteration: mean wall time per iteration, compile time excluded (the first
        iteration is left out)

Usage: ``python benchmarks/bench_learning.py [--iterations 450] [--seeds 2] [--envs 64]
[--first-seed 0] [--window 25] [--schedule N] [--keep DIR] [--set FIELD=VALUE ...]``. With
``--keep DIR`` the run folders are kept in DIR (``DIR/seed<S>``) for ``python -m bcg.learn.compare``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bcg.learn.runlog import read_log

FIRST_ITERATIONS_EXEMPT = 10  # the reward target ignores the first iterations (the networks are random)


def _column(rows: list[dict], name: str) -> np.ndarray:
    out = []
    for row in rows:
        try:
            out.append(float(row.get(name) or "nan"))
        except ValueError:
            out.append(math.nan)
    return np.asarray(out, float)


def summarise(rows: list[dict], window: int) -> dict[str, float]:
    """The benchmark's figures of one run's log rows (see the module docstring)."""
    if len(rows) < 2 * window:
        raise ValueError(f"the run logged {len(rows)} iterations; the benchmark needs at least {2 * window}")
    length = _column(rows, "episode_length")
    falls = _column(rows, "fall_rate")
    early = _column(rows, "tracking_error_early_cm")
    reward = _column(rows, "reward")
    wall = _column(rows, "wall_time")
    first, last = slice(0, window), slice(len(rows) - window, len(rows))
    late_reward = reward[FIRST_ITERATIONS_EXEMPT:]
    late_reward = late_reward[np.isfinite(late_reward)]
    out = {
        "episode_length_first": float(np.nanmean(length[first])),
        "episode_length_last": float(np.nanmean(length[last])),
        "fall_rate_first": float(np.nanmean(falls[first])),
        "fall_rate_last": float(np.nanmean(falls[last])),
        "tracking_error_early_first": float(np.nanmean(early[first])),
        "tracking_error_early_last": float(np.nanmean(early[last])),
        "negative_reward_fraction": float(np.mean(late_reward < 0)) if late_reward.size else math.nan,
        "min_reward_after_10": float(np.min(late_reward)) if late_reward.size else math.nan,
        "seconds_per_iteration": float((wall[-1] - wall[0]) / (len(rows) - 1)),
    }
    out["episode_length_ratio"] = out["episode_length_last"] / out["episode_length_first"]
    return out


def train_command(seed: int, folder: Path, args: argparse.Namespace) -> list[str]:
    """The training command of one seed: the first ``args.iterations`` of the run's schedule."""
    cmd = [
        sys.executable, "-m", "bcg.learn.train", "--motion", args.motion, "--kappa", str(args.kappa),
        "--stop-after", str(args.iterations), "--seed", str(seed), "--out", str(folder), "--overwrite",
    ]  # fmt: skip
    if args.schedule is not None:
        cmd += ["--iterations", str(args.schedule)]
    if args.envs is not None:
        cmd += ["--envs", str(args.envs)]
    for item in args.overrides:
        cmd += ["--set", item]
    return cmd


def run_seed(seed: int, folder: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = train_command(seed, folder, args)
    print("# " + " ".join(cmd), flush=True)
    # the training's own progress bar goes to this process's stderr
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return summarise(read_log(folder / "log.csv"), args.window)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 450 iterations of two seeds take about 30 minutes on this project's 2-core machine
    p.add_argument("--iterations", type=int, default=450, help="iterations per seed (default 450)")
    p.add_argument("--seeds", type=int, default=2, help="seeds 0 .. S-1 (default 2)")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--envs", type=int, help="parallel environments (default: the training's, 64)")
    p.add_argument("--motion", default="run")
    p.add_argument("--kappa", type=float, default=300.0)
    p.add_argument("--window", type=int, default=25, help="iterations averaged at each end (default 25)")
    p.add_argument(
        "--schedule", type=int, metavar="N",
        help="decay the learning rates over N iterations (default: the training's, 3000)",
    )  # fmt: skip
    p.add_argument("--keep", type=Path, help="keep the run folders in this directory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    args = p.parse_args(argv)
    if args.iterations < 2 * args.window:
        p.error(f"--iterations must be at least twice --window ({2 * args.window})")
    if args.schedule is not None and args.schedule < args.iterations:
        p.error(f"--schedule ({args.schedule}) must be at least --iterations ({args.iterations})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")
    results = []
    with tempfile.TemporaryDirectory(prefix="bcg-bench-learning-") as tmp:
        base = args.keep if args.keep is not None else Path(tmp)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            res = run_seed(seed, base / f"seed{seed}", args)
            results.append(res)
            for name, value in res.items():
                print(f"seed{seed}_{name}={value:.4g}", flush=True)
    for name in results[0]:
        print(f"{name}={np.mean([r[name] for r in results]):.4g}")
    print(f"iterations={args.iterations}")
    print(f"schedule={args.schedule if args.schedule is not None else 'default'}")
    print(f"seeds={args.seeds}")
    print(f"overrides={','.join(args.overrides) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
