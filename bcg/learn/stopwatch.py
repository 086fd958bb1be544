"""Seconds spent in the named parts of a learner's iteration, for the log's ``time_*`` columns."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Wall-clock seconds per part, summed over the part's ``with stopwatch(part):`` blocks.

    Attributes:
        seconds: {part: s}; a part never timed reads 0.
    """

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        t0 = self.clock()
        try:
            yield
        finally:
            self.seconds[part] += self.clock() - t0

    def timed(self, part: str) -> bool:
        """Some block of ``part`` ran."""
        return part in self.seconds
