"""Detection and repair of single-frame joint spikes.

A spike is one frame of one joint that jumps away and straight back: it disagrees, by more than a
threshold and in the same direction, with

- the midpoint of its two neighbours, ``q[i] - (q[i-1] + q[i+1]) / 2``,
- the linear extrapolation from the two frames before it, ``q[i] - (2 q[i-1] - q[i-2])``,
- the linear extrapolation from the two frames after it, ``q[i] - (2 q[i+1] - q[i+2])``.

A fast but real movement (a punch whose wrist turns 1.2 rad in one frame, a sharp turning point)
agrees with at least one of the extrapolations and is not flagged; it shows up in the
discontinuity report of :mod:`bcg.motion.check` instead. The first and last two frames cannot be
tested. A repair replaces the frame by the cubic through its four neighbours,
``(-q[i-2] + 4 q[i-1] + 4 q[i+1] - q[i+2]) / 6``.

At the default threshold of 0.25 rad the four LAFAN1 takes shipped with the project have no spike
(the largest score in them is 0.195 rad, fight1_subject2 frame 3041, left ankle roll).
"""

from __future__ import annotations

import numpy as np

DEFAULT_THRESHOLD = 0.25  # rad


def spike_scores(joint_pos: np.ndarray) -> np.ndarray:
    """Spike score of every frame and joint.

    Args:
        joint_pos: rad (T, J).

    Returns:
        rad (T, J): the smallest of the three disagreements when all three share a sign, else 0; zero
        at the first and last two frames.
    """
    q = np.asarray(joint_pos, dtype=float)
    scores = np.zeros_like(q)
    if len(q) < 5:
        return scores
    centre = q[2:-2]
    mid = centre - 0.5 * (q[1:-3] + q[3:-1])
    left = centre - (2.0 * q[1:-3] - q[:-4])
    right = centre - (2.0 * q[3:-1] - q[4:])
    same = (np.sign(mid) == np.sign(left)) & (np.sign(mid) == np.sign(right))
    scores[2:-2] = np.where(same, np.minimum(np.minimum(np.abs(mid), np.abs(left)), np.abs(right)), 0.0)
    return scores


def find_spikes(joint_pos: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """(frame, joint) index pairs (n, 2) of the spikes, sorted by frame then joint."""
    return np.argwhere(spike_scores(joint_pos) > threshold)


def fix_spikes(joint_pos: np.ndarray, spikes: np.ndarray) -> np.ndarray:
    """Copy of ``joint_pos`` (T, J) with each (frame, joint) in ``spikes`` replaced by the cubic
    through its four neighbours (the neighbours are the original values)."""
    q = np.asarray(joint_pos, dtype=float)
    fixed = q.copy()
    for frame, joint in np.asarray(spikes, dtype=int).reshape(-1, 2):
        n = q[frame - 2 : frame + 3, joint]
        fixed[frame, joint] = (-n[0] + 4.0 * n[1] + 4.0 * n[3] - n[4]) / 6.0
    return fixed
