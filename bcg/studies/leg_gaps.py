"""How close do a policy's legs pass each other, in MuJoCo and in the training simulator?

    python -m bcg.studies.leg_gaps POLICY [--runs 10] [--seed 0] [--seconds 10] [--start-time T]
        [--training-sim on|off] [--plot out.png]

The training simulator models foot-ground contact alone unless the policy trained with the leg
contact, so a foot that passes through the other leg costs the policy only the leg-clearance term;
in MuJoCo the leg is struck and the robot may trip (docs/learning.md, "What is left"). From
``bcg.validate.sim2sim``'s starts (the same seeds and reset noise, so run i here is run i there) it
plays each run in MuJoCo and, with the policy's own contact settings, in the training simulator,
and prints per run the smallest gap between the legs' collision capsules in each (cm; negative: the
capsules cross, a contact MuJoCo reports; the distance of :mod:`bcg.learn.clearance`), when it
came, the closest pair of capsules, the control steps within the policy's clearance margin, the
falls, and how far apart the two simulators' joints are where MuJoCo's legs come closest. A run
whose legs pass a few cm apart in the training simulator and touch in MuJoCo is one the clearance
term did not make robust to the gap between the simulators. ``--plot`` draws each run's smallest
gap over time in both.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.atomic import write_figure_png
from bcg.learn.clearance import LegCapsules, leg_gaps
from bcg.learn.config import EnvConfig
from bcg.learn.policy import PolicyFileError
from bcg.motion.errors import MotionFileError
from bcg.robot.run import load_checked
from bcg.validate import mujoco_runner as mr
from bcg.validate.stored_config import (
    training_contact,
    training_depth_correction,
    training_joint_limits,
    training_lead_out,
    training_leg_contact,
    training_margin,
)


@dataclass(frozen=True)
class Gaps:
    """One simulator's run: the smallest leg gap (m) at every control-step boundary (K + 1,), the
    closest pair's capsule names at each, and the fall time (s after the start, None if none)."""

    gap: np.ndarray
    pair: tuple[tuple[str, str], ...]
    fall_time: float | None

    def smallest(self) -> tuple[float, float, tuple[str, str]]:
        """(gap m, s after the start, (left capsule, right capsule)) of the closest approach."""
        k = int(np.argmin(self.gap))
        return float(self.gap[k]), k * g1.CONTROL_DT, self.pair[k]

    def within(self, margin: float) -> int:
        """Control steps (after the start state) with the legs closer than ``margin``."""
        return int(np.sum(self.gap[1:] < margin))


def gaps_along(model: mujoco.MjModel, legs: LegCapsules, episode: mr.Episode) -> Gaps:
    """The legs' smallest gap over an episode's configurations (MuJoCo's kinematics of each)."""
    data = mujoco.MjData(model)
    xpos, xquat = [], []
    for q in episode.qpos:
        data.qpos[:] = q
        mujoco.mj_kinematics(model, data)
        xpos.append(data.xpos.copy())
        xquat.append(data.xquat.copy())
    every = leg_gaps(legs, np.asarray(xpos), np.asarray(xquat))  # (K + 1, L, R)
    flat = every.reshape(len(every), -1)
    best = np.argmin(flat, axis=1)
    right = len(legs.right_names)
    pair = tuple((legs.left_names[b // right], legs.right_names[b % right]) for b in best)
    return Gaps(flat[np.arange(len(flat)), best], pair, episode.fall_time if episode.fell else None)


def compare(policy, clip, runs: int, seed: int, seconds: float, start_time: float | None, replay: bool):
    """[(clip time of the start, MuJoCo's Gaps, the training simulator's Gaps or None, the largest
    joint-angle difference (rad) between the two simulators at MuJoCo's closest approach or None)]
    per run."""
    stored = policy.config
    pd = mr.PDParams.from_policy(policy)
    backend = mr.MujocoG1(pd)
    training = None
    if replay:
        contact = training_contact(policy.kappa, training_margin(stored), training_depth_correction(stored))
        training = mr.TrainingSimG1(
            pd,
            contact=contact,
            leg_contact=training_leg_contact(stored),
            joint_limits=training_joint_limits(stored),
        )
    legs = LegCapsules.of(backend.model)
    noise = mr.ResetNoise.of_training(stored)
    lead_out = training_lead_out(stored)
    held = lead_out > 0.0  # the clip's last frame held after its end, as in training
    steps = int(round(seconds / g1.CONTROL_DT))
    out, began = [], time.perf_counter()
    for i in range(runs):
        rng = np.random.default_rng(seed + i)  # sim2sim's start for the same seed
        start = mr.initial_state(clip, backend.model, rng, seconds, noise, start_time, False, lead_out)
        source = mr.PolicyActions(policy)
        mj = mr.run_episode(backend, source, clip, start, steps, still_after_end=held)
        tr = None
        if training is not None:
            tr = mr.run_episode(training, source, clip, start, steps, still_after_end=held)
        g_mj, g_tr, apart = gaps_along(backend.model, legs, mj), None, None
        if tr is not None:
            g_tr = gaps_along(backend.model, legs, tr)
            # how far the two simulators' joints are apart where MuJoCo's legs come closest
            k = min(int(np.argmin(g_mj.gap)), len(tr.qpos) - 1)
            apart = float(np.abs(mj.qpos[k, 7:] - tr.qpos[k, 7:]).max())
        out.append((mj.start_time, g_mj, g_tr, apart))
        eta = (time.perf_counter() - began) / (i + 1) * (runs - i - 1)
        print(f"  run {i + 1}/{runs} [ETA {eta:.0f} s]", file=sys.stderr, flush=True)
    return out


def _cell(g: Gaps | None, margin: float) -> str:
    if g is None:
        return "– | – | – | –"
    gap, at, (a, b) = g.smallest()
    fall = f"{g.fall_time:.2f}" if g.fall_time is not None else "–"
    return f"{100 * gap:.2f} at {at:.2f} s | {a} / {b} | {g.within(margin)} | {fall}"


def write_plot(path: Path, rows, margin: float, title: str) -> None:
    """Each run's smallest leg gap over time: MuJoCo solid, the training simulator dashed."""
    import matplotlib  # slow to import: loads only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    for i, (_, mj, tr, _) in enumerate(rows):
        t = g1.CONTROL_DT * np.arange(len(mj.gap))
        line = ax.plot(t, 100 * mj.gap, lw=1.0, label=f"run {i + 1}")[0]
        if tr is not None:
            ax.plot(
                g1.CONTROL_DT * np.arange(len(tr.gap)), 100 * tr.gap, lw=1.0, ls="--", color=line.get_color()
            )
    ax.axhline(0.0, color="k", lw=0.6)
    ax.axhline(100 * margin, color="k", lw=0.6, ls=":")
    ax.set_xlabel("s after the start")
    ax.set_ylabel("smallest leg gap [cm]")
    ax.set_title(title + " (MuJoCo solid, training simulator dashed)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    write_figure_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bcg.studies.leg_gaps", description=__doc__.split("\n\n")[0])
    p.add_argument("policy", metavar="POLICY", help="policy file (.h5)")
    p.add_argument("--runs", type=int, default=10, help="starts, seeds SEED.. as sim2sim's (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=10.0, help="s each run lasts at most (default 10)")
    p.add_argument("--start-time", type=float, help="clip time of every start (default: random, as sim2sim)")
    p.add_argument(
        "--training-sim", choices=("on", "off"), default="on", help="also play each run in bcg.sim"
    )
    p.add_argument("--plot", type=Path, help="write each run's smallest gap over time as a PNG")
    args = p.parse_args(argv)
    if args.runs < 1 or not 0.0 < args.seconds <= 60.0:
        p.error("--runs must be at least 1 and --seconds within (0, 60]")
    if args.start_time is not None and args.start_time < 0.0:
        p.error(f"--start-time must be >= 0, got {args.start_time}")
    try:
        policy, clip = load_checked(args.policy)
        default = EnvConfig().leg_clearance_margin  # a policy file from before the term stored none
        margin = float(policy.config.get("env", {}).get("leg_clearance_margin", default))
        rows = compare(
            policy, clip, args.runs, args.seed, args.seconds, args.start_time, args.training_sim == "on"
        )
    except (PolicyFileError, MotionFileError, mr.EvaluationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.policy}: {policy.motion_name}, {args.runs} runs of up to {args.seconds:g} s from seed "
        f"{args.seed}; smallest gap between the legs' capsules [cm] (negative: crossing), the pair, "
        f"control steps within the policy's {100 * margin:g} cm margin, fall [s after the start]"
    )
    head = "smallest gap | closest pair | steps within | fall"
    print(f"| run | start [s] | MuJoCo: {head} | training sim: {head} | joints apart there [rad] |")
    print("|---|---|" + "---|" * 9)
    for i, (start, mj, tr, apart) in enumerate(rows):
        there = "–" if apart is None else f"{apart:.3f}"
        print(f"| {i + 1} | {start:.2f} | {_cell(mj, margin)} | {_cell(tr, margin)} | {there} |")
    touch = [i + 1 for i, (_, mj, _, _) in enumerate(rows) if mj.gap.min() < 0.0]
    print(f"runs whose legs cross in MuJoCo: {len(touch)}/{args.runs}" + (f" ({touch})" if touch else ""))
    if args.training_sim == "on":
        cross = [i + 1 for i, (_, _, tr, _) in enumerate(rows) if tr.gap.min() < 0.0]
        print(
            f"runs whose legs cross in the training simulator: {len(cross)}/{args.runs}"
            + (f" ({cross})" if cross else "")
        )
    if args.plot is not None:
        write_plot(args.plot, rows, margin, f"{Path(args.policy).name}: {policy.motion_name}")
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
