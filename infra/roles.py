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
from dataclasses import replace
from typing import Any

from infra.orchestrate import build_parser, parse_or_exit
from infra.orchestrate import main as run_main
from infra.paths import PACKAGE_ROOT
from infra.procs import die_with_parent
from locustfiles import LOCUSTFILE
from locustfiles.config import MASTER_PORT as DEFAULT_PORT  # Locust's own default master port


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
    """``swarmload run``'s flags and the master's own (RunConfig's fields of both)."""
    return build_parser("master", __doc__)


def master_main(argv: list[str]) -> int:
    # every run option as `run` takes it; no worker on this host
    config = replace(parse_or_exit(master_parser(), argv), local_workers=0)
    return run_main(argv, config=config)


def worker_parser() -> argparse.ArgumentParser:
    """The worker's flags (RunConfig's fields of ``swarmload worker``)."""
    return build_parser("worker", __doc__)


def worker_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
            "--master-host", host, "--master-port", str(port)]


def worker_main(argv: list[str]) -> int:
    config = parse_or_exit(worker_parser(), argv)
    host, port = parse_master_address(config.master_address)
    env = dict(os.environ)
    if config.host_name:
        env["SWARMLOAD_HOST_NAME"] = config.host_name
    # they print to this terminal (no log file), and die with this process if it is killed
    procs = [subprocess.Popen(worker_argv(host, port), cwd=PACKAGE_ROOT, env=env,
                              preexec_fn=die_with_parent())
             for _ in range(config.processes)]

    def _forward(signum: int, _frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    codes = [proc.wait() for proc in procs]
    return max(codes, default=0)
