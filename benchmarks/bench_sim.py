"""Throughput of bcg.sim on the G1 against MuJoCo, in one run on this machine.

    python benchmarks/bench_sim.py [--envs 64] [--steps 32] [--skip-cold] [--arch cpu|cuda]
                                   [--parts free,contact,bcg]

Everything is measured in this one command so that ratios compare like with like on a noisy machine:

- MuJoCo: ``mujoco.rollout`` with 2 threads, the same G1 (armature, PD as position actuators with the
  same gains and effort limits), Euler at 5 ms; without contact, and with the foot capsules only.
- bcg.sim (float32): forward env-substeps per second, and forward+backward (the reverse pass of a
  whole window with a loss at its end) at 64 environments, without and with contact (kappa = 300).
- The cost of a 32-step window with bundled contact gradients triggered in 0 %, 10 % and 30 % of the
  environment-steps (forced at random, B = 10, H = 2; ``--bundle-size``, ``--bundle-horizon`` and
  ``--sampling`` change the bundles).
- Cold start (empty Taichi cache: every kernel compiled, reverse included) and warm start, each in a
  fresh process.

The last lines are machine-readable ``name=value``.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import mujoco
import numpy as np
from mujoco import rollout

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bcg.core import g1  # noqa: E402


def mujoco_pd_model(collisions: str) -> mujoco.MjModel:
    spec = g1.build_spec(floor=collisions != "none", collisions=collisions)
    for name, kp, kd, lim in zip(g1.JOINT_NAMES, g1.KP, g1.KD, g1.EFFORT_LIMIT, strict=True):
        act = spec.add_actuator(name=name, target=name)
        act.trntype = mujoco.mjtTrn.mjTRN_JOINT
        act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        act.gainprm[0] = kp
        act.biasprm[:3] = [0.0, -kp, -kd]
        act.forcerange = [-lim, lim]
        act.forcelimited = True
    mj = spec.compile()
    mj.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    return mj


def bench_mujoco(collisions: str, envs: int, substeps: int) -> float:
    """Env-steps (5 ms) per second of mujoco.rollout with 2 threads."""
    mj = mujoco_pd_model(collisions)
    data = [mujoco.MjData(mj) for _ in range(2)]
    d = mujoco.MjData(mj)
    d.qpos[:] = g1.default_qpos(mj)
    mujoco.mj_forward(mj, d)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.zeros(mujoco.mj_stateSize(mj, spec))
    mujoco.mj_getState(mj, d, state, spec)
    init = np.tile(state, (envs, 1))
    ctrl = np.tile(g1.DEFAULT_JOINT_POS, (envs, substeps, 1))
    rollout.rollout(mj, data, init, ctrl, persistent_pool=True)  # warm up the pool
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        rollout.rollout(mj, data, init, ctrl, persistent_pool=True)
        best = min(best, time.perf_counter() - t0)
    return envs * substeps / best


def standing_window(envs: int, steps: int, contact=None, bundle=None, backward=True, cpu_threads=None):
    """A G1 simulator of ``envs`` environments in the default pose, and a function that runs one
    window of ``steps`` steps holding it (then a reverse pass from the pelvis height) and returns
    (forward seconds, forward + backward seconds). ``cpu_threads``: :attr:`bcg.sim.SimConfig.cpu_threads`."""
    import taichi as ti

    from bcg.g1sim import make_g1

    sim = make_g1(envs, max_steps=steps, contact=contact, bundle=bundle, cpu_threads=cpu_threads)
    q0 = np.tile(g1.default_qpos(sim.mjmodel), (envs, 1))
    ctrl = np.tile(g1.DEFAULT_JOINT_POS, (envs, 1))
    seed = np.zeros((envs, sim.nq))
    seed[:, 2] = 1.0

    def window():
        sim.set_state(q0, 0.0)
        ti.sync()  # kernel launches are asynchronous on CUDA
        t0 = time.perf_counter()
        for _ in range(steps):
            sim.step(ctrl)
        ti.sync()
        t1 = time.perf_counter()
        if backward:
            sim.backward({sim.substep: seed})
            ti.sync()
        return t1 - t0, time.perf_counter() - t0

    return sim, window


def bench_bcg(envs: int, steps: int, contact, bundle=None, backward=True, repeats=2):
    """(forward env-substeps/s, forward+backward env-substeps/s) over windows of ``steps`` steps."""
    sim, window = standing_window(envs, steps, contact, bundle, backward)
    window()  # compile
    fwd, both = np.inf, np.inf
    for _ in range(repeats):
        f, b = window()
        fwd, both = min(fwd, f), min(both, b)
    n = envs * steps * sim.substeps
    return n / fwd, n / both


START_SCRIPT = """
import time, numpy as np
t0 = time.perf_counter()
import bcg.sim as bs
from bcg.core import g1
from bcg.g1sim import make_g1
import os
bs.init(arch=os.environ["BCG_BENCH_ARCH"], precision="float32")
sim = make_g1(
    4, max_steps=2, contact=bs.ContactConfig(kappa=300.0), bundle=bs.BundleConfig(trigger_fraction=1.0)
)
sim.set_state(g1.default_qpos(sim.mjmodel)[None], 0.0)
sim.rollout(np.tile(g1.DEFAULT_JOINT_POS, (2, 4, 1)))
g = np.zeros((4, sim.nq)); g[:, 2] = 1
sim.backward({sim.substep: g})
s2 = make_g1(4, max_steps=2)
s2.rollout(np.tile(g1.DEFAULT_JOINT_POS, (2, 4, 1)))
s2.backward({s2.substep: g})
print("ready", time.perf_counter() - t0)
"""


def start_time(cache: str, arch: str) -> float:
    env = dict(os.environ, BCG_CACHE_DIR=cache, PYTHONPATH=ROOT, BCG_BENCH_ARCH=arch)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", START_SCRIPT], check=True, env=env, cwd=ROOT, capture_output=True)
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32, help="control steps per window")
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold/warm start measurement")
    parser.add_argument("--arch", choices=("cpu", "cuda"), default="cpu", help="Taichi backend (default cpu)")
    parser.add_argument(
        "--parts",
        default="free,contact,bcg",
        help="comma-separated subset of free, contact, bcg (each compiles its own kernels from a cold cache)",
    )
    parser.add_argument("--bundle-size", type=int, default=10, help="B of the bcg part (the paper's 10)")
    parser.add_argument(
        "--bundle-horizon",
        type=int,
        default=2,
        help="H, control steps of the bcg part's bundles (the paper's 2)",
    )
    parser.add_argument(
        "--sampling",
        choices=("gaussian", "antithetic", "latin", "phase"),
        default="gaussian",
        help="the bcg part's bundle sampling (bcg.sim.BundleConfig.sampling; gaussian = the paper's)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"free", "contact", "bcg"}:
        parser.error(f"--parts: unknown {sorted(parts - {'free', 'contact', 'bcg'})}")
    import taichi as ti

    import bcg.sim as bs

    bs.init(arch=args.arch, precision="float32")
    print(f"bcg.sim on {ti.lang.impl.current_cfg().arch.name} (asked for {args.arch})")
    n, steps = args.envs, args.steps
    out = {}
    if "free" in parts:
        mj_free = bench_mujoco("none", n, 4 * steps)
        f, fb = bench_bcg(n, steps, None)
        print(f"MuJoCo rollout (2 threads), {n} envs, no contact: {mj_free:,.0f} env-steps/s")
        print(f"bcg.sim without contact: forward {f:,.0f} env-substeps/s, forward+backward {fb:,.0f}")
        out["forward_env_substeps_per_s"] = f
        out["forward_backward_env_substeps_per_s"] = fb
        out["mujoco_env_steps_per_s"] = mj_free
        out["forward_vs_mujoco_ratio"] = f / mj_free
        out["backward_over_forward"] = f / fb
    contact = bs.ContactConfig(kappa=300.0)
    if "contact" in parts:
        mj_feet = bench_mujoco("feet", n, 4 * steps)
        cf, cfb = bench_bcg(n, steps, contact)
        print(f"MuJoCo rollout (2 threads), {n} envs, feet contact: {mj_feet:,.0f} env-steps/s")
        print(
            f"bcg.sim with contact (kappa 300): forward {cf:,.0f} env-substeps/s, forward+backward {cfb:,.0f}"
        )
        out["contact_forward_env_substeps_per_s"] = cf
        out["contact_forward_backward_env_substeps_per_s"] = cfb
        out["mujoco_feet_env_steps_per_s"] = mj_feet
        out["contact_forward_vs_mujoco_ratio"] = cf / mj_feet
        out["contact_backward_over_forward"] = cf / cfb
    if "bcg" in parts:
        costs = {}
        for pct in (0, 10, 30):
            bundle = bs.BundleConfig(
                trigger_fraction=pct / 100.0,
                seed=1,
                size=args.bundle_size,
                horizon=args.bundle_horizon,
                sampling=args.sampling,
            )
            _, both = bench_bcg(n, steps, contact, bundle=bundle, repeats=1)
            costs[pct] = 1.0 / both
            print(
                f"32-step window with BCG (B = {args.bundle_size}, H = {args.bundle_horizon}, "
                f"{args.sampling}) triggered in {pct}% of "
                f"env-steps: {both:,.0f} env-substeps/s (fwd+bwd)"
            )
        out["bcg_cost_ratio_10pct"] = costs[10] / costs[0]
        out["bcg_cost_ratio_30pct"] = costs[30] / costs[0]
    if not args.skip_cold:
        with tempfile.TemporaryDirectory() as cache:
            out["cold_start_s"] = start_time(cache, args.arch)
            out["warm_start_s"] = start_time(cache, args.arch)
        print(f"start: cold {out['cold_start_s']:.1f} s, warm {out['warm_start_s']:.1f} s")
    for k, v in out.items():
        print(f"{k}={v:.4g}")


if __name__ == "__main__":
    main()
