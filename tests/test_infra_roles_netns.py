"""Master, two workers and the target on four "hosts": Linux network namespaces (needs root).

Each of ``swarmload master``, ``swarmload worker`` (twice) and the simulator runs in its own
namespace with its own address on a bridge that lives in a fifth namespace, so traffic goes only
between the namespaces this test creates, over veth pairs, as between machines on a LAN. One
worker's wall clock is skewed by ``SKEW_S`` (``SWARMLOAD_TEST_CLOCK_SKEW_S``), as a badly
synchronised machine's would be. The run replays an open-loop Poisson plan.

What a user would notice: every scheduled request has a record; the manifest gives each worker's
offset with the truth within its error bound (under 10 ms even on a loaded box); the skewed
worker still sends on schedule (uncorrected, it would send ``SKEW_S`` early), and its records
land on the master's time axis in the telemetry join.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from collectors.run_folder import load_requests, load_server_metrics
from dashboards.analysis.telemetry import clock_offsets, reference_ns, request_hosts
from infra.targets.simulator.settings import READY_LINE_PREFIX

REPO_ROOT = Path(__file__).resolve().parent.parent
SKEW_S = 0.25
SUBNET = "10.231.77"
ADDRESSES = {"master": f"{SUBNET}.1", "wa": f"{SUBNET}.2", "wb": f"{SUBNET}.3",
             "target": f"{SUBNET}.4"}
MASTER_PORT = 5557
# An exchange's offset is within half its round trip of the truth whatever the path's delays
# (clock_sync); the slack is for the wall clock read twice per exchange. A bound over
# MAX_BOUND_S would make the clock lines useless, loaded box or not.
CLOCK_SLACK_MS = 0.05
MAX_BOUND_S = 0.01
COLLECT_PORT = 9109
COLLECTOR_SKEW_S = -0.4
TARGET_PORT = 8000

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2 (CI runs as root)")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    """Five namespaces (master, wa, wb, target + the bridge's), removed whatever happens."""
    tag = f"sl{os.getpid() % 100000}"
    names = {role: f"{tag}-{role}" for role in [*ADDRESSES, "br"]}
    created: list[str] = []
    try:
        for name in names.values():
            _ip("netns", "add", name)
            created.append(name)
        bridge = names["br"]
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        for i, (role, address) in enumerate(ADDRESSES.items()):
            ns, port = names[role], f"p{i}"
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", bridge)
            _ip("-n", bridge, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def _start(ns: str, argv: list[str], log: Path, env: dict[str, str] | None = None
           ) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv], cwd=REPO_ROOT, stdout=out,
            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                        # the run's shared token, on every host
                                        "SWARMLOAD_TOKEN": "netns-run-token-0123456789",
                                        **(env or {})},
            start_new_session=True)


def _wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {log} after {timeout_s} s:\n"
                         f"{log.read_text(errors='replace')[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_two_workers_on_other_hosts_one_skewed(namespaces: dict[str, str],
                                               poisson_workload: Path, tmp_path: Path) -> None:
    py = sys.executable
    target_url = f"http://{ADDRESSES['target']}:{TARGET_PORT}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start(namespaces["target"], [
            py, "-m", "infra.cli", "sim", "--host", ADDRESSES["target"],
            "--port", str(TARGET_PORT)], tmp_path / "target.log"))
        # serving before its collector's first scrape (a refused scrape is an error row)
        _wait_for_line(tmp_path / "target.log", READY_LINE_PREFIX, 30)
        # the server's host runs its own collector, its clock COLLECTOR_SKEW_S behind
        procs.append(_start(namespaces["target"], [
            py, "-m", "infra.cli", "collect", "--serve", f"{ADDRESSES['target']}:{COLLECT_PORT}",
            "--run-dir", str(tmp_path / "remote"), "--host", "gpu-host", "--gpu-interval", "0",
            "--metrics-url", f"{target_url}/metrics", "--metrics-interval", "0.25",
            "--host-interval", "0.5"], tmp_path / "collector.log",
            env={"SWARMLOAD_TEST_CLOCK_SKEW_S": str(COLLECTOR_SKEW_S)}))
        _wait_for_line(tmp_path / "collector.log", "serving clock and files", 30)
        master = _start(namespaces["master"], [
            py, "-m", "infra.cli", "master", "--workers", "3", "--bind", ADDRESSES["master"],
            "--port", str(MASTER_PORT), "--target", target_url, "--workload",
            str(poisson_workload), "--duration", "6", "--drain", "20", "--worker-wait", "60",
            "--results", str(tmp_path / "results"), "--run-id", "netns", "--no-collectors",
            "--remote-collector", f"http://{ADDRESSES['target']}:{COLLECT_PORT}",
            "--telemetry-tail", "1"],
            tmp_path / "master.log")
        procs.append(master)
        # loadgen-b runs two worker processes (--processes), both on its skewed clock
        for role, name, skew, count in (("wa", "loadgen-a", 0.0, 1),
                                        ("wb", "loadgen-b", SKEW_S, 2)):
            procs.append(_start(namespaces[role], [
                py, "-m", "infra.cli", "worker", "--master",
                f"{ADDRESSES['master']}:{MASTER_PORT}", "--name", name,
                "--processes", str(count)],
                tmp_path / f"{role}.log", env={"SWARMLOAD_TEST_CLOCK_SKEW_S": str(skew)}))
        try:
            code = master.wait(90)
        except subprocess.TimeoutExpired:
            code = None
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                         for p in sorted(tmp_path.glob("*.log")))
        assert code == 0, logs
        # the master's printout names each skewed host's offset, the truth within its bound
        printed = {(m[1], float(m[2]), float(m[3])) for m in re.finditer(
            r"clock: (\S+) \(\w+\) ([+-][\d.]+) ms from the master's \(within ([\d.]+) ms\)",
            (tmp_path / "master.log").read_text())}
        assert {host for host, ms, bound in printed
                if abs(ms - SKEW_S * 1e3) <= bound + CLOCK_SLACK_MS} == {"loadgen-b"}, printed
        assert {host for host, ms, bound in printed
                if abs(ms - COLLECTOR_SKEW_S * 1e3) <= bound + CLOCK_SLACK_MS} == {
            "gpu-host"}, printed
    finally:
        for proc in reversed(procs):
            _stop(proc)

    run_dir = tmp_path / "results" / "netns"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished"

    # each worker's measured offset: the injected skew within the error bound the run reports
    # (half the best exchange's round trip), and that bound under MAX_BOUND_S
    clocks = sorted((c["host"], c["offset_s"], c["error_bound_s"])
                    for c in manifest["clock"].values())
    assert [host for host, *_ in clocks] == ["loadgen-a", "loadgen-b", "loadgen-b"], clocks
    for host, offset, bound in clocks:
        truth = SKEW_S if host == "loadgen-b" else 0.0
        assert abs(offset - truth) <= bound + CLOCK_SLACK_MS / 1e3 and bound < MAX_BOUND_S, clocks
    measured = {host: (offset, bound) for host, offset, bound in clocks}

    # every scheduled request present, once, answered
    events = json.loads((run_dir / "replay_events.json").read_text())
    scheduled = next(e["requests"] for e in events if e["event"] == "schedule_start")
    requests = load_requests(run_dir)
    assert scheduled > 90 and len(requests) == scheduled  # Poisson: about 20 req/s x 6 s
    assert requests["request_id"].is_unique
    assert (requests["outcome"] == "ok").all(), requests["outcome"].value_counts()
    hosts = request_hosts(requests)
    assert set(hosts) == {"loadgen-a", "loadgen-b"}

    # sends on schedule once each worker's clock is put on the master's axis
    offsets = clock_offsets(manifest)
    assert abs(offsets["loadgen-b"] - SKEW_S) < 1e-3
    sent_ref = reference_ns(requests["sent_wall_ns"], hosts, offsets)
    late_ms = (sent_ref - requests["scheduled_wall_ns"].astype("int64")).to_numpy() / 1e6
    # The worker's own lag (sent - due, both on its monotonic clock) is what a busy CI box adds;
    # on the master's wall-clock axis the lateness must be exactly that lag, to the clock
    # estimates' error: uncorrected, loadgen-b's residual would be -250 ms. A lease turns due
    # times into the worker's clock with the estimate of its moment (at worst the one the
    # worker joined with: replay_events.json), the records are corrected with the run's last:
    # each within its bound of the truth, so the residual within the two bounds.
    residual_ms = late_ms - requests["schedule_lag_s"].to_numpy() * 1e3
    joined = {e["worker"]: e["clock_error_bound_s"] for e in events
              if e["event"] == "worker_joined"}
    for host in ("loadgen-a", "loadgen-b"):
        mask = (hosts == host).to_numpy()
        mine, rest = late_ms[mask], residual_ms[mask]
        clients = [cid for cid, c in manifest["clock"].items() if c["host"] == host]
        at_join_ms = max(joined[cid] for cid in clients) * 1e3
        bound_ms = at_join_ms + measured[host][1] * 1e3 + CLOCK_SLACK_MS
        print(f"{host}: measured offset {measured[host][0] * 1e3:+.3f} ms "
              f"(within {measured[host][1] * 1e3:.3f} ms; {at_join_ms:.3f} ms when it joined), "
              f"{len(mine)} sends, corrected lateness p50 {np.median(mine):.2f} ms, "
              f"max {mine.max():.2f} ms, minus the worker's own lag: within "
              f"{np.abs(rest).max():.3f} ms of the bounds' {bound_ms:.3f} ms")
        assert np.abs(rest).max() <= bound_ms, (host, np.sort(rest)[[0, -1]], bound_ms)
        assert np.median(mine) < 10.0, (host, np.sort(mine)[-5:])

    # the server host's collector: its offset measured over HTTP, its files in the run folder,
    # its rows joined on the master's axis
    (collector,) = [h for h in manifest["hosts"] if h.get("role") == "collector"]
    assert collector["host"] == "gpu-host" and "error" not in collector, collector
    print(f"gpu-host collector: measured offset {collector['clock_offset_s'] * 1e3:+.3f} ms, "
          f"{collector['files']} files copied")
    assert (abs(collector["clock_offset_s"] - COLLECTOR_SKEW_S)
            <= collector["clock_error_bound_s"] + CLOCK_SLACK_MS / 1e3), collector
    assert collector["clock_error_bound_s"] < MAX_BOUND_S, collector
    server = load_server_metrics(run_dir)
    assert (server["host"] == "gpu-host").all() and server["error"].isna().all()
    running = server[server["sample"] == "vllm:num_requests_running"]
    ref = reference_ns(running["wall_ns"], running["host"], offsets)
    sent = sent_ref.to_numpy()
    # on the master's axis the scrapes span the load (uncorrected they sit 400 ms early)
    assert ref.min() < sent.min() and ref.max() > sent.max()
    busy = running[running["value"] > 0]
    busy_ref = reference_ns(busy["wall_ns"], busy["host"], offsets)
    # The preflight's one streamed request runs seconds before the load (a scrape may catch it):
    # judge the samples from 1 s before the first send on, which a 400 ms error would still fail.
    busy_ref = busy_ref[busy_ref > sent.min() - 1e9]
    assert len(busy_ref) and busy_ref.min() >= sent.min() - 0.05e9, (
        (busy_ref.min() - sent.min()) / 1e6)
    report = json.loads((run_dir / "telemetry-gpu-host.json").read_text())
    assert report["status"] == "stopped"
