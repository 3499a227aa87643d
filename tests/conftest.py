"""Shared fixtures: the repo root and a helper to run ``swarmload`` as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_swarmload(tmp_path: Path):
    """Run ``swarmload ARGS`` in a subprocess with a hard timeout; returns CompletedProcess."""

    def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "infra.cli", *args], cwd=REPO_ROOT, text=True,
            capture_output=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    return _run
