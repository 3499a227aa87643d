"""``swarmload collect --serve`` (collectors.remote) read by the run (infra.remote_collect)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from collectors.remote import CollectorServer
from infra.remote_collect import measure_offset, pull

TOKEN = "a-shared-token-of-the-run"


@pytest.mark.alone  # the offset within 1 ms: a clean-clone run put a test beside it at 3.0 ms
def test_offset_files_and_stop_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = tmp_path / "remote"
    (remote / "server_metrics").mkdir(parents=True)
    (remote / "server_metrics" / "gpu-1-7-000000.parquet").write_bytes(b"PAR1 rows PAR1")
    (remote / "telemetry-gpu-1.json").write_text('{"status": "stopped"}')
    (remote / "secret.txt").write_text("not a run file")
    stopped: list[bool] = []
    monkeypatch.setenv("SWARMLOAD_TEST_CLOCK_SKEW_S", "1.5")
    monkeypatch.setenv("SWARMLOAD_TOKEN", TOKEN)
    server = CollectorServer(("127.0.0.1", 0), remote, "gpu-1", lambda: stopped.append(True),
                             token=TOKEN)
    server.start()
    try:
        host, estimator = measure_offset(server.url, rounds=8)
        assert host == "gpu-1" and estimator.samples == 8
        assert abs(estimator.offset_ns / 1e9 - 1.5) < 1e-3  # the skew, within 1 ms
        with pytest.raises(urllib.error.HTTPError) as missing:  # only listed run files
            urllib.request.urlopen(urllib.request.Request(
                f"{server.url}/file?path=secret.txt", headers={"Authorization": f"Bearer {TOKEN}"}),
                timeout=5)
        assert missing.value.code == 404
        run_dir = tmp_path / "run"
        copied = pull(server.url, run_dir)
        assert stopped == [True] and server.done.is_set()
        assert sorted(copied) == ["server_metrics/gpu-1-7-000000.parquet",
                                  "telemetry-gpu-1.json"]
        assert (run_dir / "server_metrics" / "gpu-1-7-000000.parquet").read_bytes() == (
            b"PAR1 rows PAR1")
    finally:
        server.close()


def _request(url: str, method: str = "GET", token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_served_collector_refuses_requests_without_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real `swarmload collect --serve`: every control and data request without the run's
    token (or with another) is answered 401 and stops nothing; the run's own requests, with the
    token, still get its clock and its files."""
    import json
    import os
    import subprocess
    import sys
    import time

    from infra.ports import free_port

    # without a token it does not serve at all
    bare = subprocess.run([sys.executable, "-m", "infra.cli", "collect", "--serve", "0",
                           "--run-dir", str(tmp_path / "x")], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items()
                                           if k != "SWARMLOAD_TOKEN"})
    assert bare.returncode == 2 and "SWARMLOAD_TOKEN" in bare.stderr
    port = free_port()
    remote = tmp_path / "remote"
    env = {**os.environ, "SWARMLOAD_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "collect", "--serve", f"127.0.0.1:{port}",
         "--run-dir", str(remote), "--host", "gpu-1", "--gpu-interval", "0",
         "--host-interval", "0.2", "--duration", "120"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        assert any("serving clock and files" in line for line in lines)
        base = f"http://127.0.0.1:{port}"
        for token in (None, "not-the-token-of-this-run"):
            for method, path in (("GET", "/clock"), ("GET", "/files"),
                                 ("GET", "/file?path=telemetry-gpu-1.json"),
                                 ("POST", "/stop"), ("POST", "/done")):
                assert _request(base + path, method, token) == 401, (path, token)
        time.sleep(0.5)
        assert proc.poll() is None  # neither /stop nor /done was done
        status = json.loads((remote / "telemetry-gpu-1.json").read_text())
        assert status["status"] == "running"
        from infra.remote_collect import RemoteCollectorError

        monkeypatch.setenv("SWARMLOAD_TOKEN", "another-token-altogether")
        with pytest.raises(RemoteCollectorError, match="SWARMLOAD_TOKEN is not the collector"):
            measure_offset(base, rounds=1)  # a run with another token is told why
        monkeypatch.setenv("SWARMLOAD_TOKEN", TOKEN)
        host, _ = measure_offset(base, rounds=2)
        copied = pull(base, tmp_path / "run")  # the run's own requests carry the token
        assert host == "gpu-1" and any(c.startswith("host/") for c in copied), copied
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
