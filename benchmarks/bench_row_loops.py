"""Serial against parallel loops over the rows on a CPU: the simulator and the learner, each built
twice in one process.

Taichi 1.7's CPU backend gives a parallel loop of fewer than 1,024 iterations one task (its adaptive
block size is at least 512), so the simulator's loops over its rows (64 environments plus the
active bundle copies) run on one pool thread either way: parallel, they only add the hand-over to
the pool and back. ``Simulator`` therefore runs them on the launching thread on a CPU (up to
``SERIAL_STAGE_ENVS`` environments). This script builds each twice, the second with the row loops
parallel (``SERIAL_STAGE_ENVS = 0`` before it is built), and times the two alternately (paired,
the order swapped every pair, so that this machine's drift falls on both): 32-step windows of the
standing G1 with contact, forward and reverse, as in ``bench_sim.py``; then SHAC iterations at the
training defaults.

Prints ``name=value`` lines: the CPU cores a plain parallel Taichi loop keeps busy over 64 rows and
over 4,096 rows of the same total work (about 1 where the loop is one task, up to the core count),
then for the window and for the iteration the mean seconds of each, ``parallel_over_serial`` (ratio
of the means) and the number of pairs in which serial was faster.

Usage: ``python benchmarks/bench_row_loops.py [--pairs 6] [--envs 64] [--kappa 300] [--skip-training]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def probe_cores(rows: int, work: int, calls: int = 10) -> float:
    """CPU time over wall time of a parallel Taichi loop over ``rows`` independent rows of
    ``work`` multiply-adds each: about 1 where the loop runs as one task, up to the core count."""
    import taichi as ti

    out = ti.field(ti.f32, shape=rows)

    @ti.kernel
    def rows_loop():
        for i in range(rows):
            acc = ti.cast(i, ti.f32)
            for _ in range(work):
                acc = acc * 0.9999999 + 1.0
            out[i] = acc

    rows_loop()
    ti.sync()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        rows_loop()
    ti.sync()
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def paired(run_a, run_b, pairs: int, label: str) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of ``run_a`` and ``run_b`` called alternately, the order swapped every pair."""
    ta, tb = [], []
    for i in range(pairs):
        for run, times in ((run_a, ta), (run_b, tb)) if i % 2 == 0 else ((run_b, tb), (run_a, ta)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        sys.stderr.write(f"{label} pair {i + 1}/{pairs}: serial {ta[-1]:.2f} s, parallel {tb[-1]:.2f} s\n")
    return np.array(ta), np.array(tb)


def report(prefix: str, ta: np.ndarray, tb: np.ndarray) -> None:
    print(f"{prefix}_serial_seconds={ta.mean():.4g}")
    print(f"{prefix}_parallel_seconds={tb.mean():.4g}")
    print(f"{prefix}_parallel_over_serial={tb.mean() / ta.mean():.4g}")
    print(f"{prefix}_pairs_serial_faster={int((tb > ta).sum())}/{len(ta)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--kappa", type=float, default=300.0)
    p.add_argument("--skip-training", action="store_true", help="only the probe and the simulator window")
    args = p.parse_args(argv)

    import taichi as ti

    import bcg.sim
    import bcg.sim.rollout as rollout
    from bcg.learn.config import TrainConfig, apply_overrides
    from bcg.learn.train import build

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_sim import standing_window

    bcg.sim.init(arch="cpu", precision="float32")
    # the same arithmetic (2.6e7 multiply-adds per call) split over 64 and over 4,096 rows
    print(f"taichi_parallel_cores_64_rows={probe_cores(64, 400_000):.3g}")
    print(f"taichi_parallel_cores_4096_rows={probe_cores(4096, 6_250):.3g}")

    def both(make):
        """``make()`` with the row loops serial, then with them parallel."""
        a = make()
        saved = rollout.SERIAL_STAGE_ENVS
        rollout.SERIAL_STAGE_ENVS = 0
        try:
            b = make()
        finally:
            rollout.SERIAL_STAGE_ENVS = saved
        return a, b

    # the simulator alone: the G1 standing on its 8 foot spheres, 32-step windows forward and reverse
    contact = bcg.sim.ContactConfig(kappa=args.kappa)
    (sim_a, win_a), (sim_b, win_b) = both(lambda: standing_window(args.envs, 32, contact=contact))
    if not sim_a._serial_rows or sim_b._serial_rows:
        sys.exit("the two simulators do not differ in their row loops (not on a CPU?)")

    def timed(window):
        def run():
            window()
            ti.sync()

        return run

    win_a(), win_b()  # compile
    report("window", *paired(timed(win_a), timed(win_b), 2 * args.pairs, "window"))
    if args.skip_training:
        return 0

    cfg = apply_overrides(TrainConfig(), [f"num_envs={args.envs}", f"env.kappa={args.kappa}"])
    quiet = lambda m: None  # noqa: E731
    (_, serial), (_, parallel) = both(lambda: build(cfg, None, log=quiet))
    for name, learner in (("serial", serial), ("parallel", parallel)):
        t0 = time.perf_counter()
        learner.iteration_step()  # compiles
        sys.stderr.write(f"{name}: first iteration {time.perf_counter() - t0:.1f} s\n")
    report("iteration", *paired(serial.iteration_step, parallel.iteration_step, args.pairs, "iteration"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
