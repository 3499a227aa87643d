"""A soak's early warning end to end, time-compressed 60x (a minute of the run stands for an
hour of a soak): the simulator leaks +8% of its memory per compressed hour, the soak plans 72
compressed hours against a stated 80 MB limit. The leak is flagged within the first compressed
hour, while it has moved the server's RSS by less than the drift verdict's 10%, and the time it
projects to the limit is within 15% of the time the RSS's next 20 s say it will take."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from dashboards.analysis.soak import soak_series
from infra.ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
# alone: the projection's 15% rests on a slope fitted to 30-odd seconds of a 0.1 MB-a-window
# leak; beside the parallel part, the simulator's own start-up growth stretched into the fit and
# made it 24% too steep in a clean-clone CI run, against 9% with nothing beside it
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(400)]
LEAK_MB_PER_MIN = 3.2  # 8% of the simulator's ~40 MB a (compressed) hour
LIMIT_MB = 80.0
# The truth the projection is held to: the RSS's own slope over the next AFTER_S. The known leak
# is not the whole of it: a Python server under load creeps by itself (0.1-0.5 MB/min here, no
# Python object behind it), 5-16% of the leak from one machine to the next.
AFTER_S = 20.0


def test_a_creep_of_8_percent_per_compressed_hour_is_flagged_in_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "soak", "--target", "sim", "--workers", "1",
         "--users", "8", "--target-arg=--fixed-ttft-s=0.05", "--target-arg=--fixed-itl-s=0.004",
         f"--target-arg=--leak-mb-per-min={LEAK_MB_PER_MIN}", "--duration", "72m",
         "--window", "2s", "--warmup", "12s", "--sample-interval", "1", "--early-every", "3",
         "--memory-limit", f"{LIMIT_MB:g}MB", "--prometheus-port", str(port),
         "--results", str(tmp_path), "--run-id", "leak", "--progress", "off"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "leak"
    flagged, served = None, ""
    try:
        deadline = started + 150
        while time.time() < deadline and flagged is None:
            time.sleep(1)
            path = run_dir / "early_warning.json"
            if not path.exists():
                continue
            body = json.loads(path.read_text())
            rows = {r["series"]: r for r in body["warnings"]}
            rss = rows.get("server_rss_mb")
            if rss and rss["flagged"]:
                manifest = json.loads((run_dir / "manifest.json").read_text())
                load_start_ns = manifest["soak"]["segments"][0]["started_wall_ns"]
                # from the load's start (the target up) to this projection
                flagged = dict(rss, elapsed_s=(body["computed_wall_ns"] - load_start_ns) / 1e9,
                               last_window_ns=body["last_window_ns"])
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10) as response:
                    served = response.read().decode()
        if flagged is not None:  # what the RSS does next
            time.sleep(max(0.0, flagged["last_window_ns"] / 1e9 + AFTER_S - time.time()))
    finally:
        proc.send_signal(signal.SIGTERM)  # a soak stopped early: its report all the same
        out = proc.communicate(timeout=120)[0]
    assert flagged is not None, out[-3000:]
    rss_series = soak_series(run_dir)["server_rss_mb"].dropna()
    after = rss_series[rss_series.index >= flagged["last_window_ns"]]
    after_h = (after.index.to_numpy() - flagged["last_window_ns"]) / 3.6e12
    assert after_h.max() > AFTER_S * 0.8 / 3600, after
    next_slope_per_h, rss_then = np.polyfit(after_h, after.to_numpy(), 1)
    true_h = (LIMIT_MB - rss_then) / next_slope_per_h
    print(f"flagged {flagged['elapsed_s']:.0f} s in (a compressed hour is 60 s), the RSS "
          f"moved {flagged['change_share']:+.1%} so far: {flagged['text']}; projected "
          f"{flagged['hours_to_limit'] * 60:.2f} min to {LIMIT_MB:g} MB; the next {AFTER_S:g} s "
          f"rose {next_slope_per_h:.0f} MB/h (the leak {LEAK_MB_PER_MIN * 60:.0f}): "
          f"{true_h * 60:.2f} min ({flagged['hours_to_limit'] / true_h - 1:+.1%})")
    assert next_slope_per_h > LEAK_MB_PER_MIN * 60  # the leak is in what the RSS did
    assert flagged["elapsed_s"] < 60  # within the first compressed hour
    assert abs(flagged["change_share"]) < 0.10  # the drift verdict would not flag it yet
    assert flagged["limit_what"] == "stated limit" and flagged["limit"] == LIMIT_MB
    assert flagged["hours_to_limit"] == pytest.approx(true_h, rel=0.15)
    # the same figures on the Prometheus endpoint, and in the soak's summary
    assert 'swarmload_drift_hours_to_limit{endpoint="completions",run_id="leak",' \
           'series="server_rss_mb"}' in served
    assert "[swarmload] early warning: server RSS +" in out
    assert "early warning: server RSS +" in out.split("drifting:")[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert any(w["series"] == "server_rss_mb" and w["flagged"]
               for w in manifest["early_warning"])
    # the Soak page says it above its verdicts, with the table of every projected trend
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWARMLOAD_RESULTS", str(tmp_path))
    at = AppTest.from_file(str(REPO_ROOT / "dashboards/ui/soak_page.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    text = "\n".join(m.value for m in at.markdown)
    assert "**Early warning**" in text and "server RSS +" in text
    assert "| server_rss_mb | yes |" in text
