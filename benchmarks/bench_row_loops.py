"""Serial against parallel loops over the rows on a CPU: the simulator and the learner, each built
twice in one process.

Taichi 1.7's CPU backend cuts a range-for of fewer than 32,768 iterations into tasks of 512 (its
adaptive block size; ``ti.loop_config(block_dim=...)`` does not change it), so a plain parallel loop
over the simulator's rows (64 environments plus the active bundle copies) is one task on one pool
thread. ``--compare spread`` (default) measures what the simulator does about it: its heavy row loops
run over 512 x T items, T of the pool's threads, each task taking one block of consecutive rows
(``SimConfig.cpu_threads``; by default one thread per 32 environments). Both sides are built in
this process, with ``cpu_threads=1`` (every row on the launching thread) and with the default
spread, and timed alternately (paired, the order swapped every pair, so that this machine's drift
falls on both): 32-step windows of the standing G1 with contact, forward and reverse, as in
``bench_sim.py``; then SHAC iterations at the training defaults, where the learner keeps the rows on
its own thread (``cpu_threads=1``, its update worker busy on the other core) against the same
learner with the rows spread. ``--compare parallel`` measures the earlier choice instead: the row
loops serial against plain parallel loops (``SERIAL_STAGE_ENVS = 0`` before the second is built).

Prints ``name=value`` lines: the CPU cores a plain parallel Taichi loop keeps busy over 64 rows and
over 4,096 rows of the same total work (about 1 where the loop is one task, up to the core count),
then for the window and for the iteration the mean seconds of each side, the ratio of the means
(second over first) and the number of pairs in which the first was faster.

Usage: ``python benchmarks/bench_row_loops.py [--compare spread|parallel] [--pairs 6] [--envs 64]
[--kappa 300] [--skip-training]``
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


def paired(
    run_a, run_b, pairs: int, label: str, names=("serial", "parallel")
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of ``run_a`` and ``run_b`` called alternately, the order swapped every pair."""
    ta, tb = [], []
    for i in range(pairs):
        for run, times in ((run_a, ta), (run_b, tb)) if i % 2 == 0 else ((run_b, tb), (run_a, ta)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        sys.stderr.write(
            f"{label} pair {i + 1}/{pairs}: {names[0]} {ta[-1]:.2f} s, {names[1]} {tb[-1]:.2f} s\n"
        )
    return np.array(ta), np.array(tb)


def report(prefix: str, ta: np.ndarray, tb: np.ndarray, names=("serial", "parallel")) -> None:
    a, b = names
    print(f"{prefix}_{a}_seconds={ta.mean():.4g}")
    print(f"{prefix}_{b}_seconds={tb.mean():.4g}")
    print(f"{prefix}_{b}_over_{a}={tb.mean() / ta.mean():.4g}")
    print(f"{prefix}_pairs_{a}_faster={int((tb > ta).sum())}/{len(ta)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", choices=("spread", "parallel"), default="spread")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--kappa", type=float, default=300.0)
    p.add_argument("--skip-training", action="store_true", help="only the probe and the simulator window")
    args = p.parse_args(argv)

    import taichi as ti

    import bcg.sim
    import bcg.sim.rows as rows
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import apply_overrides
    from bcg.learn.train import build

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_sim import standing_window

    bcg.sim.init(arch="cpu", precision="float32")
    # the same arithmetic (2.6e7 multiply-adds per call) split over 64 and over 4,096 rows
    print(f"taichi_parallel_cores_64_rows={probe_cores(64, 400_000):.3g}")
    print(f"taichi_parallel_cores_4096_rows={probe_cores(4096, 6_250):.3g}")

    import bcg.learn.training_sim as learn_sim

    names = ("serial", args.compare)

    def both(make):
        """``make(threads)`` with the row loops on the launching thread, then spread over the
        pool's threads in blocks (``--compare spread``; ``threads`` None) or plain parallel
        (``--compare parallel``)."""
        if args.compare == "spread":
            return make(1), make(None)
        a = make(1)
        saved = rows.SERIAL_STAGE_ENVS
        rows.SERIAL_STAGE_ENVS = 0
        try:
            b = make(1)
        finally:
            rows.SERIAL_STAGE_ENVS = saved
        return a, b

    # the simulator alone: the G1 standing on its 8 foot spheres, 32-step windows forward and reverse
    contact = bcg.sim.ContactConfig(kappa=args.kappa)
    (sim_a, win_a), (sim_b, win_b) = both(
        lambda threads: standing_window(args.envs, 32, contact=contact, cpu_threads=threads)
    )
    differ = sim_b._row_tasks > 1 if args.compare == "spread" else not sim_b._serial_rows
    if not sim_a._serial_rows or not differ:
        sys.exit("the two simulators do not differ in their row loops (not on a CPU, or one thread?)")

    def timed(window):
        def run():
            window()
            ti.sync()

        return run

    win_a(), win_b()  # compile
    report("window", *paired(timed(win_a), timed(win_b), 2 * args.pairs, "window", names), names)
    if args.skip_training:
        return 0

    cfg = apply_overrides(TrainConfig(), [f"num_envs={args.envs}", f"env.kappa={args.kappa}"])
    quiet = lambda m: None  # noqa: E731
    original = learn_sim.make_g1_sim

    def learner(threads):
        """The learner as training builds it, its simulator's rows set to ``threads``."""
        learn_sim.make_g1_sim = lambda *a, **k: original(*a, **{**k, "cpu_threads": threads})
        try:
            return build(cfg, None, log=quiet)
        finally:
            learn_sim.make_g1_sim = original

    (_, serial), (_, other) = both(learner)
    for name, one in zip(names, (serial, other)):
        t0 = time.perf_counter()
        one.iteration_step()  # compiles
        sys.stderr.write(f"{name}: first iteration {time.perf_counter() - t0:.1f} s\n")
    ta, tb = paired(serial.iteration_step, other.iteration_step, args.pairs, "iteration", names)
    report("iteration", ta, tb, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
