"""Compare policies' MuJoCo validations run from the same starts, paired start by start.

Usage::

    python -m bcg.validate.compare A.json B.json [C.json ...] [--plot out.png]

Each file is what ``python -m bcg.validate.sim2sim POLICY --runs N --json FILE`` writes. Runs with the
same seed start from the same state (the reference phase and the reset noise are drawn from the
seed), so two policies evaluated with the same ``--runs``, ``--seed``, motion and reset noise meet
the same starts; the command refuses files whose seeds, start times, reset noise, motion or episode
length differ. For every file it prints falls and
time up (seconds until a fall, or the episode's length) per start, and against the first file the
mean paired difference of time up, the starts where it is longer, equal and shorter, and the
two-sided Wilcoxon signed-rank p-value over the starts whose times differ (``scipy.stats.wilcoxon``).
``--plot`` draws time up per start, one marker per file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

from bcg.core import g1
from bcg.core.atomic import write_figure_png
from bcg.validate.metrics import mean_std


class CompareError(ValueError):
    """A validation file that cannot be read or compared."""


@dataclass(frozen=True)
class Validation:
    """One sim2sim JSON file: its label, the starts (seed, start time, reset noise) and each run's
    control steps up and fall."""

    path: Path
    label: str
    starts: tuple[tuple[int, float], ...]
    steps: np.ndarray  # control steps until the fall or the episode's end, per run
    fell: np.ndarray
    motion_hash: str | None
    seconds: float | None
    reset_noise: dict | None

    @property
    def time_up(self) -> np.ndarray:
        return self.steps * g1.CONTROL_DT


def _whole(value, what: str) -> int:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
    if not ok or value != int(value) or value < 0:
        raise ValueError(f"{what} is {value!r}, not a whole number >= 0")
    return int(value)


def load_validation(path: str | Path) -> Validation:
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
        runs = payload["runs"]
        starts = tuple((_whole(r["seed"], "a seed"), round(float(r["start_time"]), 6)) for r in runs)
        steps = np.array([_whole(r["steps"], "a run's steps") for r in runs], dtype=np.int64)
        fell = np.array([r["fell"] for r in runs], dtype=object)
        if not all(isinstance(f, bool) for f in fell):
            raise ValueError("a run's 'fell' is not true or false")
        config = payload.get("config") or {}
        policy = payload.get("policy")
        reset_noise = payload.get("reset_noise")
        if not isinstance(config, dict) or not isinstance(policy, (str, type(None))):
            raise ValueError("'config' is not an object or 'policy' not a path")
        if not isinstance(reset_noise, (dict, type(None))):
            raise ValueError("'reset_noise' is not an object")
        seconds = config.get("seconds")
        seconds = None if seconds is None else float(seconds)
    except OSError as exc:
        raise CompareError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CompareError(
            f"{path} is not a validation written by python -m bcg.validate.sim2sim --json ({exc})"
        ) from None
    if not runs:
        raise CompareError(f"{path} holds no runs")
    label = Path(policy or path.stem).stem
    return Validation(
        path, label, starts, steps, fell.astype(bool), payload.get("motion_hash"), seconds, reset_noise
    )


@dataclass(frozen=True)
class Paired:
    """A file against the reference, over the shared starts."""

    mean_difference_s: float
    longer: int
    equal: int
    shorter: int
    p_value: float
    tested: int  # the starts whose times differ, which the Wilcoxon test ranks


def paired(reference_steps: np.ndarray, other_steps: np.ndarray) -> Paired:
    """Time up of ``other`` against ``reference`` start by start, from whole control steps (so that
    equal differences tie exactly in the signed-rank test); the p-value is 1 when no start differs."""

    diff = np.asarray(other_steps, np.int64) - np.asarray(reference_steps, np.int64)
    differ = diff != 0
    p = float(wilcoxon(diff[differ]).pvalue) if differ.any() else 1.0
    return Paired(
        mean_difference_s=float(diff.mean() * g1.CONTROL_DT),
        longer=int(np.sum(diff > 0)),
        equal=int(np.sum(~differ)),
        shorter=int(np.sum(diff < 0)),
        p_value=p,
        tested=int(differ.sum()),
    )


def check_same_starts(validations: list[Validation]) -> None:
    first = validations[0]
    for v in validations[1:]:
        if v.starts != first.starts:
            raise CompareError(
                f"{v.path} and {first.path} do not start from the same states (seeds and start times "
                "differ): run sim2sim with the same --runs, --seed and motion"
            )
        if v.motion_hash != first.motion_hash:
            raise CompareError(f"{v.path} and {first.path} were run on different motion clips")
        if v.seconds != first.seconds:
            raise CompareError(f"{v.path} ran {v.seconds} s episodes, {first.path} {first.seconds} s")
        if v.reset_noise != first.reset_noise:
            raise CompareError(
                f"{v.path} and {first.path} started with different reset noise (the same seeds give "
                "the same start times but other start states): run sim2sim with the same noise, or "
                "--no-reset-noise for both"
            )


def report(validations: list[Validation]) -> str:
    check_same_starts(validations)
    width = max(8, *(len(v.label) for v in validations))
    lines = [f"{'start':>5}  {'seed':>4}  " + "  ".join(f"{v.label:>{width}}" for v in validations)]
    for i, (seed, _) in enumerate(validations[0].starts):
        cells = [f"{v.time_up[i]:>{width - 1}.2f}{'*' if v.fell[i] else ' '}" for v in validations]
        lines.append(f"{i + 1:>5}  {seed:>4}  " + "  ".join(cells))
    lines.append("time up [s] per start; * a fall")
    lines.append("")
    ref = validations[0]
    for v in validations:
        mean, std = mean_std(v.time_up)  # as sim2sim's summary gives it
        line = f"{v.label}: falls {int(v.fell.sum())}/{len(v.fell)}, time up {mean:.2f} ± {std:.2f} s"
        if v is not ref:
            p = paired(ref.steps, v.steps)
            line += (
                f"; against {ref.label}: {p.mean_difference_s:+.2f} s on average, longer from "
                f"{p.longer}, equal from {p.equal}, shorter from {p.shorter} starts, Wilcoxon p = "
                f"{p.p_value:.3g} over {p.tested} starts"
            )
            if 0 < p.tested < 6:  # two-sided exact test: the smallest p is 2 / 2^n
                line += f" (with {p.tested} starts p cannot fall below {2.0 / 2**p.tested:.3g})"
        lines.append(line)
    return "\n".join(lines)


def write_plot(path: Path, validations: list[Validation]) -> None:
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    starts = np.arange(1, len(validations[0].starts) + 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(starts) + 2), 3.5))
    offsets = np.linspace(-0.2, 0.2, len(validations)) if len(validations) > 1 else [0.0]
    for v, dx in zip(validations, offsets):
        line = ax.plot(starts + dx, v.time_up, "o", label=v.label)[0]
        ax.plot(starts[v.fell] + dx, v.time_up[v.fell], "x", color=line.get_color(), ms=9)
    ax.set_xticks(starts)
    ax.set_xlabel("start (seed order); x: a fall")
    ax.set_ylabel("time up in MuJoCo [s]")
    ax.legend(fontsize=8)
    write_figure_png(path, fig)


def _folder_label(path: Path) -> str:
    return f"{path.absolute().parent.name}/{path.stem}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bcg.validate.compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "files", nargs="+", type=Path, help="sim2sim --json files; the first is the reference"
    )
    parser.add_argument("--plot", type=Path, help="write a PNG of time up per start")
    args = parser.parse_args(argv)
    try:
        if len(args.files) < 2:
            raise CompareError("give two or more validation files")
        validations = [load_validation(p) for p in args.files]
        if len({v.label for v in validations}) < len(validations):  # one policy under other settings
            validations = [dataclasses.replace(v, label=v.path.stem) for v in validations]
        if len({v.label for v in validations}) < len(validations):  # runs/a/val.json, runs/b/val.json
            validations = [dataclasses.replace(v, label=_folder_label(v.path)) for v in validations]
        print(report(validations))
        if args.plot:
            write_plot(args.plot, validations)
            print(f"wrote {args.plot}")
    except (CompareError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
