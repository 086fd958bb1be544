"""Training throughput: seconds per SHAC iteration at the paper's settings, and peak memory.

Builds the learner exactly as ``python -m bcg.learn.train`` does (``bcg.learn.train.build``), runs
``--warmup`` iterations (kernel compilation, caches), then times ``--iterations`` more.

Prints ``name=value`` lines:
    seconds_per_iteration: mean wall time of the timed iterations
    time_rollout / time_backward / time_critic / time_disc: mean seconds per phase
    env_steps_per_second: num_envs * horizon / seconds_per_iteration
    critic_gflop, gemm_gflops, critic_floor_s, critic_over_floor: the critic fit's matrix arithmetic,
        this process's float32 matrix-product rate, their quotient (the least time the critic phase
        can take with this BLAS) and the measured critic phase over it
    cpu_cores_busy: the process's CPU time over wall time during the timed iterations (2.0 would be
        both cores of this machine busy throughout)
    worker_cores_busy: the same for the update worker process (``critic_worker``; read from
        /proc, NaN where there is none), and ``total_cores_busy`` the two together
    peak_rss_mb: the process's peak resident memory
    bcg_trigger_rate, live_fraction, nan_grad_envs: mean over the timed iterations
    num_envs, horizon, contact, bcg, kappa, blas_threads

Usage: ``python benchmarks/bench_train.py [--envs 64] [--horizon 32] [--kappa 300] [--no-bcg] [--no-contact]
[--iterations 3] [--warmup 1] [--set FIELD=VALUE ...]``. ``OPENBLAS_NUM_THREADS`` defaults to one per core (at
most 8) as in training; set it before the command to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))  # as in training
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as in training
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def critic_floor(shac, cfg) -> dict[str, float]:
    """The critic phase's matrix arithmetic and the least time it can take here.

    Counts the multiply-adds of the critic fit (every pass, minibatch and ensemble member: the
    forward, the weight gradients and the hidden layers' input gradients), measures this process's
    float32 matrix-product rate at the fit's largest product (minibatch x observation x first
    width, with the BLAS threads in use) and divides: seconds no implementation on this machine's
    BLAS can beat. LayerNorm, ELU, Adam and the shuffles come on top."""
    widths = [shac.env.obs_dim, *cfg.critic.hidden, 1]
    layers = list(zip(widths[:-1], widths[1:]))
    per_sample = 2 * sum(i * o for i, o in layers)  # forward
    per_sample += 2 * sum(i * o for i, o in layers)  # weight gradients
    per_sample += 2 * sum(i * o for i, o in layers[1:])  # input gradients of the hidden layers
    samples = cfg.num_envs * cfg.horizon * cfg.critic.iterations * cfg.critic.ensemble_size
    flops = per_sample * samples
    rng = np.random.default_rng(0)
    batch = max(cfg.num_envs * cfg.horizon // cfg.critic.minibatches, 1)
    a = rng.standard_normal((batch, widths[0])).astype(np.float32)
    w = rng.standard_normal((widths[0], widths[1])).astype(np.float32)
    for _ in range(3):
        a @ w
    reps, t0 = 30, time.perf_counter()
    for _ in range(reps):
        a @ w
    rate = 2 * batch * widths[0] * widths[1] * reps / (time.perf_counter() - t0)
    return {"gflop": flops / 1e9, "gflops": rate / 1e9, "seconds": flops / rate}


def worker_cpu_seconds(shac) -> float:
    """CPU seconds the learner's update worker process has used so far (NaN without one, or
    without Linux's /proc)."""
    updates = getattr(shac, "updates", None)  # PPO has no update worker
    worker = updates.worker if updates is not None else None
    if worker is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{worker._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


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
    p.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="config override, as in training"
    )
    args = p.parse_args(argv)

    import taichi as ti

    import bcg.sim
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import ConfigError, apply_overrides
    from bcg.learn.train import build

    try:
        cfg = apply_overrides(
            TrainConfig(),
            [
                f"num_envs={args.envs}",
                f"horizon={args.horizon}",
                f"env.kappa={args.kappa}",
                f"env.bcg={args.bcg}",
                f"env.contact={args.contact}",
                f"env.motion={args.motion}",
                *args.set,
            ],
        )
    except ConfigError as exc:
        p.error(str(exc))
    bcg.sim.init(arch=args.arch, precision="float32")
    _, shac = build(cfg, None, log=lambda m: sys.stderr.write(m + "\n"))
    for i in range(args.warmup):
        t0 = time.perf_counter()
        shac.iteration_step()
        sys.stderr.write(f"warm-up iteration {i + 1}/{args.warmup}: {time.perf_counter() - t0:.1f} s\n")
    rows = []
    cpu0, wall0, worker0 = time.process_time(), time.perf_counter(), worker_cpu_seconds(shac)
    for i in range(args.iterations):
        t0 = time.perf_counter()
        stats = shac.iteration_step()
        stats["time_iteration"] = time.perf_counter() - t0
        rows.append(stats)
        sys.stderr.write(f"iteration {i + 1}/{args.iterations}: {stats['time_iteration']:.1f} s\n")

    def mean(key):
        values = [r.get(key, np.nan) for r in rows]
        return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")

    wall = time.perf_counter() - wall0
    cores_busy = (time.process_time() - cpu0) / wall
    worker_busy = (worker_cpu_seconds(shac) - worker0) / wall
    seconds = mean("time_iteration")
    floor = critic_floor(shac, cfg)
    out = {
        "seconds_per_iteration": seconds,
        "time_rollout": mean("time_rollout"),
        "time_backward": mean("time_backward"),
        "time_critic": mean("time_critic"),
        "time_disc": mean("time_disc"),
        "env_steps_per_second": args.envs * args.horizon / seconds,
        "critic_gflop": floor["gflop"],
        "gemm_gflops": floor["gflops"],
        "critic_floor_s": floor["seconds"],
        "critic_over_floor": mean("time_critic") / floor["seconds"],
        "cpu_cores_busy": cores_busy,
        "worker_cores_busy": worker_busy,
        "total_cores_busy": cores_busy + worker_busy,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bcg_trigger_rate": mean("bcg_trigger_rate"),
        "live_fraction": mean("live_fraction"),
        "nan_grad_envs": mean("nan_grad_envs"),
        "num_envs": args.envs,
        "horizon": args.horizon,
        "contact": int(shac.env.has_contact),
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
