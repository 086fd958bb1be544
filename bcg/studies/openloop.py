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

It prints the mean length (control steps) of the episodes that ended over ``--windows`` windows,
and the live env-steps per fall (the episodes still running at the end are not counted as ended,
so the mean length of the ended ones understates a policy that rarely falls).

    python -m bcg.studies.openloop --policy POLICY [--sigma 0,0.25,0.5,1]

asks the converse for a trained policy: its mean action plus exploration noise of each std σ
(the paper starts training at σ = 1), in the same default training environment on the policy's
motion (not the settings the policy was trained with: a lead-in, extra terms). It tells
whether a learner's short early episodes are the exploration noise's or the policy's.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from bcg.core import g1
from bcg.learn import train
from bcg.learn.config import TrainConfig
from bcg.learn.policy import Policy, PolicyFileError, load_policy
from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError

RULES = ("zero", "reference", "zero+noise", "reference+noise")


def episode_lengths(motion: str, rule: str, windows: int, envs: int, seed: int) -> np.ndarray:
    """Lengths (steps) of the episodes that ended over ``windows`` windows under ``rule``."""
    return _rollout(motion, rule, None, 0.0, windows, envs, seed)[0]


def policy_episodes(
    policy: Policy, sigma: float, windows: int, envs: int, seed: int
) -> tuple[np.ndarray, int, int]:
    """A trained policy's mean action plus N(0, σ²) noise on its own motion: the lengths (steps) of
    the episodes that ended, the number of falls and the number of live env-steps."""
    return _rollout(policy.motion_name, "policy", policy, sigma, windows, envs, seed)


def _rollout(motion, rule, policy, sigma, windows, envs, seed) -> tuple[np.ndarray, int, int]:
    base = TrainConfig()
    cfg = dataclasses.replace(
        base, seed=seed, num_envs=envs, env=dataclasses.replace(base.env, motion=motion)
    )
    clip, learner = train.build(cfg, None, log=lambda *_: None)
    env, rng = learner.env, np.random.default_rng(seed + 1)
    lengths, falls, live = [], 0, 0
    for _ in range(windows):
        obs, _ = env.begin_window()
        for _ in range(cfg.horizon):
            if rule == "policy":
                actions = policy.act(obs) + sigma * rng.standard_normal((env.num_envs, env.act_dim))
            else:
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
            falls += int(res.terminated.sum())
            live += int(res.info["alive"].sum())
            obs = res.obs
        env.end_window()
    return np.asarray(lengths, float), falls, live


def _line(name: str, lengths: np.ndarray, falls: int, live: int) -> str:
    mean = f"mean length {lengths.mean():5.1f} steps" if len(lengths) else "none ended           "
    per_fall = f"{live / falls:6.1f}" if falls else "no fall"
    return f"{name:16s} episodes {len(lengths):4d}  {mean}  live steps per fall {per_fall}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--motion", default="run")
    p.add_argument(
        "--windows", type=int, default=12, help=f"windows of {TrainConfig().horizon} control steps per rule"
    )
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default="cpu", help="Taichi arch: cpu or cuda")
    p.add_argument("--policy", type=Path, help="a trained policy (.h5) instead of the open-loop rules")
    p.add_argument(
        "--sigma",
        default="0,0.25,0.5,1",
        help="with --policy: comma-separated exploration stds (default 0,0.25,0.5,1)",
    )
    args = p.parse_args(argv)
    if args.windows < 1 or args.envs < 1:
        p.error("--windows and --envs must be at least 1")
    policy, sigmas = None, []
    if args.policy is not None:
        try:
            sigmas = [float(v) for v in args.sigma.split(",")]
        except ValueError:
            p.error(f"--sigma must be comma-separated numbers, got {args.sigma!r}")
        if not sigmas or any(not np.isfinite(v) or v < 0 for v in sigmas):
            p.error(f"--sigma must be finite and non-negative, got {args.sigma!r}")
        try:
            policy = load_policy(args.policy)
        except PolicyFileError as exc:
            p.error(str(exc))  # names the file
        except OSError as exc:
            p.error(f"{args.policy}: {exc}")
        args.motion = policy.motion_name
    try:
        MotionClip.load(args.motion)  # a wrong name or a broken file is a usage error, before Taichi
    except MotionFileError as exc:
        p.error(str(exc))
    import bcg.sim  # Taichi is slow to import: usage errors and --help stay quick

    bcg.sim.init(arch=args.arch, precision="float32")
    who = f"{args.policy}, " if policy is not None else ""
    print(f"{who}{args.motion}, {args.envs} environments, {args.windows} windows, seed {args.seed}")
    if policy is not None:
        for sigma in sigmas:
            out = policy_episodes(policy, sigma, args.windows, args.envs, args.seed)
            print(_line(f"policy σ={sigma:g}", *out), flush=True)
        return 0
    for rule in RULES:
        print(
            _line(rule, *_rollout(args.motion, rule, None, 0.0, args.windows, args.envs, args.seed)),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
