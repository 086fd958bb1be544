"""How long the training environment's episodes last under open-loop action rules.

    python -m bcg.studies.openloop [--motion run] [--windows 12] [--envs 64] [--seed 0] [--arch cpu]

The learning benchmark's first iterations start from episodes of about 30 control steps. This study
asks what a policy that ignores its observations would get in the same environment (the default
training configuration: its starts, reset noise, randomisation, pushes and fall rule), so that the
benchmark's lengths can be read against them:

- ``zero``: a = 0, the PD targets at the (randomised) default pose;
- ``reference``: the reference's joint positions at the end of each control step as PD targets,
  a = (q_ref(t + dt) - q_default) / action scale, which a residual-on-reference action mapping
  would start from;
- each of them with the paper's initial exploration noise, a + N(0, 1) (``+noise``).

It prints the mean length (control steps) of the episodes that ended over ``--windows`` windows.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from bcg.core import g1
from bcg.learn import train
from bcg.learn.config import TrainConfig
from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError

RULES = ("zero", "reference", "zero+noise", "reference+noise")


def episode_lengths(motion: str, rule: str, windows: int, envs: int, seed: int) -> np.ndarray:
    """Lengths (steps) of the episodes that ended over ``windows`` windows under ``rule``."""
    base = TrainConfig()
    cfg = dataclasses.replace(
        base, seed=seed, num_envs=envs, env=dataclasses.replace(base.env, motion=motion)
    )
    clip, learner = train.build(cfg, None, log=lambda *_: None)
    env, rng = learner.env, np.random.default_rng(seed + 1)
    lengths = []
    for _ in range(windows):
        env.begin_window()
        for _ in range(cfg.horizon):
            if rule.startswith("zero"):
                actions = np.zeros((env.num_envs, env.act_dim))
            else:
                ref = clip.sample(env.time + g1.CONTROL_DT)
                actions = (ref.joint_pos - env.default_pos) / g1.ACTION_SCALE
            if rule.endswith("+noise"):
                actions = actions + rng.standard_normal(actions.shape)
            res = env.step(actions.astype(np.float32))
            ended = res.terminated | res.truncated  # the env reports ends of live episodes only
            lengths.extend(res.info["episode_step"][ended].tolist())
        env.end_window()
    return np.asarray(lengths, float)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--motion", default="run")
    p.add_argument(
        "--windows", type=int, default=12, help=f"windows of {TrainConfig().horizon} control steps per rule"
    )
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default="cpu", help="Taichi arch: cpu or cuda")
    args = p.parse_args(argv)
    if args.windows < 1 or args.envs < 1:
        p.error("--windows and --envs must be at least 1")
    try:
        MotionClip.load(args.motion)  # a wrong name or a broken file is a usage error, before Taichi
    except MotionFileError as exc:
        p.error(str(exc))
    import bcg.sim  # Taichi is slow to import: usage errors and --help stay quick

    bcg.sim.init(arch=args.arch, precision="float32")
    print(f"{args.motion}, {args.envs} environments, {args.windows} windows, seed {args.seed}")
    for rule in RULES:
        lengths = episode_lengths(args.motion, rule, args.windows, args.envs, args.seed)
        mean = f"mean length {lengths.mean():.1f} steps" if len(lengths) else "none ended"
        print(f"{rule:16s} episodes {len(lengths):4d}  {mean}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
