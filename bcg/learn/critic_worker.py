"""The critic fit and the discriminator's SGD steps in a process of their own, beside the simulator.

On a CPU the learner's simulator runs on one core (Taichi's CPU backend gives a loop over the
environments one task, training keeps ``SimConfig.cpu_threads=1``, and a kernel holds Python's GIL
while it runs, so no thread can run beside it), while the
critic fit and the discriminator's update are numpy matrix products. Neither depends on the reverse
pass:

- the critic fit of an iteration needs that iteration's observations and TD(λ) targets (known before
  the reverse pass) and the members and their optimisers, which nothing reads until the next
  iteration's bootstrap values (the target copies, which the Polyak step updates after the fit), so
  its result is taken after the next rollout;
- the discriminator's update needs the window's differentials and the draws of its minibatches
  (made beforehand, :func:`bcg.learn.discriminator.discriminator_plan`); the reverse pass reads the
  frozen weights the rollout used, and the next rollout the updated ones, so its result is taken
  after the reverse pass.

:class:`CriticWorker` sends each job's inputs (networks, optimiser states, data, and the random
draws made in the learner's process, in the order an in-process update makes them) to a child
process, which runs them in the order sent; the results come back when the learner asks for them.
The child runs :func:`bcg.learn.critic.critic_fit` and :func:`bcg.learn.discriminator.discriminator_sgd`
themselves, with a BLAS thread per core but one (the simulator keeps that one); an update computes
the same arithmetic as in the learner's process, up to the order in which a multi-threaded BLAS sums
(float32 round-off).

A job whose iteration the NaN guard rejects is received and dropped. A child that fails sends its
traceback, which the learner raises; a child that exits raises too. The child exits when its pipe from
the learner closes (the learner's exit).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
import weakref
from collections import deque
from multiprocessing.connection import Connection

import numpy as np

from bcg.learn.adam import AdamState, SGDState
from bcg.learn.critic import Critic, CriticConfig, critic_fit
from bcg.learn.discriminator import Discriminator, discriminator_sgd
from bcg.learn.mlp import MLPSpec


class CriticWorkerError(RuntimeError):
    """The worker failed or exited."""


def _critic_job(cfg, spec, members, optimizers, obs, targets, lr, batches):
    critic = Critic(cfg, spec, members, [], [AdamState.from_state_dict(o) for o in optimizers])
    info = critic_fit(critic, obs, targets, lr, batches=batches)
    return critic.members, [o.state_dict() for o in critic.optimizers], info


def _disc_job(cfg, spec, params, optimizer, batches):
    opt = SGDState.from_state_dict(optimizer)
    info = discriminator_sgd(cfg, spec, params, opt, batches)
    return params, opt.state_dict(), info


_JOBS = {"critic": _critic_job, "disc": _disc_job}


def _serve(conn_in, conn_out) -> None:
    """The child's loop: one job per request until ``None`` or the pipe closes.

    Threads receive the requests and send the replies as they come: the learner sends its next job
    while this one's result waits for it to be taken (the discriminator's until the reverse pass
    ends), and neither the learner nor the next job may wait for that."""
    requests: queue.SimpleQueue = queue.SimpleQueue()
    replies: queue.SimpleQueue = queue.SimpleQueue()

    def receive():
        while True:
            try:
                msg = conn_in.recv()
            except (EOFError, OSError):
                msg = None
            requests.put(msg)
            if msg is None:
                return

    def send():
        while (reply := replies.get()) is not None:
            try:
                conn_out.send(reply)
            except (OSError, ValueError):
                return

    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    while (msg := requests.get()) is not None:
        kind, args = msg
        try:
            replies.put((kind, "ok", _JOBS[kind](*args)))
        except Exception:  # noqa: BLE001 - the learner raises it with the child's traceback
            replies.put((kind, "error", traceback.format_exc()))
    replies.put(None)
    sender.join(timeout=5)


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
    """A child process that fits a :class:`~bcg.learn.critic.Critic` and steps a
    :class:`~bcg.learn.discriminator.Discriminator`, its jobs run in the order submitted."""

    def __init__(self):
        # a plain child interpreter (not multiprocessing's spawn, which would import the learner's
        # __main__ module, Taichi with it): requests on its stdin, replies on a pipe of its own
        reply_r, reply_w = os.pipe()
        # BLAS threads (read by numpy at import): every core but the one the simulator runs on,
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
        self._queue: deque[str] = deque()  # kinds of the jobs sent and not yet received
        self._ready: dict[str, deque] = {kind: deque() for kind in _JOBS}  # received, not taken
        self._finalizer = weakref.finalize(self, _shutdown, self._out, self._in, self._proc)

    @property
    def pending(self) -> bool:
        """Some job's result has not been taken."""
        return bool(self._queue) or any(self._ready.values())

    def pending_kind(self, kind: str) -> int:
        """How many ``kind`` jobs ("critic", "disc") have results not taken yet."""
        return sum(k == kind for k in self._queue) + len(self._ready[kind])

    def _send(self, kind: str, args: tuple) -> None:
        self._check_alive()
        try:
            self._out.send((kind, args))
        except (OSError, ValueError) as exc:
            raise CriticWorkerError(f"could not send the {kind} update to its worker process: {exc}") from exc
        self._queue.append(kind)

    def _take(self, kind: str):
        """The oldest ``kind`` result: received in order, others kept for their turn."""
        if not self.pending_kind(kind):
            raise CriticWorkerError(f"no {kind} update is running")
        while not self._ready[kind]:
            try:
                got, status, payload = self._in.recv()
            except (EOFError, OSError) as exc:
                code = self._proc.poll()
                self._queue.clear()
                raise CriticWorkerError(
                    f"the worker process exited (exit code {code}) before returning its result"
                ) from exc
            expected = self._queue.popleft()
            if got != expected:
                raise CriticWorkerError(f"the worker returned a {got} result for a {expected} job")
            self._ready[got].append((status, payload))
        status, payload = self._ready[kind].popleft()
        if status != "ok":
            raise CriticWorkerError(f"the {kind} update failed in its worker process:\n" + payload)
        return payload

    def submit(
        self,
        critic: Critic,
        obs: np.ndarray,
        targets: np.ndarray,
        lr: float,
        batches: list[list[np.ndarray]],
    ) -> None:
        """Start fitting a copy of ``critic``'s members (``critic`` itself is not touched)."""
        cfg: CriticConfig = critic.cfg
        spec: MLPSpec = critic.spec
        args = (
            cfg,
            spec,
            critic.members,
            [o.state_dict() for o in critic.optimizers],
            np.ascontiguousarray(obs),
            np.ascontiguousarray(targets),
            float(lr),
            batches,
        )
        self._send("critic", args)

    def result(self, critic: Critic | None) -> dict[str, float]:
        """Wait for the oldest critic fit; install it into ``critic`` (``None`` drops it). Returns
        the fit's diagnostics (:func:`~bcg.learn.critic.critic_fit`)."""
        members, optimizers, info = self._take("critic")
        if critic is not None:
            critic.members = members
            critic.optimizers = [AdamState.from_state_dict(o) for o in optimizers]
        return info

    def submit_disc(self, disc: Discriminator, batches: list[np.ndarray]) -> None:
        """Start the SGD steps of a :class:`~bcg.learn.discriminator.DiscriminatorPlan`'s
        ``batches`` on a copy of ``disc``'s weights and optimiser (``disc`` is not touched)."""
        self._send("disc", (disc.cfg, disc.spec, disc.params, disc.optimizer.state_dict(), batches))

    def result_disc(self, disc: Discriminator | None) -> dict[str, float]:
        """Wait for the oldest discriminator update; install it into ``disc`` (``None`` drops it).
        Returns its diagnostics (:func:`~bcg.learn.discriminator.discriminator_sgd`)."""
        params, optimizer, info = self._take("disc")
        if disc is not None:
            disc.params = params
            disc.optimizer = SGDState.from_state_dict(optimizer)
        return info

    def drop_all(self) -> None:
        """Receive and drop every result not taken yet (a learner that loads a checkpoint)."""
        for kind in _JOBS:
            while self.pending_kind(kind):
                try:
                    self._take(kind)
                except CriticWorkerError:
                    if self._proc.poll() is not None:
                        raise

    def _check_alive(self) -> None:
        code = self._proc.poll()
        if code is not None:
            raise CriticWorkerError(f"the worker process has exited (exit code {code})")

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
