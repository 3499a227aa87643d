"""Replicas: HAProxy (Debian package) in front of two simulators, and client-side balancing.

A user would notice: every request's record names the replica that answered; per replica, the
records' count equals HAProxy's own count (``show stat``) and the replica's own /metrics; the
summary prints the per-replica table.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.run_folder import load_manifest, load_requests, load_server_metrics
from dashboards.analysis.replicas import per_replica
from infra.targets.haproxy import haproxy_config, parse_show_stat

REPO_ROOT = Path(__file__).resolve().parent.parent
needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None and
                                   not Path("/usr/sbin/haproxy").exists(),
                                   reason="haproxy not installed (make test installs it)")


def test_config_names_each_server_and_sets_the_header(tmp_path: Path) -> None:
    text = haproxy_config(["http://127.0.0.1:8001", "http://10.0.0.2:8002"], 9000,
                          tmp_path / "s.sock", balance="leastconn")
    assert "server r0 127.0.0.1:8001" in text and "server r1 10.0.0.2:8002" in text
    assert "http-response set-header X-Served-By %[srv_name]" in text
    assert "balance leastconn" in text and "bind 127.0.0.1:9000" in text


def test_show_stat_csv_is_read_by_its_header() -> None:
    rows = parse_show_stat("# pxname,svname,stot,hrsp_2xx,\nreplicas,r0,5,4,\n")
    assert rows[0]["svname"] == "r0" and rows[0]["hrsp_2xx"] == "4"


def _run(workload: Path, results: Path, *extra: str) -> tuple[Path, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--replicas", "2",
         "--workers", "2", "--workload", str(workload), "--duration", "5", "--drain", "20",
         "--model", "swarmload-sim", "--telemetry-tail", "1.5", "--results", str(results),
         "--run-id", "replicas", *extra],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results / "replicas", proc.stdout


@needs_haproxy
def test_haproxy_counts_equal_the_records_per_replica(
        poisson_workload: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, stdout = _run(poisson_workload, tmp_path, "--balance", "haproxy")
    requests = load_requests(run_dir)
    assert len(requests) > 60 and (requests["outcome"] == "ok").all()
    assert set(requests["replica"]) == {"r0", "r1"}  # every record names its server
    manifest = load_manifest(run_dir)
    table = per_replica(requests, load_server_metrics(run_dir), manifest)
    print(table[["requests", "ok", "server_ok", "lb_2xx", "lb_sessions"]])
    for name, row in table.iterrows():
        assert row["ok"] == row["lb_2xx"], (name, json.dumps(manifest["balancer"]))
        assert row["ok"] == row["server_ok"], name  # the replica's own /metrics agrees
        assert row["ok_share"] > 0.4, name  # HAProxy's round robin
    assert "per replica" in stdout and "LB 2xx" in stdout
    # the dashboard's run page shows the same table
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWARMLOAD_RESULTS", str(tmp_path))
    at = AppTest.from_file(str(REPO_ROOT / "dashboards" / "app.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Per replica" in [h.value for h in at.subheader]
    (shown,) = [df.value for df in at.dataframe if "lb_2xx" in df.value.columns]
    assert shown["ok"].tolist() == shown["lb_2xx"].tolist() == table["ok"].tolist()


def test_client_side_least_busy_spreads_over_both_urls(poisson_workload: Path,
                                                       tmp_path: Path) -> None:
    run_dir, _ = _run(poisson_workload, tmp_path, "--balance", "least-busy")
    requests = load_requests(run_dir)
    urls = {r["url"] for r in load_manifest(run_dir)["target"]["replicas"]}
    assert len(urls) == 2 and set(requests["replica"]) == urls
    table = per_replica(requests, load_server_metrics(run_dir), load_manifest(run_dir))
    for name, row in table.iterrows():
        assert row["ok"] == row["server_ok"], name
        assert row["ok_share"] > 0.3, name
