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


# The Graph page's panels for a soak: each one expression whose series carry a ``side`` label,
# so the client's line and the server's share one graph.
def _both(client: str, server: str) -> str:
    return (f'label_replace({client}, "side", "client (swarmload)", "", "") or '
            f'label_replace({server}, "side", "server (vLLM /metrics)", "", "")')


GRAPH_PANELS = (
    _both('histogram_quantile(0.95, sum by (le) (rate(swarmload_ttft_seconds_bucket[30s])))',
          'histogram_quantile(0.95, sum by (le) '
          '(rate(vllm:time_to_first_token_seconds_bucket[30s])))'),
    _both('sum(rate(swarmload_requests_total{outcome="ok"}[30s]))',
          'sum(rate(vllm:request_success_total[30s]))'),
    _both("sum(swarmload_in_flight)", "sum(vllm:num_requests_running)"),
)


def graph_screenshot(base_url: str, path: Path, panels: tuple[str, ...] = GRAPH_PANELS,
                     range_s: int = 300) -> Path:
    """Prometheus's own Graph page (its web UI) with ``panels``, in headless Chromium."""
    from infra.tools.browser import chromium_browser

    params: dict[str, str] = {}
    for i, expr in enumerate(panels):
        params.update({f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0",
                       f"g{i}.show_exemplars": "0", f"g{i}.range_input": f"{range_s}s"})
    url = f"{base_url}/graph?{urllib.parse.urlencode(params)}"
    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 460 * len(panels) + 120})
        page.goto(url, timeout=60_000)
        # every panel's graph drawn with both its series (Debian's Prometheus serves the
        # classic UI: Rickshaw graphs, one legend line per series)
        page.wait_for_function("document.querySelectorAll('.rickshaw_graph svg path.path')"
                               f".length >= {2 * len(panels)}", timeout=60_000)
        page.wait_for_timeout(1500)
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m infra.tools.prometheus screenshot OUT.png``: a simulator, a Prometheus scraping
    it and a soak's ``--prometheus-port``, the soak running for ``--soak`` seconds; the Graph page
    shot while it still runs (docs/results/prometheus/)."""
    import argparse
    import subprocess
    import sys
    import tempfile
    import time

    from infra.targets.simulator import running_simulator

    p = argparse.ArgumentParser(prog="python -m infra.tools.prometheus")
    p.add_argument("command", choices=["screenshot"])
    p.add_argument("out", type=Path)
    p.add_argument("--soak", type=float, default=240.0, help="soak length, s (default 240)")
    p.add_argument("--users", type=int, default=16)
    args = p.parse_args(argv)
    live_port = free_port()
    with tempfile.TemporaryDirectory(prefix="swarmload-prom-") as tmp, \
            running_simulator() as sim_url:
        folder = Path(tmp)
        targets = {"swarmload": f"127.0.0.1:{live_port}",
                   "vllm-sim": sim_url.removeprefix("http://")}
        with running_prometheus(folder / "prom", targets, interval_s=2.0) as prom:
            soak = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "soak", "--target", sim_url, "--users",
                 str(args.users), "--workers", "2", "--duration", f"{args.soak:g}",
                 "--window", "10s", "--warmup", "20s", "--results", str(folder / "results"),
                 "--prometheus-port", str(live_port), "--quiet", "--no-collectors"])
            try:
                time.sleep(max(args.soak - 30.0, 30.0))
                graph_screenshot(prom, args.out, range_s=int(args.soak))
                print(f"wrote {args.out} while the soak ran ({prom})")
            finally:
                soak.wait(timeout=args.soak + 180)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
