"""collectors.atomic: a failed write leaves the old file and no litter; a good one replaces it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from collectors.atomic import write_atomic, write_json_atomic


def test_json_replaces_the_file_with_ordinary_permissions(tmp_path: Path) -> None:
    path = tmp_path / "new" / "manifest.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "when": Path("/x")})
    assert json.loads(path.read_text()) == {"a": 2, "when": "/x"}
    assert os.listdir(path.parent) == ["manifest.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "steps.parquet"
    path.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["steps.parquet"]
