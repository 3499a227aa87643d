"""Write a file so that a reader sees the old version or the new one, never half of one.

Every file swarmload writes while something may read it (run manifests, the recorder's Parquet
parts, replay events, study state, roll-ups) goes through :func:`write_atomic`: the content is
written to a hidden temporary file in the same folder (``.<name>.<pid>-<thread>.tmp``; Arrow's
dataset reader skips names that start with a dot), then renamed over the target, which POSIX
makes atomic within one file system. Usage::

    write_json_atomic(run_dir / "manifest.json", manifest)
    write_atomic(out / "steps.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_path)`` on a fresh temporary file next to ``path``, then rename it to
    ``path``. The folder is created if missing; the temporary file is removed if ``write`` fails."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # one name per process and thread, so two writers never share a temporary file; not mkstemp,
    # whose 0600 mode would stick to the target
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    """``data`` as JSON (``default=str`` for dates and paths, a final newline), atomically."""
    text = json.dumps(data, indent=indent, default=str) + "\n"
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
