"""A real Prometheus (Debian's ``prometheus``, ``make prometheus``) for tests and screenshots.

:func:`running_prometheus` starts one on a free loopback port with its own data folder, scraping
the given ``host:port`` targets (one job each) every ``interval_s``; :func:`query` asks its HTTP
API (``/api/v1/query``) an instant PromQL query. Nothing here is needed to *use* swarmload's
live metrics: any Prometheus scrapes ``--prometheus-port`` (docs/guides/prometheus.md).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from infra import procs
from infra.ports import free_port

PROMETHEUS_BINARIES = ("/usr/bin/prometheus", "/usr/sbin/prometheus")


def prometheus_binary() -> str | None:
    """Debian's Prometheus, or one on PATH; None when there is none."""
    for path in PROMETHEUS_BINARIES:
        if Path(path).exists():
            return path
    return shutil.which("prometheus")


def write_config(path: Path, targets: Mapping[str, str], interval_s: float) -> Path:
    """A prometheus.yml scraping each ``job: host:port`` every ``interval_s``."""
    jobs = "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
                   for job, target in targets.items())
    path.write_text(f"global:\n  scrape_interval: {interval_s:g}s\n"
                    f"  evaluation_interval: {interval_s:g}s\nscrape_configs:\n{jobs}")
    return path


@contextlib.contextmanager
def running_prometheus(folder: Path, targets: Mapping[str, str], *,
                       interval_s: float = 1.0) -> Iterator[str]:
    """Prometheus scraping ``targets`` ({job: "host:port"}), data in ``folder``; yields its
    base URL (``http://127.0.0.1:PORT``) once it answers ``/-/ready``."""
    binary = prometheus_binary()
    if binary is None:
        raise FileNotFoundError("no prometheus binary (make prometheus: Debian's package)")
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(folder / "prometheus.yml", targets, interval_s)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d",
            "--web.console.templates=/usr/share/prometheus/consoles",
            "--web.console.libraries=/usr/share/prometheus/console_libraries"]
    with procs.running(argv, name="prometheus", log_path=folder / "prometheus.log",
                       ready_url=f"{url}/-/ready", ready_timeout_s=60.0, grace_s=10.0):
        yield url


def query(base_url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query; ``at`` in Unix seconds (default: now). Returns the result vector;
    raises RuntimeError with Prometheus's own error for a bad query."""
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    request = f"{base_url}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        body = json.load(exc)
    if body.get("status") != "success":
        raise RuntimeError(f"{promql}: {body.get('errorType')}: {body.get('error')}")
    return list(body["data"]["result"])


def scalar(base_url: str, promql: str, at: float | None = None) -> float | None:
    """The one value of an instant query (None when the vector is empty)."""
    result = query(base_url, promql, at)
    return float(result[0]["value"][1]) if result else None
