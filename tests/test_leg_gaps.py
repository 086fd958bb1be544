"""How close the legs pass each other, in MuJoCo and the training simulator (bcg.studies.leg_gaps)."""

from pathlib import Path
from types import SimpleNamespace

import mujoco
import numpy as np
import pytest

from bcg.learn.clearance import LegCapsules
from bcg.robot.run import load_checked
from bcg.studies import leg_gaps
from bcg.validate import mujoco_runner as mr

POLICIES = Path(__file__).resolve().parents[1] / "policies"


def _mujoco_leg_pairs(model, qpos):
    """The (left geom, right geom) names of MuJoCo's contacts between the two legs at ``qpos``."""
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    mujoco.mj_forward(model, data)
    pairs = set()
    for c in data.contact[: data.ncon]:
        names = sorted((model.geom(c.geom1).name, model.geom(c.geom2).name))
        if names[0].startswith("left_") and names[1].startswith("right_"):
            pairs.add(tuple(names))
    return pairs


def test_a_negative_gap_is_a_contact_mujoco_reports_between_the_named_pair():
    """Legs apart in the default pose: positive gap, no leg contact in MuJoCo. Hips rolled inwards
    until the legs cross: a negative gap, and MuJoCo reports a contact between the two capsules
    the study names as closest."""
    backend = mr.MujocoG1(mr.PDParams.from_g1())
    model = backend.model
    legs = LegCapsules.of(model)
    stand = model.qpos0.copy()
    stand[2] = 0.8
    crossed = stand.copy()
    crossed[model.joint("left_hip_roll_joint").qposadr[0]] = -0.5
    crossed[model.joint("right_hip_roll_joint").qposadr[0]] = 0.5
    episode = SimpleNamespace(qpos=np.stack([stand, crossed]), fell=False, fall_time=None)
    gaps = leg_gaps.gaps_along(model, legs, episode)
    assert gaps.gap[0] > 0.03 and not _mujoco_leg_pairs(model, stand)
    assert gaps.gap[1] < 0.0
    assert tuple(sorted(gaps.pair[1])) in _mujoco_leg_pairs(model, crossed)
    assert gaps.smallest()[:2] == (gaps.gap[1], 0.02) and gaps.within(0.02) == 1
    assert gaps.fall_time is None


def test_the_runs_start_where_sim2sims_do():
    """Run i is sim2sim's run i: the same start for the same seed (the training's reset noise)."""
    from bcg.validate.sim2sim import EvalConfig, evaluate_policy

    policy, clip = load_checked(str(POLICIES / "run_k300.h5"))
    rows = leg_gaps.compare(policy, clip, runs=2, seed=5, seconds=0.2, start_time=None, replay=False)
    results, _, _ = evaluate_policy(
        policy, EvalConfig(runs=2, seconds=0.2, seed=5, training_sim="off"), progress=None
    )
    assert [r[0] for r in rows] == [r.start_time for r in results]
    assert all(r[2] is None and r[3] is None and len(r[1].gap) == 11 for r in rows)


def test_the_command_prints_a_row_per_run_and_draws_the_plot(tmp_path, capsys):
    out = tmp_path / "gaps.png"
    args = [str(POLICIES / "run_k300.h5"), "--runs", "2", "--seconds", "0.3", "--plot", str(out)]
    assert leg_gaps.main(args) == 0
    text = capsys.readouterr().out
    assert "| 1 | " in text and "| 2 | " in text and "| 3 | " not in text
    assert "runs whose legs cross in MuJoCo: " in text and "in the training simulator: " in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_errors(capsys):
    with pytest.raises(SystemExit):
        leg_gaps.main([str(POLICIES / "run_k300.h5"), "--runs", "0"])
    assert "--runs" in capsys.readouterr().err
    assert leg_gaps.main([str(POLICIES / "missing.h5")]) == 2
    assert "missing.h5" in capsys.readouterr().err
