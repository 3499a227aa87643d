"""Task figures over a hand-built request table: a known graph with known times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboards.analysis import tasks as ta

_MS = 1_000_000  # ns
T0_NS = 1_700_000_000 * 1_000_000_000


def _record(task: str, turn: int, agent: str, deps: list[int], scheduled_ms: float,
            sent_ms: float, e2e_ms: float | None, outcome: str = "ok", step: str | None = None,
            prompt: int = 1000, reusable: int = 800, cached: int | None = 768,
            tool_wait_ms: float | None = None) -> dict[str, object]:
    return {"session_id": task, "turn": turn, "turn_step": step, "depends_on": deps,
            "agent": agent, "outcome": outcome, "scheduled_wall_ns": int(scheduled_ms * _MS),
            "sent_wall_ns": int(sent_ms * _MS), "ttft_s": 0.1 if outcome == "ok" else None,
            "e2e_s": None if e2e_ms is None else e2e_ms / 1e3, "prompt_tokens": prompt,
            "reusable_tokens": reusable, "cached_tokens": cached,
            "tool_wait_s": None if tool_wait_ms is None else tool_wait_ms / 1e3,
            "history_tokens": 0}


def _good_task(task: str = "t#0", origin_ms: float = 0.0, cached: bool = True
               ) -> list[dict[str, object]]:
    """planner -> three workers (worker-1 a tool loop) -> joiner. Times in ms from origin:
    planner scheduled 0, sent 10 (10 ms of generator lag), 1000 ms long, ends 1010;
    workers scheduled 1110 (100 ms think time): worker-0 sent 1110 for 2000 ms (ends 3110);
    worker-1 sent 1120 (10 ms lag), its tool call 500 ms, the tool 300 ms, the final answer
    1500 ms (ends 3420); worker-2 sent 1110 for 500 ms (ends 1610); joiner (on the planner's
    context) scheduled 3470 (50 ms after worker-1, the last), sent then, 800 ms (ends 4270)."""
    o = origin_ms
    c = (lambda v: v) if cached else (lambda v: None)
    return [
        _record(task, 0, "planner", [], o, o + 10, 1000, prompt=1000, reusable=800,
                cached=c(768)),
        _record(task, 1, "worker-0", [0], o + 1110, o + 1110, 2000, prompt=2000,
                reusable=1800, cached=c(1792)),
        _record(task, 2, "worker-1", [0], o + 1110, o + 1120, 500, step="tool_call",
                prompt=2000, reusable=1800, cached=c(1792)),
        _record(task, 2, "worker-1", [0], o + 1110, o + 1920, 1500, step="final",
                prompt=2600, reusable=2500, cached=c(2496), tool_wait_ms=300),
        _record(task, 3, "worker-2", [0], o + 1110, o + 1110, 500, prompt=2000,
                reusable=1800, cached=c(1792)),
        _record(task, 4, "joiner", [0, 1, 2, 3], o + 3470, o + 3470, 800, prompt=3000,
                reusable=2500, cached=c(1024)),
    ]


def _failed_task(task: str = "u#1", origin_ms: float = 10_000.0) -> list[dict[str, object]]:
    """planner ok, worker-0 a 5xx after 200 ms, worker-1 ok, the joiner never sent."""
    o = origin_ms
    return [
        _record(task, 0, "planner", [], o, o, 1000),
        _record(task, 1, "worker-0", [0], o + 1000, o + 1000, 200, outcome="http_5xx"),
        _record(task, 2, "worker-1", [0], o + 1000, o + 1000, 700),
        _record(task, 3, "joiner", [1, 2], o + 1700, o + 1700, None, outcome="session_ended"),
    ]


def _requests(*tasks: list[dict[str, object]]) -> pd.DataFrame:
    rows = [r for t in tasks for r in t]
    rows.append({"session_id": None, "turn": None, "outcome": "ok", "sent_wall_ns": 0,
                 "e2e_s": 0.1, "depends_on": None})  # a lone request: no task
    rows.append({"session_id": "s#9", "turn": 0, "outcome": "ok", "sent_wall_ns": 0,
                 "e2e_s": 0.1, "depends_on": None})  # a plain session's turn: no task
    return pd.DataFrame(rows)


def test_task_time_and_critical_path_of_a_known_graph() -> None:
    task = ta.per_task(_requests(_good_task())).set_index("session_id").loc["t#0"]
    assert task["calls"] == 5 and task["calls_ok"] == 5 and task["outcome"] == "ok"
    # the joiner's wait on the planner is implied by the workers': not counted, as the build
    assert task["fan_out"] == 3 and task["depth"] == 3 and task["agents"] == 5
    assert task["task_s"] == pytest.approx(4.27, abs=1e-9)  # first schedule -> joiner's end
    # planner 1.0 + worker-1's 0.1 think + 2.3 (tool loop) + joiner's 0.05 + 0.8
    assert task["critical_path_s"] == pytest.approx(4.25, abs=1e-9)
    assert task["generator_delay_s"] == pytest.approx(0.02, abs=1e-9)  # two 10 ms lags
    assert task["path_server_s"] == pytest.approx(1.0 + 0.5 + 1.5 + 0.8, abs=1e-9)
    assert task["path_tool_s"] == pytest.approx(0.3, abs=1e-9)
    assert task["path_delay_s"] == pytest.approx(0.15, abs=1e-9)
    assert task["server_share"] == pytest.approx(3.8 / 4.25, abs=1e-12)


def test_each_call_has_its_place_in_the_graph() -> None:
    calls = ta.per_call(_requests(_good_task())).set_index("turn")
    assert len(calls) == 5  # the tool loop's final answer is part of its call
    assert calls["depth"].tolist() == [0, 1, 1, 1, 2]
    assert calls["on_critical_path"].tolist() == [True, False, True, False, True]
    assert calls.loc[2, "own_s"] == pytest.approx(2.3, abs=1e-9)
    assert calls.loc[2, "server_s"] == pytest.approx(2.0, abs=1e-9)
    assert calls.loc[2, "e2e_s"] == 0.5 and calls.loc[2, "ttft_s"] == 0.1
    assert calls.loc[4, "delay_s"] == pytest.approx(0.05, abs=1e-9)
    assert calls.loc[4, "path_s"] == pytest.approx(4.25, abs=1e-9)


def test_a_task_with_a_failed_call_is_not_ok_and_stays_out_of_the_percentiles() -> None:
    frame = _requests(_good_task(), _failed_task())
    tasks = ta.per_task(frame).set_index("session_id")
    failed = tasks.loc["u#1"]
    assert failed["outcome"] == "http_5xx" and failed["calls_ok"] == 2
    assert math.isnan(failed["critical_path_s"])
    assert failed["task_s"] == pytest.approx(1.7, abs=1e-9)  # until its last call ended
    assert ta.task_percentiles(tasks.reset_index())["task_p50_s"] == pytest.approx(4.27)
    calls = ta.per_call(frame)
    assert not calls.loc[calls["session_id"] == "u#1", "on_critical_path"].any()
    text = ta.format_tasks(frame)
    assert "tasks 2: ok 1, not ok 1 (http_5xx 1)" in text
    assert ("task time (ok tasks; 95% intervals over tasks): P50 4.27 s, P95 4.27 s, P99 "
            "4.27 s (no interval for P50 (needs 8 ok tasks), P95 (needs 80 ok tasks), P99 "
            "(needs 400 ok tasks): 1 ok)") in text


def test_task_percentiles_are_exact() -> None:
    times = np.random.default_rng(3).lognormal(0.0, 1.0, 501)
    tasks = pd.DataFrame({"task_s": np.append(times, 1e6),
                          "outcome": ["ok"] * 501 + ["http_5xx"]})
    got = ta.task_percentiles(tasks)
    for q in (50, 95, 99):
        assert got[f"task_p{q}_s"] == np.percentile(times, q, method="linear")


def test_the_cache_table_sets_the_server_hit_share_beside_a_perfect_cache() -> None:
    frame = _requests(*(_good_task(f"t#{k}", 10_000.0 * k) for k in range(6)))
    table = ta.cache_table(ta.per_call(frame)).set_index(["depth", "agent"])
    joiner = table.loc[(2, "joiner")]
    assert joiner["calls"] == 6 and joiner["reported"] == 6
    assert joiner["perfect_share"] == 2500 / 3000 and joiner["hit_share"] == 1024 / 3000
    assert joiner["gap"] == pytest.approx(2500 / 3000 - 1024 / 3000)
    # every task alike: the interval over tasks is the value itself
    assert joiner["hit_lo"] == pytest.approx(joiner["hit_hi"]) == pytest.approx(1024 / 3000)
    planner = table.loc[(0, "planner")]
    assert planner["perfect_share"] == 0.8 and planner["hit_share"] == 0.768


def test_the_cache_interval_spans_tasks_that_differ_and_absent_is_said() -> None:
    tasks = [_good_task(f"t#{k}", 10_000.0 * k) for k in range(40)]
    for k, task in enumerate(tasks):
        task[-1]["cached_tokens"] = 3000 if k % 2 else 0  # the joiner hit all or nothing
    table = ta.cache_table(ta.per_call(_requests(*tasks))).set_index("agent")
    joiner = table.loc["joiner"]
    assert joiner["hit_share"] == 0.5 and joiner["hit_lo"] < 0.5 < joiner["hit_hi"]
    absent = _requests(_good_task(cached=False))
    row = ta.cache_table(ta.per_call(absent)).set_index("agent").loc["joiner"]
    assert row["reported"] == 0 and math.isnan(row["hit_share"])
    text = ta.format_tasks(absent)
    assert "hit absent: the server reported no cached tokens" in text
    assert "    2 joiner            1 perfect 83.3%\n" in text + "\n"


def test_a_run_without_tasks_has_no_task_figures() -> None:
    frame = _requests()
    assert ta.per_call(frame).empty and ta.per_task(frame).empty
    assert ta.format_tasks(frame) == "" and ta.step_figures(frame, (0, 10**12)) == {}


def test_a_study_step_gets_task_time_and_the_task_slo_is_judged_on_it() -> None:
    frame = _requests(_good_task(), _failed_task())
    figures = ta.step_figures(frame, (0, int(5e9)))  # only t#0 began in the window
    assert figures["tasks"] == 1 and figures["tasks_ok"] == 1.0
    assert figures["task_p95_s"] == pytest.approx(4.27) and "task_p90_s" in figures
    assert ta.task_slo_met(figures, {"task_ms": 5000, "percentile": "p95"}) is True
    assert ta.task_slo_met(figures, {"task_ms": 4000, "percentile": "p95"}) is False
    assert ta.task_slo_met(figures, {"ttft_ms": 500}) is None
    assert ta.task_slo_met({}, {"task_ms": 4000}) is False  # no task timed


def test_the_task_drawn_is_the_one_asked_for_and_its_timeline_shows_each_dependency() -> None:
    frame = _requests(*(_good_task(f"t#{k}", 10_000.0 * k) for k in range(3)), _failed_task())
    frame.loc[frame["session_id"].eq("t#2"), "e2e_s"] *= 2  # the slowest task
    tasks = ta.per_task(frame)
    assert ta.pick_task(tasks, "slowest") == "t#2"
    assert ta.pick_task(tasks, "first not ok") == "u#1"
    assert ta.pick_task(tasks, "nearest P50") in ("t#0", "t#1")
    with pytest.raises(ValueError, match="one of nearest P50"):
        ta.pick_task(tasks, "median")
    line = ta.timeline(ta.per_call(frame), "t#0")
    joiner = line[line["call"] == 4]
    assert joiner["dep"].tolist() == [0, 1, 2, 3]  # an edge per dependency into the joiner
    assert joiner["from_end_s"].tolist() == pytest.approx([1.01, 3.11, 3.42, 1.61])
    assert line.drop_duplicates("call")["on_critical_path"].tolist() == [
        True, False, True, False, True]


def _write_task_run(results: Path) -> Path:
    """A run folder of six good tasks and one that failed, as the product writes it."""
    from collectors.parquet_sink import RollingParquetWriter
    from collectors.schemas import REQUEST_SCHEMA

    run_dir = results / "agents"
    rows = [r for k in range(6) for r in _good_task(f"t#{k}", 10_000.0 * k)]
    rows += _failed_task("u#6", 60_000.0)
    for row in rows:
        row.update(run_id="agents", worker_id="h:1:0", request_id=f"r{id(row)}",
                   endpoint="chat", output_tokens=16,
                   sent_wall_ns=T0_NS + row["sent_wall_ns"],
                   scheduled_wall_ns=T0_NS + row["scheduled_wall_ns"])
    writer = RollingParquetWriter(run_dir / "requests", REQUEST_SCHEMA, prefix="m")
    writer.append_rows(rows)
    writer.close()
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": "agents", "started_at": "2023-11-14T22:13:20Z",
        "ended_at": "2023-11-14T22:14:30Z", "gpu": {"available": False, "reason": "none"}}))
    return run_dir


def test_the_summary_prints_task_percentiles_beside_the_calls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.summary import print_details

    print_details(_write_task_run(tmp_path / "results"))
    text = capsys.readouterr().out
    assert "tasks 7: ok 6, not ok 1 (http_5xx 1)" in text
    assert "sessions: per turn" not in text  # a call's index is no turn of a conversation
    assert ("task time (ok tasks; 95% intervals over tasks): P50 4.27 s, P95 4.27 s, "
            "P99 4.27 s (no interval for P50 (needs 8 ok tasks), P95 (needs 80 ok tasks), P99 "
            "(needs 400 ok tasks): 6 ok)") in text
    assert "    2 joiner            6 perfect 83.3% [83.3%, 83.3%], hit 34.1%" in text


def test_the_run_page_shows_the_tasks_view(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    from dashboards import launch

    run_dir = _write_task_run(tmp_path / "results")
    monkeypatch.setenv("SWARMLOAD_RESULTS", str(run_dir.parent))
    app = Path(launch.__file__).with_name("app.py")
    at = AppTest.from_file(str(app), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Tasks"] == "7" and metrics["Tasks ok"] == "6"
    assert "Sessions" not in metrics  # tasks have their own section
    assert metrics["Task P95 (s)"] == "4.270"
    assert any(c.value.startswith("task time, 95% intervals from a bootstrap over ok tasks: "
                                  "P50 4.27 s, P95 4.27 s, P99 4.27 s (no interval for P50")
               for c in at.caption)
    markdown = "\n".join(m.value for m in at.markdown)
    # the cache table's joiner row: 6 ok calls, perfect 2500 / 3000, hit 1024 / 3000
    assert "| 2 | joiner | 6 | 3000.0 | 83.3% [83.3%, 83.3%] | 34.1% [34.1%, 34.1%] | 49.2 |" \
        in markdown
    assert any("critical path on the server" in c.value.lower() for c in at.caption)
    at = at.selectbox(key="task_choice").select("first not ok").run()
    assert not at.exception, [e.value for e in at.exception]


def test_a_study_step_holds_the_task_time_slo() -> None:
    from dashboards.analysis.study import slo_met, summarize_step

    frame = _requests(_good_task(), _failed_task()).dropna(subset=["session_id"])
    frame = frame.assign(bucket="short", output_tokens=16, tpot_s=0.01, itl_s=None,
                         schedule_lag_s=0.0, sent_wall_ns=frame["sent_wall_ns"] + T0_NS,
                         scheduled_wall_ns=frame["scheduled_wall_ns"] + T0_NS)
    window = (T0_NS, T0_NS + int(5e9))
    figures = ta.step_figures(frame, window)
    for limit, held in ((5000, True), (4000, False)):
        slo = {"task_ms": limit, "error_rate": 1.0, "percentile": "p95"}
        rows = summarize_step(frame, window, slo, "concurrency", figures)
        assert rows["task_p95_s"].tolist() == pytest.approx([4.27, 4.27])  # short, all
        assert rows["slo_met"].tolist() == [held, held]
        assert rows["sustainable"].tolist() == [held, held]
    assert not slo_met({"error_rate": 0.0}, {"task_ms": 5000})  # no task timed: not held


def test_compare_sets_task_time_beside_the_other_figures(tmp_path: Path) -> None:
    from dashboards.analysis import compare

    _write_task_run(tmp_path / "results")
    side = compare.side_by_side(compare.discover([tmp_path / "results"]))
    text = compare.side_by_side_text(side)["agents"]
    assert text["Tasks"] == "7" and text["Task P95"] == "4270.0 ms"


def test_the_study_page_says_the_task_time_slo() -> None:
    from dashboards.analysis.study_data import slo_text

    slo = {"ttft_ms": 500, "task_ms": 20000, "error_rate": 0.01, "percentile": "p95"}
    assert slo_text(slo) == "P95 TTFT <= 500 ms, P95 task time <= 20 s, errors <= 1%"


def _lognormal_tasks(n: int, seed: int) -> pd.DataFrame:
    times = np.random.default_rng(seed).lognormal(0.0, 0.4, n)
    return pd.DataFrame({"task_s": times, "outcome": "ok"})


def test_task_intervals_hold_the_known_percentile_and_narrow_with_more_tasks() -> None:
    from scipy import stats

    true = {q: math.exp(0.4 * stats.norm.ppf(q / 100)) for q in (50, 95)}
    held = dict.fromkeys(true, 0)
    for seed in range(40):
        got = ta.task_intervals(_lognormal_tasks(400, seed), draws=200, seed=seed)
        for q, value in true.items():
            held[q] += got[f"task_p{q}_s_lo"] <= value <= got[f"task_p{q}_s_hi"]
    assert held[50] >= 34 and held[95] >= 32, held  # 95% nominal; 85% / 80% of 40 seeds

    def width(n: int) -> float:
        got = ta.task_intervals(_lognormal_tasks(n, 1), draws=200)
        return got["task_p95_s_hi"] - got["task_p95_s_lo"]

    assert width(1600) < width(400) / 1.5 < width(100) / 2.25


def test_no_task_interval_under_the_stated_minimum() -> None:
    got = ta.task_intervals(_lognormal_tasks(79, 0))
    assert math.isnan(got["task_p95_s_lo"]) and math.isnan(got["task_p99_s_hi"])
    assert got["task_p50_s_lo"] < got["task_p50_s_hi"]
    assert ta.interval_note(79) == ("no interval for P95 (needs 80 ok tasks), P99 (needs 400 "
                                    "ok tasks): 79 ok")
    figures = {"task_p95_s": 8.68, "task_p95_s_lo": 8.27, "task_p95_s_hi": 9.789}
    assert ta.percentile_text(figures, 95) == "P95 8.68 s [8.27, 9.79]"
    assert ta.interval_note(400) == ""


def _solo_tasks(n: int, median_s: float, seed: int) -> pd.DataFrame:
    """``n`` one-call tasks over 100 s from T0_NS, lognormal task times (median ``median_s``)
    as a study step's records."""
    rng = np.random.default_rng(seed)
    starts = (T0_NS + np.sort(rng.uniform(0, 100, n)) * 1e9).astype("int64")
    return pd.DataFrame({
        "session_id": [f"t{i}#0" for i in range(n)], "turn": 0, "turn_step": None,
        "depends_on": [[] for _ in range(n)], "agent": "solo", "outcome": "ok",
        "scheduled_wall_ns": starts, "sent_wall_ns": starts, "ttft_s": 0.1,
        "e2e_s": rng.lognormal(math.log(median_s), 0.3, n), "prompt_tokens": 100,
        "reusable_tokens": 0, "cached_tokens": None, "bucket": "short", "output_tokens": 16,
        "tpot_s": 0.01, "itl_s": None, "schedule_lag_s": 0.0})


def _task_study(slo: dict[str, object], cached_before: bool = False
                ) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Two configurations (b's tasks 1.5x a's) at 1 and 2 users: points, draws, capacity
    (``cached_before``: cohorts without task times, as cached before task draws)."""
    from dashboards.analysis import study

    window = (T0_NS, T0_NS + int(100e9))
    steps, cohorts = [], {}
    for config, median in (("a", 2.0), ("b", 3.0)):
        for load in (1.0, 2.0):
            frame = _solo_tasks(int(200 * load), median * load, int(load * 10))
            rows = study.summarize_step(frame, window, slo, "concurrency",
                                        ta.step_figures(frame, window))
            run_dir = f"{config}/{load:g}"
            steps.append(rows.assign(config=config, step=int(load), offered_load=load,
                                     load_kind="concurrency", run_dir=run_dir))
            cohorts[run_dir] = frame if cached_before else frame.assign(
                task_s=ta.opening_task_times(frame, window).to_numpy())
    points, draws = study.points_table(pd.concat(steps, ignore_index=True), cohorts, slo)
    capacity = study.capacity_with_intervals(points, draws, slo, "ttft", ["a", "b"])
    return points, draws, capacity


def test_a_task_slo_study_point_gets_an_interval_drawn_over_tasks() -> None:
    slo = {"task_ms": 5000, "error_rate": 1.0, "percentile": "p95"}
    points, _, capacity = _task_study(slo)
    b1 = points[(points["config"] == "b") & (points["offered_load"] == 1.0)
                & (points["bucket"] == "all")].iloc[0]
    assert b1["task_p95_s_lo"] < b1["task_p95_s"] < b1["task_p95_s_hi"]
    assert b1["task_p95_s_lo"] < 5.0 < b1["task_p95_s_hi"]  # the SLO inside its interval:
    assert b1["sustainable"] and 0.5 < b1["sustainable_draws"] < 1.0  # some draws fail it
    b = capacity.set_index("config").loc["b"]
    assert b["max_sustainable_load"] == 1.0 and b["max_load_lo"] < 1.0  # the draws' doubt
    # cohorts cached before task draws: the point's own figure, no interval, all or nothing
    old, _, old_capacity = _task_study(slo, cached_before=True)
    b1 = old[(old["config"] == "b") & (old["offered_load"] == 1.0)].iloc[0]
    assert "task_p95_s_lo" not in old and b1["task_p95_s"] == pytest.approx(4.6458, abs=1e-4)
    assert b1["sustainable_draws"] == 1.0
    assert old_capacity.set_index("config").loc["b", "max_load_lo"] == 1.0


def test_the_verdict_names_the_task_time_difference_at_a_common_load() -> None:
    from dashboards.analysis.study_verdict import verdict_table

    slo = {"task_ms": 5000, "error_rate": 1.0, "percentile": "p95"}
    points, draws, capacity = _task_study(slo)
    verdict = verdict_table(points, draws, capacity, slo, ["a", "b"])
    row = verdict[(verdict["figure"] == "task_p95_s") & (verdict["offered_load"] == 2.0)].iloc[0]
    assert 0 < row["lo"] < row["change"] < row["hi"] and not row["within_noise"]
    assert row["text"] == (f"at 2: task P95 b - a = {row['change']:+.2f} s "
                           f"[{row['lo']:+.2f}, {row['hi']:+.2f}]")
    summary = verdict[verdict["kind"] == "summary"]["text"].iloc[0]
    assert summary.endswith(f"; task P95 b - a = {row['change']:+.2f} s "
                            f"[{row['lo']:+.2f}, {row['hi']:+.2f}]"), summary
    # an SLO without task time: no task row
    plain = {"error_rate": 1.0, "percentile": "p95"}
    assert "task_p95_s" not in set(verdict_table(points, draws, capacity, plain,
                                                 ["a", "b"])["figure"])


def test_a_study_steps_cohort_carries_each_ok_tasks_time_once(tmp_path: Path) -> None:
    from dashboards.analysis import study

    rows, cohort = study.measure_step(
        _write_task_run(tmp_path / "results"), config="a", step=0, offered_load=1.0,
        load_kind="concurrency", slo={"task_ms": 5000}, step_duration_s=1e6, warmup_s=0.0,
        cooldown_s=0.0)
    assert rows["tasks"].iloc[0] == 7  # 6 ok, one not: only the ok ones are drawn
    assert cohort["task_s"].dropna().tolist() == pytest.approx([4.27] * 6)
