"""Train a G1 motion-tracking policy with SHAC + ADD on the differentiable simulator, or with PPO + ADD
on the same environment without gradients (``--algo ppo``, :mod:`bcg.learn.ppo`).

Example::

    python -m bcg.learn.train --motion run --kappa 300 --out runs/run
    python -m bcg.learn.train --algo ppo --motion run --kappa 300     # PPO, runs/run_k300_s0_ppo
    python -m bcg.learn.train --motion run --out runs/run --resume          # continue where it stopped
    python -m bcg.learn.train --motion run --out runs/run2 --init-from runs/run \\
        --set env.pose_termination_dist=1.0
    python -m bcg.learn.train --motion jump --no-bcg --envs 128 --set actor.lr=1e-3 --set env.dr_push=false
    python -m bcg.learn.train --motion run --set env_stages=       # Run without its recipe of stages

Run trains with a recipe of stages (:data:`bcg.learn.stages.MOTION_STAGES`): the default until it
stays up, then the terms that hold it to the clip's path.

The run folder holds: ``config.json`` (the resolved config), ``log.csv`` (one row per iteration, columns
:data:`bcg.learn.runlog.LOG_COLUMNS`, described there), ``curves.png`` (the main columns plotted),
``checkpoint.h5`` (everything needed to continue: networks, optimisers, normalisers, discriminator and, with
``checkpoint_replay`` (the default), its replay buffer, random generators, env state and the iteration;
written to a temporary file and renamed, and never with a non-finite parameter), ``policy_it<N>.h5`` every
``policy_every`` iterations (when set), ``nan_dump_*.h5`` after non-finite events, ``train.lock``
(held while a process trains in the folder; a second one is refused), and at the end ``policy.h5``
(:func:`bcg.learn.policy.save_policy`).

Progress goes to stderr: iteration, rate, ETA, the latest episode return and tracking error.
Bad arguments (an unknown motion, a malformed ``--set``, a missing checkpoint) print one line on
stderr and exit with status 2.
"""

from __future__ import annotations

import os

# BLAS threads: one per core, at most 8 (the learner's matrices are a few hundred wide). Measured on
# 2 cores with `benchmarks/bench_train.py`: 7.5-7.9 s per iteration with two threads against 8.7 s with
# one (an earlier simulator, whose kernels kept the cores busy longer, measured the opposite). With the
# update worker (`critic_worker`, the default) the learner limits its own BLAS to one thread during
# its iterations and the worker takes the rest (bcg.learn.shac.Shac.iteration_step).
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))
# BLAS worker threads sleep at once after a product instead of spinning for ~0.1 s: the spinning
# competes with the critic's worker process (bcg.learn.critic_worker), which fits the critic while
# the reverse pass runs (measured: 5.33 s per iteration with the worker against 6.34 s without, where
# with spinning threads the two were level)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bcg.core import g1  # noqa: E402
from bcg.learn.config import PPOConfig, TrainConfig  # noqa: E402
from bcg.learn.config_io import ConfigError, apply_overrides  # noqa: E402
from bcg.learn.discriminator import discriminator_init  # noqa: E402
from bcg.learn.features import FEATURE_SIZE  # noqa: E402
from bcg.learn.observation import REFERENCE_STEPS  # noqa: E402
from bcg.learn.policy import save_run_policy, save_snapshot  # noqa: E402
from bcg.learn.ppo import Ppo  # noqa: E402
from bcg.learn.runfolder import (  # noqa: E402
    CHECKPOINT,
    FIXED_ON_INIT,
    NAN_DUMPS,
    RUN_FILES,
    SNAPSHOTS,
    UsageError,
    _check_resume_config,  # noqa: E402
    algo_name,
    check_checkpoint_state,
    config_changes,
    load_checkpoint,
    lock_run_folder,
    remove_stale_temporaries,
    resume_command,
    save_checkpoint,
    snapshots_after,
    write_config,
)
from bcg.learn.runlog import append_log, plot_curves, read_log, write_log  # noqa: E402
from bcg.learn.shac import Shac  # noqa: E402
from bcg.learn.stages import (  # noqa: E402
    StageError,
    check_stages,
    joint_limits_later,
    leg_contact_later,
    motion_stages,
)
from bcg.motion import MotionClip, MotionFileError  # noqa: E402
from bcg.motion.check import check_clip  # noqa: E402

MOTION_NAMES = ("run", "jump", "fight", "dance")
ALGOS = ("shac", "ppo")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bcg.learn.train",
        description="Train a G1 motion-tracking policy with SHAC + ADD on the differentiable simulator.",
    )
    p.add_argument(
        "--motion", default="run", help=f"reference clip: {', '.join(MOTION_NAMES)} or a path to a .h5 clip"
    )
    p.add_argument("--kappa", type=float, default=300.0, help="contact stiffness kappa (1/m), default 300")
    p.add_argument(
        "--algo", choices=ALGOS, default="shac",
        help="shac (default): SHAC through the differentiable simulator; ppo: PPO on the same "
        "environment, forward only (bcg.learn.ppo)",
    )  # fmt: skip
    p.add_argument(
        "--bcg", action=argparse.BooleanOptionalAction, default=None,
        help="bundled contact gradients (default on for SHAC; PPO takes no gradient and has none)",
    )  # fmt: skip
    p.add_argument("--iterations", type=int, help="iterations (default 3000)")
    p.add_argument("--envs", type=int, help="parallel environments (default 64 for SHAC, 4096 for PPO)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--out", type=Path, help="run folder (default runs/<motion>_k<kappa>_s<seed>)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.h5")
    p.add_argument(
        "--init-from", type=Path, metavar="CHECKPOINT",
        help="start a new run from another run's checkpoint (a checkpoint.h5 or its run folder): its "
        "networks, optimisers, normalisers, discriminator, episodes and iteration count, under this "
        "command's config (reward weights, learning rates etc. may differ; the motion may not)",
    )  # fmt: skip
    p.add_argument(
        "--overwrite", action="store_true",
        help="start over in a run folder that already holds a run (its checkpoint, log, plot, config, "
        "policy, policy snapshots policy_it<N>.h5 and NaN dumps are deleted)",
    )  # fmt: skip
    p.add_argument(
        "--stop-after",
        type=int,
        help="stop after this many iterations of this call, writing a checkpoint (unless that fails: the "
        "closing line says which iteration the folder's checkpoint holds)",
    )
    p.add_argument("--arch", choices=("cpu", "cuda"), default="cpu", help="Taichi backend (default cpu)")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
        help="override any config field by dotted name, e.g. actor.lr=1e-3 or env.dr_push=false",
    )  # fmt: skip
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> TrainConfig | PPOConfig:
    """The run's config (a :class:`TrainConfig` for SHAC, a :class:`PPOConfig` for PPO): defaults,
    then the named options, then ``--set`` overrides. A SHAC run on a motion with a recipe of stages
    (:data:`bcg.learn.stages.MOTION_STAGES`, Run's) trains with it unless ``--set env_stages=...``
    names other stages (``--set env_stages=`` none); a field set by ``--set env.FIELD=...`` keeps
    that value throughout."""
    motion = args.motion
    if motion not in MOTION_NAMES:
        path = Path(motion)
        if path.suffix != ".h5":
            raise UsageError(
                f"unknown motion {motion!r}: use one of {', '.join(MOTION_NAMES)} or a path to a .h5 clip"
            )
        if not path.is_file():
            raise UsageError(f"motion file {motion} does not exist")
    algo = getattr(args, "algo", "shac")
    if algo == "ppo" and args.bcg:
        raise UsageError("--bcg is for SHAC: bundles smooth the simulator's gradients, and PPO takes none")
    items = [f"env.motion={motion}", f"env.kappa={args.kappa}"]
    if algo == "shac":
        items.append(f"env.bcg={args.bcg is not False}")
    for name, field in (("iterations", "iterations"), ("envs", "num_envs"), ("seed", "seed")):
        if getattr(args, name) is not None:
            items.append(f"{field}={getattr(args, name)}")
    try:
        cfg = apply_overrides(PPOConfig() if algo == "ppo" else TrainConfig(), items + list(args.overrides))
        named = {item.partition("=")[0].strip() for item in args.overrides}
        if algo == "shac" and "env_stages" not in named:
            # the motion's recipe (bcg.learn.stages.MOTION_STAGES), fitted to the run's length; a
            # field the command sets itself keeps its value throughout
            fixed = {name.removeprefix("env.") for name in named if name.startswith("env.")}
            cfg = dataclasses.replace(cfg, env_stages=motion_stages(motion, cfg.iterations, fixed))
        check_stages(cfg.env, getattr(cfg, "env_stages", ""), cfg.iterations)
    except (ConfigError, StageError) as exc:
        raise UsageError(str(exc)) from None
    return cfg


# ---------------------------------------------------------------------------------------------------
# progress


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
    """One-line progress on stderr: bar, iteration, rate, ETA, latest return and tracking error.

    The first iteration of a process also compiles (or loads) the simulator's kernels, about a
    minute from an empty kernel cache, so the rate and ETA are measured from its end once a second
    iteration is done; until then the line says that the rate includes compiling."""

    def __init__(self, start: int, total: int, stream=sys.stderr, clock=time.perf_counter):
        self.start, self.total, self.stream, self.clock = start, total, stream, clock
        self.t0 = clock()
        self.first = None  # (time, iteration) at the end of this process's first iteration
        self.tty = stream.isatty()
        self.last_return = float("nan")
        self.last_error = float("nan")

    def update(self, done: int, stats: dict) -> None:
        if math.isfinite(stats.get("episode_return", float("nan"))):
            self.last_return = stats["episode_return"]
        if math.isfinite(stats.get("tracking_error_cm", float("nan"))):
            self.last_error = stats["tracking_error_cm"]
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
            t_from, n_from = self.t0, self.start
        else:
            t_from, n_from = self.first
        elapsed = now - t_from
        rate = (done - n_from) / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - done) / rate if rate and rate > 0 else float("inf")
        width = 24
        filled = int(width * done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        line = (
            f"[{bar}] {done}/{self.total} {rate:.3f} it/s ETA {_duration(eta)} "
            f"return {self.last_return:.2f} error {self.last_error:.1f} cm"
        )
        if n_from == self.start and done < self.total:
            line += " (rate includes compiling)"
        if stats.get("skipped"):
            line += " (update skipped: non-finite)"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------------
# the run


def build(cfg: TrainConfig | PPOConfig, out: Path | None, log=print, clip=None):
    """Clip, discriminator, env and learner (:class:`bcg.learn.shac.Shac` or
    :class:`bcg.learn.ppo.Ppo`) for ``cfg`` (Taichi must be initialised)."""
    # the environment brings Taichi, slow to import: usage errors and --help stay quick
    from bcg.learn.env import G1TrackingEnv
    from bcg.learn.training_sim import make_g1_sim  # Taichi too

    clip = MotionClip.load(cfg.env.motion) if clip is None else clip
    seeds = np.random.SeedSequence(cfg.seed).spawn(4)  # the first three as before the fourth existed
    disc = discriminator_init(cfg.disc, FEATURE_SIZE, np.random.default_rng(seeds[0]))
    bundle_seed = int(seeds[3].generate_state(1)[0])
    # With the update worker on the other core, the simulator's rows stay on this thread: spread
    # over two threads they ran slower (4.39 and 4.07 against 4.19 and 3.86 s per iteration,
    # benchmarks/bench_train.py, alternated), where alone they run 1.4x faster (bench_sim.py).
    # PPO's simulator runs forward only: no gradient buffers, and the env keeps no reverse-pass data
    ppo = isinstance(cfg, PPOConfig)
    threads = 1 if not ppo and cfg.critic_worker else None
    sim = make_g1_sim(
        cfg.env,
        cfg.num_envs,
        cfg.horizon,
        bundle_seed=bundle_seed,
        cpu_threads=threads,
        requires_grad=not ppo,
        leg_contact_later=not ppo and leg_contact_later(cfg),
        joint_limits_later=not ppo and joint_limits_later(cfg),
    )
    env = G1TrackingEnv(
        cfg.env, cfg.num_envs, cfg.horizon, disc, np.random.default_rng(seeds[1]), clip=clip, sim=sim
    )
    learner = (Ppo if ppo else Shac)(cfg, env, disc, np.random.default_rng(seeds[2]), log=log, dump_dir=out)
    return clip, learner


def default_run_dir(cfg: TrainConfig | PPOConfig) -> Path:
    """``runs/<motion>_k<kappa>_s<seed>``, with ``_nobcg`` for a SHAC run without bundles and
    ``_ppo`` for PPO, so the runs of a comparison with the same seed do not ask for the same folder."""
    name = f"{Path(cfg.env.motion).stem}_k{cfg.env.contact.kappa:g}_s{cfg.seed}"
    if algo_name(cfg) == "ppo":
        return Path("runs") / (name + "_ppo")
    return Path("runs") / (name if cfg.env.bundle.on else name + "_nobcg")


def restore(shac, state: dict, path: Path, action: str = "resume") -> None:
    """Load a checkpoint's ``state`` (read from ``path``) into a freshly built learner, after checking
    every array against it; UsageError ("cannot <action>: ...") when it does not fit."""
    problems = check_checkpoint_state(state, shac.state_dict(include_replay=False))
    if problems:
        raise UsageError(
            f"cannot {action}: {path} does not fit this run (damaged, or written by another "
            f"version): {'; '.join(problems[:5])}"
            + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        )
    try:
        shac.load_state_dict(state)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot {action}: {path} cannot be restored: {exc!r}") from None


def load_motion(
    cfg: TrainConfig, expected_hash: str | None = None, action: str = "resume", check: bool = False
):
    """The run's motion clip; UsageError when it cannot be read, (with ``expected_hash``) is not the
    clip a checkpoint was written with, or (with ``check``) is too short for an episode or fails
    :func:`bcg.motion.check.check_clip` (stored velocities or body poses that do not follow from
    its positions, impossible jumps)."""

    try:
        clip = MotionClip.load(cfg.env.motion)
    except MotionFileError as exc:
        raise UsageError(f"cannot load motion {cfg.env.motion!r}: {exc}") from None
    if expected_hash is not None and expected_hash != clip.content_hash:
        raise UsageError(f"cannot {action}: the motion {cfg.env.motion!r} changed since the checkpoint")
    try:
        clip.with_lead_in(cfg.env.clip_lead_in)  # refused before Taichi starts, not inside the env
    except ValueError as exc:
        raise UsageError(f"env.clip_lead_in: {exc}") from None
    if check:
        shortest = (max(REFERENCE_STEPS) + 2) * g1.CONTROL_DT
        if clip.duration < shortest:
            raise UsageError(
                f"motion {cfg.env.motion!r} lasts {clip.duration:.3f} s; "
                f"an episode needs at least {shortest:.2f} s"
            )
        report = check_clip(clip, g1.load_model(collisions="none", floor=False))
        if not report.usable:
            failed = "; ".join(
                f"{topic}: {message}" for level, topic, message in report.findings if level == "fail"
            )
            raise UsageError(
                f"motion {cfg.env.motion!r} is not usable ({failed}); see python -m bcg.motion check"
            )
    return clip


@dataclass
class InitFrom:
    """Another run's checkpoint a new run starts from (``--init-from``).

    Attributes:
        source: the checkpoint file.
        state: its state.
        iteration: its iteration.
        changes: this run's config changes against its config, as :func:`config_changes` words them.
    """

    source: Path
    state: dict
    iteration: int
    changes: list[str]


@dataclass
class RunStart:
    """What a run starts from, checked before its folder is changed.

    Attributes:
        out: the run folder (created, and locked by this process).
        clip: the motion clip.
        resume: the state of the folder's checkpoint (``--resume``), or None.
        init: ``--init-from``'s checkpoint, or None.
    """

    out: Path
    clip: MotionClip
    resume: dict | None
    init: InitFrom | None


def run(args: argparse.Namespace) -> int:
    """One call of the command: the config, the run folder checked and opened, the loop; returns the
    exit status (UsageError for bad arguments, see :func:`main`)."""
    cfg = resolve_config(args)
    start = open_run_folder(args, cfg)
    learner = start_learner(args, cfg, start)
    return train_loop(args, cfg, start, learner)


def open_run_folder(args: argparse.Namespace, cfg: TrainConfig | PPOConfig) -> RunStart:
    """Check the run's folder, motion and starting checkpoint against ``cfg`` (UsageError when they do
    not fit), then create and lock the folder; nothing in it is deleted yet."""
    out = args.out or default_run_dir(cfg)
    if out.is_dir():
        lock_run_folder(out)  # before anything is read from it or deleted in it
    clip = load_motion(cfg, check=True)
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if args.resume and args.init_from is not None:
        raise UsageError("--resume and --init-from exclude each other")
    init = None if args.init_from is None else check_init_from(args.init_from, cfg, clip)
    state = None
    if args.resume:
        state = check_resume(out, cfg, clip)
    else:
        previous = [out / name for name in RUN_FILES if (out / name).exists()]
        previous += sorted(out.glob(SNAPSHOTS)) + sorted(out.glob(NAN_DUMPS))
        if previous and not args.overwrite:
            raise UsageError(
                f"{out} already holds a run ({', '.join(p.name for p in previous)}): pass --resume to "
                "continue it, --overwrite to start over (deleting it), or --out for a new folder"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run folder {out}: {exc}") from None
    lock_run_folder(out)  # held until the process ends
    for p in remove_stale_temporaries(out):
        sys.stderr.write(f"removed {p.name}, left by an interrupted write\n")
    return RunStart(out, clip, state, init)


def check_init_from(path: Path, cfg: TrainConfig | PPOConfig, clip: MotionClip) -> InitFrom:
    """The checkpoint ``--init-from`` names (a checkpoint.h5 or its run folder), when a run with
    ``cfg`` on ``clip`` can start from it; UsageError otherwise."""
    source = path / CHECKPOINT if path.is_dir() else path
    init_state, init_cfg, init_hash = load_checkpoint(source, action="initialise from")
    if algo_name(init_cfg) != algo_name(cfg):
        raise UsageError(
            f"cannot initialise from {source}: it is a {algo_name(init_cfg)} run, this one {algo_name(cfg)}"
        )
    if init_hash != clip.content_hash:
        raise UsageError(
            f"cannot initialise from {source}: it was trained on another motion "
            f"({init_cfg.env.motion!r}, content {init_hash[:12]}) than {cfg.env.motion!r}"
        )
    start_iteration = int(np.asarray(init_state.get("iteration", 0)))
    if start_iteration >= cfg.iterations:
        raise UsageError(
            f"cannot initialise from {source}: it is at iteration {start_iteration}, and this run "
            f"stops at {cfg.iterations} (raise --iterations)"
        )
    changes = config_changes(init_cfg, cfg)
    fixed = [c for c in changes if c.split(" ", 1)[0] in FIXED_ON_INIT]
    if fixed:
        raise UsageError(
            f"cannot initialise from {source}: {'; '.join(fixed)} cannot change (the random "
            "generators, the environments and the networks' shapes come from the checkpoint)"
        )
    lead_in_changed = any(c.split(" ", 1)[0] == "env.clip_lead_in" for c in changes)
    if lead_in_changed and isinstance(init_state.get("env"), dict):
        # the failure histogram's bins and the episodes under way are on the old clip's timeline:
        # a fresh histogram, and every environment resets at the first window
        init_state["env"].pop("start_phases", None)
        if "needs_reset" in init_state["env"]:
            init_state["env"]["needs_reset"] = np.ones_like(init_state["env"]["needs_reset"])
    return InitFrom(source, init_state, start_iteration, changes)


def check_resume(out: Path, cfg: TrainConfig | PPOConfig, clip: MotionClip) -> dict:
    """The state of ``out``'s checkpoint, when the run continues it under ``cfg`` on ``clip``;
    UsageError otherwise."""
    state, stored, stored_hash = load_checkpoint(out / CHECKPOINT)
    _check_resume_config(stored, cfg)
    if stored.iterations != cfg.iterations and algo_name(cfg) == "shac":
        sys.stderr.write(
            f"note: {cfg.iterations} iterations instead of the checkpoint's {stored.iterations}: the "
            "learning rates now decay linearly to the new end\n"
        )
    if stored_hash != clip.content_hash:
        raise UsageError(f"cannot resume: the motion {cfg.env.motion!r} changed since the checkpoint")
    return state


def _log(message: str) -> None:
    """The learner's messages (NaN events, skipped writes) on stderr, on a line of their own."""
    sys.stderr.write(("\n" if sys.stderr.isatty() else "") + message + "\n")


def start_learner(args: argparse.Namespace, cfg: TrainConfig | PPOConfig, start: RunStart):
    """Taichi, the learner (:func:`build`) and its starting state: the resumed checkpoint (with the
    log rows and snapshots written after it removed), ``--init-from``'s, or a fresh start (the
    folder's previous run deleted); then the resolved config is written to the folder."""
    import bcg.sim  # Taichi, slow to import, loads once the arguments and the run folder are checked

    bcg.sim.init(arch=args.arch, precision="float32")
    out = start.out
    clip, learner = build(cfg, out, _log, start.clip)
    extra = {}
    if start.init is not None:
        init = start.init
        restore(learner, init.state, init.source, action="initialise from")
        _log(
            f"initialised from {init.source} at iteration {init.iteration}; config changes: "
            + ("; ".join(init.changes) if init.changes else "none")
            + (
                " (domain randomisation changes reach each environment at its next reset)"
                if any(c.startswith("env.dr_") for c in init.changes)
                else ""
            )
        )
        extra = {
            "init_from": str(init.source.resolve()),
            "init_iteration": init.iteration,
            "init_changes": init.changes,
        }
    if start.resume is not None:
        restore(learner, start.resume, out / CHECKPOINT)
        rows = read_log(out / "log.csv")
        write_log(out / "log.csv", [r for r in rows if int(r["iteration"]) <= learner.iteration])
        for later in snapshots_after(out, learner.iteration):  # written after the checkpoint, as the rows
            later.unlink(missing_ok=True)
        extra = _stored_origin(out)
    else:
        old = [out / name for name in RUN_FILES] + sorted(out.glob(NAN_DUMPS)) + sorted(out.glob(SNAPSHOTS))
        for stale in old:
            stale.unlink(missing_ok=True)
    write_config(
        out, cfg, {"motion_hash": clip.content_hash, "contact": bool(learner.env.has_contact)} | extra
    )
    return learner


def _stored_origin(out: Path) -> dict:
    """The ``--init-from`` origin a resumed run's stored config.json records ({} when none)."""
    if not (out / "config.json").is_file():
        return {}
    try:
        stored_extra = json.loads((out / "config.json").read_text())
        return {
            k: stored_extra[k] for k in ("init_from", "init_iteration", "init_changes") if k in stored_extra
        }
    except (OSError, ValueError):
        return {}


class StopSignals:
    """While training: Ctrl-C (SIGINT) or SIGTERM asks to stop after the iteration; a second one
    stops at once (KeyboardInterrupt, without a checkpoint).

    Attributes:
        received: the signals received, first first.
    """

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received:
            raise KeyboardInterrupt
        self.received.append(signum)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        sys.stderr.write(f"\n{name}: stopping after this iteration (again to stop now)\n")

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Checkpoints:
    """Writes a learner's checkpoint and the curves; knows which iteration the folder's checkpoint
    holds (``saved``, None when it holds none)."""

    def __init__(self, out: Path, learner, cfg: TrainConfig | PPOConfig, motion_hash: str, saved: int | None):
        self.out, self.learner, self.cfg, self.motion_hash, self.saved = out, learner, cfg, motion_hash, saved

    def save(self) -> None:
        """The checkpoint, unless it holds this iteration already (or the write is skipped), and
        the curves."""
        out, learner = self.out, self.learner
        if self.saved != learner.iteration:
            if save_checkpoint(out, learner, self.cfg, self.motion_hash, _log) is not None:
                self.saved = learner.iteration
        try:
            plot_curves(out / "log.csv", out / "curves.png")
        except OSError as exc:
            _log(f"curves.png not written: {exc}")


def train_loop(args: argparse.Namespace, cfg: TrainConfig | PPOConfig, start: RunStart, learner) -> int:
    """The training loop, to ``cfg.iterations`` or ``--stop-after`` iterations of this call or a stop
    signal: a log row per iteration, policy snapshots and checkpoints as ``cfg`` asks, and a last
    checkpoint and (at the end) the policy. Returns the exit status."""
    out, motion_hash = start.out, start.clip.content_hash
    first = learner.iteration
    stop = cfg.iterations if args.stop_after is None else min(cfg.iterations, first + args.stop_after)
    progress = Progress(first, stop)  # rate and ETA to where this invocation stops
    with StopSignals() as signals:
        t_run = time.perf_counter() - (_last_wall_time(out / "log.csv") if start.resume is not None else 0.0)
        checkpoints = Checkpoints(out, learner, cfg, motion_hash, first if start.resume is not None else None)
        while learner.iteration < stop and not signals.received:
            t0 = time.perf_counter()
            stats = learner.iteration_step()
            stats["time_iteration"] = time.perf_counter() - t0
            stats["iteration"] = learner.iteration
            stats["wall_time"] = time.perf_counter() - t_run
            try:
                append_log(out / "log.csv", stats)
            except OSError as exc:
                _log(f"log row of iteration {learner.iteration} not written: {exc}")
            progress.update(learner.iteration, stats)
            if cfg.policy_every and learner.iteration % cfg.policy_every == 0:  # before the checkpoint:
                save_snapshot(out, learner, cfg, motion_hash, _log)  # a resume deletes it if that fails
            every = cfg.checkpoint_every
            if every and learner.iteration % every == 0 and learner.iteration < stop:
                checkpoints.save()
    progress.close()
    checkpoints.save()
    return _finish(args, cfg, out, learner, checkpoints.saved, bool(signals.received), motion_hash)


def _finish(args, cfg, out: Path, learner, saved: int | None, interrupted: bool, motion_hash: str) -> int:
    """The closing line (and, at the end, the policy file); returns the exit status."""
    resume = resume_command(getattr(args, "argv", []), out)
    if saved != learner.iteration:
        held = f"the checkpoint of iteration {saved}" if saved is not None else "no checkpoint"
        resume = f"the folder holds {held}" + (
            f"; resume from it with: {resume}" if saved is not None else ""
        )
    else:
        resume = f"resume with: {resume}"
    if interrupted:
        sys.stderr.write(f"interrupted at iteration {learner.iteration}; {resume}\n")
        return 130
    if learner.iteration >= cfg.iterations:
        save_run_policy(
            out / "policy.h5", cfg, learner.actor, learner.obs_rms, motion_hash, learner.iteration
        )
        sys.stderr.write(f"done: {out / 'policy.h5'}\n")
    else:
        sys.stderr.write(
            f"stopped at iteration {learner.iteration}; {resume} "
            f"(its policy so far: python -m bcg.learn.policy export {out})\n"
        )
    return 0


def _last_wall_time(log_path: Path) -> float:
    """The last logged ``wall_time`` (a resumed run's clock goes on from it), 0 when there is none."""
    for row in reversed(read_log(log_path)):
        try:
            value = float(row.get("wall_time") or "")
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    return 0.0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:  # the run folder's disk or permissions, outside the loop's own handling
        sys.stderr.write(f"error: {exc}; the last checkpoint written (if any) is intact\n")
        return 1
    except KeyboardInterrupt:  # during start-up, a second Ctrl-C, or the final save
        sys.stderr.write("\ninterrupted; the last checkpoint written (if any) is intact\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
