"""Plain Locust, as the README documents it: `locust -f locustfiles/llm_user.py`, headless and
with its web UI in Chromium; either way the run folder gets a manifest and shows in the
dashboard's list of runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from collectors.run_folder import list_runs, load_requests
from dashboards.analysis.runs import summarize_requests
from infra import procs
from infra.ports import free_port
from infra.targets.simulator import running_simulator
from infra.tools.browser import CHROMIUM, chromium_browser

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO_ROOT / "locustfiles" / "llm_user.py"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with running_simulator(fixed_ttft_s=0.02, fixed_itl_s=0.005) as url:
        yield url


def _locust(cwd: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args]


@pytest.mark.alone  # a 4 s run's figures: a test beside it once left it no TTFT row
def test_headless_run_gets_records_a_manifest_and_shows_in_the_dashboard(
        sim_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        _locust(tmp_path, "--headless", "-u", "4", "-r", "4", "-t", "4s", "--host", sim_url,
                "--swarmload-max-tokens", "8", "--only-summary"),
        cwd=tmp_path, text=True, capture_output=True, timeout=90,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Locust's own table shows the TTFT and E2E entries (exit code 1 only when a request was
    # cut by the end of the run, which Locust counts as a failure)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "TTFT" in done.stderr + done.stdout and "E2E" in done.stderr + done.stdout
    runs = list_runs(tmp_path / "results")
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    run = runs.iloc[0]
    assert run.target_kind == "endpoint" and run.users == 4 and run.requests > 10
    summary = summarize_requests(load_requests(run.path))
    assert summary.loc["all", "ok"] > 10
    # the dashboard opens it like any other run
    from streamlit.testing.v1 import AppTest

    from dashboards import launch

    os.environ["SWARMLOAD_RESULTS"] = str(tmp_path / "results")
    try:
        app = AppTest.from_file(str(Path(launch.__file__).with_name("app.py")),
                                default_timeout=60)
        app.query_params["run"] = run.run_id
        app.run()
    finally:
        del os.environ["SWARMLOAD_RESULTS"]
    assert not app.exception, [e.value for e in app.exception]
    assert app.title[0].value == f"Run {run.run_id}"
    assert [m.value for m in app.metric if m.label == "Requests"] == [str(run.requests)]


def _locust_stats(port: int) -> dict[str, Any] | None:
    """Locust's own ``/stats/requests`` JSON (what its web UI polls), or None while it does not
    answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats/requests",
                                    timeout=5) as response:
            return cast(dict[str, Any], json.load(response))
    except (OSError, ValueError):
        return None


def _wait_for_live_entries(locust: procs.ManagedProcess, port: int, entries: set[str],
                           timeout_s: float) -> None:
    """Until Locust says the run is on and its stats list every one of ``entries``.

    Why before the browser opens the page: Locust's web UI polls ``/stats/requests`` only while
    the state it got on loading is spawning or running. ``--autostart`` fires ``test_start``
    (this project's listeners open the run folder, its writers and manifest: 2 s on an idle
    2-core machine, many more under the suite's load) while the state is still ``ready``; a page
    loaded in that window shows the start form and never looks again (locustio/locust#1463), so
    the entries never appear in it."""
    deadline = time.monotonic() + timeout_s
    stats: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if locust.poll() is not None:
            raise AssertionError(f"locust exited ({procs.describe_exit(locust.returncode)}) "
                                 f"before its stats listed {sorted(entries)}")
        stats = _locust_stats(port)
        if stats is not None and stats.get("state") in ("spawning", "running"):
            if entries <= {row.get("method") for row in stats.get("stats", [])}:
                return
        time.sleep(0.25)
    raise AssertionError(f"Locust's /stats/requests did not list {sorted(entries)} within "
                         f"{timeout_s:.0f} s; it last said {stats!r}"[:2000])


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")
def test_web_ui_shows_ttft_and_e2e_in_chromium(sim_url: str, tmp_path: Path) -> None:
    pytest.importorskip("playwright.sync_api")
    port = free_port()
    log = tmp_path / "locust.log"  # printed when the test fails
    locust = procs.start(
        _locust(tmp_path, "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart",
                "-u", "3", "-r", "3", "-t", "60s", "--host", sim_url,
                "--swarmload-max-tokens", "8"),
        name="locust", log_path=log, cwd=tmp_path)
    try:
        # generous: the deadline only bounds a broken start, a loaded machine just takes longer
        _wait_for_live_entries(locust, port, {"TTFT", "E2E"}, timeout_s=120)
        with chromium_browser() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/", timeout=60_000)
            for entry in ("TTFT", "E2E"):
                page.get_by_role("cell", name=entry, exact=True).first.wait_for(timeout=60_000)
            page.wait_for_timeout(3000)  # a few refreshes, so the table carries figures
            shot = tmp_path / "locust-web-ui.png"
            page.screenshot(path=str(shot))
            if os.environ.get("SWARMLOAD_SCREENSHOTS"):
                page.screenshot(path=os.environ["SWARMLOAD_SCREENSHOTS"])
            assert shot.stat().st_size > 10_000
    except BaseException:
        print(f"--- {log} (the last 8,000 characters) ---\n{locust.log_tail(8000)}")
        raise
    finally:
        locust.stop(grace_s=30)  # SIGTERM: Locust stops the test and quits
    runs = list_runs(tmp_path / "results")
    assert len(runs) == 1 and runs.iloc[0].requests > 5, locust.log_tail(8000)


def test_headless_reasoning_run_shows_answer_ttft(tmp_path: Path) -> None:
    with running_simulator(fixed_ttft_s=0.02, fixed_itl_s=0.005, reasoning_events=4) as url:
        done = subprocess.run(
            _locust(tmp_path, "--headless", "-u", "2", "-r", "2", "-t", "6s", "--host", url,
                    "--swarmload-max-tokens", "8", "--swarmload-endpoint", "chat",
                    "--only-summary"),
            cwd=tmp_path, text=True, capture_output=True, timeout=90,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = done.stderr + done.stdout
    assert "answer TTFT" in out and "TTFT" in out, out[-2000:]
    records = load_requests(list_runs(tmp_path / "results").iloc[0].path)
    ok = records[records.outcome == "ok"]
    assert len(ok) > 0 and (ok.reasoning_events == 4).all()
    later = ok.answer_ttft_s - ok.ttft_s
    # four 5 ms gaps later; never earlier (equal when one read brought both: the lines of a
    # read share its kernel receive time)
    assert (later >= 0).all() and later.median() > 0.015


def test_run_time_counts_from_the_start_not_from_a_slow_import(sim_url: str,
                                                                tmp_path: Path) -> None:
    """A locustfile that takes seconds to import (a loaded machine) still runs its -t: gevent's
    loop clock is brought up to date before Locust sets the run-time timer."""
    slow = tmp_path / "slow_user.py"
    slow.write_text(
        "import gevent.monkey\n"
        "gevent.monkey.get_original('time', 'sleep')(3)  # blocks: no turn of gevent's loop\n"
        f"exec(open({str(LOCUSTFILE)!r}).read())\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(slow), "--headless", "-u", "2", "-r", "2",
         "-t", "2s", "--host", sim_url, "--swarmload-max-tokens", "8", "--only-summary"],
        cwd=tmp_path, text=True, capture_output=True, timeout=90,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert time.monotonic() - started >= 3 + 2  # the import, then the whole run time
    runs = list_runs(tmp_path / "results")
    assert len(runs) == 1 and runs.iloc[0].requests > 5, done.stderr[-2000:]
