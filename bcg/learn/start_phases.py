"""Where episodes start on the clip: uniform, or shifted toward the phases where episodes fail.

Reference state initialisation [paper] starts every episode at a uniform phase of the clip. A policy
that tracks most of a clip but not one hard segment (Run's sprint out of the turn at 13-14.5 s, Jump's
turn-around after the landing) then meets that segment only as often as any other, however often it
fails there. :class:`FailurePhases` keeps a decaying histogram of the clip times at which episodes
ended early (a fall or lost track, not a timeout) and, when asked, starts a fraction of the resets
shortly before those times, so that the policy practises the approach to the segment where it fails.
This is the start-state side of hard-example mining (as PHC does over motions); with a mix of 0 the
sampler is the paper's uniform one and draws the same random numbers.

A second, independent share (``begin_mix``) starts at the clip's first frame. Uniform starts visit
clip time t only from episodes begun before it, so the first second, which only the starts inside
it reach, is the least practised stretch of the clip, and it is the one a deployed robot always
begins with (:mod:`bcg.robot.run` starts the clip at its first frame).
"""

from __future__ import annotations

import numpy as np

from bcg.core import g1
from bcg.motion import MotionClip


class FailurePhases:
    """Start phases: uniform, with a fraction ``mix`` drawn shortly before recent failures and a
    fraction ``begin_mix`` at the clip's first frame.

    Args:
        clip: the reference clip.
        mix: fraction of the resets drawn from the failure histogram, in [0, 1] (0: uniform only).
        lead: s; a failure-based start lies U(0, lead) before a failure time drawn from the histogram.
        memory: factor on the histogram per window (``decay``), in [0, 1): 0.97 halves a failure's
            weight in about 23 windows.
        bin_width: s, the histogram's resolution.
        horizon: s left free at the clip's end, as :meth:`MotionClip.random_phase` takes it (the
            observation's future frames).
        begin_mix: fraction of the resets, in [0, 1], that start at clip time 0, drawn after and
            independently of the failure-based ones (which then make ``mix * (1 - begin_mix)``).
    """

    def __init__(
        self,
        clip: MotionClip,
        mix: float,
        lead: float = 1.0,
        memory: float = 0.97,
        bin_width: float = 0.25,
        horizon: float = 3 * g1.CONTROL_DT,
        begin_mix: float = 0.0,
    ):
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"failure start mix must lie in [0, 1], got {mix}")
        if not lead >= 0.0:
            raise ValueError(f"failure start lead must be >= 0 s, got {lead}")
        if not 0.0 <= memory < 1.0:
            raise ValueError(f"failure start memory must lie in [0, 1), got {memory}")
        if not 0.0 <= begin_mix <= 1.0:
            raise ValueError(f"clip-start mix must lie in [0, 1], got {begin_mix}")
        if not bin_width > 0.0:
            raise ValueError(f"failure histogram bin width must be > 0 s, got {bin_width}")
        self.clip, self.mix, self.lead, self.memory = clip, float(mix), float(lead), float(memory)
        self.bin_width = float(bin_width)
        self.horizon = float(horizon)
        self.begin_mix = float(begin_mix)
        self.counts = np.zeros(int(np.ceil(clip.duration / self.bin_width)))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Start times (n,) in s."""
        t0 = self._failure_or_uniform(rng, n)
        if self.begin_mix > 0.0 and n:  # no draw at 0: the same random numbers as before the option
            t0[rng.random(n) < self.begin_mix] = 0.0
        return t0

    def _failure_or_uniform(self, rng: np.random.Generator, n: int) -> np.ndarray:
        t0 = self.clip.random_phase(rng, n, self.horizon)
        total = self.counts.sum()
        if self.mix == 0.0 or total <= 0.0 or n == 0:
            return t0  # the uniform draw alone: the same random numbers as without the sampler
        pick = rng.random(n) < self.mix
        m = int(pick.sum())
        if m:
            bins = rng.choice(len(self.counts), size=m, p=self.counts / total)
            fail_time = (bins + rng.random(m)) * self.bin_width
            start = fail_time - rng.uniform(0.0, self.lead, m)
            t0[pick] = np.clip(start, 0.0, self.clip.duration - self.horizon)
        return t0

    def record(self, times: np.ndarray) -> None:
        """Count failures at these clip times (s)."""
        times = np.asarray(times, np.float64)
        times = times[np.isfinite(times)]
        if len(times):
            idx = np.clip((times / self.bin_width).astype(np.int64), 0, len(self.counts) - 1)
            np.add.at(self.counts, idx, 1.0)

    def decay(self) -> None:
        """Forget a little: once per window."""
        self.counts *= self.memory

    def state_dict(self) -> dict:
        return {"counts": self.counts.copy()}

    def load_state_dict(self, d: dict) -> None:
        counts = np.asarray(d["counts"], np.float64)
        if counts.shape != self.counts.shape:
            raise ValueError(f"failure histogram: stored {counts.shape} != {self.counts.shape}")
        self.counts = counts.copy()
