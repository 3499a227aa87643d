"""The send journal: every request a worker sends is noted on disk before it goes out, so a
request whose record never reached the Parquet files (its worker or the master was killed) still
ends with one record.

- Workers (and local runners) call :meth:`SendJournal.note` just before each request: one
  unbuffered ``write`` of one line to ``<run_dir>/journal/<host>-<pid>-<tag>.tsv`` (a few
  microseconds; it survives a SIGKILL of the worker, since the kernel holds the bytes).
- After every process of the run has stopped, the orchestrator calls :func:`reconcile`: each
  journalled request without a record gets one, ``worker_lost`` when the process that sent it
  died, ``record_lost`` when the master (which stores records) died, with how long it had waited
  until that death, written to ``requests/reconciled-*.parquet``.

Only journals on the orchestrator's host are seen; workers started by hand on other machines
keep theirs locally (the same call reconciles them when their folders are gathered).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from collectors.parquet_sink import RollingParquetWriter, visible_part_files
from collectors.schemas import (
    OUTCOME_RECORD_LOST,
    OUTCOME_WORKER_LOST,
    REQUEST_SCHEMA,
    REQUESTS_TABLE,
)

JOURNAL_DIR = "journal"
_FIELDS = ("request_id", "http_request_id", "sent_wall_ns", "bucket", "endpoint",
           "target_prompt_tokens", "max_tokens", "scheduled_wall_ns")


class SendJournal:
    """Append-only, unbuffered: one line per request sent by this process."""

    def __init__(self, run_dir: str | os.PathLike[str], worker_id: str) -> None:
        folder = Path(run_dir) / JOURNAL_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.worker_id = worker_id
        name = worker_id.replace(":", "-").replace("/", "_")
        self.path = folder / f"{name}.tsv"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, f"#worker\t{worker_id}\n".encode())

    def note(self, request_id: str, http_request_id: str | None, sent_wall_ns: int,
             bucket: str | None, endpoint: str | None, target_prompt_tokens: int | None,
             max_tokens: int | None, scheduled_wall_ns: int | None = None) -> None:
        values = (request_id, http_request_id, sent_wall_ns, bucket, endpoint,
                  target_prompt_tokens, max_tokens, scheduled_wall_ns)
        os.write(self._fd, ("\t".join("" if v is None else str(v) for v in values)
                            + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_journals(run_dir: str | os.PathLike[str],
                  since_ns: int | None = None) -> list[dict[str, Any]]:
    """Every journalled request of the run (sent at or after ``since_ns`` when given), with the
    ``worker_id`` that sent it. Files are read line by line: a soak's journals grow with the run,
    and only the entries asked for are kept."""
    entries: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / JOURNAL_DIR).glob("*.tsv")):
        worker_id = path.stem
        with path.open(errors="replace") as lines:
            for line in lines:
                line = line.rstrip("\n")
                if line.startswith("#worker\t"):
                    worker_id = line.split("\t", 1)[1]
                    continue
                parts = line.split("\t")
                if len(parts) != len(_FIELDS):
                    continue  # a line cut by a kill mid-write: that request was not sent
                if since_ns is not None and parts[2] and int(parts[2]) < since_ns:
                    continue
                entry: dict[str, Any] = {"worker_id": worker_id}
                for name, value in zip(_FIELDS, parts, strict=True):
                    entry[name] = value or None
                for name in ("sent_wall_ns", "target_prompt_tokens", "max_tokens",
                             "scheduled_wall_ns"):
                    if entry[name] is not None:
                        entry[name] = int(entry[name])
                entries.append(entry)
    return entries


# A record's sent time can trail its journal line's a little; records this much older than
# ``since_ns`` are still compared.
RECORD_TIME_MARGIN_NS = 60 * 10**9


def _recorded_ids(run_dir: Path, since_ns: int | None = None) -> set[str]:
    import pyarrow.dataset as ds  # noqa: PLC0415 - it imports pandas (collectors.run_folder)

    files = visible_part_files(run_dir / REQUESTS_TABLE)
    if not files:
        return set()
    dataset = ds.dataset([str(p) for p in files], format="parquet", schema=REQUEST_SCHEMA)
    where = (None if since_ns is None
             else ds.field("sent_wall_ns") >= since_ns - RECORD_TIME_MARGIN_NS)
    table = dataset.to_table(columns=["request_id"], filter=where)
    return set(table.column("request_id").to_pylist())


def reconcile(run_dir: str | os.PathLike[str], run_id: str, deaths: dict[str, dict[str, Any]],
              pid_of: dict[str, int], since_ns: int | None = None,
              why_lost: str | None = None) -> dict[str, Any]:
    """Write a record for every journalled request without one; returns what it did.

    ``deaths``: process name -> ``{"exit": ..., "wall_ns": ...}`` of the run's processes that
    died (``infra.procs.ProcessGroup.deaths``); ``pid_of``: process name -> pid, to tell which
    journal belongs to a dead worker. ``since_ns``: only requests sent from then on are looked
    at (a soak: memory bounded by that stretch, not by the run); ``why_lost``: the error text of
    record_lost records when no death explains them (a resumed soak: the whole run crashed).
    """
    run_dir = Path(run_dir)
    entries = read_journals(run_dir, since_ns)
    if not entries:
        return {"journalled": 0, "reconciled": 0}
    recorded = _recorded_ids(run_dir, since_ns)
    missing = [e for e in entries if e["request_id"] not in recorded]
    dead_pids = {pid_of[name]: (name, info) for name, info in deaths.items() if name in pid_of}
    master = deaths.get("master")
    rows = []
    by_reason: dict[str, int] = {}
    for entry in missing:
        pid = int(entry["worker_id"].split(":")[1]) if entry["worker_id"].count(":") >= 2 else -1
        died = dead_pids.get(pid)
        if died is not None:
            name, info = died
            outcome = OUTCOME_WORKER_LOST
            why = (f"its worker {name} (pid {pid}) died ({info['exit']}) before the record "
                   "reached the master (a request it was sending may not have reached the "
                   "server)")
        elif master is not None:
            info = master
            outcome = OUTCOME_RECORD_LOST
            why = f"sent; the master died ({master['exit']}) before storing its record"
        else:
            info = None
            outcome = OUTCOME_RECORD_LOST
            why = why_lost or ("sent; its record never reached the master (the run ended "
                               "before it did)")
        ended_ns = int(info["wall_ns"]) if info else None
        sent = entry["sent_wall_ns"]
        rows.append({
            "run_id": run_id, "worker_id": entry["worker_id"], "request_id": entry["request_id"],
            "bucket": entry["bucket"], "endpoint": entry["endpoint"], "outcome": outcome,
            "error": why, "sent_wall_ns": sent, "scheduled_wall_ns": entry["scheduled_wall_ns"],
            "e2e_s": (ended_ns - sent) / 1e9 if ended_ns and sent and ended_ns > sent else None,
            "target_prompt_tokens": entry["target_prompt_tokens"],
            "max_tokens": entry["max_tokens"], "http_request_id": entry["http_request_id"],
            "streamed": True, "content_events": 0, "itl_count": 0, "tokens_estimated": True,
        })
        by_reason[outcome] = by_reason.get(outcome, 0) + 1
    if rows:
        sink = RollingParquetWriter(run_dir / REQUESTS_TABLE, REQUEST_SCHEMA,
                                    prefix=f"reconciled-{socket.gethostname()}-{os.getpid()}",
                                    flush_interval_s=3600)
        sink.append_rows(rows)
        sink.close()
    return {"journalled": len(entries), "reconciled": len(rows), "by_outcome": by_reason}
