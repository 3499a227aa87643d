"""Task figures (issue 42, ``docs/METRICS.md`` "One task"): agent tasks whose calls form a graph.

A task is a session whose records carry ``depends_on`` (a list, ``[]`` for the calls sent at the
task's start): ``session_id`` is the task, ``turn`` the call, ``agent`` who made it. A call that
is a tool loop is two records (``turn_step`` ``tool_call`` and ``final``); it counts once here,
from its first send to its final answer's last byte. Pure pandas/numpy.

- :func:`per_call`: one row per call: its place in the graph (``depth``: 0 for the calls sent at
  the start, 1 + its deepest dependency's otherwise; ``agent``; ``on_critical_path``), its
  outcome (ok when every request of it was), ``ttft_s`` / ``e2e_s`` of its first request,
  ``delay_s`` (scheduled - its dependencies' last end; for a start call, scheduled - the task's
  start), ``own_s`` (first send to last byte, a tool loop's final answer included), ``server_s``
  (the E2E of its requests summed), ``tool_s`` (own - server: the tool round trip) and
  ``path_s`` (the longest path through the graph that ends with this call).
- :func:`per_task`: one row per task: calls, calls_ok, agents, ``fan_out`` (the most calls that
  wait directly on one call) and ``depth`` (calls on the longest chain: planner -> workers ->
  joiner is 3) as the workload build reports them, ``start_ns`` (the start calls' scheduled
  time), ``end_ns`` (the last call's last byte), ``task_s`` = end - start, ``critical_path_s``
  (the longest path, each call weighing ``delay_s + own_s``), ``generator_delay_s`` = task -
  critical path (the generator's own schedule lag along it: near 0 when the generator kept
  up), the critical path split into ``path_server_s``, ``path_tool_s``, ``path_delay_s`` (they
  add up to it, to the microsecond) and ``server_share``, and ``outcome``: ok only when every
  call is ok, else the first failed call's outcome. The critical path is NaN for a task that is
  not ok.
- :func:`task_percentiles`: task time P50/P95/P99 over ok tasks (exact, collectors.percentiles);
  :func:`task_intervals`: their 95% intervals, a bootstrap over ok tasks (the task the unit
  drawn: its calls' times are not independent), none for a percentile with fewer tasks than
  :func:`dashboards.analysis.study_stats.min_units` (5, and 4 beyond the percentile: 8 tasks
  for P50, 80 for P95, 400 for P99); :func:`percentile_text` writes "P95 8.68 s [8.27, 9.79]".
- :func:`cache_table`: the share of each call's prompt a perfect prefix cache would reuse
  (``reusable_tokens / prompt_tokens``: the shared system prompt, the parent's context) against
  the server's (``cached_tokens / prompt_tokens``; absent where the server reports none), by
  depth and agent, over ok calls, with 95% intervals from a bootstrap over tasks (a task's calls
  share their prefixes: the task is the unit drawn).
- :func:`format_tasks`: the terminal's lines; :func:`step_figures`: a study step's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from collectors.percentiles import percentiles
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK
from dashboards.analysis.sessions import session_requests
from dashboards.analysis.study_stats import (
    BOOTSTRAP,
    INTERVAL_PERCENTILES,
    MIN_UNITS,
    Draws,
    min_units,
    unit_quantile_draws,
)
from workloads.tasks import task_graph_figures

# the requests columns the task figures read
TASK_COLUMNS = ["session_id", "turn", "turn_step", "depends_on", "agent", "outcome",
                "scheduled_wall_ns", "sent_wall_ns", "ttft_s", "e2e_s", "prompt_tokens",
                "reusable_tokens", "cached_tokens"]
TASK_PERCENTILES = (50.0, 95.0, 99.0)
# every percentile a study's SLO may be checked at
STEP_PERCENTILES = tuple(INTERVAL_PERCENTILES.values())
_NS = 1e9
_CALL_COLUMNS = ["session_id", "turn", "agent", "depends_on", "depth", "outcome", "scheduled_ns",
                 "sent_ns", "end_ns", "ttft_s", "e2e_s", "delay_s", "own_s", "server_s",
                 "tool_s", "path_s", "on_critical_path", "prompt_tokens", "reusable_tokens",
                 "cached_tokens"]
_TASK_COLUMNS = ["session_id", "calls", "calls_ok", "agents", "fan_out", "depth", "start_ns",
                 "end_ns", "task_s", "critical_path_s", "generator_delay_s", "path_server_s",
                 "path_tool_s", "path_delay_s", "server_share", "outcome"]


def task_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests of a run that are calls of tasks (empty when it has none)."""
    sessions = session_requests(requests)
    if "depends_on" not in sessions:
        return sessions.iloc[0:0]
    return sessions[sessions["depends_on"].notna()]


def _deps(value: Any) -> list[int]:
    return [] if value is None else [int(d) for d in value]


def _call_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per call, before the graph: its first record's fields, its outcome (the first
    not-ok outcome of its records in step order, else ok), end, and time on the server."""
    calls = task_requests(requests)
    step = calls["turn_step"] if "turn_step" in calls else pd.Series(None, index=calls.index)
    sent = ~calls["outcome"].isin(GENERATOR_OUTCOMES)
    sent_ns = calls["sent_wall_ns"].astype("float64").where(sent)
    e2e = calls["e2e_s"].astype("float64")
    frame = calls.assign(
        _final=step.eq("final"), _ok=calls["outcome"].eq(OUTCOME_OK),
        _end=sent_ns + e2e.fillna(0.0) * _NS, _server=e2e.where(sent))
    keys = ["session_id", "turn"]
    first = frame[~frame["_final"]].drop_duplicates(keys).set_index(keys)
    grouped = frame.groupby(keys, sort=False)
    bad = (frame[~frame["_ok"]].sort_values("_final", kind="stable")
           .groupby(keys, sort=False)["outcome"].first())
    out = pd.DataFrame(index=first.index)
    out["agent"] = first["agent"] if "agent" in first else None
    out["depends_on"] = first["depends_on"].map(_deps)
    out["outcome"] = bad.reindex(out.index).fillna(OUTCOME_OK).astype(str)
    scheduled = (first["scheduled_wall_ns"].astype("float64") if "scheduled_wall_ns" in first
                 else pd.Series(np.nan, index=first.index))
    out["sent_ns"] = first["sent_wall_ns"].astype("float64").where(
        ~first["outcome"].isin(GENERATOR_OUTCOMES))
    out["scheduled_ns"] = scheduled.fillna(out["sent_ns"])
    out["end_ns"] = grouped["_end"].max().reindex(out.index)
    out["ttft_s"] = first["ttft_s"].astype("float64")
    out["e2e_s"] = first["e2e_s"].astype("float64")
    out["server_s"] = grouped["_server"].sum(min_count=1).reindex(out.index)
    for column in ("prompt_tokens", "reusable_tokens", "cached_tokens"):
        out[column] = (first[column].astype("float64") if column in first
                       else np.nan)
    return out.reset_index().sort_values(keys, kind="stable").reset_index(drop=True)


def per_call(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per call of every task (columns in the module docstring)."""
    if task_requests(requests).empty:
        return pd.DataFrame(columns=_CALL_COLUMNS)
    calls = _call_frame(requests)
    n = len(calls)
    task = calls["session_id"].to_numpy()
    turn = calls["turn"].to_numpy(dtype=np.int64)
    deps = calls["depends_on"].tolist()
    scheduled = calls["scheduled_ns"].to_numpy(dtype=np.float64)
    sent = calls["sent_ns"].to_numpy(dtype=np.float64)
    end = calls["end_ns"].to_numpy(dtype=np.float64)
    server = calls["server_s"].to_numpy(dtype=np.float64)
    roots = np.array([not d for d in deps])
    start = pd.Series(np.where(roots, scheduled, np.nan)).groupby(task, sort=False) \
        .transform("min").to_numpy(dtype=np.float64)
    own = (end - sent) / _NS
    depth = np.zeros(n, dtype=np.int64)
    delay = np.full(n, np.nan)
    path = np.full(n, np.nan)
    before = np.full(n, -1, dtype=np.int64)  # the dependency the longest path comes through
    where: dict[tuple[Any, int], int] = {}
    for i in range(n):  # dependencies have smaller turns: each comes before its dependents
        where[(task[i], int(turn[i]))] = i
        mine = [where.get((task[i], d), -1) for d in deps[i]]
        if not mine:
            delay[i] = (scheduled[i] - start[i]) / _NS
            path[i] = delay[i] + own[i]
            continue
        if min(mine) < 0:  # a dependency without a record: no place in the graph
            depth[i] = -1
            continue
        depth[i] = 1 + max(depth[j] for j in mine)
        delay[i] = (scheduled[i] - max(end[j] for j in mine)) / _NS
        longest = max(mine, key=lambda j: path[j] if path[j] == path[j] else -np.inf)
        before[i] = longest
        path[i] = delay[i] + own[i] + path[longest]
    calls["depth"] = depth
    calls["delay_s"], calls["own_s"] = delay, own
    # to the microsecond: wall clocks as float64 ns carry 256 ns of rounding (no "-0.0%")
    calls["tool_s"] = np.round(own - server, 6) + 0.0
    calls["path_s"] = path
    calls["on_critical_path"] = _critical_marks(task, path, before, calls["outcome"])
    return calls[_CALL_COLUMNS]


def _critical_marks(task: np.ndarray, path: np.ndarray, before: np.ndarray,
                    outcome: pd.Series) -> np.ndarray:
    """True for the calls on each ok task's critical path: back from its longest path's end."""
    marks = np.zeros(task.size, dtype=bool)
    ok_task = outcome.eq(OUTCOME_OK).groupby(task, sort=False).transform("all").to_numpy()
    frame = pd.DataFrame({"task": task, "path": np.where(ok_task, path, np.nan)})
    for i in frame.dropna().groupby("task", sort=False)["path"].idxmax():
        while i >= 0:
            marks[i] = True
            i = before[i]
    return marks


def per_task(requests: pd.DataFrame | None = None, calls: pd.DataFrame | None = None
             ) -> pd.DataFrame:
    """One row per task (columns in the module docstring), from the requests or from
    :func:`per_call`'s frame."""
    calls = per_call(requests) if calls is None else calls
    if calls.empty:
        return pd.DataFrame(columns=_TASK_COLUMNS)
    ids = pd.Index(calls["session_id"].drop_duplicates())
    by_task = calls.groupby("session_id", sort=False)
    ok = calls["outcome"].eq(OUTCOME_OK)
    graphs = pd.DataFrame([_graph(group) for _, group in by_task], index=ids)
    roots = calls[calls["depends_on"].map(len).eq(0)]
    start = roots.groupby("session_id", sort=False)["scheduled_ns"].min().reindex(ids)
    end = by_task["end_ns"].max().reindex(ids)
    first_bad = calls[~ok].groupby("session_id", sort=False)["outcome"].first()
    outcome = first_bad.reindex(ids).fillna(OUTCOME_OK).astype(str)
    path = calls[calls["on_critical_path"]].assign(
        _server=calls["server_s"], _tool=calls["tool_s"], _delay=calls["delay_s"]) \
        .groupby("session_id", sort=False)[["_server", "_tool", "_delay"]].sum().reindex(ids)
    critical = by_task["path_s"].max().reindex(ids).where(outcome.eq(OUTCOME_OK))
    task_s = (end - start) / _NS
    return pd.DataFrame({
        "session_id": ids,
        "calls": by_task.size().reindex(ids).to_numpy(dtype=int),
        "calls_ok": ok.groupby(calls["session_id"], sort=False).sum().reindex(ids)
        .to_numpy(dtype=int),
        "agents": by_task["agent"].nunique().reindex(ids).to_numpy(dtype=int),
        "fan_out": graphs["fanout"].to_numpy(dtype=int),
        "depth": graphs["depth"].to_numpy(dtype=int),
        "start_ns": start.to_numpy(dtype=np.float64),
        "end_ns": end.to_numpy(dtype=np.float64),
        "task_s": task_s.to_numpy(dtype=np.float64),
        "critical_path_s": critical.to_numpy(dtype=np.float64),
        "generator_delay_s": (task_s - critical).to_numpy(dtype=np.float64),
        "path_server_s": path["_server"].where(critical.notna()).to_numpy(dtype=np.float64),
        "path_tool_s": path["_tool"].where(critical.notna()).to_numpy(dtype=np.float64),
        "path_delay_s": path["_delay"].where(critical.notna()).to_numpy(dtype=np.float64),
        "server_share": (path["_server"] / critical).to_numpy(dtype=np.float64),
        "outcome": outcome.to_numpy(),
    })


def _graph(calls: pd.DataFrame) -> dict[str, int]:
    """One task's fan-out and depth as the workload build reports them
    (:func:`workloads.tasks.task_graph_figures`), over the calls that have a record."""
    where = {int(t): k for k, t in enumerate(calls["turn"])}
    return task_graph_figures([[where[d] for d in deps if d in where]
                               for deps in calls["depends_on"]])


def task_percentiles(tasks: pd.DataFrame, qs: Sequence[float] = TASK_PERCENTILES
                     ) -> dict[str, float]:
    """``task_p50_s``, ``task_p95_s``, ``task_p99_s`` (or at ``qs``) of the ok tasks' task time:
    exact percentiles (linear between closest ranks, collectors.percentiles)."""
    ok = tasks.loc[tasks["outcome"].eq(OUTCOME_OK), "task_s"]
    return {f"task_p{q:g}_s": v for q, v in zip(qs, percentiles(ok, qs), strict=True)}


def task_intervals(tasks: pd.DataFrame, qs: Sequence[float] = TASK_PERCENTILES,
                   draws: int = BOOTSTRAP, seed: int = 0) -> dict[str, float]:
    """``task_p<q>_s_lo`` / ``_hi`` of :func:`task_percentiles`: 95%, a bootstrap over the ok
    tasks (study_stats.unit_quantile_draws); NaN under ``min_units(q)`` tasks."""
    ok = tasks.loc[tasks["outcome"].eq(OUTCOME_OK), "task_s"].to_numpy(dtype=np.float64)
    drawn = Draws(unit_quantile_draws([ok], np.ones((draws, 1), dtype=np.int64),
                                      np.random.default_rng(seed), "task",
                                      {f"p{q:g}": q for q in qs}))
    out = {}
    for q in qs:
        out[f"task_p{q:g}_s_lo"], out[f"task_p{q:g}_s_hi"] = drawn.interval(f"task_p{q:g}_s")
    return out


def percentile_text(figures: Mapping[str, float], q: float) -> str:
    """ "P95 8.68 s [8.27, 9.79]" from :func:`headline`'s figures; the value alone where it
    has no interval."""
    name = f"task_p{q:g}_s"
    value, lo, hi = (figures.get(name, np.nan), figures.get(f"{name}_lo", np.nan),
                     figures.get(f"{name}_hi", np.nan))
    if value != value:
        return f"P{q:g} -"
    interval = "" if lo != lo or hi != hi else f" [{lo:.2f}, {hi:.2f}]"
    return f"P{q:g} {value:.2f} s{interval}"


def interval_note(tasks_ok: float, qs: Sequence[float] = TASK_PERCENTILES) -> str:
    """Which percentiles have no interval for ``tasks_ok`` ok tasks, and the minimum each
    needs ('' when every one has one)."""
    short = [q for q in qs if tasks_ok < min_units(q)]
    if not short:
        return ""
    return "no interval for " + ", ".join(
        f"P{q:g} (needs {min_units(q)} ok tasks)" for q in short) + f": {int(tasks_ok)} ok"


def call_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Per depth and agent: calls, ok, ``critical`` (the share of them on their task's
    critical path),
    TTFT and E2E P50/P95 of the ok calls, and the call's own time P50 (tool loop included)."""
    rows = []
    for (depth, agent), group in calls.groupby(["depth", "agent"], sort=True, dropna=False):
        ok = group[group["outcome"].eq(OUTCOME_OK)]
        ttft = percentiles(ok["ttft_s"], (50, 95))
        e2e = percentiles(ok["e2e_s"], (50, 95))
        rows.append({"depth": int(depth), "agent": agent, "calls": len(group), "ok": len(ok),
                     "critical": float(group["on_critical_path"].mean()),
                     "ttft_p50_s": ttft[0], "ttft_p95_s": ttft[1], "e2e_p50_s": e2e[0],
                     "e2e_p95_s": e2e[1], "own_p50_s": percentiles(ok["own_s"], (50,))[0]})
    return pd.DataFrame(rows)


def cache_table(calls: pd.DataFrame, by: Sequence[str] = ("depth", "agent"),
                draws: int = BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """Per group of ok calls (``by``): calls, ``reported`` (calls whose server reported cached
    tokens), prompt tokens P50, ``perfect_share`` (reusable / prompt tokens, summed over the
    calls), ``hit_share`` (cached / prompt over the reporting calls; NaN when none reported),
    ``gap`` (perfect - hit), each share with ``_lo`` / ``_hi`` (95%, a bootstrap over tasks;
    NaN under :data:`study_stats.MIN_UNITS` tasks)."""
    ok = calls[calls["outcome"].eq(OUTCOME_OK) & calls["prompt_tokens"].gt(0)]
    columns = [*by, "calls", "reported", "prompt_tokens_p50", "perfect_share", "perfect_lo",
               "perfect_hi", "hit_share", "hit_lo", "hit_hi", "gap"]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    tasks = pd.Index(ok["session_id"].drop_duplicates())
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(len(tasks), np.full(len(tasks), 1.0 / len(tasks)), size=draws)
    rows = []
    for key, group in ok.groupby(list(by), sort=True, dropna=False):
        reported = group["cached_tokens"].notna()
        row: dict[str, Any] = dict(zip(by, key if isinstance(key, tuple) else (key,),
                                       strict=True))
        row.update(calls=len(group), reported=int(reported.sum()),
                   prompt_tokens_p50=percentiles(group["prompt_tokens"], (50,))[0])
        for name, part, numerator in (("perfect", group, "reusable_tokens"),
                                      ("hit", group[reported], "cached_tokens")):
            value, lo, hi = _share_interval(part, numerator, tasks, weights)
            row[f"{name}_share"], row[f"{name}_lo"], row[f"{name}_hi"] = value, lo, hi
        row["gap"] = row["perfect_share"] - row["hit_share"]
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def _share_interval(group: pd.DataFrame, numerator: str, tasks: pd.Index,
                    weights: np.ndarray) -> tuple[float, float, float]:
    """(sum numerator / sum prompt tokens, lo, hi): tasks drawn with replacement (``weights``:
    draws x tasks, as counts); NaN without calls."""
    if group.empty:
        return np.nan, np.nan, np.nan
    by_task = group.groupby("session_id", sort=False)[[numerator, "prompt_tokens"]].sum() \
        .reindex(tasks, fill_value=0.0)
    top = by_task[numerator].to_numpy(dtype=np.float64)
    bottom = by_task["prompt_tokens"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        drawn = (weights @ top) / (weights @ bottom)
    lo, hi = (Draws({"share": drawn}).interval("share") if len(tasks) >= MIN_UNITS
              else (np.nan, np.nan))
    return float(top.sum() / bottom.sum()), lo, hi


def timeline(calls: pd.DataFrame, task: str) -> pd.DataFrame:
    """One task's calls as bars for a timeline: call, agent (the lane), depth, start_s / end_s
    (seconds since the task's start: first send to last byte), scheduled_s, on_critical_path,
    outcome, and one row per dependency edge in ``edges`` form (``from_end_s`` -> this call's
    ``scheduled_s``): columns ``dep``, ``from_agent``, ``from_end_s`` (NaN for a start call)."""
    mine = calls[calls["session_id"] == task]
    origin = mine.loc[mine["depends_on"].map(len).eq(0), "scheduled_ns"].min()
    ends = mine.set_index("turn")
    rows = []
    for call in mine.itertuples(index=False):
        base = {"call": int(call.turn), "agent": call.agent, "depth": int(call.depth),
                "start_s": (call.sent_ns - origin) / _NS, "end_s": (call.end_ns - origin) / _NS,
                "scheduled_s": (call.scheduled_ns - origin) / _NS,
                "on_critical_path": bool(call.on_critical_path), "outcome": call.outcome}
        for dep in call.depends_on or [None]:
            known = dep is not None and dep in ends.index
            rows.append({**base, "dep": dep,
                         "from_agent": ends.at[dep, "agent"] if known else None,
                         "from_end_s": (ends.at[dep, "end_ns"] - origin) / _NS if known
                         else np.nan})
    return pd.DataFrame(rows)


# the tasks a page offers to draw: the ok task nearest a percentile of task time, the
# slowest, or the first that was not ok
TASK_CHOICES = ("nearest P50", "nearest P95", "nearest P99", "slowest", "first not ok")


def pick_task(tasks: pd.DataFrame, choice: str = "nearest P95") -> str | None:
    """The task of :data:`TASK_CHOICES` ``choice`` to draw (None when there is no such task)."""
    if choice not in TASK_CHOICES:
        raise ValueError(f"choice {choice!r}: one of {', '.join(TASK_CHOICES)}")
    ok = tasks[tasks["outcome"].eq(OUTCOME_OK) & tasks["task_s"].notna()]
    if choice == "first not ok":
        bad = tasks.loc[~tasks["outcome"].eq(OUTCOME_OK), "session_id"]
        return str(bad.iloc[0]) if len(bad) else None
    if ok.empty:
        return None
    if choice == "slowest":
        return str(ok.loc[ok["task_s"].idxmax(), "session_id"])
    q = float(choice.removeprefix("nearest P"))
    target = task_percentiles(ok, (q,))[f"task_p{q:g}_s"]
    return str(ok.loc[(ok["task_s"] - target).abs().idxmin(), "session_id"])


def task_histogram(tasks: pd.DataFrame, bins: int = 20) -> pd.DataFrame:
    """Ok tasks per task-time bin (bin centres in seconds)."""
    times = tasks.loc[tasks["outcome"].eq(OUTCOME_OK), "task_s"].dropna().to_numpy(
        dtype=np.float64)
    if not times.size:
        return pd.DataFrame({"task_s": [], "tasks": []})
    counts, edges = np.histogram(times, bins=bins)
    return pd.DataFrame({"task_s": np.round((edges[:-1] + edges[1:]) / 2, 3), "tasks": counts})


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:.1f}"


def _pct_text(value: float) -> str:
    return "-" if value != value else f"{value:.1%}"


def _with_interval(value: float, lo: float, hi: float) -> str:
    """ "85.3% [84.1%, 86.0%]"; the value alone without an interval."""
    interval = "" if lo != lo or hi != hi else f" [{_pct_text(lo)}, {_pct_text(hi)}]"
    return _pct_text(value) + interval


def cache_text(cache: pd.DataFrame) -> pd.DataFrame:
    """:func:`cache_table` written out for a page: depth, agent, calls, prompt tokens P50, the
    perfect and hit shares with their intervals ("absent" where the server reported none) and
    the gap in percentage points."""
    return pd.DataFrame({
        "depth": cache["depth"], "agent": cache["agent"], "calls": cache["calls"],
        "prompt tokens P50": cache["prompt_tokens_p50"].round(0),
        "perfect cache": [_with_interval(*r) for r in zip(
            cache["perfect_share"], cache["perfect_lo"], cache["perfect_hi"], strict=True)],
        "server hit": [_with_interval(v, lo, hi) if n else "absent" for v, lo, hi, n in zip(
            cache["hit_share"], cache["hit_lo"], cache["hit_hi"], cache["reported"],
            strict=True)],
        "gap (points)": [_points(g) for g in cache["gap"]],
    })


def _points(value: float) -> str:
    return "-" if value != value else f"{value * 100:.1f}"


def headline(tasks: pd.DataFrame) -> dict[str, float]:
    """The task figures a summary shows: tasks, ok, task time P50/P95/P99 with ``_lo`` /
    ``_hi`` (:func:`task_intervals`), critical path P50,
    generator delay P99 (of ok tasks), and the critical path's shares on the server, tools and
    delays (summed over the ok tasks)."""
    ok = tasks[tasks["outcome"].eq(OUTCOME_OK)]
    path = ok["critical_path_s"].sum()
    out = {"tasks": float(len(tasks)), "tasks_ok": float(len(ok)), **task_percentiles(tasks),
           **task_intervals(tasks),
           "critical_path_p50_s": percentiles(ok["critical_path_s"], (50,))[0],
           "generator_delay_p99_s": percentiles(ok["generator_delay_s"], (99,))[0]}
    for part in ("server", "tool", "delay"):
        out[f"path_{part}_share"] = float(ok[f"path_{part}_s"].sum() / path) if path > 0 \
            else np.nan
    return out


def format_tasks(requests: pd.DataFrame) -> str:
    """The terminal's task lines: task time P50/P95/P99 beside the calls' figures by depth and
    agent, and the cache table; '' for a run without tasks."""
    calls = per_call(requests)
    if calls.empty:
        return ""
    tasks = per_task(calls=calls)
    figures = headline(tasks)
    failed = tasks.loc[tasks["outcome"].ne(OUTCOME_OK), "outcome"].value_counts()
    why = ", ".join(f"{outcome} {count}" for outcome, count in failed.items())
    lines = ["", f"tasks {len(tasks)}: ok {int(figures['tasks_ok'])}, not ok "
             f"{int(failed.sum())}{f' ({why})' if why else ''}",
             "task time (ok tasks; 95% intervals over tasks): " + ", ".join(
                 percentile_text(figures, q) for q in TASK_PERCENTILES)
             + (f" ({note})" if (note := interval_note(figures["tasks_ok"])) else ""),
             f"critical path P50 {_ms(figures['critical_path_p50_s'])} ms; generator delay "
             f"P99 {_ms(figures['generator_delay_p99_s'])} ms",
             f"critical path: server {_pct_text(figures['path_server_share'])}, tools "
             f"{_pct_text(figures['path_tool_share'])}, delays "
             f"{_pct_text(figures['path_delay_share'])}",
             f"{'depth':>5} {'agent':<12} {'calls':>6} {'ok':>5} {'critical':>8} "
             f"{'TTFT P50':>9} {'TTFT P95':>9} {'E2E P50':>9} {'E2E P95':>9}"]
    for r in call_table(calls).itertuples(index=False):
        lines.append(f"{r.depth:>5} {str(r.agent):<12} {r.calls:>6} {r.ok:>5} "
                     f"{_pct_text(r.critical):>8} {_ms(r.ttft_p50_s):>9} {_ms(r.ttft_p95_s):>9} "
                     f"{_ms(r.e2e_p50_s):>9} {_ms(r.e2e_p95_s):>9}")
    cache = cache_table(calls)
    reported = bool(cache["reported"].any())
    lines.append("prefix cache per call (ok calls; perfect = what a perfect prefix cache "
                 "would reuse, hit = the server's cached_tokens; 95% intervals over tasks)"
                 + ("" if reported else "; hit absent: the server reported no cached tokens"))
    for r in cache.itertuples(index=False):
        hit = (", hit " + (_with_interval(r.hit_share, r.hit_lo, r.hit_hi) if r.reported
                           else "absent")) if reported else ""
        lines.append(f"{r.depth:>5} {str(r.agent):<12} {r.calls:>6} perfect "
                     f"{_with_interval(r.perfect_share, r.perfect_lo, r.perfect_hi)}{hit}")
    return "\n".join(lines)


def _window_tasks(requests: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """:func:`per_task`'s rows of the tasks whose first send fell in ``window`` (a task belongs
    to the window its first send falls in, as a session does), with ``began_ns``."""
    calls = per_call(requests)
    if calls.empty:
        return per_task(calls=calls).assign(began_ns=np.nan)
    tasks = per_task(calls=calls)
    began = calls.groupby("session_id", sort=False)["sent_ns"].min().reindex(
        tasks["session_id"]).to_numpy()
    return tasks[(began >= window[0]) & (began < window[1])].assign(
        began_ns=began[(began >= window[0]) & (began < window[1])])


def opening_task_times(requests: pd.DataFrame, window: tuple[int, int]) -> pd.Series:
    """Per record of ``requests`` (its index): the task time of an ok task that began in
    ``window``, on the record of its first send (NaN on every other record): the task times a
    study step's cohort carries, for draws over tasks (dashboards.analysis.study)."""
    out = pd.Series(np.nan, index=requests.index)
    cohort = _window_tasks(requests, window)
    cohort = cohort[cohort["outcome"].eq(OUTCOME_OK)]
    if cohort.empty:
        return out
    sent = task_requests(requests)
    sent = sent[~sent["outcome"].isin(GENERATOR_OUTCOMES)]
    first = sent.sort_values("sent_wall_ns", kind="stable").drop_duplicates("session_id")
    opener = pd.Series(first.index, index=first["session_id"].to_numpy()).reindex(
        cohort["session_id"].to_numpy())
    keep = opener.notna().to_numpy()
    out.loc[opener[keep].to_numpy()] = cohort["task_s"].to_numpy(dtype=np.float64)[keep]
    return out


def step_figures(requests: pd.DataFrame, window: tuple[int, int]) -> dict[str, float]:
    """A study step's task figures over the tasks that began (first send) in ``window``: tasks,
    tasks_ok (share), ``task_p50_s`` ... ``task_p99_s`` (ok tasks; every percentile a study's
    SLO may be checked at) and the generator delay P99. Empty for a step without tasks."""
    cohort = _window_tasks(requests, window)
    if cohort.empty:
        return {}
    figures = headline(cohort)
    return {"tasks": figures["tasks"], "tasks_ok": figures["tasks_ok"] / figures["tasks"],
            **task_percentiles(cohort, STEP_PERCENTILES),
            "task_generator_delay_p99_s": figures["generator_delay_p99_s"]}


def task_slo_met(figures: Mapping[str, Any], slo: Mapping[str, Any]) -> bool | None:
    """Whether ``figures`` (a step's) meet ``slo['task_ms']`` at ``slo['percentile']``; None
    when the SLO names no task time. A step without tasks fails it (no task was timed)."""
    limit = slo.get("task_ms")
    if limit is None:
        return None
    value = figures.get(f"task_{slo.get('percentile', 'p95')}_s", np.nan)
    return bool(value is not None and value <= float(limit) / 1e3)
