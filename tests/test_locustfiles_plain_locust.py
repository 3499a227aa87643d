"""Plain Locust, as the README documents it: `locust -f locustfiles/llm_user.py`, headless and
with its web UI in Chromium; either way the run folder gets a manifest and shows in the
dashboard's list of runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.run_folder import list_runs, load_requests
from dashboards.analysis.runs import summarize_requests
from infra.browser import CHROMIUM, chromium_browser
from infra.ports import free_port
from infra.targets.simulator import running_simulator

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


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")
def test_web_ui_shows_ttft_and_e2e_in_chromium(sim_url: str, tmp_path: Path) -> None:
    pytest.importorskip("playwright.sync_api")
    port = free_port()
    proc = subprocess.Popen(
        _locust(tmp_path, "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart",
                "-u", "3", "-r", "3", "-t", "60s", "--host", sim_url,
                "--swarmload-max-tokens", "8"),
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with chromium_browser() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            deadline = time.monotonic() + 30
            while True:  # the web UI needs a moment to listen
                try:
                    page.goto(f"http://127.0.0.1:{port}/", timeout=5000)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            for entry in ("TTFT", "E2E"):
                page.get_by_role("cell", name=entry, exact=True).first.wait_for(timeout=30_000)
            page.wait_for_timeout(3000)  # a few refreshes, so the table carries figures
            shot = tmp_path / "locust-web-ui.png"
            page.screenshot(path=str(shot))
            if os.environ.get("SWARMLOAD_SCREENSHOTS"):
                page.screenshot(path=os.environ["SWARMLOAD_SCREENSHOTS"])
            assert shot.stat().st_size > 10_000
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # Locust stops the test and quits
        proc.wait(30)
    runs = list_runs(tmp_path / "results")
    assert len(runs) == 1 and runs.iloc[0].requests > 5


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
