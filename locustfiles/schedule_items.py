"""Turn a workload and its arrival plan into the items the master leases to workers."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from workloads.arrivals import TracePlan, load_plan, schedule, trace_pass
from workloads.builtin_mix import NO_SALT, BuiltinMix, salt_text
from workloads.schema import PLAN_FILE, read_workload
from workloads.sessions import session_salt


def build_items(workload_dir: str, plan_path: str | None, duration_s: float,
                seed: int = 0, salt: str = "") -> Any:
    """One dict per scheduled arrival: seq, rid, bucket, endpoint, prompt/messages, offset.

    Every prompt opens with the run's ``salt`` (the first message's text for chat), so that a
    workload replayed again (the next run, the next study step) meets a cold prefix cache, while
    requests of one run still share what the workload itself shares (Mooncake prefix blocks,
    a common system prompt). A plan longer than its workload uses rows again: each further pass
    gets its own opening, so no prompt of a run repeats one sent before in it.

    A session workload gives one item per session instead (:func:`session_items`): a list for
    open-loop plans, an endless iterator for a closed plan (K sessions at a time).
    """
    frame = read_workload(workload_dir)
    plan_file = Path(plan_path) if plan_path else Path(workload_dir) / PLAN_FILE
    plan = load_plan(plan_file)
    if is_session_workload(frame):
        return session_items(frame, plan, duration_s, seed, salt)
    arrivals = schedule(plan, frame, duration_s, seed)
    filler = BuiltinMix(seed=seed)
    rows = frame.to_dict("records")
    uses = [0] * len(rows)  # times each row has been scheduled so far
    items = []
    for seq, (index, offset) in enumerate(
        zip(arrivals["request_index"].tolist(), arrivals["offset_s"].tolist(), strict=True)
    ):
        items.append(_item(rows[int(index)], seq, float(offset), filler, salt,
                           uses[int(index)]))
        uses[int(index)] += 1
    return items


def _item(row: dict[str, Any], seq: int, offset: float, filler: BuiltinMix, salt: str,
          repeat: int) -> dict[str, Any]:
    rid = f"{row['request_id']}#{seq}"
    messages: Any = row.get("messages")
    prompt: Any = row.get("prompt")
    if isinstance(messages, str):
        endpoint, messages = "chat", json.loads(messages)
    else:
        endpoint, messages = "completions", None
        if not isinstance(prompt, str):
            # A log with token counts only and no tokenizer at build time: approximate
            # words (one token each on the simulator); `workload build --tokenizer` is exact.
            prompt = filler.text_of_length(int(row["prompt_tokens"]), rid)
    if endpoint == "chat":
        messages = [dict(m) for m in messages]
        messages[0]["content"] = salt_text(str(messages[0].get("content") or ""), salt, repeat)
    else:
        prompt = salt_text(prompt, salt, repeat)
    return {
        "seq": seq, "rid": rid, "bucket": row["bucket"], "endpoint": endpoint,
        "prompt": prompt if endpoint == "completions" else None, "messages": messages,
        "max_tokens": int(row["output_tokens"]), "ptoks": int(row["prompt_tokens"]),
        "off": offset,
    }


def closed_items(workload_dir: str, seed: int = 0, salt: str = "",
                 tag: str = "") -> Iterator[dict[str, Any]]:
    """A closed-loop user's requests (``--users`` on a workload without an arrival plan): the
    workload's rows in turn, endlessly, each pass salted apart as :func:`build_items` does. A
    worker's ``tag`` opens each request id and the salt, so no two workers send one prompt."""
    frame = read_workload(workload_dir)
    filler = BuiltinMix(seed=seed)
    rows = frame.to_dict("records")
    own = salt if salt in ("", NO_SALT) else f"{salt}{tag}"  # 'none': the prompts as logged
    for seq in itertools.count():
        item = _item(rows[seq % len(rows)], seq, 0.0, filler, own, seq // len(rows))
        item["rid"] = f"{tag}{item['rid']}"
        yield item


# A synthetic plan's schedule is generated this many seconds at a time (rounded up to whole
# burst periods), so a soak holds one chunk of arrival times, never the whole run's.
SOAK_CHUNK_S = 600.0


def iter_items(workload_dir: str, plan_path: str | None, duration_s: float, seed: int = 0,
               salt: str = "", *, start_seq: int = 0,
               chunk_s: float = SOAK_CHUNK_S) -> Iterator[dict[str, Any]]:
    """The items of :func:`build_items`, generated lazily for runs of hours or days.

    The workload is replayed on repeat: a trace plan pass after pass (its own length each),
    synthetic plans (poisson, gamma, bursts) ``chunk_s`` at a time walking the workload row
    after row. Every prompt opens with the run's ``salt`` and, from the second pass over the
    workload on, the pass's number (:func:`workloads.builtin_mix.salt_text`), so a server's
    prefix cache does not serve the repeats. ``seq`` numbers every arrival of the run from 0;
    with ``start_seq`` (a resumed run) the items before it are skipped without being built.
    Same inputs, seed and salt: same items.
    """
    frame = read_workload(workload_dir)
    plan = load_plan(Path(plan_path) if plan_path else Path(workload_dir) / PLAN_FILE)
    if is_session_workload(frame):  # a soak of sessions: the session schedule, resumable
        for item in session_items(frame, plan, duration_s, seed, salt):
            if item["seq"] >= start_seq:
                yield item
        return
    filler = BuiltinMix(seed=seed)
    rows = frame.to_dict("records")
    max_requests = getattr(plan, "max_requests", None)  # a closed plan has none
    limit = max_requests if max_requests is not None else math.inf
    if isinstance(plan, TracePlan):
        pass_rows, pass_times, span = trace_pass(plan, frame)
        chunks: Iterator[tuple[int, float, Any, Any]] = (
            (k, k * span, pass_rows, pass_times) for k in range(int(1e12)))
    else:
        period = getattr(plan, "period_s", None)
        chunk = math.ceil(chunk_s / period) * period if period else chunk_s

        def synthetic() -> Iterator[tuple[int, float, Any, Any]]:
            for k in range(int(1e12)):
                part = schedule(plan, frame, chunk, seed + k)
                yield k, k * chunk, None, part["offset_s"].to_numpy()

        chunks = synthetic()
    seq = 0
    for k, start, chunk_rows, times in chunks:
        if start >= duration_s or seq >= limit:
            return
        if seq + len(times) <= start_seq:  # a resumed run: skip whole chunks unbuilt
            seq += len(times)
            continue
        for i, offset in enumerate(times.tolist()):
            at = start + offset
            if at >= duration_s or seq >= limit:
                return
            if seq >= start_seq:
                # A trace pass replays its own rows; synthetic plans walk the workload in order.
                index = int(chunk_rows[i]) if chunk_rows is not None else seq % len(rows)
                passes = k if chunk_rows is not None else seq // len(rows)
                yield _item(rows[index], seq, at, filler, salt, passes)
            seq += 1


# ----------------------------------------------------------------------------- sessions


def is_session_workload(frame: Any) -> bool:
    return "turn" in frame and bool(frame["turn"].notna().any())


def plan_concurrency(workload_dir: str, plan_path: str | None) -> int | None:
    """K of a closed plan (K sessions at a time), None for open-loop plans."""
    plan = load_plan(Path(plan_path) if plan_path else Path(workload_dir) / PLAN_FILE)
    return int(plan.concurrency) if plan.kind == "closed" else None  # type: ignore[union-attr]


def _number(value: Any, default: float | None = None) -> float | None:
    return default if value is None or (isinstance(value, float) and math.isnan(value)) \
        else float(value)


def _session_rows(frame: Any) -> list[list[dict[str, Any]]]:
    """The workload's sessions, each its rows in turn order (rows of a session are adjacent)."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for row in frame.to_dict("records"):
        sessions.setdefault(str(row["session_id"]), []).append(row)
    return [sorted(rows, key=lambda r: int(r["turn"])) for rows in sessions.values()]


def _session_item(rows: list[dict[str, Any]], seq: int, offset: float, salt: str,
                  repeat: int) -> dict[str, Any]:
    """One session to lease: its turns with what each adds, salted.

    The run's salt opens the session's first message (a group's shared system prompt stays
    shared within the run); the session's own salt (:func:`workloads.sessions.session_salt`)
    opens its first user message, so sessions share no prefix by accident, nor does a session
    replayed again in the same run. A task (rows with ``depends_on``) is salted so at every call
    that opens a context (no ``context_turn``), and its item is marked ``task``: each call
    carries its dependencies (``deps``), the call whose conversation opens its prompt (``ctx``)
    and its ``agent``.
    """
    sid = f"{rows[0]['session_id']}#{seq}"
    task = any(_dependencies(row) is not None for row in rows)
    turns: list[dict[str, Any]] = []
    for k, row in enumerate(rows):
        messages = [dict(m) for m in json.loads(row["messages"])]
        deps, ctx = _graph_place(rows, k, sid) if task else (None, None)
        if (ctx is None) if task else k == 0:
            messages[0]["content"] = salt_text(str(messages[0].get("content") or ""), salt)
            user = next(m for m in messages if m["role"] == "user")
            # the run's salt opens messages[0] already; the pass keeps a replayed session apart
            own = session_salt(str(row["session_id"]), "", repeat)
            user["content"] = f"{own} {user['content']}"
        tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else None
        opener = turns[-1] if not task and k else turns[ctx] if ctx is not None else None
        turns.append({
            "rid": f"{row['request_id']}#{seq}", "turn": k, "bucket": row["bucket"],
            "ptoks": int(row["prompt_tokens"]), "max_tokens": int(row["output_tokens"]),
            "messages": messages, "think": _number(row.get("think_time_s"), 0.0),
            "answer": row.get("answer") if isinstance(row.get("answer"), str) else "",
            "tools": tools, "tool_time": _number(row.get("tool_time_s"), 0.0),
            "shared": int(_number(row.get("shared_tokens"), 0.0) or 0),
            "hist": 0 if opener is None else opener["ptoks"] + opener["max_tokens"],
        })
        if task:
            agent = row.get("agent")
            turns[-1].update(deps=deps, ctx=ctx, agent=agent if isinstance(agent, str) else None)
    first = turns[0]
    item = {"seq": seq, "rid": sid, "sid": sid, "endpoint": "chat", "bucket": first["bucket"],
            "ptoks": first["ptoks"], "max_tokens": first["max_tokens"], "off": offset,
            "turns": turns}
    if task:
        item["task"] = True
    return item


def _dependencies(row: dict[str, Any]) -> list[int] | None:
    deps = row.get("depends_on")
    if deps is None or (isinstance(deps, float) and math.isnan(deps)):
        return None
    return [int(d) for d in deps]


def _graph_place(rows: list[dict[str, Any]], k: int, sid: str) -> tuple[list[int], int | None]:
    """A task call's dependencies and context call; a row without ``depends_on`` in a task
    follows the call before it, in its conversation, as a session's turn does."""
    deps = _dependencies(rows[k])
    if deps is None:
        return ([k - 1], k - 1) if k else ([], None)
    context = _number(rows[k].get("context_turn"))
    ctx = None if context is None else int(context)
    if any(not 0 <= d < k for d in deps) or (ctx is not None and ctx not in deps):
        raise ValueError(
            f"task {sid.split('#')[0]}, call {k}: depends_on {deps} and context_turn {ctx} must"
            f" name earlier calls of the task, context_turn one of depends_on")
    return deps, ctx


def session_items(frame: Any, plan: Any, duration_s: float, seed: int = 0,
                  salt: str = "") -> Any:
    """Session items: open-loop plans schedule session arrivals (a trace plan: each session's
    first turn's logged time); a closed plan gives the sessions in order, endlessly (the
    dispatcher keeps K of them running and stops leasing at the schedule's end)."""
    sessions = _session_rows(frame)
    if plan.kind == "closed":
        def endless() -> Iterator[dict[str, Any]]:
            for seq in itertools.count():
                rows = sessions[seq % len(sessions)]
                yield _session_item(rows, seq, 0.0, salt, seq // len(sessions))
        return endless()
    heads = pd.DataFrame([{**rows[0], "prompt_tokens": rows[0]["prompt_tokens"]}
                          for rows in sessions])
    arrivals = schedule(plan, heads, duration_s, seed)
    uses = [0] * len(sessions)
    items = []
    for seq, (index, offset) in enumerate(
            zip(arrivals["request_index"].tolist(), arrivals["offset_s"].tolist(), strict=True)):
        items.append(_session_item(sessions[int(index)], seq, float(offset), salt,
                                   uses[int(index)]))
        uses[int(index)] += 1
    return items
