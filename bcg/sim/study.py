"""Gradient-variance study: how stiff contact scatters gradients, and how bundling calms them.

    python -m bcg.sim.study [--samples 64] [--steps 15] [--height 0.10] [--spread 0.02] [--kappas 50 100 300]

The G1 in its standing pose is dropped onto its feet from M nearby heights (height + U(0, spread)
above the standing height; from 10 cm the touchdown's per-sphere forces pass the 400 N threshold). For each sample the command differentiates the pelvis's vertical velocity k
control steps later with respect to the initial pelvis height, d vz(t_k) / d z(0), through the
touchdown, for each kappa with and without bundled contact gradients (B = 10, H = 2, tau = 400 N,
the paper's settings). It prints the mean and standard deviation over the samples per setting, the
ratio of the standard deviations, the trigger rate and the mean foot penetration of the forward
motion, and saves a plot of the per-sample gradients (PNG).
"""

import argparse
import sys
import time

import numpy as np


def gradients(
    kappa: float, bundle: bool, samples: int, steps: int, seed: int, sim=None, height=0.10, spread=0.02
):
    """d vz(t_k)/d z(0) per sample, the trigger rate, and the mean deepest-sphere penetration (m)."""
    import bcg.sim as bs
    from bcg.robot import g1

    if sim is None:
        sim = bs.make_g1(
            samples, max_steps=steps, contact=bs.ContactConfig(kappa=kappa), bundle=bs.BundleConfig(seed=seed)
        )
    sim.set_kappa(kappa)
    sim.set_bundling(bundle)
    rng = np.random.default_rng(seed)
    q = np.tile(g1.default_qpos(sim.mjmodel), (samples, 1))
    q[:, 2] += height + rng.uniform(0.0, spread, samples)
    sim.set_state(q, 0.0)
    sim.reset_stats()
    depth = []
    for _ in range(steps):
        sim.step(np.tile(g1.DEFAULT_JOINT_POS, (samples, 1)))
        depth.append(sim.penetration().max(axis=1))
    seed_grad = np.zeros((samples, sim.nv))
    seed_grad[:, 2] = 1.0
    g = sim.backward(qvel_grad={sim.substep: seed_grad})
    return g.qpos[:, 2], sim.bundle_stats()["trigger_rate"], float(np.mean(depth)), sim


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bcg.sim.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=64, help="nearby initial states (M)")
    parser.add_argument("--steps", type=int, default=15, help="control steps k (20 ms each) after the drop")
    parser.add_argument("--height", type=float, default=0.10, help="m, drop height above standing")
    parser.add_argument("--spread", type=float, default=0.02, help="m, spread of the drop heights")
    parser.add_argument("--kappas", type=float, nargs="+", default=[50.0, 100.0, 300.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="gradient_study.png", help="plot file (PNG)")
    parser.add_argument("--arch", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.samples < 2 or args.steps < 1 or any(k <= 0 for k in args.kappas):
        print("error: need --samples >= 2, --steps >= 1 and positive kappas", file=sys.stderr)
        return 2
    import bcg.sim as bs

    bs.init(arch=args.arch, precision="float32")
    rows, sim = [], None
    settings = [(k, b) for k in args.kappas for b in (False, True)]
    t0 = time.time()
    for i, (kappa, bundle) in enumerate(settings):
        g, rate, depth, sim = gradients(
            kappa, bundle, args.samples, args.steps, args.seed, sim, height=args.height, spread=args.spread
        )
        rows.append((kappa, bundle, g, rate, depth))
        done = i + 1
        eta = (time.time() - t0) / done * (len(settings) - done)
        print(
            f"[{done}/{len(settings)}] kappa={kappa:g} bcg={'on' if bundle else 'off'}  eta {eta:.0f} s",
            file=sys.stderr,
        )
    print(f"d vz(t + {args.steps} steps) / d z(0) over {args.samples} drops")
    print(f"{'kappa':>6} {'BCG':>4} {'mean':>10} {'std':>10} {'trigger':>8} {'penetr. mm':>11}")
    for kappa, bundle, g, rate, depth in rows:
        print(
            f"{kappa:6g} {'on' if bundle else 'off':>4} {g.mean():10.3f} {g.std():10.3f} {rate:8.2%} {1000 * depth:11.2f}"
        )
    for kappa in args.kappas:
        off = next(r for r in rows if r[0] == kappa and not r[1])
        on = next(r for r in rows if r[0] == kappa and r[1])
        print(f"kappa={kappa:g}: std without / with BCG = {off[2].std() / max(on[2].std(), 1e-12):.1f}")
    plot(rows, args.out, args.steps)
    print(f"plot: {args.out}")
    return 0


def plot(rows, path, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kappas = sorted({r[0] for r in rows})
    fig, axes = plt.subplots(1, len(kappas), figsize=(4 * len(kappas), 3.5), squeeze=False)
    for ax, kappa in zip(axes[0], kappas, strict=True):
        for bundle, colour in ((False, "tab:red"), (True, "tab:blue")):
            g = next(r[2] for r in rows if r[0] == kappa and r[1] == bundle)
            label = f"{'BCG' if bundle else 'plain'} (std {g.std():.2f})"
            ax.plot(np.arange(len(g)), g, "o", ms=3, color=colour, label=label)
        ax.set_title(f"kappa = {kappa:g}")
        ax.set_xlabel("sample (initial height)")
        ax.set_ylabel(f"d vz(t+{steps}) / d z0  [1/s]")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
