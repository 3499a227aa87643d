"""The master admits only workers that know the run's token (locustfiles/worker_auth.py): real
`swarmload master` and `swarmload worker` processes on loopback. A worker without the token, or
with another, is told so and quits; it gets no users and none of its records land; the run
goes on with the worker that has it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.run_folder import load_requests
from infra.ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "the-run-token-0123456789"


def _env(token: str | None, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SWARMLOAD_TOKEN"}
    env.update(PYTHONUNBUFFERED="1", SWARMLOAD_HOST_NAME=name)
    if token is not None:
        env["SWARMLOAD_TOKEN"] = token
    return env


def _worker(port: int, token: str | None, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "worker", "--master", f"127.0.0.1:{port}",
         "--name", name], cwd=REPO_ROOT, env=_env(token, name), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_workers_without_the_token_are_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    port = free_port()
    master_cmd = [sys.executable, "-m", "infra.cli", "master", "--workers", "1", "--bind",
                  "127.0.0.1", "--port", str(port), "--target", "sim", "--users", "4",
                  "--duration", "6", "--worker-wait", "90", "--results", str(tmp_path),
                  "--run-id", "auth", "--no-collectors", "--progress", "off"]
    # a master for workers on other hosts needs the token itself
    bare = subprocess.run(master_cmd, cwd=REPO_ROOT, env=_env(None, "m"), text=True,
                          capture_output=True, timeout=60)
    assert bare.returncode == 2 and "SWARMLOAD_TOKEN" in bare.stderr, bare.stderr
    master = subprocess.Popen(master_cmd, cwd=REPO_ROOT, env=_env(TOKEN, "m"), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    intruders = []
    try:
        log = tmp_path / "auth" / "logs" / "master.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "Waiting for workers" in log.read_text()):
            if master.poll() is not None or time.monotonic() > deadline:
                master.kill()
                pytest.fail(f"the master never waited for workers (rc {master.wait(10)}):\n"
                            f"{master.communicate()[0]}")
            time.sleep(0.2)
        intruders = [_worker(port, None, "intruder-none"),
                     _worker(port, "a-token-of-another-run", "intruder-wrong")]
        outs = [p.communicate(timeout=60)[0] for p in intruders]
        assert [p.returncode for p in intruders] == [3, 3], outs
        assert "refused this worker: no token" in outs[0]
        assert "refused this worker: a wrong token" in outs[1]
        assert master.poll() is None  # the run waits on, unharmed
        good = _worker(port, TOKEN, "loadgen-ok")
        master_out = master.communicate(timeout=120)[0]
        assert master.returncode == 0, master_out
        assert good.wait(30) == 0
    finally:
        for proc in [master, *intruders]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    run_dir = tmp_path / "auth"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    requests = load_requests(run_dir, ["worker_id", "outcome"])
    hosts = {w.split(":")[0] for w in requests["worker_id"]}
    assert hosts == {"loadgen-ok"} and (requests["outcome"] == "ok").sum() > 10
    text = (run_dir / "logs" / "master.log").read_text()
    assert text.count("refused worker") == 2
    assert TOKEN not in "".join(p.read_text(errors="replace") for p in run_dir.rglob("*")
                                if p.is_file() and p.suffix in (".json", ".log", ".txt"))
