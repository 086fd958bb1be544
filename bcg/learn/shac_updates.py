"""Where SHAC's critic fit and discriminator steps run: in the update worker beside the reverse pass, or
in the learner's process.

With ``TrainConfig.critic_worker`` the fit and the steps are sent to a child process
(:mod:`bcg.learn.critic_worker`) before the reverse pass, and this process's BLAS runs on one thread
during the iteration: the worker's takes every core but the simulator's, and this process's own
products (the actor's, batch num_envs) on more threads would wait for a core the worker holds
(measured: the actor's reverse pass 3x slower). Either way the numbers are those of updates made
in this process, up to float32 round-off.

The critic fit of an iteration is taken after the next iteration's rollout (or by a checkpoint),
the discriminator's steps after the reverse pass. If the worker fails (it exited, or a job raised),
:class:`ShacUpdates` logs it, stops it and runs the update here from the inputs it kept (a job that
raised raises again here, with its own traceback), and so do later iterations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

from bcg.learn.critic import Critic, critic_fit, critic_update_target
from bcg.learn.critic_worker import CriticWorker, CriticWorkerError
from bcg.learn.discriminator import Discriminator, DiscriminatorPlan, discriminator_sgd


class ShacUpdates:
    """The pending critic fit and discriminator steps of a learner, and the worker that runs them.

    Args:
        use_worker: run the updates in a worker process (started with the first update).
        log: ``log(message)``, for a worker that failed.

    Attributes:
        worker: the worker process, or None (not started yet, not used, or lost).
        critic_job: the last iteration's critic fit, not taken yet: (where, keep, critic_fit's
            arguments), where "worker" or "here" and keep False for an iteration that was skipped;
            None when there is none.
        critic_info: the diagnostics of the last fit taken, not yet reported in a log row.
    """

    def __init__(self, use_worker: bool, log=print):
        self.enabled = use_worker
        self.log = log
        self.worker: CriticWorker | None = None
        self.lost = False  # the worker failed: the updates run in this process from then on
        self.critic_job: tuple | None = None
        self.critic_info: dict[str, float] = {}
        self._disc_sent = False  # this iteration's discriminator steps run in the worker
        self._blas: ThreadpoolController | None = None

    @property
    def use_worker(self) -> bool:
        return self.enabled and not self.lost

    def threads(self) -> contextlib.AbstractContextManager:
        """The context an iteration runs in: this process's BLAS on one thread while the worker is
        used (see the module docstring)."""
        if not self.use_worker:
            return contextlib.nullcontext()
        if self._blas is None:
            self._blas = ThreadpoolController()
        return self._blas.limit(limits=1, user_api="blas")

    def _call(self, call: Callable[[CriticWorker], object]) -> object | None:
        """``call(worker)``; None when there is no worker or it failed (then it is logged and
        stopped, and the caller runs the update here)."""
        if self.worker is None:
            return None
        try:
            return call(self.worker)
        except CriticWorkerError as exc:
            self.log(f"the update worker failed, updates run in this process from now on: {exc}")
            self.worker.close()
            self.worker, self.lost = None, True
            return None

    def start_worker(self) -> None:
        """Start the worker when it is used and not running (the first update)."""
        if self.use_worker and self.worker is None:
            self.worker = CriticWorker()

    def submit_disc(self, disc: Discriminator, plan: DiscriminatorPlan) -> None:
        """Start the discriminator's SGD steps of ``plan`` in the worker, when it is used."""
        self._disc_sent = False
        if self.use_worker:
            self._disc_sent = bool(self._call(lambda wk: wk.submit_disc(disc, plan.batches) or True))

    def finish_disc(self, disc: Discriminator, plan: DiscriminatorPlan) -> dict[str, float]:
        """Install the discriminator's steps of ``plan`` (taken from the worker, or made here);
        returns their diagnostics."""
        info = self._call(lambda wk: wk.result_disc(disc)) if self._disc_sent else None
        self._disc_sent = False
        if info is None:
            info = discriminator_sgd(disc.cfg, disc.spec, disc.params, disc.optimizer, plan.batches)
        return info

    def submit_critic_fit(
        self, critic: Critic, obs: np.ndarray, targets: np.ndarray, lr: float, batches: list
    ) -> None:
        """Start the critic fit on ``obs`` (M, D) and ``targets`` (M,) in the worker when it is used;
        either way it is taken by :meth:`take_critic_fit`."""
        sent = self.use_worker and self._call(lambda wk: wk.submit(critic, obs, targets, lr, batches) or True)
        self.critic_job = ("worker" if sent else "here", True, (obs, targets, lr, None, batches))

    def drop(self) -> None:
        """An iteration skipped after its updates were started: its discriminator steps and
        critic fit are dropped."""
        if self._disc_sent:
            self._call(lambda wk: wk.result_disc(None))
            self._disc_sent = False
        self.critic_job = (self.critic_job[0], False, None)

    def take_critic_fit(self, critic: Critic) -> dict[str, float]:
        """Install the last iteration's critic fit into ``critic`` and make the Polyak step (waits
        for the worker). Returns the fit's diagnostics ({} when there was none or it was dropped)."""
        job, self.critic_job = self.critic_job, None
        if job is None:
            return {}
        where, keep, args = job
        if not keep:  # its iteration was skipped
            if where == "worker":
                self._call(lambda w: w.result(None))
            return {}
        info = self._call(lambda w: w.result(critic)) if where == "worker" else None
        if info is None:
            info = critic_fit(critic, *args)
        critic_update_target(critic)
        self.critic_info = info
        return info

    def pop_critic_info(self) -> dict[str, float]:
        """The diagnostics of the last fit taken, once: the next log row reports them."""
        info, self.critic_info = self.critic_info, {}
        return info

    def forget(self) -> None:
        """Drop every pending update (a learner that loads a checkpoint)."""
        self.critic_job, self.critic_info = None, {}
        self._disc_sent = False
        self._call(lambda w: w.drop_all())
