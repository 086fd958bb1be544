"""Running the package's commands in a child process, as a user does."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).absolute().parents[1]


def run_module(module: str, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root; output captured as text."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
