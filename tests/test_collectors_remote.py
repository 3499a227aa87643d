"""``swarmload collect --serve`` (collectors.remote) read by the run (infra.remote_collect)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from collectors.remote import CollectorServer
from infra.remote_collect import measure_offset, pull


def test_offset_files_and_stop_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = tmp_path / "remote"
    (remote / "server_metrics").mkdir(parents=True)
    (remote / "server_metrics" / "gpu-1-7-000000.parquet").write_bytes(b"PAR1 rows PAR1")
    (remote / "telemetry-gpu-1.json").write_text('{"status": "stopped"}')
    (remote / "secret.txt").write_text("not a run file")
    stopped: list[bool] = []
    monkeypatch.setenv("SWARMLOAD_TEST_CLOCK_SKEW_S", "1.5")
    server = CollectorServer(("127.0.0.1", 0), remote, "gpu-1", lambda: stopped.append(True))
    server.start()
    try:
        host, estimator = measure_offset(server.url, rounds=8)
        assert host == "gpu-1" and estimator.samples == 8
        assert abs(estimator.offset_ns / 1e9 - 1.5) < 1e-3  # the skew, within 1 ms
        with pytest.raises(urllib.error.HTTPError):  # only listed run files are served
            urllib.request.urlopen(f"{server.url}/file?path=secret.txt", timeout=5)
        run_dir = tmp_path / "run"
        copied = pull(server.url, run_dir)
        assert stopped == [True] and server.done.is_set()
        assert sorted(copied) == ["server_metrics/gpu-1-7-000000.parquet",
                                  "telemetry-gpu-1.json"]
        assert (run_dir / "server_metrics" / "gpu-1-7-000000.parquet").read_bytes() == (
            b"PAR1 rows PAR1")
    finally:
        server.close()
