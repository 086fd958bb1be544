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
