"""PPO's rollout on bcg.sim without gradients against mujoco.rollout, and its time per iteration.

    python benchmarks/bench_ppo.py [--envs 1024,4096] [--iteration-envs 1024] [--arch cpu|cuda]

Measured in this one command, so that the ratios compare like with like on a noisy machine:

- MuJoCo: ``mujoco.rollout`` with 2 threads on the G1 with its foot capsules as the only floor
  contact (``benchmarks/bench_sim.py``'s scene), standing, a window of 24 control steps.
- bcg.sim (float32, ``requires_grad=False``, κ = 300, the 8 foot spheres, no bundles): the same
  standing window, physics steps (5 ms) per second; and the ratio to MuJoCo's at the same count.
- PPO's whole rollout (:meth:`bcg.learn.ppo.Ppo.rollout`: actor, simulator, observation, ADD reward,
  randomisation, latency, pushes) on Run, control steps (20 ms) per second.
- One PPO iteration with the paper's settings (networks, 5 epochs x 4 minibatches, the
  discriminator's update) at ``--iteration-envs``: seconds of rollout, update (GAE and the minibatch
  passes) and discriminator, the second of two iterations (the first compiles).

The last lines are machine-readable ``name=value``.
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_sim import bench_mujoco  # noqa: E402

from bcg.core import g1  # noqa: E402

STEPS = 24  # PPO's horizon


def bench_forward(envs: int, repeats: int = 2) -> float:
    """Physics steps per second of bcg.sim without gradients, a standing window of STEPS steps."""
    import taichi as ti

    import bcg.sim as bs
    from bcg.g1sim import make_g1

    sim = make_g1(envs, max_steps=STEPS, requires_grad=False, contact=bs.ContactConfig(kappa=300.0))
    q0 = np.tile(g1.default_qpos(sim.mjmodel), (envs, 1))
    ctrl = np.tile(g1.DEFAULT_JOINT_POS, (envs, 1))
    best = np.inf
    for _ in range(repeats + 1):  # the first compiles
        sim.set_state(q0, 0.0)
        ti.sync()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            sim.step(ctrl)
        ti.sync()
        best = min(best, time.perf_counter() - t0)
    return envs * STEPS * sim.substeps / best


def ppo_learner(envs: int):
    from bcg.learn.config import PPOConfig
    from bcg.learn.train import build

    cfg = dataclasses.replace(PPOConfig(), num_envs=envs)
    return build(cfg, None, log=lambda message: None)[1]


def bench_rollout(envs: int) -> float:
    """Control steps per second of PPO's rollout (the second window; the first compiles)."""
    learner = ppo_learner(envs)
    learner.rollout()
    t0 = time.perf_counter()
    learner.rollout()
    return envs * STEPS / (time.perf_counter() - t0)


def bench_iteration(envs: int) -> dict[str, float]:
    learner = ppo_learner(envs)
    learner.iteration_step()
    stats = learner.iteration_step()
    return {k: stats[k] for k in ("time_rollout", "time_update", "time_disc")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="1024,4096", help="environment counts of the rollout comparison")
    p.add_argument("--iteration-envs", type=int, default=1024, help="environments of the timed PPO iteration")
    p.add_argument("--arch", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()
    import bcg.sim as bs

    bs.init(arch=args.arch, precision="float32")
    lines = []
    for n in [int(x) for x in args.envs.split(",")]:
        mujoco_rate = bench_mujoco("feet", n, 4 * STEPS)
        ours = bench_forward(n)
        rollout = bench_rollout(n)
        print(
            f"{n} envs: MuJoCo {mujoco_rate:,.0f}, bcg.sim without gradients {ours:,.0f} physics steps/s "
            f"({ours / mujoco_rate:.2f}x); PPO's rollout {rollout:,.0f} control steps/s",
            flush=True,
        )
        lines += [
            f"mujoco_rollout_steps_per_s_{n}={mujoco_rate:.0f}",
            f"bcg_sim_nograd_steps_per_s_{n}={ours:.0f}",
            f"ratio_bcg_sim_nograd_to_mujoco_{n}={ours / mujoco_rate:.3f}",
            f"ppo_rollout_control_steps_per_s_{n}={rollout:.0f}",
            f"ppo_rollout_physics_steps_per_s_{n}={4 * rollout:.0f}",
            f"ratio_ppo_rollout_to_mujoco_{n}={4 * rollout / mujoco_rate:.3f}",
        ]
    times = bench_iteration(args.iteration_envs)
    n = args.iteration_envs
    lines += [f"ppo_iteration_{k.removeprefix('time_')}_s_{n}={v:.2f}" for k, v in times.items()]
    lines.append(f"ppo_iteration_s_{n}={sum(times.values()):.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
