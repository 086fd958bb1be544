"""Policy file: round trip, inference against a hand-written reference, refusal of bad files."""

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from bcg.core import g1
from bcg.learn import policy as P
from bcg.learn.actor import ActorConfig, actor_init, actor_mean
from bcg.learn.normalizer import RunningMeanStd
from bcg.learn.observation import OBSERVATION_SIZE
from bcg.learn.policy_checks import read_file
from bcg.motion import MotionClip
from bcg.motion.errors import MotionFileError

CONFIG = {"shac": {"num_envs": 64, "horizon": 32}, "actor": {"hidden": [64, 32]}, "seed": 3}


def trained_like(rng, squash=False):
    """Small actor with a non-trivial output layer and a normaliser fed with data."""
    cfg = ActorConfig(hidden=(64, 32), squash=squash)
    params = actor_init(cfg, OBSERVATION_SIZE, g1.NUM_JOINTS, rng)
    params["w_out"] = rng.normal(scale=0.3, size=params["w_out"].shape).astype(np.float32)
    params["ln_gain0"] = rng.uniform(0.5, 1.5, size=params["ln_gain0"].shape).astype(np.float32)
    rms = RunningMeanStd.new(OBSERVATION_SIZE)
    rms.update(rng.normal(loc=2.0, scale=3.0, size=(100, OBSERVATION_SIZE)))
    return cfg, params, rms


@pytest.fixture()
def saved(tmp_path):
    rng = np.random.default_rng(0)
    cfg, params, rms = trained_like(rng)
    path = P.save_policy(
        tmp_path / "policy.h5",
        actor_config=cfg,
        actor_params=params,
        normalizer=rms,
        motion_name="run",
        motion_hash="f" * 64,
        config=CONFIG,
        kappa=50.0,
    )
    return path, cfg, params, rms


def reference_act(params, rms, obs, squash=False):
    """Hand-written float64 inference: normalise, [Linear, LayerNorm, ELU] x n, Linear."""
    x = (obs - rms.mean) / np.sqrt(rms.var + rms.eps)
    i = 0
    while f"w{i}" in params:
        z = x @ params[f"w{i}"].astype(np.float64) + params[f"b{i}"]
        z = (z - z.mean(axis=1, keepdims=True)) / np.sqrt(z.var(axis=1, keepdims=True) + 1e-5)
        z = z * params[f"ln_gain{i}"] + params[f"ln_bias{i}"]
        x = np.where(z > 0, z, np.exp(np.minimum(z, 0)) - 1)
        i += 1
    y = x @ params["w_out"].astype(np.float64) + params["b_out"]
    return np.tanh(y) if squash else y


def test_round_trip_act_and_metadata(saved):
    path, cfg, params, rms = saved
    obs = np.random.default_rng(1).normal(loc=2.0, scale=3.0, size=(5, OBSERVATION_SIZE))
    policy = P.load_policy(path)
    before = reference_act(params, rms, obs)
    after = policy.act(obs)
    assert after.shape == (5, 29)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)
    assert np.abs(before).max() > 0.1  # a non-trivial output
    # the training code's own inference before saving gives the same numbers bit for bit
    np.testing.assert_array_equal(after, actor_mean(cfg, params, rms.normalize(obs, dtype=np.float32)))
    np.testing.assert_allclose(policy.act(obs[0]), after[0], rtol=1e-5, atol=1e-5)
    for name, value in params.items():
        np.testing.assert_array_equal(policy.params[name], value)
        assert policy.params[name].dtype == value.dtype
    np.testing.assert_array_equal(policy.normalizer.mean, rms.mean)
    np.testing.assert_array_equal(policy.normalizer.var, rms.var)
    assert policy.normalizer.count == rms.count
    assert policy.actor_config.hidden == cfg.hidden and policy.actor_config.squash is False
    assert (policy.motion_name, policy.motion_hash, policy.kappa) == ("run", "f" * 64, 50.0)
    assert policy.config == CONFIG
    assert (policy.control_dt, policy.physics_dt) == (g1.CONTROL_DT, g1.PHYSICS_DT)
    np.testing.assert_array_equal(policy.kp, g1.KP)
    np.testing.assert_array_equal(policy.targets(after), g1.DEFAULT_JOINT_POS + g1.ACTION_SCALE * after)
    with h5py.File(path) as f:
        assert tuple(f["robot/joint_names"].asstr()[()]) == g1.JOINT_NAMES
        assert f.attrs["obs_size"] == 825 and f.attrs["action_mapping"] == "default_plus_scale"
        assert list(f["observation/sizes"][()])[:7] == [1, 6, 3, 3, 174, 29, 15]
        assert f.attrs["bcg_version"] and f.attrs["git_commit"]


def test_squashed_actor_round_trip(tmp_path):
    cfg, params, rms = trained_like(np.random.default_rng(2), squash=True)
    path = P.save_policy(
        tmp_path / "p.h5", actor_config=cfg, actor_params=params, normalizer=rms, motion_name="jump",
        motion_hash="0" * 64, config=CONFIG,
    )  # fmt: skip
    obs = np.random.default_rng(3).normal(size=(3, OBSERVATION_SIZE))
    np.testing.assert_allclose(P.load_policy(path).act(obs), reference_act(params, rms, obs, True), atol=1e-4)


def test_hold_policy_holds_default_pose(tmp_path):
    path = P.make_hold_policy(tmp_path / "hold.h5", motion="run", motion_hash="a" * 64)
    policy = P.load_policy(path)
    obs = np.random.default_rng(4).normal(scale=10, size=(7, OBSERVATION_SIZE))
    np.testing.assert_array_equal(policy.act(obs), 0.0)
    np.testing.assert_array_equal(policy.targets(policy.act(obs)), np.tile(g1.DEFAULT_JOINT_POS, (7, 1)))
    assert policy.actor_config.hidden == (512, 256, 128)
    assert np.abs(policy.params["w0"]).max() > 0  # a genuine network, only its output layer is zero


def test_hold_policy_records_the_clip_hash(tmp_path):
    from bcg.motion.clip import MotionClip

    policy = P.load_policy(P.make_hold_policy(tmp_path / "hold.h5", motion="jump"))
    assert policy.motion_name == "jump"
    assert policy.motion_hash == MotionClip.load("jump").content_hash


def test_hold_policy_without_motion_file(tmp_path):
    with pytest.raises(MotionFileError):
        P.make_hold_policy(tmp_path / "hold.h5", motion="no_such_motion")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# Refusals


def tampered(path, tmp_path, edit):
    out = tmp_path / "tampered.h5"
    shutil.copy(path, out)
    with h5py.File(out, "a") as f:
        edit(f)
    return out


def test_truncated_file(saved, tmp_path):
    path = saved[0]
    data = path.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(P.PolicyFileError, match="corrupt or truncated"):
        P.load_policy(cut)
    cut.write_bytes(b"")
    with pytest.raises(P.PolicyFileError, match="not a readable HDF5"):
        P.load_policy(cut)


def test_flipped_bytes_in_weights(saved, tmp_path):
    path = saved[0]
    with h5py.File(path) as f:
        offset = f["actor/params/w0"].id.get_offset()
    assert offset is not None  # contiguous storage: the weights' bytes sit at this offset
    data = bytearray(path.read_bytes())
    data[offset + 1000] ^= 0xFF
    bad = tmp_path / "flipped.h5"
    bad.write_bytes(bytes(data))
    with pytest.raises(P.PolicyFileError, match="checksum mismatch"):
        P.load_policy(bad)


def test_missing_file(tmp_path):
    with pytest.raises(P.PolicyFileError, match="no such policy file"):
        P.load_policy(tmp_path / "absent.h5")


def set_attr(name, value):
    def edit(f):
        f.attrs[name] = value

    return edit


def delete(name):
    def edit(f):
        del f[name]

    return edit


def replace(name, value):
    def edit(f):
        del f[name]
        if isinstance(value, list):
            f.create_dataset(name, data=value, dtype=h5py.string_dtype())
        else:
            f[name] = value

    return edit


def set_entry(name, index, value):
    def edit(f):
        f[name][index] = value

    return edit


def resigned(edit):
    """``edit``, then a checksum that matches: what a buggy writer, not a damaged disk, would make."""

    def both(f):
        edit(f)
        flat, attrs, actor_attrs = read_file("resigned", f)
        f.attrs["content_sha256"] = P._digest(flat, attrs, actor_attrs)

    return both


SHUFFLED = list(g1.JOINT_NAMES)
SHUFFLED[3], SHUFFLED[4] = SHUFFLED[4], SHUFFLED[3]
LAYOUT_849 = [1, 6, 3, 3, 180] + [29, 15] + [3, 6, 180, 15] * 3

TAMPERING = {
    "missing kp": (delete("robot/kp"), "missing dataset 'robot/kp'"),
    "missing normaliser": (delete("normalizer/var"), "missing dataset 'normalizer/var'"),
    "missing output layer": (delete("actor/params/w_out"), "missing dataset 'actor/params/w_out'"),
    "missing layer norm": (delete("actor/params/ln_gain1"), "missing dataset 'actor/params/ln_gain1'"),
    "missing layout": (delete("observation/sizes"), "missing dataset 'observation/sizes'"),
    "missing attribute": (lambda f: f.attrs.__delitem__("motion_hash"), "missing attribute.*motion_hash"),
    "shuffled joints": (
        replace("robot/joint_names", SHUFFLED),
        "joint names order differs.*position 3 is 'left_ankle_pitch_joint'",
    ),
    "obs size": (set_attr("obs_size", 849), "observation size 849"),
    "first layer": (
        replace("actor/params/w0", np.zeros((849, 64), np.float32)),
        r"actor/params/w0 has shape \(849, 64\), expected \(825, 64\)",
    ),
    "layout": (replace("observation/sizes", np.array(LAYOUT_849)), "observation layout"),
    "control dt": (set_attr("control_dt", 0.01), "control_dt is 0.01 s"),
    "physics dt": (set_attr("physics_dt", 0.002), "physics_dt is 0.002 s"),
    "gain": (set_entry("robot/kp", 5, 1.0), "robot/kp of left_ankle_roll_joint"),
    "mapping": (set_attr("action_mapping", "tanh_scaled"), "action mapping 'tanh_scaled'"),
    "format version": (set_attr("format_version", 99), "format version 99"),
    "foreign format": (set_attr("format", "other"), "not a bcg policy file"),
    # wrong types and shapes: refused with a message, never a traceback
    "gains as text": (replace("robot/kp", ["a"] * 29), "'robot/kp' holds text, numbers were expected"),
    "weights as text": (replace("actor/params/w_out", ["a"]), "'actor/params/w_out' holds text"),
    "hidden sizes a scalar": (replace("actor/hidden", np.int64(64)), "actor/hidden must be a list of widths"),
    "normaliser count an array": (replace("normalizer/count", np.ones(3)), "malformed policy file"),
    "layout 2-d": (replace("observation/sizes", np.zeros((2, 2), np.int64)), "malformed policy file"),
    "control dt as text": (set_attr("control_dt", "abc"), "control_dt must be a finite number, got 'abc'"),
    # found by fuzzing: each was accepted (or ended in a traceback or a memory blow-up) before
    "control dt nan": (set_attr("control_dt", np.nan), "control_dt must be a finite number, got nan"),
    "physics dt nan": (set_attr("physics_dt", np.nan), "physics_dt must be a finite number"),
    "huge declared dataset": (
        lambda f: f.create_dataset("junk", shape=(10**9, 29), dtype=np.float32, chunks=(1, 29)),
        r"'junk' declares shape \(1000000000, 29\)",
    ),
    "huge hidden width": (replace("actor/hidden", np.array([10**7, 32])), "widths must be within 1-16384"),
    "fractional hidden width": (replace("actor/hidden", np.array([64.5, 32.0])), "must be an integer"),
    "integer weights": (replace("actor/params/w_out", np.zeros((32, 29), np.int32)), "float32 or float64"),
    "half-precision weights": (
        replace("actor/params/w_out", np.zeros((32, 29), np.float16)),
        "float32 or float64",
    ),
    "mixed weight dtypes": (replace("actor/params/w_out", np.zeros((32, 29), np.float64)), "mix dtypes"),
    "overflowing weights": (
        resigned(replace("actor/params/w_out", np.full((32, 29), 3e38, np.float32))),
        "action is not finite",
    ),
    "deep config": (set_attr("config_json", "[" * 100000 + "]" * 100000), "unreadable config_json"),
    "config not an object": (set_attr("config_json", "[1, 2]"), "must hold a JSON object, got list"),
    "kappa nan": (set_attr("kappa", np.nan), "kappa must be a finite number"),
    "kappa negative": (set_attr("kappa", -300.0), "kappa must be positive"),
    "squash as text": (lambda f: f["actor"].attrs.__setitem__("squash", "no"), "squash must be a boolean"),
    "eps infinite": (replace("normalizer/eps", np.float64(np.inf)), "eps within"),
    "count nan": (replace("normalizer/count", np.float64(np.nan)), "count must be finite"),
    "noise nan": (set_entry("observation/noise", 0, np.nan), "observation/noise must be finite"),
    # the actor group's attributes are under the checksum: squashing would change every action
    "squash flipped": (lambda f: f["actor"].attrs.__setitem__("squash", True), "checksum mismatch"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_refuses_tampered_file(saved, tmp_path, case):
    edit, message = TAMPERING[case]
    with pytest.raises(P.PolicyFileError, match=message):
        P.load_policy(tampered(saved[0], tmp_path, edit))
    with pytest.raises(P.PolicyFileError, match="is a folder"):
        P.load_policy(tmp_path)


def test_refuses_foreign_hdf5(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(P.PolicyFileError, match="missing attribute"):
        P.load_policy(foreign)


def test_model_with_other_bodies(saved):
    spec = g1.build_spec(floor=False, collisions="none")
    spec.body("torso_link").add_body(name="camera_mount")
    with pytest.raises(
        P.PolicyFileError, match=r"body names do not match.*extra \[\], missing \['camera_mount'\]"
    ):
        P.load_policy(saved[0], model=spec.compile())


# ---------------------------------------------------------------------------------------------------
# Atomic writes


def test_failed_save_leaves_nothing(tmp_path):
    cfg, params, rms = trained_like(np.random.default_rng(5))
    target = tmp_path / "policy.h5"
    bad = dict(params, w0=np.zeros((849, 64), np.float32))
    with pytest.raises(P.PolicyFileError, match="not saved.*w0 has shape"):
        P.save_policy(target, actor_config=cfg, actor_params=bad, normalizer=rms, motion_name="run",
                      motion_hash="0", config=CONFIG)  # fmt: skip
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(P.PolicyFileError, match="JSON"):
        P.save_policy(target, actor_config=cfg, actor_params=params, normalizer=rms, motion_name="run",
                      motion_hash="0", config={"f": object()})  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_previous_file(saved):
    path, cfg, params, rms = saved
    before = path.read_bytes()
    nan = dict(params, b_out=np.full_like(params["b_out"], np.nan))
    with pytest.raises(P.PolicyFileError, match="non-finite"):
        P.save_policy(path, actor_config=cfg, actor_params=nan, normalizer=rms, motion_name="run",
                      motion_hash="0", config=CONFIG)  # fmt: skip
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.h5"]


# ---------------------------------------------------------------------------------------------------
# Command line


def test_cli(tmp_path, capsys):
    assert P.main(["hold", str(tmp_path / "h.h5"), "--motion-hash", "b" * 64]) == 0
    assert "hidden [512, 256, 128]" in capsys.readouterr().out
    assert P.main(["show", str(tmp_path / "h.h5")]) == 0
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    assert P.main(["show", str(tmp_path / "junk.h5")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "junk.h5" in err and "Traceback" not in err


def test_format_version_1_files_still_load(saved, tmp_path):
    """Version 1 files, whose checksum did not cover the actor group's attributes, still load."""
    path = saved[0]

    def as_version_1(f):
        f.attrs["format_version"] = 1
        flat, attrs, _ = read_file(path, f)
        f.attrs["content_sha256"] = P._digest(flat, attrs)

    old = tampered(path, tmp_path, as_version_1)
    a, b = P.load_policy(path), P.load_policy(old)
    assert a.actor_config == b.actor_config and all(
        np.array_equal(a.params[k], b.params[k]) for k in a.params
    )


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "policies").glob("*.h5"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_policies_load_and_match_their_name_and_summary(path):
    """Each policy under policies/ loads, was trained on the motion and κ its name gives, against
    the clip shipped now, and has its summary (command, commit, iterations) beside it."""
    policy = P.load_policy(path)
    motion, kappa = path.stem.rsplit("_k", 1)
    assert policy.motion_name == motion
    assert policy.kappa == float(kappa)
    assert policy.motion_hash == MotionClip.load(motion).content_hash
    summary = path.with_suffix(".md").read_text()
    assert policy.git_commit[:7] in summary
    assert str(policy.trained_iterations) in summary
    obs = np.zeros((2, OBSERVATION_SIZE))
    assert np.all(np.isfinite(policy.act(obs)))
