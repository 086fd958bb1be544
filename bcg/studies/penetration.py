"""Foot penetration of bcg.sim's contact beside MuJoCo's, standing and through a drop.

    python -m bcg.studies.penetration [--kappas 50 100 300] [--seconds 0.6] [--drop 0.05]
                                  [--activation-margin M] [--depth-correction BETA]

Two scenes, both with the G1 holding its default pose by PD (the same gains, limits and 5 ms
semi-implicit Euler in both simulators) and feet-only collision, as in training:

- standing: released in the default pose with the soles on the ground;
- drop: released ``--drop`` above it.

Penetration as the paper measures it, each simulator on its own contact geometry: in bcg.sim the
depth of each foot sphere's lowest point below the ground, d_i = max(0, -(z_i - rho)); in MuJoCo,
which runs its default soft contact on the foot capsules, the depth of its own capsule-floor contacts.
The deepest per control step, averaged over the scene (mean) and its maximum, in mm.
``--depth-correction BETA`` adds the contact's position term (:attr:`bcg.sim.ContactConfig.depth_correction`;
0, the default, is Schwarke et al.'s model, which has none). (The spheres match the capsules only while a sole
is flat: the toe spheres sit 12 mm further out sideways than the outer capsule's axis.) The robot is not
balanced by a controller, so the scenes are kept short (it tips over after about a second in both simulators).
"""

import argparse
import sys

import mujoco
import numpy as np

import bcg.sim as bs
from bcg.core import g1
from bcg.g1sim import make_g1
from bcg.validate.metrics import floor_contact_depth


def mujoco_depths(seconds: float, drop: float) -> np.ndarray:
    """Deepest penetration (m) of MuJoCo's foot-floor contacts per control step."""
    mj = g1.load_model(collisions="feet")
    mj.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    data = mujoco.MjData(mj)
    data.qpos[:] = g1.default_qpos(mj)
    data.qpos[2] += drop
    qa, da = g1.joint_qpos_adr(mj), g1.joint_dof_adr(mj)
    feet = np.unique(g1.body_ids(mj, [b for b, _ in g1.FOOT_SPHERES]))
    out = []
    for _ in range(int(round(seconds / g1.CONTROL_DT))):
        for _ in range(g1.SUBSTEPS):
            tau = g1.KP * (g1.DEFAULT_JOINT_POS - data.qpos[qa]) - g1.KD * data.qvel[da]
            data.qfrc_applied[:] = 0.0
            data.qfrc_applied[da] = np.clip(tau, -g1.EFFORT_LIMIT, g1.EFFORT_LIMIT)
            mujoco.mj_step(mj, data)
        mujoco.mj_kinematics(mj, data)  # the new state's contacts (mj_step's are the old state's)
        mujoco.mj_collision(mj, data)
        out.append(floor_contact_depth(mj, data, feet))
    return np.array(out)


def bcg_depths(sim, kappa: float, seconds: float, drop: float) -> np.ndarray:
    """Deepest foot-sphere penetration (m) per control step in bcg.sim at stiffness kappa."""
    sim.set_kappa(kappa)
    q = g1.default_qpos(sim.mjmodel)[None].copy()
    q[:, 2] += drop
    sim.set_state(q, 0.0)
    out = []
    for _ in range(int(round(seconds / g1.CONTROL_DT))):
        if sim.substep // sim.substeps >= sim.max_steps:
            sim.reset_window()
        sim.step(g1.DEFAULT_JOINT_POS[None])
        out.append(sim.penetration()[0].max())
    return np.array(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bcg.studies.penetration",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kappas", type=float, nargs="+", default=[50.0, 100.0, 300.0])
    parser.add_argument("--seconds", type=float, default=0.6, help="length of each scene, s")
    parser.add_argument("--drop", type=float, default=0.05, help="drop height of the second scene, m")
    parser.add_argument(
        "--activation-margin",
        type=float,
        default=None,
        help="m, gap below which a sphere enters the contact solver (default 4.6 / kappa)",
    )
    parser.add_argument(
        "--depth-correction",
        type=float,
        default=0.0,
        help="beta in [0, 1): the solver aims a sphere's normal velocity at beta max(d, 0) / h "
        "(default 0: Schwarke's model, without a position term)",
    )
    args = parser.parse_args(argv)
    margin = args.activation_margin
    if args.seconds <= 0 or args.drop < 0 or any(k <= 0 for k in args.kappas):
        print("error: need --seconds > 0, --drop >= 0 and positive kappas", file=sys.stderr)
        return 2
    if margin is not None and not 0 <= margin < 1:
        print("error: --activation-margin must be in [0, 1) m", file=sys.stderr)
        return 2
    if not 0 <= args.depth_correction < 1:
        print("error: --depth-correction must be in [0, 1)", file=sys.stderr)
        return 2

    bs.init(precision="float64")
    contact = bs.ContactConfig(activation_margin=margin, depth_correction=args.depth_correction)
    sim = make_g1(1, max_steps=50, requires_grad=False, contact=contact)
    print(
        f"activation margin: {'4.6 / kappa' if margin is None else format(1000 * margin, 'g') + ' mm'}; "
        f"depth correction {args.depth_correction:g}"
    )
    scenes = (("standing", 0.0), ("drop", args.drop))
    ref = {name: mujoco_depths(args.seconds, h) for name, h in scenes}
    print(
        "mean (max) deepest foot penetration (bcg.sim: its spheres; MuJoCo: its capsule contacts) "
        f"over {args.seconds:g} s, mm"
    )
    print(f"{'scene':>9} {'MuJoCo':>14} " + " ".join(f"{'kappa=' + format(k, 'g'):>14}" for k in args.kappas))
    gaps = {k: [] for k in args.kappas}
    for name, h in scenes:
        cells = []
        for k in args.kappas:
            d = bcg_depths(sim, k, args.seconds, h)
            gaps[k].append(1000 * (d.mean() - ref[name].mean()))
            cells.append(f"{1000 * d.mean():6.2f} ({1000 * d.max():5.1f})")
        print(
            f"{name:>9} {1000 * ref[name].mean():6.2f} ({1000 * ref[name].max():5.1f}) "
            + " ".join(f"{c:>14}" for c in cells)
        )
    for k in args.kappas:
        print(f"kappa={k:g}: bcg.sim minus MuJoCo, standing {gaps[k][0]:+.2f} mm, drop {gaps[k][1]:+.2f} mm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
