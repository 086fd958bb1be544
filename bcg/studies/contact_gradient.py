"""Gradient-variance study: how stiff contact scatters gradients, and how bundling calms them.

    python -m bcg.studies.contact_gradient [--scene jump] [--samples 64] [--steps 5] [--offset 0.005] \\
        [--kappas 50 100 300]

The paper's experiment: how a small change of the G1's pelvis height changes its vertical pelvis
velocity a few control steps later, through a touchdown of the Jump motion. M nearby initial states
are the reference state of ``motions/jump.h5`` ``--lead`` control steps (20 ms each) before a
touchdown, with the pelvis height offset by U(-d, d) (``--offset`` d, m) and optional Gaussian noise on
the pelvis's linear velocity (``--velocity-noise``, m/s). The robot is driven open loop: the PD
targets of control step c are the reference's joint positions at the end of the step. For each sample
the command differentiates vz(t_k) = qvel[2] ``--steps`` k control steps after the touchdown with
respect to the initial pelvis height, d vz(t_k) / d z(0), for each kappa with and without bundled
contact gradients (B = 10, H = 2, tau = 400 N, the paper's settings).

A touchdown is the time at which the reference's lowest foot-sphere point reaches the ground after the
feet have been at least 2 cm clear of it (linear interpolation between frames). ``--touchdown i``
picks the i-th touchdown of the clip (default: the first); ``--time`` gives the touchdown time in s
directly.

``--scene drop`` is the simpler control experiment: the G1 in its default pose, PD targets held at
the default pose, dropped flat from ``--height`` (+ U(-d, d)) above its standing height; the touchdown
is taken at the free-fall time.

The table gives, per kappa and BCG on/off, the mean and standard deviation of the gradient over the
samples, the ratio std(off) / std(on), the residual standard deviation about a straight line in the
offset (the scatter between nearby states that a smooth dependence on the height does not explain),
the trigger rate (fraction of environment-steps whose per-sphere contact force passed the threshold),
the triggers dropped because the bundle pool was full, the forward motion's foot penetration from the
touchdown on (mean over samples and control-step boundaries of the deepest sphere, and the mean
per-sample peak) and the mean final vz. The bundle noise is drawn independently for every sample
(each environment's bundle draws its own perturbations, as in training); ``--common-noise`` adds a
third row per kappa ("crn") in which every sample bundled at the same control step gets the same draws
(common random numbers, :attr:`bcg.sim.BundleConfig.common_noise`), so the samples' bundled gradients
differ by their states only. A plot of the per-sample
gradients against the height offset is written as PNG (``--out``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

import bcg.sim as bs
from bcg.core import g1
from bcg.core.atomic import atomic_write
from bcg.g1sim import make_g1
from bcg.motion import kinematics
from bcg.motion.clip import MotionClip

#: m, how far the lowest foot sphere must have been above the ground for a landing to count
CLEARANCE = 0.02


@dataclass(frozen=True)
class Scene:
    """M nearby initial states and the open-loop PD targets that drive them.

    Attributes:
        name: "jump" or "drop".
        qpos0: (M, nq) initial configurations.
        qvel0: (M, nv) initial velocities.
        ctrl: rad (T, M, 29) PD targets per control step, in :data:`g1.JOINT_NAMES` order.
        offsets: m (M,) pelvis height offset of each sample from the unperturbed state.
        lead: control steps from the start to the (reference) touchdown.
        touchdown: s, the touchdown time in the clip (jump) or the free-fall time (drop).
    """

    name: str
    qpos0: np.ndarray
    qvel0: np.ndarray
    ctrl: np.ndarray
    offsets: np.ndarray
    lead: int
    touchdown: float

    @property
    def samples(self) -> int:
        return len(self.offsets)

    @property
    def steps(self) -> int:
        return len(self.ctrl)


def foot_clearance(clip) -> np.ndarray:
    """m (T,) height of the lowest point of the lowest foot sphere above the ground, per frame."""

    index = np.array([clip.body_names.index(body) for body, _ in g1.FOOT_SPHERES])
    offsets = np.array([pos for _, pos in g1.FOOT_SPHERES], dtype=float)
    points = kinematics.point_positions(clip.frames.body_pos, clip.frames.body_quat, index, offsets)
    return points[..., 2].min(axis=-1) - g1.FOOT_SPHERE_RADIUS


def touchdowns(clip, clearance: float = CLEARANCE) -> np.ndarray:
    """Touchdown times (s) of a clip: the lowest foot-sphere point reaches z = 0 after having been at
    least ``clearance`` m above it; linear interpolation between frames."""
    h = foot_clearance(clip)
    times, airborne = [], False
    for i in range(1, len(h)):
        airborne = airborne or h[i - 1] > clearance
        if airborne and h[i - 1] > 0.0 >= h[i]:
            times.append((i - 1 + h[i - 1] / (h[i - 1] - h[i])) * clip.dt)
            airborne = False
    return np.array(times)


def _offsets(rng, samples: int, offset: float) -> np.ndarray:
    return np.sort(rng.uniform(-offset, offset, samples))


def jump_scene(
    samples: int,
    steps: int,
    offset: float,
    lead: int = 3,
    touchdown: int = 0,
    time_s: float | None = None,
    velocity_noise: float = 0.0,
    seed: int = 0,
    clip_name: str = "jump",
) -> Scene:
    """The Jump clip, ``lead`` control steps before a touchdown, ``steps`` control steps after it.

    Args:
        samples: M nearby initial states.
        steps: control steps (20 ms) simulated after the touchdown.
        offset: m, the pelvis heights are the reference's + U(-offset, offset) (sorted).
        lead: control steps simulated before the touchdown.
        touchdown: index into :func:`touchdowns` of the clip.
        time_s: s, touchdown time to use instead (overrides ``touchdown``).
        velocity_noise: m/s, std of Gaussian noise added to the pelvis's linear velocity.
        seed: seed of the offsets and the velocity noise.
        clip_name: motion clip name or path.

    Raises:
        ValueError: no such touchdown, or the window leaves the clip.
    """

    clip = MotionClip.load(clip_name)
    if time_s is None:
        found = touchdowns(clip)
        if not 0 <= touchdown < len(found):
            raise ValueError(f"the clip has {len(found)} touchdowns; --touchdown {touchdown} is out of range")
        time_s = float(found[touchdown])
    start = time_s - lead * g1.CONTROL_DT
    end = time_s + steps * g1.CONTROL_DT
    if start < 0.0 or end > clip.duration:
        raise ValueError(f"the window {start:.3f}..{end:.3f} s leaves the clip (0..{clip.duration:.3f} s)")
    rng = np.random.default_rng(seed)
    ref = clip.sample(np.full(samples, start))
    qpos, qvel = clip.qpos(ref), clip.qvel(ref)
    dz = _offsets(rng, samples, offset)
    qpos[:, 2] += dz
    qvel[:, 0:3] += rng.normal(0.0, velocity_noise, (samples, 3)) if velocity_noise > 0 else 0.0
    times = start + g1.CONTROL_DT * np.arange(1, lead + steps + 1)
    targets = clip.sample(times).joint_pos
    ctrl = np.repeat(targets[:, None], samples, axis=1)
    return Scene("jump", qpos, qvel, ctrl, dz, lead, time_s)


def drop_scene(
    samples: int, steps: int, offset: float, height: float = 0.11, velocity_noise: float = 0.0, seed: int = 0
) -> Scene:
    """The default pose dropped flat from ``height`` (+ U(-offset, offset)) m above standing, PD
    targets held at the default pose, ``steps`` control steps simulated after the free-fall time
    (``lead`` = the free-fall time in control steps); other arguments as :func:`jump_scene`."""
    mj = g1.load_model(floor=False, collisions="none")
    rng = np.random.default_rng(seed)
    fall = math.sqrt(2.0 * height / 9.81)
    lead = max(1, round(fall / g1.CONTROL_DT))
    qpos = np.tile(g1.default_qpos(mj), (samples, 1))
    dz = _offsets(rng, samples, offset)
    qpos[:, 2] += height + dz
    qvel = np.zeros((samples, mj.nv))
    qvel[:, 0:3] += rng.normal(0.0, velocity_noise, (samples, 3)) if velocity_noise > 0 else 0.0
    ctrl = np.broadcast_to(g1.DEFAULT_JOINT_POS, (lead + steps, samples, len(g1.JOINT_NAMES))).copy()
    return Scene("drop", qpos, qvel, ctrl, dz, lead, fall)


@dataclass(frozen=True)
class Result:
    """One setting's outcome.

    Attributes:
        kappa: 1/m contact stiffness; bundle: BCG on or off.
        common_noise: the bundles drew common random numbers (:attr:`bcg.sim.BundleConfig.common_noise`).
        gradient: 1/s (M,) d vz(t_k) / d z(0) per sample.
        vz: m/s (M,) the forward vertical pelvis velocity at t_k.
        trigger_rate: fraction of environment-steps whose contact force passed the threshold.
        dropped: triggers left unbundled because the bundle pool was full.
        penetration: m, mean over samples and control steps from the touchdown on of the deepest
            sphere's depth.
        peak_penetration: m, mean over samples of the deepest penetration from the touchdown on.
    """

    kappa: float
    bundle: bool
    gradient: np.ndarray
    vz: np.ndarray
    trigger_rate: float
    dropped: int
    penetration: float
    peak_penetration: float
    common_noise: bool = False

    @property
    def label(self) -> str:
        return ("crn" if self.common_noise else "on") if self.bundle else "off"


def make_simulator(
    scene: Scene,
    kappa: float = 300.0,
    bundle=None,
    activation_margin: float | None = None,
    depth_correction: float = 0.0,
):
    """A G1 simulator with contact and bundled contact gradients sized for the scene; reuse it across
    kappas and BCG on/off (kernels compile once per simulator).

    Args:
        scene: the samples and window length.
        kappa: 1/m initial contact stiffness.
        bundle: :class:`bcg.sim.BundleConfig`; default the paper's settings.
        activation_margin: m, :attr:`bcg.sim.ContactConfig.activation_margin` (None = 4.6 / kappa,
            following kappa; 0 = a sphere enters the solver only once it touches, as in Schwarke's code).
        depth_correction: :attr:`bcg.sim.ContactConfig.depth_correction`, the position term
            (0 = Schwarke's model).
    """

    return make_g1(
        scene.samples,
        max_steps=scene.steps,
        contact=bs.ContactConfig(
            kappa=kappa, activation_margin=activation_margin, depth_correction=depth_correction
        ),
        bundle=bundle if bundle is not None else bs.BundleConfig(),
    )


def run_setting(sim, scene: Scene, kappa: float, bundle: bool, common_noise: bool = False) -> Result:
    """Roll the scene out at ``kappa`` with BCG on or off (with common random numbers across samples
    when ``common_noise``) and differentiate vz at the end."""
    sim.set_kappa(kappa)
    sim.set_bundling(bundle, common_noise=common_noise)
    sim.set_state(scene.qpos0, scene.qvel0)
    sim.reset_stats()
    depth = []
    for c in range(scene.steps):
        sim.step(scene.ctrl[c])
        if c + 1 >= scene.lead:
            depth.append(sim.penetration().max(axis=1))
    depth = np.array(depth)
    vz = sim.qvel_now[:, 2].astype(np.float64)
    seed = np.zeros((scene.samples, sim.nv))
    seed[:, 2] = 1.0
    stats = sim.bundle_stats()
    grad = sim.backward(qvel_grad={sim.substep: seed}).qpos[:, 2].astype(np.float64)
    return Result(
        kappa=float(kappa),
        bundle=bool(bundle),
        gradient=grad,
        vz=vz,
        trigger_rate=float(stats["trigger_rate"]),
        dropped=int(stats["dropped"]),
        penetration=float(depth.mean()),
        peak_penetration=float(depth.max(axis=0).mean()),
        common_noise=bool(bundle and common_noise),
    )


def residual_std(offsets: np.ndarray, gradient: np.ndarray) -> float:
    """Standard deviation of the gradient about its least-squares line in the offset: the scatter
    between nearby states that a smooth (linear) dependence on the height does not explain."""
    a = np.stack([np.ones_like(offsets), offsets], axis=1)
    coef, *_ = np.linalg.lstsq(a, gradient, rcond=None)
    return float(np.std(gradient - a @ coef))


def table(results: list[Result], scene: Scene) -> str:
    """The printed table (one row per setting, then std(off) / std(on) per kappa)."""
    k = scene.steps - scene.lead
    lines = [
        f"scene {scene.name}: touchdown {scene.touchdown:.3f} s, {scene.lead} steps before it to {k} after, "
        f"{scene.samples} samples, pelvis height offset {1000 * np.ptp(scene.offsets):.1f} mm wide",
        f"d vz(touchdown + {k} steps) / d z(0), 1/s",
        f"{'kappa':>6} {'BCG':>4} {'mean':>10} {'std':>10} {'off/on':>7} {'resid':>8} "
        f"{'trigger':>8} {'dropped':>7} "
        f"{'pen. mm':>8} {'peak mm':>8} {'vz m/s':>8}",
    ]
    for r in results:
        ratio = ""
        if r.bundle:
            off = next((o for o in results if o.kappa == r.kappa and not o.bundle), None)
            if off is not None:
                on_std = r.gradient.std()
                ratio = f"{off.gradient.std() / on_std:.2f}" if on_std > 0 else "inf"
        lines.append(
            f"{r.kappa:6g} {r.label:>4} {r.gradient.mean():10.4f} "
            f"{r.gradient.std():10.4f} {ratio:>7} {residual_std(scene.offsets, r.gradient):8.4f} "
            f"{r.trigger_rate:8.2%} {r.dropped:7d} {1000 * r.penetration:8.2f} "
            f"{1000 * r.peak_penetration:8.2f} {r.vz.mean():8.3f}"
        )
    return "\n".join(lines)


def plot(results: list[Result], scene: Scene, path: str, sampling: str = "gaussian"):
    """Per-sample gradients against the height offset, one panel per kappa (PNG, written atomically);
    the legend names the bundles' sampling unless it is the paper's."""
    # matplotlib, slow to import, loads only when a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    kappas = sorted({r.kappa for r in results})
    fig, axes = plt.subplots(1, len(kappas), figsize=(4 * len(kappas), 3.5), squeeze=False)
    for ax, kappa in zip(axes[0], kappas, strict=True):
        for r in results:
            if r.kappa != kappa:
                continue
            colour = {"off": "tab:red", "on": "tab:blue", "crn": "tab:green"}[r.label]
            bcg = "BCG" if sampling == "gaussian" else f"BCG ({sampling})"
            name = {"off": "plain", "on": bcg, "crn": f"{bcg}, common noise"}[r.label]
            label = f"{name} (std {r.gradient.std():.3g})"
            ax.plot(1000 * scene.offsets, r.gradient, "o", ms=3, color=colour, label=label)
        ax.set_title(f"kappa = {kappa:g}")
        ax.set_xlabel("initial pelvis height offset [mm]")
        ax.set_ylabel(f"d vz(t+{scene.steps - scene.lead}) / d z0 [1/s]")
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bcg.studies.contact_gradient",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scene", choices=["jump", "drop"], default="jump")
    p.add_argument("--samples", type=int, default=64, help="nearby initial states (M)")
    p.add_argument("--steps", type=int, default=5, help="control steps k (20 ms) after the touchdown")
    p.add_argument("--lead", type=int, default=3, help="jump: control steps before the touchdown")
    p.add_argument("--offset", type=float, default=0.005, help="m, pelvis height offsets U(-d, d)")
    p.add_argument("--velocity-noise", type=float, default=0.0, help="m/s, std of pelvis velocity noise")
    p.add_argument("--touchdown", type=int, default=0, help="jump: which touchdown of the clip (0 = first)")
    p.add_argument(
        "--time", type=float, default=None, help="jump: touchdown time in s (overrides --touchdown)"
    )
    p.add_argument("--height", type=float, default=0.11, help="drop: m above the standing height")
    p.add_argument("--threshold", type=float, default=400.0, help="N, per-sphere force that triggers BCG")
    p.add_argument("--kappas", type=float, nargs="+", default=[50.0, 100.0, 300.0])
    p.add_argument(
        "--activation-margin",
        type=float,
        default=None,
        help="m, gap below which a sphere enters the contact solver (default 4.6 / kappa; 0 as in "
        "Schwarke's code, where the impulse scale jumps from 0 to 1/2 at touchdown)",
    )
    p.add_argument(
        "--depth-correction",
        type=float,
        default=0.0,
        help="beta in [0, 1): the contact solver aims a sphere's normal velocity at beta max(d, 0) / h "
        "(bcg.sim.ContactConfig.depth_correction; 0 = Schwarke's model, without a position term)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the offsets and of the bundle noise")
    p.add_argument(
        "--common-noise",
        action="store_true",
        help="also run BCG with common random numbers: every sample bundled at a step gets the same draws",
    )
    p.add_argument("--bundle-size", type=int, default=10, help="B, copies per bundle (the paper's 10)")
    p.add_argument(
        "--bundle-horizon", type=int, default=2, help="H, control steps a bundle lasts (the paper's 2)"
    )
    p.add_argument(
        "--sampling",
        choices=["gaussian", "antithetic", "latin", "phase"],
        default="gaussian",
        help="how a bundle's B draws are spread (bcg.sim.BundleConfig.sampling; gaussian = the paper's)",
    )
    p.add_argument(
        "--perturb-at",
        choices=["bodies", "spheres"],
        default="bodies",
        help="where a bundle's draws land (bcg.sim.BundleConfig.perturb_at): the foot bodies' origins "
        "(default) or every contact sphere's centre",
    )
    p.add_argument("--out", default="gradient_study.png", help="plot file (PNG)")
    p.add_argument("--arch", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["float32", "float64"], default="float32")
    return p


def _check(args) -> str | None:
    if args.samples < 2:
        return "--samples must be at least 2"
    if args.steps < 1 or args.lead < 1:
        return "--steps and --lead must be at least 1"
    if not args.offset > 0 or args.velocity_noise < 0 or args.height <= 0:
        return "--offset and --height must be positive and --velocity-noise non-negative"
    if args.bundle_size < 1 or (args.sampling == "antithetic" and args.bundle_size % 2):
        return "--bundle-size must be at least 1 (and even with --sampling antithetic)"
    if args.bundle_horizon < 1:
        return "--bundle-horizon must be at least 1"
    if not args.threshold >= 0:
        return "--threshold must be non-negative"
    if any(not k > 0 for k in args.kappas):
        return "kappas must be positive"
    if args.activation_margin is not None and not 0 <= args.activation_margin < 1:
        return "--activation-margin must be in [0, 1) m"
    if not 0 <= args.depth_correction < 1:
        return "--depth-correction must be in [0, 1)"
    if not args.out.endswith(".png"):
        return "--out must name a .png file"
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        return f"--out: no folder {os.path.dirname(os.path.abspath(args.out))}"
    return None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    problem = _check(args)
    if problem is None:
        try:
            if args.scene == "jump":
                scene = jump_scene(
                    args.samples, args.steps, args.offset, args.lead, args.touchdown, args.time,
                    args.velocity_noise, args.seed,
                )  # fmt: skip
            else:
                scene = drop_scene(
                    args.samples, args.steps, args.offset, args.height, args.velocity_noise, args.seed
                )
        except ValueError as e:
            problem = str(e)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    bs.init(arch=args.arch, precision=args.precision)
    t0 = time.time()
    print("building the simulator (kernels load or compile on first use)", file=sys.stderr, flush=True)
    sim = make_simulator(
        scene,
        args.kappas[0],
        bs.BundleConfig(
            threshold=args.threshold,
            seed=args.seed,
            sampling=args.sampling,
            size=args.bundle_size,
            horizon=args.bundle_horizon,
            perturb_at=args.perturb_at,
        ),
        activation_margin=args.activation_margin,
        depth_correction=args.depth_correction,
    )
    margin = "4.6 / kappa" if args.activation_margin is None else f"{1000 * args.activation_margin:g} mm"
    print(
        f"activation margin: {margin}; depth correction {args.depth_correction:g}; "
        f"bundles of {args.bundle_size} for {args.bundle_horizon} steps, "
        f"draws: {args.sampling}, "
        f"perturbed at the {args.perturb_at}"
    )
    modes = [(False, False), (True, False)] + ([(True, True)] if args.common_noise else [])
    settings = [(k, b, crn) for k in args.kappas for b, crn in modes]
    results = []
    for i, (kappa, bundle, crn) in enumerate(settings):
        t = time.time()
        results.append(run_setting(sim, scene, kappa, bundle, crn))
        done, now = i + 1, time.time()
        # the first setting pays for loading the kernels: estimate from the later ones when there are any
        per = (now - t) if i else (now - t0) / done
        print(
            f"[{done}/{len(settings)}] kappa={kappa:g} bcg={results[-1].label} "
            f"{now - t:.1f} s ({scene.samples * scene.steps / (now - t):.0f} env-steps/s), "
            f"eta {per * (len(settings) - done):.0f} s",
            file=sys.stderr,
            flush=True,
        )
    print(table(results, scene))
    plot(results, scene, args.out, args.sampling)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
