"""The shipped policies through the robot client's supervisor and driver against the MuJoCo emulator,
tick by tick in simulated time (bcg.studies.client_lockstep): the path a policy takes on the robot,
short of DDS and the wall clock."""

from pathlib import Path

import pytest

from bcg.robot.run import load_checked
from bcg.studies import client_lockstep

POLICIES = Path(__file__).resolve().parents[1] / "policies"


@pytest.mark.parametrize("motion", ["run", "jump", "fight", "dance"])
def test_a_shipped_policy_plays_its_whole_clip_through_the_client(motion):
    policy, clip = load_checked(str(POLICIES / f"{motion}_k300.h5"))
    outcome = client_lockstep.run_variant(policy, clip, "client")
    assert outcome.end == "motion finished", outcome
    assert not outcome.fell
    assert outcome.policy_steps >= outcome.clip_steps - 2
    assert outcome.up_for >= clip.duration - 0.2
    assert outcome.up_after_end is None  # not asked for


def test_targets_clipped_to_the_joint_limits_make_jump_fall():
    """The client's former clip (targets within the joint limits) takes away the torque Jump's
    policy pushes its ankles with at their stops: it falls about 5.5 s after A. The study sees it."""
    policy, clip = load_checked(str(POLICIES / "jump_k300.h5"))
    outcome = client_lockstep.run_variant(policy, clip, "joint-range", seconds=8.0)
    assert outcome.fell and outcome.end.startswith("pelvis tilted"), outcome
    assert 3.0 < outcome.up_for < 8.0


def test_cli_rejects_unknown_variants(capsys):
    with pytest.raises(SystemExit):
        client_lockstep.main([str(POLICIES / "run_k300.h5"), "--variants", "client,nope"])
    assert "nope" in capsys.readouterr().err


def test_late_policy_results_are_modelled():
    """Each result 40 ms late (training draws 0 or 20 ms): Jump falls within seconds,
    and the reference advances by policy steps, fewer than the seconds it stayed up would give."""
    policy, clip = load_checked(str(POLICIES / "jump_k300.h5"))
    outcome = client_lockstep.run_variant(policy, clip, "client", seconds=6.0, latency=0.04)
    assert outcome.fell, outcome
    assert outcome.up_for < 4.0
    assert outcome.policy_steps < 0.7 * outcome.up_for / policy.control_dt


def test_cli_rejects_a_latency_past_the_clients_fault(capsys):
    with pytest.raises(SystemExit):
        client_lockstep.main([str(POLICIES / "run_k300.h5"), "--latency", "150"])
    assert "--latency" in capsys.readouterr().err


def test_play_past_the_motions_end_with_the_hold_and_with_the_policy_kept_running():
    """``after_end``: the play goes on past MOTION FINISHED until the robot is down or the time is
    up; the time to the motion's end is unchanged, the open-loop hold asks the policy for nothing
    more, and the policy kept running on the held last frame does."""
    policy, clip = load_checked(str(POLICIES / "jump_k300.h5"))
    hold = client_lockstep.run_variant(policy, clip, "client", after_end=3.0)
    kept = client_lockstep.run_variant(policy, clip, "client", after_end=3.0, policy_after_end=True)
    for o in (hold, kept):
        assert o.up_after_end is not None and 0.0 < o.up_after_end <= 3.0 + 1e-9, o
        assert o.up_for >= clip.duration - 0.2
    assert hold.policy_steps <= hold.clip_steps + 1
    assert kept.policy_steps >= hold.policy_steps + int(0.9 * kept.up_after_end / policy.control_dt)


def test_cli_rejects_a_negative_after_end(capsys):
    with pytest.raises(SystemExit):
        client_lockstep.main([str(POLICIES / "run_k300.h5"), "--after-end", "-1"])
    assert "--after-end" in capsys.readouterr().err
