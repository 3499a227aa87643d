"""infra.targets.vllm_cpu and infra.targets.vllm_venv without vLLM: interpreter lookup, start-up
failures, stop().

A shell script stands in for the vLLM interpreter (``$SWARMLOAD_VLLM_PYTHON``), so the process
handling is exercised on real processes in a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.run_folder import load_requests
from infra.targets import vllm_venv as vllm_bench
from infra.targets.vllm_cpu import (
    VllmCpuTarget,
    VllmStartError,
    VllmVenvMissingError,
    _parse_args,
    group_members,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Stands in for vLLM's interpreter: `-m infra.targets.tiny_model` succeeds, and the server command
# serves the built-in simulator on the port, model name and length limit that vLLM was given.
SIMULATOR_STAND_IN = """
if [ "$2" = infra.targets.tiny_model ]; then exit 0; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2 ;;
    --served-model-name) model=$2 ;;
    --max-model-len) length=$2 ;;
  esac
  shift
done
exec {python} -m infra.targets.simulator --port "$port" --model "$model" --max-model-len "$length"
"""


def _fake_python(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_vllm_python_defaults_to_repo_venv_and_env_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_bench.PYTHON_ENV_VAR, raising=False)
    # in a checkout the default venv sits at the repository root (installed: the current folder)
    assert vllm_bench.vllm_python() == REPO_ROOT / ".venv-vllm" / "bin" / "python"
    assert vllm_bench.vllm_python(tmp_path / "v") == tmp_path / "v" / "bin" / "python"
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, "/opt/elsewhere/python")
    assert vllm_bench.vllm_python() == Path("/opt/elsewhere/python")


def test_missing_venv_says_how_to_make_it(monkeypatch):
    monkeypatch.delenv(vllm_bench.PYTHON_ENV_VAR, raising=False)
    target = VllmCpuTarget(venv="no-such-venv-here")
    with pytest.raises(VllmVenvMissingError, match="make vllm-venv"):
        target.start()
    assert target.pid is None


def test_server_that_exits_is_reported_with_its_log_tail(monkeypatch, tmp_path):
    fake = _fake_python(tmp_path, 'echo "line one"; echo "fatal: no such device" >&2; exit 3')
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    log = tmp_path / "server.log"
    target = VllmCpuTarget(model_dir=tmp_path, log_path=log)
    target.start()
    with pytest.raises(VllmStartError, match="code 3") as caught:
        target.wait_ready(timeout_s=20)
    assert "fatal: no such device" in str(caught.value)
    assert str(log) in str(caught.value)
    target.stop()


def test_stop_kills_a_group_that_ignores_sigterm(monkeypatch, tmp_path):
    # The leader and its child both ignore SIGTERM (ignored signals survive exec): only SIGKILL
    # of the whole group after the grace period ends them.
    fake = _fake_python(tmp_path, "trap '' TERM; sleep 120 & sleep 120; wait")
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    target = VllmCpuTarget(model_dir=tmp_path, log_path=tmp_path / "server.log")
    target.start()
    deadline = time.monotonic() + 10
    while len(group_members(target.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(target.pid)) >= 2
    started = time.monotonic()
    target.stop(grace_s=1.0)
    assert 0.9 < time.monotonic() - started < 15
    assert group_members(target.pid) == []
    target.stop()  # idempotent


def test_wait_ready_times_out_with_the_log_tail(monkeypatch, tmp_path):
    fake = _fake_python(tmp_path, 'echo "still loading weights"; exec sleep 60')
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    target = VllmCpuTarget(model_dir=tmp_path, log_path=tmp_path / "server.log")
    target.start()
    try:
        with pytest.raises(VllmStartError, match="not ready after 2 s") as caught:
            target.wait_ready(timeout_s=2)
        assert "still loading weights" in str(caught.value)
    finally:
        target.stop(grace_s=5)
    assert group_members(target.pid) == []


def test_context_manager_stops_the_server_when_start_up_fails(monkeypatch, tmp_path):
    fake = _fake_python(tmp_path, 'sleep 1 & echo "bad flag"; exit 2')
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    target = VllmCpuTarget(model_dir=tmp_path, log_path=tmp_path / "server.log")
    with pytest.raises(VllmStartError, match="bad flag"):
        with target:
            pytest.fail("must not be entered")  # pragma: no cover
    assert group_members(target.pid) == []


def test_port_in_use_is_refused_before_launch(monkeypatch, tmp_path):
    fake = _fake_python(tmp_path, "exit 0")
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        target = VllmCpuTarget(model_dir=tmp_path, port=port)
        with pytest.raises(VllmStartError, match=f"port {port}"):
            target.start()
    assert target.pid is None


def test_launch_args_use_dummy_weights_only_for_the_tiny_model(monkeypatch, tmp_path):
    fake = _fake_python(tmp_path, "exec sleep 30")
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    target = VllmCpuTarget(model_dir=tmp_path, max_model_len=512, extra_args=["--seed", "7"],
                           log_path=tmp_path / "server.log")
    target.start()
    try:
        args = target.launch_args
        assert args[args.index("--max-model-len") + 1] == "512"
        assert args[args.index("--model") + 1] == str(tmp_path.resolve())
        assert "--load-format" not in args
        assert args[-2:] == ["--seed", "7"]
        assert target.base_url.startswith("http://127.0.0.1:")
        assert target.model_name == tmp_path.name
    finally:
        target.stop(grace_s=5)


def test_cli_args_after_double_dash_go_to_vllm():
    args, extra = _parse_args(["--port", "9001", "--max-model-len", "4096", "--", "--seed", "1"])
    assert (args.port, args.max_model_len, extra) == (9001, 4096, ["--seed", "1"])


def test_run_with_target_vllm_cpu_serves_through_its_own_server_and_stops_it(tmp_path):
    # The real-vLLM end-to-end test shares the session's server through a URL; this one keeps
    # `swarmload run --target vllm-cpu` itself covered: start, wait ready, record, stop.
    fake = _fake_python(tmp_path, SIMULATOR_STAND_IN.format(python=sys.executable))
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "vllm-cpu",
         "--target-arg=--seed=7", "--workers", "1", "--users", "2", "--duration", "3",
         "--max-tokens", "4", "--no-collectors", "--results", str(results)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, vllm_bench.PYTHON_ENV_VAR: str(fake), "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    target = manifest["target"]
    assert target["kind"] == "vllm-cpu" and target["model"] == "swarmload-tiny-llama"
    assert target["launch_args"][-1] == "--seed=7"  # --target-arg reaches the server
    assert target["pid"] and group_members(target["pid"]) == []  # the run stopped it
    records = load_requests(run_dir)
    assert (records["outcome"] == "ok").sum() > 0


def test_traces_endpoint_reaches_vllm_as_flag_and_otlp_http_settings(monkeypatch, tmp_path):
    from infra.orchestrate import _server_traces_listen
    from locustfiles.config import RunConfig

    fake = _fake_python(tmp_path, "exec sleep 30")
    monkeypatch.setenv(vllm_bench.PYTHON_ENV_VAR, str(fake))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    endpoint = "http://127.0.0.1:4999/v1/traces"
    target = VllmCpuTarget(model_dir=tmp_path, traces_endpoint=endpoint,
                           log_path=tmp_path / "server.log")
    target.start()
    try:
        args = target.launch_args
        assert args[args.index("--otlp-traces-endpoint") + 1] == endpoint
        # vLLM exports gRPC unless told; the receiver speaks OTLP/HTTP (recorded for the manifest)
        assert target.launch_env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    finally:
        target.stop(grace_s=5)
    # swarmload run: a free port for a vLLM it starts, 4318 for one given by URL
    launched = _server_traces_listen(RunConfig(target="vllm-cpu", server_traces=True))
    given = _server_traces_listen(RunConfig(target="http://10.0.0.2:8000", server_traces=True))
    assert launched["launched"] and launched["port"] != 4318 and launched["wait_s"] == 1.5
    assert (given["port"], given["wait_s"], given["launched"]) == (4318, 6.0, False)
    assert _server_traces_listen(RunConfig(target="vllm-cpu")) is None
