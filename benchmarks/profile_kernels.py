"""Best time per call of each bcg.sim kernel over 32-step windows with contact, forward and backward.

    python benchmarks/profile_kernels.py [--envs 64] [--steps 32] [--windows 3] [--kappa 300]
                                         [--arch cpu|cuda]

The G1 stands on all 8 foot spheres in its default pose, and every window ends with a reverse pass from the
pelvis height. Taichi's kernel profiler times every launch; a kernel's best time over all its calls moves far
less with this machine's load than its mean, so compare versions by the best times, alternated in one shell
command. The last line is machine-readable ``name=value`` (ms, the kernel's tasks
summed).
"""

import argparse
import os
import sys

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import taichi as ti  # noqa: E402

MAIN = [
    "_k_dynamics",
    "_k_advance",
    "solve_multi_adjoint",
    "delassus_adjoint",
    "pgs_adjoint",
    "mass_bias_adjoint",
    "contact_rhs_adjoint",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--windows", type=int, default=3, help="timed windows after one to compile")
    ap.add_argument("--kappa", type=float, default=300.0)
    ap.add_argument("--arch", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()

    from bench_sim import standing_window

    import bcg.sim as bs

    init = ti.init

    def init_profiled(*a, **k):  # bcg.sim.init owns the other settings
        return init(*a, **k, kernel_profiler=True)

    ti.init = init_profiled
    try:
        bs.init(arch=args.arch, precision="float32")
    finally:
        ti.init = init
    n = args.envs
    sim, window = standing_window(n, args.steps, contact=bs.ContactConfig(kappa=args.kappa))
    window()  # compile
    ti.profiler.clear_kernel_profiler_info()
    for _ in range(args.windows):
        window()
    ti.profiler.print_kernel_profiler_info()
    from taichi.profiler.kernel_profiler import get_default_kernel_profiler

    prof = get_default_kernel_profiler()
    try:  # the profiler's per-kernel statistics have no public accessor in taichi 1.7
        prof._update_records()
        prof._count_statistics()
        stats = prof._statistical_results
    except AttributeError:
        print("this taichi version's profiler keeps its statistics elsewhere: read the table above")
        return
    best = {}
    for name, st in stats.items():
        for k in MAIN:
            if name.startswith(k + "_c"):
                best[k] = best.get(k, 0.0) + st.min_time
    count = sim.ground.con_count.to_numpy()[:n].mean()
    print(f"spheres in the solver per environment at the last step: {count:.1f}")
    print(" ".join(f"{k}_ms={best[k]:.3f}" for k in MAIN if k in best))


if __name__ == "__main__":
    main()
