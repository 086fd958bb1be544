"""``TrainConfig.env_stages``: settings that change after set iterations of one run."""

import pytest
from test_train import SMALL, _train  # the training command in a subprocess (float32 Taichi)

from bcg.learn.config import EnvConfig, TrainConfig
from bcg.learn.config_io import apply_overrides
from bcg.learn.stages import StageError, check_stages, config_at, env_at, parse_stages


def test_stages_apply_in_order_on_top_of_each_other():
    text = "10:pose_termination_dist=1.5,env.root_position_weight=5; 20:root_position_weight=2,"
    text += "start_failure_mix=0.3"
    assert parse_stages(text) == (
        (10, {"pose_termination_dist": "1.5", "root_position_weight": "5"}),
        (20, {"root_position_weight": "2", "start_failure_mix": "0.3"}),
    )
    env = EnvConfig()
    assert env_at(env, text, 9) == env
    at10 = env_at(env, text, 10)
    assert (at10.pose_termination_dist, at10.root_position_weight, at10.start_failure_mix) == (1.5, 5.0, 0.0)
    at25 = env_at(env, text, 25)
    assert (at25.pose_termination_dist, at25.root_position_weight, at25.start_failure_mix) == (1.5, 2.0, 0.3)
    cfg = apply_overrides(TrainConfig(), ["iterations=30", f"env_stages={text}"])
    assert config_at(cfg, 9) == cfg and config_at(cfg, 25).env == at25
    assert config_at(cfg, 25).env_stages == text and config_at(TrainConfig(), 100) == TrainConfig()


@pytest.mark.parametrize(
    "text, words",
    [
        ("pose_termination_dist=1.5", ["ITERATION:field=value"]),
        ("-5:pose_termination_dist=1.5", ["ITERATION:field=value"]),
        ("10:pose_termination_dist", ["not field=value"]),
        ("10:kappa=50", ["'kappa' cannot change", "pose_termination_dist"]),
        ("10:action_rate_weight=0", ["'action_rate_weight' cannot change"]),
        ("20:fall_height=0.2;10:fall_height=0.1", ["iteration 10 does not follow 20"]),
        ("3000:fall_height=0.2", ["never starts in a run of 3000"]),
        ("10:fall_height=low", ["fall_height", "expected a float"]),
        ("10:start_failure_mix=2", ["must lie in [0, 1]"]),
    ],
)
def test_a_bad_stage_is_refused_with_a_clear_message(text, words):
    with pytest.raises(StageError) as info:
        check_stages(EnvConfig(), text, 3000)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_a_run_with_stages_switches_its_env_and_stores_the_stage_in_its_policies(tmp_path):
    """The stage takes effect after its iteration, also in a resumed run, and each policy file
    holds the environment of the stage in force at its iteration (sim2sim reads its pose rule)."""
    from bcg.learn.policy import load_policy

    run = tmp_path / "run"
    stages = "env_stages=1:pose_termination_dist=1.5,start_failure_mix=0.3"
    small = [*SMALL, "--set", "env.contact=false", "--iterations", "3", "--set", "policy_every=1"]
    first = _train(*small, "--set", stages, "--out", run, "--stop-after", "1")
    assert first.returncode == 0, first.stderr
    assert "iteration 2 on" not in first.stderr
    resumed = _train(*small, "--set", stages, "--out", run, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "iteration 2 on: env.pose_termination_dist=1.5, env.start_failure_mix=0.3" in resumed.stderr
    env1 = load_policy(run / "policy_it1.h5").config["env"]
    env3 = load_policy(run / "policy.h5").config["env"]
    assert (env1["pose_termination_dist"], env1["start_failure_mix"]) == (0.0, 0.0)
    assert (env3["pose_termination_dist"], env3["start_failure_mix"]) == (1.5, 0.3)
    bad = _train(*small, "--set", "env_stages=1:kappa=50", "--out", tmp_path / "bad")
    assert bad.returncode == 2 and "'kappa' cannot change" in bad.stderr and "Traceback" not in bad.stderr


def test_run_trains_with_its_recipe_of_stages_unless_told_otherwise():
    """``--motion run`` (the main job) gets Run's stages; ``--set env_stages=...`` replaces them, and
    a run too short for a stage (the benchmark's ``--schedule``) leaves it out instead of refusing."""
    from bcg.learn.stages import MOTION_STAGES
    from bcg.learn.train import parse_args, resolve_config

    def stages(*argv):
        return getattr(resolve_config(parse_args(list(argv))), "env_stages", None)

    recipe = MOTION_STAGES["run"]
    assert stages() == stages("--motion", "run", "--kappa", "300") == recipe
    first, second = recipe.split(";")
    assert first.startswith("1250:") and second.startswith("2500:")
    assert stages("--iterations", "2000") == first
    assert stages("--iterations", "1250") == stages("--set", "iterations=450") == ""
    assert stages("--set", "env_stages=") == ""
    assert stages("--set", "env_stages=10:fall_height=0.2") == "10:fall_height=0.2"
    assert stages("--motion", "jump") == "" and stages("--algo", "ppo") is None
    # a field the command sets holds throughout: the recipe leaves it out (and a stage left empty)
    mine = stages("--set", "env.pose_termination_dist=1.0", "--set", "env.root_rotation_cap=0.5")
    assert "pose_termination_dist" not in mine and "root_rotation_cap" not in mine
    assert mine.startswith("1250:leg_clearance_cap=0,root_rotation_weight=1,") and ";" not in mine
    # the recipe is a valid stage string that changes the env from iteration 1250 on
    cfg = resolve_config(parse_args([]))
    assert config_at(cfg, 1249).env == cfg.env
    late = config_at(cfg, 2500).env
    assert (late.pose_termination_dist, late.root_position_weight, late.root_rotation_cap) == (1.5, 5.0, 0.0)


def test_a_stage_turns_the_leg_contact_on_and_changes_nothing_before_it(tmp_path):
    """A stage may switch on the leg-against-leg contact: the run builds its simulator with it at
    k = 0, so its iterations before the stage log what a run without the stage logs, bit for bit;
    from the stage on the simulator pushes the legs apart, and the policies store the setting (the
    MuJoCo check's replay reads it)."""
    from bcg.learn.policy import load_policy
    from bcg.learn.runlog import read_log
    from bcg.learn.stages import leg_contact_later

    small = [*SMALL, "--set", "env.contact=false", "--iterations", "3", "--set", "policy_every=1"]
    stage = "env_stages=2:leg_contact_stiffness=5000,leg_contact_limit=150"
    staged = _train(*small, "--set", stage, "--out", tmp_path / "staged")
    assert staged.returncode == 0, staged.stderr
    assert "iteration 3 on: env.leg_contact_stiffness=5000.0, env.leg_contact_limit=150.0" in staged.stderr
    plain = _train(*small, "--set", "env_stages=", "--out", tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    rows = [read_log(tmp_path / name / "log.csv") for name in ("staged", "plain")]
    clock = ("time", "wall_time")
    for a, b in zip(rows[0][:2], rows[1][:2]):
        assert {k: v for k, v in a.items() if not k.startswith(clock)} == {
            k: v for k, v in b.items() if not k.startswith(clock)
        }
    env2 = load_policy(tmp_path / "staged" / "policy_it2.h5").config["env"]
    env3 = load_policy(tmp_path / "staged" / "policy.h5").config["env"]
    assert (env2["leg_contact_stiffness"], env3["leg_contact_stiffness"], env3["leg_contact_limit"]) == (
        0.0,
        5000.0,
        150.0,
    )
    cfg = apply_overrides(TrainConfig(), ["iterations=30", "env_stages=10:leg_contact_stiffness=100"])
    assert leg_contact_later(cfg) and not leg_contact_later(TrainConfig())
    assert not leg_contact_later(apply_overrides(TrainConfig(), ["env_stages=10:leg_contact_stiffness=0"]))


def test_set_env_config_gives_the_leg_contact_to_the_simulator_only_when_it_has_one():
    """A stage that changes the contact's damping or limit while it stays off leaves a simulator
    without the contact alone; turning it on there is refused; a simulator with it gets all three."""
    from types import SimpleNamespace

    from bcg.learn.stages import set_env_config

    class Sim:
        def __init__(self, built):
            self.self_contact, self.calls = (object() if built else None), []

        def set_self_contact(self, **values):
            self.calls.append(values)

    def env(built):
        phases = SimpleNamespace(mix=0, lead=0, memory=0, begin_mix=0)
        return SimpleNamespace(cfg=EnvConfig(), sim=Sim(built), start_phases=phases)

    without = env(False)
    assert set_env_config(without, EnvConfig(leg_contact_damping=0.3)) == {"leg_contact_damping": 0.3}
    assert without.cfg.leg_contact_damping == 0.3
    with pytest.raises(ValueError, match="cannot turn on the leg contact"):
        set_env_config(env(False), EnvConfig(leg_contact_stiffness=5000.0))
    built = env(True)
    set_env_config(built, EnvConfig(leg_contact_stiffness=5000.0, leg_contact_limit=150.0))
    assert built.sim.calls == [{"stiffness": 5000.0, "damping": 0.5, "force_limit": 150.0}]
