"""How well the robot client's state estimator recovers the root's motion.

    python -m bcg.studies.estimator [run jump fight dance]
    python -m bcg.studies.estimator --policy policies/jump_k300.h5 [--policy ...] [--seconds 10]

The client (:mod:`bcg.robot.run`) observes the robot through :class:`bcg.robot.estimator.StateEstimator`
(IMU orientation and gyro, joint angles and speeds), the training environment and sim2sim through
the true state. Two measures, each printed as a table: the mean and 95th percentile of the
horizontal root velocity error and the root height error, beside the mean horizontal speed (the
error of an estimator that took the robot as standing still).

- On the clips: each clip's frames fed to the estimator as the robot would measure them. The
  retargeted clips' feet slide and float, which stance-leg kinematics reads as root motion, so this
  overstates the estimator's error where a clip's feet skate (Jump's most).
- With ``--policy``: the policy played from standing in MuJoCo, as ``sim2sim --start standing``
  does, and the estimator fed the rollout at the control rate (angular and joint velocities by
  central differences of the 50 Hz states): physical contact, no skating feet; the robot client
  runs the estimator at 500 Hz on the measured rates.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_to_matrix
from bcg.learn.policy import PolicyFileError, load_policy
from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError
from bcg.robot.estimator import StateEstimator
from bcg.validate.mujoco_runner import (
    EvaluationError,
    MujocoG1,
    PDParams,
    PolicyActions,
    ResetNoise,
    initial_state,
    run_episode,
)
from bcg.validate.stored_config import training_lead_in

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
    return _summary(v_err, h_err, np.linalg.norm(f.root_lin_vel_w[:, :2], axis=1))


def rollout_errors(policy_path: str, seconds: float = 10.0, seed: int = 0) -> dict[str, float]:
    """The estimator's errors over ``policy_path`` played from standing in MuJoCo (see the module
    docstring); also ``fell`` (1.0 if the rollout fell) and ``seconds`` played."""
    policy = load_policy(policy_path)
    clip = MotionClip.load(policy.motion_name)
    if clip.content_hash != policy.motion_hash:
        raise EvaluationError(f"{policy_path}: {clip.path.name} is not the clip the policy was trained on")
    try:
        clip = clip.with_lead_in(training_lead_in(policy.config))
    except ValueError as exc:
        raise EvaluationError(f"{policy_path}: its clip_lead_in: {exc}") from None
    backend = MujocoG1(PDParams.from_policy(policy))
    noise = ResetNoise.of_training(policy.config)
    start = initial_state(
        clip, backend.model, np.random.default_rng(seed), seconds, noise, 0.0, standing=True
    )
    episode = run_episode(backend, PolicyActions(policy), clip, start, int(round(seconds / g1.CONTROL_DT)))
    q, dt, jq = episode.qpos, g1.CONTROL_DT, g1.joint_qpos_adr(backend.model)
    rot = quat_to_matrix(q[:, 3:7])
    est = StateEstimator()
    v_err, h_err, speed = [], [], []
    for k in range(1, len(q) - 1):
        # body-frame angular velocity: the mean of the two neighbouring steps' rotation vectors
        w = (_vee(rot[k - 1].T @ rot[k]) + _vee(rot[k].T @ rot[k + 1])) / (2 * dt)
        dq = (q[k + 1, jq] - q[k - 1, jq]) / (2 * dt)
        row = est.update(q[k, 3:7], w, q[k, jq], dq, k * dt)
        v_true = (q[k + 1, :2] - q[k - 1, :2]) / (2 * dt)
        if k > 10:  # past the low-pass filter's start-up from rest
            v_err.append(np.linalg.norm(row.root_lin_vel[0, :2] - v_true))
            h_err.append(abs(row.root_pos[0, 2] - q[k, 2]))
            speed.append(np.linalg.norm(v_true))
    if not v_err:
        raise EvaluationError(
            f"{policy_path}: the rollout lasted {len(q) - 1} control steps; the estimate needs more than 12"
        )
    return _summary(np.array(v_err), np.array(h_err), np.array(speed)) | {
        "fell": float(episode.fell),
        "seconds": (len(q) - 1) * dt,
    }


def _vee(m: np.ndarray) -> np.ndarray:
    """Rotation vector of a small rotation matrix (its skew part)."""
    return np.array([m[2, 1] - m[1, 2], m[0, 2] - m[2, 0], m[1, 0] - m[0, 1]]) / 2


def _summary(v_err: np.ndarray, h_err: np.ndarray, speed: np.ndarray) -> dict[str, float]:
    return {
        "velocity_error_mean": float(v_err.mean()),
        "velocity_error_p95": float(np.percentile(v_err, 95)),
        "speed_mean": float(speed.mean()),
        "height_error_median": float(np.median(h_err)),
        "height_error_p95": float(np.percentile(h_err, 95)),
    }


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bcg.studies.estimator", description=doc)
    parser.add_argument("motions", nargs="*", help="clips to read (default: all four; not with --policy)")
    parser.add_argument("--policy", action="append", default=[], help="a policy to play from standing")
    parser.add_argument("--seconds", type=float, default=10.0, help="s per rollout (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rollout's reset noise")
    args = parser.parse_args(argv)
    if args.policy and args.motions:
        parser.error("give clips or --policy, not both")
    if not args.seconds >= 0.3:
        parser.error(
            f"--seconds must be at least 0.3 (the filter's start-up is left out), got {args.seconds}"
        )
    try:
        if args.policy:
            rows = [(path, rollout_errors(path, args.seconds, args.seed)) for path in args.policy]
        else:
            rows = [(name, estimator_errors(MotionClip.load(name))) for name in args.motions or MOTIONS]
    except (MotionFileError, PolicyFileError, EvaluationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    what = "policy from standing in MuJoCo" if args.policy else "motion (the clip's frames)"
    print(
        f"| {what} | velocity error, mean / p95 [m/s] | mean speed (standing still's error) [m/s] "
        "| height error, median / p95 [cm] |"
    )
    print("|---|---|---|---|")
    for name, e in rows:
        velocity = f"{e['velocity_error_mean']:.2f} / {e['velocity_error_p95']:.2f}"
        height = f"{100 * e['height_error_median']:.1f} / {100 * e['height_error_p95']:.1f}"
        fell = f" (fell at {e['seconds']:.1f} s)" if e.get("fell") else ""
        print(f"| {name}{fell} | {velocity} | {e['speed_mean']:.2f} | {height} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
