"""Check a training run's policy gradient against the change of its loss.

    python -m bcg.learn.gradcheck RUN_DIR|checkpoint.h5 [--alphas 1e-4 1e-3 1e-2] [--tolerance 0.05]

The learner's gradient is only as good as the whole chain behind it: simulator adjoints through
contact and bundles, observation and ADD feature VJPs, the critic's bootstrap, the policy network.
This command checks the chain end to end on a real run. It loads the checkpoint and runs one SHAC
window (rollout and reverse pass, no update) for the actor loss L(θ) and its gradient g. Then, for
each step size α, it repeats the same window from the same learner state (same resets, action noise,
randomisation and bundle draws) at θ + αu and θ − αu, u = g/|g|, and prints the central difference
(L(θ + αu) − L(θ − αu)) / 2α beside |g|, the derivative along u that the gradient predicts.

A right gradient gives a ratio near 1 at small α; the ratio drifts at larger α where the loss
curves. A stiff contact event that a perturbed window crosses differently (a touchdown one substep
earlier, a bundle that opens or not) makes the loss jump: that is the scatter bundled contact
gradients address, and it shows as a ratio far from 1 at every α.

Exit status: 0 when the ratio at the best α (the one closest to 1: too small a step drowns in
float32 rounding, too large a one in curvature) is within ``--tolerance`` of 1, 1 when not, 2 on
bad input (a missing or unreadable checkpoint, a non-positive α). A wrong gradient (a sign error in
one layer, a missing term) is off at every α.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np

from bcg.learn import train


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bcg.learn.gradcheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="a training run folder (its checkpoint.h5) or a checkpoint file")
    p.add_argument(
        "--alphas", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2], help="step sizes along g/|g|"
    )
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed |ratio - 1| at the best alpha")
    p.add_argument("--arch", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["float32", "float64"], default="float32")
    return p


def _direction(grads: dict) -> tuple[dict, float]:
    norm = float(np.sqrt(sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in grads.values())))
    return {k: np.asarray(v, np.float64) / norm for k, v in grads.items()}, norm


def check(shac, alphas, progress=None) -> dict:
    """The central differences of the window loss along the normalised gradient.

    Args:
        shac: a learner (its current state is the point θ; it is restored afterwards).
        alphas: step sizes.
        progress: ``progress(done, total)`` after each window, or None.

    Returns:
        {"loss", "grad_norm", "rows": [(alpha, L(θ+αu) − L, L(θ−αu) − L, central, ratio)]}.
    """
    start = copy.deepcopy(shac.state_dict())
    theta = {k: v.copy() for k, v in start["actor"].items()}
    total, done = 1 + 2 * len(alphas), 0

    def window(params):
        nonlocal done
        shac.load_state_dict(copy.deepcopy(start))
        shac.actor = {k: v.copy() for k, v in params.items()}
        out = shac.iteration_step(update=False)
        done += 1
        if progress is not None:
            progress(done, total)
        if "actor_grads" not in out:
            raise RuntimeError("the window was skipped (non-finite state or loss): no gradient to check")
        return out

    try:
        base = window(theta)
        loss = float(base["actor_loss"])
        u, norm = _direction(base["actor_grads"])
        if not (np.isfinite(loss) and np.isfinite(norm) and norm > 0):
            raise RuntimeError(f"loss {loss} or gradient norm {norm} is not usable")
        rows = []
        for alpha in alphas:
            step = {k: (theta[k] + alpha * u[k]).astype(theta[k].dtype) for k in theta}
            plus = float(window(step)["actor_loss"]) - loss
            step = {k: (theta[k] - alpha * u[k]).astype(theta[k].dtype) for k in theta}
            minus = float(window(step)["actor_loss"]) - loss
            central = (plus - minus) / (2 * alpha)
            rows.append((alpha, plus, minus, central, central / norm))
    finally:
        shac.load_state_dict(copy.deepcopy(start))
    return {"loss": loss, "grad_norm": norm, "rows": rows}


def format_report(result: dict) -> str:
    lines = [
        f"window loss L = {result['loss']:.6g}, gradient norm |g| = {result['grad_norm']:.4g}",
        f"{'alpha':>9} {'L(+a)-L':>12} {'L(-a)-L':>12} {'central':>12} {'ratio':>8}",
    ]
    for alpha, plus, minus, central, ratio in result["rows"]:
        lines.append(f"{alpha:9.1e} {plus:12.4e} {minus:12.4e} {central:12.4e} {ratio:8.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    path = Path(args.run)
    path = path / "checkpoint.h5" if path.is_dir() else path
    if not args.alphas or any(not a > 0 for a in args.alphas) or not args.tolerance > 0:
        print("error: --alphas and --tolerance must be positive", file=sys.stderr)
        return 2
    try:
        state, cfg, motion_hash = train.load_checkpoint(path)
        clip = train.load_motion(cfg, motion_hash, action="check")
    except train.UsageError as exc:
        print(f"error: {str(exc).replace('cannot resume', 'cannot check')}", file=sys.stderr)
        return 2
    # Taichi, slow to import, loads once the arguments are checked
    import bcg.sim

    bcg.sim.init(arch=args.arch, precision=args.precision)
    print(
        f"building the learner of {path} (kernels load or compile on first use)", file=sys.stderr, flush=True
    )
    _, shac = train.build(cfg, None, log=lambda message: None, clip=clip)
    try:
        train.restore(shac, state, path, action="check")
    except train.UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.time()

    def progress(done, total):
        rate = done / (time.time() - t0)
        print(
            f"window {done}/{total}, {rate:.2f} windows/s, eta {(total - done) / rate:.0f} s", file=sys.stderr
        )

    try:
        result = check(shac, sorted(args.alphas), progress)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    alpha, *_, ratio = min(result["rows"], key=lambda row: abs(row[4] - 1.0))
    ok = abs(ratio - 1.0) <= args.tolerance
    verdict = "agrees" if ok else "DISAGREES"
    print(f"{verdict}: best ratio {ratio:.4f} at alpha {alpha:.1e} (tolerance {args.tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
