"""Agent tasks in the load generator (locustfiles/sessions.py): a task's calls run as a graph on
one worker. The runner on a fake stream (dependencies, overlap, failures, the run's end), then a
real master, two workers and the simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import pandas as pd
import pytest
from locust_workers import wait_for_schedule_start, wait_for_worker
from task_frames import agent_frame, check_task_run, write_agent_workload

from collectors.run_folder import load_requests
from dashboards.analysis.runs import format_summary, summarize_run
from dashboards.analysis.tasks import per_call
from locustfiles.schedule_items import session_items
from locustfiles.sessions import SessionRun
from locustfiles.streaming import StreamTiming, mark_cancelled
from workloads.arrivals import parse_plan_spec
from workloads.builtin_mix import with_answers

REPO_ROOT = Path(__file__).resolve().parent.parent
CALL_S = 0.1  # each fake call's time, first send to last byte
HEADER = "X-Session-Id"


class FakeStream:
    """A worker's context whose requests take ``CALL_S`` each and answer ``answer <rid>``;
    request ids in ``fail`` answer HTTP 500."""

    def __init__(self, *, fail: tuple[str, ...] = (), history: str = "real") -> None:
        self.settings = SimpleNamespace(session_history=history, session_header=HEADER,
                                        run_id="run", tool_choice="required",
                                        tool_max_tokens=16)
        self.worker_id = "w0"
        self.fail = fail
        self.sent: dict[str, dict[str, Any]] = {}  # rid -> its send: start, end, body, headers

    def item_payload(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"messages": item["messages"], "max_tokens": item["max_tokens"]}

    def request_id(self, rid: str) -> str:
        return rid

    def note_sent(self, *_args: Any) -> None:
        pass

    def stream(self, _path: str, body: dict[str, Any], rid: str, *, keep_answer: bool,
               headers: dict[str, str] | None, session: str | None) -> StreamTiming:
        start = time.perf_counter_ns()
        timing = StreamTiming(sent_ns=start, sent_wall_ns=time.time_ns())
        self.sent[rid] = {"start": start, "body": body, "headers": headers, "end": None,
                          "session": session}
        try:
            gevent.sleep(CALL_S)
        except gevent.GreenletExit as exc:
            mark_cancelled(timing, exc, time.perf_counter_ns())
            raise
        end = time.perf_counter_ns()
        self.sent[rid]["end"] = end
        timing.last_byte_ns, timing.content_ns = end, [end]
        if any(rid.startswith(f) for f in self.fail):
            timing.outcome, timing.http_status = "http_5xx", 500
            return timing
        delta: dict[str, Any]
        if body.get("tools"):  # the tool loop's call
            delta = {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                     "function": {"name": "lookup", "arguments": "{}"}}]}
        else:
            delta = {"content": f"answer {rid}"}
        timing.answer_lines = [b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode()]
        timing.usage = {"prompt_tokens": 100, "completion_tokens": 8}
        return timing


def _task(frame: pd.DataFrame) -> dict[str, Any]:
    plan = parse_plan_spec("closed:concurrency=1")
    return next(iter(session_items(frame, plan, 10.0, salt="S")))


def _run(ctx: FakeStream, item: dict[str, Any]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    now = time.perf_counter_ns()
    SessionRun(ctx, item, records.append).run(now, time.time_ns())
    return records


def test_a_call_that_depends_on_nothing_waits_its_delay_from_the_tasks_arrival() -> None:
    """A traced agent that started 0.3 s after the task's first call and waited on none: it
    was sent at the task's arrival, 0.3 s early, and its record said it was meant then."""
    frame = agent_frame(1, fanout=(3, 3), think_s=0.0, tool_time_s=None)
    late = frame.index[frame["turn"] == 2][0]
    frame.at[late, "depends_on"] = []
    frame.at[late, "think_time_s"] = 0.3
    item = _task(frame)
    ctx = FakeStream()
    arrival = time.perf_counter_ns()
    arrival_wall = time.time_ns()
    records: list[dict[str, Any]] = []
    SessionRun(ctx, item, records.append).run(arrival, arrival_wall)
    sent = {t["turn"]: ctx.sent[t["rid"]]["start"] for t in item["turns"]}
    assert sent[0] - arrival < 0.05e9 <= 0.3e9 <= sent[2] - arrival, (sent, arrival)
    record = next(r for r in records if r["turn"] == 2)
    assert record["depends_on"] == [] and record["outcome"] == "ok"
    assert abs(record["scheduled_wall_ns"] - (arrival_wall + 0.3e9)) < 1e6


def test_a_call_waits_for_every_dependency_and_independent_calls_overlap() -> None:
    frame = agent_frame(1, fanout=(4, 4), think_s=0.05, tool_time_s=None)
    item = _task(frame)
    ctx = FakeStream()
    records = _run(ctx, item)
    assert sorted(r["turn"] for r in records) == list(range(6))
    assert {r["outcome"] for r in records} == {"ok"}
    sent = {t["turn"]: ctx.sent[t["rid"]] for t in item["turns"]}
    for turn in item["turns"]:
        for dep in turn["deps"]:  # sent no sooner than the think time after each dependency
            assert sent[turn["turn"]]["start"] >= sent[dep]["end"] + 0.05e9
    workers = [sent[k] for k in range(1, 5)]
    assert max(w["start"] for w in workers) < min(w["end"] for w in workers)  # all at once
    # one session header, and one replica where the worker balances (it picks by the session)
    assert all(s["headers"] == {HEADER: item["sid"]} for s in sent.values())
    assert {s["session"] for s in sent.values()} == {item["sid"]}
    by_turn = {r["turn"]: r for r in records}
    assert by_turn[5]["depends_on"] == [0, 1, 2, 3, 4] and by_turn[5]["agent"] == "joiner"
    assert by_turn[2]["agent"] == "worker-2" and by_turn[0]["depends_on"] == []
    # the generator's own delay: scheduled = dependencies' end + think time
    assert all(0 <= r["schedule_lag_s"] < 0.02 for r in records)


def test_a_call_opens_with_its_context_and_carries_the_other_answers() -> None:
    item = _task(agent_frame(1, fanout=(3, 3), tool_time_s=None))
    ctx = FakeStream()
    records = {r["turn"]: r for r in _run(ctx, item)}
    turns = item["turns"]
    planner = ctx.sent[turns[0]["rid"]]["body"]["messages"]
    joiner = ctx.sent[turns[4]["rid"]]["body"]["messages"]
    # the planner's prompt as sent and its answer, then the joiner's message with the answers
    assert joiner[:2] == planner
    assert joiner[2] == {"role": "assistant", "content": f"answer {turns[0]['rid']}"}
    own = turns[4]["messages"][0]["content"]
    assert joiner[3]["content"] == with_answers(own, [f"answer {t['rid']}" for t in turns[1:4]])
    # a sub-agent: its own messages (shared system prompt), the planner's answer in its message
    worker = ctx.sent[turns[1]["rid"]]["body"]["messages"]
    assert worker[0] == planner[0] and worker[1]["content"].endswith(
        f"\n\nanswer {turns[0]['rid']}")
    # history: the context call's prompt + answer (its usage); none for a sub-agent
    assert records[4]["history_tokens"] == 108 and records[1]["history_tokens"] == 0
    assert records[1]["reusable_tokens"] == 40  # the shared system prompt


def test_logged_history_carries_the_logged_answers() -> None:
    frame = agent_frame(1, fanout=(3, 3), tool_time_s=None)
    item = _task(frame)
    ctx = FakeStream(history="logged")
    records = {r["turn"]: r for r in _run(ctx, item)}
    joiner = ctx.sent[item["turns"][4]["rid"]]["body"]["messages"]
    assert joiner[2]["content"] == frame["answer"].iloc[0]
    assert joiner[3]["content"].endswith(frame["answer"].iloc[3])
    assert records[4]["history_tokens"] == item["turns"][0]["ptoks"] + 8  # the logged estimate


def test_a_failed_call_ends_only_the_calls_that_depend_on_it() -> None:
    frame = agent_frame(1, fanout=(3, 3), tool_time_s=None)
    # a fifth call after the joiner, and a sixth after worker-1 alone
    extra = frame.iloc[[4, 1]].assign(turn=[5, 6], depends_on=[[4], [1]],
                                      context_turn=[4, None], request_id=["r5", "r6"])
    item = _task(pd.concat([frame, extra], ignore_index=True))
    ctx = FakeStream(fail=(item["turns"][2]["rid"],))  # worker-2 fails
    records = _run(ctx, item)
    outcome = {r["turn"]: r["outcome"] for r in records}
    assert len(records) == 7 and sorted(outcome) == list(range(7))
    assert outcome == {0: "ok", 1: "ok", 2: "http_5xx", 3: "ok", 4: "session_ended",
                       5: "session_ended", 6: "ok"}
    assert item["turns"][4]["rid"] not in ctx.sent and item["turns"][5]["rid"] not in ctx.sent


def test_the_run_ending_mid_task_records_every_call_once() -> None:
    item = _task(agent_frame(1, fanout=(3, 3), think_s=0.0))  # worker-1 is a tool loop
    ctx = FakeStream()
    records: list[dict[str, Any]] = []
    runner = gevent.spawn(SessionRun(ctx, item, records.append).run, time.perf_counter_ns(),
                          time.time_ns())
    gevent.sleep(CALL_S * 1.5)  # the sub-agents in flight
    runner.kill(block=True)
    calls = [r for r in records if r["turn_step"] != "final"]
    assert sorted(r["turn"] for r in calls) == list(range(5))
    outcome = {r["turn"]: r["outcome"] for r in calls}
    assert outcome == {0: "ok", 1: "cancelled", 2: "cancelled", 3: "cancelled",
                       4: "cancelled"}
    assert records[-1]["turn"] == 4 and records[-1]["error"] == "run ended before it was sent"


def test_task_items_carry_the_graph_and_plain_sessions_do_not() -> None:
    item = _task(agent_frame(1, fanout=(3, 3)))
    assert item["task"] is True
    assert [(t["deps"], t["ctx"], t["agent"]) for t in item["turns"]] == [
        ([], None, "planner"), ([0], None, "worker-1"), ([0], None, "worker-2"),
        ([0], None, "worker-3"), ([0, 1, 2, 3], 0, "joiner")]
    # every call that opens a context opens with the run's salt and the task's own
    for turn in item["turns"][:4]:
        assert turn["messages"][0]["content"].startswith("S ")
        assert turn["messages"][1]["content"].startswith("taskaaa ")
    assert not item["turns"][4]["messages"][0]["content"].startswith("taskaaa")
    plain = agent_frame(1).assign(depends_on=None, context_turn=None, agent=None)
    assert "task" not in _task(plain) and "deps" not in _task(plain)["turns"][0]


def test_a_dependency_on_a_later_call_is_refused_with_one_line() -> None:
    frame = agent_frame(1, fanout=(3, 3))
    frame.at[1, "depends_on"] = [2]
    with pytest.raises(ValueError, match=r"task task000, call 1: depends_on \[2\]"):
        _task(frame)


# ----------------------------------------------------------------------------- end to end


def _sim_run(workload: Path, results: Path, duration: str, *, kill_worker_after_s: float = 0,
             ) -> pd.DataFrame:
    """A run on the simulator with a master and two workers; its records. With
    ``kill_worker_after_s`` one worker is killed that long into the schedule."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--workload", str(workload), "--duration", duration, "--drain", "30",
         "--results", str(results), "--no-collectors"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        if kill_worker_after_s:
            worker = wait_for_worker(proc)
            assert worker is not None
            assert wait_for_schedule_start(proc, results), "the schedule never started"
            time.sleep(kill_worker_after_s)
            os.kill(worker.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (1 if kill_worker_after_s else 0), out[-3000:]
    (run,) = [p for p in results.iterdir() if p.is_dir()]
    return load_requests(run)


@pytest.mark.slow
def test_agent_tasks_on_the_simulator_run_as_graphs_over_two_workers(tmp_path: Path) -> None:
    workload = write_agent_workload(tmp_path / "wl", "trace", tasks=12, think_s=0.05,
                                    tool_time_s=0.1, gap_s=0.4)
    records = _sim_run(workload, tmp_path / "results", "6")
    assert set(records["outcome"]) == {"ok"} and records["request_id"].is_unique
    tasks = check_task_run(records, agent_frame(12, think_s=0.05, tool_time_s=0.1), 0.05)
    assert len(tasks) == 12
    assert records.groupby("session_id")["worker_id"].nunique().eq(1).all()
    assert records["worker_id"].nunique() == 2
    # the tool loop's call: its final answer's last byte ends it (the time its dependents wait)
    assert (records.loc[records["turn_step"] == "final", "tool_wait_s"] >= 0.1).all()
    # the graph runner's own delay: a call after its dependencies is sent within 50 ms of its
    # time nine times in ten, and never 0.5 s late (a task's first calls wait on the run's start
    # like any session's first turn). Not all within 50 ms: on the shared 2-core test machine a
    # worker once stalled 0.2 s whole, its reads as late (read_delay_s), three sends with it.
    later = records[records["depends_on"].map(len).gt(0) & records["turn_step"].ne("final")]
    lag = later["schedule_lag_s"]
    assert lag.quantile(0.9) < 0.05 and lag.between(-1e-3, 0.5).all(), lag.describe()
    print(f"generator delay per task (task - critical path): median "
          f"{tasks['generator_delay_s'].median() * 1e3:.1f} ms, max "
          f"{tasks['generator_delay_s'].max() * 1e3:.1f} ms over {len(tasks)} tasks")


@pytest.mark.slow
def test_a_closed_plan_runs_k_tasks_at_a_time(tmp_path: Path) -> None:
    workload = write_agent_workload(tmp_path / "wl", "closed:concurrency=3", tasks=4,
                                    think_s=0.05, tool_time_s=None)
    records = _sim_run(workload, tmp_path / "results", "5")
    assert set(records["outcome"]) <= {"ok", "cancelled"}  # the run's end cancels the last
    tasks = check_task_run(records, agent_frame(4, think_s=0.05, tool_time_s=None), 0.05,
                           every_task=False)
    assert len(tasks) > 6  # a finished task's place went to the next one
    calls = per_call(records)
    start = calls.groupby("session_id")["sent_ns"].min().to_numpy()
    end = calls.groupby("session_id")["end_ns"].max().to_numpy()
    assert max(((start <= t) & (end > t)).sum() for t in start) == 3  # K, never more
    # a closed plan offers no load: the summary says none, though each task's calls carry the
    # times they were due (leased as one ended, then from the answers)
    (run,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    assert "open-loop: offered" not in format_summary(summarize_run(run))


@pytest.mark.slow
def test_a_killed_worker_leaves_its_tasks_calls_recorded_once(tmp_path: Path) -> None:
    spec: dict[str, Any] = {"tasks": 20, "think_s": 0.3, "tool_time_s": None, "gap_s": 0.4}
    workload = write_agent_workload(tmp_path / "wl", "trace", **spec)
    records = _sim_run(workload, tmp_path / "results", "8", kill_worker_after_s=3)
    assert set(records["outcome"]) <= {"ok", "worker_lost"}
    # the dead worker's tasks: their calls whose records had not reached the master, sent or
    # not, are counted lost by it, each once
    assert (records["outcome"] == "worker_lost").any()
    check_task_run(records, agent_frame(**spec), 0.3)
