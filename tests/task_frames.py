"""Agent task workloads built by hand for the load generator's tests: a planner, 3-5 sub-agents
in parallel on a shared system prompt, then a joiner in the planner's conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dashboards.analysis.tasks import per_call, per_task
from workloads.arrivals import parse_plan_spec, save_plan
from workloads.builtin_mix import with_answers
from workloads.schema import PLAN_FILE, workload_table, write_workload
from workloads.sessions import LOOKUP_TOOL

WORDS = "alpha beta gamma delta river stone light music water field cloud ember".split()


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, words))


def agent_frame(tasks: int = 4, *, fanout: tuple[int, int] = (3, 5), system_words: int = 40,
                user_words: int = 12, output_tokens: int = 8, think_s: float = 0.05,
                tool_time_s: float | None = 0.1, gap_s: float = 0.5,
                seed: int = 0) -> pd.DataFrame:
    """``tasks`` tasks: call 0 the planner; calls 1..n sub-agents (``fanout`` inclusive), each
    on the shared system prompt with the planner's answer in its message, ``think_s`` after the
    planner; the last call joins them in the planner's conversation. With ``tool_time_s`` the
    first sub-agent's call is a tool loop. Task ``i`` arrives at ``i * gap_s`` under a trace
    plan. ``prompt_tokens`` counts words with the logged answers."""
    rng = np.random.default_rng(seed)
    system = {"role": "system", "content": _text(rng, system_words)}
    cols: dict[str, list[Any]] = {k: [] for k in (
        "session_id", "messages", "prompt_tokens", "turn", "think_time_s", "answer", "tools",
        "tool_time_s", "shared_tokens", "depends_on", "context_turn", "agent")}

    def add(task: int, k: int, messages: list[dict[str, Any]], prompt: int, deps: list[int],
            ctx: int | None, agent: str, answer: str, think: float = 0.0,
            tools: str | None = None, tool_time: float | None = None) -> None:
        for key, value in (("session_id", f"task{task:03d}"), ("messages", json.dumps(messages)),
                           ("prompt_tokens", prompt), ("turn", k), ("think_time_s", think),
                           ("answer", answer), ("tools", tools), ("tool_time_s", tool_time),
                           ("shared_tokens", system_words), ("depends_on", deps),
                           ("context_turn", ctx), ("agent", agent)):
            cols[key].append(value)

    for task in range(tasks):
        plan = {"role": "user", "content": _text(rng, user_words)}
        plan_answer = _text(rng, output_tokens)
        add(task, 0, [system, plan], system_words + user_words, [], None, "planner",
            plan_answer)
        workers = int(rng.integers(fanout[0], fanout[1] + 1))
        answers = []
        for i in range(1, workers + 1):
            content = _text(rng, user_words)
            answers.append(_text(rng, output_tokens))
            tool = tool_time_s is not None and i == 1
            add(task, i, [system, {"role": "user", "content": content}],
                system_words + user_words + output_tokens, [0], None, f"worker-{i}",
                answers[-1], think_s,
                json.dumps({"tools": [LOOKUP_TOOL], "result": "found"}) if tool else None,
                tool_time_s if tool else None)
        join = with_answers(_text(rng, user_words), answers)
        add(task, workers + 1, [{"role": "user", "content": join}],
            system_words + user_words + output_tokens + len(join.split()),
            list(range(workers + 1)), 0, "joiner", _text(rng, output_tokens), think_s)
    n = len(cols["turn"])
    arrivals = [int(sid[4:]) * gap_s for sid in cols["session_id"]]
    return workload_table(["short"] * n, cols.pop("prompt_tokens"), [output_tokens] * n,
                          request_id=[f"r{i:06d}" for i in range(n)], trace_offset_s=arrivals,
                          **cols)


def write_agent_workload(out: Path, arrivals: str, **kwargs: Any) -> Path:
    """``agent_frame(**kwargs)`` written to ``out`` with the arrival plan ``arrivals``."""
    write_workload(agent_frame(**kwargs), out, {"source": "tests: agent tasks"})
    save_plan(parse_plan_spec(arrivals), out / PLAN_FILE)
    return out


def check_task_run(records: pd.DataFrame, frame: pd.DataFrame, think_s: float, *,
                   every_task: bool = True) -> pd.DataFrame:
    """What a run of :func:`agent_frame`'s tasks must show, from its records; the task figures
    (``dashboards.analysis.tasks.per_task``) of its tasks.

    Every call of every task recorded once (every task of ``frame`` with ``every_task``); no
    call sent before its dependencies' last byte and think time (within 1 ms: each request
    reads the wall clock's offset to the monotonic one anew); the sub-agents of every task in
    flight at once; each task's time its critical path plus the generator's own delay, no more
    than its calls' schedule lag."""
    calls = per_call(records)
    size = frame.groupby("session_id").size()
    got = calls.groupby("session_id")["turn"].apply(list)
    if every_task:
        assert sorted(got.index.str.split("#").str[0]) == sorted(size.index)
    for sid, turns in got.items():
        assert sorted(turns) == list(range(int(size[str(sid).split("#")[0]]))), (sid, turns)
    assert not calls.duplicated(["session_id", "turn"]).any()
    ok = calls[calls["outcome"] == "ok"].set_index(["session_id", "turn"])
    for (sid, turn), row in ok.iterrows():
        for dep in row["depends_on"]:
            assert row["sent_ns"] >= ok.loc[(sid, dep), "end_ns"] + think_s * 1e9 - 1e6, (
                sid, turn, dep)
    workers = ok[ok["agent"].str.startswith("worker")].groupby(level=0)
    assert (workers["sent_ns"].max() < workers["end_ns"].min()).all()  # all in flight at once
    tasks = per_task(calls=calls)
    tasks = tasks[tasks["outcome"] == "ok"]
    lag = records.groupby("session_id")["schedule_lag_s"].sum().reindex(tasks["session_id"])
    delay = tasks["generator_delay_s"].to_numpy()
    assert (delay >= -1e-3).all() and (delay <= lag.to_numpy() + 1e-3).all(), (delay, lag)
    return tasks
