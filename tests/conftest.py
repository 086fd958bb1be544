"""Shared test set-up: one float64 Taichi runtime for the session, with a persistent kernel cache."""

import os

os.environ.setdefault("TI_SKIP_VERSION_CHECK", "ON")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ti64():
    """Taichi initialised in float64 (gradient checks need it), on the CPU unless ``BCG_TEST_ARCH=cuda``.

    ``BCG_TEST_ARCH=cuda pytest tests/test_sim_gradients.py tests/test_sim_contact.py`` runs the
    gradient checks on a CUDA device (Taichi falls back to the CPU where there is none).
    """
    from bcg.sim import runtime

    return runtime.init(arch=os.environ.get("BCG_TEST_ARCH", "cpu"), precision="float64")
