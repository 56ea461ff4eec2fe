"""Run a script of ``benchmarks/`` as a user would, for the tests of its small modes."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: int = 300) -> None:
    """Run ``benchmarks/<script>.py`` with ``args`` on one thread (``--threads 1`` and
    ``OMP_NUM_THREADS=1``) from the repository root; fail with the tail of its stderr unless
    it exits with 0."""
    command = [sys.executable, f"benchmarks/{script}.py", *args, "--threads", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
