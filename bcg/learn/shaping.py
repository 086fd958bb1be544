"""Bounded costs for the reward's shaping terms (leg clearance, root orientation, root position).

A shaping term that grows without bound can make a state cost more than staying alive earns, and
then falling, whose value is zero, becomes the better deal; the cap keeps every such term below it.
"""

from __future__ import annotations

import numpy as np


def bounded_cost(weight: float, cap: float, value: np.ndarray) -> np.ndarray:
    """A reward term's cost w v, or c x / (1 + x) with x = w v / c under a cap c > 0: equal to w v
    while that is small against c, never above c, so that no state costs a step more than the cap
    (with c the alive reward, never more than staying alive earns)."""
    if not cap:
        return weight * value
    x = weight * value / cap
    return cap * x / (1.0 + x)


def bounded_cost_slope(weight: float, cap: float, value: np.ndarray) -> np.ndarray:
    """d cost / d value of :func:`bounded_cost`: w / (1 + x)², or w without a cap."""
    value = np.asarray(value, np.float64)
    return weight / (1.0 + weight * value / cap) ** 2 if cap else np.full_like(value, weight)
