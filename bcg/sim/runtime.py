"""Taichi start-up: architecture, precision and the persistent kernel cache, set once per process."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import taichi as ti  # noqa: E402

_STATE: dict = {}


def default_cache_dir() -> Path:
    base = os.environ.get("BCG_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bcg" / "taichi"


def init(
    arch: str = "cpu", precision: str = "float32", debug: bool = False, cache_dir: str | Path | None = None
):
    """Initialise Taichi for bcg (idempotent when called again with the same settings).

    Args:
        arch: "cpu" or "cuda". "cuda" falls back to the CPU when no CUDA device is present.
            (``ti.gpu`` is never used: its OpenGL probe can crash on machines without a GPU.)
        precision: "float32" (default) or "float64".
        debug: Taichi's debug mode (bounds checks; needed for ``ti.ad.Tape(validation=True)``).
        cache_dir: the offline kernel cache; compiled forward and reverse kernels are reused across
            processes. Defaults to ``bcg/taichi`` under ``$BCG_CACHE_DIR``, else ``$XDG_CACHE_HOME``,
            else ``~/.cache``.

    Returns the Taichi float type in use.
    """
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}")
    if arch not in ("cpu", "cuda"):
        raise ValueError(f"arch must be 'cpu' or 'cuda', got {arch!r}")
    key = (arch, precision, debug)
    if _STATE.get("key") == key:
        return _STATE["fp"]
    if "key" in _STATE:
        ti.reset()
    fp = ti.f64 if precision == "float64" else ti.f32
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    archs = [ti.cuda] if arch == "cuda" else ti.cpu
    ti.init(
        arch=archs,
        default_fp=fp,
        debug=debug,
        offline_cache=True,
        offline_cache_file_path=str(cache),
        ad_stack_size=64,
        log_level=ti.WARN,
    )
    _STATE.update(key=key, fp=fp)
    return fp


def current() -> tuple | None:
    """(arch, precision, debug) of the running Taichi runtime, or None before :func:`init`."""
    return _STATE.get("key")


def on_cpu() -> bool:
    """True when the running Taichi backend is a CPU (x64 or arm64)."""
    return ti.lang.impl.current_cfg().arch in (ti.x64, ti.arm64)
