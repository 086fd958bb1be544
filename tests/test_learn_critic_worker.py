"""The critic fit in a worker process: the same fit as in the learner's process, errors surfaced,
a dropped fit leaves the critic as it was."""

import copy
import os
import signal
import time

import numpy as np
import pytest

from bcg.learn.critic import CriticConfig, critic_fit, critic_init, fit_minibatches
from bcg.learn.critic_worker import CriticWorker, CriticWorkerError


def _problem(seed=0, n=96, obs_dim=12):
    rng = np.random.default_rng(seed)
    critic = critic_init(CriticConfig(hidden=(16, 16), iterations=3, minibatches=2), obs_dim, rng)
    obs = rng.standard_normal((n, obs_dim)).astype(np.float32)
    targets = (obs[:, 0] - 0.5 * obs[:, 1]).astype(np.float32)
    return critic, obs, targets


@pytest.fixture(scope="module")
def worker():
    w = CriticWorker()
    yield w
    w.close()


def test_worker_fit_equals_the_fit_in_process(worker):
    critic, obs, targets = _problem()
    here = copy.deepcopy(critic)
    batches = fit_minibatches(critic.cfg, len(targets), np.random.default_rng(7))
    worker.submit(critic, obs, targets, 1e-3, batches)
    info = worker.result(critic)
    info_here = critic_fit(here, obs, targets, 1e-3, batches=batches)
    assert info == pytest.approx(info_here, rel=1e-5)
    for a, b in zip(critic.members, here.members, strict=True):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert critic.optimizers[0].step == here.optimizers[0].step == 6
    assert not np.array_equal(critic.members[0]["w0"], _problem()[0].members[0]["w0"])  # it moved


def test_drawn_minibatches_are_the_ones_critic_fit_draws():
    critic, obs, targets = _problem()
    other = copy.deepcopy(critic)
    critic_fit(critic, obs, targets, 1e-3, rng=np.random.default_rng(3))
    critic_fit(
        other, obs, targets, 1e-3, batches=fit_minibatches(other.cfg, len(targets), np.random.default_rng(3))
    )
    for a, b in zip(critic.members, other.members, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_a_dropped_fit_leaves_the_critic_unchanged(worker):
    critic, obs, targets = _problem(1)
    before = copy.deepcopy(critic.members)
    worker.submit(
        critic, obs, targets, 1e-3, fit_minibatches(critic.cfg, len(targets), np.random.default_rng(0))
    )
    worker.result(None)
    for a, b in zip(critic.members, before, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert critic.optimizers[0].step == 0


def test_a_failing_fit_raises_with_the_worker_traceback_and_the_worker_goes_on(worker):
    critic, obs, targets = _problem(2)
    bad = [[np.array([0, 10_000])]]  # an index past the samples
    worker.submit(critic, obs, targets, 1e-3, bad)
    with pytest.raises(CriticWorkerError, match="IndexError"):
        worker.result(critic)
    worker.submit(
        critic, obs, targets, 1e-3, fit_minibatches(critic.cfg, len(targets), np.random.default_rng(0))
    )
    assert np.isfinite(worker.result(critic)["loss_last"])


def test_a_worker_that_exited_is_reported():
    critic, obs, targets = _problem(3)
    w = CriticWorker()
    try:
        w._proc.kill()
        w._proc.wait()
        with pytest.raises(CriticWorkerError, match="exited"):
            w.submit(
                critic,
                obs,
                targets,
                1e-3,
                fit_minibatches(critic.cfg, len(targets), np.random.default_rng(0)),
            )
    finally:
        w.close()


def test_ctrl_c_leaves_the_worker_running(worker):
    """Ctrl-C makes training finish its iteration, which takes the fit: the worker must not die."""
    critic, obs, targets = _problem(4)
    os.kill(worker._proc.pid, signal.SIGINT)
    time.sleep(0.2)
    assert worker._proc.poll() is None
    worker.submit(
        critic, obs, targets, 1e-3, fit_minibatches(critic.cfg, len(targets), np.random.default_rng(0))
    )
    assert np.isfinite(worker.result(critic)["loss_last"])
