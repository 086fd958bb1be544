"""How much the policy gradient of a training window scatters over nearby start states, with and
without bundled contact gradients.

    python -m bcg.studies.gradscatter RUN_DIR|checkpoint.h5 [--windows 12] [--offset 0.002]
                                    [--modes none gaussian phase] [--plot scatter.png] [--set field=value]

The paper's case for BCG is made at the level of the learner: near a stiff contact, "rollouts that
start close together disagree about which direction improves the return, and first-order learning
stalls". ``python -m bcg.studies.contact_gradient`` measures that for one scalar derivative of one scene; this
command measures it for the gradient SHAC actually steps along. It loads a checkpoint and, for each
mode (``none``: no BCG; ``gaussian``: the paper's draws; ``phase``: copies spread over one physics step,
:attr:`bcg.sim.BundleConfig.sampling`), runs K windows from the checkpoint's learner state: the same
resets, action noise, domain randomisation and bundle draws, the same policy, critic and normalisers.
The K windows differ only in their start states: every environment's pelvis is moved up or down by
its own offset ~ U(-offset, offset) (the same K sets of offsets in every mode; `--offset 0` repeats
one window K times, whose gradients must agree to round-off). Over the K windows it reports:

- ``rel``: the policy gradient's scatter, sqrt(mean_k |g_k - g|^2) / |g| with g the mean of the
  g_k (all actor parameters, unclipped): 0 when nearby windows agree, about 1 when their
  disagreement is as large as what they agree on;
- ``cos``: the mean cosine between each g_k and g;
- ``nsr``: the same for the action gradients dL/da_k of every environment and step (the signal
  the simulator's reverse pass hands the policy), sum of variances over sum of squared means: the
  finer-grained view, before the sum over environments and steps averages part of the scatter away;
- the window loss (mean and standard deviation) and the share of env-steps that opened a bundle.

Bad input (a missing or unreadable checkpoint, a negative offset, fewer than two windows) exits
with status 2 and a message.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np

from bcg.learn import train
from bcg.learn.config_io import apply_overrides
from bcg.learn.runfolder import FIXED_ON_INIT, config_changes

MODES = {
    "none": ["env.bcg=false"],
    "gaussian": ["env.bcg=true", "env.bcg_sampling=gaussian"],
    "phase": ["env.bcg=true", "env.bcg_sampling=phase"],
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bcg.studies.gradscatter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="a training run folder (its checkpoint.h5) or a checkpoint file")
    p.add_argument("--windows", type=int, default=12, help="windows K per mode (at least 2)")
    p.add_argument("--offset", type=float, default=0.002, help="m, half-width of the pelvis height offsets")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--seed", type=int, default=0, help="seed of the offsets")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of the cosines per mode")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="config override for every mode (e.g. env.kappa=50, env.contact_margin=0)",
    )
    p.add_argument("--arch", choices=["cpu", "cuda"], default="cpu")
    return p


def _flat(grads: dict) -> np.ndarray:
    return np.concatenate([np.asarray(grads[k], np.float64).ravel() for k in sorted(grads)])


def scatter(gradients: np.ndarray, action_grads: np.ndarray | None = None) -> dict:
    """Agreement of K gradients of nearby windows.

    Args:
        gradients: (K, P) flattened policy gradients.
        action_grads: (K, ...) per-window action gradients, or None.

    Returns:
        {"rel", "cos" (K,), "norm" (|mean|), "nsr" (nan without action_grads)}.
    """
    g = np.asarray(gradients, np.float64)
    if g.ndim != 2 or len(g) < 2:
        raise ValueError(f"need (K >= 2, P) gradients, got shape {g.shape}")
    mean = g.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    spread = float(np.sqrt(np.mean(np.sum((g - mean) ** 2, axis=1))))
    norms = np.linalg.norm(g, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = spread / norm if norm > 0 else float("inf") if spread > 0 else 0.0
        cos = (g @ mean) / (norms * norm)
    nsr = float("nan")
    if action_grads is not None:
        a = np.asarray(action_grads, np.float64).reshape(len(g), -1)
        signal = float(np.sum(a.mean(axis=0) ** 2))
        noise = float(np.sum(a.var(axis=0)))
        nsr = noise / signal if signal > 0 else float("inf") if noise > 0 else 0.0
    return {"rel": rel, "cos": cos, "norm": norm, "nsr": nsr}


def windows(shac, offsets: np.ndarray, progress=None) -> dict:
    """K windows of ``shac`` from its current state, the k-th with every environment's pelvis moved
    by ``offsets[k]`` (m, (K, N)); the learner is restored afterwards.

    Returns:
        {"grads" (K, P), "action_grads" (K, horizon, N, A), "loss" (K,), "trigger" (K,)}.
    """
    start = copy.deepcopy(shac.state_dict())
    env = shac.env
    out = {"grads": [], "action_grads": [], "loss": [], "trigger": []}
    try:
        for k, dz in enumerate(offsets):
            shac.load_state_dict(copy.deepcopy(start))
            begin = env.begin_window

            def begin_moved(dz=dz, begin=begin):
                # the resets the window would make, then the offsets, then the window as usual
                idx = np.flatnonzero(env.needs_reset)
                if len(idx):
                    env._reset(idx)
                env.needs_reset[:] = False
                env.qpos[:, 2] += dz
                return begin()

            env.begin_window = begin_moved
            try:
                result = shac.iteration_step(update=False)
            finally:
                del env.begin_window  # the class's method again
            if "actor_grads" not in result:
                raise RuntimeError("a window was skipped (non-finite state or loss): no gradient to compare")
            out["grads"].append(_flat(result["actor_grads"]))
            out["action_grads"].append(result["action_grads"])
            out["loss"].append(float(result["actor_loss"]))
            out["trigger"].append(float(result.get("bcg_trigger_rate", float("nan"))))
            if progress is not None:
                progress(k + 1, len(offsets))
    finally:  # restored on an error too
        shac.load_state_dict(copy.deepcopy(start))
    return {key: np.asarray(value) for key, value in out.items()}


def format_report(rows: list[tuple[str, dict, dict]]) -> str:
    """A table, one line per mode: (mode, :func:`scatter`'s result, :func:`windows`'s result)."""
    lines = [
        f"{'mode':>9} {'rel':>7} {'cos':>6} {'cos min':>7} {'nsr':>8} {'|g|':>9} {'loss':>10} "
        f"{'loss std':>9} {'trigger':>7}"
    ]
    for mode, s, w in rows:
        trig = np.nanmean(w["trigger"]) if np.isfinite(w["trigger"]).any() else float("nan")
        lines.append(
            f"{mode:>9} {s['rel']:7.3f} {np.mean(s['cos']):6.3f} {np.min(s['cos']):7.3f} {s['nsr']:8.3f} "
            f"{s['norm']:9.3g} {np.mean(w['loss']):10.4g} {np.std(w['loss']):9.2g} {trig:7.3f}"
        )
    for mode, s, _ in rows:
        lines.append(f"gradscatter_rel_{mode}={s['rel']:.4f}")
        lines.append(f"gradscatter_nsr_{mode}={s['nsr']:.4f}")
    return "\n".join(lines)


def plot(rows: list[tuple[str, dict, dict]], path: Path, title: str) -> None:
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for i, (mode, s, _) in enumerate(rows):
        ax[0].scatter(np.full(len(s["cos"]), i), s["cos"], alpha=0.6)
        ax[1].bar(i, s["rel"], label=f"{mode}: rel {s['rel']:.2f}, nsr {s['nsr']:.2f}")
    names = {"none": "no BCG", "gaussian": "BCG, the paper's draws", "phase": "BCG, phase copies"}
    for a in ax:
        a.set_xticks(range(len(rows)), [names.get(m, m) for m, _, _ in rows])
    ax[0].set_ylabel("cos(g_k, mean g)")
    ax[0].set_title("each window's gradient against the mean")
    ax[1].set_ylabel("rms |g_k - mean g| / |mean g|")
    ax[1].set_title("relative scatter")
    ax[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    path = Path(args.run)
    path = path / "checkpoint.h5" if path.is_dir() else path
    if args.windows < 2 or not args.offset >= 0:
        print("error: --windows must be at least 2 and --offset not negative", file=sys.stderr)
        return 2
    try:
        state, stored, motion_hash = train.load_checkpoint(path, action="measure")
        clip = train.load_motion(stored, motion_hash, action="measure")
        configs = {mode: apply_overrides(stored, args.set + MODES[mode]) for mode in args.modes}
    except (train.UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    fixed = [
        change
        for cfg in configs.values()
        for change in config_changes(stored, cfg)
        if change.split(" ", 1)[0] in FIXED_ON_INIT
    ]
    if fixed:
        print(
            f"error: {'; '.join(sorted(set(fixed)))} cannot change: the checkpoint's environments, random "
            "generators and networks are measured as they are",
            file=sys.stderr,
        )
        return 2
    # Taichi, slow to import, loads once the arguments are checked
    import bcg.sim

    bcg.sim.init(arch=args.arch, precision="float32")
    n = stored.num_envs
    offsets = np.random.default_rng(args.seed).uniform(-args.offset, args.offset, (args.windows, n))
    rows = []
    for mode, cfg in configs.items():
        print(
            f"{mode}: building the learner (kernels load or compile on first use)",
            file=sys.stderr,
            flush=True,
        )
        _, shac = train.build(cfg, None, log=lambda message: None, clip=clip)
        if cfg.env.bcg and not shac.env.has_contact:
            print(f"{mode}: skipped, the simulator has no contact (env.contact=false)", file=sys.stderr)
            continue
        try:
            train.restore(shac, state, path, action="measure")
        except train.UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        t0 = time.time()

        def progress(done, total, mode=mode, t0=t0):
            rate = done / (time.time() - t0)
            print(
                f"{mode}: window {done}/{total}, {rate:.2f} windows/s, eta {(total - done) / rate:.0f} s",
                file=sys.stderr,
                flush=True,
            )

        try:
            w = windows(shac, offsets, progress)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        rows.append((mode, scatter(w["grads"], w["action_grads"]), w))
        del shac
    if not rows:
        print("error: no mode to measure", file=sys.stderr)
        return 2
    env = configs[rows[0][0]].env
    title = (
        f"{path.parent.name}/{path.name} (iteration {int(np.asarray(state.get('iteration', 0)))}): "
        f"kappa {env.kappa:g}, "
        f"margin {'4.6/kappa' if env.contact_margin is None else f'{env.contact_margin:g} m'}, {n} envs, "
        f"{args.windows} windows, pelvis offsets U(-{args.offset * 1e3:g}, {args.offset * 1e3:g}) mm, "
        f"{env.imitation_reward} reward"
    )
    print(title)
    print(format_report(rows))
    if args.plot is not None:
        plot(rows, args.plot, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
