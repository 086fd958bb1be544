"""The one atomic-write helper every file writer in the package goes through."""

import os
import stat

import pytest

from bcg.core import atomic
from bcg.core.atomic import atomic_write, temporary_name_pattern


@pytest.fixture
def fsyncs(monkeypatch):
    """Record what is flushed to disk: regular files and folders, by path."""
    seen = []
    real = os.fsync

    def fsync(fd):
        seen.append(
            ("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file", os.readlink(f"/proc/self/fd/{fd}"))
        )
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return seen


def test_the_new_file_replaces_the_old_whole_flushed_and_with_ordinary_permissions(tmp_path, fsyncs):
    target = tmp_path / "out.json"
    target.write_text("old")
    umask = os.umask(0o027)
    try:
        assert atomic_write(target, lambda p: p.write_text("new")) == target
    finally:
        os.umask(umask)
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    kinds = [k for k, _ in fsyncs]
    assert kinds == ["file", "folder"]  # the content before the rename, the folder after it
    assert fsyncs[1][1] == str(tmp_path)


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "checkpoint.h5"
    target.write_bytes(b"old checkpoint")

    def failing(p):
        p.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, failing)
    assert target.read_bytes() == b"old checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.h5"]

    with pytest.raises(KeyboardInterrupt):  # also an interrupt in the middle of writing
        atomic_write(target, lambda p: (p.write_bytes(b"half"), (_ for _ in ()).throw(KeyboardInterrupt())))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.h5"]


def test_temporaries_carry_the_target_name_and_the_requested_ending(tmp_path):
    seen = []
    atomic_write(tmp_path / "run.mp4", lambda p: seen.append(p.name) or p.write_bytes(b"x"), suffix=".mp4")
    atomic_write(tmp_path / "log.csv", lambda p: seen.append(p.name) or p.write_text("x"))
    assert seen[0].startswith(".run.mp4.") and seen[0].endswith(".mp4")
    assert tmp_path.joinpath(seen[1]).match(temporary_name_pattern("log.csv"))


def test_a_missing_folder_is_an_error_before_anything_is_written(tmp_path):
    called = []
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "x.h5", called.append)
    assert not called and not (tmp_path / "missing").exists()


def test_every_writer_of_the_package_goes_through_the_helper():
    """No module keeps its own temporary-file-and-rename code (they drifted apart before: some
    did not flush to disk, one left its files readable by the owner alone)."""
    from pathlib import Path

    root = Path(atomic.__file__).parents[1]  # the package, bcg/
    own = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p != Path(atomic.__file__) and any(s in p.read_text() for s in ("mkstemp", "os.replace("))
    ]
    assert own == []


def test_a_folder_that_cannot_be_flushed_is_tolerated_but_an_io_error_is_not(tmp_path, monkeypatch):
    import errno

    real = os.fsync

    def fsync_failing_on_folders(err):
        def fsync(fd):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(err, os.strerror(err))
            return real(fd)

        return fsync

    monkeypatch.setattr(atomic.os, "fsync", fsync_failing_on_folders(errno.EINVAL))
    atomic_write(tmp_path / "a.txt", lambda p: p.write_text("a"))  # the file system cannot: fine
    assert (tmp_path / "a.txt").read_text() == "a"
    monkeypatch.setattr(atomic.os, "fsync", fsync_failing_on_folders(errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        atomic_write(tmp_path / "b.txt", lambda p: p.write_text("b"))


def test_a_figure_is_written_as_png_and_closed_also_when_the_write_fails(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bcg.core.atomic import write_figure_png

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = write_figure_png(tmp_path / "f.png", fig)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not plt.fignum_exists(fig.number)
    fig2, _ = plt.subplots()
    with pytest.raises(FileNotFoundError):
        write_figure_png(tmp_path / "missing" / "f.png", fig2)
    assert not plt.fignum_exists(fig2.number) and list(tmp_path.iterdir()) == [out]
