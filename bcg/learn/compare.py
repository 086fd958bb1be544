"""Compare training runs: early against late averages of the main curves, and one plot of them all.

    python -m bcg.learn.compare RUN_DIR [RUN_DIR ...] [--window 20] [--x iteration|samples|seconds]
        [--out compare.png]

Each RUN_DIR is a folder written by ``python -m bcg.learn.train`` (its ``log.csv``). For every run the
command prints the mean of each curve over the first and the last ``--window`` iterations (tracking
error in cm, episode length in control steps, fall rate, episode return, BCG trigger rate and seconds
per iteration) and the change between them, and it saves the curves of all runs, smoothed over the
window, in one PNG (written atomically). ``--x samples`` puts environment samples on the x-axis
(iterations × environments × horizon, from the run's ``config.json``), so that learners with different
batch sizes, such as SHAC and PPO, compare per sample; ``--x seconds`` puts the logged wall-clock time.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bcg.core.atomic import atomic_write
from bcg.learn.runlog import read_log

CURVES = (
    ("tracking_error_cm", "tracking error [cm]"),
    ("episode_length", "episode length [steps]"),
    ("fall_rate", "fall rate"),
    ("episode_return", "episode return"),
)
EXTRA = (
    ("tracking_error_early_cm", "tracking error, first 0.5 s [cm]"),
    ("bcg_trigger_rate", "BCG trigger rate"),
    ("action_std", "action std"),
    ("live_fraction", "env-steps inside an episode"),
    ("time_iteration", "s / iteration"),
)


def load_run(path: Path) -> dict[str, np.ndarray]:
    """The log of a run folder (or of a log.csv) as {column: (iterations,) float array}."""
    path = Path(path)
    log = path / "log.csv" if path.is_dir() else path
    if not log.is_file():
        raise FileNotFoundError(f"{path}: no log.csv (is it a folder written by bcg.learn.train?)")
    rows = read_log(log)
    if not rows:
        raise ValueError(f"{log}: the log holds no iteration yet")
    columns = {}
    for key in rows[0]:
        try:
            columns[key] = np.array([float(r[key]) if r[key] not in ("", None) else np.nan for r in rows])
        except (TypeError, ValueError):
            continue
    missing = [k for k, _ in CURVES if k not in columns]
    if missing:
        raise ValueError(f"{log}: missing columns {', '.join(missing)}")
    return columns


X_AXES = {"iteration": "iteration", "samples": "environment samples", "seconds": "wall-clock time [s]"}


def samples_per_iteration(path: Path) -> int:
    """Environment samples one iteration of the run takes in: environments × horizon, read from the
    ``config.json`` beside its log."""
    path = Path(path)
    config = (path if path.is_dir() else path.parent) / "config.json"
    try:
        stored = json.loads(config.read_text())
        cfg = stored.get("config", stored)
        n = int(cfg["num_envs"]) * int(cfg["horizon"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{config}: cannot read num_envs and horizon ({exc})") from None
    if n <= 0:
        raise ValueError(f"{config}: num_envs × horizon is {n}")
    return n


def x_values(columns: dict[str, np.ndarray], axis: str, per_iteration: int | None = None) -> np.ndarray:
    """The x-axis of a run's curves: its iterations, the environment samples taken in by the end of
    each (``per_iteration`` a step), or the logged wall-clock time."""
    it = columns.get("iteration", np.arange(1, len(columns[CURVES[0][0]]) + 1, dtype=float))
    if axis == "iteration":
        return it
    if axis == "samples":
        if per_iteration is None:
            raise ValueError("samples need the run's samples per iteration")
        return it * per_iteration
    if axis == "seconds":
        if "wall_time" not in columns:
            raise ValueError("the log has no wall_time column")
        return columns["wall_time"]
    raise ValueError(f"unknown x-axis {axis!r}: use one of {', '.join(X_AXES)}")


def summary(columns: dict[str, np.ndarray], window: int) -> dict[str, tuple[float, float]]:
    """{column: (mean over the first window, mean over the last window)}, NaNs ignored."""
    n = len(columns[CURVES[0][0]])
    w = max(1, min(window, n // 2 if n >= 2 else 1))
    out = {}
    for key, _ in CURVES + EXTRA:
        if key in columns:
            v = columns[key]
            first, last = v[:w], v[-w:]
            out[key] = (
                float(np.nanmean(first)) if np.isfinite(first).any() else np.nan,
                float(np.nanmean(last)) if np.isfinite(last).any() else np.nan,
            )
    return out


def smooth(v: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over up to ``window`` finite values (same length as v)."""
    out = np.full(len(v), np.nan)
    for i in range(len(v)):
        seg = v[max(0, i - window + 1) : i + 1]
        seg = seg[np.isfinite(seg)]
        if len(seg):
            out[i] = seg.mean()
    return out


def plot(
    runs: dict[str, dict[str, np.ndarray]], window: int, path: Path, xs=None, x_label="iteration"
) -> None:
    """The curves of every run, raw and smoothed; ``xs`` maps a run to its x values (default: its
    iterations)."""
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    # the early tracking error too, when every run logged it (logs before it existed lack it)
    curves = CURVES + tuple(e for e in EXTRA[:1] if all(e[0] in cols for cols in runs.values()))
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4))
    for ax, (key, label) in zip(axes, curves, strict=True):
        for name, cols in runs.items():
            it = xs[name] if xs is not None else x_values(cols, "iteration")
            ax.plot(it, cols[key], alpha=0.25, lw=0.8)
            ax.plot(it, smooth(cols[key], window), lw=1.8, color=ax.lines[-1].get_color(), label=name)
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def run_labels(paths: list[str]) -> list[str]:
    """A short, distinct label per run folder: its name, or as many trailing path parts as it takes
    to tell folders with the same name apart (``runs/bcg/run`` and ``runs/nobcg/run``)."""
    parts = [Path(p).resolve().parts for p in paths]
    for i, p in enumerate(parts):
        if p in parts[:i]:
            raise ValueError(f"run folder {paths[i]} is given more than once")
    for k in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(Path(p).resolve()) for p in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bcg.learn.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", help="run folders written by bcg.learn.train")
    parser.add_argument("--window", type=int, default=20, help="iterations averaged at each end")
    parser.add_argument("--x", choices=tuple(X_AXES), default="iteration", help="the plot's x-axis")
    parser.add_argument("--out", default="compare.png", help="plot file (PNG)")
    args = parser.parse_args(argv)
    if args.window < 1:
        print("error: --window must be >= 1", file=sys.stderr)
        return 2
    out_dir = Path(args.out).resolve().parent
    if not out_dir.is_dir():
        print(f"error: --out {args.out}: folder {out_dir} does not exist", file=sys.stderr)
        return 2
    try:
        labels = run_labels(args.runs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs, xs = {}, {}
    for label, r in zip(labels, args.runs):
        try:
            runs[label] = load_run(Path(r))
            per = samples_per_iteration(Path(r)) if args.x == "samples" else None
            xs[label] = x_values(runs[label], args.x, per)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"{'run':<20} {'iters':>5} {'curve':<34} {'first':>10} {'last':>10} {'change':>10}")
    for name, cols in runs.items():
        n = len(cols[CURVES[0][0]])
        for key, label in CURVES + EXTRA:
            s = summary(cols, args.window).get(key)
            if s is None:
                continue
            print(f"{name:<20} {n:>5} {label:<34} {s[0]:10.3f} {s[1]:10.3f} {s[1] - s[0]:+10.3f}")
        if args.x != "iteration":
            print(f"{name:<20} {n:>5} {X_AXES[args.x] + ' at the end':<34} {xs[name][-1]:10.0f}")
    plot(runs, args.window, Path(args.out), xs, X_AXES[args.x])
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
