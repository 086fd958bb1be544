"""Shared test set-up: one float64 Taichi runtime for the session, with a persistent kernel cache."""

import os

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ti64():
    """Taichi initialised on the CPU in float64 (gradient checks need it)."""
    from bcg.sim import runtime

    return runtime.init(arch="cpu", precision="float64")
