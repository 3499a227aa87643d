"""The run folder as files: the typed manifest and its one writer, older manifests read."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from collectors.run_folder import (
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    read_manifest,
    update_manifest,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_an_older_manifest_reads_and_keeps_what_this_version_does_not_know(tmp_path: Path) -> None:
    # written before labels, validity or live metrics existed, with a key since retired
    old = {"run_id": "r1", "status": "finished", "started_at": "2026-01-01T00:00:00.000+00:00",
           "target": {"kind": "sim"}, "retired_key": [1, 2]}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(old))
    manifest = read_manifest(tmp_path)
    assert manifest.run_id == "r1" and manifest.target == {"kind": "sim"}
    assert manifest.labels is None and manifest.extra == {"retired_key": [1, 2]}
    assert load_manifest(tmp_path) == old
    update_manifest(tmp_path, labels={"engine": "sim"})
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == {**old,
                                                                  "labels": {"engine": "sim"}}


def test_the_writer_refuses_a_key_that_is_no_field_and_writes_nothing(tmp_path: Path) -> None:
    update_manifest(tmp_path, run_id="r2", status="running")
    before = (tmp_path / MANIFEST_NAME).read_text()
    with pytest.raises(TypeError, match=r"\['statuss'\] unknown"):
        update_manifest(tmp_path, statuss="finished")
    assert (tmp_path / MANIFEST_NAME).read_text() == before


def test_a_field_set_to_none_leaves_the_file(tmp_path: Path) -> None:
    update_manifest(tmp_path, status="finished", ended_at="2026-01-01T00:00:01.000+00:00")
    update_manifest(tmp_path, status="running", ended_at=None)  # a soak segment resumes
    assert load_manifest(tmp_path) == {"status": "running"}
    assert load_manifest(tmp_path / "nowhere") == {}


def _written_keys() -> dict[str, str]:
    """Every keyword given to update_manifest in the product code -> where."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    keys: dict[str, str] = {}
    for name in files:
        if name.startswith("tests/"):
            continue
        tree = ast.parse((REPO_ROOT / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if getattr(func, "id", getattr(func, "attr", None)) == "update_manifest":
                for keyword in node.keywords:  # type: ignore[attr-defined]
                    if keyword.arg:
                        keys[keyword.arg] = f"{name}:{node.lineno}"
    return keys


def test_every_key_the_code_writes_is_a_manifest_field() -> None:
    keys = _written_keys()
    assert {"run_id", "status", "soak", "study"} <= set(keys)  # the scan finds the writers
    unknown = {k: where for k, where in keys.items() if k not in Manifest.field_names()}
    assert unknown == {}
