"""Training throughput: seconds per SHAC iteration at the paper's settings, and peak memory.

Builds the learner exactly as ``python -m bcg.learn.train`` does (``bcg.learn.train.build``), runs
``--warmup`` iterations (kernel compilation, caches), then times ``--iterations`` more.

Prints ``name=value`` lines:
    seconds_per_iteration: mean wall time of the timed iterations
    time_rollout / time_backward / time_critic / time_disc: mean seconds per phase
    env_steps_per_second: num_envs * horizon / seconds_per_iteration
    peak_rss_mb: the process's peak resident memory
    bcg_trigger_rate, nan_grad_envs: mean over the timed iterations
    num_envs, horizon, contact, bcg, kappa, blas_threads

Usage: ``python benchmarks/bench_train.py [--envs 64] [--horizon 32] [--kappa 300] [--no-bcg]
[--no-contact] [--iterations 3] [--warmup 1]``. ``OPENBLAS_NUM_THREADS`` defaults to 1 as in training;
set it before the command to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--horizon", type=int, default=32)
    p.add_argument("--kappa", type=float, default=300.0)
    p.add_argument("--bcg", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--contact", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--motion", default="run")
    p.add_argument("--arch", choices=("cpu", "cuda"), default="cpu", help="Taichi backend (default cpu)")
    args = p.parse_args(argv)

    import taichi as ti

    import bcg.sim
    from bcg.learn.config import TrainConfig, apply_overrides
    from bcg.learn.env import contact_available
    from bcg.learn.train import build

    bcg.sim.init(arch=args.arch, precision="float32")
    cfg = apply_overrides(
        TrainConfig(),
        [
            f"num_envs={args.envs}",
            f"horizon={args.horizon}",
            f"env.kappa={args.kappa}",
            f"env.bcg={args.bcg}",
            f"env.contact={args.contact}",
            f"env.motion={args.motion}",
        ],
    )
    _, shac = build(cfg, None, log=lambda m: sys.stderr.write(m + "\n"))
    for i in range(args.warmup):
        t0 = time.perf_counter()
        shac.iteration_step()
        sys.stderr.write(f"warm-up iteration {i + 1}/{args.warmup}: {time.perf_counter() - t0:.1f} s\n")
    rows = []
    for i in range(args.iterations):
        t0 = time.perf_counter()
        stats = shac.iteration_step()
        stats["time_iteration"] = time.perf_counter() - t0
        rows.append(stats)
        sys.stderr.write(f"iteration {i + 1}/{args.iterations}: {stats['time_iteration']:.1f} s\n")

    def mean(key):
        values = [r.get(key, np.nan) for r in rows]
        return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")

    seconds = mean("time_iteration")
    out = {
        "seconds_per_iteration": seconds,
        "time_rollout": mean("time_rollout"),
        "time_backward": mean("time_backward"),
        "time_critic": mean("time_critic"),
        "time_disc": mean("time_disc"),
        "env_steps_per_second": args.envs * args.horizon / seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bcg_trigger_rate": mean("bcg_trigger_rate"),
        "nan_grad_envs": mean("nan_grad_envs"),
        "num_envs": args.envs,
        "horizon": args.horizon,
        "contact": int(shac.env.has_contact),
        "contact_available": int(contact_available()),
        "bcg": int(args.bcg and shac.env.has_contact),
        "kappa": args.kappa,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "arch": ti.lang.impl.current_cfg().arch.name,
    }
    for name, value in out.items():
        print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
