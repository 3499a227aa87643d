"""``swarmload collect``: the telemetry samplers as one process, for a host where no Locust runs.

    swarmload collect --run-dir results/RUN [--run-id ID] [--gpu-interval 1.0]
        [--metrics-url URL] [--metrics-interval 0.5] [--metrics-include PREFIX ...]
        [--host-interval 1.0] [--pid PID ...] [--process-name REGEX ...] [--children-of PID ...]
        [--otlp-port PORT [--otlp-host HOST]] [--duration S]

Samples until SIGTERM/SIGINT or ``--duration`` seconds, stops every sampler (which flushes its
Parquet), and exits 0. SIGUSR1 (a run whose load has stopped: its telemetry tail) stops it as
soon as every sampler has stored a sample begun after the signal that shows the server settled
(no request running or waiting on any ``/metrics``); the run sends SIGTERM if that takes longer
than its ``--telemetry-tail``. Tables: ``<run_dir>/gpu``, ``gpu_processes``, ``server_metrics``,
``host``, and with ``--otlp-port`` ``server_requests`` (the server's own per-request
spans, OTLP/HTTP: ``collectors.otlp_traces``).
An interval of 0 turns that sampler off; no GPU is not an error (the probe says why).

``<run_dir>/telemetry-<host>.json`` is written at start (``status: "running"``, so a launcher can
wait for it) and again at exit: the GPU probe, this host's wall clock read next to its monotonic
clock at start (for clock-offset estimates), and each sampler's counts and own CPU cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collectors.atomic import write_json_atomic
from collectors.auth import token_from_env, token_problem
from collectors.gpu import GpuSampler, probe_gpus
from collectors.host import HostSampler
from collectors.parquet_sink import arrow_without_pandas
from collectors.periodic import PeriodicSampler, RunSampler
from collectors.remote import CollectorServer, parse_address, wall_ns


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmload collect", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, type=Path, help="run folder (tables go under it)")
    p.add_argument("--run-id", help="run id written in every row (default: run folder's name)")
    p.add_argument("--host", help="host name written in every row (default: this host's name)")
    p.add_argument("--gpu-interval", type=float, default=1.0, help="seconds; 0 = off")
    p.add_argument("--gpu-slow-interval", type=float, default=1.0,
                   help="seconds between energy/PCIe/ECC/per-process reads")
    p.add_argument("--metrics-url", nargs="+", default=None, metavar="URL",
                   help="Prometheus /metrics URL(s) or server base URL(s): one per replica; "
                        "each row names its URL in `target`")
    p.add_argument("--metrics-interval", type=float, default=0.5, help="seconds; 0 = off")
    p.add_argument("--metrics-ca-bundle", default=None, metavar="PEM",
                   help="https /metrics: trust these CA certificates")
    p.add_argument("--metrics-insecure", action="store_true",
                   help="https /metrics: do not verify the certificate")
    p.add_argument("--metrics-api-key-env", default=None, metavar="NAME",
                   help="environment variable holding a key to send as 'Authorization: Bearer'")
    p.add_argument("--metrics-include", nargs="*", default=None, metavar="PREFIX",
                   help="keep only metric families starting with these prefixes")
    p.add_argument("--host-interval", type=float, default=1.0, help="seconds; 0 = off")
    p.add_argument("--pid", type=int, nargs="*", default=[], help="processes to watch")
    p.add_argument("--process-name", nargs="*", default=[], metavar="REGEX",
                   help="watch processes whose name or command line matches")
    p.add_argument("--children-of", type=int, nargs="*", default=[], metavar="PID",
                   help="watch all descendants of these processes")
    p.add_argument("--otlp-port", type=int, default=None, metavar="PORT",
                   help="receive the server's OpenTelemetry spans (OTLP/HTTP, POST /v1/traces) "
                        "on this port into the server_requests table; vLLM: "
                        "--otlp-traces-endpoint http://HOST:PORT/v1/traces with "
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf")
    p.add_argument("--otlp-host", default="127.0.0.1", metavar="HOST",
                   help="--otlp-port: the address to listen on (0.0.0.0 for a server on "
                        "another host)")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    p.add_argument("--serve", default=None, metavar="[HOST:]PORT",
                   help="serve this host's clock and, at the end, the files to the run's master "
                        "(swarmload run --remote-collector http://HOST:PORT); HOST: an address "
                        "the master reaches (default 127.0.0.1)")
    p.add_argument("--linger", type=float, default=300.0,
                   help="--serve: after stopping, wait this long for the run to fetch the files")
    p.add_argument("--flush-interval", type=float, default=5.0, help="seconds between part files")
    p.add_argument("--compact-every", type=float, default=0.0,
                   help="merge each table's part files this often, seconds (soaks; 0 = never)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Check ``--serve``'s token, stop on SIGTERM/SIGINT, start the samplers, serve the run
    (``--serve``), wait, stop them all and write the final report."""
    args = _parser().parse_args(argv)
    arrow_without_pandas()  # the samplers write rows, never a frame
    token = None
    if args.serve:  # checked before anything starts: a run could not stop us without it
        token = _serve_token()
        if token is None:
            return 2
    stop = threading.Event()
    wake = threading.Event()  # a signal came: look again
    received: list[str] = []
    settle_from: list[int] = []  # SIGUSR1's wall clock: settle, then stop
    # Handlers first: a SIGTERM that arrives while NVML is still starting must end us cleanly.
    _stop_on_signals(stop, wake, received, settle_from)
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = args.run_id or run_dir.resolve().name
    host = args.host or socket.gethostname()
    report = _first_report(args, host, run_id)
    collection = _Collection(run_dir / f"telemetry-{host}.json", report,
                             _samplers(args, run_dir, run_id, host, report), stop)
    collection.start(args.compact_every, run_dir)
    server = None
    if token is not None:
        server = _serve(args.serve, run_dir, host, token, collection)
    collection.finish(_wait(collection, args.duration, wake, received, settle_from))
    if server is not None:
        _linger(server, report, received, args.linger)
    return 0


def _serve_token() -> str | None:
    """The run's token (``SWARMLOAD_TOKEN``) for ``--serve``; None, said on stderr, when it
    is missing or weak."""
    token = token_from_env()
    problem = token_problem(token)
    if problem:
        print(f"swarmload collect: --serve: {problem}; the run sends it with every "
              "request and it is never written to the run folder", file=sys.stderr)
        return None
    return token


def _stop_on_signals(stop: threading.Event, wake: threading.Event, received: list[str],
                     settle_from: list[int]) -> None:
    def _on_signal(signum: int, _frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        wake.set()

    def _on_settle(_signum: int, _frame: Any) -> None:
        if not settle_from:
            settle_from.append(wall_ns())
        wake.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGUSR1, _on_settle)


def _wait(collection: _Collection, duration: float | None, wake: threading.Event,
          received: list[str], settle_from: list[int]) -> str:
    """Until a stop signal, the run's ``POST /stop``, ``duration`` seconds, or, after SIGUSR1,
    every sampler settled since the signal (:meth:`PeriodicSampler.settled`); says which."""
    end = None if duration is None else time.monotonic() + duration
    asked = False  # after SIGUSR1, each sampler samples once at once
    while not collection.stop.is_set():
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return "duration"
        if settle_from and not asked:
            asked = True
            for sampler in collection.samplers.values():
                sampler.sample_now()
        if settle_from and all(sampler.settled(settle_from[0])
                               for sampler in collection.samplers.values()):
            return "settled"
        # after SIGUSR1 a look per 50 ms; else a signal wakes us, the run's POST /stop within
        # half a second
        wake.wait(0.05 if settle_from else 0.5 if left is None else min(left, 0.5))
        wake.clear()
    return received[0] if received else "run (POST /stop)"


def _first_report(args: argparse.Namespace, host: str, run_id: str) -> dict[str, Any]:
    clock = {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()}
    return {
        "host": host, "run_id": run_id, "pid": os.getpid(), "status": "starting",
        "started_at": datetime.now(UTC).isoformat(), "clock_at_start": clock,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def _samplers(args: argparse.Namespace, run_dir: Path, run_id: str, host: str,
              report: dict[str, Any]) -> dict[str, PeriodicSampler]:
    """The samplers the flags ask for (the GPU probe goes into ``report``); none started."""
    samplers: dict[str, PeriodicSampler] = {}
    report["gpu"] = probe_gpus()
    if args.gpu_interval > 0 and report["gpu"]["available"]:
        samplers["gpu"] = GpuSampler(run_dir, run_id, args.gpu_interval, host=host,
                                     slow_interval_s=args.gpu_slow_interval,
                                     flush_interval_s=args.flush_interval)
    if args.metrics_url and args.metrics_interval > 0:
        # late: httpx only when asked
        from collectors.server_metrics import ServerMetricsScraper  # noqa: PLC0415

        key = os.environ.get(args.metrics_api_key_env, "") if args.metrics_api_key_env else ""
        samplers["server_metrics"] = ServerMetricsScraper(
            run_dir, run_id, args.metrics_url, args.metrics_interval, host=host,
            include=args.metrics_include, flush_interval_s=args.flush_interval,
            verify=False if args.metrics_insecure else (args.metrics_ca_bundle or True),
            headers={"Authorization": f"Bearer {key}"} if key else None)
    if args.otlp_port is not None:
        # late: protobuf only when asked
        from collectors.otlp_traces import OtlpTraceReceiver  # noqa: PLC0415

        samplers["server_traces"] = OtlpTraceReceiver(
            run_dir, run_id, (args.otlp_host, args.otlp_port), host=host,
            flush_interval_s=args.flush_interval)
    if args.host_interval > 0:
        samplers["host"] = HostSampler(
            run_dir, run_id, args.host_interval, pids=args.pid, name_patterns=args.process_name,
            children_of=args.children_of, host=host, flush_interval_s=args.flush_interval)
    return samplers


class _Collection:
    """The samplers of one ``swarmload collect`` and its report file, started and stopped
    once (the run's ``POST /stop`` and a signal may both ask)."""

    def __init__(self, status_path: Path, report: dict[str, Any],
                 samplers: dict[str, PeriodicSampler], stop: threading.Event) -> None:
        self.status_path, self.report, self.samplers, self.stop = (
            status_path, report, samplers, stop)
        self._finished = threading.Lock()

    def start(self, compact_every_s: float, run_dir: Path) -> None:
        for sampler in self.samplers.values():
            if isinstance(sampler, RunSampler):
                sampler.compact_every_s = compact_every_s
        started = {name: s.start() for name, s in self.samplers.items()
                   if not self.stop.is_set()}
        self.report["status"] = "running"
        self.report["samplers_started"] = started
        write_json_atomic(self.status_path, self.report)
        print(f"swarmload collect: sampling {sorted(n for n, ok in started.items() if ok)} "
              f"into {run_dir} (gpu: {self.report['gpu']['reason'] or 'available'})",
              flush=True)

    def finish(self, by: str) -> None:
        """Stop every sampler (each flushes its Parquet) and write the final report, once."""
        with self._finished:
            if self.report["status"] == "stopped":
                return
            for sampler in self.samplers.values():
                sampler.stop()
            self.report["status"] = "stopped"
            self.report["ended_at"] = datetime.now(UTC).isoformat()
            self.report["stopped_by"] = by
            self.report["samplers"] = {name: s.stats() for name, s in self.samplers.items()}
            write_json_atomic(self.status_path, self.report)
        self.stop.set()


def _serve(address: str, run_dir: Path, host: str, token: str,
           collection: _Collection) -> CollectorServer:
    server = CollectorServer(parse_address(address), run_dir, host,
                             lambda: collection.finish("run (POST /stop)"), token=token)
    server.start()
    print(f"swarmload collect: serving clock and files on {server.url}", flush=True)
    return server


def _linger(server: CollectorServer, report: dict[str, Any], received: list[str],
            linger_s: float) -> None:
    """Stopped by the run (POST /stop): it fetches the files now, then says /done; a signal
    or ``--linger`` ends the wait. Stopped by a signal or --duration: no run is waiting."""
    count = len(received)
    deadline = time.monotonic() + linger_s
    while (report["stopped_by"].startswith("run") and not server.done.wait(0.2)
           and len(received) == count and time.monotonic() < deadline):
        pass
    server.close()


if __name__ == "__main__":
    sys.exit(main())
