"""The container image built and run (`make image`, deploy/compose.yaml): the Compose file's
master, two workers and the simulator under `docker-compose up`, a short load through them, and
the results read from the mounted volume: every record there, the manifest naming the containers'
hosts. Needs a running docker daemon and Debian's docker-compose; skipped with the reason where
there is none. Under `make test` the image builds in the background from the suite's start
(deploy/dockerd.sh starts a daemon in CI, then deploy/image.sh): the test waits for its exit
status; run alone, it runs `make image` itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from collectors.run_folder import load_requests

REPO_ROOT = Path(__file__).resolve().parent.parent
# alone: compose up adds a bridge and veths to the host, and a Chromium test beside it would lose
# its page's requests to the network change (net::ERR_NETWORK_CHANGED)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(1200)]


def _daemon_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client (Debian's docker.io)"
    if shutil.which("docker-compose") is None:
        return "no docker-compose (Debian's docker-compose)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return "no docker daemon answers (start dockerd)"
    return None


# exit status of deploy/dockerd.sh and deploy/image.sh when it cannot be done here
CANNOT_HERE = 3
BUILD_WAIT_S = 960  # a new machine: apt-get, debootstrap, packages, niced beside the suite


def _built_in_background(prefix: str) -> None:
    """Waits for the background build `make test` started (PREFIX.rc: its exit status, PREFIX.log:
    its output); skips with its reason where no daemon can be had."""
    rc_file, log_file = Path(prefix + ".rc"), Path(prefix + ".log")
    deadline = time.monotonic() + BUILD_WAIT_S
    while not rc_file.exists():
        assert time.monotonic() < deadline, f"no image after {BUILD_WAIT_S} s: {log_file}"
        time.sleep(1)
    rc = int(rc_file.read_text())
    log = log_file.read_text() if log_file.exists() else ""
    print(log[-2000:])
    if rc == CANNOT_HERE:
        pytest.skip((log.strip().splitlines() or [f"no image could be built here: {log_file}"])[-1])
    assert rc == 0, log[-4000:]


def test_compose_up_runs_the_load_and_the_volume_holds_every_record(tmp_path: Path) -> None:
    background = os.environ.get("SWARMLOAD_IMAGE_BUILD")
    if background:
        _built_in_background(background)
    problem = _daemon_problem()
    if problem:
        pytest.skip(problem)
    if not background:
        built = subprocess.run(["make", "image"], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=900)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # the image's user (uid 10001) writes there
    override = tmp_path / "override.yaml"
    override.write_text("services:\n  master:\n    volumes:\n"
                        f"      - {results}:/results\n")
    # Debian's docker-compose (1.29) predates the spec's top-level `name` (the project is -p)
    spec = yaml.safe_load((REPO_ROOT / "deploy/compose.yaml").read_text())
    spec.pop("name", None)
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(yaml.safe_dump(spec))
    project = f"swarmload-test-{os.getpid()}"
    env = {**os.environ, "SWARMLOAD_TOKEN": "compose-test-token-0123456789", "WORKERS": "2",
           "USERS": "8", "DURATION": "10", "SWARMLOAD_IMAGE": "swarmload:latest"}
    compose = ["docker-compose", "-p", project, "--project-directory", str(REPO_ROOT / "deploy"),
               "-f", str(compose_file), "-f", str(override), "--profile", "sim"]
    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)

    started = time.monotonic()
    up_s = ran_s = 0.0
    try:
        up = run("up", "-d", "--no-build", "--scale", "worker=2")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        master_id = run("ps", "-q", "master").stdout.strip()
        up_s = time.monotonic() - started
        # the master runs the load and exits (the workers quit when it tells them)
        waited = subprocess.run(["docker", "wait", master_id], capture_output=True, text=True,
                                timeout=300)
        ran_s = time.monotonic() - started - up_s
        logs = run("logs", "--no-color")
        (tmp_path / "compose.log").write_text(logs.stdout + logs.stderr)
        print(logs.stdout[-2500:])
        assert waited.stdout.strip() == "0", logs.stdout[-4000:]
    finally:
        # -t 1: the simulator (PID 1 in its container) is not told to stop twice
        down_from = time.monotonic()
        subprocess.run([*compose, "down", "-v", "-t", "1"], cwd=REPO_ROOT, env=env,
                       capture_output=True, timeout=180)
        print(f"compose: up {up_s:.0f} s, master ran {ran_s:.0f} s, "
              f"down {time.monotonic() - down_from:.0f} s")
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    recorder = manifest["recorder"]
    requests = load_requests(run_dir)
    assert len(requests) == recorder["records_written"] > 20
    assert (requests["outcome"].isin(["ok", "cancelled"])).all()
    worker_hosts = {h["host"] for h in manifest["hosts"] if h.get("role") == "worker"}
    assert len(worker_hosts) == 2  # two containers, each its own host
    assert {w.split(":")[0] for w in requests["worker_id"]} == worker_hosts
    print(f"compose: {len(requests)} records from {sorted(worker_hosts)}; "
          f"{(requests['outcome'] == 'ok').sum()} ok")
