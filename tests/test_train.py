"""The training command line: bad input, the run folder's files, and resume against an uninterrupted run.

Training runs in float32 Taichi, so it runs in subprocesses (the test session holds a float64 runtime).
"""

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from bcg.learn.config import TrainConfig
from bcg.learn.config_io import apply_overrides, config_from_dict, config_to_dict

ROOT = Path(__file__).absolute().parents[1]
SMALL = [
    "--envs", "4", "--iterations", "2", "--seed", "7",
    "--set", "horizon=4", "--set", "actor.hidden=16", "--set", "critic.hidden=16",
    "--set", "critic.iterations=2", "--set", "disc.hidden=16,8", "--set", "checkpoint_every=1",
]  # fmt: skip


def _train(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "bcg.learn.train", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["--motion", "walk"], ["unknown motion 'walk'", "run, jump, fight, dance"]),
        (["--motion", "/nonexistent/clip.h5"], ["does not exist"]),
        (["--motion", str(ROOT / "pyproject.toml")], ["unknown motion"]),
        (["--set", "actor.nope=1"], ["unknown config field"]),
        (["--set", "actor.lr=fast"], ["actor.lr", "expected a float"]),
        (["--set", "horizon"], ["not of the form field=value"]),
        (["--kappa", "nan"], ["env.kappa", "finite"]),
        (["--set", "actor.lr=inf"], ["actor.lr", "finite"]),
        (["--resume", "--overwrite"], ["exclude each other"]),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(tmp_path, args, words):
    out = _train(*args, "--out", tmp_path / "run")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ")
    for word in words:
        assert word in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_file_that_is_not_a_clip_is_refused(tmp_path):
    bad = tmp_path / "clip.h5"
    bad.write_bytes(b"not an HDF5 file")
    out = _train("--motion", bad, "--out", tmp_path / "run")
    assert out.returncode == 2 and "cannot load motion" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    out = _train("--resume", "--out", tmp_path)
    assert out.returncode == 2 and "cannot resume" in out.stderr and "Traceback" not in out.stderr


def test_a_folder_in_use_by_another_training_process_is_refused(tmp_path):
    import fcntl

    (tmp_path / "checkpoint.h5").write_bytes(b"a run in progress")
    (tmp_path / ".checkpoint.h5.x1y2.tmp").write_bytes(b"its checkpoint being written")
    with (tmp_path / "train.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = _train("--resume", "--out", tmp_path)
    assert out.returncode == 2 and "is in use by another training process" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / ".checkpoint.h5.x1y2.tmp").exists()  # the other process's file is left alone


def test_a_folder_holding_a_run_is_neither_overwritten_nor_deleted_without_overwrite(tmp_path):
    (tmp_path / "checkpoint.h5").write_bytes(b"hours of training")
    (tmp_path / "log.csv").write_text("iteration\n1\n")
    out = _train("--out", tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "already holds a run (checkpoint.h5, log.csv)" in out.stderr and "--overwrite" in out.stderr
    assert (tmp_path / "checkpoint.h5").read_bytes() == b"hours of training"
    assert (tmp_path / "log.csv").read_text() == "iteration\n1\n"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "nan_dump_000012.h5").write_bytes(b"the states before a NaN")
    out = _train("--out", dumps)
    assert out.returncode == 2 and "already holds a run (nan_dump_000012.h5)" in out.stderr, out.stderr
    assert (dumps / "nan_dump_000012.h5").exists()


def _fresh_state():
    """A learner-like state tree (the shapes of a tiny run)."""
    from bcg.learn.mlp import rng_state

    rng = np.random.default_rng(0)

    def w():
        return {"w0": np.zeros((8, 4), np.float32), "b0": np.zeros(4, np.float32)}

    return {
        "iteration": np.int64(3),
        "rng": rng_state(rng),
        "actor": w(),
        "actor_opt": {"m": w(), "v": w(), "step": np.int64(3)},
        "env": {
            "qpos": np.zeros((4, 36)),
            "rng": rng_state(rng),
            "episode_return": np.full(4, np.nan),
            "start_phases": {"counts": np.zeros(60)},
        },
        "disc": {
            "params": w(),
            "replay": {
                "data": np.zeros((0, 5), np.float32),
                "capacity": np.int64(10),
                "head": np.int64(0),
                "size": np.int64(0),
            },
        },  # fmt: skip
    }


def test_checkpoint_state_is_checked_against_the_fresh_learner():
    from bcg.learn.train import check_checkpoint_state

    fresh = _fresh_state()
    good = _fresh_state()
    good["rng"] = np.frombuffer(b'{"bit_generator": "PCG64", "state": {"state": 1, "inc": 3}, '
                                b'"has_uint32": 0, "uinteger": 0}', np.uint8)  # fmt: skip
    good["disc"]["replay"].update(data=np.ones((3, 5), np.float32), size=np.int64(3), head=np.int64(3))
    assert check_checkpoint_state(good, fresh) == []
    del good["disc"]["replay"]  # checkpoint_replay=false
    assert check_checkpoint_state(good, fresh) == []
    del good["env"]["start_phases"]  # a checkpoint from before the failure-weighted start phases
    assert check_checkpoint_state(good, fresh) == []

    def broken(edit):
        state = _fresh_state()
        edit(state)
        return check_checkpoint_state(state, fresh)

    assert broken(lambda s: s.pop("iteration")) == ["iteration is missing"]
    assert broken(lambda s: s["env"]["start_phases"].update(counts=np.zeros(30))) == [
        "env/start_phases/counts has shape (30,), expected (60,)"
    ]
    assert broken(lambda s: s["actor"].update(w0=np.zeros((9, 4), np.float32))) == [
        "actor/w0 has shape (9, 4), expected (8, 4)"
    ]
    assert broken(lambda s: s["actor_opt"].update(m={"w0": 1})) == [
        "actor_opt/m/w0 has shape (), expected (8, 4)", "actor_opt/m/b0 is missing"
    ]  # fmt: skip
    assert broken(lambda s: s["actor"]["w0"].fill(np.nan)) == ["actor/w0 holds non-finite values"]
    assert broken(lambda s: s.update(rng=np.frombuffer(b"\xff\xfe", np.uint8))) == [
        "rng is not a generator state"
    ]
    assert broken(lambda s: s["actor"].update(b0=np.array(["x"] * 4))) == [
        "actor/b0 holds <U1, expected float32"
    ]
    assert broken(lambda s: s.update(disc=np.zeros(3))) == ["disc is not a group"]
    assert broken(lambda s: s["disc"]["replay"].update(size=np.int64(7))) == [
        "disc/replay: size, head and capacity disagree with its 0 rows"
    ]


def test_a_damaged_log_does_not_stop_a_resume(tmp_path):
    from bcg.learn.runlog import read_log

    log = tmp_path / "log.csv"
    log.write_bytes(b"iteration,reward\n1,0.5\n2,0.6\n\x00\x00\x003,0.7\n,0.8\n4,0.9,extra\n5\n")
    assert [r["iteration"] for r in read_log(log)] == ["1", "2", "3"]


def test_a_config_stored_before_action_rate_on_keeps_the_sampled_action_rate():
    stored = config_to_dict(TrainConfig())
    del stored["env"]["action_rate_on"]
    assert config_from_dict(stored).env.action_rate_on == "sample"
    assert config_from_dict(config_to_dict(TrainConfig())).env.action_rate_on == "mean"


def test_a_config_stored_before_hold_ended_episodes_keeps_simulating_them():
    stored = config_to_dict(TrainConfig())
    del stored["env"]["hold_ended_episodes"]
    assert config_from_dict(stored).env.hold_ended_episodes is False
    assert config_from_dict(config_to_dict(TrainConfig())).env.hold_ended_episodes is True


def test_a_config_stored_before_the_position_term_default_keeps_the_papers_contact():
    """Runs stored before β = 0.2 became the default trained on the paper's model (β = 0): a resume
    or a replay of them must not switch the term on, in the flat layout or the nested one."""
    stored = config_to_dict(TrainConfig())
    assert stored["env"]["contact_depth_correction"] == 0.2
    del stored["env"]["contact_depth_correction"]
    assert config_from_dict(stored).env.contact_depth_correction == 0.0
    nested = config_to_dict(TrainConfig())
    nested["env"] = {k: v for k, v in nested["env"].items() if not k.startswith(("contact", "kappa"))}
    nested["env"]["contact"] = {"on": True, "kappa": 300.0}
    assert config_from_dict(nested).env.contact.depth_correction == 0.0
    literal = apply_overrides(TrainConfig(), ["env.contact_depth_correction=0"])
    assert config_from_dict(config_to_dict(literal)).env.contact_depth_correction == 0.0


def test_a_config_stored_before_the_leg_clearance_default_keeps_its_term():
    """The leg-clearance term is on by default (w = 1000, cost bounded at c = 2): a run stored before
    either field keeps the term as it trained, off, or on without the bound."""
    cfg = TrainConfig()
    assert (cfg.env.leg_clearance_weight, cfg.env.leg_clearance_cap) == (1000.0, 2.0)
    stored = config_to_dict(cfg)
    del stored["env"]["leg_clearance_weight"], stored["env"]["leg_clearance_cap"]
    env = config_from_dict(stored).env
    assert (env.leg_clearance_weight, env.leg_clearance_cap) == (0.0, 0.0)
    stored = config_to_dict(apply_overrides(cfg, ["env.leg_clearance_weight=500"]))
    del stored["env"]["leg_clearance_cap"]
    env = config_from_dict(stored).env
    assert (env.leg_clearance_weight, env.leg_clearance_cap) == (500.0, 0.0)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    from bcg.learn.config_io import ConfigError

    with pytest.raises(ConfigError, match="leg_clearance_cap must be >= 0, got 1000.0, 0.02, -1.0"):
        apply_overrides(cfg, ["env.leg_clearance_cap=-1"])


def test_a_refused_resume_names_the_flags_that_resume_the_run_as_it_trained():
    """A run stored before a default changed is refused on resume with its old command; the message
    gives the --set flags that restore its config, and with them the resume is accepted."""
    from bcg.learn.runfolder import UsageError, _check_resume_config

    stored = config_to_dict(apply_overrides(TrainConfig(), ["env.friction=0.5,1.0", "env.dr_push=false"]))
    for key in ("contact_depth_correction", "leg_clearance_weight", "leg_clearance_cap"):
        del stored["env"][key]  # a run from before these defaults
    stored = config_from_dict(stored)
    with pytest.raises(UsageError) as refused:
        _check_resume_config(stored, TrainConfig())
    message = str(refused.value)
    flags = message.split("add: ")[1].split()
    sets = [flags[i + 1] for i, f in enumerate(flags) if f == "--set"]
    assert sorted(sets) == sorted(
        [
            "env.contact_depth_correction=0.0",
            "env.leg_clearance_weight=0.0",
            "env.leg_clearance_cap=0.0",
            "env.friction=0.5,1.0",
            "env.dr_push=false",
        ]
    )
    _check_resume_config(stored, apply_overrides(TrainConfig(), sets))  # accepted


def test_overrides_and_stored_config_round_trip():
    cfg = apply_overrides(
        TrainConfig(), ["env.dr_push=false", "critic.hidden=128,64", "env.friction=0.5,1.0"]
    )
    assert cfg.env.dr_push is False and cfg.critic.hidden == (128, 64) and cfg.env.friction == (0.5, 1.0)
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_a_stored_flat_env_config_loads_into_the_contact_and_bundle_groups():
    """Run folders and policy files hold the contact and bundle settings under flat names (env.kappa,
    env.bcg_size, ...): they load into EnvConfig's groups and are written back as they were; the
    nested layout loads too, and overrides take either name."""
    from bcg.learn.config import BundleConfig, ContactConfig

    stored = config_to_dict(TrainConfig())
    stored["env"] |= {
        "contact": False, "kappa": 50.0, "contact_margin": 0.0, "contact_depth_correction": 0.2,
        "bcg": False, "bcg_threshold": 300.0, "bcg_size": 4, "bcg_horizon": 1, "bcg_sigma_pos": 0.02,
        "bcg_sigma_vel": 0.03, "bcg_damping": 1e-3, "bcg_common_noise": True, "bcg_sampling": "latin",
    }  # fmt: skip
    cfg = config_from_dict(json.loads(json.dumps(stored)))
    assert cfg.env.contact == ContactConfig(on=False, kappa=50.0, activation_margin=0.0, depth_correction=0.2)
    assert cfg.env.bundle == BundleConfig(
        on=False, threshold=300.0, size=4, horizon=1, sigma_pos=0.02, sigma_vel=0.03,
        jacobian_damping=1e-3, common_noise=True, sampling="latin",
    )  # fmt: skip
    assert (cfg.env.kappa, cfg.env.bcg_size, cfg.env.bcg) == (50.0, 4, False)
    assert config_to_dict(cfg) == stored
    assert config_from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
    flat = apply_overrides(TrainConfig(), ["env.contact=false", "env.kappa=50", "env.bcg_size=4"])
    nested = apply_overrides(
        TrainConfig(), ["env.contact.on=false", "env.contact.kappa=50", "env.bundle.size=4"]
    )
    assert flat == nested and nested.env.contact.kappa == 50.0 and not nested.env.contact.on


def test_contact_margin_is_an_optional_number_and_reaches_the_simulator():
    from bcg.learn.config import EnvConfig
    from bcg.learn.config_io import ConfigError
    from bcg.learn.training_sim import make_g1_sim

    assert TrainConfig().env.contact_margin is None  # 4.6 / kappa
    cfg = apply_overrides(TrainConfig(), ["env.contact_margin=0"])
    assert cfg.env.contact_margin == 0.0
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    assert apply_overrides(cfg, ["env.contact_margin=none"]).env.contact_margin is None
    for bad in ("env.contact_margin=abc", "env.contact_margin=-0.01"):
        with pytest.raises(ConfigError, match="contact_margin"):
            apply_overrides(TrainConfig(), [bad])
    for margin, expected in ((0.0, 0.0), (0.004, 0.004), (None, 4.6 / 300.0)):
        sim = make_g1_sim(EnvConfig(contact_margin=margin, kappa=300.0), num_envs=1, horizon=1)
        assert sim.contact.margin == pytest.approx(expected)
        assert sim.ground.con_margin[None] == pytest.approx(expected)


def test_contact_depth_correction_is_checked_and_reaches_the_simulator():
    from bcg.learn.config import EnvConfig
    from bcg.learn.config_io import ConfigError
    from bcg.learn.training_sim import make_g1_sim

    assert TrainConfig().env.contact_depth_correction == 0.2  # ours; 0 is the paper's model
    cfg = apply_overrides(TrainConfig(), ["env.contact_depth_correction=0"])
    assert cfg.env.contact_depth_correction == 0.0
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    for bad in (
        "env.contact_depth_correction=abc",
        "env.contact_depth_correction=1",
        "env.contact_depth_correction=-0.1",
    ):
        with pytest.raises(ConfigError, match="contact_depth_correction"):
            apply_overrides(TrainConfig(), [bad])
    sim = make_g1_sim(EnvConfig(contact_depth_correction=0.1, kappa=300.0), num_envs=1, horizon=1)
    assert sim.contact.depth_correction == 0.1 and sim.ground.con_dcorr[None] == pytest.approx(0.1)
    sim = make_g1_sim(EnvConfig(), num_envs=1, horizon=1)  # the default reaches it unasked
    assert sim.ground.con_dcorr[None] == pytest.approx(0.2)


def test_bundle_sampling_is_checked_and_reaches_the_simulator():
    from bcg.learn.config import EnvConfig
    from bcg.learn.config_io import ConfigError
    from bcg.learn.training_sim import make_g1_sim

    assert TrainConfig().env.bcg_sampling == "gaussian"  # the paper's
    cfg = apply_overrides(TrainConfig(), ["env.bcg_sampling=latin"])
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    for bad in (["env.bcg_sampling=sobol"], ["env.bcg_size=9", "env.bcg_sampling=antithetic"]):
        with pytest.raises((ConfigError, ValueError), match="bcg_sampling"):
            apply_overrides(TrainConfig(), bad)
    sim = make_g1_sim(EnvConfig(bcg_sampling="antithetic"), num_envs=1, horizon=1)
    assert sim.bundle.sampling == "antithetic"


def _checkpoint(path):
    from bcg.learn.mlp import flatten_tree, read_tree_h5

    with h5py.File(path) as f:
        return flatten_tree(read_tree_h5(f))


@pytest.mark.parametrize("contact", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_resume_continues_exactly_and_writes_the_run_files(tmp_path, contact):
    """2 iterations in one go against 1 + 1 with a stop and --resume: identical state, bit for bit
    (with contact: bundles included, whose perturbation generator the checkpoint carries)."""
    from bcg.learn.policy import load_policy

    whole, split = tmp_path / "whole", tmp_path / "split"
    small = [*SMALL, "--set", f"env.contact={contact}"]
    out = _train(*small, "--out", whole)
    assert out.returncode == 0, out.stderr
    assert "it/s" in out.stderr and "ETA" in out.stderr and "2/2" in out.stderr
    first = _train(*small, "--out", split, "--stop-after", "1")
    assert first.returncode == 0 and "stopped at iteration 1" in first.stderr, first.stderr
    assert not (split / "policy.h5").exists()
    # a stop keeps the run's schedule: the first iteration learns at the whole run's rate
    # (benchmarks/bench_learning.py relies on it)
    rows = [(d / "log.csv").read_text().splitlines() for d in (whole, split)]
    lrs = [float(r[1].split(",")[r[0].split(",").index("lr_actor")]) for r in rows]
    assert lrs[0] == lrs[1]
    changed = _train(*small, "--out", split, "--resume", "--set", "gamma=0.9")
    assert changed.returncode == 2 and "gamma" in changed.stderr
    # a row logged after the checkpoint (a run killed between the two) goes on resume
    with (split / "log.csv").open("a") as f:
        f.write("2" + ",9" * (len((split / "log.csv").read_text().splitlines()[0].split(",")) - 1) + "\n")
    # the closing line's resume command, as printed (it repeats this call's options)
    hint = first.stderr.split("resume with: ")[1].split(" (its policy so far")[0]
    command = shlex.split(hint)
    assert command[:3] == ["python", "-m", "bcg.learn.train"] and "--stop-after" not in command
    second = _train(*command[3:])
    assert second.returncode == 0, second.stderr
    again = _train(*small, "--out", split)  # forgetting --resume does not wipe the run
    assert again.returncode == 2 and "already holds a run" in again.stderr

    damaged = tmp_path / "damaged"
    shutil.copytree(split, damaged)
    with h5py.File(damaged / "checkpoint.h5", "a") as f:
        f["actor/w0"][0, 0] = np.nan
        del f["critic/members/1/b0"]
    out = _train(*small, "--out", damaged, "--resume")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "does not fit this run" in out.stderr and "actor/w0 holds non-finite values" in out.stderr
    assert "critic/members/1/b0 is missing" in out.stderr

    a, b = _checkpoint(whole / "checkpoint.h5"), _checkpoint(split / "checkpoint.h5")
    assert set(a) == set(b)
    assert int(a["iteration"]) == 2
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
    assert any(key.startswith("disc/replay") for key in a) and any(key.startswith("env/") for key in a)

    rows = (whole / "log.csv").read_text().splitlines()
    assert rows[0].startswith("iteration,wall_time,reward") and len(rows) == 3
    split_rows = (split / "log.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in split_rows[1:]] == ["1", "2"]
    assert [r.split(",")[2:8] for r in split_rows[1:]] == [r.split(",")[2:8] for r in rows[1:]]
    # the resumed run's clock goes on from the first call's (its second row took time_iteration)
    log = [dict(zip(split_rows[0].split(","), r.split(","))) for r in split_rows[1:]]
    assert float(log[1]["wall_time"]) >= float(log[0]["wall_time"]) + float(log[1]["time_iteration"])
    assert (whole / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((whole / "config.json").read_text())
    assert config["config"]["num_envs"] == 4 and config["config"]["actor"]["hidden"] == [16]
    policy = load_policy(whole / "policy.h5")
    assert policy.motion_name == "run" and policy.kappa == 300.0 and policy.trained_iterations == 2
    for key, value in policy.params.items():
        assert np.array_equal(value, a[f"actor/{key}"]), key


def test_init_from_another_run_continues_it_under_a_new_config(tmp_path):
    """``--init-from``: with the same config it is a resume into a new folder (identical state after
    one more iteration); with changed fields it records them; another motion, too few iterations or
    --resume beside it are refused."""
    small = [*SMALL, "--set", "env.contact=false"]
    source, resumed, same, changed = (tmp_path / n for n in ("source", "resumed", "same", "changed"))
    assert _train(*small, "--out", source, "--stop-after", "1").returncode == 0
    shutil.copytree(source, resumed)
    assert _train(*small, "--out", resumed, "--resume").returncode == 0
    out = _train(*small, "--out", same, "--init-from", source)
    assert out.returncode == 0, out.stderr
    assert "initialised from" in out.stderr and "at iteration 1; config changes: none" in out.stderr
    a, b = _checkpoint(resumed / "checkpoint.h5"), _checkpoint(same / "checkpoint.h5")
    assert set(a) == set(b) and int(b["iteration"]) == 2
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
    assert [r.split(",")[0] for r in (same / "log.csv").read_text().splitlines()[1:]] == ["2"]

    # a new lead-in changes the clip's timeline: the failure histogram starts afresh
    out = _train(*small, "--out", changed, "--init-from", source / "checkpoint.h5",
                 "--set", "env.leg_clearance_weight=100", "--set", "actor.lr=0.001",
                 "--set", "env.clip_lead_in=0.5")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "env.leg_clearance_weight (checkpoint 1000.0, now 100.0)" in out.stderr
    config = json.loads((changed / "config.json").read_text())
    assert config["init_from"] == str((source / "checkpoint.h5").resolve()) and config["init_iteration"] == 1
    assert len(config["init_changes"]) == 3 and config["config"]["env"]["leg_clearance_weight"] == 100.0
    assert "leg_overlap_rate" in (changed / "log.csv").read_text().splitlines()[0]
    c = _checkpoint(changed / "checkpoint.h5")
    assert not np.array_equal(c["actor/w0"], a["actor/w0"])  # another learning rate, another step
    from bcg.learn.adam import linear_lr

    row = (changed / "log.csv").read_text().splitlines()
    lr = float(row[1].split(",")[row[0].split(",").index("lr_actor")])
    assert lr == pytest.approx(linear_lr(1e-3, 1, 2, 1e-5))  # the new rate took effect, not the stored one

    for args, words in (
        (["--motion", "jump"], ["another motion", "'run'"]),
        (["--iterations", "1"], ["at iteration 1", "raise --iterations"]),
        (["--resume"], ["exclude each other"]),
        (["--seed", "8"], ["seed (checkpoint 7, now 8)", "cannot change"]),
        (["--set", "actor.hidden=8"], ["actor.hidden", "cannot change"]),
    ):
        bad = _train(*small, *args, "--out", tmp_path / "bad", "--init-from", source)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        assert all(w in bad.stderr for w in words), bad.stderr
        assert not (tmp_path / "bad").exists()


def test_policy_snapshots_are_written_every_n_iterations_and_go_with_overwrite(tmp_path):
    """``policy_every``: a loadable ``policy_it<N>.h5`` at every N-th iteration, holding the actor of
    that iteration; ``--overwrite`` deletes them with the rest of the old run."""
    from bcg.learn.policy import load_policy

    run = tmp_path / "run"
    small = [*SMALL, "--set", "env.contact=false", "--iterations", "3"]
    bad = _train(*small, "--set", "policy_every=-1", "--out", run)
    assert bad.returncode == 2 and "policy_every must be >= 0" in bad.stderr and not run.exists()
    out = _train(*small, "--set", "policy_every=2", "--out", run)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in run.glob("policy*.h5")) == ["policy.h5", "policy_it2.h5"]
    snapshot, final = load_policy(run / "policy_it2.h5"), load_policy(run / "policy.h5")
    assert snapshot.trained_iterations == 2 and final.trained_iterations == 3
    assert snapshot.config["policy_every"] == 2
    assert any(not np.array_equal(snapshot.params[k], final.params[k]) for k in final.params)

    again = _train(*small, "--set", "policy_every=1", "--iterations", "2", "--out", run, "--stop-after", "1")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert (run / "policy_it2.h5").exists()
    again = _train(*small, "--set", "policy_every=1", "--out", run, "--stop-after", "1", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in run.glob("policy*.h5")) == ["policy_it1.h5"]
    state = _checkpoint(run / "checkpoint.h5")
    for key, value in load_policy(run / "policy_it1.h5").params.items():
        assert np.array_equal(value, state[f"actor/{key}"]), key

    # a snapshot newer than the checkpoint goes on resume, as its log rows do; a resume may change
    # how often snapshots and checkpoints are written
    shutil.copy(run / "policy_it1.h5", run / "policy_it3.h5")
    resumed = _train(
        *small, "--set", "policy_every=2", "--set", "checkpoint_every=2", "--out", run, "--resume"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in run.glob("policy*.h5")) == ["policy.h5", "policy_it1.h5", "policy_it2.h5"]


def test_export_writes_the_policy_of_an_unfinished_run(tmp_path, capsys):
    """``python -m bcg.learn.policy export RUN``: the checkpoint's actor and normaliser, with the
    iterations behind them; an existing file is kept, a damaged or missing checkpoint is refused
    and leaves no file."""
    from bcg.learn.policy import PolicyFileError, export_policy, load_policy, main

    run = tmp_path / "run"
    out = _train(*SMALL, "--set", "env.contact=false", "--out", run, "--stop-after", "1")
    assert out.returncode == 0 and "python -m bcg.learn.policy export" in out.stderr, out.stderr
    assert not (run / "policy.h5").exists()
    written = export_policy(run)
    assert written == run / "policy_it1.h5"
    policy = load_policy(written)
    assert policy.trained_iterations == 1 and policy.motion_name == "run" and policy.kappa == 300.0
    state = _checkpoint(run / "checkpoint.h5")
    for key, value in policy.params.items():
        assert np.array_equal(value, state[f"actor/{key}"]), key
    assert np.array_equal(policy.normalizer.mean, state["obs_rms/mean"])
    assert policy.config["actor"]["hidden"] == [16]
    before = written.read_bytes()
    with pytest.raises(PolicyFileError, match="exists"):
        export_policy(run)
    assert written.read_bytes() == before
    assert main(["export", str(run / "checkpoint.h5"), "--out", str(tmp_path / "p.h5")]) == 0
    assert "trained for 1 iterations" in capsys.readouterr().out

    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    (damaged / "policy_it1.h5").unlink()
    with h5py.File(damaged / "checkpoint.h5", "a") as f:
        f["actor/w0"][0, 0] = np.nan
    with pytest.raises(PolicyFileError, match="non-finite"):
        export_policy(damaged)
    assert not (damaged / "policy_it1.h5").exists()
    assert sorted(p.name for p in damaged.iterdir() if p.name.startswith("policy")) == []
    assert main(["export", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "cannot export" in err and "does not exist" in err and "Traceback" not in err


def test_updates_in_the_worker_process_equal_those_in_the_learner_process(tmp_path):
    """``critic_worker`` (the default) runs the critic fit and the discriminator's SGD in a child
    process, the fit taken one rollout later: the same training as in the learner's process, up to
    float32 round-off."""
    small = [*SMALL, "--set", "env.contact=false", "--iterations", "3"]
    there = _train(*small, "--out", tmp_path / "worker")
    here = _train(*small, "--out", tmp_path / "here", "--set", "critic_worker=false")
    assert there.returncode == 0 and here.returncode == 0, there.stderr + here.stderr
    a, b = (
        _checkpoint(tmp_path / "worker" / "checkpoint.h5"),
        _checkpoint(tmp_path / "here" / "checkpoint.h5"),
    )
    assert set(a) == set(b)
    moved = 0
    for key in a:
        if (
            key.startswith(("actor/", "critic/", "disc/params/", "disc/optimizer/"))
            and a[key].dtype.kind == "f"
        ):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)
            moved += key.startswith("disc/params/")
    assert moved >= 2
    # the discriminator took SGD steps (its momentum is not zero)
    assert any(np.any(a[k] != 0) for k in a if k.startswith("disc/optimizer/") and a[k].dtype.kind == "f")
    rows = (tmp_path / "worker" / "log.csv").read_text().splitlines()
    log = [dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:]]
    assert log[0]["critic_loss"] in ("", "nan") and float(log[1]["critic_loss"]) >= 0  # one row later


def test_tracking_reward_trains_without_updating_the_discriminator(tmp_path):
    """``env.imitation_reward=tracking``: the discriminator's weights stay at their initial values
    while its normaliser (which scales the tracking reward) follows the differentials."""
    small = [*SMALL, "--set", "env.contact=false", "--set", "env.imitation_reward=tracking"]
    one = _train(*small, "--iterations", "1", "--out", tmp_path / "one")
    two = _train(*small, "--out", tmp_path / "two")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    a, b = _checkpoint(tmp_path / "one" / "checkpoint.h5"), _checkpoint(tmp_path / "two" / "checkpoint.h5")
    params = [k for k in a if k.startswith("disc/params/")]
    assert params and all(np.array_equal(a[k], b[k]) for k in params)
    normaliser = [k for k in a if k.startswith("disc/normalizer/") and a[k].dtype.kind == "f"]
    assert any(not np.array_equal(a[k], b[k]) for k in normaliser)
    assert not any(np.array_equal(a[k], b[k]) for k in a if k.startswith("actor/w"))  # the policy learns
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["config"]["env"]["imitation_reward"] == "tracking"


def test_ctrl_c_stops_after_the_iteration_with_a_checkpoint(tmp_path):
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [*SMALL, "--set", "env.contact=false", "--iterations", "200", "--set", "checkpoint_every=0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bcg.learn.train", *args, "--out", str(tmp_path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = tmp_path / "log.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.is_file() or len(log.read_text().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at iteration" in err and "Traceback" not in err
    state = _checkpoint(tmp_path / "checkpoint.h5")
    assert int(state["iteration"]) == len(log.read_text().splitlines()) - 1 >= 1


def test_run_files_are_written_whole_with_ordinary_permissions_and_leftovers_are_removed(
    tmp_path, monkeypatch
):
    from collections import namedtuple

    from bcg.core.atomic import atomic_write
    from bcg.learn import runfolder, train

    (tmp_path / ".checkpoint.h5.x1y2.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / ".policy_it250.h5.a1b2.tmp").write_bytes(b"half a snapshot")
    (tmp_path / ".nan_dump_000012.h5.c3d4.tmp").write_bytes(b"half a dump")
    (tmp_path / "notes.tmp").write_text("not ours")
    (tmp_path / ".notes.txt.e5f6.tmp").write_text("not ours either")
    assert sorted(p.name for p in train.remove_stale_temporaries(tmp_path)) == [
        ".checkpoint.h5.x1y2.tmp", ".nan_dump_000012.h5.c3d4.tmp", ".policy_it250.h5.a1b2.tmp"
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.txt.e5f6.tmp", "notes.tmp"]
    (tmp_path / ".notes.txt.e5f6.tmp").unlink()

    umask = os.umask(0o022)
    try:
        atomic_write(tmp_path / "config.json", lambda p: p.write_text("{}"))
    finally:
        os.umask(umask)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o644

    def failing(p):
        p.write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / "config.json", failing)
    assert (tmp_path / "config.json").read_text() == "{}"  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "notes.tmp"]

    class Learner:
        iteration = 7

        def state_dict(self, include_replay=True):
            return {"actor": {"w0": np.zeros((1000, 1000), np.float32)}}

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(runfolder.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    messages = []
    assert train.save_checkpoint(tmp_path, Learner(), TrainConfig(), "hash", messages.append) is None
    assert "checkpoint at iteration 7 skipped: 1 MB free" in messages[0]
    Learner.actor = {"w0": np.zeros((1000, 1000), np.float32)}
    assert train.save_snapshot(tmp_path, Learner(), TrainConfig(), "hash", messages.append) is None
    assert "policy snapshot policy_it7.h5 skipped: 1 MB free" in messages[1]
    assert not list(tmp_path.glob("policy_it*"))
    assert not (tmp_path / "checkpoint.h5").exists()
    monkeypatch.undo()
    assert train.save_checkpoint(tmp_path, Learner(), TrainConfig(), "hash", messages.append).is_file()
    good = (tmp_path / "checkpoint.h5").read_bytes()

    class Diverged(Learner):  # a parameter turned NaN: a resume would refuse this checkpoint
        def state_dict(self, include_replay=True):
            return {"actor": {"w0": np.full((2, 2), np.nan, np.float32)}, "env": {"x": np.array([np.nan])}}

    assert train.save_checkpoint(tmp_path, Diverged(), TrainConfig(), "hash", messages.append) is None
    assert "skipped: actor/w0 hold non-finite values (the previous checkpoint is kept)" in messages[-1]
    assert (tmp_path / "checkpoint.h5").read_bytes() == good

    def broken_write(path, write, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runfolder, "atomic_write", broken_write)
    assert train.save_checkpoint(tmp_path, Learner(), TrainConfig(), "hash", messages.append) is None
    assert "not written: [Errno 28] No space left on device" in messages[-1]
    assert (tmp_path / "checkpoint.h5").read_bytes() == good


def test_progress_rate_and_eta_leave_out_the_first_iteration_which_compiles():
    import io

    from bcg.learn.train import Progress

    times = iter([0.0, 60.0, 70.0, 80.0])  # start; a 60 s first iteration (compiling), then 10 s each
    out = io.StringIO()
    progress = Progress(0, 10, stream=out, clock=lambda: next(times))
    for i in (1, 2, 3):
        progress.update(i, {"episode_return": 1.0, "tracking_error_cm": 2.0})
    lines = out.getvalue().splitlines()
    assert "0.017 it/s" in lines[0] and "(rate includes compiling)" in lines[0]
    assert "0.100 it/s ETA 1m20s" in lines[1] and "compiling" not in lines[1]
    assert "0.100 it/s ETA 1m10s" in lines[2]


def test_an_unusable_or_too_short_clip_is_refused_before_the_run_folder(tmp_path, capsys):
    """Velocities that do not follow from the positions (here: all zero), or a clip shorter than an
    episode's first steps: refused with the reason, before any folder or kernel exists."""
    from bcg.learn.train import main
    from bcg.motion import MotionClip

    shipped = MotionClip.load("jump").path
    still = tmp_path / "still.h5"
    shutil.copyfile(shipped, still)
    with h5py.File(still, "r+") as f:
        f["joint_vel"][...] = 0.0
    short = tmp_path / "short.h5"
    shutil.copyfile(shipped, short)
    with h5py.File(short, "r+") as f:
        for name in [n for n in f if n not in ("joint_names", "body_names")]:
            data = f[name][:4]
            del f[name]
            f[name] = data
        f.attrs["source_frame_end"] = f.attrs["source_frame_start"] + 4
        f.attrs["fps"] = 1000.0
    for clip, reason in ((still, "velocities"), (short, "an episode needs at least")):
        out = tmp_path / f"run_{clip.stem}"
        assert main(["--motion", str(clip), "--iterations", "1", "--envs", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err, err
        assert not out.exists()
