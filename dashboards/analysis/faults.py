"""Fault drills: what the users saw during each fault of a run's fault plan, what the balancer
did, and how long the service took to come back.

A *fault* is an action that takes a replica out or makes it worse (``kill``, ``stop``,
``slow``) and the action that undoes it (``restart``, ``cont``, ``restore``); a ``restart`` of a
replica that was up is a fault of its own, out while it starts again. The actions as they were
acted out are the manifest's ``faults.actions`` (``infra/faults.py``). Per fault:

- **what users saw**: requests in the fault's span, failed ones by outcome class (cut streams,
  HTTP 5xx ...), dropped ones; the 1 s timeline of arrivals, error rate, P50/P95 TTFT and the
  server's waiting queue around it (the burst analysis's windows: ``burst.analyze_spike``);
- **recovery** (the burst analysis's definition, METRICS.md "Over time", with the error rate as
  a third criterion): the first window after which every window's P95 TTFT, error rate and the
  server's queue are back within the band of the minutes before the fault. ``recovery_s`` is
  counted from the fault's first action (how long users were worse off), ``after_end_s`` from
  its end (the replica serving again: burst's own ``recovery_s``), ``queue_recovery_s`` (from
  the first action) on the server's queue alone, ``back_s`` (from the first action) to the
  first window back within the band, when the backlog had drained. The fault's span opens with
  the arrival of the oldest request still in flight when it struck, so requests it cut count to
  it, not to the baseline;
- **what the balancer did**: with HAProxy, when it marked the replica DOWN and UP again (its
  stats socket, read every 0.1 s: ``balancer.watch``), against its health-check interval, and
  its own counts of retried and redispatched connections and of transfers the server aborted
  (stats socket), and from its log line per request (``collectors.balancer_log``) the requests
  of the fault's span it saw fail and the ones it retried;
  with client-side balancing the same from the records: the first failed request sent to the
  replica, the last one, and the first one it answered after the fault;
- **the server's own account** (simulator replicas: ``replicas/rN-requests.jsonl``): requests
  it started and never ended (a killed server's), to set beside the failed records; of those,
  the ones that failed (``server_unfinished_failed``, by request id: one whose connection
  closed before the answer's headers names no replica) and the ones the client still got an
  answer to (``server_unfinished_served_elsewhere``): their connection closed before one byte
  of the answer, so the client sent them once more (``locustfiles.streaming``) and another
  replica answered.

Usage::

    report = fault_report(run_dir)      # None without a fault plan
    report.faults                        # FAULT_COLUMNS, one row per fault
    report.timelines[1]                  # fault 1's windows (burst.TIMELINE_COLUMNS, t_s from
                                         # the fault's first action)
    print("\\n".join(fault_lines(report.faults)))
    spike_like(report.faults.iloc[0])   # a fault as burst_charts draws a spike
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.atomic import write_atomic
from collectors.balancer_log import balancer_failed, load_balancer_requests
from collectors.run_folder import (
    ROLLUP_DIR,
    load_manifest,
    load_requests,
    load_server_metrics,
    read_study,
)
from collectors.server_figures import KV_USAGE, RUNNING, WAITING
from dashboards.analysis import burst

OUT_ACTIONS = ("kill", "stop", "slow")
BACK_ACTIONS = {"kill": "restart", "stop": "cont", "slow": "restore"}
_NS = 1_000_000_000
MAX_IN_FLIGHT_S = 60.0  # the oldest request counted as in flight at a fault, at most

FAULT_COLUMNS = (
    "fault", "replica", "action", "undo", "start_s", "end_s", "out_s", "requests", "failed",
    "failed_by_class", "failed_on_replica", "dropped", "in_flight", "baseline_ttft_p50_s",
    "baseline_ttft_p95_s", "baseline_error_rate", "ttft_limit_s", "queue_limit",
    "peak_ttft_p95_s", "peak_error_rate", "peak_waiting", "recovered", "recovery_s",
    "back_s", "after_end_s", "queue_recovery_s", "lb_removed_after_s", "lb_returned_after_s",
    "lb_check_interval_s", "lb_retries", "lb_redispatches", "lb_server_aborts", "lb_failed",
    "lb_retried", "lb_unlogged_failed", "first_served_after_s", "client_first_error_s",
    "client_last_error_s", "server_unfinished", "server_unfinished_failed",
    "server_unfinished_served_elsewhere", "note",
)


@dataclass
class FaultReport:
    origin_ns: int
    faults: pd.DataFrame  # FAULT_COLUMNS
    timelines: dict[int, pd.DataFrame] = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    replica: str
    action: str
    start_ns: int
    end_ns: int | None  # the replica serving again; None: not undone in the run
    undo: str | None
    start_entry: dict[str, Any]
    end_entry: dict[str, Any] | None


def predicted_recovery_s(outage_s: float, rate: float, capacity_left: float,
                         capacity_all: float) -> float:
    """The recovery time worked out in advance, from the fault's first action: while a replica
    is out (``outage_s``) the rest serve ``capacity_left`` of the ``rate`` offered, so a backlog
    of ``(rate - capacity_left) * outage_s`` builds; once it is back the backlog drains at the
    spare capacity ``capacity_all - rate``. No backlog (``rate <= capacity_left``): back as soon
    as the replica is out of the way, 0 after the outage."""
    if rate <= capacity_left:
        return 0.0
    if rate >= capacity_all:
        return float("inf")
    backlog = (rate - capacity_left) * outage_s
    return outage_s + backlog / (capacity_all - rate)


# ------------------------------------------------------------------------------- the faults


def pair_faults(actions: list[dict[str, Any]]) -> list[Fault]:
    """The actions done, paired per replica into faults (see the module docstring)."""
    faults: list[Fault] = []
    open_: dict[str, dict[str, Any]] = {}
    for entry in sorted((a for a in actions if a.get("outcome") == "done"),
                        key=lambda a: int(a["wall_ns"])):
        replica, kind = entry["replica"], entry["action"]
        if kind in OUT_ACTIONS:
            if replica not in open_:
                open_[replica] = entry
            continue
        began = open_.pop(replica, None)
        end = _serving_again_ns(entry)
        if began is None:
            if kind == "restart":  # a restart of a replica that was up
                faults.append(Fault(replica, "restart", int(entry["wall_ns"]), end, None,
                                    entry, entry))
            continue
        faults.append(Fault(replica, began["action"], int(began["wall_ns"]), end, kind, began,
                            entry))
    for replica, began in open_.items():
        faults.append(Fault(replica, began["action"], int(began["wall_ns"]), None, None, began,
                            None))
    return sorted(faults, key=lambda f: f.start_ns)


def _serving_again_ns(entry: dict[str, Any]) -> int:
    return int(entry["wall_ns"]) + int(float(entry.get("serving_after_s") or 0.0) * _NS)


def _in_flight_opening(prepared: pd.DataFrame, sent_ns: np.ndarray, at_ns: int) -> int:
    """The arrival of the oldest request still in flight at ``at_ns`` (``at_ns`` if none)."""
    e2e = np.nan_to_num(prepared["e2e_s"].to_numpy(dtype=np.float64), nan=np.inf)
    ends = sent_ns + np.minimum(e2e, MAX_IN_FLIGHT_S) * _NS
    inside = (sent_ns < at_ns) & (ends >= at_ns) & (sent_ns >= at_ns - MAX_IN_FLIGHT_S * _NS)
    if not inside.any():
        return at_ns
    return int(min(prepared["arrival_ns"].to_numpy()[inside].min(), at_ns))


# ------------------------------------------------------------------------ what HAProxy did


def balancer_moves(watch: dict[str, Any] | None, server: str, start_ns: int,
                   end_ns: int | None) -> dict[str, float]:
    """When HAProxy marked ``server`` DOWN after ``start_ns`` (seconds after it) and UP again
    after that (seconds after ``end_ns``, the replica serving again), from the watch's events."""
    out = {"lb_removed_after_s": np.nan, "lb_returned_after_s": np.nan}
    events = [e for e in (watch or {}).get("events", [])
              if e.get("event") == "status" and e.get("server") == server]
    down = next((e for e in events if e["status"] == "DOWN" and e["wall_ns"] >= start_ns), None)
    if down is None:
        return out
    out["lb_removed_after_s"] = (down["wall_ns"] - start_ns) / _NS
    up = next((e for e in events if e["status"] == "UP" and e["wall_ns"] > down["wall_ns"]),
              None)
    if up is not None:
        out["lb_returned_after_s"] = (up["wall_ns"] - (end_ns or start_ns)) / _NS
    return out


def _counter_delta(before: dict[str, Any] | None, after: dict[str, Any] | None,
                   key: str, servers: list[str] | None = None) -> float:
    if not before or not after:
        return np.nan
    names = servers or sorted(set(before) | set(after))
    return float(sum(int((after.get(n) or {}).get(key, 0)) - int((before.get(n) or {}).get(key, 0))
                     for n in names))


def _snapshots(watch: dict[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    return [(int(e["wall_ns"]), e["servers"]) for e in (watch or {}).get("events", [])
            if e.get("event") == "snapshot"]


def _snapshot_at_or_after(snaps: list[tuple[int, dict[str, Any]]], at_ns: int
                          ) -> dict[str, Any] | None:
    return next((s for t, s in snaps if t >= at_ns), None)


# ----------------------------------------------------------------------- the server's account


def server_unfinished(run_dir: Path, replica: str, lo_ns: int, hi_ns: int) -> set[str] | None:
    """The request ids (``X-Request-Id``) a simulator replica logged as started in
    ``[lo_ns, hi_ns)`` with no end line: the ones it had in flight when it was killed (None
    without its request log)."""
    path = run_dir / "replicas" / f"{replica}-requests.jsonl"
    if not path.is_file():
        return None
    started: dict[str, int] = {}
    ended: set[str] = set()
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        rid = item.get("request_id")
        if item.get("event") == "start":
            started[rid] = int(item["wall_ns"])
        elif item.get("event") == "end":
            ended.add(rid)
    return {rid for rid, t in started.items() if lo_ns <= t < hi_ns and rid not in ended}


# ---------------------------------------------------------------------------------- a run


def analyze_faults(requests: pd.DataFrame, faults: list[Fault], origin_ns: int,
                   server: dict[str, pd.DataFrame] | None = None, *,
                   manifest: dict[str, Any] | None = None, run_dir: Path | None = None,
                   balancer_requests: pd.DataFrame | None = None,
                   end_ns: int | None = None, window_s: float = burst.WINDOW_S,
                   tolerance: float = burst.TOLERANCE) -> FaultReport:
    """Every fault of a run: the fault table and each fault's timeline."""
    manifest = manifest or {}
    server = server or {}
    prepared = burst.prepare_requests(requests)
    sent = requests["sent_wall_ns"].to_numpy(dtype=np.int64)
    replica_col = (requests["replica"].astype(object).to_numpy() if "replica" in requests
                   else np.full(len(requests), None, dtype=object))
    if end_ns is None:
        end_ns = int(prepared["arrival_ns"].max()) + 1 if len(prepared) else origin_ns
    balancer = manifest.get("balancer") or {}
    watch = balancer.get("watch")
    check = balancer.get("health_check") or {}
    snaps = _snapshots(watch)
    # a fault names its replica rN, the N-th started; records name it by HAProxy's server name
    # (rN too) or, balanced by the workers, by its URL
    urls = [r.get("url") for r in (manifest.get("target") or {}).get("replicas") or []]
    client_side = not balancer
    lb_failed_ids: set[str] = set()
    lb_retried_ids: set[str] = set()
    lb_logged_ids: set[str] = set()
    if balancer_requests is not None and len(balancer_requests):
        lb_logged_ids = set(balancer_requests["request_id"])
        lb_failed_ids = set(balancer_requests["request_id"][balancer_failed(balancer_requests)])
        lb_retried_ids = set(balancer_requests["request_id"][balancer_requests["retries"] > 0])
    http_ids = (requests["http_request_id"].astype(object).to_numpy()
                if "http_request_id" in requests else np.full(len(requests), None, dtype=object))
    rows, timelines = [], {}
    not_before = origin_ns + int(burst.SKIP_START_S * _NS)
    openings = [_in_flight_opening(prepared, sent, f.start_ns) for f in faults]
    for number, fault in enumerate(faults, start=1):
        opening = openings[number - 1]
        fault_end = fault.end_ns if fault.end_ns is not None else end_ns
        horizon = openings[number] if number < len(faults) else end_ns
        spike = burst.Spike(opening, max(fault_end, opening + 1), source="fault")
        row, view = burst.analyze_spike(prepared, server, spike, not_before_ns=not_before,
                                        horizon_ns=horizon, window_s=window_s,
                                        tolerance=tolerance, errors=True)
        out_s = (fault_end - fault.start_ns) / _NS
        view = view.assign(t_s=(view["window_start_ns"] - fault.start_ns) / _NS)
        timelines[number] = view
        recovered = bool(row["recovered"])
        recovery_end = (fault_end + int(row["recovery_s"] * _NS) if recovered else horizon)
        arrival = prepared["arrival_ns"].to_numpy()
        span = (arrival >= opening) & (arrival < max(recovery_end, fault_end))
        failed = prepared["failed"].to_numpy() & span
        classes = pd.Series(prepared["outcome"].to_numpy()[failed]).value_counts()
        peak = view[view["phase"] != "baseline"]
        index = int(fault.replica[1:]) if fault.replica[1:].isdigit() else -1
        target_name = (urls[index] if client_side and 0 <= index < len(urls)
                       else fault.replica)
        mine = replica_col == target_name
        after_end = (sent >= fault_end) & mine & (prepared["ok"].to_numpy())
        errors_mine = mine & prepared["failed"].to_numpy() & (sent >= opening)
        if fault.end_ns is not None:
            errors_mine &= sent < max(recovery_end, fault_end)
        before = (fault.start_entry.get("balancer") or
                  _snapshot_at_or_after(snaps, fault.start_ns))
        after = _snapshot_at_or_after(snaps, recovery_end) or (snaps[-1][1] if snaps else None)
        moves = balancer_moves(watch, fault.replica, fault.start_ns, fault.end_ns)
        note = [row["note"]] if row["note"] else []
        unfinished = (server_unfinished(run_dir, fault.replica, opening,
                                        max(recovery_end, fault_end))
                      if run_dir is not None and fault.action == "kill" else None)
        if fault.end_ns is None:
            note.append(f"{fault.action} not undone in the run")
        result = {
            "fault": number, "replica": fault.replica, "action": fault.action,
            "undo": fault.undo or "", "start_s": (fault.start_ns - origin_ns) / _NS,
            "end_s": (fault_end - origin_ns) / _NS if fault.end_ns is not None else np.nan,
            "out_s": out_s, "requests": int(span.sum()), "failed": int(failed.sum()),
            "failed_by_class": ", ".join(f"{k} {v}" for k, v in classes.items()),
            "failed_on_replica": int((failed & mine).sum()),
            "dropped": int((prepared["dropped"].to_numpy() & span).sum()),
            "in_flight": int(((sent < fault.start_ns) & (arrival >= opening)).sum()),
            "baseline_ttft_p50_s": row["baseline_ttft_p50_s"],
            "baseline_ttft_p95_s": row["baseline_ttft_p95_s"],
            "ttft_limit_s": row["ttft_limit_s"], "queue_limit": row["queue_limit"],
            "baseline_error_rate": row["baseline_error_rate"],
            "peak_ttft_p95_s": float(peak["ttft_p95_s"].max()) if len(peak) else np.nan,
            "peak_error_rate": float(peak["error_rate"].max()) if len(peak) else np.nan,
            "peak_waiting": float(peak["waiting"].max()) if len(peak) else np.nan,
            "recovered": recovered,
            "recovery_s": out_s + row["recovery_s"] if recovered else np.nan,
            "back_s": out_s + row["back_s"] if np.isfinite(row["back_s"]) else np.nan,
            "after_end_s": row["recovery_s"],
            "queue_recovery_s": (out_s + row["queue_recovery_s"]
                                 if np.isfinite(row["queue_recovery_s"]) else np.nan),
            **moves,
            "lb_check_interval_s": float(check.get("interval_s") or np.nan),
            "lb_retries": _counter_delta(before, after, "wretr"),
            "lb_redispatches": _counter_delta(before, after, "wredis"),
            "lb_server_aborts": _counter_delta(before, after, "srv_abrt", [fault.replica]),
            "lb_failed": (float(sum(1 for i in http_ids[span] if i in lb_failed_ids))
                          if balancer_requests is not None else np.nan),
            "lb_retried": (float(sum(1 for i in http_ids[span] if i in lb_retried_ids))
                           if balancer_requests is not None else np.nan),
            # failed on a connection HAProxy closed before it logged a request on it
            "lb_unlogged_failed": (float(sum(1 for i in http_ids[failed]
                                             if i not in lb_logged_ids))
                                   if balancer_requests is not None else np.nan),
            "first_served_after_s": ((sent[after_end].min() - fault_end) / _NS
                                     if fault.end_ns is not None and after_end.any()
                                     else np.nan),
            "client_first_error_s": ((sent[errors_mine].min() - fault.start_ns) / _NS
                                     if errors_mine.any() else np.nan),
            "client_last_error_s": ((sent[errors_mine].max() - fault.start_ns) / _NS
                                    if errors_mine.any() else np.nan),
            "server_unfinished": (len(unfinished) if unfinished is not None else np.nan),
            # matched by request id: a failure whose connection closed before the answer's
            # headers names no replica, yet the killed server had started it
            "server_unfinished_failed": (
                float(len(unfinished.intersection(http_ids[prepared["failed"].to_numpy()])))
                if unfinished is not None else np.nan),
            "server_unfinished_served_elsewhere": (
                float(len(unfinished.intersection(http_ids[prepared["ok"].to_numpy()])))
                if unfinished is not None else np.nan),
            "note": "; ".join(note),
        }
        rows.append(result)
        not_before = recovery_end if recovered else horizon
    return FaultReport(origin_ns, pd.DataFrame(rows, columns=list(FAULT_COLUMNS)), timelines)


def fault_report(run_dir: str | Path, window_s: float = burst.WINDOW_S,
                 tolerance: float = burst.TOLERANCE) -> FaultReport | None:
    """The fault analysis of a run folder, or None when it had no fault plan (or no record)."""
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    plan = manifest.get("faults")
    if not plan or not plan.get("actions"):
        return None
    requests = load_requests(run_dir)
    if requests.empty:
        return None
    origin = plan.get("origin_ns") or burst.schedule_origin_ns(manifest, run_dir) or int(
        requests["sent_wall_ns"].min())
    faults = pair_faults(plan["actions"])
    if not faults:
        return FaultReport(int(origin), pd.DataFrame(columns=list(FAULT_COLUMNS)))
    server = burst.server_frames(load_server_metrics(run_dir, [WAITING, RUNNING, KV_USAGE]),
                                 manifest)

    end = int(requests["sent_wall_ns"].max()) + 1
    return analyze_faults(requests, faults, int(origin), server, manifest=manifest,
                          run_dir=run_dir, balancer_requests=load_balancer_requests(run_dir),
                          end_ns=end, window_s=window_s, tolerance=tolerance)


# ------------------------------------------------------------------------------------ text


def _s(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f} s" if np.isfinite(value) else "n/a"


def fault_lines(faults: pd.DataFrame) -> list[str]:
    """One line per fault for the terminal summary."""
    lines = []
    for row in faults.itertuples(index=False):
        what = f"{row.action} {row.replica} at {row.start_s:.1f} s"
        if row.undo:
            what += f", {row.undo} at {row.end_s:.1f} s"
        failed = f"failed {row.failed}" + (f" ({row.failed_by_class})" if row.failed else "")
        parts = [what, failed]
        if np.isfinite(row.lb_failed):
            parts.append(f"HAProxy saw {row.lb_failed:.0f} fail, retried {row.lb_retried:.0f} "
                         f"(its counters: {row.lb_retries:.0f} retries, "
                         f"{row.lb_redispatches:.0f} redispatches)")
        if np.isfinite(row.lb_removed_after_s):
            removed = (f"HAProxy took it out {_s(row.lb_removed_after_s, 2)} after the "
                       f"{row.action}")
            if np.isfinite(row.lb_check_interval_s):
                removed += f" (checks every {row.lb_check_interval_s:g} s)"
            if np.isfinite(row.lb_returned_after_s):
                removed += f", back in {_s(row.lb_returned_after_s, 2)} after the {row.undo}"
            parts.append(removed)
        elif np.isfinite(row.client_first_error_s):
            parts.append(f"errors from it {_s(row.client_first_error_s, 2)} to "
                         f"{_s(row.client_last_error_s, 2)} after the {row.action}")
        if row.recovered:
            recovery = (f"recovered {_s(row.recovery_s, 0)} after the {row.action} "
                        f"({_s(row.after_end_s, 0)} after the {row.undo or 'end'})")
        else:
            recovery = f"NOT recovered ({row.note})" if row.note else "NOT recovered"
        if np.isfinite(row.back_s) and not (row.recovered and row.back_s >= row.recovery_s):
            recovery += f"; first back in the band {_s(row.back_s, 0)} after the {row.action}"
        if np.isfinite(row.queue_recovery_s):
            recovery += f"; server queue back {_s(row.queue_recovery_s, 0)} after it"
        parts.append(f"P95 TTFT up to {_s(row.peak_ttft_p95_s, 2)} (baseline "
                     f"{_s(row.baseline_ttft_p95_s, 2)}), {recovery}")
        lines.append(f"fault {row.fault}: " + "; ".join(parts))
    return lines


def format_faults(report: FaultReport | None) -> str:
    """The fault lines under a heading, or "" without faults."""
    if report is None or report.faults.empty:
        return ""
    return "\n".join(["", "faults (1 s windows; recovery = P95 TTFT, error rate and queue "
                      "back within the band before the fault):", *fault_lines(report.faults)])


def spike_like(fault: pd.Series) -> pd.DataFrame:
    """One fault as a one-row spike table (``config`` = ``fault N``), so the burst charts
    (``dashboards.burst_charts``) draw its timeline: shaded while the replica was out (from
    the action, ``t_s`` 0, to ``out_s``), the baseline band, a rule where it recovered."""
    return pd.DataFrame([{
        "config": f"fault {int(fault['fault'])}", "duration_s": float(fault["out_s"]),
        "recovery_s": float(fault["after_end_s"]),
        "baseline_ttft_p50_s": float(fault["baseline_ttft_p50_s"]),
        "ttft_limit_s": float(fault["ttft_limit_s"]), "queue_limit": float(fault["queue_limit"]),
    }])


# ------------------------------------------------------------------------------------ studies

FAULTS_FILE = "faults.parquet"  # <study>/rollup/: one row per configuration x step x fault


def study_faults(study_dir: str | Path) -> pd.DataFrame:
    """Every fault of every done step of a study (a configuration's fault plan), with
    ``config``, ``step``, ``offered_load`` and ``run_dir`` in front: configurations side by
    side on the same drill."""
    study_dir = Path(study_dir)
    tables = []
    for entry in read_study(study_dir).get("steps", []):
        report = (fault_report(study_dir / entry["run_dir"])
                  if entry.get("status") == "done" else None)
        if report is not None and len(report.faults):
            tables.append(report.faults.assign(config=entry["config"], step=int(entry["step"]),
                                               offered_load=float(entry["offered_load"]),
                                               run_dir=entry["run_dir"]))
    columns = ["config", "step", "offered_load", "run_dir", *FAULT_COLUMNS]
    return (pd.concat(tables, ignore_index=True)[columns] if tables
            else pd.DataFrame(columns=columns))


def write_study_faults(study_dir: str | Path) -> pd.DataFrame:
    """:func:`study_faults` written to ``<study>/rollup/faults.parquet`` (atomically)."""
    table = study_faults(study_dir)
    out = Path(study_dir) / ROLLUP_DIR / FAULTS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda tmp: table.to_parquet(tmp, index=False))
    return table


def load_study_faults(study_dir: str | Path) -> pd.DataFrame | None:
    """The written fault roll-up of a study, or None when it has none."""
    path = Path(study_dir) / ROLLUP_DIR / FAULTS_FILE
    if not path.is_file():
        return None
    table = pd.read_parquet(path)
    return table if len(table) else None


STUDY_FAULT_COLUMNS = ("config", "step", "offered_load", "fault", "action", "replica", "failed",
                       "lb_failed", "lb_removed_after_s", "lb_returned_after_s", "recovery_s",
                       "after_end_s", "queue_recovery_s", "peak_ttft_p95_s")
