"""The critic fit and the discriminator's steps in a worker process, against in the learner's.

Builds the training learner twice in one process, ``critic_worker=True`` (the default) and
``critic_worker=False``, and times SHAC iterations of the two alternately (paired, the order swapped
every pair, so that this machine's drift falls on both). With the worker the critic phase is the wait
for its fit after the next rollout and the discriminator phase the wait for its steps after the
reverse pass; the rollout and the reverse pass share the machine with them.

Prints ``name=value`` lines: mean seconds per iteration and per phase of each, ``inproc_over_worker``
(ratio of the mean iteration times) and the number of pairs in which the worker was faster.

Usage: ``python benchmarks/bench_critic_worker.py [--pairs 8] [--envs 64] [--kappa 300]``
(``OPENBLAS_NUM_THREADS`` and ``OPENBLAS_THREAD_TIMEOUT`` default to training's settings.)
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))  # as in training
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as in training
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

PHASES = ("time_rollout", "time_backward", "time_critic", "time_disc")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--kappa", type=float, default=300.0)
    args = p.parse_args(argv)

    import bcg.sim
    from bcg.learn.config import TrainConfig
    from bcg.learn.config_io import apply_overrides
    from bcg.learn.train import build

    bcg.sim.init(arch="cpu", precision="float32")
    learners = {}
    for name, flag in (("worker", True), ("inproc", False)):
        cfg = apply_overrides(
            TrainConfig(), [f"num_envs={args.envs}", f"env.kappa={args.kappa}", f"critic_worker={flag}"]
        )
        learners[name] = build(cfg, None, log=lambda m: None)[1]
        t0 = time.perf_counter()
        learners[name].iteration_step()  # compiles
        sys.stderr.write(f"{name}: first iteration {time.perf_counter() - t0:.1f} s\n")
    times = {k: [] for k in learners}
    phases = {k: [] for k in learners}
    for i in range(args.pairs):
        for name in ("worker", "inproc") if i % 2 == 0 else ("inproc", "worker"):
            t0 = time.perf_counter()
            stats = learners[name].iteration_step()
            times[name].append(time.perf_counter() - t0)
            phases[name].append([stats[k] for k in PHASES])
        sys.stderr.write(
            f"pair {i + 1}/{args.pairs}: worker {times['worker'][-1]:.2f} s, "
            f"in process {times['inproc'][-1]:.2f} s\n"
        )
    for name in learners:
        print(f"{name}_seconds_per_iteration={np.mean(times[name]):.4g}")
        for key, value in zip(PHASES, np.mean(phases[name], axis=0), strict=True):
            print(f"{name}_{key}={value:.4g}")
    d = np.array(times["inproc"]) - np.array(times["worker"])
    print(f"inproc_over_worker={np.mean(times['inproc']) / np.mean(times['worker']):.4g}")
    print(f"pairs_worker_faster={int((d > 0).sum())}/{len(d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
