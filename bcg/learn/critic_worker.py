"""The critic fit in a process of its own, so that it runs while the reverse pass does.

On a CPU the simulator's reverse pass runs on one core (Taichi's CPU backend gives a loop over the
environments one task, and a kernel holds Python's GIL while it runs, so no thread can run beside
it), while the critic fit is numpy matrix products. The fit of an iteration depends only on that
iteration's rollout (observations and TD(λ) targets, both known before the reverse pass) and on the
critic's members and optimisers, which the reverse pass does not read (the actor's bootstrap uses
the target copies, which the Polyak step updates after both). So :class:`CriticWorker` sends the
members, their optimiser states, the observations, targets, learning rate and the minibatches'
indices (drawn beforehand from the learner's generator, in the order an in-process fit draws them)
to a child process, the reverse pass runs, and the fitted members come back before the Polyak step.
The child runs :func:`bcg.learn.critic.critic_fit` itself, with a BLAS thread per core but one (the
reverse pass keeps that one); a fit computes the same arithmetic as in the learner's process, up to the
order in which a multi-threaded BLAS sums (float32 round-off).

A fit whose reverse pass the NaN guard rejects is received and dropped: the critic stays as it was.
A child that fails sends its traceback, which :meth:`CriticWorker.result` raises; a child that
exits raises too. The child exits when its pipe from the learner closes (the learner's exit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
import weakref
from multiprocessing.connection import Connection

import numpy as np

from bcg.learn.adam import AdamState
from bcg.learn.critic import Critic, CriticConfig, critic_fit
from bcg.learn.mlp import MLPSpec


class CriticWorkerError(RuntimeError):
    """The critic worker failed or exited."""


def _serve(conn_in, conn_out) -> None:
    """The child's loop: one fit per request until ``None`` or the pipe closes."""
    while True:
        try:
            msg = conn_in.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            cfg, spec, members, optimizers, obs, targets, lr, batches = msg
            critic = Critic(cfg, spec, members, [], [AdamState.from_state_dict(o) for o in optimizers])
            info = critic_fit(critic, obs, targets, lr, batches=batches)
            conn_out.send(("ok", critic.members, [o.state_dict() for o in critic.optimizers], info))
        except Exception:  # noqa: BLE001 - the learner raises it with the child's traceback
            conn_out.send(("error", traceback.format_exc()))


def _shutdown(conn_out, conn_in, proc) -> None:
    try:
        conn_out.send(None)
    except (OSError, ValueError):
        pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    conn_out.close()
    conn_in.close()


class CriticWorker:
    """A child process that fits a :class:`~bcg.learn.critic.Critic`, one request at a time."""

    def __init__(self):
        # a plain child interpreter (not multiprocessing's spawn, which would import the learner's
        # __main__ module, Taichi with it): requests on its stdin, replies on a pipe of its own
        reply_r, reply_w = os.pipe()
        # BLAS threads (read by numpy at import): every core but the one the reverse pass runs on,
        # at most 8 as in training; one on this project's 2-core machine
        threads = max(1, min((os.cpu_count() or 1) - 1, 8))
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bcg.learn.critic_worker", str(reply_w)],
            stdin=subprocess.PIPE,
            pass_fds=(reply_w,),
            env=env,
            start_new_session=True,  # Ctrl-C at the terminal stops the learner, which stops this
        )
        os.close(reply_w)
        self._out = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._proc.stdin.close()
        self._in = Connection(reply_r, writable=False)
        self._pending = False
        self._finalizer = weakref.finalize(self, _shutdown, self._out, self._in, self._proc)

    @property
    def pending(self) -> bool:
        return self._pending

    def submit(
        self,
        critic: Critic,
        obs: np.ndarray,
        targets: np.ndarray,
        lr: float,
        batches: list[list[np.ndarray]],
    ) -> None:
        """Start fitting a copy of ``critic``'s members (``critic`` itself is not touched)."""
        if self._pending:  # an iteration that stopped before taking its fit (an exception)
            self.result(None)
        self._check_alive()
        cfg: CriticConfig = critic.cfg
        spec: MLPSpec = critic.spec
        msg = (
            cfg,
            spec,
            critic.members,
            [o.state_dict() for o in critic.optimizers],
            np.ascontiguousarray(obs),
            np.ascontiguousarray(targets),
            float(lr),
            batches,
        )
        try:
            self._out.send(msg)
        except (OSError, ValueError) as exc:
            raise CriticWorkerError(f"could not send the critic fit to its worker process: {exc}") from exc
        self._pending = True

    def result(self, critic: Critic | None) -> dict[str, float]:
        """Wait for the running fit; install it into ``critic`` (``None`` drops it). Returns the
        fit's diagnostics (:func:`~bcg.learn.critic.critic_fit`)."""
        if not self._pending:
            raise CriticWorkerError("no critic fit is running")
        self._pending = False
        try:
            reply = self._in.recv()
        except (EOFError, OSError) as exc:
            code = self._proc.poll()
            raise CriticWorkerError(
                f"the critic worker process exited (exit code {code}) before returning its fit"
            ) from exc
        if reply[0] != "ok":
            raise CriticWorkerError("the critic fit failed in its worker process:\n" + reply[1])
        _, members, optimizers, info = reply
        if critic is not None:
            critic.members = members
            critic.optimizers = [AdamState.from_state_dict(o) for o in optimizers]
        return info

    def _check_alive(self) -> None:
        code = self._proc.poll()
        if code is not None:
            raise CriticWorkerError(f"the critic worker process has exited (exit code {code})")

    def close(self) -> None:
        """Stop the child (also done when the worker is garbage-collected or at exit)."""
        self._finalizer()


def main(argv=None) -> int:
    """The child: ``python -m bcg.learn.critic_worker REPLY_FD`` (started by :class:`CriticWorker`)."""
    argv = sys.argv[1:] if argv is None else argv
    reply_fd = int(argv[0])
    # the learner's Ctrl-C finishes its iteration (and takes this fit) before it stops: the child
    # ignores the signal and exits when the learner closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # stdout stays free for prints: replies go to their own pipe
    _serve(Connection(os.dup(0), writable=False), Connection(reply_fd, readable=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
