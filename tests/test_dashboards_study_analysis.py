"""dashboards.analysis.study on synthetic studies whose capacity is known exactly.

Each step's requests come from a small discrete-event model of a c-slot server with a fixed
service time (an M/D/c queue fed by Poisson arrivals), written as ordinary run folders: the
analysis must find capacity c / service from the records alone.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collectors import run_folder
from collectors.schemas import REQUEST_SCHEMA
from dashboards.analysis import study as sa

T0_NS = 1_750_000_000 * 1_000_000_000
SERVICE_S = 0.4
OUTPUT_TOKENS = 16
STEP_S = 20.0
SLO = {"ttft_ms": 2000.0, "tpot_ms": 50.0, "error_rate": 0.01, "percentile": "p95"}


def _queue_records(rate: float, slots: int, seed: int, error_every: int = 0) -> list[dict]:
    """Poisson arrivals for STEP_S seconds into ``slots`` FIFO servers of SERVICE_S each."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * STEP_S * 2)))
    arrivals = arrivals[arrivals < STEP_S]
    free_at = [0.0] * slots
    records = []
    step_s = SERVICE_S / OUTPUT_TOKENS
    for i, t in enumerate(arrivals):
        start = max(t, heapq.heappop(free_at))
        heapq.heappush(free_at, start + SERVICE_S)
        ttft = start - t + step_s
        e2e = start - t + SERVICE_S
        failed = error_every and i % error_every == 0
        sent = T0_NS + int(t * 1e9)
        records.append({
            "run_id": "r", "worker_id": "h:1:0", "request_id": f"q{i}",
            "bucket": "short" if i % 2 else "medium", "outcome": "http_5xx" if failed else "ok",
            "scheduled_wall_ns": sent, "sent_wall_ns": sent, "schedule_lag_s": 0.0,
            "ttft_s": None if failed else ttft, "e2e_s": 0.01 if failed else e2e,
            "tpot_s": None if failed else (e2e - ttft) / (OUTPUT_TOKENS - 1),
            "itl_s": None if failed else [step_s] * (OUTPUT_TOKENS - 1),
            "prompt_tokens": 20, "output_tokens": None if failed else OUTPUT_TOKENS,
        })
    return records


def _write_study(study_dir: Path, configs: dict[str, tuple[int, list[float]]],
                 error_every: int = 0) -> None:
    steps = []
    for name, (slots, rates) in configs.items():
        for k, rate in enumerate(rates, 1):
            run_dir = study_dir / name / f"step-{k}"
            (run_dir / "requests").mkdir(parents=True)
            records = _queue_records(rate, slots, seed=k, error_every=error_every)
            table = pa.Table.from_pylist(records, schema=REQUEST_SCHEMA)
            pq.write_table(table, run_dir / "requests" / "part-0.parquet")
            steps.append({"config": name, "step": k, "offered_load": rate, "load_kind": "rate",
                          "run_dir": f"{name}/step-{k}", "status": "done", "phase": "sweep",
                          "stopped": None})
    study = {"name": "synthetic", "status": "finished", "slo": SLO, "step_duration_s": STEP_S,
             "warmup_s": 2.0, "cooldown_s": 1.0, "knee_metric": "ttft",
             "configurations": [{"name": n, "target": "sim", "args": []} for n in configs],
             "steps": steps}
    (study_dir / run_folder.STUDY_FILE).write_text(json.dumps(study))


def test_capacity_and_knee_of_two_known_queues(tmp_path: Path) -> None:
    capacities = {"slots-4": 4 / SERVICE_S, "slots-8": 8 / SERVICE_S}  # 10 and 20 req/s
    fractions = [0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.4]
    _write_study(tmp_path, {name: (int(c * SERVICE_S), [round(c * f, 3) for f in fractions])
                            for name, c in capacities.items()})
    steps, capacity = sa.rollup_study(tmp_path)

    written_steps, written_capacity = sa.load_rollup(tmp_path)
    pd.testing.assert_frame_equal(written_steps, steps)
    assert list(written_capacity["config"]) == ["slots-4", "slots-8"]
    assert set(steps["bucket"]) == {"short", "medium", "all"}
    assert len(steps) == 2 * len(fractions) * 3
    for name, c in capacities.items():
        row = capacity.set_index("config").loc[name]
        assert row["max_load_reached"] and row["knee_reached"], row["note"]
        assert abs(row["max_sustainable_load"] - c) <= 0.1 * c, row
        assert abs(row["knee_load"] - c) <= 0.1 * c, row
        assert row["metric"] == "ttft_p95_s"
        mine = steps[(steps["config"] == name) & (steps["bucket"] == "all")]
        over = mine[mine["offered_load"] >= 1.2 * c]
        # over capacity the achieved rate is the capacity, not the offered load
        assert np.allclose(over["achieved_req_per_s"], c, rtol=0.06), over["achieved_req_per_s"]
        under = mine[mine["offered_load"] <= 0.7 * c]
        assert (under["achieved_ratio"] > 0.97).all() and under["sustainable"].all()
        # bucket rows share the all row's span, so they add up
        for _, group in steps[steps["config"] == name].groupby("step"):
            buckets = group[group["bucket"] != "all"]["achieved_req_per_s"].sum()
            assert buckets == pytest.approx(group[group["bucket"] == "all"][
                "achieved_req_per_s"].iloc[0])
        # a deterministic 25 ms decode step: TPOT is exactly that, and every SLO-met request
        # under capacity is goodput
        assert np.allclose(mine["tpot_p95_s"], SERVICE_S / OUTPUT_TOKENS)
        assert np.allclose(under["goodput_req_per_s"], under["achieved_req_per_s"])


def test_errors_above_the_limit_make_a_step_unsustainable(tmp_path: Path) -> None:
    _write_study(tmp_path, {"flaky": (8, [4.0, 8.0])}, error_every=20)  # 5% HTTP 5xx
    steps, capacity = sa.rollup_study(tmp_path)
    all_rows = steps[steps["bucket"] == "all"]
    assert np.allclose(all_rows["error_rate"], 0.05, atol=0.02)
    assert np.allclose(all_rows["err_http_5xx"], all_rows["error_rate"])
    assert (all_rows["err_timeout_before_first_token"] == 0).all()  # every class has a column
    assert not all_rows["slo_met"].any()
    row = capacity.iloc[0]
    assert math.isnan(row["max_sustainable_load"]) and not row["max_load_reached"]
    assert "below the lowest step" in row["note"]


def test_knee_flags() -> None:
    flat_then_steep = sa.find_knee([1, 2, 4, 8, 16, 32], [0.1, 0.1, 0.11, 0.12, 0.9, 2.5])
    # the bend at 8, placed between its neighbours by the broken line through every point
    assert 4 < flat_then_steep["knee_load"] < 16 and flat_then_steep["knee_reached"]
    # a noisy dip does not make a bend: the isotonic fit pools it with its neighbour
    noisy = sa.find_knee([1, 2, 3, 4], [0.2, 0.1, 0.2, 0.21])
    assert noisy["curve"]["monotone_s"] == pytest.approx([0.15, 0.15, 0.2, 0.21])
    assert not noisy["knee_reached"]
    # nor does a spike at the lowest load lift the whole floor
    spike = sa.find_knee([5, 10, 15, 18, 22, 28], [0.54, 0.11, 0.12, 0.22, 0.64, 2.75])
    assert 15 < spike["knee_load"] < 28 and spike["knee_reached"]
    # a sweep whose curve flattens at its end: kneed alone answered with the last load (14)
    flattening = sa.find_knee([5, 7.5, 9.2, 10.8, 14], [0.072, 0.135, 0.314, 1.955, 2.7])
    assert 7.5 < flattening["knee_load"] < 10.8 and flattening["knee_reached"]
    still_flat = sa.find_knee([1, 2, 4, 8], [0.1, 0.1, 0.1, 0.1])
    assert math.isnan(still_flat["knee_load"]) and not still_flat["knee_reached"]


def test_the_knee_is_found_between_the_steps_wherever_they_fall() -> None:
    # a hinge at 10 (flat, then 0.2 s per unit of load), swept with steps that straddle it
    # differently: the knee lands within 2% of 10, not on whichever step is nearest
    for loads in ([5, 9.4, 11.1, 13, 16], [6, 8.3, 10.9, 14], [4, 7, 9.8, 12.5, 17]):
        x = np.asarray(loads, dtype=float)
        knee = sa.find_knee(x, 0.1 + 0.2 * np.maximum(0.0, x - 10.0))
        assert abs(knee["knee_load"] - 10.0) <= 0.2 and knee["knee_reached"], (loads, knee)


def test_a_rate_knee_is_read_on_the_arrivals_each_load_received() -> None:
    rows = pd.DataFrame({"load_kind": "rate", "offered_load": [32.0, 39.0, 41.0, 44.0],
                         "offered_req_per_s": [32.2, 38.1, 40.2, 44.6]})
    assert list(sa.knee_axis(rows)) == [32.2, 38.1, 40.2, 44.6]
    # arrivals out of order (a generator far behind), or closed-loop users: the setting
    assert list(sa.knee_axis(rows.assign(offered_req_per_s=[32.2, 41.0, 40.2, 44.6]))) == [
        32.0, 39.0, 41.0, 44.0]
    assert list(sa.knee_axis(rows.assign(load_kind="concurrency"))) == [32.0, 39.0, 41.0, 44.0]


def test_slo_met_needs_every_metric_at_the_percentile() -> None:
    row = {"ttft_p95_s": 0.4, "tpot_p95_s": 0.06, "error_rate": 0.0}
    assert not sa.slo_met(row, {"ttft_ms": 500, "tpot_ms": 50, "percentile": "p95"})
    assert sa.slo_met(row, {"ttft_ms": 500, "tpot_ms": 70, "percentile": "p95"})
    assert not sa.slo_met({**row, "ttft_p95_s": math.nan}, {"ttft_ms": 500})
    assert not sa.slo_met({**row, "error_rate": 0.02}, {"ttft_ms": 500, "error_rate": 0.01})


def test_a_step_whose_generator_fell_behind_is_named_by_the_knee(tmp_path: Path) -> None:
    _write_study(tmp_path, {"lagging": (8, [4.0, 8.0, 12.0])})
    # the last step's generator fell behind: 200 ms of schedule lag on every request
    part = tmp_path / "lagging" / "step-3" / "requests" / "part-0.parquet"
    frame = pq.read_table(part).to_pandas()
    frame["schedule_lag_s"] = 0.2
    pq.write_table(pa.Table.from_pandas(frame, schema=REQUEST_SCHEMA, preserve_index=False), part)
    steps, capacity = sa.rollup_study(tmp_path)
    verdicts = steps[steps["bucket"] == "all"].set_index("offered_load")["validity"]
    assert verdicts.to_dict() == {4.0: "valid", 8.0: "valid", 12.0: "generator_limited"}
    row = capacity.iloc[0]
    assert row["invalid_steps"] == 1
    assert "did not fully measure the server at 12 (generator_limited)" in row["note"]


def test_an_open_loop_knee_is_the_saturation_point_and_the_bend_is_kept_beside_it() -> None:
    import json

    from dashboards.analysis.study import apply_saturation_knee

    # C = 60 req/s: P50 TTFT leaves its floor at about 57 (waiting starts before the queue
    # saturates) and the loads that saturated it (66 and 72 req/s) completed 60.2 on average
    curve = {"load": [48.0, 57.0, 59.0, 62.0, 66.0, 72.0],
             "monotone_s": [0.15, 0.19, 0.30, 0.56, 0.97, 1.7]}
    capacity = pd.DataFrame([
        {"config": "open", "load_kind": "rate", "knee_load": 57.4, "knee_lo": 53.4,
         "knee_hi": 59.8, "knee_reached": True, "knee_latency_s": 0.2, "knee_kind": "bend",
         "bend_load": 57.4, "bend_lo": 53.4, "bend_hi": 59.8, "saturation_throughput": 60.2,
         "saturation_throughput_lo": 59.6, "saturation_throughput_hi": 60.9,
         "curve": json.dumps(curve), "note": "knee candidate only: latency did not at least "
         "double past it"},
        {"config": "below", "load_kind": "rate", "knee_load": 40.0, "knee_lo": 38.0,
         "knee_hi": 42.0, "knee_reached": False, "knee_latency_s": 0.2, "knee_kind": "bend",
         "bend_load": 40.0, "bend_lo": 38.0, "bend_hi": 42.0, "saturation_throughput": math.nan,
         "saturation_throughput_lo": math.nan, "saturation_throughput_hi": math.nan,
         "curve": json.dumps(curve), "note": ""},
        {"config": "closed", "load_kind": "concurrency", "knee_load": 8.0, "knee_lo": 7.5,
         "knee_hi": 8.5, "knee_reached": True, "knee_latency_s": 0.3, "knee_kind": "bend",
         "bend_load": 8.0, "bend_lo": 7.5, "bend_hi": 8.5, "saturation_throughput": math.nan,
         "saturation_throughput_lo": math.nan, "saturation_throughput_hi": math.nan,
         "curve": json.dumps(curve), "note": ""}])
    out = apply_saturation_knee(capacity).set_index("config")
    assert out.loc["open", "knee_load"] == 60.2 and out.loc["open", "knee_kind"] == "saturation"
    assert (out.loc["open", "knee_lo"], out.loc["open", "knee_hi"]) == (59.6, 60.9)
    assert out.loc["open", "bend_load"] == 57.4 and bool(out.loc["open", "knee_reached"])
    assert 0.30 < out.loc["open", "knee_latency_s"] < 0.56  # the curve's value at 60.2
    assert "candidate" not in out.loc["open", "note"]
    # no load saturated the open-loop sweep, or the users are closed-loop: the bend stays
    assert out.loc["below", "knee_load"] == 40.0 and out.loc["below", "knee_kind"] == "bend"
    assert out.loc["closed", "knee_load"] == 8.0 and out.loc["closed", "knee_kind"] == "bend"


def test_a_step_the_generator_failed_is_labelled_not_read_as_the_servers_limit(
        tmp_path: Path) -> None:
    # 8 slots: 20 req/s; every step is under it. At the top step the worker was overloaded on
    # purpose: it read each answer's first 14 tokens together (ITL gaps of 0, the later
    # time on all), so TTFT reads 2.5 s late and misses the 2 s SLO.
    _write_study(tmp_path, {"slots-8": (8, [8.0, 12.0, 16.0, 18.0])})
    part = tmp_path / "slots-8" / "step-4" / "requests" / "part-0.parquet"
    frame = pq.read_table(part).to_pandas()
    gap = SERVICE_S / OUTPUT_TOKENS
    frame["ttft_s"] = frame["ttft_s"] + 2.5
    frame["itl_s"] = [[0.0] * 14 + [gap * 15]] * len(frame)
    pq.write_table(pa.Table.from_pandas(frame, schema=REQUEST_SCHEMA, preserve_index=False), part)
    steps, capacity = sa.rollup_study(tmp_path)
    top = steps[(steps["bucket"] == "all") & (steps["offered_load"] == 18.0)].iloc[0]
    assert not top["sustainable"]  # the figures fail the SLO ...
    assert top["validity"] == "generator_limited"  # ... and are labelled the generator's
    assert "GENERATOR READ EVENTS TOGETHER" in top["validity_reasons"]
    assert "TTFT may read late by up to 5250.0 ms" in top["validity_reasons"]
    row = capacity.iloc[0]
    assert row["max_sustainable_load"] == 16.0
    assert not row["max_load_reached"], row["note"]  # no server limit found below 18
    assert "not taken as the server's limit" in row["note"] and ": 18" in row["note"]
    from dashboards.analysis import study_data

    (limited,) = study_data.generator_limited_steps(steps).to_dict("records")  # the Study page
    assert limited["offered_load"] == 18.0 and not limited["sustainable"]
    # the same failure with the events read apart is the server's: it bounds the capacity
    frame["itl_s"] = [[gap] * 15] * len(frame)
    pq.write_table(pa.Table.from_pandas(frame, schema=REQUEST_SCHEMA, preserve_index=False), part)
    steps, capacity = sa.rollup_study(tmp_path)
    assert capacity.iloc[0]["max_load_reached"]


def test_a_server_that_fell_behind_failed_on_its_own_whatever_the_generator_did() -> None:
    rows = pd.DataFrame({
        "offered_load": [10.0, 20.0, 30.0, 40.0],
        "sustainable": [True, False, False, False],
        "validity": ["generator_limited", "generator_limited", "generator_limited", "valid"],
        "achieved_ratio": [1.0, 0.99, 0.80, 0.99]})
    # 20: kept up, missed on the latency the generator bent; 30: fell behind its arrivals;
    # 40: the generator measured it; 10: passed
    assert sa.generator_failed_rows(rows).tolist() == [False, True, False, False]
    assert sa.generator_failed_rows(rows.assign(above_ceiling=[False, True, False, False])
                                    ).tolist() == [False, False, False, False]



def test_no_sustainable_step_names_the_limit_only_where_the_server_failed() -> None:
    def note(validity: list[str]) -> str:
        rows = pd.DataFrame({
            "config": "c", "bucket": "all", "step": [1, 2, 3], "load_kind": "concurrency",
            "offered_load": [4.0, 8.0, 12.0], "sustainable": [False] * 3,
            "ttft_p95_s": [2.0, 3.0, 4.0], "validity": validity})
        return sa.capacity_row(rows, {"ttft_ms": 1000, "percentile": "p95"}, "ttft")["note"]

    # the server failed the lowest load: its limit is below the sweep
    assert "the limit is below the lowest step" in note(["valid"] * 3)
    # the generator failed the lowest load, the server the next: below that one, not the lowest
    lower = note(["generator_limited", "valid", "valid"])
    assert "the limit is below 8, the lowest load the server itself failed" in lower, lower
    # the generator failed every load: nothing bounds the server
    unknown = note(["generator_limited"] * 3)
    assert "the server's limit is not measured" in unknown and "below" not in unknown, unknown
    assert "not taken as the server's limit" in unknown and ": 4, 8, 12" in unknown

def _task_records(rate: float, slots: int, seed: int) -> list[dict]:
    """Poisson task arrivals for STEP_S seconds; a task is a call, 3 calls after it in
    parallel and a join after them, every call a request of SERVICE_S on ``slots`` FIFO
    servers (sent once its dependencies finished)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * STEP_S * 2)))
    deps = [[], [0], [0], [0], [1, 2, 3]]
    ready = [(float(t), i, 0) for i, t in enumerate(arrivals[arrivals < STEP_S])]
    heapq.heapify(ready)
    free_at = [0.0] * slots
    ends: dict[tuple[int, int], float] = {}
    records = []
    while ready:
        t, task, call = heapq.heappop(ready)
        start = max(t, heapq.heappop(free_at))
        heapq.heappush(free_at, start + SERVICE_S)
        ends[task, call] = start + SERVICE_S
        for later, needs in enumerate(deps):
            if call in needs and all((task, d) in ends for d in needs):
                heapq.heappush(ready, (max(ends[task, d] for d in needs), task, later))
        sent = T0_NS + int(t * 1e9)
        records.append({
            "run_id": "r", "worker_id": "h:1:0", "request_id": f"t{task}-{call}",
            "bucket": "short", "outcome": "ok", "scheduled_wall_ns": sent, "sent_wall_ns": sent,
            "schedule_lag_s": 0.0, "ttft_s": start - t + SERVICE_S / OUTPUT_TOKENS,
            "e2e_s": start - t + SERVICE_S, "tpot_s": SERVICE_S / OUTPUT_TOKENS,
            "itl_s": [SERVICE_S / OUTPUT_TOKENS] * (OUTPUT_TOKENS - 1), "prompt_tokens": 20,
            "output_tokens": OUTPUT_TOKENS, "session_id": f"task-{task}#{task}", "turn": call,
            "depends_on": deps[call], "agent": "planner" if call in (0, 4) else f"w{call}"})
    return records


def _write_task_study(folder: Path, rates: tuple[float, ...], slo: dict[str, Any]) -> None:
    """A finished study of one configuration with a step of :func:`_task_records` per rate."""
    steps = []
    for k, rate in enumerate(rates, 1):
        run_dir = folder / "sim" / f"step-{k}"
        (run_dir / "requests").mkdir(parents=True)
        table = pa.Table.from_pylist(_task_records(rate, 8, seed=k), schema=REQUEST_SCHEMA)
        pq.write_table(table, run_dir / "requests" / "part-0.parquet")
        steps.append({"config": "sim", "step": k, "offered_load": rate, "load_kind": "rate",
                      "run_dir": f"sim/step-{k}", "status": "done", "phase": "sweep",
                      "stopped": None})
    study = {"name": "tasks", "status": "finished", "slo": slo,
             "step_duration_s": STEP_S, "warmup_s": 2.0, "cooldown_s": 1.0,
             "knee_metric": "ttft", "configurations": [{"name": "sim", "target": "sim"}],
             "steps": steps}
    (folder / run_folder.STUDY_FILE).write_text(json.dumps(study))


def test_a_task_workload_is_offered_and_achieved_in_tasks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rate plan of tasks: the ratio compares tasks with tasks. Five calls a task on 8 slots
    of 0.4 s: 20 calls/s, 4 tasks/s. At 2 tasks/s the server keeps up (the calls' own
    completion span, clustered by task, used to read anywhere from 50% to 500%); at 6 it falls
    behind."""
    _write_task_study(tmp_path, (2.0, 6.0), {**SLO, "ttft_ms": 60000.0})
    steps_table, _capacity = sa.rollup_study(tmp_path)
    rows = steps_table[steps_table["bucket"] == "all"].set_index("offered_load")
    assert (rows["arrival_unit"] == "tasks").all()
    from dashboards.analysis import study_data
    assert study_data.load_unit(steps_table) == "tasks/s"  # the Study page's load axis
    keeps_up, behind = rows.loc[2.0], rows.loc[6.0]
    # offered: the tasks that arrived (Poisson: within 25% of the plan over 17 s)
    assert keeps_up["offered_arrivals_per_s"] == pytest.approx(2.0, rel=0.25)
    assert behind["offered_arrivals_per_s"] == pytest.approx(6.0, rel=0.25)
    assert keeps_up["achieved_ratio"] == pytest.approx(1.0, abs=0.05)
    assert keeps_up["sustainable"]
    assert behind["achieved_ratio"] < 0.8 and not behind["sustainable"]
    # fallen behind, what it achieved is the pace of its calls: 20 calls/s, 4 tasks/s
    assert behind["achieved_arrivals_per_s"] == pytest.approx(4.0, rel=0.06)
    # the points (over repeats) judge the same, in tasks too
    points = pd.read_parquet(tmp_path / "rollup" / "points.parquet")
    points = points[points["bucket"] == "all"].set_index("offered_load")
    assert points.loc[2.0, "sustainable"] and not points.loc[6.0, "sustainable"]
    assert points.loc[6.0, "achieved_ratio"] == pytest.approx(behind["achieved_ratio"])
    from dashboards.analysis.study_verdict import arrivals_unit
    assert arrivals_unit(points.reset_index()) == "tasks/s"  # the verdict's sentences
    assert sa.main([str(tmp_path)]) == 0  # swarmload study rollup: the capacity table's legend
    assert "(loads in tasks/s;" in capsys.readouterr().out


def test_the_study_page_reads_a_task_study_by_its_task_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task study's Study page offers the tasks' time as a Metric: its table per step (the
    tasks are timed over the whole step, not per bucket), its curve with each point's interval,
    and the SLO's bound on it; a study of lone requests does not offer it."""
    _write_task_study(tmp_path, (1.0, 2.0), {**SLO, "ttft_ms": 60000.0, "task_ms": 3000.0})
    sa.rollup_study(tmp_path)
    from dashboards import study_charts, study_export
    from dashboards.analysis import study_data
    study = study_data.load_study(tmp_path)
    assert study_data.metrics_present(study.steps)["task"] == "task time"
    lone = study.steps.drop(columns=[c for c in study.steps if c.startswith("task_")])
    assert "task" not in study_data.metrics_present(lone)
    table = study_data.latency_table_ms(study.steps, "task", ("p50", "p95"))
    assert list(table.columns) == ["all P50", "all P95"]  # the whole step's, not a bucket's
    all_rows = study.steps[study.steps["bucket"] == "all"].sort_values("offered_load")
    assert table["all P95"].tolist() == pytest.approx((all_rows["task_p95_s"] * 1e3).tolist())
    bound = study_data.slo_threshold_s(study.slo, "task", "p95")
    assert bound == 3.0 and study_data.slo_threshold_s(study.slo, "task", "p99") is None
    view = study_data.select_steps(study.curves, "all")
    spec = study_charts.latency_vs_load(view, study.capacity, "task", "p95", None, bound)
    assert spec["title"] == "P95 task time (ms) vs offered load"
    assert {"y": 3000.0, "label": "SLO 3000 ms"} in [  # the task SLO's rule
        value for layer in spec["layer"] for value in layer.get("data", {}).get("values", [])]
    # each point's interval where it has the tasks for one: 17-34 tasks a step give a P50's
    # (8 or more), not a P95's (80)
    assert "task_p95_s_lo" not in view and view["task_p50_s_lo"].notna().all()
    spec = study_charts.latency_vs_load(view, study.capacity, "task", "p50")
    bars = [layer for layer in spec["layer"] if "y2" in layer["encoding"]]
    assert bars and bars[0]["encoding"]["y"]["field"] == "latency_ms_lo"
    # the page itself, opened at ?metric=task
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWARMLOAD_RESULTS", str(tmp_path))
    app = Path(study_data.__file__).parent.parent / "app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    at.switch_page("ui/study_page.py")
    at.query_params["metric"] = "task"
    at.query_params["section"] = "latency"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="study_metric").value == "task"
    assert "task time" in at.radio(key="study_metric").options
    assert "task time (ms, ok tasks of the whole step)" in [h.value for h in at.subheader]
    assert [list(t.value.columns) for t in at.table] == [["all P95", "all P99"]]
    text = study_export.export(tmp_path, tmp_path / "study.html", cdn=True).read_text()
    assert "<h2>task time (ms, ok tasks of the whole step)</h2>" in text
