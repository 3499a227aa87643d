"""A per-request column is declared once (collectors/request_columns.py): the Parquet schema,
the schema docs, METRICS.md's table, the summary's lists and the Run page's tiles come from it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from collectors import request_columns, schema_docs, schemas
from collectors.request_columns import OPTIONAL, REQUEST_COLUMNS, Latency, RequestColumn

METRICS_MD = Path(__file__).resolve().parents[1] / "docs" / "METRICS.md"


def test_the_schema_and_its_docs_are_the_declarations() -> None:
    assert schemas.REQUEST_SCHEMA.names == [c.name for c in REQUEST_COLUMNS]
    for column in REQUEST_COLUMNS:
        field = schemas.REQUEST_SCHEMA.field(column.name)
        assert (field.type, field.nullable) == (column.type, column.nullable)
    _, _, lines = schema_docs.TABLES[schemas.REQUESTS_TABLE]
    assert lines == {c.name: c.meaning for c in REQUEST_COLUMNS}


def test_metrics_md_holds_the_generated_table() -> None:
    table = request_columns.metrics_table()
    assert table in METRICS_MD.read_text(), (
        "docs/METRICS.md's per-request table differs from the declarations; paste in the "
        "output of: python -c 'from collectors.request_columns import metrics_table as t; "
        "print(t())'")
    named = {name.strip("` ") for row in table.splitlines()[2:]
             for name in row.split(" | ")[1].split(",")}
    assert {"ttft_s", "itl_s", "resent", "session_id"} <= named


@pytest.fixture
def runs_with_extra_column(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """dashboards.analysis.runs re-derived with one more declared column: a latency shown
    in every summary with a headline tile, counted and averaged (a stand-in for a new figure)."""
    from dashboards.analysis import runs

    extra = RequestColumn("probe_s", pa.float64(), "a probe", summary=OPTIONAL,
                          latency=Latency("probe", "Probe", 9, ("p99",)),
                          mean="mean probe")
    flag = RequestColumn("probed", pa.bool_(), "probed", summary=OPTIONAL, count="were probed")
    monkeypatch.setattr(request_columns, "REQUEST_COLUMNS", (*REQUEST_COLUMNS, extra, flag))
    monkeypatch.setattr(request_columns, "BY_NAME", {**request_columns.BY_NAME,
                                                     "probe_s": extra, "probed": flag})
    yield importlib.reload(runs)
    monkeypatch.undo()
    importlib.reload(runs)


def test_the_summary_lists_and_tiles_come_from_the_declarations(
        runs_with_extra_column: ModuleType) -> None:
    runs = runs_with_extra_column
    assert list(runs.LATENCY_METRICS) == ["ttft", "itl", "tpot", "e2e", "probe"]
    assert runs.EXTRA_LATENCY_METRICS == {"queued_ttft": "queued_ttft_s",
                                          "answer_ttft": "answer_ttft_s"}
    assert runs.SUMMARY_OPTIONAL_COLUMNS[-2:] == ("probe_s", "probed")
    assert runs.LATENCY_TITLES["probe"] == "Probe"
    assert runs.HEADLINE_METRICS[-1] == ("P99 Probe (ms)", "probe_p99_s")
    assert runs.COUNTED_COLUMNS["probed"] == "were probed"
    assert runs.MEAN_COLUMNS["probe_s"] == "mean probe"
    assert runs.RUN_PAGE_COLUMNS[-1] == "probe_s"  # the Run page loads what its tables show


def test_the_declared_lists_as_they_were_written_by_hand() -> None:
    """The lists derived from the declarations are the ones runs.py and run_page.py held."""
    from dashboards.analysis import runs

    assert runs.LATENCY_METRICS == {"ttft": "ttft_s", "itl": "itl_s", "tpot": "tpot_s",
                                    "e2e": "e2e_s"}
    assert set(runs.SUMMARY_COLUMNS) == {
        "bucket", "outcome", "sent_wall_ns", "scheduled_wall_ns", "schedule_lag_s", "ttft_s",
        "itl_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens"}
    assert set(runs.SUMMARY_OPTIONAL_COLUMNS) >= {
        "queued_ttft_s", "answer_ttft_s", "reasoning_events", "streamed", "resent",
        "read_delay_s"}
    assert runs.HEADLINE_METRICS == (
        ("P50 TTFT (ms)", "ttft_p50_s"), ("P95 TTFT (ms)", "ttft_p95_s"),
        ("P99 TTFT (ms)", "ttft_p99_s"), ("P95 ITL (ms)", "itl_p95_s"),
        ("P95 TPOT (ms)", "tpot_p95_s"), ("P95 E2E (ms)", "e2e_p95_s"))
