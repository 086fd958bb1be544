"""Reproducible choice of the most dynamic window of a take.

Every window of ``length`` consecutive frames is scored by one criterion, and the best admissible
window wins (the earliest one on a tie). Criteria (per-frame quantity averaged or counted over the
window):

- ``speed``: mean horizontal root speed, m/s (fast running);
- ``flight``: number of flight frames, where both feet are off the ground, i.e. the lowest foot
  sphere bottom of each foot is above :data:`FLIGHT_CLEARANCE` (jumps);
- ``joint-speed``: mean absolute joint velocity over the 29 joints, rad/s (fights, dances).

A window is admissible when the root stays above :data:`MIN_ROOT_HEIGHT` (so that the reference never
comes near the fall height), no frame holds a joint spike (:mod:`bcg.motion.spikes`), and no airborne
phase floats: retargeting a human take to the smaller G1 scales its heights but not its timing, so
its flights fall slower than gravity, and a phase whose centre of mass falls slower than
:data:`MIN_FLIGHT_FALL` g cannot be followed by a robot (it would have to rise higher and stay up
as long, about 9 cm higher for fight1_subject2's flying kicks). motions/README.md gives the
phases of the takes and docs/learning.md what the kicks did to training.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from bcg.core import g1
from bcg.motion import kinematics, spikes

CRITERIA = ("speed", "flight", "joint-speed")
FLIGHT_CLEARANCE = 0.03  # m; the stance foot of these takes stays within about 1 cm of z = 0
MIN_ROOT_HEIGHT = g1.FALL_HEIGHT + 0.1  # m
GRAVITY = 9.81  # m/s^2
MIN_AIRBORNE_FRAMES = 5  # shorter airborne phases are too few frames for a fitted acceleration
# fraction of g; an airborne phase falling slower makes its windows inadmissible. Between the
# takes' floating phases (fight1_subject2's at 0.01-0.22 g) and Jump's hops (0.39-0.49 g), which
# its policies learnt; the nearest phases are jumps1_subject1's at 0.29-0.30 g outside its window.
MIN_FLIGHT_FALL = 0.3


@dataclass(frozen=True)
class Window:
    """Chosen frames [start, end) and their score (unit of the criterion)."""

    start: int
    end: int
    score: float
    criterion: str


def frame_quantity(datasets: dict[str, np.ndarray], criterion: str) -> np.ndarray:
    """Per-frame quantity (T,) that the criterion averages or counts (see the module docstring).

    Args:
        datasets: the schema's datasets of the whole take (joints in any order, bodies named).
    """
    if criterion == "speed":
        return np.linalg.norm(datasets["root_lin_vel_w"][:, :2], axis=1)
    if criterion == "flight":
        spheres = kinematics.foot_sphere_positions(
            datasets["body_pos"], datasets["body_quat"], tuple(datasets["body_names"])
        )
        return np.all(kinematics.foot_clearance(spheres) > FLIGHT_CLEARANCE, axis=1).astype(float)
    if criterion == "joint-speed":
        return np.abs(datasets["joint_vel"]).mean(axis=1)
    raise ValueError(f"unknown criterion {criterion!r}, expected one of {', '.join(CRITERIA)}")


def floating_frames(datasets: dict[str, np.ndarray], model: mujoco.MjModel, dt: float) -> np.ndarray:
    """(T,) True in the frames of airborne phases whose centre of mass falls slower than
    :data:`MIN_FLIGHT_FALL` g (``model``: the G1 the datasets' body poses are of, ``dt``: frame
    spacing in s)."""
    phases = kinematics.airborne_phases(
        model,
        datasets["body_pos"],
        datasets["body_quat"],
        tuple(datasets["body_names"]),
        dt,
        FLIGHT_CLEARANCE,
        MIN_AIRBORNE_FRAMES,
    )
    floating = np.zeros(len(datasets["body_pos"]), dtype=bool)
    for first, end, accel in phases:
        if accel > -MIN_FLIGHT_FALL * GRAVITY:
            floating[first:end] = True
    return floating


def window_scores(
    datasets: dict[str, np.ndarray], criterion: str, length: int, model: mujoco.MjModel, dt: float
) -> np.ndarray:
    """Score of every window start (T - length + 1,); -inf where the window is not admissible.

    Args:
        datasets: the schema's datasets of the whole take.
        criterion: one of :data:`CRITERIA`; length: frames per window.
        model: the G1 the body poses are of (masses for the centre of mass); dt: frame spacing, s.
    """
    quantity = frame_quantity(datasets, criterion)
    if length > len(quantity):
        raise ValueError(f"window of {length} frames is longer than the take ({len(quantity)} frames)")
    total = np.convolve(quantity, np.ones(length), mode="valid")
    scores = total if criterion == "flight" else total / length
    bad = (
        (datasets["root_pos"][:, 2] < MIN_ROOT_HEIGHT)
        | np.any(spikes.spike_scores(datasets["joint_pos"]) > spikes.DEFAULT_THRESHOLD, axis=1)
        | floating_frames(datasets, model, dt)
    )
    bad_in_window = np.convolve(bad.astype(float), np.ones(length), mode="valid") > 0
    return np.where(bad_in_window, -np.inf, scores)


def best_window(
    datasets: dict[str, np.ndarray], criterion: str, length: int, model: mujoco.MjModel, dt: float
) -> Window:
    """The admissible window with the highest score (earliest on a tie); arguments as
    :func:`window_scores`'s."""
    scores = window_scores(datasets, criterion, length, model, dt)
    start = int(np.argmax(scores))
    if not np.isfinite(scores[start]):
        raise ValueError(f"no admissible window of {length} frames")
    return Window(start=start, end=start + length, score=float(scores[start]), criterion=criterion)
