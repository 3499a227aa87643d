"""Imports run one way between the top-level folders (import-linter, contracts in pyproject.toml).

infra above dashboards and locustfiles (which never import each other), above collectors and
workloads; nothing outside dashboards imports a Streamlit page. A broken contract names the
import chain that breaks it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_imports_follow_the_layers() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint_imports)], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout
