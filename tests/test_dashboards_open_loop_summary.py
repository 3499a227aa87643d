"""The summary of an open-loop run: offered rate over the schedule's own span (not the drain),
schedule lag P50/P99/max, queued TTFT percentiles; answer TTFT for reasoning models."""

from __future__ import annotations

import numpy as np
import pandas as pd

from collectors.schemas import REQUEST_SCHEMA
from dashboards.analysis.runs import format_summary, summarize_requests, throughput_table

T0 = 1_700_000_000_000_000_000


def _frame(n: int = 600, rate: float = 5.0, drain_s: float = 54.0) -> pd.DataFrame:
    """A 120 s schedule at 5 req/s whose last request finishes 54 s after the schedule ends."""
    rng = np.random.default_rng(1)
    scheduled = T0 + (np.arange(n) / rate * 1e9).astype(np.int64)
    lag = rng.uniform(0.0005, 0.004, n)
    ttft = rng.uniform(0.05, 0.15, n)
    e2e = ttft + 1.0
    e2e[-1] = drain_s  # the slowest one keeps the run going through a long drain
    rows = {name: [None] * n for name in REQUEST_SCHEMA.names}
    rows.update({
        "run_id": ["r"] * n, "worker_id": ["w"] * n, "request_id": [str(i) for i in range(n)],
        "bucket": ["short"] * n, "outcome": ["ok"] * n, "scheduled_wall_ns": scheduled,
        "sent_wall_ns": scheduled + (lag * 1e9).astype(np.int64), "schedule_lag_s": lag,
        "ttft_s": ttft, "queued_ttft_s": ttft + lag, "e2e_s": e2e, "output_tokens": [8] * n,
        "prompt_tokens": [10] * n, "itl_s": [[0.01] * 7] * n,
        "answer_ttft_s": ttft + 0.2, "reasoning_events": [20] * n, "streamed": [True] * n})
    return pd.DataFrame(rows)


def test_offered_rate_is_over_the_schedule_not_the_drain() -> None:
    frame = _frame()
    summary = summarize_requests(frame)
    all_row = summary.loc["all"]
    assert all_row["window_s"] > 170  # first send to last completion, drain included
    assert abs(all_row["offered_req_per_s"] - 5.0) < 0.01  # 600 arrivals, 119.8 s first to last
    lag = frame["schedule_lag_s"]
    assert all_row["schedule_lag_max_s"] == lag.max()
    assert abs(all_row["schedule_lag_p50_s"] - np.percentile(lag, 50)) < 1e-12
    assert abs(all_row["queued_ttft_p95_s"] - np.percentile(frame["queued_ttft_s"], 95)) < 1e-12
    assert abs(all_row["answer_ttft_p50_s"] - np.percentile(frame["answer_ttft_s"], 50)) < 1e-12
    text = format_summary(summary)
    assert "offered 5.00 req/s over the schedule's 120.0 s" in text
    assert "schedule lag ms: P50" in text and "max" in text
    assert "queued TTFT" in text and "answer TTFT" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_closed_loop_and_no_reasoning_show_no_extra_rows() -> None:
    frame = _frame(n=50)
    frame["scheduled_wall_ns"] = None
    frame["schedule_lag_s"] = None
    frame["queued_ttft_s"] = None
    frame["reasoning_events"] = 0
    text = format_summary(summarize_requests(frame))
    assert "open-loop" not in text and "queued TTFT" not in text and "answer TTFT" not in text
    frame["streamed"] = False
    frame["ttft_s"] = None
    assert "non-streaming requests: no TTFT" in format_summary(summarize_requests(frame))


def test_a_task_run_offers_tasks_per_second() -> None:
    """120 tasks at 1 task/s, 4 calls each (one at the start, two after it, a join): the plan
    offered 1 task/s; its 4.0 req/s of calls were sent as answers came back."""
    n, calls = 120, [([], 0.0), ([0], 1.0), ([0], 1.0), ([1, 2], 2.0)]
    frame = _frame(n=n * len(calls), rate=4.0)
    arrival = T0 + (np.arange(n) * 1e9).astype(np.int64)
    frame["session_id"] = [f"t{i}#{i}" for i in range(n) for _ in calls]
    frame["turn"] = [k for _ in range(n) for k in range(len(calls))]
    frame["depends_on"] = [deps for _ in range(n) for deps, _after in calls]
    frame["scheduled_wall_ns"] = [int(a + after * 1e9) for a in arrival for _d, after in calls]
    frame["sent_wall_ns"] = frame["scheduled_wall_ns"]
    frame["e2e_s"] = 1.0
    summary = summarize_requests(frame)
    all_row = summary.loc["all"]
    assert all_row["arrival_unit"] == "tasks" and all_row["arrivals"] == n
    assert abs(all_row["offered_arrivals_per_s"] - 1.0) < 1e-9
    text = format_summary(summary)
    assert "open-loop: offered 1.00 tasks/s over their arrivals' 120.0 s, not sent 0" in text
    assert "their requests: 3.96 req/s over the schedule's 121.3 s" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    lone = format_summary(summarize_requests(_frame()))  # lone requests: as they were
    assert "offered 5.00 req/s over the schedule's 120.0 s, not sent 0" in lone
    assert "tasks/s" not in lone and "their requests" not in lone
    # the Run page's throughput table: the plan's tasks/s, then the requests they led to
    table = throughput_table(summary)
    assert list(table.columns[:4]) == ["req/s", "output tok/s", "offered tasks/s",
                                       "offered req/s"]
    assert abs(table.loc["all", "offered tasks/s"] - 1.0) < 1e-9
    assert "offered tasks/s" not in throughput_table(summarize_requests(_frame()))
