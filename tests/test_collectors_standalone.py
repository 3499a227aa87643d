"""``swarmload collect`` as a real subprocess: started, sampled, stopped with SIGTERM, read back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from collectors.gpu import probe_gpus

REPO = Path(__file__).resolve().parents[1]
FAKES = Path(__file__).parent / "fakes"


def _collect(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "collect", "--run-dir", str(run_dir), *args],
        cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def _wait_running(run_dir: Path, proc: subprocess.Popen, timeout_s: float = 20) -> dict:
    path = run_dir / f"telemetry-{socket.gethostname()}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            report = json.loads(path.read_text())
            if report["status"] == "running":
                return report
        if proc.poll() is not None:
            raise AssertionError(f"collect exited early: {proc.stdout.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("collect did not report running in time")


@contextlib.contextmanager
def _metrics_server(registry: CollectorRegistry) -> Iterator[int]:
    """``registry`` served as a Prometheus /metrics on a free local port (yielded)."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _lost_and_continued(run_dir: Path) -> bool:
    try:
        gpu = pd.read_parquet(run_dir / "gpu")
    except (OSError, ValueError):  # no part file yet
        return False
    if gpu.empty:
        return False
    lost = gpu[(gpu["gpu_index"] == 1) & gpu["error"].notna()]
    healthy = gpu[(gpu["gpu_index"] == 0) & gpu["error"].isna()]
    return len(lost) > 0 and (healthy["wall_ns"] > lost["wall_ns"].min()).sum() >= 3


def _scraped(run_dir: Path, sample: str, count: int) -> bool:
    """The server metrics written so far hold ``count`` scrapes of ``sample``."""
    try:
        metrics = pd.read_parquet(run_dir / "server_metrics")
    except (OSError, ValueError):  # no part file yet
        return False
    return int((metrics["sample"] == sample).sum()) >= count


def test_sigterm_stops_cleanly_with_readable_parquet(tmp_path):
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", registry=registry).set(5)
    with _metrics_server(registry) as port:
        run_dir = tmp_path / "run-42"
        # The fake NVML shadows pynvml in the child: two GPUs, the second lost 1 s after init.
        env = {"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "FAKE_NVML_GPUS": "2",
               "FAKE_NVML_LOSE": "1@1.0"}
        started = time.monotonic()
        proc = _collect(run_dir, "--gpu-interval", "0.1", "--metrics-url",
                        f"http://127.0.0.1:{port}", "--metrics-interval", "0.2",
                        "--host-interval", "0.2", "--pid", str(os.getpid()),
                        "--flush-interval", "0.5", env=env)
        try:
            report = _wait_running(run_dir, proc)
            ready_s = time.monotonic() - started
            assert report["gpu"]["available"] and len(report["gpu"]["gpus"]) == 2
            assert report["clock_at_start"]["wall_ns"] > 0 and report["run_id"] == "run-42"
            # Parts are readable while it runs: wait until GPU 1 was lost and samples went on,
            # and the server was scraped five times (on a loaded host the GPU's loss can come
            # before the fifth scrape: seen once in CI with two)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    _lost_and_continued(run_dir)
                    and _scraped(run_dir, "vllm:num_requests_running", 5)):
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            stop_started = time.monotonic()
            assert proc.wait(15) == 0, proc.stdout.read()
            stop_s = time.monotonic() - stop_started
        finally:
            if proc.poll() is None:
                proc.kill()
    assert ready_s < 15 and stop_s < 5, (ready_s, stop_s)
    report = json.loads((run_dir / f"telemetry-{socket.gethostname()}.json").read_text())
    assert report["status"] == "stopped" and report["stopped_by"] == "SIGTERM"
    gpu = pd.read_parquet(run_dir / "gpu")
    assert (gpu["run_id"] == "run-42").all()
    assert gpu[gpu["gpu_index"] == 0]["error"].isna().sum() >= 5
    assert gpu[gpu["gpu_index"] == 1]["error"].str.contains("GPU is lost").any()
    assert report["samplers"]["gpu"]["gpu_rows"] == len(gpu)
    metrics = pd.read_parquet(run_dir / "server_metrics")
    running = metrics[metrics["sample"] == "vllm:num_requests_running"]
    assert len(running) >= 5 and (running["value"] == 5).all()
    host = pd.read_parquet(run_dir / "host")
    assert set(host["selector"].dropna()) == {"self", "pid"}
    assert (host[host["selector"] == "pid"]["pid"] == os.getpid()).all()
    assert not list(run_dir.rglob(".*.tmp"))  # no half-written part left behind


def test_without_gpu_it_says_so_and_stops_after_duration(tmp_path):
    if probe_gpus()["available"]:
        pytest.skip("this machine has a GPU")
    run_dir = tmp_path / "run-nogpu"
    proc = _collect(run_dir, "--run-id", "r-1", "--host-interval", "0.2", "--duration", "1.0")
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "NVML init failed" in out
    report = json.loads((run_dir / f"telemetry-{socket.gethostname()}.json").read_text())
    assert report["gpu"]["available"] is False and report["gpu"]["reason"]
    assert report["stopped_by"] == "duration" and "gpu" not in report["samplers"]
    assert not (run_dir / "gpu").exists()
    assert (pd.read_parquet(run_dir / "host")["run_id"] == "r-1").all()


def test_sigusr1_stops_once_a_sample_after_it_shows_the_server_settled(tmp_path):
    """A run's telemetry tail: after SIGUSR1 the collector samples on while the server still
    has requests running or waiting, and stops by itself once every sampler has a sample begun
    after the signal, the last scrape showing the server idle."""
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", registry=registry)
    running.set(3)
    with _metrics_server(registry) as port:
        run_dir = tmp_path / "run"
        proc = _collect(run_dir, "--gpu-interval", "0", "--metrics-url",
                        f"http://127.0.0.1:{port}", "--metrics-interval", "0.1",
                        "--host-interval", "0.3", "--pid", str(os.getpid()))
        try:
            _wait_running(run_dir, proc)
            proc.send_signal(signal.SIGUSR1)
            signalled_ns = time.time_ns()
            time.sleep(1.0)
            assert proc.poll() is None  # requests still running: not settled
            waiting.set(2)  # first: a scrape between the two must not see an idle server
            running.set(0)
            time.sleep(1.0)
            assert proc.poll() is None  # requests waiting: not settled
            waiting.set(0)
            idle_ns = time.time_ns()
            assert proc.wait(30) == 0, proc.stdout.read()  # by itself (seconds when loaded)
        finally:
            if proc.poll() is None:
                proc.kill()
    report = json.loads((run_dir / f"telemetry-{socket.gethostname()}.json").read_text())
    assert report["stopped_by"] == "settled"
    metrics = pd.read_parquet(run_dir / "server_metrics")
    gauges = metrics[metrics["sample"].isin(["vllm:num_requests_running",
                                            "vllm:num_requests_waiting"])]
    busy = gauges.groupby("wall_ns")["value"].sum()
    assert (busy[busy.index < signalled_ns - int(0.2e9)] == 3).all()
    assert busy.iloc[-1] == 0 and busy.index[-1] >= idle_ns - int(0.2e9)
    # sampled on while requests ran, and while they waited
    assert {3.0, 2.0} <= set(busy[busy.index > signalled_ns])
    host = pd.read_parquet(run_dir / "host")
    assert host["wall_ns"].max() >= signalled_ns


def test_sigusr1_samples_at_once_not_at_the_next_tick(tmp_path):
    """After SIGUSR1 each sampler samples once at once: an idle server is seen settled then,
    not an interval later (10 s here; the 1 s of a run's host sampler cost every run up to 1 s
    before)."""
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", registry=registry).set(0)
    with _metrics_server(registry) as port:
        run_dir = tmp_path / "run"
        proc = _collect(run_dir, "--gpu-interval", "0", "--metrics-url",
                        f"http://127.0.0.1:{port}", "--metrics-interval", "10",
                        "--host-interval", "10")
        try:
            _wait_running(run_dir, proc)
            time.sleep(0.5)  # the first samples (at the start) are taken
            signalled_ns = time.time_ns()
            proc.send_signal(signal.SIGUSR1)
            assert proc.wait(30) == 0, proc.stdout.read()
            stopped_s = (time.time_ns() - signalled_ns) / 1e9
        finally:
            if proc.poll() is None:
                proc.kill()
    report = json.loads((run_dir / f"telemetry-{socket.gethostname()}.json").read_text())
    assert report["stopped_by"] == "settled"
    assert stopped_s < 5.0  # the next tick was 9.5 s away
    for table in ("server_metrics", "host"):
        stamps = sorted(set(pd.read_parquet(run_dir / table)["wall_ns"]))
        assert len(stamps) == 2 and stamps[-1] >= signalled_ns, (table, stamps)


def test_interval_zero_turns_a_sampler_off(tmp_path):
    """The collectors' effect on a busy vLLM is measured per sampler (BENCHMARKS.md): a run can
    keep NVML and drop the /metrics scrapes, so an interval of 0 must mean no scrape at all."""
    scrapes: list[float] = []
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", registry=registry).set_function(
        lambda: scrapes.append(time.monotonic()) or 1.0)
    with _metrics_server(registry) as port:
        env = {"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "FAKE_NVML_GPUS": "1"}
        proc = _collect(tmp_path / "run", "--gpu-interval", "0.1", "--metrics-url",
                        f"http://127.0.0.1:{port}", "--metrics-interval", "0",
                        "--host-interval", "0", "--flush-interval", "0.5", env=env)
        try:
            report = _wait_running(tmp_path / "run", proc)
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert report["samplers_started"] == {"gpu": True}
    assert scrapes == [] and not (tmp_path / "run" / "server_metrics").exists()
    assert len(pd.read_parquet(tmp_path / "run" / "gpu")) >= 5


def test_otlp_port_receives_a_servers_spans_into_server_requests(tmp_path):
    """`swarmload collect --otlp-port` (what `swarmload run --server-traces` starts): an OTLP/HTTP
    export posted while it runs is a row of server_requests after SIGTERM."""
    import httpx
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from infra.ports import free_port

    port = free_port()
    export = ExportTraceServiceRequest()
    span = export.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.start_time_unix_nano = "llm_request", 1_000
    attribute = span.attributes.add()
    attribute.key, attribute.value.string_value = "gen_ai.request.id", "cmpl-run-1-0"
    proc = _collect(tmp_path / "run", "--gpu-interval", "0", "--host-interval", "0",
                    "--otlp-port", str(port))
    try:
        report = _wait_running(tmp_path / "run", proc)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/traces",
                            content=export.SerializeToString(),
                            headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert report["samplers_started"] == {"server_traces": True}
    assert answer.status_code == 200
    rows = pd.read_parquet(tmp_path / "run" / "server_requests")
    assert rows["server_request_id"].tolist() == ["cmpl-run-1-0"]
    final = json.loads((tmp_path / "run" / f"telemetry-{socket.gethostname()}.json").read_text())
    assert final["samplers"]["server_traces"]["spans"] == 1
