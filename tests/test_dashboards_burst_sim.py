"""A spike against a simulator of known capacity: the backlog drains in the time known in advance.

The simulator decodes ``max_num_seqs`` = 4 sequences per 100 ms step with no prefill cost, and each
request asks for 4 tokens: a request holds a slot for 0.4 s, so the capacity is C = 10 req/s. On a
base load B = 6 req/s, a spike of 3C = 30 req/s for S = 4 s leaves a backlog of (3C - C) S = 80
requests, which drains at C - B = 4 req/s: recovery in 80 / 4 = 20 s. The measured recovery time
(METRICS.md, 1 s windows) must be within 10% of that: two windows, room for one late window on
a host at load average 15 (one run in thirteen measured 18 s against 16 with B = 5). A 100 ms
step (not 25 ms) keeps the baseline TTFT (100-200 ms) large next to a busy CI host's few
milliseconds of jitter, so the 10% band measures the server, not the host. About 55 s: one
``swarmload run`` of 34 s of schedule.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dashboards.analysis import burst

# alone: evenly spaced arrivals meet the 100 ms steps at the same few phases, so an idle host's
# window P95 TTFT is 169 ms in every window and the band is 186 ms; beside the parallel part two
# clean-clone CI runs read 196-210 ms in the last windows (the host's load; the queue was empty)
# and called the spike not recovered, though it drained in the 20 s worked out in advance
pytestmark = [pytest.mark.slow, pytest.mark.alone]

SLOTS, STEP_S, TOKENS = 4, 0.1, 4
CAPACITY = SLOTS / (STEP_S * TOKENS)  # 10 req/s
BASE, SPIKE_S, SPIKE_AT = 0.6 * CAPACITY, 4.0, 6.0
BACKLOG = (3 * CAPACITY - CAPACITY) * SPIKE_S  # 80 requests
EXPECTED_RECOVERY_S = BACKLOG / (CAPACITY - BASE)  # 20 s


def short_workload(folder: Path, rows: int = 60) -> Path:
    from workloads.schema import write_workload

    frame = pd.DataFrame({
        "request_id": [f"r{i:04d}" for i in range(rows)], "bucket": ["short"] * rows,
        "prompt_tokens": [8] * rows, "output_tokens": [TOKENS] * rows,
        "prompt": ["alpha beta gamma delta epsilon zeta eta theta"] * rows,
        "messages": [None] * rows, "trace_offset_s": [None] * rows, "session_id": [None] * rows,
        "prefix_block_ids": [[] for _ in range(rows)], "source_line": list(range(1, rows + 1)),
        "prompt_source": ["synthesized"] * rows})
    write_workload(frame, folder, {"source": {"kind": "test"}})
    return folder


def test_recovery_from_a_3c_spike_is_backlog_over_spare_capacity(
        tmp_path: Path, run_swarmload, monkeypatch: pytest.MonkeyPatch) -> None:
    workload = short_workload(tmp_path / "wl")
    plan = tmp_path / "spike.yaml"
    plan.write_text(f"kind: bursts\nbase_rps: {BASE}\npeak_rps: {3 * CAPACITY}\n"
                    f"spike_s: {SPIKE_S}\ncount: 1\nfirst_spike_s: {SPIKE_AT}\nspacing: even\n")
    results = tmp_path / "results"
    sim = [f"--max-num-seqs={SLOTS}", f"--decode-base-s={STEP_S}", "--decode-per-seq-s=0",
           "--prefill-base-s=0", "--prefill-per-token-s=0"]
    done = run_swarmload("run", "--target", "sim", *(f"--target-arg={a}" for a in sim),
                         "--workers", "1", "--workload", str(workload), "--plan", str(plan),
                         "--duration", "34", "--drain", "30", "--results", str(results),
                         timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    report = burst.burst_report(run_dir)
    assert report is not None and len(report.spikes) == 1
    row = report.spikes.iloc[0]
    print(f"\nexpected recovery {EXPECTED_RECOVERY_S:g} s, measured {row['recovery_s']:g} s; "
          f"peak P95 TTFT {row['peak_ttft_p95_s']:.2f} s, baseline "
          f"{row['baseline_ttft_p95_s'] * 1e3:.0f} ms, peak queue {row['peak_waiting']:g}")
    after = report.timelines[1].query("phase == 'after'")[
        ["t_s", "requests", "ttft_p95_s", "waiting", "ttft_ok", "queue_ok"]]
    assert row["recovered"], (row["note"], after.to_string())
    assert abs(row["recovery_s"] - EXPECTED_RECOVERY_S) <= 0.1 * EXPECTED_RECOVERY_S, (
        row[["ttft_limit_s", "queue_limit"]].to_dict(), after.to_string())
    # at the spike's end the last arrival waits behind the whole backlog: backlog / C
    assert row["peak_ttft_p95_s"] == pytest.approx(BACKLOG / CAPACITY, rel=0.15)
    assert row["peak_waiting"] == pytest.approx(BACKLOG, rel=0.15)  # the server's own queue
    assert row["offered_peak_rps"] == 3 * CAPACITY and row["failed"] == row["dropped"] == 0
    timeline = report.timelines[1]
    spike = timeline[timeline["phase"] == "spike"]
    # the server completes C req/s whatever is offered
    assert spike["achieved_rps"].mean() == pytest.approx(CAPACITY, rel=0.15)
    # the terminal summary: one line per spike
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("spike 1 at 6.0 s")]
    assert f"recovered in {row['recovery_s']:.0f} s" in line and "failed 0" in line
    # the Burst page on the run: its spike table says the same
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWARMLOAD_RESULTS", str(results))
    app = Path(burst.__file__).parent.parent / "app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    at.switch_page("ui/burst_page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == f"Bursts · run {run_dir.name}"
    table = next(m.value for m in at.markdown if m.value.startswith("| spike |"))
    header, _, first = table.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in first.split("|")],
                     strict=True))
    assert cells["recovery (s)"] == f"{row['recovery_s']:.3g}"
    # the same run as a burst study's step: the roll-up the study runner writes after each step
    import json

    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text(json.dumps({"name": "spike", "steps": [
        {"config": "seqs-4", "step": 1, "offered_load": BASE, "status": "done",
         "run_dir": str(Path("..") / run_dir.relative_to(tmp_path))}]}))
    spikes, timelines = burst.write_study_bursts(study)
    assert burst.load_study_bursts(study)[0]["recovery_s"].tolist() == [row["recovery_s"]]
    comparison = burst.recovery_comparison(spikes)
    assert comparison["recovery_s"].tolist() == [row["recovery_s"]]
    assert set(timelines["config"]) == {"seqs-4"} and len(timelines) == len(report.timelines[1])
