"""``swarmload soak``: a run of hours or days with bounded memory, windows, resume and drift.

    swarmload soak --target sim --workers 2 --users 64 --duration 72h
    swarmload soak --workload wl/ --plan poisson-100.yaml --duration 24h   # open loop, looping
    swarmload soak --resume results/run-...                  # after a crash: a new segment

The same processes as ``swarmload run`` (target, Locust master + workers, collectors), in soak
mode: the open-loop schedule is drawn lazily and loops over the workload (a fresh prompt salt
each pass), acknowledgements are kept only for requests in flight, Locust's own stats are
trimmed, per-minute windows are written during the run (``windows`` table), and part files are
compacted hourly. The server's RSS is watched through its pid: the one swarmload started, the
local process listening on the target's port, or ``--server-pid``; on another host run
``swarmload collect --process-name ...`` there. At the end (and on Ctrl-C / SIGTERM) the drift
report is computed from the windows and telemetry and written to ``drift.json``, the manifest
and the summary.

``--resume RUN_DIR`` continues a run that crashed (or was stopped) as a new *segment* with the
same settings: the gap is recorded in the manifest (``soak.segments``); each request the crashed
run had sent (workers journal every request before sending it) without a stored record gets a
``record_lost`` record, an open-loop schedule goes on after the last request sent, and the
scheduled requests before it that were never sent get a ``worker_lost`` record: each request id
has exactly one record, and nothing sent before the crash is sent again.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.dataset as ds

from collectors.atomic import write_json_atomic
from collectors.host import pid_listening_on
from collectors.journal import reconcile
from collectors.manifest import utc_now_iso
from collectors.parquet_sink import (
    PART_PATTERN,
    RollingParquetWriter,
    compact_parts,
    remove_covered_parts,
    visible_part_files,
)
from collectors.run_folder import load_manifest, load_table, update_manifest
from collectors.schemas import (
    GPU_PROCESS_SCHEMA,
    GPU_PROCESSES_TABLE,
    GPU_SCHEMA,
    GPU_TABLE,
    HOST_SCHEMA,
    HOST_TABLE,
    OUTCOME_WORKER_LOST,
    REQUEST_SCHEMA,
    REQUESTS_TABLE,
    SERVER_METRICS_SCHEMA,
    SERVER_METRICS_TABLE,
    WINDOW_SCHEMA,
    WINDOWS_TABLE,
)
from collectors.server_figures import E2E, ITL, KV_USAGE, RUNNING, TTFT, WAITING, include_prefixes
from collectors.windows import WINDOW_INPUT_COLUMNS, window_stats
from dashboards.analysis.drift import (
    ATTRIBUTED_UNCONFIRMED,
    drifting,
    format_drift,
    generator_drifting,
)
from dashboards.analysis.early_warning import (
    EARLY_WARNING_FILE,
    format_warnings,
    soak_early_warning,
)
from dashboards.analysis.soak import (
    LATENCY_SERIES,
    generator_limited,
    rss_flatness,
    soak_drift,
    soak_totals,
)
from infra.orchestrate import InputError, RunError, RunHooks, Target, build_parser, config_from
from infra.orchestrate import run as run_processes
from locustfiles.config import RunConfig
from locustfiles.schedule_items import iter_items

SOAK_KEY = "soak"
# A request without a record after a death was sent at most this long before it (the longest
# stream plus buffering): journals are reconciled over this stretch only, so a soak's end or
# resume never reads days of journal and request ids.
RECONCILE_HORIZON_S = 900.0
# what a soak's collector keeps of /metrics: KV cache, queue and the server's latencies
# every engine's names for them (collectors.server_figures)
KV_AND_QUEUE = include_prefixes([KV_USAGE, RUNNING, WAITING, TTFT, E2E, ITL])


def soak_parser() -> argparse.ArgumentParser:
    """``swarmload run``'s flags and the soak's own (RunConfig's fields of both)."""
    return build_parser("soak", __doc__)


def parse_soak_args(argv: list[str]) -> RunConfig:
    """argv -> the soak's validated configuration; InputError names the flag."""
    return config_from(soak_parser().parse_args(argv))


def _check_slos(args: RunConfig) -> None:
    """Each ``--slo`` names a latency series the soak has (InputError otherwise)."""
    unknown = sorted(set(args.slo_seconds) - set(LATENCY_SERIES))
    if unknown:
        raise InputError(f"--slo: {', '.join(unknown)} is not a soak latency series; "
                         f"allowed: {', '.join(LATENCY_SERIES)}")


class LiveEarlyWarning:
    """While the soak runs: its trends projected every ``every_s`` (the orchestrator's tick),
    written to ``early_warning.json`` (the master serves it to Prometheus; the Soak page reads
    the same analysis) and each newly flagged series printed once."""

    def __init__(self, warmup_s: float, alpha: float, share: float, every_s: float,
                 say: Any = print) -> None:
        self.warmup_s, self.alpha, self.share, self.every_s = warmup_s, alpha, share, every_s
        self.say = say
        self.next_at = time.monotonic() + every_s
        self.flagged: set[str] = set()

    def __call__(self, run_dir: Path) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        try:
            body = write_early_warning(run_dir, self.warmup_s, self.alpha, self.share)
        except Exception as exc:  # noqa: BLE001 - a half-written table must not stop the soak
            self.say(f"[swarmload] early warning not computed this time: {exc}")
            return
        for row in body["warnings"]:
            if row["flagged"] and row["series"] not in self.flagged:
                self.flagged.add(row["series"])
                self.say(f"[swarmload] early warning: {row['text']}")


def write_early_warning(run_dir: Path, warmup_s: float, alpha: float, share: float
                        ) -> dict[str, Any]:
    """Project the soak's trends now; write them to ``early_warning.json`` (atomic)."""
    warnings, facts = soak_early_warning(run_dir, warmup_s=warmup_s, alpha=alpha, share=share)
    body = {"computed_wall_ns": time.time_ns(), **facts,
            "warnings": json.loads(warnings.to_json(orient="records"))}
    write_json_atomic(run_dir / EARLY_WARNING_FILE, body)
    return body


# ------------------------------------------------------------------------------------ resume


def _request_seqs(run_dir: Path) -> tuple[int, list[int]]:
    """(highest schedule seq with a record, seqs below it without one), from request ids
    ``<id>#<seq>``, read one column and one batch at a time."""
    files = visible_part_files(run_dir / "requests")
    if not files:
        return -1, []
    dataset = ds.dataset([str(f) for f in files], format="parquet")
    seen = np.zeros(1 << 16, dtype=bool)
    top = -1
    for batch in dataset.to_batches(columns=["request_id"]):
        ids = batch.column(0)
        ids = pc.filter(ids, pc.match_substring(ids, "#"))  # closed-loop ids carry no seq
        if len(ids) == 0:
            continue
        parts = pc.split_pattern(ids, "#", reverse=True, max_splits=1)
        seqs = np.asarray(pc.list_element(parts, 1).cast("int64"))
        top = max(top, int(seqs.max()))
        if top >= seen.size:
            seen = np.concatenate([seen, np.zeros(max(top + 1, 2 * seen.size) - seen.size,
                                                  dtype=bool)])
        seen[seqs] = True
    missing = np.flatnonzero(~seen[: top + 1]).tolist() if top >= 0 else []
    return top, missing


def _lost_records(args: RunConfig, run_id: str, missing: list[int], segment: int,
                  gap_start_ns: int) -> list[dict[str, Any]]:
    """A ``worker_lost`` record for each scheduled request before the resume point that has no
    record even after the journals were reconciled: leased to a worker that had not sent it yet
    when the run died (a sent one is in a journal and has its ``record_lost`` record)."""
    if not missing:
        return []
    wanted = set(missing)
    records = []
    for item in iter_items(str(Path(args.workload).resolve()),
                           str(Path(args.plan).resolve()) if args.plan else None,
                           args.duration, args.seed, start_seq=min(missing)):
        if item["seq"] > max(missing):
            break
        if item["seq"] in wanted:
            records.append({
                "run_id": run_id, "worker_id": f"resume:segment-{segment}",
                "request_id": item["rid"], "bucket": item["bucket"],
                "endpoint": item["endpoint"], "outcome": OUTCOME_WORKER_LOST,
                "error": "never sent: the run crashed before its time (resumed after it)",
                "sent_wall_ns": gap_start_ns, "target_prompt_tokens": item["ptoks"],
                "max_tokens": item["max_tokens"],
            })
    return records


def _last_alive_ns(run_dir: Path) -> int:
    """When the crashed run last wrote anything (its newest part file or manifest)."""
    newest = 0
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.name.startswith(".") and "logs" not in path.parts:
            newest = max(newest, path.stat().st_mtime_ns)
    return newest


def _tidy_tables(run_dir: Path) -> None:
    """After a crash: drop parts a compacted file holds, and merge each dead writer's loose
    parts, so the files stay bounded by the hours across segments too."""
    schemas = {REQUESTS_TABLE: REQUEST_SCHEMA, WINDOWS_TABLE: WINDOW_SCHEMA,
               HOST_TABLE: HOST_SCHEMA, GPU_TABLE: GPU_SCHEMA,
               GPU_PROCESSES_TABLE: GPU_PROCESS_SCHEMA,
               SERVER_METRICS_TABLE: SERVER_METRICS_SCHEMA}
    for table, schema in schemas.items():
        directory = run_dir / table
        if not directory.is_dir():
            continue
        remove_covered_parts(directory)
        loose: dict[str, list[int]] = {}
        for path in directory.glob("*.parquet"):
            match = PART_PATTERN.match(path.name)
            if match:
                loose.setdefault(match["prefix"], []).append(int(match["part"]))
        for prefix, numbers in loose.items():
            compact_parts(directory, prefix, min(numbers), max(numbers), schema)


def prepare_resume(args: RunConfig) -> tuple[RunConfig, dict[str, Any]]:
    """The saved settings of the run in ``args.resume``, and this segment's facts."""
    run_dir = Path(args.resume).resolve()
    manifest = load_manifest(run_dir)
    soak = manifest.get(SOAK_KEY) or {}
    if not soak.get("argv"):
        raise RunError(f"{run_dir} is not a soak run folder (no soak settings in its manifest)")
    saved = replace(parse_soak_args(soak["argv"]), resume=str(run_dir), run_id=run_dir.name,
                    results=str(run_dir.parent), quiet=args.quiet)
    segment = len(soak.get("segments") or [])
    gap_start_ns = max((s.get("ended_wall_ns") or 0 for s in soak["segments"]), default=0)
    gap_start_ns = gap_start_ns or _last_alive_ns(run_dir)
    _tidy_tables(run_dir)
    # Requests the crashed run had sent (its workers journal each one before sending) whose
    # record died with it get one now; the schedule then goes on after the last of them, so
    # nothing sent is sent again.
    reconciled = reconcile(run_dir, run_dir.name, {}, {},
                           since_ns=gap_start_ns - int(RECONCILE_HORIZON_S * 1e9),
                           why_lost="sent; the whole run crashed (kill -9, reboot) before its "
                                    "record was stored")
    start_seq, lost = 0, 0
    if saved.workload:
        top, missing = _request_seqs(run_dir)
        start_seq = top + 1
        records = _lost_records(saved, run_dir.name, missing, segment, gap_start_ns)
        if records:
            writer = RollingParquetWriter(run_dir / REQUESTS_TABLE, REQUEST_SCHEMA,
                                          prefix=f"{socket.gethostname()}-resume{segment}")
            writer.append_rows(records)
            writer.close()
        lost = len(records)
    rebuilt = _rebuild_lost_windows(run_dir, soak, segment - 1)
    crashed = [{**s, "status": "crashed", "ended_wall_ns": gap_start_ns}
               if s.get("status") == "running" else s for s in soak["segments"]]
    update_manifest(run_dir, soak={**soak, "segments": crashed})
    facts = {"segment": segment, "start_seq": start_seq, "lost_in_gap": lost,
             "sent_record_lost": int(reconciled.get("reconciled", 0)),
             "gap_start_wall_ns": gap_start_ns, "windows_rebuilt": rebuilt}
    return saved, facts


def _rebuild_lost_windows(run_dir: Path, soak: dict[str, Any], segment: int) -> int:
    """Windows the crashed segment had not written yet (a window waits for its grace time),
    rebuilt from the records that survived: only the minutes after its last written window are
    read, so a resume never re-reads a long run's requests."""
    window_s = float(soak.get("window_s") or 60.0)
    written = load_table(run_dir, WINDOWS_TABLE, WINDOW_SCHEMA, ["window_start_ns", "segment"])
    mine = written[written["segment"] == segment]
    segment_start = next((s.get("started_wall_ns") for s in soak.get("segments") or []
                          if s.get("segment") == segment), None) or 0
    cutoff = (int(mine["window_start_ns"].max()) + int(window_s * 1e9) if not mine.empty
              else int(segment_start))
    files = visible_part_files(run_dir / "requests")
    if not files:
        return 0
    dataset = ds.dataset([str(f) for f in files], format="parquet", schema=REQUEST_SCHEMA)
    records = dataset.to_table(columns=list(WINDOW_INPUT_COLUMNS),
                               filter=ds.field("sent_wall_ns") >= cutoff).to_pandas()
    rows = window_stats(records, window_s, segment=segment)
    if rows.empty:
        return 0
    writer = RollingParquetWriter(run_dir / WINDOWS_TABLE, WINDOW_SCHEMA,
                                  prefix=f"{socket.gethostname()}-rebuilt{segment}")
    writer.append_frame(rows)
    writer.close()
    return len(rows)


# ------------------------------------------------------------------------------------- run


def _server_pid(target: Target, explicit: int | None) -> int | None:
    if explicit:
        return explicit
    if target.pid:
        return None  # swarmload started it: `run` already watches its pid and children
    parsed = urlparse(target.base_url)
    if parsed.hostname in ("127.0.0.1", "localhost", "::1") and parsed.port:
        return pid_listening_on(parsed.port)
    return None


def _segments(run_dir: Path) -> list[dict[str, Any]]:
    return list((load_manifest(run_dir).get(SOAK_KEY) or {}).get("segments") or [])


def _save_segment(run_dir: Path, soak: dict[str, Any], segment: dict[str, Any]) -> None:
    segments = _segments(run_dir)
    segments = [s for s in segments if s.get("segment") != segment["segment"]] + [segment]
    update_manifest(run_dir, soak={**soak, "segments": sorted(segments,
                                                              key=lambda s: s["segment"])})


def run_soak(args: RunConfig, argv: list[str], facts: dict[str, Any]) -> Path:
    segment_no = facts["segment"]
    soak_settings = {
        "argv": argv, "window_s": args.window, "compact_every_s": args.compact_every,
        "stats_keep_s": args.stats_keep, "warmup_s": args.warmup, "drift_p": args.drift_p,
        "drift_share": args.drift_share, "memory_limit_mb": args.memory_limit_mb,
        "slos": args.slo_seconds,
    }
    # the run in soak mode: the workers read soak, window, ... as their --swarmload-* options
    config = replace(args, soak=True, segment=segment_no, start_seq=facts["start_seq"],
                     gpu_interval=args.sample_interval, metrics_interval=args.sample_interval)
    segment: dict[str, Any] = {"segment": segment_no, **facts}

    def on_target_ready(run_dir: Path, target: Target) -> list[str]:
        pid = _server_pid(target, args.server_pid)
        now_ns = time.time_ns()
        segment.update(started_at=utc_now_iso(), started_wall_ns=now_ns, server_pid=pid or
                       target.pid, status="running")
        if segment_no > 0 and facts.get("gap_start_wall_ns"):
            segment["gap_before_s"] = (now_ns - facts["gap_start_wall_ns"]) / 1e9
        _save_segment(run_dir, soak_settings, segment)
        return ["--pid", str(pid), "--children-of", str(pid)] if pid else []

    hooks = RunHooks(
        log_subdir=f"segment-{segment_no}", resume=bool(args.resume),
        reconcile_horizon_s=RECONCILE_HORIZON_S, on_target_ready=on_target_ready,
        on_tick=LiveEarlyWarning(args.warmup, args.drift_p, args.drift_share,
                                 args.early_every or max(2 * args.window, 30.0)),
        collector_args=["--compact-every", str(args.compact_every),
                        "--host-interval", str(args.sample_interval),
                        "--flush-interval", str(max(args.sample_interval, 30.0)),
                        "--metrics-include", *KV_AND_QUEUE])
    run_dir = run_processes(config, hooks)
    segment.update(ended_at=utc_now_iso(), ended_wall_ns=time.time_ns(),
                   status=load_manifest(run_dir).get("status"))
    _save_segment(run_dir, soak_settings, segment)
    return run_dir


def report(run_dir: Path, warmup_s: float, drift_p: float, drift_share: float) -> str:
    """Compute the drift report, store it (drift.json, manifest) and return the summary text."""
    series, drift = soak_drift(run_dir, warmup_s=warmup_s, alpha=drift_p, share=drift_share)
    early = write_early_warning(run_dir, warmup_s, drift_p, drift_share)
    flat = rss_flatness(series, warmup_s)
    totals = soak_totals(run_dir)
    rows = json.loads(drift.to_json(orient="records"))
    write_json_atomic(run_dir / "drift.json", {
        "rule": {"mann_kendall_p_below": drift_p, "change_share_above": drift_share,
                 "warmup_s": warmup_s}, "series": rows}, indent=1)
    flagged = drifting(drift)
    # counted over the series, not the report: a latency left out in over half the windows
    # is not in the report at all
    left_out = int(generator_limited(series).sum()) if not series.empty else 0
    judged_latencies = int(drift["series"].isin(LATENCY_SERIES).sum())
    unconfirmed = [name for name, where in zip(drift["series"], drift["attribution"], strict=True)
                   if where == ATTRIBUTED_UNCONFIRMED and name in flagged]
    update_manifest(run_dir, rss_after_warmup=json.loads(flat.to_json(orient="index")),
                    drift={"drifting": flagged, "series": rows, "warmup_s": warmup_s,
                                    "mann_kendall_p_below": drift_p,
                                    "change_share_above": drift_share}, soak_totals=totals,
                    early_warning=early["warnings"])
    lines = [
        f"soak {run_dir.name}: {totals.get('requests', 0)} requests in "
        f"{totals.get('windows', 0)} windows over {totals.get('span_s', 0) / 3600:.2f} h, "
        f"segments {totals.get('segments')}, error rate {totals.get('error_rate', 0):.4f}, "
        f"{totals.get('mean_req_per_s', 0):.1f} ok req/s",
        "",
        format_drift(drift),
        "",
        f"drifting: {', '.join(flagged) if flagged else 'none'}",
        format_warnings(pd.DataFrame(early["warnings"], columns=["flagged", "text"])),
        *([f"of which client-side, with no server figure to confirm them: {', '.join(unconfirmed)}"]
          if unconfirmed else []),
        *([f"drifting in the generator or network, not the server (its own figure is flat): "
           f"{', '.join(generator_drifting(drift))}"] if generator_drifting(drift) else []),
        f"client latencies: {left_out} of {totals.get('windows', 0)} windows left out (the "
        "generator fell behind: schedule lag or read delay P99 over 10 ms)"
        + ("; too few left to judge them" if judged_latencies == 0 and left_out else ""),
        "",
        "RSS after warm-up, per-window means (MB): "
        + "; ".join(f"{name[:-7]} {r.first_mb:.0f} -> {r.last_mb:.0f} "
                    f"(min {r.min_mb:.0f}, max {r.max_mb:.0f}, spread {r.spread_share:.1%})"
                    for name, r in flat.iterrows()),
    ]
    return "\n".join(lines)


def _raise_interrupt(*_args: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    try:  # every flag checked before anything starts (e.g. --window 0)
        args = parse_soak_args(argv)
        _check_slos(args)
    except InputError as exc:
        print(f"swarmload soak: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # stops it like Ctrl-C does
    if args.report:
        print(report(Path(args.report).resolve(), args.warmup, args.drift_p, args.drift_share))
        return 0
    try:
        if args.resume:
            args, facts = prepare_resume(args)
            saved_argv = _saved_argv(Path(args.resume))
        else:
            facts = {"segment": 0, "start_seq": 0, "lost_in_gap": 0}
            saved_argv = _absolute_paths(argv)
        run_dir = run_soak(args, saved_argv, facts)
    except RunError as exc:
        print(f"swarmload soak: {exc}", file=sys.stderr)
        return 2
    print(report(run_dir, args.warmup, args.drift_p, args.drift_share))
    print(f"\nrun folder: {run_dir}")
    print(f"dashboard:  swarmload dashboard --results {run_dir.parent}")
    return 0


def _saved_argv(run_dir: Path) -> list[str]:
    return list((load_manifest(run_dir).get(SOAK_KEY) or {}).get("argv") or [])


def _absolute_paths(argv: list[str]) -> list[str]:
    """``argv`` with its folder and file options made absolute, so --resume works from anywhere."""
    out = list(argv)
    for i, word in enumerate(out):
        for flag in ("--workload", "--plan", "--results"):
            if word == flag and i + 1 < len(out):
                out[i + 1] = str(Path(out[i + 1]).resolve())
            elif word.startswith(flag + "="):
                out[i] = f"{flag}={Path(word.split('=', 1)[1]).resolve()}"
    return out
