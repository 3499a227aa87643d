"""Burst analysis on made-up runs whose answers are known: a queue that fills during a spike and
drains at a known rate, spikes found in a plan and in a schedule, the terminal lines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis import burst

NS = 1_000_000_000
T0 = 1_800_000_000 * NS  # schedule start on the wall clock


def fluid_run(base: float = 5.0, peak: float = 30.0, capacity: float = 10.0,
              spike: tuple[float, float] = (10.0, 15.0), end: float = 50.0,
              ttft0: float = 0.03) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Evenly spaced arrivals; the server serves ``capacity`` req/s, so during the spike the
    queue grows by (peak - capacity)/s and after it drains at (capacity - base)/s. A request's
    TTFT is ``ttft0`` plus the queue it finds / capacity. The queue is scraped every 0.5 s."""
    times, t = [], 0.0
    while t < end:
        rate = peak if spike[0] <= t < spike[1] else base
        times.append(t)
        t = round(t + 1.0 / rate, 9)
    times_a = np.array(times)

    def queue(at: np.ndarray) -> np.ndarray:
        grown = np.clip(at - spike[0], 0, spike[1] - spike[0]) * (peak - capacity)
        drained = np.clip(at - spike[1], 0, None) * (capacity - base)
        return np.clip(grown - drained, 0, None)

    n = times_a.size
    requests = pd.DataFrame({
        "scheduled_wall_ns": (T0 + times_a * NS).astype("int64"),
        "sent_wall_ns": (T0 + times_a * NS).astype("int64"),
        "outcome": ["ok"] * n,
        "ttft_s": ttft0 + queue(times_a) / capacity,
        "tpot_s": np.full(n, 0.025),
        "e2e_s": ttft0 + queue(times_a) / capacity + 0.4,
    })
    scrapes = np.arange(0, end, 0.5)
    server = {"waiting": pd.DataFrame({"ref_ns": (T0 + scrapes * NS).astype("int64"),
                                       "value": np.floor(queue(scrapes))})}
    return requests, server


def test_recovery_is_backlog_over_spare_capacity() -> None:
    """Backlog (30 - 10) x 5 s = 100 requests, drained at 10 - 5 = 5 req/s: 20 s."""
    requests, server = fluid_run()
    spikes = [burst.Spike(T0 + 10 * NS, T0 + 15 * NS, 30.0)]
    report = burst.analyze(requests, spikes, T0, server)
    row = report.spikes.iloc[0]
    assert row["recovered"] and row["recovery_s"] == row["queue_recovery_s"] == 20.0
    assert row["back_s"] == 20.0
    assert row["start_s"] == 10.0 and row["duration_s"] == 5.0
    assert row["baseline_s"] == 9.0  # the run's first second is skipped
    assert row["baseline_ttft_p95_s"] == pytest.approx(0.03)
    assert row["baseline_tpot_p50_s"] == pytest.approx(0.025)
    assert row["baseline_offered_rps"] == pytest.approx(5.0)
    assert row["baseline_waiting"] == 0 and row["baseline_error_rate"] == 0
    # the queue's top is the backlog; the worst window's P95 TTFT about backlog / C
    assert row["peak_waiting"] == pytest.approx(95, abs=5)
    assert row["peak_ttft_p95_s"] == pytest.approx(0.03 + 100 / 10, abs=0.5)
    assert row["offered_peak_rps"] == 30 and row["failed"] == 0 and row["dropped"] == 0
    timeline = report.timelines[1]
    assert list(timeline.columns) == list(burst.TIMELINE_COLUMNS)
    assert (timeline["phase"] == "spike").sum() == 5
    assert timeline.loc[timeline["phase"] == "spike", "offered_rps"].tolist() == [30.0] * 5
    after = timeline[timeline["phase"] == "after"].reset_index(drop=True)
    assert not after["ttft_ok"][19] and after["ttft_ok"][20:].all()
    assert after["t_s"][20] == 25.0  # t_s counts from the spike's start


def test_the_queue_alone_can_hold_recovery_back() -> None:
    """TTFT back at once but the waiting queue still full for 6 s: recovery waits for it."""
    requests, server = fluid_run()
    requests["ttft_s"] = 0.03
    waiting = server["waiting"]
    t = (waiting["ref_ns"] - T0) / NS
    waiting["value"] = np.where((t >= 10) & (t < 21), 8.0, 0.0)
    report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS)], T0, server)
    assert report.spikes.iloc[0]["recovery_s"] == report.spikes.iloc[0]["queue_recovery_s"] == 6
    # and a slow request long after the queue drained holds recovery back, not the queue's
    late = (requests["scheduled_wall_ns"] - T0) // NS == 40
    requests.loc[late, "ttft_s"] = 0.5
    row = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS)], T0,
                        server).spikes.iloc[0]
    assert (row["recovery_s"], row["queue_recovery_s"]) == (26.0, 6.0)
    assert row["back_s"] == 6.0  # first back in the band: the drain, not the later blip
    assert burst.spike_lines(pd.DataFrame([row]))[0].endswith(
        "recovered in 26 s; server queue back in 6 s")


def test_a_run_that_never_recovers_says_so() -> None:
    requests, server = fluid_run(end=25.0)
    report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS)], T0, server)
    row = report.spikes.iloc[0]
    assert not row["recovered"] and np.isnan(row["recovery_s"])
    assert "not recovered within 9 s" in row["note"]
    assert "NOT recovered" in burst.spike_lines(report.spikes)[0]


def test_failed_and_dropped_requests_are_counted_per_spike() -> None:
    requests, server = fluid_run()
    t = (requests["scheduled_wall_ns"] - T0) / NS
    requests.loc[(t >= 12) & (t < 13), "outcome"] = "http_5xx"
    requests.loc[(t >= 13) & (t < 13.5), "outcome"] = "dropped"
    requests.loc[requests["outcome"] != "ok", ["ttft_s", "e2e_s"]] = np.nan
    report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS)], T0, server)
    row = report.spikes.iloc[0]
    assert (row["failed"], row["dropped"]) == (30, 15)
    timeline = report.timelines[1]
    assert timeline.loc[timeline["t_s"] == 2.0, "error_rate"].item() == 1.0


def test_a_second_spike_takes_its_baseline_after_the_first_recovered() -> None:
    requests, server = fluid_run(end=50.0)
    # a second, small spike at 40 s: its baseline starts when the first one recovered (35 s)
    spikes = [burst.Spike(T0 + 10 * NS, T0 + 15 * NS), burst.Spike(T0 + 40 * NS, T0 + 41 * NS)]
    report = burst.analyze(requests, spikes, T0, server)
    first, second = report.spikes.iloc[0], report.spikes.iloc[1]
    assert first["recovery_s"] == 20.0 and first["horizon_s"] == 25.0
    assert second["baseline_s"] == 5.0
    assert second["baseline_ttft_p95_s"] == pytest.approx(0.03)


def test_spikes_from_a_bursts_plan_and_from_a_schedule() -> None:
    plan = {"kind": "bursts", "base_rps": 5, "peak_rps": 30, "spike_s": 5, "period_s": 20,
            "first_spike_s": 10, "spacing": "even", "path": "/x/arrivals.yaml"}
    spikes = burst.plan_spikes(plan, T0, 45)
    assert [(s.start_ns - T0, s.end_ns - T0, s.peak_rps) for s in spikes] == [
        (10 * NS, 15 * NS, 30.0), (30 * NS, 35 * NS, 30.0)]
    assert burst.plan_spikes({"kind": "poisson", "rate_rps": 3}, T0, 45) == []
    requests, _ = fluid_run()
    found = burst.schedule_spikes(requests["scheduled_wall_ns"].to_numpy(), T0)
    assert [(s.start_ns - T0, s.end_ns - T0, s.source) for s in found] == [
        (10 * NS, 15 * NS, "schedule")]
    # Poisson noise at a steady rate is no spike
    rng = np.random.default_rng(0)
    steady = T0 + np.sort(rng.uniform(0, 300, 300 * 20) * NS).astype("int64")
    assert burst.schedule_spikes(steady, T0) == []


def test_spike_lines_give_peak_failed_and_recovery() -> None:
    requests, server = fluid_run()
    report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS, 30.0)], T0, server)
    (line,) = burst.spike_lines(report.spikes)
    assert line.startswith("spike 1 at 10.0 s (5 s, planned 30 req/s): peak P95 TTFT ")
    assert "(baseline 30 ms), failed 0, dropped 0, recovered in 20 s" in line
    assert burst.format_bursts(None) == ""


def test_a_bursty_schedule_prints_a_bounded_list() -> None:
    requests, server = fluid_run(end=50.0)
    spikes = [burst.Spike(T0 + k * NS, T0 + (k + 1) * NS) for k in range(10, 40, 2)]
    text = burst.format_bursts(burst.analyze(requests, spikes, T0, server), max_lines=4)
    lines = text.splitlines()
    assert len(lines) == 2 + 4 + 1 and lines[-1].startswith("... and 11 more spikes (")


def test_a_spike_at_the_end_or_the_start_cannot_be_judged() -> None:
    requests, server = fluid_run(end=15.0)  # the schedule ends with the spike
    report = burst.analyze(requests, [burst.Spike(T0 + 10 * NS, T0 + 15 * NS)], T0, server)
    assert "recovery unknown: no window after the spike" in burst.spike_lines(report.spikes)[0]
    report = burst.analyze(requests, [burst.Spike(T0, T0 + 2 * NS)], T0, server)
    assert report.spikes.iloc[0]["note"].startswith("recovery unknown: no baseline")


def _task_run(run_dir, plan: dict[str, object]) -> None:
    """A run folder of agent tasks arriving one a second for 60 s; every tenth fans out to 20
    sub-agents at once 0.5 s after it arrived (its reaction, not load offered)."""
    import json

    from collectors.parquet_sink import RollingParquetWriter
    from collectors.schemas import REQUEST_SCHEMA

    rows = []
    for k in range(60):
        t = T0 + k * NS
        fan = 20 if k % 10 == 0 else 2
        calls = [(0, [], t)] + [(j, [0], t + NS // 2) for j in range(1, fan + 1)]
        rows += [{"run_id": "r", "request_id": f"{k}-{j}", "worker_id": "w",
                  "session_id": f"t{k}#{k}", "turn": j, "depends_on": deps, "agent": "a",
                  "outcome": "ok", "scheduled_wall_ns": at, "sent_wall_ns": at, "ttft_s": 0.05,
                  "e2e_s": 0.2} for j, deps, at in calls]
    writer = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA, prefix="m")
    writer.append_rows(rows)
    writer.close()
    (run_dir / "manifest.json").write_text(json.dumps(
        {"run_id": "r", "load": {"plan": plan, "duration_s": 60.0}}))


def test_a_task_fanning_out_is_no_spike_and_a_closed_loop_has_none(tmp_path) -> None:
    """Spikes are looked for in the arrivals: a session's or task's later calls follow its own
    answers (a fan-out of 20 sub-agents, in a closed loop the next task as one ends)."""
    for kind, plan in (("poisson", {"kind": "poisson", "rate_rps": 1.0}),
                       ("closed", {"kind": "closed", "concurrency": 2})):
        _task_run(tmp_path / kind, plan)
        assert burst.burst_report(tmp_path / kind) is None, kind
    requests = burst.load_requests(tmp_path / "poisson")
    assert len(burst.arrival_times(requests)) == 60
    # every call counted as load would find the six fan-outs
    assert len(burst.schedule_spikes(requests["scheduled_wall_ns"].to_numpy(), T0)) == 6
