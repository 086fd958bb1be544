"""Does a policy follow its reference when the reference is moved? A step in the reference's
horizontal position, in MuJoCo.

    python -m bcg.studies.reference_shift POLICY [POLICY ...] [--shift 0.2] [--after 1] [--seconds 6]
        [--runs 5] [--seed 0] [--plot out.png] [--gains 1,2,3]

A policy's world-frame tracking error (E_track) is mostly its root's distance from the clip's path.
Either it does not see that distance (the observation's reference root position carries the
paper's ±0.25 m training noise) or it sees it and closes it too slowly. This study tells which: from
the same random starts as ``bcg.validate.sim2sim`` (the training's reset noise, the same seeds), it
plays each run once as it is and once with the whole reference moved by ``--shift`` m along +x, -x,
+y and -y from ``--after`` s on (the observation's reference root positions, ref - robot, move by
the shift; the reference's pose about its root does not). It prints, for each second after the
step, how far the robot's root has moved along the shift against the unshifted run of the same
start, as a fraction of the shift (1: followed fully), and the runs that fell; ``--plot`` draws
each policy's mean over the directions and runs every 0.1 s. ``--gains 1,2,3`` adds, per policy,
falls and world-frame E_track over 10 s runs with the observed distance to the reference scaled
by each gain: whether a policy that reacted more strongly to it would track the path better (a
diagnostic for training, not a way to run a policy).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bcg.core import g1
from bcg.core.atomic import write_figure_png
from bcg.learn.observation import observation_slices
from bcg.learn.policy import PolicyFileError
from bcg.motion.errors import MotionFileError
from bcg.robot.run import load_checked
from bcg.validate import mujoco_runner as mr
from bcg.validate.metrics import tracking_errors

DIRECTIONS = {"+x": (1.0, 0.0), "-x": (-1.0, 0.0), "+y": (0.0, 1.0), "-y": (0.0, -1.0)}


class ShiftedReference:
    """The policy's actions with the observation's reference root positions (``ref{k}_root_pos``,
    reference minus robot, xy) moved by ``shift`` (m) from step ``from_step`` on, and scaled by
    ``gain`` (1: as trained): a moved reference, or a policy made to see its distance to the
    reference ``gain`` times larger."""

    def __init__(self, policy, shift: np.ndarray, from_step: int = 0, gain: float = 1.0):
        self.inner = mr.PolicyActions(policy)
        self.shift, self.from_step, self.gain = shift, from_step, gain
        self.step = 0
        self.name = "policy, reference shifted"
        slices = observation_slices()
        self.blocks = [
            s for name, s in slices.items() if name.startswith("ref") and name.endswith("_root_pos")
        ]

    def targets(self, obs: np.ndarray, refs) -> np.ndarray:
        if self.step >= self.from_step or self.gain != 1.0:
            obs = obs.copy()
            for s in self.blocks:
                xy = obs[s.start : s.start + 2] + (self.shift if self.step >= self.from_step else 0.0)
                obs[s.start : s.start + 2] = self.gain * xy
        self.step += 1
        return self.inner.targets(obs, refs)


def _starts(policy, clip, seconds: float, runs: int, seed: int):
    """The MuJoCo G1 with the policy's gains, sim2sim's starts for seeds ``seed ..`` (the training's
    reset noise) and the number of control steps in ``seconds``."""
    backend = mr.MujocoG1(mr.PDParams.from_policy(policy))
    noise = mr.ResetNoise.of_training(policy.config)
    starts = [
        mr.initial_state(clip, backend.model, np.random.default_rng(seed + i), seconds, noise)
        for i in range(runs)
    ]
    return backend, starts, int(round(seconds / g1.CONTROL_DT))


def gain_sweep(policy, clip, gains: list[float], seconds: float, runs: int, seed: int):
    """{gain: (falls, world-frame E_track per run in cm)} over ``runs`` MuJoCo runs of ``seconds``
    from sim2sim's starts, the observation's distance to the reference scaled by each gain."""
    backend, starts, steps = _starts(policy, clip, seconds, runs, seed)
    out = {}
    for gain in gains:
        falls, errors = 0, []
        for start in starts:
            ep = mr.run_episode(backend, ShiftedReference(policy, np.zeros(2), 0, gain), clip, start, steps)
            falls += ep.fell
            errors.append(tracking_errors(ep.points, ep.ref_points)[0])
        out[gain] = (falls, np.asarray(errors))
    return out


def followed(
    policy, clip, shift: float, after: float, seconds: float, runs: int, seed: int, every: float = 1.0
):
    """(fractions, falls): fractions[d] is (runs, marks every ``every`` s after the step) of the root's
    displacement along direction d against the unshifted run over ``shift`` (NaN once either run
    has fallen); falls[d] counts the shifted runs that fell, falls["none"] the unshifted ones."""
    backend, starts, steps = _starts(policy, clip, seconds, runs, seed)
    k0 = int(round(after / g1.CONTROL_DT))
    count = int(np.floor((seconds - after) / every + 1e-6))
    marks = [k0 + int(round(j * every / g1.CONTROL_DT)) for j in range(1, count + 1)]
    fractions = {d: np.full((runs, len(marks)), np.nan) for d in DIRECTIONS}
    falls = {d: 0 for d in ("none", *DIRECTIONS)}
    began = time.perf_counter()
    for i, start in enumerate(starts):
        base = mr.run_episode(backend, mr.PolicyActions(policy), clip, start, steps)
        falls["none"] += base.fell
        for d, unit in DIRECTIONS.items():
            u = np.asarray(unit)
            ep = mr.run_episode(backend, ShiftedReference(policy, shift * u, k0), clip, start, steps)
            falls[d] += ep.fell
            for j, k in enumerate(marks):
                if k < len(ep.qpos) and k < len(base.qpos):
                    fractions[d][i, j] = float((ep.qpos[k, 0:2] - base.qpos[k, 0:2]) @ u) / shift
        spent = time.perf_counter() - began
        eta = spent / (i + 1) * (runs - i - 1)
        print(f"  {policy.motion_name}: run {i + 1}/{runs} [ETA {eta:.0f} s]", file=sys.stderr, flush=True)
    return fractions, falls


PLOT_EVERY = 0.1  # s between the plot's points; the table reads every tenth
GAIN_SECONDS = 10.0  # s per run of the gain table, as sim2sim's


def write_plot(path: Path, curves: dict[str, np.ndarray], shift: float) -> None:
    """One line per policy: the fraction followed (mean over directions and runs) against the
    seconds after the step, with its spread over them as a band."""
    import matplotlib  # slow to import: loads only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for label, f in curves.items():
        t = PLOT_EVERY * np.arange(1, f.shape[1] + 1)
        mean, std = np.nanmean(f, axis=0), np.nanstd(f, axis=0)
        line = ax.plot(t, mean, label=label)[0]
        ax.fill_between(t, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("s after the reference moved")
    ax.set_ylabel(f"fraction of the {shift:g} m followed")
    ax.legend(fontsize=8)
    write_figure_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bcg.studies.reference_shift", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("policies", nargs="+", metavar="POLICY", help="policy files (.h5)")
    p.add_argument("--shift", type=float, default=0.2, help="m the reference moves (default 0.2)")
    p.add_argument("--after", type=float, default=1.0, help="s after the start the step comes (default 1)")
    p.add_argument("--seconds", type=float, default=6.0, help="s each run lasts (default 6)")
    p.add_argument("--runs", type=int, default=5, help="starts, seeds SEED.. (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, help="write the fractions followed over time as a PNG")
    p.add_argument(
        "--gains",
        help="also: comma-separated gains on the observed distance to the reference, each over --runs "
        "MuJoCo runs of 10 s without a shift: falls and world-frame E_track (a diagnostic, not a policy)",
    )
    args = p.parse_args(argv)
    if not 0.0 < args.shift <= 2.0:
        p.error(f"--shift must be within (0, 2] m, got {args.shift}")
    if args.runs < 1 or not 0.0 <= args.after or args.seconds < args.after + 1.0:
        p.error("--runs must be at least 1, --after non-negative and --seconds at least --after + 1")
    gains = []
    if args.gains is not None:
        try:
            gains = [float(v) for v in args.gains.split(",")]
        except ValueError:
            p.error(f"--gains must be comma-separated numbers, got {args.gains!r}")
        if not gains or any(not 0.0 <= g <= 10.0 for g in gains):
            p.error(f"--gains must lie within 0-10, got {args.gains!r}")
    curves = {}
    for path in args.policies:
        try:
            policy, clip = load_checked(path)
            fractions, falls = followed(
                policy, clip, args.shift, args.after, args.seconds, args.runs, args.seed, every=PLOT_EVERY
            )
        except (PolicyFileError, MotionFileError, mr.EvaluationError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        curves[f"{policy.motion_name} ({Path(path).name})"] = np.concatenate(list(fractions.values()))
        print(
            f"{path}: {policy.motion_name}, reference moved {args.shift:g} m at {args.after:g} s, "
            f"{args.runs} runs of {args.seconds:g} s from seed {args.seed}; falls unshifted {falls['none']}, "
            + ", ".join(f"{d} {falls[d]}" for d in DIRECTIONS)
        )
        print("| s after the step | " + " | ".join(f"followed along {d}" for d in DIRECTIONS) + " |")
        print("|---|" + "---|" * len(DIRECTIONS))
        per_second = int(round(1.0 / PLOT_EVERY))
        for j in range(per_second - 1, next(iter(fractions.values())).shape[1], per_second):
            cells = []
            for d in DIRECTIONS:
                ok = fractions[d][:, j][np.isfinite(fractions[d][:, j])]
                cells.append(f"{ok.mean():.2f} ± {ok.std():.2f}" if len(ok) else "–")
            print(f"| {(j + 1) // per_second} | " + " | ".join(cells) + " |", flush=True)
        if gains:
            try:
                sweep = gain_sweep(policy, clip, gains, GAIN_SECONDS, args.runs, args.seed)
            except mr.EvaluationError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(
                f"\n| gain on the observed distance | falls ({args.runs} runs of {GAIN_SECONDS:g} s) "
                "| E_track [cm] |"
            )
            print("|---|---|---|")
            for gain, (falls_g, errors) in sweep.items():
                print(
                    f"| {gain:g} | {falls_g}/{args.runs} | {errors.mean():.1f} ± {errors.std():.1f} |",
                    flush=True,
                )
    if args.plot is not None:
        write_plot(args.plot, curves, args.shift)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
