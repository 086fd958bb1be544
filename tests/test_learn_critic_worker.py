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


def _disc_problem(seed=0):
    from bcg.learn.discriminator import DiscriminatorConfig, discriminator_init, discriminator_plan

    rng = np.random.default_rng(seed)
    disc = discriminator_init(DiscriminatorConfig(hidden=(32, 16), batch_size=16), 9, rng)
    plan = discriminator_plan(disc, rng.standard_normal((40, 9)), np.random.default_rng(seed + 1))
    return disc, plan


def test_worker_discriminator_steps_equal_those_in_process(worker):
    from bcg.learn.discriminator import discriminator_sgd

    disc, plan = _disc_problem()
    here = copy.deepcopy(disc)
    worker.submit_disc(disc, plan.batches)
    info = worker.result_disc(disc)
    info_here = discriminator_sgd(here.cfg, here.spec, here.params, here.optimizer, plan.batches)
    assert info == pytest.approx(info_here, rel=1e-5) and info["steps"] == len(plan.batches) == 10
    for key in disc.params:
        np.testing.assert_allclose(disc.params[key], here.params[key], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            disc.optimizer.momentum_buffer[key], here.optimizer.momentum_buffer[key], rtol=1e-5, atol=1e-6
        )
    assert not np.array_equal(disc.params["w0"], _disc_problem()[0].params["w0"])  # it moved


def test_results_are_taken_in_any_order_and_dropped_ones_leave_the_networks_alone(worker):
    """The learner sends the discriminator's steps and the critic fit together, takes the first after
    the reverse pass and the second after the next rollout; it may take them in either order."""
    disc, plan = _disc_problem(1)
    critic, obs, targets = _problem(5)
    batches = fit_minibatches(critic.cfg, len(targets), np.random.default_rng(0))
    worker.submit_disc(disc, plan.batches)
    worker.submit(critic, obs, targets, 1e-3, batches)
    assert worker.pending_kind("disc") == 1 and worker.pending_kind("critic") == 1
    before = copy.deepcopy(disc.params)
    assert np.isfinite(worker.result(critic)["loss_last"])  # the critic's, received after the other
    assert worker.pending_kind("disc") == 1 and worker.pending_kind("critic") == 0
    worker.result_disc(None)
    assert all(np.array_equal(disc.params[k], before[k]) for k in before)
    assert not worker.pending
    with pytest.raises(CriticWorkerError, match="no disc update is running"):
        worker.result_disc(disc)
    worker.submit_disc(disc, plan.batches)
    worker.submit(critic, obs, targets, 1e-3, batches)
    worker.drop_all()
    assert not worker.pending
    assert all(np.array_equal(disc.params[k], before[k]) for k in before)


def test_a_planned_discriminator_update_is_the_update():
    """Plan (draws, normaliser, replay rows as after the push), apply, SGD = the update in one go,
    bit for bit, also once the replay buffer is full and wraps."""
    from bcg.learn.discriminator import (
        DiscriminatorConfig,
        discriminator_apply,
        discriminator_init,
        discriminator_plan,
        discriminator_sgd,
        discriminator_update,
    )

    cfg = DiscriminatorConfig(hidden=(16, 8), replay_size=50, replay_push=7, batch_size=16)
    a = discriminator_init(cfg, 5, np.random.default_rng(0))
    b = copy.deepcopy(a)
    ra, rb = np.random.default_rng(3), np.random.default_rng(3)
    for i in range(5):
        delta = np.random.default_rng(10 + i).standard_normal((13, 5))
        sampled = []
        plan = discriminator_plan(b, delta, rb)
        # the replay half of every batch holds rows the buffer holds after the push
        discriminator_apply(b, plan)
        stored = {tuple(r) for r in b.replay.data[: b.replay.size] * b.normalizer.scale()}
        for batch in plan.batches:
            sampled += [tuple(r) for r in batch[len(batch) // 2 :]]
        assert all(r in stored for r in sampled)
        info_b = discriminator_sgd(b.cfg, b.spec, b.params, b.optimizer, plan.batches)
        assert discriminator_update(a, delta, ra) == info_b
    assert a.replay.size == 50 and a.replay.head != 0  # the buffer wrapped
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]), key
    assert np.array_equal(a.replay.data, b.replay.data) and a.replay.head == b.replay.head
    assert ra.integers(1 << 30) == rb.integers(1 << 30)


def test_jobs_larger_than_a_pipe_buffer_do_not_block_each_other():
    """The learner sends the critic job (megabytes of observations) while the discriminator's
    result (megabytes of weights) waits in the reply pipe: the child must keep taking requests."""
    import threading

    from bcg.learn.discriminator import DiscriminatorConfig, discriminator_init, discriminator_plan

    rng = np.random.default_rng(0)
    disc = discriminator_init(DiscriminatorConfig(hidden=(512, 256), batch_size=256), 300, rng)
    plan = discriminator_plan(disc, rng.standard_normal((512, 300)), rng)
    critic = critic_init(CriticConfig(hidden=(64, 64), iterations=1, minibatches=2), 800, rng)
    obs = rng.standard_normal((2048, 800)).astype(np.float32)  # 6.5 MB
    targets = obs[:, 0].copy()
    w = CriticWorker()
    done = []

    def learner():
        w.submit_disc(disc, plan.batches)
        w.submit(critic, obs, targets, 1e-3, fit_minibatches(critic.cfg, len(targets), rng))
        done.append(w.result_disc(disc)["steps"])
        done.append(w.result(critic)["loss_last"])

    t = threading.Thread(target=learner, daemon=True)
    t.start()
    t.join(60)
    try:
        assert not t.is_alive(), "the learner and its worker blocked each other"
        assert done[0] == 8 and np.isfinite(done[1])
    finally:
        w._proc.kill()
        w.close()
