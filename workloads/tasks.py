"""Task workloads (agents): tasks whose calls form a graph, as rows of the workload format.

A task is a session whose turns are *calls* (``workloads.schema``: ``depends_on``,
``context_turn``, ``agent``): a planner fans out to sub-agents that run in parallel, each on
its own context, and a later call joins their answers. A call's prompt
(:func:`workloads.builtin_mix.call_messages`) is its context call's conversation (that call's
prompt and answer), then its own messages, the answers of its other dependencies added to its
first user message. ``prompt_tokens`` is that
whole prompt with the logged answers; the load generator builds the same with the real ones.

Sources (``swarmload workload build --tasks SOURCE``, ``docs/guides/agents.md``):

- ``synthetic:KEY=VALUE,...`` (:class:`TaskSpec`): a planning call, ``fanout`` sub-agents in
  parallel (``depth`` levels), each ``steps`` calls with the tool's time between two of them,
  and a joining call on the planner's context; sizes and times as distributions
  (``workloads.sessions.Dist``);
- ``otel:PATH``: OpenTelemetry traces of an agent framework (OTLP JSON, JSON lines of it, or a
  JSON list of spans) with the GenAI semantic conventions: one trace is one task, one
  model-call span one call (``workloads.agent_traces`` says how the graph is found);
- ``json:PATH``: the simple tasks format (:func:`json_tasks`, :func:`tasks_json` writes it).

Every call's text is synthesized to its lengths (the logged ones, or the drawn ones), exact in
the target's tokenizer: a task source needs ``--tokenizer DIR|words`` or ``--tokenize-url``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workloads.agent_traces import TracedCall, otel_tasks
from workloads.buckets import BucketSpec
from workloads.builtin_mix import call_messages
from workloads.schema import workload_table
from workloads.sessions import (
    LOOKUP_TOOL,
    SYNTHETIC_KIND,
    Dist,
    SessionBuild,
    SessionSpecError,
    Turn,
    _letters,
    _TextFitter,
    spec_values,
    turn_messages,
    turn_reply,
)
from workloads.synth import TokenCounter

OTEL_KIND = "otel"
JSON_KIND = "json"
TASK_KINDS = (SYNTHETIC_KIND, OTEL_KIND, JSON_KIND)
DEFAULT_TOOL_RESULT_TOKENS = 32


class TaskSourceError(SessionSpecError):
    """A task source that cannot work: names the file, task or trace, call or span, and key."""


@dataclass
class Call(Turn):
    """One call while a task is assembled: a turn with its place in the graph and its lengths
    (``user`` and ``answer`` are synthesized from them)."""

    depends_on: list[int] = field(default_factory=list)
    context: int | None = None
    agent: str = ""
    user_tokens: int | None = None  # its own user message's tokens, or ...
    prompt_tokens: int | None = None  # ... the whole prompt's (the user message fills the rest)
    system_tokens: int = 0  # a call that opens a context: its system prompt's tokens
    system_key: str = ""  # calls of the same key (and length) share one system prompt text
    tool_result_tokens: int = DEFAULT_TOOL_RESULT_TOKENS  # a tool loop's result


# ------------------------------------------------------------------------------ synthetic


@dataclass(frozen=True)
class TaskSpec:
    """A synthetic task workload (``--tasks synthetic:tasks=200,fanout=3..5,...``).

    The planner's call (``plan_tokens``, ``plan_output_tokens``) starts ``fanout`` sub-agents in
    parallel; a sub-agent makes ``steps`` calls (``sub_tokens``, ``sub_output_tokens``; a later
    step's user message is the tool's result, ``tool_result_tokens``, sent ``tool_s`` after the
    previous step's answer). With ``depth`` > 1 a sub-agent plans and fans out in turn. A joining
    call (``join_tokens``, ``join_output_tokens``) continues each planner's conversation once its
    sub-agents are done. ``system_tokens``: the system prompt that opens every agent's context,
    one per group (task i gets prompt i % ``groups``; 0: one per task). ``think_s``: each call's
    own delay after its dependencies (the agent's work), added to the tool time; the planner's
    first call starts the task.
    """

    tasks: int = 100
    fanout: str = "3..5"
    depth: str = "1"
    steps: str = "2"
    system_tokens: int = 0
    groups: int = 1
    plan_tokens: str = "200"
    plan_output_tokens: str = "100"
    sub_tokens: str = "100"
    sub_output_tokens: str = "200"
    tool_s: str = "0.5"
    tool_result_tokens: str = "50"
    join_tokens: str = "50"
    join_output_tokens: str = "200"
    think_s: str = "0"

    @classmethod
    def parse(cls, spec: str) -> TaskSpec:
        try:
            parsed = cls(**spec_values(cls, spec, "synthetic task spec"))
        except SessionSpecError as exc:
            raise TaskSourceError(str(exc)) from None
        parsed.check()
        return parsed

    def dists(self) -> dict[str, Dist]:
        try:
            return {f.name: Dist.parse(f.name, getattr(self, f.name))
                    for f in fields(self) if f.type in ("str", str)}
        except SessionSpecError as exc:
            raise TaskSourceError(str(exc)) from None

    def check(self) -> None:
        if self.tasks < 1:
            raise TaskSourceError(f"tasks={self.tasks}: must be >= 1")
        for name in ("system_tokens", "groups"):
            if getattr(self, name) < 0:
                raise TaskSourceError(f"{name}={getattr(self, name)}: must be >= 0")
        dists = self.dists()
        top = {}
        for name in ("depth", "fanout"):
            dist = dists[name]
            top[name] = round(max(dist.a, dist.b))
            if dist.kind in ("exp", "lognormal") or not 1 <= top[name] <= 16 or dist.a < 0.5:
                raise TaskSourceError(f"{name}={getattr(self, name)}: expected N or A..B, "
                                      "from 1 to 16")
        if top["fanout"] ** top["depth"] > 4096:
            raise TaskSourceError(f"fanout={self.fanout}, depth={self.depth}: up to "
                                  f"{top['fanout'] ** top['depth']} sub-agents a task, over 4096")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def synthetic_tasks(spec: TaskSpec, seed: int = 0) -> list[list[Call]]:
    """The tasks of ``spec``, each its calls in index order (text not yet built)."""
    rng = np.random.default_rng(seed)
    dists = spec.dists()
    return [_SyntheticTask(spec, dists, rng, f"t{t:06d}",
                           str(t % spec.groups if spec.groups else t)).calls
            for t in range(spec.tasks)]


_COUNTS = ("fanout", "depth", "steps")  # drawn as whole numbers, A..B each as likely


class _SyntheticTask:
    """One synthetic task's calls: the planner's, its sub-agents' (recursively), the join."""

    def __init__(self, spec: TaskSpec, dists: dict[str, Dist], rng: np.random.Generator,
                 task: str, group: str) -> None:
        self.spec, self.d, self.rng, self.task, self.group = spec, dists, rng, task, group
        self.calls: list[Call] = []
        self.depth = self.draw("depth")
        self.agent("planner", 0, [])

    def draw(self, name: str) -> int:
        dist = self.d[name]
        if name in _COUNTS and dist.kind == "uniform":  # 3..5: 3, 4 or 5, alike
            return int(self.rng.integers(math.ceil(dist.a), math.floor(dist.b) + 1))
        return dist.draw_int(self.rng)

    def add(self, agent: str, deps: list[int], context: int | None, user: int, output: int,
            delay: float) -> int:
        self.calls.append(Call(
            session=self.task, user="", output_tokens=output, think_time_s=round(delay, 6),
            depends_on=deps, context=context, agent=agent, user_tokens=user,
            system_tokens=self.spec.system_tokens if context is None else 0,
            system_key=f"group {self.group}"))
        return len(self.calls) - 1

    def agent(self, name: str, level: int, after: list[int]) -> int:
        """An agent's calls, its first after ``after``; returns its last call."""
        think = self.d["think_s"].draw(self.rng) if after else 0.0  # the task starts with it
        if level < self.depth:
            role = "plan" if level == 0 else "sub"
            plan = self.add(name, after, None, self.draw(f"{role}_tokens"),
                            self.draw(f"{role}_output_tokens"), think)
            lasts = [self.agent(f"{'worker' if level == 0 else name}-{i + 1}", level + 1, [plan])
                     for i in range(self.draw("fanout"))]
            return self.add(name, [plan, *lasts], plan, self.draw("join_tokens"),
                            self.draw("join_output_tokens"), self.d["think_s"].draw(self.rng))
        last = self.add(name, after, None, self.draw("sub_tokens"),
                        self.draw("sub_output_tokens"), think)
        for _ in range(self.draw("steps") - 1):
            last = self.add(name, [last], last, self.draw("tool_result_tokens"),
                            self.draw("sub_output_tokens"),
                            self.d["tool_s"].draw(self.rng) + self.d["think_s"].draw(self.rng))
        return last


# ------------------------------------------------------------------------------ JSON tasks

_TASK_KEYS = ("id", "system_prompt_tokens", "start_s", "calls")
_CALL_KEYS = ("id", "agent", "depends_on", "context", "prompt_tokens", "user_tokens",
              "output_tokens", "delay_s", "tool_time_s", "tool_result_tokens",
              "system_prompt_tokens")


def _number(where: str, key: str, value: Any, *, integer: bool, low: float) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        not integer or float(value).is_integer()) and math.isfinite(value) and value >= low
    if not ok:
        kind = "an integer" if integer else "a number"
        raise TaskSourceError(f"{where}: {key}={value!r}: expected {kind} >= {low:g}")
    return int(value) if integer else float(value)


def _check_keys(where: str, obj: Any, allowed: Sequence[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TaskSourceError(f"{where}: expected an object with keys {list(allowed)}")
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise TaskSourceError(f"{where}: unknown key(s) {unknown}; allowed: {list(allowed)}")
    return obj


def _graph_order(where: str, ids: list[str], deps: dict[str, list[str]]) -> list[str]:
    """``ids`` in an order where every call comes after its dependencies (file order kept where
    free); a cycle is named."""
    done: list[str] = []
    placed: set[str] = set()
    left = list(ids)
    while left:
        ready = [c for c in left if all(d in placed for d in deps[c])]
        if not ready:
            cycle = [left[0]]
            while True:  # walk unplaced dependencies until one repeats
                nxt = next(d for d in deps[cycle[-1]] if d not in placed)
                if nxt in cycle:
                    cycle = cycle[cycle.index(nxt):] + [nxt]
                    break
                cycle.append(nxt)
            raise TaskSourceError(f"{where}: depends_on forms a cycle: "
                                  + " -> ".join(repr(c) for c in cycle))
        done.append(ready[0])
        placed.add(ready[0])
        left.remove(ready[0])
    return done


def json_tasks(doc: Any, where: str) -> tuple[list[list[Call]], list[float | None]]:
    """The tasks of a JSON tasks document and each task's start (``start_s``, or None).

    The format (``docs/guides/agents.md``)::

        {"tasks": [{"id": "t1", "system_prompt_tokens": 800, "start_s": 0.0,
                    "calls": [{"id": "plan", "agent": "planner", "depends_on": [],
                               "user_tokens": 200, "output_tokens": 100},
                              {"id": "w1", "agent": "worker-1", "depends_on": ["plan"],
                               "prompt_tokens": 1500, "output_tokens": 300, "delay_s": 0.2,
                               "tool_time_s": 1.5},
                              {"id": "join", "agent": "planner", "depends_on": ["w1"],
                               "context": "plan", "user_tokens": 40, "output_tokens": 200}]}]}

    Per call: ``id`` (unique in its task), ``agent`` (default: the id), ``depends_on`` (ids of
    calls that must have finished first; default none: sent at the task's start), ``context``
    (the call, one it depends on directly or through others, whose conversation opens this
    prompt; default none), ``output_tokens`` and exactly one of ``user_tokens`` (its own user
    message) or ``prompt_tokens`` (the whole prompt, as logged: the user message fills what the
    context, the system prompt and the dependencies' answers leave), ``delay_s`` (after the last
    dependency finished, or after the task's start for a call that depends on nothing;
    default 0), ``tool_time_s`` (the call offers the lookup tool: a tool loop whose tool runs
    this long; ``tool_result_tokens`` its result, default 32), ``system_prompt_tokens`` (the
    task's, for a call that opens a context).
    """
    tasks_doc = doc.get("tasks") if isinstance(doc, dict) else doc
    if isinstance(doc, dict):
        _check_keys(where, doc, ("tasks",))
    if not isinstance(tasks_doc, list) or not tasks_doc:
        raise TaskSourceError(f"{where}: expected {{\"tasks\": [...]}} with at least one task")
    out: list[list[Call]] = []
    starts: list[float | None] = []
    seen_tasks: set[str] = set()
    for i, task in enumerate(tasks_doc):
        task = _check_keys(f"{where}: task #{i + 1}", task, _TASK_KEYS)
        tid = str(task.get("id", f"task{i + 1}"))
        twhere = f"{where}: task {tid!r}"
        if tid in seen_tasks:
            raise TaskSourceError(f"{twhere}: the id appears twice")
        seen_tasks.add(tid)
        system = _number(twhere, "system_prompt_tokens", task.get("system_prompt_tokens", 0),
                         integer=True, low=0)
        start = task.get("start_s")
        starts.append(None if start is None else _number(twhere, "start_s", start,
                                                         integer=False, low=0))
        raw = task.get("calls")
        if not isinstance(raw, list) or not raw:
            raise TaskSourceError(f"{twhere}: calls: expected a list of at least one call")
        by_id: dict[str, dict[str, Any]] = {}
        for j, c in enumerate(raw):
            c = _check_keys(f"{twhere}, call #{j + 1}", c, _CALL_KEYS)
            if "id" not in c:
                raise TaskSourceError(f"{twhere}, call #{j + 1}: id: missing")
            cid = str(c["id"])
            if cid in by_id:
                raise TaskSourceError(f"{twhere}: call id {cid!r} appears twice")
            by_id[cid] = c
        deps: dict[str, list[str]] = {}
        for cid, c in by_id.items():
            cwhere = f"{twhere}, call {cid!r}"
            named = c.get("depends_on", [])
            if not isinstance(named, list):
                raise TaskSourceError(f"{cwhere}: depends_on: expected a list of call ids")
            deps[cid] = [str(d) for d in named]
            for d in deps[cid]:
                if d not in by_id:
                    raise TaskSourceError(f"{cwhere}: depends_on names {d!r}, not a call of "
                                          f"the task (calls: {list(by_id)})")
        order = _graph_order(twhere, list(by_id), deps)
        index = {cid: k for k, cid in enumerate(order)}
        ancestors: dict[str, set[str]] = {}
        calls: list[Call] = []
        for cid in order:
            c, cwhere = by_id[cid], f"{twhere}, call {cid!r}"
            ancestors[cid] = set(deps[cid]).union(*(ancestors[d] for d in deps[cid]))
            context = c.get("context")
            if context is not None and str(context) not in ancestors[cid]:
                raise TaskSourceError(f"{cwhere}: context {context!r} is not a call it depends "
                                      "on (directly or through others)")
            if ("user_tokens" in c) == ("prompt_tokens" in c):
                raise TaskSourceError(f"{cwhere}: give exactly one of user_tokens, "
                                      "prompt_tokens")
            if "output_tokens" not in c:
                raise TaskSourceError(f"{cwhere}: output_tokens: missing")
            tool = c.get("tool_time_s")
            calls.append(Call(
                session=tid, user="",
                output_tokens=_number(cwhere, "output_tokens", c["output_tokens"], integer=True,
                                      low=1),
                think_time_s=_number(cwhere, "delay_s", c.get("delay_s", 0), integer=False,
                                     low=0),
                tools=[LOOKUP_TOOL] if tool is not None else None,
                tool_time_s=None if tool is None else _number(cwhere, "tool_time_s", tool,
                                                              integer=False, low=0),
                depends_on=sorted({index[d] for d in deps[cid]}
                                  | ({index[str(context)]} if context is not None else set())),
                context=None if context is None else index[str(context)],
                agent=str(c.get("agent", cid)),
                user_tokens=None if "user_tokens" not in c else _number(
                    cwhere, "user_tokens", c["user_tokens"], integer=True, low=1),
                prompt_tokens=None if "prompt_tokens" not in c else _number(
                    cwhere, "prompt_tokens", c["prompt_tokens"], integer=True, low=1),
                system_tokens=_number(cwhere, "system_prompt_tokens",
                                      c.get("system_prompt_tokens", system), integer=True, low=0)
                if context is None else 0,
                system_key="json",
                tool_result_tokens=_number(cwhere, "tool_result_tokens", c.get(
                    "tool_result_tokens", DEFAULT_TOOL_RESULT_TOKENS), integer=True, low=1)))
        out.append(calls)
    return out, starts


def _traced_system(call: TracedCall, counter: TokenCounter) -> dict[str, Any]:
    """A traced call's system prompt, where the trace holds its instructions and the call opens
    a context: their length, and a key that calls of the same instructions share (a digest:
    the text itself is not kept)."""
    if call.system is None or call.context is not None:
        return {}
    digest = hashlib.sha256(call.system.encode()).hexdigest()[:12]
    return {"system_tokens": counter.count_text(call.system), "system_key": f"traced {digest}"}


def tasks_json(frame: pd.DataFrame, counter: TokenCounter) -> dict[str, Any]:
    """A task workload's frame (``workloads.schema`` rows) in the JSON tasks format, prompts as
    whole lengths: building it again gives the same calls, graph, lengths and delays."""
    tasks: list[dict[str, Any]] = []
    for sid, rows in frame.groupby("session_id", sort=False):
        calls = []
        for row in rows.sort_values("turn").itertuples(index=False):
            call: dict[str, Any] = {
                "id": f"c{int(row.turn)}", "agent": row.agent,
                "depends_on": [f"c{int(d)}" for d in row.depends_on],
                "context": None if pd.isna(row.context_turn) else f"c{int(row.context_turn)}",
                "prompt_tokens": int(row.prompt_tokens), "output_tokens": int(row.output_tokens),
                "delay_s": float(row.think_time_s)}
            if call["context"] is None:
                call["system_prompt_tokens"] = int(row.shared_tokens or 0)
            if isinstance(row.tools, str):
                tool = json.loads(row.tools)
                call["tool_time_s"] = float(row.tool_time_s)
                call["tool_result_tokens"] = counter.count_text(str(tool["result"]))
            calls.append(call)
        task: dict[str, Any] = {"id": str(sid), "calls": calls}
        first = rows["trace_offset_s"].iloc[0]
        if not pd.isna(first):
            task["start_s"] = float(first)
        tasks.append(task)
    return {"tasks": tasks}


# ------------------------------------------------------------------------------ to the format


def _build_texts(calls: list[Call], fitter: _TextFitter, counter: TokenCounter,
                 systems: dict[tuple[str, int], str]) -> list[list[dict[str, Any]]]:
    """Synthesize each call's system prompt, user message and answer (calls in index order);
    returns each call's prompt as built with the logged answers."""
    full: list[list[dict[str, Any]]] = []
    for k, c in enumerate(calls):
        context = (full[c.context] + turn_reply(calls[c.context], c.context)
                   if c.context is not None else None)
        answers = [calls[d].answer or "" for d in c.depends_on if d != c.context]
        if c.system_tokens and context is None:
            key = (c.system_key, c.system_tokens)
            if key not in systems:
                systems[key] = fitter.text(f"system:{key}", c.system_tokens,
                                           f"system {_letters(c.system_key)} ")
            c.system = systems[key]
        opening = f"{_letters(c.session)} {_letters(str(k))} "
        want = c.user_tokens
        if want is None:  # the whole prompt's length: the user message fills the rest
            c.user = ""
            rest = counter.count_chat(call_messages(context, turn_messages(c), answers))
            want = max(1, (c.prompt_tokens or 1) - rest)
        c.user = fitter.text(f"{c.session}:{k}", want, opening)
        if c.prompt_tokens is not None and c.user_tokens is None:
            off = counter.count_chat(call_messages(context, turn_messages(c), answers)) - \
                c.prompt_tokens
            if off and want - off >= 1:  # a join of texts counted differently: once more
                c.user = fitter.text(f"{c.session}:{k}", want - off, opening)
        c.answer = fitter.text(f"{c.session}:{k}:answer", c.output_tokens)
        if c.tools:
            c.tool_result = fitter.text(f"tool:{c.session}:{k}", c.tool_result_tokens)
        full.append(call_messages(context, turn_messages(c), answers))
    return full


def tasks_frame(tasks: Sequence[list[Call]], counter: TokenCounter, buckets: BucketSpec,
                seed: int = 0, starts: Sequence[float | None] | None = None
                ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The workload rows of ``tasks`` (tasks consecutive, calls in index order) and the report."""
    fitter = _TextFitter(counter, "completions", seed)
    systems: dict[tuple[str, int], str] = {}
    rows: list[dict[str, Any]] = []
    for t, calls in enumerate(tasks):
        full = _build_texts(calls, fitter, counter, systems)
        shared: list[int] = []
        for k, c in enumerate(calls):
            shared.append(shared[c.context] if c.context is not None else (
                counter.count_text(c.system) if c.system else 0))
            prompt = counter.count_chat(full[k])
            rows.append({
                "bucket": buckets.bucket_of(prompt), "prompt_tokens": prompt,
                "output_tokens": c.output_tokens,
                "messages": json.dumps(turn_messages(c), ensure_ascii=False),
                "session_id": c.session, "request_id": f"{c.session}.c{k}",
                "trace_offset_s": (starts[t] if starts is not None and starts[t] is not None
                                   else np.nan) if k == 0 else np.nan,
                "source_line": c.source_line or t + 1, "turn": k,
                "think_time_s": c.think_time_s, "user_tokens": counter.count_text(c.user),
                "answer": c.answer,
                "tools": json.dumps({"tools": c.tools, "result": c.tool_result or "done"})
                if c.tools else None,
                "tool_time_s": c.tool_time_s, "shared_tokens": shared[k],
                "depends_on": list(c.depends_on), "context_turn": c.context, "agent": c.agent,
                "logged_prompt_tokens": c.prompt_tokens if c.user_tokens is None else None})
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    frame = workload_table(
        cols["bucket"], cols["prompt_tokens"], cols["output_tokens"],
        request_id=cols["request_id"], messages=cols["messages"],
        trace_offset_s=cols["trace_offset_s"], session_id=cols["session_id"],
        source_line=cols["source_line"], prompt_source="synthesized",
        **{k: cols[k] for k in ("turn", "think_time_s", "user_tokens", "answer", "tools",
                                "tool_time_s", "shared_tokens", "depends_on", "context_turn",
                                "agent")})
    return frame, task_report(frame.assign(logged_prompt_tokens=cols["logged_prompt_tokens"]))


# ------------------------------------------------------------------------------ the report


def _spread(values: Sequence[float] | pd.Series, counts: bool = True) -> dict[str, Any]:
    series = pd.Series(values, dtype="float64")
    out: dict[str, Any] = {"min": float(series.min()), "p50": float(series.median()),
                           "mean": round(float(series.mean()), 3), "max": float(series.max())}
    if counts and series.nunique() <= 24:
        out["counts"] = {f"{v:g}": int(n) for v, n in series.value_counts().sort_index().items()}
    return out


def task_graph_figures(depends_on: Sequence[Sequence[int]]) -> dict[str, int]:
    """One task's graph (``depends_on`` of its calls in index order): calls, fan-out (most calls
    that wait directly on one call), fan-in (most direct dependencies of one call), depth (calls
    on the longest chain), width (most calls at one depth). Direct: a dependency implied by
    another (a joining call's context, the planner's call) is not counted."""
    n = len(depends_on)
    waiting, fanin, level = [0] * n, [0] * n, [1] * n
    ancestors: list[set[int]] = []
    for k, listed in enumerate(depends_on):
        deps = {int(d) for d in listed}
        direct = {d for d in deps if not any(d in ancestors[e] for e in deps)}
        for d in direct:
            waiting[d] += 1
        fanin[k] = len(direct)
        ancestors.append(deps.union(*(ancestors[d] for d in deps)))
        level[k] = 1 + max((level[d] for d in deps), default=0)
    return {"calls": n, "fanout": max(waiting), "fanin": max(fanin),
            "depth": max(level), "width": max(level.count(v) for v in set(level))}


def task_report(frame: pd.DataFrame) -> dict[str, Any]:
    """Tasks, calls per task, fan-out, fan-in, depth and width (distributions over tasks), the
    agents, lengths, distinct system prompts and the calls they open, delays, tool loops, and
    how many whole prompts came out at their logged length."""
    per_task = pd.DataFrame([
        {**task_graph_figures(list(rows["depends_on"])), "agents": rows["agent"].nunique(),
         "delay_s": float(rows["think_time_s"].astype("float64").sum())}
        for _, rows in frame.groupby("session_id", sort=False)])
    logged = frame["logged_prompt_tokens"] if "logged_prompt_tokens" in frame else pd.Series(
        [None] * len(frame))
    mask = logged.notna().to_numpy()
    diff = (frame["prompt_tokens"].to_numpy()[mask] - logged[mask].astype("int64").to_numpy())
    roots = frame[frame["depends_on"].map(len) == 0]
    systems = [m[0]["content"] for m in map(json.loads, frame["messages"])
               if m and m[0]["role"] == "system"]
    return {
        "tasks": int(len(per_task)), "calls": int(len(frame)),
        "calls_per_task": _spread(per_task["calls"]),
        **{name: _spread(per_task[name]) for name in ("fanout", "fanin", "depth", "width",
                                                       "agents")},
        "root_calls": int(len(roots)),
        "with_context": int(frame["context_turn"].notna().sum()),
        "tool_loops": int(frame["tools"].notna().sum()),
        "prompt_tokens": _spread(frame["prompt_tokens"], counts=False),
        "output_tokens": _spread(frame["output_tokens"], counts=False),
        "shared_tokens": _spread(frame["shared_tokens"].astype("float64"), counts=False),
        "system_prompts": {"distinct": len(set(systems)), "calls": len(systems)},
        "delay_s": _spread(frame["think_time_s"].astype("float64"), counts=False),
        "task_delay_s": _spread(per_task["delay_s"], counts=False),
        "prompts_logged": {"calls": int(mask.sum()), "exact": int((diff == 0).sum()),
                           "longer": int((diff > 0).sum()), "shorter": int((diff < 0).sum()),
                           "max_off": int(np.abs(diff).max()) if len(diff) else 0},
    }


def format_task_report(report: dict[str, Any]) -> str:
    def spread(name: str) -> str:
        s = report[name]
        text = f"min {s['min']:g} p50 {s['p50']:g} max {s['max']:g}"
        if "counts" in s:
            text += "  (" + ", ".join(f"{v}: {n}" for v, n in s["counts"].items()) + ")"
        return text

    logged = report["prompts_logged"]
    lines = [f"tasks {report['tasks']}, calls {report['calls']} ({report['root_calls']} at a "
             f"task's start, {report['with_context']} on a context, tool loops "
             f"{report['tool_loops']})"]
    for name, what in (("calls_per_task", "calls per task"), ("fanout", "fan-out"),
                       ("fanin", "fan-in"), ("depth", "depth (calls)"), ("width", "width"),
                       ("agents", "agents")):
        lines.append(f"{what:<15} {spread(name)}")
    lines.append(f"{'prompt tokens':<15} {spread('prompt_tokens')}; output "
                 f"{spread('output_tokens')}; shared p50 {report['shared_tokens']['p50']:g}")
    systems = report["system_prompts"]
    lines.append(f"{'system prompts':<15} {systems['distinct']} distinct, opening "
                 f"{systems['calls']} calls")
    lines.append(f"{'delay s':<15} {spread('delay_s')}; per task p50 "
                 f"{report['task_delay_s']['p50']:g}")
    if logged["calls"]:
        lines.append(f"{'logged prompts':<15} {logged['exact']} of {logged['calls']} exact, "
                     f"{logged['longer']} longer, {logged['shorter']} shorter (max off "
                     f"{logged['max_off']} tokens)" + (
                         ": longer where the context and the answers of its dependencies "
                         "exceed the logged prompt" if logged["longer"] else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the build


def build_tasks(source: str, counter: TokenCounter | None, *, n: int | None = None,
                seed: int = 0, buckets: BucketSpec | None = None) -> SessionBuild:
    """A task workload from ``synthetic:KEY=VALUE,...``, ``otel:PATH`` or ``json:PATH``;
    ``n`` keeps the first n tasks."""
    kind, sep, rest = source.partition(":")
    if not sep or kind not in TASK_KINDS:
        raise TaskSourceError(f"--tasks {source!r}: expected KIND:..., KIND one of "
                              f"{list(TASK_KINDS)}")
    if counter is None:
        raise TaskSourceError("tasks need a tokenizer: --tokenizer DIR|words or --tokenize-url "
                              "URL (every call's text is synthesized to its length)")
    where = f"{kind}:{rest}"
    starts: list[float | None] | None = None
    source_report: dict[str, Any] = {"kind": kind}
    if kind == SYNTHETIC_KIND:
        spec = TaskSpec.parse(rest)
        if n is not None:
            spec = TaskSpec(**{**spec.to_dict(), "tasks": min(spec.tasks, n)})
        tasks = synthetic_tasks(spec, seed)
        source_report["spec"] = spec.to_dict()
    elif kind == OTEL_KIND:
        traced, starts, figures = otel_tasks(rest, where)
        tasks = [[Call(session=c.task, user="", output_tokens=c.output_tokens,
                       think_time_s=c.delay_s, depends_on=c.depends_on, context=c.context,
                       agent=c.agent, prompt_tokens=c.input_tokens, source_line=c.span_number,
                       **_traced_system(c, counter))
                  for c in trace] for trace in traced]
        source_report.update(path=rest, **figures)
    else:
        try:
            doc = json.loads(Path(rest).read_text(encoding="utf-8"))
        except OSError as exc:
            raise TaskSourceError(f"{where}: cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{where}: not JSON (line {exc.lineno}: {exc.msg})") from None
        tasks, starts = json_tasks(doc, where)
        source_report["path"] = rest
    if n is not None:
        tasks = tasks[:n]
        starts = None if starts is None else starts[:n]
    frame, report = tasks_frame(tasks, counter, buckets or BucketSpec(), seed, starts)
    metadata = {"source": {k: v for k, v in source_report.items() if k in ("kind", "path",
                                                                          "spec")},
                "endpoint": "chat", "tokenizer": counter.name, "seed": seed, "sessions": True,
                "tasks": True, "n": len(frame)}
    return SessionBuild(frame, {"source": source_report, "tasks": report}, metadata)
