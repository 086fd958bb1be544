"""How well the robot client's state estimator recovers each shipped clip's root motion.

    python -m bcg.studies.estimator [run jump fight dance]

The client (:mod:`bcg.robot.run`) observes the robot through :class:`bcg.robot.estimator.StateEstimator`
(IMU orientation and gyro, joint angles and speeds), the training environment and sim2sim through
the true state. This study feeds the estimator each clip's frames as the robot would measure them
and prints, per clip, the mean and 95th percentile of the horizontal root velocity error and of the
root height error, beside the clip's mean horizontal speed: the error an estimator that took the
robot as standing still would make. A clip whose error is near that speed gives the policy no
velocity information on the robot that it had in training.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError
from bcg.robot.estimator import StateEstimator

MOTIONS = ("run", "jump", "fight", "dance")


def estimator_errors(clip: MotionClip) -> dict[str, float]:
    """Velocity (m/s) and height (m) errors of the estimator over ``clip``'s frames."""
    f = clip.frames
    est = StateEstimator()
    rows = [
        est.update(f.root_quat[i], f.root_ang_vel_b[i], f.joint_pos[i], f.joint_vel[i], i * clip.dt)
        for i in range(clip.num_frames)
    ]
    vel = np.array([r.root_lin_vel[0, :2] for r in rows])
    height = np.array([r.root_pos[0, 2] for r in rows])
    v_err = np.linalg.norm(vel - f.root_lin_vel_w[:, :2], axis=1)
    h_err = np.abs(height - f.root_pos[:, 2])
    return {
        "velocity_error_mean": float(v_err.mean()),
        "velocity_error_p95": float(np.percentile(v_err, 95)),
        "speed_mean": float(np.linalg.norm(f.root_lin_vel_w[:, :2], axis=1).mean()),
        "height_error_median": float(np.median(h_err)),
        "height_error_p95": float(np.percentile(h_err, 95)),
    }


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bcg.studies.estimator", description=doc)
    parser.add_argument("motions", nargs="*", default=list(MOTIONS), help="shipped clip names or .h5 paths")
    args = parser.parse_args(argv)
    try:
        clips = [MotionClip.load(name) for name in args.motions]
    except MotionFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        "| motion | velocity error, mean / p95 [m/s] | mean speed (standing still's error) [m/s] "
        "| height error, median / p95 [cm] |"
    )
    print("|---|---|---|---|")
    for name, clip in zip(args.motions, clips, strict=True):
        e = estimator_errors(clip)
        velocity = f"{e['velocity_error_mean']:.2f} / {e['velocity_error_p95']:.2f}"
        height = f"{100 * e['height_error_median']:.1f} / {100 * e['height_error_p95']:.1f}"
        print(f"| {name} | {velocity} | {e['speed_mean']:.2f} | {height} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
