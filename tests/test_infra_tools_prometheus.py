"""A real Prometheus (Debian's) scrapes a run's --prometheus-port and the simulator's /metrics:
what it stored agrees with the run's own summary, and every query of the Grafana dashboard runs
against it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dashboards.analysis.runs import summarize_run
from infra.ports import free_port
from infra.targets.simulator import running_simulator
from infra.tools.prometheus import prometheus_binary, query, running_prometheus, scalar

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(prometheus_binary() is None,
                                reason="no prometheus binary: `make prometheus` installs "
                                       "Debian's")
DURATION_S = 40
MARGIN_S = 6.0  # left out at each end of the run: ramp-up, the last records' way in
RECORD_DELAY_S = 3.0  # a worker reports its records every 3 s: the client counter's steps
SCRAPE_S = 1.0  # an instant query reads the newest sample, up to one scrape old


def _dashboard_exprs(run_id: str) -> list[str]:
    dashboard = json.loads((REPO_ROOT / "deploy/grafana/swarmload-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return [e.replace("$__rate_interval", "15s").replace("$quantile", "0.95")
            .replace("$run_id", run_id).replace("$server_job", "sim") for e in exprs]


@pytest.mark.slow
def test_prometheus_scrape_agrees_with_the_run_summary(tmp_path: Path, run_swarmload) -> None:
    live_port = free_port()
    with running_simulator() as sim_url:
        sim = sim_url.removeprefix("http://")
        targets = {"swarmload": f"127.0.0.1:{live_port}", "sim": sim}
        with running_prometheus(tmp_path / "prom", targets, interval_s=SCRAPE_S) as prom:
            result = run_swarmload(
                "run", "--target", sim_url, "--workers", "2", "--users", "8", "--duration",
                str(DURATION_S), "--results", str(tmp_path / "results"), "--run-id", "live",
                "--prometheus-port", str(live_port), "--label", "team=perf", "--quiet",
                "--no-collectors", timeout=180)
            assert result.returncode == 0, result.stdout + result.stderr
            time.sleep(2.0)  # the last scrapes
            run_dir = tmp_path / "results" / "live"
            import pandas as pd

            from collectors.run_folder import load_requests

            records = load_requests(run_dir, ["sent_wall_ns", "e2e_s", "outcome"])
            ok = records[records["outcome"] == "ok"]
            first = int(records["sent_wall_ns"].min())
            last = int((ok["sent_wall_ns"] + (ok["e2e_s"] * 1e9).astype("int64")).max())
            start_s, end_s = first / 1e9 + MARGIN_S, last / 1e9 - MARGIN_S
            window_s = end_s - start_s
            summary = summarize_run(run_dir, window=(int(start_s * 1e9), int(end_s * 1e9)))
            expected = float(summary.loc["all", "req_per_s"])
            assert expected > 5 and isinstance(summary, pd.DataFrame)

            def counted(promql: str) -> float:
                at_end, at_start = scalar(prom, promql, end_s), scalar(prom, promql, start_s)
                assert at_end is not None and at_start is not None, promql
                return (at_end - at_start) / window_s

            client = counted('sum(swarmload_requests_total{run_id="live",outcome="ok",'
                             'team="perf"})')
            server = counted('sum(vllm:request_success_total{job="sim"})')
            # the client counter moves in steps of each worker's report (every 3 s), both
            # counters in steps of a scrape, at each end of the window
            tolerance = (RECORD_DELAY_S + SCRAPE_S) / window_s + 0.03
            server_tolerance = 2 * SCRAPE_S / window_s + 0.03
            print(f"window {window_s:.1f} s: summary {expected:.2f} req/s, Prometheus client "
                  f"{client:.2f} ({client / expected - 1:+.1%}), server {server:.2f} "
                  f"({server / expected - 1:+.1%}); tolerance {tolerance:.1%}")
            assert client == pytest.approx(expected, rel=tolerance)
            assert server == pytest.approx(expected, rel=server_tolerance)
            # Prometheus's own rate() over the window, as the dashboard asks it
            rate = scalar(prom, f'sum(rate(swarmload_requests_total{{outcome="ok"}}'
                                f'[{int(window_s)}s]))', end_s)
            assert rate == pytest.approx(expected, rel=tolerance + 0.05)
            # every query of the Grafana dashboard runs; the client's all return series
            empty = []
            for expr in _dashboard_exprs("live"):
                at = end_s
                series = query(prom, expr, at)  # raises on a PromQL error
                if "swarmload_" in expr and "drift" not in expr and not series:
                    empty.append(expr)
            assert empty == []
