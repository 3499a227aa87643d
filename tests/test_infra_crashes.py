"""kill -9 of the processes of a real ``swarmload run``: the manifest tells the truth (``crashed``,
which process, which signal; never ``finished``), the records stored so far stay readable, and
nothing of the run is left running 10 s later (also when ``swarmload run`` itself is killed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest

from collectors.parquet_sink import visible_part_files
from collectors.run_folder import load_manifest
from collectors.schemas import REQUEST_SCHEMA

REPO_ROOT = Path(__file__).resolve().parent.parent


def _start(results: Path) -> tuple[subprocess.Popen[str], Path, list[psutil.Process]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--users", "8", "--duration", "120", "--max-tokens", "16", "--mix", "100/0/0",
         "--results", str(results), "--telemetry-tail", "0"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = list(results.glob("*/requests/*.parquet"))
        if parts:
            run_dir = parts[0].parent.parent
            children = psutil.Process(proc.pid).children(recursive=True)
            names = " ".join(_cmd(c) for c in children)
            if "collect" in names and "--worker" in names:
                return proc, run_dir, children
        time.sleep(0.3)
    proc.kill()
    raise AssertionError("no records appeared")


def _cmd(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # a short-lived helper that is gone already
        return ""


def _child(children: list[psutil.Process], needle: str, exclude: str = "\0") -> psutil.Process:
    return next(c for c in children if needle in _cmd(c) and exclude not in _cmd(c))


def _readable(run_dir: Path) -> int:
    files = visible_part_files(run_dir / "requests")
    assert files
    return ds.dataset([str(f) for f in files], format="parquet",
                      schema=REQUEST_SCHEMA).to_table().num_rows


def _none_alive(children: list[psutil.Process], seconds: float = 10.0) -> None:
    _gone, alive = psutil.wait_procs(children, timeout=seconds)
    assert not alive, f"left running {seconds:g} s after: {[_cmd(p) for p in alive]}"


@pytest.mark.slow
def test_kill_9_of_the_collector_then_the_master_is_a_crash_told_in_the_manifest(
        tmp_path: Path) -> None:
    proc, run_dir, children = _start(tmp_path)
    try:
        _child(children, "infra.cli collect").kill()
        time.sleep(2)  # the run goes on without telemetry
        _child(children, "--master", exclude="--master-host").kill()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    _none_alive(children)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "crashed"
    crashed = {c["process"]: c["exit"] for c in manifest["crashes"]}
    assert crashed == {"collectors": "signal SIGKILL", "master": "signal SIGKILL"}, crashed
    warnings = " ".join(manifest["warnings"])
    assert "CRASHED: collectors" in warnings and "CRASHED: master" in warnings
    assert manifest["validity"]["verdict"] == "crashed"
    rows = _readable(run_dir)
    # every request a worker sent has a record: stored by the master, or written from the
    # workers' send journals as record_lost when the master died holding it
    journalled = manifest["recorder"]["reconciled"]["journalled"]
    assert rows == journalled, (rows, manifest["recorder"])
    assert "CRASHED" in out
    print(f"\nkill -9 collector + master: exit {proc.returncode}, status {manifest['status']}, "
          f"crashes {crashed}, rows readable {rows} (journalled {journalled}, reconciled "
          f"{manifest['recorder']['reconciled']}), warnings {manifest['warnings']}")


@pytest.mark.slow
def test_kill_9_of_swarmload_run_leaves_nothing_running(tmp_path: Path) -> None:
    proc, run_dir, children = _start(tmp_path)
    assert len(children) >= 5  # simulator, collector, master, 2 workers
    proc.kill()
    proc.wait(10)
    _none_alive(children)
    assert _readable(run_dir) > 0
    manifest = load_manifest(run_dir)  # nobody wrote the end: shown as crashed
    assert manifest["status"] == "crashed"
    assert manifest["crashes"][0]["process"] == "orchestrator"
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
    print(f"\nkill -9 swarmload run: {len(children)} children, none alive 10 s after; rows "
          f"readable {_readable(run_dir)}; manifest read as {manifest['status']}: "
          f"{manifest['warnings'][0]}")
