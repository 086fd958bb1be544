"""Trace PPO's KL(π_old ‖ π) after every minibatch, to see what the adaptive learning rate reacts to.

    python benchmarks/ppo_kl_trace.py [--iterations 6] [--set field=value ...]

Builds the PPO learner on Run (64 environments and a cheaper discriminator update by default, the
rest PPO's defaults), runs a few iterations and prints per iteration the learning rate, the KL of
every minibatch in order, and the size of the normalised observations.
"""

import argparse

import numpy as np

import bcg.sim
from bcg.learn import ppo as ppo_module
from bcg.learn.config import PPOConfig
from bcg.learn.config_io import apply_overrides
from bcg.learn.train import build

DEFAULTS = ["env.motion=run", "env.kappa=300", "num_envs=64", "disc.batch_size=512", "disc.epochs=1"]


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="field=value")
    args = parser.parse_args()
    bcg.sim.init(arch="cpu", precision="float32")
    cfg = apply_overrides(PPOConfig(), DEFAULTS + args.overrides)
    _, ppo = build(cfg, None)
    kls: list[float] = []
    kl_of = ppo_module.gaussian_kl

    def traced_kl(*a):  # the update computes one KL per minibatch, before its step
        value = kl_of(*a)
        kls.append(float(np.mean(value)))
        return value

    ppo_module.gaussian_kl = traced_kl
    for it in range(args.iterations):
        kls.clear()
        row = ppo.iteration_step()
        print(
            f"iteration {it + 1}: lr_after={ppo.lr:.2g} episode_length={row['episode_length']:.1f} "
            f"kl_per_minibatch={' '.join(f'{k:.3f}' for k in kls)}"
        )


if __name__ == "__main__":
    main()
