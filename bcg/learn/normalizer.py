"""Running statistics used to normalise observations, rewards and ADD differentials.

- :class:`RunningMeanStd`: per-feature mean and variance of a stream (Chan's parallel update,
  float64 accumulators). Observation normaliser: ô = (o - mean) / sqrt(var + eps), eps = 1e-5 (SHAC).
- :class:`ReturnNormalizer`: SHAC's reward scaling: each env keeps a discounted running return
  G <- gamma G + r (reset to 0 at done); rewards are divided by sqrt(Var[G] + 1e-6).
- :class:`DiffNormalizer`: MimicKit's ADD normaliser: Δ̂ = Δ / max(mean|Δ|, 1e-4) per feature, with the
  mean absolute value tracked over every differential recorded so far.

None of the statistics carry gradients. SHAC freezes the observation statistics for a rollout
window (``frozen = rms.copy()`` at the start, ``rms.update`` during it) so that the normalisation
inside the differentiated graph stays fixed; :meth:`RunningMeanStd.normalize_grad` chains it.
Every class has ``state_dict`` / ``from_state_dict`` holding arrays only (see ``mlp.write_tree_h5``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OBS_EPS = 1e-5
RETURN_EPS = 1e-6
DIFF_MIN = 1e-4


@dataclass
class RunningMeanStd:
    """Mean and (population) variance of everything passed to :meth:`update`.

    Attributes:
        mean: (*shape,) float64.
        var: (*shape,) float64; 1 before the first update.
        count: samples seen (float, may start at a small prior count).
        eps: added to var before the square root.
    """

    mean: np.ndarray
    var: np.ndarray
    count: float
    eps: float = OBS_EPS

    @classmethod
    def new(cls, shape: int | tuple[int, ...], eps: float = OBS_EPS, initial_count: float = 0.0):
        """Zero mean, unit variance; ``initial_count`` > 0 weights that prior (SHAC uses 1e-4)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return cls(np.zeros(shape), np.ones(shape), float(initial_count), eps)

    def update(self, x: np.ndarray) -> None:
        """Fold a batch (..., *shape) into the statistics."""
        x = np.asarray(x, dtype=np.float64)
        nd = self.mean.ndim
        if x.shape[x.ndim - nd :] != self.mean.shape or x.ndim <= nd:
            raise ValueError(f"batch shape {x.shape} does not end in the statistics shape {self.mean.shape}")
        x = x.reshape(-1, *self.mean.shape)
        n = x.shape[0]
        batch_mean = x.mean(axis=0)
        batch_var = x.var(axis=0)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.mean = self.mean + delta * (n / total)
        self.var = m2 / total
        self.count = total

    def inv_std(self, dtype=np.float32) -> np.ndarray:
        """1 / sqrt(var + eps), (*shape,)."""
        return (1.0 / np.sqrt(self.var + self.eps)).astype(dtype)

    def normalize(self, x: np.ndarray, dtype=np.float32) -> np.ndarray:
        """(x - mean) / sqrt(var + eps), in ``dtype``."""
        return ((np.asarray(x) - self.mean.astype(dtype)) * self.inv_std(dtype)).astype(dtype, copy=False)

    def normalize_grad(self, d_normalized: np.ndarray) -> np.ndarray:
        """dL/dx from dL/dx̂ (the statistics are constants)."""
        d = np.asarray(d_normalized)
        return d * self.inv_std(d.dtype)

    def denormalize(self, x_normalized: np.ndarray) -> np.ndarray:
        return np.asarray(x_normalized) * np.sqrt(self.var + self.eps) + self.mean

    def copy(self) -> RunningMeanStd:
        return RunningMeanStd(self.mean.copy(), self.var.copy(), self.count, self.eps)

    def state_dict(self) -> dict:
        return {
            "mean": self.mean.copy(),
            "var": self.var.copy(),
            "count": np.float64(self.count),
            "eps": np.float64(self.eps),
        }

    @classmethod
    def from_state_dict(cls, d: dict) -> RunningMeanStd:
        return cls(
            np.array(d["mean"], np.float64),
            np.array(d["var"], np.float64),
            float(d["count"]),
            float(d["eps"]),
        )


@dataclass
class ReturnNormalizer:
    """SHAC's return-based reward scale.

    Attributes:
        returns: (num_envs,) discounted running return of each env since its last reset.
        rms: statistics of those returns (scalar shape).
        gamma: discount.
    """

    returns: np.ndarray
    rms: RunningMeanStd
    gamma: float

    @classmethod
    def new(cls, num_envs: int, gamma: float) -> ReturnNormalizer:
        return cls(np.zeros(num_envs), RunningMeanStd.new((), eps=RETURN_EPS), float(gamma))

    def scale(self) -> float:
        """Factor the rewards are multiplied by: 1 / sqrt(Var[G] + 1e-6). Read it once per window."""
        return float(1.0 / np.sqrt(self.rms.var + self.rms.eps))

    def observe(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """After a control step: G <- gamma G + r, update the statistics, then G <- 0 where done.

        Args:
            rewards: (num_envs,) unscaled rewards of this step.
            dones: (num_envs,) bool, episode ended at this step.
        """
        rewards = np.asarray(rewards, np.float64)
        if rewards.shape != self.returns.shape:
            raise ValueError(f"rewards shape {rewards.shape} != ({self.returns.shape[0]},) envs")
        self.returns = self.returns * self.gamma + rewards
        self.rms.update(self.returns)
        self.returns = np.where(np.asarray(dones, bool), 0.0, self.returns)

    def state_dict(self) -> dict:
        return {"returns": self.returns.copy(), "rms": self.rms.state_dict(), "gamma": np.float64(self.gamma)}

    @classmethod
    def from_state_dict(cls, d: dict) -> ReturnNormalizer:
        return cls(
            np.array(d["returns"], np.float64), RunningMeanStd.from_state_dict(d["rms"]), float(d["gamma"])
        )


@dataclass
class DiffNormalizer:
    """Per-feature running mean of |Δ| for ADD (MimicKit ``DiffNormalizer``).

    Attributes:
        mean_abs: (dim,) float64, 1 before the first update.
        count: differentials seen.
        min_diff: floor on the divisor.
    """

    mean_abs: np.ndarray
    count: int
    min_diff: float = DIFF_MIN

    @classmethod
    def new(cls, dim: int, min_diff: float = DIFF_MIN) -> DiffNormalizer:
        return cls(np.ones(dim), 0, float(min_diff))

    def update(self, delta: np.ndarray) -> None:
        """Fold a batch of differentials (..., dim) into the mean absolute value."""
        delta = np.asarray(delta, np.float64)
        if delta.ndim < 2 or delta.shape[-1] != self.mean_abs.shape[0]:
            raise ValueError(f"differentials {delta.shape} must be (..., {self.mean_abs.shape[0]})")
        delta = delta.reshape(-1, delta.shape[-1])
        n = delta.shape[0]
        total = self.count + n
        self.mean_abs = self.mean_abs * (self.count / total) + np.abs(delta).sum(axis=0) / total
        self.count = total

    def scale(self, dtype=np.float32) -> np.ndarray:
        """1 / max(mean|Δ|, min_diff), (dim,): Δ̂ = Δ * scale and dL/dΔ = dL/dΔ̂ * scale."""
        return (1.0 / np.maximum(self.mean_abs, self.min_diff)).astype(dtype)

    def normalize(self, delta: np.ndarray, dtype=np.float32) -> np.ndarray:
        return (np.asarray(delta) * self.scale(dtype)).astype(dtype, copy=False)

    def state_dict(self) -> dict:
        return {
            "mean_abs": self.mean_abs.copy(),
            "count": np.int64(self.count),
            "min_diff": np.float64(self.min_diff),
        }

    @classmethod
    def from_state_dict(cls, d: dict) -> DiffNormalizer:
        return cls(np.array(d["mean_abs"], np.float64), int(d["count"]), float(d["min_diff"]))
