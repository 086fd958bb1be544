"""Taichi kernel launches of one SHAC iteration at the training defaults, by kernel.

Builds the learner as ``python -m bcg.learn.train`` does (the updates in the learner's process, so
that every launch is this process's), runs one iteration to compile, then counts every Taichi kernel
call of the next one and its wall time (launch included: on a CPU a call returns when the kernel has
run). Prints a table of the kernels with the most time, then ``name=value`` lines:

    launches_per_iteration, seconds_in_launches: all calls of the timed iteration
    contact_stats_fill_ms, contact_stats_kernel_ms: clearing a step's contact-force statistics with
        two ``field.fill(0)`` calls (Taichi's Python-scope fill) against the simulator's one kernel
        (``_clear_contact_stats``), mean of 50 calls each, alternated, each after a 5 ms pause (in
        training numpy runs between the steps and Taichi's CPU thread pool goes idle);
        ``..._fill_over_kernel`` their ratio

Usage: ``python benchmarks/bench_launches.py [--envs 64] [--kappa 300] [--top 25]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))  # as in training
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import collections  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--kappa", type=float, default=300.0)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)

    from taichi.lang import kernel_impl

    import bcg.sim
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import apply_overrides
    from bcg.learn.train import build

    cfg = apply_overrides(
        TrainConfig(), [f"num_envs={args.envs}", f"env.kappa={args.kappa}", "critic_worker=false"]
    )
    bcg.sim.init(arch="cpu", precision="float32")
    _, shac = build(cfg, None, log=lambda m: None)
    shac.iteration_step()  # compiles
    counts, seconds = collections.Counter(), collections.Counter()
    call = kernel_impl.Kernel.__call__

    def timed(kernel, *a, **k):
        t0 = time.perf_counter()
        out = call(kernel, *a, **k)
        name = kernel.func.__qualname__
        if kernel.autodiff_mode != kernel_impl.AutodiffMode.NONE:
            name += ".grad"
        counts[name] += 1
        seconds[name] += time.perf_counter() - t0
        return out

    kernel_impl.Kernel.__call__ = timed
    try:
        shac.iteration_step()
    finally:
        kernel_impl.Kernel.__call__ = call
    total = sum(seconds.values())
    print(f"{'calls':>6} {'ms/call':>8} {'s':>7} {'share':>6}  kernel")
    for name, s in seconds.most_common(args.top):
        print(f"{counts[name]:6d} {1e3 * s / counts[name]:8.3f} {s:7.3f} {s / total:6.1%}  {name}")

    sim = shac.env.sim
    fill, kernel = [], []
    for _ in range(50):
        # as in training, where numpy runs between the steps, Taichi's CPU thread pool goes idle
        # before each call (a parallel kernel such as fill wakes it; the simulator's serial ones
        # run on the calling thread)
        time.sleep(0.005)
        t0 = time.perf_counter()
        sim.ground.con_force.fill(0)
        sim.ground.con_force_max.fill(0)
        fill.append(time.perf_counter() - t0)
        time.sleep(0.005)
        t0 = time.perf_counter()
        sim._clear_contact_stats()
        kernel.append(time.perf_counter() - t0)
    print(f"launches_per_iteration={sum(counts.values())}")
    print(f"seconds_in_launches={total:.4g}")
    print(f"contact_stats_fill_ms={1e3 * sum(fill) / len(fill):.4g}")
    print(f"contact_stats_kernel_ms={1e3 * sum(kernel) / len(kernel):.4g}")
    print(f"contact_stats_fill_over_kernel={sum(fill) / sum(kernel):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
