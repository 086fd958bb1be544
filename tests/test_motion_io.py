"""Motion clip files: import round trip, forward kinematics, broken files and the command line."""

import re
import subprocess
import sys

import h5py
import mujoco
import numpy as np
import pytest

from bcg.core import g1
from bcg.motion import MotionClip, MotionFileError, io, lafan, synthetic
from bcg.motion.__main__ import main
from bcg.motion.importer import import_csv

NUM_FRAMES = 40


@pytest.fixture(scope="module")
def model():
    return g1.load_model(collisions="none", floor=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory, model):
    """A synthetic CSV and the clip imported from it (whole take)."""
    folder = tmp_path_factory.mktemp("motion")
    csv = folder / "synthetic.csv"
    synthetic.write_synthetic_csv(csv, NUM_FRAMES, g1.joint_limits(model))
    clip_path = folder / "synthetic.h5"
    import_csv(csv, clip_path, model=model)
    return csv, clip_path


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def test_round_trip_is_exact(source, model):
    csv, clip_path = source
    raw = np.loadtxt(csv, delimiter=",")  # independent reader of the CSV
    clip = MotionClip.load(clip_path, model)
    assert np.array_equal(clip.frames.root_pos, raw[:, 0:3])
    assert np.array_equal(clip.frames.root_quat, raw[:, [6, 3, 4, 5]])  # x y z w -> w x y z
    assert np.array_equal(clip.frames.joint_pos, raw[:, 7:])
    assert clip.attrs["source_sha256"] == lafan.read_csv(csv).sha256
    assert (clip.attrs["source_frame_start"], clip.attrs["source_frame_end"]) == (0, NUM_FRAMES)
    assert clip.attrs["quat_convention"] == "wxyz"
    with h5py.File(clip_path) as f:
        assert f["joint_pos"].dtype == np.float64 and f["joint_pos"].compression == "gzip"


def test_window_keeps_source_frames_and_numbers(source, tmp_path, model):
    csv, _ = source
    out = tmp_path / "window.h5"
    import_csv(csv, out, start=10, end=25, model=model)
    clip = MotionClip.load(out, model)
    raw = np.loadtxt(csv, delimiter=",")
    assert clip.num_frames == 15
    assert np.array_equal(clip.frames.joint_pos, raw[10:25, 7:])
    assert clip.duration == pytest.approx(14 / 30)
    # the window's edge frames use the neighbouring source frames: same velocities as the whole take
    whole = MotionClip.load(source[1], model)
    for name in (
        "joint_vel",
        "root_lin_vel_w",
        "root_ang_vel_w",
        "root_ang_vel_b",
        "body_lin_vel_w",
        "body_pos",
    ):
        assert np.array_equal(getattr(clip.frames, name), getattr(whole.frames, name)[10:25]), name


def test_body_poses_match_mujoco_forward_kinematics(source):
    _, clip_path = source
    other = g1.load_model()  # a differently built model (floor, foot collisions): bodies found by name
    clip = MotionClip.load(clip_path, other)
    data = mujoco.MjData(other)
    qpos = clip.qpos(clip.frames)
    for t in range(0, clip.num_frames, 7):
        data.qpos[:] = qpos[t]
        mujoco.mj_kinematics(other, data)
        for b, name in enumerate(clip.body_names):
            bid = other.body(name).id
            np.testing.assert_allclose(clip.frames.body_pos[t, b], data.xpos[bid], atol=1e-6)
            # same rotation (quaternion sign is free)
            dot = abs(np.dot(clip.frames.body_quat[t, b], data.xquat[bid]))
            assert dot == pytest.approx(1.0, abs=1e-12)
        torso = other.body("torso_link").id
        expected_head = data.xpos[torso] + data.xmat[torso].reshape(3, 3) @ np.array([0.0, 0.0, 0.43])
        np.testing.assert_allclose(clip.frames.key_body_pos[t, 2], expected_head, atol=1e-9)


def test_shuffled_file_is_resolved_by_name(source, tmp_path, model):
    _, clip_path = source
    shuffled = _copy(clip_path, tmp_path / "shuffled.h5")
    rng = np.random.default_rng(3)
    joint_perm = rng.permutation(g1.NUM_JOINTS)
    with h5py.File(shuffled, "r+") as f:
        body_perm = rng.permutation(len(f["body_names"]))
        for name, perm in (("joint", joint_perm), ("body", body_perm)):
            names = [n.decode() for n in f[f"{name}_names"][()]]
            del f[f"{name}_names"]
            f.create_dataset(f"{name}_names", data=[names[i] for i in perm], dtype=h5py.string_dtype())
        for key in ("joint_pos", "joint_vel", "body_pos", "body_quat", "body_lin_vel_w"):
            value = f[key][()]
            del f[key]
            f.create_dataset(key, data=value[:, joint_perm if key.startswith("joint") else body_perm])
    original = MotionClip.load(clip_path, model)
    resolved = MotionClip.load(shuffled, model)
    assert not resolved.file_joint_order_matches and not resolved.file_body_order_matches
    assert original.file_joint_order_matches and original.file_body_order_matches
    for field in ("joint_pos", "joint_vel", "body_pos", "body_quat", "body_lin_vel_w", "key_body_pos"):
        assert np.array_equal(getattr(resolved.frames, field), getattr(original.frames, field)), field
    assert resolved.content_hash != original.content_hash  # the hash is of the file as stored


def test_content_hash_sees_one_ulp(source, tmp_path, model):
    _, clip_path = source
    datasets, _ = io.read_clip(clip_path)
    clip = MotionClip.load(clip_path, model)
    assert clip.content_hash == io.content_hash(datasets, clip.fps)
    changed = _copy(clip_path, tmp_path / "changed.h5")
    with h5py.File(changed, "r+") as f:
        f["joint_vel"][3, 4] = np.nextafter(f["joint_vel"][3, 4], np.inf)
    assert MotionClip.load(changed, model).content_hash != clip.content_hash
    faster = _copy(clip_path, tmp_path / "faster.h5")  # the same frames, played at another rate
    with h5py.File(faster, "r+") as f:
        f.attrs["fps"] = 2 * f.attrs["fps"]
    assert MotionClip.load(faster, model).content_hash != clip.content_hash


def _broken(clip_path, tmp_path, edit):
    path = _copy(clip_path, tmp_path / "broken.h5")
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def _replace(f, name, value=None, **kwargs):
    del f[name]
    f.create_dataset(name, data=value, **kwargs)


def _rename_joint(f):
    names = [n.decode() for n in f["joint_names"][()]]
    names[4] = "left_toe_joint"
    _replace(f, "joint_names", names, dtype=h5py.string_dtype())


def _nan(f):
    f["root_pos"][17, 2] = np.nan


def _zero_quat(f):
    f["root_quat"][5] = 0.0


BROKEN = {
    "missing dataset": (lambda f: f.__delitem__("body_quat"), "missing dataset(s) body_quat"),
    "unknown joint": (_rename_joint, "unknown joint name(s) left_toe_joint"),
    "nan": (_nan, "root_pos holds a non-finite value at frame 17"),
    "shape": (lambda f: _replace(f, "joint_vel", f["joint_vel"][:-1]), "joint_vel has shape (39, 29)"),
    "float32": (lambda f: _replace(f, "body_pos", f["body_pos"][()].astype(np.float32)), "float32"),
    "missing attribute": (lambda f: f.attrs.__delitem__("fps"), "missing attribute(s) fps"),
    "schema version": (lambda f: f.attrs.__setitem__("schema_version", 7), "schema version 7"),
    "zero quaternion": (_zero_quat, "root_quat holds a quaternion of norm 0 at frame 5"),
    "frame rate": (lambda f: f.attrs.__setitem__("fps", 1e7), "fps must be in [1, 1000], got 10000000.0"),
    "tiny frame rate": (lambda f: f.attrs.__setitem__("fps", 1e-300), "fps must be in [1, 1000]"),
    "boolean frame rate": (lambda f: f.attrs.__setitem__("fps", True), "attribute fps=True is not a float"),
    "fractional frame number": (
        lambda f: f.attrs.__setitem__("source_frame_start", 0.5),
        "attribute source_frame_start=0.5 is not an integer",
    ),
    "nan spike threshold": (
        lambda f: f.attrs.__setitem__("spike_threshold", np.nan),
        "spike_threshold must be",
    ),
    "group, not dataset": (
        lambda f: (f.__delitem__("joint_pos"), f.create_group("joint_pos")),
        "joint_pos must be dataset(s), not groups",
    ),
    "scalar dataset": (lambda f: _replace(f, "joint_pos", 1.0), "joint_pos has shape ()"),
    # a small file that declares a huge dataset is refused from its shape, before anything is read
    "huge declared size": (
        lambda f: _replace(f, "joint_vel", shape=(10**9, 29), dtype=np.float64, chunks=(1, 29)),
        "with at most 1000000 frames",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_file_gives_clear_error(case, source, tmp_path, capsys):
    edit, message = BROKEN[case]
    path = _broken(source[1], tmp_path, edit)
    with pytest.raises(MotionFileError, match=re.escape(message)):
        MotionClip.load(path)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_truncated_file(source, tmp_path, capsys):
    data = source[1].read_bytes()
    path = tmp_path / "truncated.h5"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(MotionFileError, match="not a readable HDF5 motion file"):
        MotionClip.load(path)
    assert main(["info", str(path)]) == 2
    assert "not a readable HDF5 motion file" in capsys.readouterr().err


def test_missing_joint_is_refused(source, tmp_path):
    def drop_last_joint(f):
        for name in ("joint_pos", "joint_vel"):
            _replace(f, name, f[name][:, :-1])
        _replace(f, "joint_names", [n.decode() for n in f["joint_names"][:-1]], dtype=h5py.string_dtype())

    path = _broken(source[1], tmp_path, drop_last_joint)
    with pytest.raises(MotionFileError, match="lacks the model's joint.*right_wrist_yaw_joint"):
        MotionClip.load(path)


def test_bad_csv_writes_nothing(source, tmp_path, capsys):
    csv, _ = source
    lines = csv.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines[:5] + [lines[5] + ",0.0"] + lines[6:]) + "\n")
    out = tmp_path / "out.h5"
    assert main(["import", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 6 has 37 columns, expected 36" in err
    assert main(["import", str(csv), "--out", str(out), "--start", "30", "--end", "90"]) == 2
    assert "outside the take's 40 frames" in capsys.readouterr().err
    nan_csv = tmp_path / "nan.csv"
    cells = lines[3].split(",")
    cells[9] = "nan"
    nan_csv.write_text("\n".join(lines[:3] + [",".join(cells)] + lines[4:]))
    assert main(["import", str(nan_csv), "--out", str(out)]) == 2
    assert "line 4 column 9 is not finite" in capsys.readouterr().err
    zero_quat = tmp_path / "zero_quat.csv"
    cells = lines[7].split(",")
    cells[3:7] = ["0", "0", "0", "0"]
    zero_quat.write_text("\n".join(lines[:7] + [",".join(cells)] + lines[8:]))
    assert main(["import", str(zero_quat), "--out", str(out)]) == 2
    assert "line 8: the root quaternion (columns 3-6) has norm 0" in capsys.readouterr().err
    huge = tmp_path / "huge.csv"  # finite, but no angle
    cells = lines[7].split(",")
    cells[9] = "1e308"
    huge.write_text("\n".join(lines[:7] + [",".join(cells)] + lines[8:]))
    assert main(["import", str(huge), "--out", str(out)]) == 2
    assert "line 8 column 9 holds 1e+308, beyond +-1000" in capsys.readouterr().err
    assert main(["import", str(csv), "--out", str(tmp_path / "noext")]) == 2
    assert "is written as .h5" in capsys.readouterr().err
    assert main(["import", str(csv), "--out", str(out), "--spike-threshold", "-1", "--fix-spikes"]) == 2
    assert "spike threshold must be a positive" in capsys.readouterr().err
    short = tmp_path / "short.csv"
    short.write_text("\n".join(lines[:2]) + "\n")
    assert main(["select", str(short), "--criterion", "speed"]) == 2
    assert "2 frame(s), at least 3 needed" in capsys.readouterr().err
    assert main(["select", str(csv), "--criterion", "speed", "--frames", "0"]) == 2
    assert "--frames must be between 3 and" in capsys.readouterr().err
    # no clip, no temporary file
    assert sorted(tmp_path.iterdir()) == sorted([bad, nan_csv, zero_quat, huge, short])


def test_command_line_has_no_traceback(source, tmp_path):
    csv, clip_path = source
    out = tmp_path / "cli.h5"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bcg.motion",
            "import",
            str(csv),
            "--out",
            str(out),
            "--start",
            "2",
            "--end",
            "30",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "28 frames" in run.stdout
    info = subprocess.run(
        [sys.executable, "-m", "bcg.motion", "info", str(out)], capture_output=True, text=True
    )
    assert info.returncode == 0 and "frames [2, 30)" in info.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bcg.motion", "check", str(tmp_path / "none.h5")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'none.h5'}: no such motion file"


def test_failed_write_leaves_the_old_file(source, tmp_path, model):
    _, clip_path = source
    target = _copy(clip_path, tmp_path / "kept.h5")
    before = target.read_bytes()
    datasets, attrs = io.read_clip(clip_path)
    del datasets["body_quat"]
    with pytest.raises(KeyError):
        io.write_clip(target, datasets, attrs)
    assert target.read_bytes() == before
    assert sorted(tmp_path.iterdir()) == [target]  # no temporary file left behind
    with pytest.raises(MotionFileError, match="does not exist"):
        io.write_clip(tmp_path / "no" / "such.h5", datasets, attrs)


def test_scalar_time(source, model):
    clip = MotionClip.load(source[1], model)
    state = clip.sample(0.5)
    assert state.joint_pos.shape == (29,) and state.body_quat.shape == (30, 4)
    assert clip.sample_future(0.5).root_pos.shape == (3, 3)


def test_a_clip_the_reader_would_refuse_is_never_written(source, tmp_path):
    _, clip_path = source
    datasets, attrs = io.read_clip(clip_path)
    datasets["root_quat"] = datasets["root_quat"].copy()
    datasets["root_quat"][5] = 0.0
    target = _copy(clip_path, tmp_path / "kept.h5")
    before = target.read_bytes()
    with pytest.raises(MotionFileError, match="root_quat holds a quaternion of norm 0 at frame 5"):
        io.write_clip(target, datasets, attrs)
    assert target.read_bytes() == before and sorted(tmp_path.iterdir()) == [target]
