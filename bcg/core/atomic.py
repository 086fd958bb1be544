"""Atomic file output shared by every writer in the package.

A file is written into a temporary file beside its target, flushed to disk, given ordinary
permissions and renamed into place, then the folder is flushed: the target is always either the
old file or the complete new one, also after a crash or a power loss, and a failed write leaves no
temporary file behind.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

TMP_SUFFIX = ".tmp"


def temporary_name_pattern(name: str, suffix: str = TMP_SUFFIX) -> str:
    """The glob pattern of the temporary files :func:`atomic_write` makes for a target ``name``
    (``.<name>.<random><suffix>``), to find the ones a killed process left."""
    return f".{name}.*{suffix}"


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ordinary_permissions(path: str | Path) -> None:
    """Give ``path`` the permissions of a newly created file (0666 less the umask); ``mkstemp``
    creates 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write(path: str | Path, write: Callable[[Path], object], suffix: str = TMP_SUFFIX) -> Path:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then move it into place.

    Args:
        path: the target; its folder must exist.
        write: writes the complete content to the path it is given (the file exists, empty). An
            exception from it leaves ``path`` as it was and removes the temporary file.
        suffix: the temporary file's ending (writers that infer the format from it, such as
            ffmpeg, need the real one).

    Returns ``path``. Raises ``OSError`` (e.g. ``FileNotFoundError`` for a missing folder, or a
    full disk) with the target left as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        _fsync(tmp)
        ordinary_permissions(tmp)
        os.replace(tmp, path)
        try:
            _fsync(path.parent)
        except OSError as exc:  # some file systems cannot flush a folder: that alone is no error
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES):
                raise
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_figure_png(path: str | Path, fig) -> Path:
    """Lay out a matplotlib figure, write it atomically to ``path`` as a PNG and close it (also when
    the write fails, so that a long-running caller does not pile up open figures)."""
    import matplotlib.pyplot as plt  # the caller has chosen the backend (Agg) before making ``fig``

    try:
        fig.tight_layout()
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"), suffix=".png")
    finally:
        plt.close(fig)
