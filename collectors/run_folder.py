"""The run folder and the study folder as files: their names, the manifest, the table loaders.

Everything that reads a run folder (``results/<run_id>/``: ``manifest.json``, one folder of
Parquet part files per table of :mod:`collectors.schemas`) or a study folder (``study.json``,
``rollup/``) goes through here; :mod:`dashboards.analysis` computes over what these return.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from collectors.atomic import write_json_atomic
from collectors.parquet_sink import visible_part_files
from collectors.schemas import (
    GPU_SCHEMA,
    GPU_TABLE,
    HOST_SCHEMA,
    HOST_TABLE,
    REQUEST_SCHEMA,
    REQUESTS_TABLE,
    SERVER_METRICS_SCHEMA,
    SERVER_METRICS_TABLE,
)
from collectors.server_figures import samples_of

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.dataset as ds

# pandas and pyarrow.dataset are imported where a table is read: a Locust process imports this
# module for the manifest and reads no table, and the two cost it 0.4 s of CPU at every start
# (hundreds of processes in a study or in the suite).

MANIFEST_NAME = "manifest.json"
STUDY_FILE = "study.json"
ROLLUP_DIR = "rollup"
STEPS_FILE = "steps.parquet"
CAPACITY_FILE = "capacity.parquet"
POINTS_FILE = "points.parquet"  # a study's figures per config x load over its repeats
VERDICT_FILE = "verdict.parquet"  # a study's verdict between its configurations
FRONTIER_FILE = "frontier.parquet"  # per-user speed against output tok/s per GPU, per config


# --------------------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: what makes a run folder self-describing.

    Written in parts as the run goes (its facts at the start, its end, a soak's segments, a
    study step's place) by one writer, :func:`update_manifest`, which refuses a key that is not
    a field here. Every field is optional: a field left ``None`` is not in the file, and older
    manifests lack the newer fields. A key this version does not know (written by another
    version) is kept in ``extra`` and written back as it was.
    """

    # the run and its status
    run_id: str | None = None
    status: str | None = None  # running / finished / interrupted / failed / crashed
    started_at: str | None = None  # ISO 8601 UTC, as utc_now_iso() writes it
    ended_at: str | None = None
    command: list[str] | None = None  # argv with header values redacted
    launcher: str | None = None  # "locust": a plain `locust -f` run wrote this manifest
    labels: dict[str, str] | None = None  # --label k=v, filtered on by the Compare page
    # what ran, against what
    target: dict[str, Any] | None = None  # kind, base_url, model, launch, replicas, ...
    endpoint: dict[str, Any] | None = None  # TLS, key source, header names, stream
    workload: dict[str, Any] | None = None
    prompt_salt: str | None = None
    load: dict[str, Any] | None = None  # kind, plan, workers, users, duration_s, ...
    collectors: dict[str, Any] | None = None
    live_metrics: dict[str, Any] | None = None
    versions: dict[str, str] | None = None
    hosts: list[dict[str, Any]] | None = None  # role, host, pid, clock_offset_s, ...
    gpu: dict[str, Any] | None = None
    # --pin-workers: {"workers": {"worker-0": [core]}, "rest": [cores]}, as read back
    cpu_cores: dict[str, Any] | None = None
    # how it ended
    exit_codes: dict[str, Any] | None = None
    crashes: list[dict[str, Any]] | None = None
    crash_warnings: list[str] | None = None
    recorder: dict[str, Any] | None = None
    clock: dict[str, Any] | None = None
    replay_events: Any = None
    balancer: Any = None
    faults: dict[str, Any] | None = None  # a fault plan's actions as acted out (infra.faults)
    warnings: list[str] | None = None
    validity: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None
    # a study step's place; a soak's segments, totals and drift
    study: dict[str, Any] | None = None
    soak: dict[str, Any] | None = None
    soak_totals: dict[str, Any] | None = None
    rss_after_warmup: dict[str, Any] | None = None
    drift: dict[str, Any] | None = None
    # a soak's trends projected to its planned end and limits (dashboards.analysis.early_warning)
    early_warning: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        known = set(cls.field_names())
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.field_names()}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    def updated(self, **changes: Any) -> Manifest:
        """This manifest with ``changes``; a key that is no field is a ``TypeError`` naming it."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise TypeError(f"manifest field(s) {unknown} unknown; add them to "
                            "collectors.run_folder.Manifest")
        return replace(self, **changes)


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """The run's manifest as written (``FileNotFoundError`` when it has none)."""
    return Manifest.from_dict(json.loads((Path(run_dir) / MANIFEST_NAME).read_text()))


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write the whole manifest atomically (a dashboard reading a live run never sees half)."""
    return write_json_atomic(Path(run_dir) / MANIFEST_NAME, manifest.to_dict())


def update_manifest(run_dir: str | os.PathLike[str], **changes: Any) -> Manifest:
    """The one writer: the manifest (an empty one when there is none yet) with ``changes``,
    written atomically; a change to ``None`` removes the key."""
    try:
        manifest = read_manifest(run_dir)
    except FileNotFoundError:
        manifest = Manifest()
    manifest = manifest.updated(**changes)
    write_manifest(run_dir, manifest)
    return manifest


# ------------------------------------------------------------------------------------- run folder


def load_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The run's manifest as a dict, for display (``{}`` when the file is absent); a run whose
    orchestrator is gone without writing the end shows as crashed."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        return {}
    return with_orchestrator_checked(read_manifest(run_dir).to_dict())


def with_orchestrator_checked(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest that still says ``running`` although the process that runs it is gone from
    this host (killed with -9: nobody was left to write the end) is shown as ``crashed``."""
    if manifest.get("status") != "running":
        return manifest
    orchestrator = next((h for h in manifest.get("hosts") or []
                         if h.get("role") == "orchestrator"), None)
    if not orchestrator or orchestrator.get("host") != socket.gethostname():
        return manifest
    pid = orchestrator.get("pid")
    try:
        os.kill(int(pid), 0)
        return manifest
    except ProcessLookupError:
        pass
    except (PermissionError, TypeError, ValueError):
        return manifest
    note = (f"CRASHED: the orchestrator (pid {pid}) is gone and never wrote the run's end; "
            "records stored before it died are kept")
    return {**manifest, "status": "crashed",
            "crashes": [{"process": "orchestrator", "pid": pid, "exit": "gone"}],
            "warnings": [note, *(manifest.get("warnings") or [])]}


def _table_dataset(run_dir: str | Path, table: str, schema: pa.Schema) -> ds.Dataset | None:
    # The writer renames finished parts into place and keeps its temporary files dot-prefixed;
    # visible_part_files also skips parts that a compacted file already holds (soaks), so a run
    # being written reads consistently. The explicit schema lets parts written before a column
    # was added still load (as nulls).
    import pyarrow.dataset as ds  # noqa: PLC0415 - it imports pandas (see above)

    files = visible_part_files(Path(run_dir) / table)
    if not files:
        return None
    return ds.dataset([str(p) for p in files], format="parquet", schema=schema)


def load_table(
    run_dir: str | Path, table: str, schema: pa.Schema, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """All closed part files of one table of a run, as a DataFrame with ``schema``'s columns.

    Returns an empty frame with those columns (and dtypes) when the table has no rows yet.
    """
    names = list(schema.names if columns is None else columns)
    unknown = [name for name in names if name not in schema.names]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown} for table {table!r}; valid: {schema.names}")
    dataset = _table_dataset(run_dir, table, schema)
    if dataset is None:
        return schema.empty_table().select(names).to_pandas()
    return dataset.to_table(columns=names).to_pandas()


def load_requests(run_dir: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Request records of a run (:data:`REQUEST_SCHEMA`); safe while the run is still writing."""
    return load_table(run_dir, REQUESTS_TABLE, REQUEST_SCHEMA, columns)


def load_gpu(run_dir: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """GPU telemetry samples of a run (:data:`GPU_SCHEMA`); empty when none were recorded."""
    return load_table(run_dir, GPU_TABLE, GPU_SCHEMA, columns)


def count_rows(run_dir: str | Path, table: str = REQUESTS_TABLE) -> int:
    """Row count of a table from Parquet footers only (cheap: no data pages are read)."""
    schema = REQUEST_SCHEMA if table == REQUESTS_TABLE else GPU_SCHEMA
    dataset = _table_dataset(run_dir, table, schema)
    return 0 if dataset is None else int(dataset.count_rows())


def run_fingerprint(run_dir: str | Path) -> tuple[int, int]:
    """(number of part files, newest mtime in ns) over the run's tables and manifest.

    Changes whenever a part file lands or the manifest is rewritten, so a cache keyed on it
    recomputes for a live run and never for a finished one.
    """
    run_dir = Path(run_dir)
    files = [p for table in run_dir.iterdir() if table.is_dir()
             for p in visible_part_files(table)]
    manifest = run_dir / MANIFEST_NAME
    if manifest.is_file():
        files.append(manifest)
    newest = max((p.stat().st_mtime_ns for p in files), default=0)
    return len(files), newest


def list_runs(results_dir: str | Path) -> pd.DataFrame:
    """One row per run folder that has a manifest, newest ``started_at`` first.

    Columns: run_id, started_at, ended_at, target_kind, model, users, workers, requests, path.
    ``run_id`` falls back to the folder name; folders without ``manifest.json`` are skipped.
    """
    columns = [
        "run_id",
        "started_at",
        "ended_at",
        "target_kind",
        "model",
        "users",
        "workers",
        "requests",
        "path",
    ]
    results_dir = Path(results_dir)
    rows: list[dict[str, Any]] = []
    if results_dir.is_dir():
        for run_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
            if not (run_dir / MANIFEST_NAME).is_file():
                continue
            try:
                manifest = load_manifest(run_dir)
            except (OSError, json.JSONDecodeError):
                continue  # a manifest being rewritten right now; it shows on the next refresh
            target = manifest.get("target") or {}
            load = manifest.get("load") or {}
            rows.append(
                {
                    "run_id": manifest.get("run_id") or run_dir.name,
                    "started_at": manifest.get("started_at"),
                    "ended_at": manifest.get("ended_at"),
                    "target_kind": target.get("kind"),
                    "model": target.get("model"),
                    "users": load.get("users"),
                    "workers": load.get("workers"),
                    "requests": count_rows(run_dir),
                    "path": str(run_dir),
                }
            )
    return newest_first(rows, columns, "run_id")


def newest_first(rows: list[dict[str, Any]], columns: list[str], id_column: str) -> pd.DataFrame:
    """``rows`` as a frame, newest ``started_at`` first (ties and unknown starts by ``id_column``,
    descending; unknown starts last): the order of every list of runs or studies."""
    import pandas as pd  # noqa: PLC0415 - see above

    frame = pd.DataFrame(rows, columns=columns)
    if frame.empty:
        return frame
    return frame.sort_values(
        ["started_at", id_column], ascending=False, na_position="last", kind="stable"
    ).reset_index(drop=True)


def load_server_metrics(run_dir: str | Path, samples: Iterable[str] | None = None) -> pd.DataFrame:
    """The long-format scrape table, each sample under the engine's own name; ``samples`` keeps
    only those (and error rows): sample names, or server figures (collectors.server_figures:
    every engine's names for them)."""
    df = load_table(run_dir, SERVER_METRICS_TABLE, SERVER_METRICS_SCHEMA)
    if samples is not None:
        df = df[df["sample"].isin(samples_of(samples)) | df["error"].notna()]
    return df.reset_index(drop=True)


def load_host(run_dir: str | Path) -> pd.DataFrame:
    return load_table(run_dir, HOST_TABLE, HOST_SCHEMA)


# ----------------------------------------------------------------------------------- study folder


def read_study(study_dir: str | Path) -> dict[str, Any]:
    """``study.json`` of a study folder as a dict."""
    path = Path(study_dir) / STUDY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{study_dir} has no {STUDY_FILE}: not a study folder")
    return json.loads(path.read_text(encoding="utf-8"))


def load_study_meta(study_dir: str | Path) -> dict[str, Any]:
    """``study.json`` as a dict; ``{}`` when absent or half-written."""
    path = Path(study_dir) / STUDY_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def study_dirs(results_dir: str | Path) -> list[Path]:
    """Folders holding a ``study.json``: the results folder itself, its children, grandchildren.

    Grandchildren cover ``results/studies/<name>``; deeper folders are step runs, not studies.
    """
    root = Path(results_dir)
    if not root.is_dir():
        return []
    found = [root] if (root / STUDY_FILE).is_file() else []
    found += sorted(p.parent for p in root.glob(f"*/{STUDY_FILE}"))
    found += sorted(p.parent for p in root.glob(f"*/*/{STUDY_FILE}"))
    return list(dict.fromkeys(found))
