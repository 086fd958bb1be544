"""The environment interface the learners rely on, as typed protocols.

:class:`bcg.learn.env.G1TrackingEnv` is the real environment; the tests drive the learners with small
ones (a point mass) that provide the same methods. This module stays free of Taichi, so that the
learners' pure parts import quickly.

A window of ``horizon`` control steps: :meth:`Env.begin_window` observes s_0, :meth:`Env.step` is
called ``horizon`` times, :meth:`Env.end_window` keeps the final state for the next window. Episodes
reset at window starts only; an env whose episode ended inside a window reports ``alive`` False for
its later steps. SHAC's reverse pass (:func:`bcg.learn.window.window_backward`) then asks a
:class:`DifferentiableEnv` for the VJPs of its observations, rewards and controls, one control step at
a time from the last, while the simulator (:class:`WindowSimulator`) reverses its steps.

Optional members, read with ``getattr`` and a default where a learner uses them:

- ``wants_mean_actions: bool``: :meth:`Env.step` takes ``mean_actions=`` μ_θ(o_k) (N, A) for the
  action-rate term (default False).
- ``rate_on_mean: bool``: this window's action-rate term read the mean actions, so the reverse pass
  returns its gradient with respect to them (default False).
- ``action_rate_weight: float``: the action-rate term's weight now, which SHAC ramps in.
- ``finished: list[(length, return, fell[, lost_track])]``: the episodes ended since the learner last read
  them (``lost_track``, optional: ended by the pose termination alone, ``env.pose_termination_dist``)
  (the learner empties it).
- ``bundle_trigger_rate() -> float``: fraction of env-steps that opened a bundle in the window.
- ``has_contact: bool``: the simulator simulates contact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class StepResult:
    """What one control step returns (arrays over envs).

    Attributes:
        obs: actor observation o_k+1 (N, D), noisy when enabled.
        obs_critic: the same without noise (N, D).
        reward: r_k (N,).
        terminated: (N,) bool, the episode ended early at this step (fall, non-finite state).
        truncated: (N,) bool, the episode ran out of reference frames at this step (timeout).
        info: per-env diagnostics: ``tracking_error`` m (N,), ``delta`` (N, 305), ``nonfinite`` (N,),
            ``alive`` (N,) (the episode had not ended before this step), ``qpos``, ``qvel`` after it,
            ``episode_step`` (N,) steps of the current episode including this one.
    """

    obs: np.ndarray
    obs_critic: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict = field(default_factory=dict)


class WindowSimulator(Protocol):
    """What the learners read of the environment's simulator (:class:`bcg.sim.Simulator`)."""

    qpos_now: np.ndarray  # (N, nq) the state after the last step
    qvel_now: np.ndarray  # (N, nv)

    def backward_begin(self) -> None: ...

    def backward_step(self) -> int:
        """Reverse the last control step not yet reversed; returns its index."""
        ...

    def backward_end(self) -> object: ...

    def state_grad(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """dL/d(qpos_k (N, nq), qvel_k (N, nv)) accumulated so far at boundary k."""
        ...

    def add_state_grad(self, k: int, g_qpos: np.ndarray, g_qvel: np.ndarray) -> None: ...

    def zero_state_grad(self, k: int, envs: np.ndarray) -> None: ...

    def ctrl_grad(self, k: int) -> np.ndarray:
        """dL/dctrl_k (N, A) of the control step just reversed."""
        ...


class Env(Protocol):
    """A batch of ``num_envs`` environments run in windows of ``horizon`` control steps (PPO's
    interface, forward only)."""

    num_envs: int
    horizon: int
    obs_dim: int
    act_dim: int
    sim: WindowSimulator

    def begin_window(self) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs that need it and observe s_0: (actor obs (N, D), critic obs (N, D))."""
        ...

    def step(self, actions: np.ndarray) -> StepResult:
        """Advance every env one control step with actions a_k (N, A)."""
        ...

    def end_window(self) -> None:
        """Keep the window's final state as the next window's start."""
        ...

    def request_reset(self, mask: np.ndarray) -> None:
        """Reset these envs (N,) bool at the next window start."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, d: dict) -> None: ...


class DifferentiableEnv(Env, Protocol):
    """An :class:`Env` with the reverse pass of its window (SHAC's interface)."""

    def state_vjp(
        self, k: int, g_obs: np.ndarray | None, g_reward: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """dL/d(qpos_k, qvel_k) from dL/do_k (N, D) raw and dL/dr_{k-1} (N,) (either None for none),
        and {j: dL/da_j (N, A)} of the reward's action terms."""
        ...

    def ctrl_vjp(self, k: int, g_ctrl: np.ndarray) -> dict[int, np.ndarray]:
        """{j: dL/da_j (N, A)} from dL/dctrl_k (N, A)."""
        ...
