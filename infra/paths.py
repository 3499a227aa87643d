"""Where swarmload's own files are, in a source checkout and when installed as a package.

- :data:`PACKAGE_ROOT`: the folder holding the top-level packages (a checkout's root, or
  ``site-packages``). The processes a run starts work there, so that ``python -m collectors...``
  imports the same code as the process that started it, whatever folder the user is in.
- :data:`CHECKOUT`: whether that folder is a source checkout (``pyproject.toml`` beside the
  packages), where ``make`` keeps ``.cache/`` and ``.venv-vllm/``.
- :data:`CACHE_DIR`: what is made once and kept (the tiny model, server logs):
  ``$SWARMLOAD_CACHE_DIR``, else a checkout's ``.cache/``, else ``$XDG_CACHE_HOME/swarmload``
  (``~/.cache/swarmload``); never inside ``site-packages``.

Files the package itself reads (the locustfile, the dashboard app, example studies) are package
data, found with ``importlib.resources`` where they are used, not through these paths.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = (PACKAGE_ROOT / "pyproject.toml").is_file()
CACHE_ENV_VAR = "SWARMLOAD_CACHE_DIR"


def cache_dir() -> Path:
    """:data:`CACHE_DIR` as the environment says now."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    if CHECKOUT:
        return PACKAGE_ROOT / ".cache"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "swarmload"


CACHE_DIR = cache_dir()
