"""Start phases of the episodes: the uniform draw and the failure-weighted one (bcg.learn.start_phases)."""

import numpy as np
import pytest

from bcg.core import g1
from bcg.learn.start_phases import FailurePhases
from bcg.motion import MotionClip


@pytest.fixture(scope="module")
def clip():
    return MotionClip.load("run")


def test_without_failures_or_mix_the_draw_is_the_uniform_one(clip):
    expected = clip.random_phase(np.random.default_rng(5), 64)
    # mix 0 with failures on record, and mix 1 with none: both the same numbers as the plain draw
    zero_mix = FailurePhases(clip, mix=0.0)
    zero_mix.record(np.array([3.0, 3.1]))
    np.testing.assert_array_equal(zero_mix.sample(np.random.default_rng(5), 64), expected)
    np.testing.assert_array_equal(FailurePhases(clip, mix=1.0).sample(np.random.default_rng(5), 64), expected)


def test_failure_starts_lie_within_the_lead_before_the_failures(clip):
    sampler = FailurePhases(clip, mix=1.0, lead=1.0, bin_width=0.25)
    sampler.record(np.array([10.1, 10.2, np.nan]))  # a non-finite time is not counted
    assert sampler.counts.sum() == 2.0 and sampler.counts[40] == 2.0
    t0 = sampler.sample(np.random.default_rng(0), 2000)
    assert t0.min() >= 9.0 and t0.max() <= 10.25
    assert t0.max() - t0.min() > 1.1  # spread over the whole lead and bin, not one point


def test_the_mix_sets_the_share_of_failure_starts(clip):
    sampler = FailurePhases(clip, mix=0.3, lead=0.5, bin_width=0.25)
    sampler.record(np.array([4.0]))
    t0 = sampler.sample(np.random.default_rng(1), 20000)
    window = (t0 >= 3.5) & (t0 <= 4.25)
    uniform_share = 0.75 / (clip.duration - 3 * g1.CONTROL_DT)
    expected = 0.3 + 0.7 * uniform_share
    assert abs(window.mean() - expected) < 0.02


def test_the_clip_begin_mix_starts_that_share_at_the_first_frame(clip):
    sampler = FailurePhases(clip, mix=0.5, lead=0.5, begin_mix=0.2)
    sampler.record(np.array([8.0]))
    t0 = sampler.sample(np.random.default_rng(3), 20000)
    # uniform starts land exactly on 0 with probability zero, so the zeros are the begin share
    assert abs(np.mean(t0 == 0.0) - 0.2) < 0.01
    failure = (t0 >= 7.5) & (t0 <= 8.25)
    uniform_share = 0.75 / (clip.duration - 3 * g1.CONTROL_DT)
    assert abs(failure.mean() - 0.8 * (0.5 + 0.5 * uniform_share)) < 0.02
    # the begin share is drawn after the rest: with it at 0 the numbers are those of the plain draw
    expected = clip.random_phase(np.random.default_rng(4), 64)
    np.testing.assert_array_equal(
        FailurePhases(clip, mix=0.0, begin_mix=0.0).sample(np.random.default_rng(4), 64), expected
    )
    assert np.all(FailurePhases(clip, mix=0.0, begin_mix=1.0).sample(np.random.default_rng(4), 64) == 0.0)


def test_starts_stay_within_the_clip(clip):
    sampler = FailurePhases(clip, mix=1.0, lead=0.0, bin_width=0.25)
    sampler.record(np.array([clip.duration - 0.01, 0.0]))
    t0 = sampler.sample(np.random.default_rng(2), 5000)
    assert t0.min() >= 0.0 and t0.max() <= clip.duration - 3 * g1.CONTROL_DT


def test_the_histogram_decays_and_round_trips(clip):
    sampler = FailurePhases(clip, mix=0.5, memory=0.9)
    sampler.record(np.array([1.0, 1.0, 7.3]))
    sampler.decay()
    np.testing.assert_allclose(sampler.counts.sum(), 2.7)
    other = FailurePhases(clip, mix=0.5, memory=0.9)
    other.load_state_dict(sampler.state_dict())
    np.testing.assert_array_equal(other.counts, sampler.counts)
    with pytest.raises(ValueError, match="failure histogram"):
        FailurePhases(clip, mix=0.5, bin_width=0.5).load_state_dict(sampler.state_dict())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mix": 1.5}, "mix"),
        ({"mix": 0.5, "lead": -1.0}, "lead"),
        ({"mix": 0.5, "memory": 1.0}, "memory"),
        ({"mix": 0.5, "bin_width": 0.0}, "bin width"),
        ({"mix": 0.5, "begin_mix": -0.1}, "clip-start mix"),
    ],
)
def test_bad_settings_are_refused(clip, kwargs, match):
    with pytest.raises(ValueError, match=match):
        FailurePhases(clip, **kwargs)
