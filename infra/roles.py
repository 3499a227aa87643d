"""``swarmload master`` and ``swarmload worker``: one run spread over several machines.

    # on the machine that holds the results (any reachable address; port 5557 by default)
    swarmload master --workers 4 --bind 0.0.0.0 --port 5557 --target http://gpu-1:8000 ...
    # on each load-generating machine
    swarmload worker --master master-host:5557 [--processes 2] [--name loadgen-3]

The master takes every option ``swarmload run`` takes (target, users, duration, workload, ...),
starts no local worker, waits up to ``--worker-wait`` seconds for ``--workers`` workers to
connect, then runs exactly as ``run`` does: records, worker telemetry and generator health travel
over Locust's own message channel, and the run folder holds everything on the master's host.
Each worker's clock offset is measured by a repeated NTP-style exchange over the same channel
(``locustfiles.clock_sync``), written to the manifest (``clock`` and ``hosts``) and used to
correct open-loop send times and the join of telemetry.

A worker needs only the package: its options come from the master (Locust sends them), its
host name is ``--name`` (default: the machine's), the first field of every record's worker id.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from infra.orchestrate import build_parser
from infra.orchestrate import main as run_main
from infra.paths import PACKAGE_ROOT
from infra.procs import die_with_parent
from locustfiles import LOCUSTFILE

DEFAULT_PORT = 5557  # Locust's own default master port


def parse_master_address(text: str) -> tuple[str, int]:
    """'HOST', 'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest.lstrip(":") or DEFAULT_PORT)
    host, sep, port = text.rpartition(":")
    if not sep or ":" in host:  # no port, or a bare IPv6 address
        return text, DEFAULT_PORT
    return host, int(port)


def master_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "swarmload master"
    p.description = __doc__
    p.add_argument("--bind", dest="master_bind", default="0.0.0.0",
                   help="address the master listens on for workers (default all)")
    p.add_argument("--port", dest="master_port", type=int, default=DEFAULT_PORT,
                   help=f"master port (default {DEFAULT_PORT})")
    p.add_argument("--worker-wait", dest="worker_wait_s", type=float, default=120.0,
                   help="longest wait for the workers to connect, s (default 120)")
    return p


def master_main(argv: list[str]) -> int:
    args = master_parser().parse_args(argv)
    args.local_workers = 0
    return run_main(argv, args=args)


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmload worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--master", required=True, metavar="HOST[:PORT]",
                   help=f"the master's address (port {DEFAULT_PORT} if left out)")
    p.add_argument("--processes", type=int, default=1,
                   help="worker processes on this machine (one per core is the most useful)")
    p.add_argument("--name", default=None,
                   help="host name in records and the manifest (default: this machine's)")
    return p


def worker_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
            "--master-host", host, "--master-port", str(port)]


def worker_main(argv: list[str]) -> int:
    args = worker_parser().parse_args(argv)
    if args.processes < 1:
        print("swarmload worker: --processes must be at least 1", file=sys.stderr)
        return 2
    host, port = parse_master_address(args.master)
    env = dict(os.environ)
    if args.name:
        env["SWARMLOAD_HOST_NAME"] = args.name
    # they print to this terminal (no log file), and die with this process if it is killed
    procs = [subprocess.Popen(worker_argv(host, port), cwd=PACKAGE_ROOT, env=env,
                              preexec_fn=die_with_parent())
             for _ in range(args.processes)]

    def _forward(signum: int, _frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    codes = [proc.wait() for proc in procs]
    return max(codes, default=0)
