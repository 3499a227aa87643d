"""dashboards.analysis.runs against a synthetic run folder whose figures are computed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collectors import run_folder
from collectors.parquet_sink import RollingParquetWriter
from collectors.schemas import GPU_SCHEMA, REQUEST_SCHEMA
from dashboards.analysis import runs as analysis

RUN_ID = "run-synthetic"
T0_NS = 1_700_000_000 * 1_000_000_000
FAILED_LATENCY_S = 100.0  # far above every ok latency: any leak into a percentile shows


def _ok_record(rng: np.random.Generator, i: int, bucket: str | None, sent_ns: int) -> dict:
    scale = {"short": 1.0, "medium": 2.0, "long": 4.0, None: 3.0}[bucket]
    output_tokens = int(rng.integers(2, 40))
    ttft = float(rng.gamma(2.0, 0.05 * scale))
    itl = (rng.gamma(2.0, 0.01 * scale, size=output_tokens - 1)).astype(np.float32)
    e2e = ttft + float(itl.astype(np.float64).sum()) + 0.001
    return {
        "run_id": RUN_ID,
        "worker_id": f"host:1:{i % 3}",
        "request_id": f"r{i}",
        "bucket": bucket,
        "endpoint": "completions",
        "outcome": "ok",
        "http_status": 200,
        "scheduled_wall_ns": sent_ns - 1_000_000,
        "sent_wall_ns": sent_ns,
        "schedule_lag_s": 0.001,
        "ttft_s": ttft,
        "queued_ttft_s": ttft + 0.001,
        "e2e_s": e2e,
        "tpot_s": (e2e - ttft) / (output_tokens - 1),
        "itl_count": len(itl),
        "itl_sum_s": float(itl.sum()),
        "itl_s": itl.tolist(),
        "prompt_tokens": int(rng.integers(10, 500)),
        "output_tokens": output_tokens,
        "tokens_estimated": False,
        "max_tokens": 64,
        "content_events": output_tokens,
    }


def _failed_record(i: int, bucket: str, outcome: str, sent_ns: int) -> dict:
    has_response = outcome != "connect_error"
    return {
        "run_id": RUN_ID,
        "worker_id": "host:1:0",
        "request_id": f"f{i}",
        "bucket": bucket,
        "endpoint": "completions",
        "outcome": outcome,
        "http_status": 500 if outcome == "http_5xx" else None,
        "error": f"synthetic {outcome}",
        "sent_wall_ns": sent_ns,
        # huge latencies and gaps: they must stay out of every percentile
        "ttft_s": FAILED_LATENCY_S if has_response else None,
        "e2e_s": FAILED_LATENCY_S + 1 if has_response else None,
        "tpot_s": FAILED_LATENCY_S if has_response else None,
        "itl_s": [FAILED_LATENCY_S] * 5 if has_response else None,
        "prompt_tokens": 10_000,
        "output_tokens": 10_000 if has_response else None,
    }


def make_records(seed: int = 7) -> list[dict]:
    """~300 ok requests in three buckets (plus a few unbucketed) and 12 failures, 10 ms apart."""
    rng = np.random.default_rng(seed)
    plan = ["short"] * 150 + ["medium"] * 90 + ["long"] * 50 + [None] * 5
    rng.shuffle(plan)
    records = [_ok_record(rng, i, b, T0_NS + i * 10_000_000) for i, b in enumerate(plan)]
    failures = [
        ("short", "http_5xx"),
        ("short", "http_5xx"),
        ("short", "timeout_mid_stream"),
        ("medium", "http_5xx"),
        ("medium", "connect_error"),
        ("long", "timeout_mid_stream"),
        ("long", "timeout_mid_stream"),
        ("long", "http_5xx"),
        ("long", "connect_error"),
        ("short", "connect_error"),
        ("medium", "timeout_mid_stream"),
        ("long", "http_5xx"),
    ]
    for j, (bucket, outcome) in enumerate(failures):
        records.append(_failed_record(j, bucket, outcome, T0_NS + (j * 25 + 3) * 10_000_000))
    return records


def write_run(
    results: Path, records: list[dict], run_id: str = RUN_ID, started_at: str | None = None
) -> Path:
    """A run folder as the product writes it: manifest + several closed request part files."""
    run_dir = results / run_id
    writer = RollingParquetWriter(
        run_dir / "requests", REQUEST_SCHEMA, prefix="master", max_buffered_rows=100
    )
    for start in range(0, len(records), 40):
        writer.append_rows(records[start : start + 40])
    writer.close()
    manifest = {
        "run_id": run_id,
        "started_at": started_at or "2023-11-14T22:13:20Z",
        "ended_at": "2023-11-14T22:13:25Z",
        "command": "swarmload run ...",
        "target": {"kind": "sim", "base_url": "http://127.0.0.1:8000", "model": "tiny"},
        "workload": {"kind": "synthetic", "mix": {"short": 0.5, "medium": 0.3, "long": 0.2}},
        "load": {"workers": 2, "users": 16, "spawn_rate": 8, "duration_s": 5},
        "versions": {"python": "3.11", "swarmload": "0.1.0"},
        "hosts": [{"host": "localhost", "role": "master"}],
        "gpu": {"available": False, "reason": "no NVIDIA driver", "gpus": []},
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


@pytest.fixture
def records() -> list[dict]:
    return make_records()


@pytest.fixture
def run_dir(tmp_path: Path, records: list[dict]) -> Path:
    return write_run(tmp_path / "results", records)


def _expected_percentiles(values: list[float]) -> list[float]:
    return list(np.percentile(np.asarray(values, dtype=np.float64), [50, 90, 95, 99, 99.9]))


def _ok(records: list[dict], bucket: str) -> list[dict]:
    return [r for r in records if r["outcome"] == "ok" and bucket in ("all", r["bucket"])]


def test_run_is_written_as_several_part_files(run_dir: Path) -> None:
    parts = sorted((run_dir / "requests").glob("*.parquet"))
    assert len(parts) >= 3
    assert len(run_folder.load_requests(run_dir)) == 307


@pytest.mark.parametrize("bucket", ["short", "medium", "long", "all"])
@pytest.mark.parametrize("metric", ["ttft", "tpot", "e2e"])
def test_percentiles_are_exact_over_ok_requests(
    run_dir: Path, records: list[dict], bucket: str, metric: str
) -> None:
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir))
    expected = _expected_percentiles([r[f"{metric}_s"] for r in _ok(records, bucket)])
    got = [summary.loc[bucket, f"{metric}_{p}_s"] for p in analysis.PERCENTILES]
    assert got == pytest.approx(expected, rel=1e-12)
    # the failed requests' 100 s would dominate P99.9 of every bucket had they leaked in
    assert summary.loc[bucket, f"{metric}_p999_s"] < FAILED_LATENCY_S / 10


@pytest.mark.parametrize("bucket", ["short", "long", "all"])
def test_itl_percentiles_use_every_gap_of_ok_requests(
    run_dir: Path, records: list[dict], bucket: str
) -> None:
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir))
    # the file stores gaps as float32; the expectation reads them back the same way
    gaps = [float(np.float32(g)) for r in _ok(records, bucket) for g in r["itl_s"]]
    assert len(gaps) > len(_ok(records, bucket))  # really per gap, not per request
    got = [summary.loc[bucket, f"itl_{p}_s"] for p in analysis.PERCENTILES]
    assert got == pytest.approx(_expected_percentiles(gaps), rel=1e-12)


def test_rows_are_buckets_in_order_then_all(run_dir: Path) -> None:
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir))
    assert list(summary.index) == ["short", "medium", "long", "all"]
    counts = summary["requests"].to_dict()
    assert counts == {"short": 154, "medium": 93, "long": 55, "all": 307}  # all has 5 unbucketed
    only_long_short = run_folder.load_requests(run_dir).query("bucket in ['long', 'short']")
    assert list(analysis.summarize_requests(only_long_short).index) == ["short", "long", "all"]


def test_error_rates_per_class(run_dir: Path) -> None:
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir))
    err_columns = [c for c in summary.columns if c.startswith("err_")]
    # one column per class present, in the schema's order of classes
    assert err_columns == ["err_connect_error", "err_timeout_mid_stream", "err_http_5xx"]
    long = summary.loc["long"]
    assert (long["ok"], long["errors"]) == (50, 5)
    assert long["error_rate"] == pytest.approx(5 / 55)
    assert long["err_timeout_mid_stream"] == pytest.approx(2 / 55)
    assert long["err_http_5xx"] == pytest.approx(2 / 55)
    assert long["err_connect_error"] == pytest.approx(1 / 55)
    everything = summary.loc["all"]
    assert everything["error_rate"] == pytest.approx(12 / 307)
    assert everything["err_http_5xx"] == pytest.approx(5 / 307)
    assert summary.loc["medium", "err_http_5xx"] == pytest.approx(1 / 93)


def test_default_window_runs_from_first_send_to_last_completion(
    run_dir: Path, records: list[dict]
) -> None:
    df = run_folder.load_requests(run_dir)
    summary = analysis.summarize_requests(df)
    first = min(r["sent_wall_ns"] for r in records)
    last = max(r["sent_wall_ns"] + (r["e2e_s"] or 0.0) * 1e9 for r in records)
    window_s = (last - first) / 1e9
    assert summary.loc["all", "window_s"] == pytest.approx(window_s, abs=1e-6)
    ok = _ok(records, "all")
    assert summary.loc["all", "req_per_s"] == pytest.approx(len(ok) / window_s, rel=1e-6)
    tokens = sum(r["output_tokens"] for r in ok)
    assert summary.loc["all", "output_tok_per_s"] == pytest.approx(tokens / window_s, rel=1e-6)
    short_ok = _ok(records, "short")
    assert summary.loc["short", "req_per_s"] == pytest.approx(len(short_ok) / window_s, rel=1e-6)
    # failed requests' 10,000 tokens stay out of the means
    mean_prompt = np.mean([r["prompt_tokens"] for r in ok])
    assert summary.loc["all", "mean_prompt_tokens"] == pytest.approx(mean_prompt)


def test_explicit_window_keeps_requests_sent_inside_it(run_dir: Path, records: list[dict]) -> None:
    start, end = T0_NS + 1_000_000_000, T0_NS + 2_000_000_000  # sends 100..199 and failures
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir), window=(start, end))
    inside = [r for r in records if start <= r["sent_wall_ns"] < end]
    inside_ok = [r for r in inside if r["outcome"] == "ok"]
    assert summary.loc["all", "requests"] == len(inside) == 104
    assert summary.loc["all", "window_s"] == pytest.approx(1.0)
    assert summary.loc["all", "req_per_s"] == pytest.approx(len(inside_ok))
    expected = _expected_percentiles([r["ttft_s"] for r in inside_ok])
    got = [summary.loc["all", f"ttft_{p}_s"] for p in analysis.PERCENTILES]
    assert got == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="after its start"):
        analysis.summarize_requests(run_folder.load_requests(run_dir), window=(end, start))


def test_empty_run_gives_one_all_row_and_schema_columns(tmp_path: Path) -> None:
    df = run_folder.load_requests(tmp_path)
    assert list(df.columns) == REQUEST_SCHEMA.names and df.empty
    summary = analysis.summarize_requests(df)
    assert list(summary.index) == ["all"]
    assert summary.loc["all", "requests"] == 0
    assert np.isnan(summary.loc["all", "ttft_p95_s"])
    assert analysis.format_summary(summary) == "no requests recorded"


def test_load_requests_reads_a_run_being_written(run_dir: Path) -> None:
    # a part file the writer has not renamed into place yet is skipped, not half-read
    (run_dir / "requests" / ".master-999999.parquet.tmp").write_bytes(b"PAR1 half written")
    df = run_folder.load_requests(run_dir, columns=["request_id", "ttft_s"])
    assert list(df.columns) == ["request_id", "ttft_s"]
    assert len(df) == 307
    with pytest.raises(ValueError, match="unknown column"):
        run_folder.load_requests(run_dir, columns=["no_such_column"])


def test_list_runs_skips_folders_without_manifest(tmp_path: Path, records: list[dict]) -> None:
    results = tmp_path / "results"
    write_run(results, records[:20], run_id="older", started_at="2024-01-01T00:00:00Z")
    write_run(results, records, run_id="newer", started_at="2024-02-01T00:00:00Z")
    (results / "half-made" / "requests").mkdir(parents=True)
    runs = run_folder.list_runs(results)
    assert list(runs["run_id"]) == ["newer", "older"]
    newer = runs.iloc[0]
    assert (newer["target_kind"], newer["model"], newer["users"], newer["workers"]) == (
        "sim",
        "tiny",
        16,
        2,
    )
    assert list(runs["requests"]) == [307, 20]
    assert run_folder.list_runs(tmp_path / "missing").empty


def test_format_summary_shows_the_figures(run_dir: Path) -> None:
    summary = analysis.summarize_requests(run_folder.load_requests(run_dir))
    text = analysis.format_summary(summary)
    for bucket in ("short", "medium", "long", "all"):
        assert bucket in text
    all_row = summary.loc["all"]
    assert f"{all_row['ttft_p95_s'] * 1e3:.2f}" in text
    assert f"{all_row['itl_p99_s'] * 1e3:.2f}" in text
    assert f"{summary.loc['long', 'e2e_p50_s'] * 1e3:.2f}" in text
    assert f"{all_row['req_per_s']:.2f}" in text
    assert f"{12 / 307 * 100:.2f}%" in text
    assert "http_5xx" in text and "P99.9" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_summary_command_prints_and_writes_nothing(run_dir: Path) -> None:
    before = sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    swarmload = Path(sys.executable).with_name("swarmload")
    command = [str(swarmload)] if swarmload.exists() else [sys.executable, "-m", "infra.cli"]
    done = subprocess.run(
        [*command, "summary", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    expected = analysis.format_summary(analysis.summarize_run(run_dir))
    assert expected in done.stdout
    assert sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before
    missing = subprocess.run(
        [*command, "summary", str(run_dir / "nope")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "not a folder" in missing.stderr


def test_latency_over_time_uses_ok_requests_and_thins(run_dir: Path) -> None:
    df = run_folder.load_requests(run_dir)
    points = analysis.latency_over_time(df, origin_ns=T0_NS)
    assert len(points) == 295 and points["ttft_ms"].max() < FAILED_LATENCY_S * 1e3
    assert points["t_s"].iloc[0] == pytest.approx(0.0)
    thin = analysis.latency_over_time(df, origin_ns=T0_NS, max_points=50)
    assert len(thin) == 50 and thin["t_s"].is_monotonic_increasing


def test_gpu_timeseries_drops_unreadable_samples(tmp_path: Path) -> None:
    writer = RollingParquetWriter(tmp_path / "gpu", GPU_SCHEMA)
    rows = [
        {
            "run_id": RUN_ID,
            "host": "h",
            "wall_ns": T0_NS + k * 100_000_000,
            "gpu_index": k % 2,
            "util_gpu_pct": 10.0 * k,
            "mem_used_bytes": 2**30 * k,
            "power_w": 100.0 + k,
            "error": "NVML read failed" if k == 3 else None,
        }
        for k in range(6)
    ]
    writer.append_rows(rows)
    writer.close()
    series = analysis.gpu_timeseries(run_folder.load_gpu(tmp_path), origin_ns=T0_NS)
    assert len(series) == 5
    assert set(series["gpu"]) == {"h:0", "h:1"}
    assert list(series["mem_used_gib"]) == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_manifest_facts_and_origin(run_dir: Path) -> None:
    manifest = run_folder.load_manifest(run_dir)
    facts = analysis.manifest_facts(manifest)
    assert facts["Target"] == "sim" and facts["Users"] == "16"
    assert facts["GPU"] == "unavailable (no NVIDIA driver)"
    assert analysis.run_origin_ns(manifest) == T0_NS
    assert analysis.manifest_facts({})["Model"] == "-"


def test_resent_requests_are_counted_and_said_in_the_summary(records: list[dict]) -> None:
    """A request sent once more (its connection closed before one byte of an answer) may have
    been started by the server too: the summary counts them, and runs before the column say
    nothing."""
    frame = pd.DataFrame(records)
    for column in REQUEST_SCHEMA.names:
        if column not in frame:
            frame[column] = None
    assert "resent" not in analysis.format_summary(analysis.summarize_requests(frame))
    frame.loc[[3, 40], "resent"] = True
    summary = analysis.summarize_requests(frame)
    assert summary.loc["all", "resent"] == 2
    assert "resent 2: sent once more" in analysis.format_summary(summary)
    assert analysis.summarize_requests(frame.drop(columns="resent")).loc["all", "resent"] == 0


def test_a_run_folders_summary_counts_its_resent_requests(tmp_path: Path,
                                                           records: list[dict]) -> None:
    """``swarmload summary RUN`` reads the folder with only the columns it needs: ``resent`` is
    one of them, or every run's summary would say 0."""
    for i in (3, 40):
        records[i]["resent"] = True
    run_dir = write_run(tmp_path / "results", records)
    summary = analysis.summarize_run(run_dir)
    assert summary.loc["all", "resent"] == 2
    assert "resent 2: sent once more" in analysis.format_summary(summary)


def test_sse_events_mean_is_shown_where_the_run_has_the_column(records: list[dict]) -> None:
    """The mean SSE events per ok request join the throughput table; a run recorded before the
    column (or with it all null) shows no such column."""
    frame = pd.DataFrame(records)
    for column in REQUEST_SCHEMA.names:
        if column not in frame:
            frame[column] = None
    assert "mean SSE events" not in analysis.throughput_table(analysis.summarize_requests(frame))
    frame["sse_events"] = 7
    table = analysis.throughput_table(analysis.summarize_requests(frame))
    assert table.loc["all", "mean SSE events"] == 7
    old = analysis.summarize_requests(frame.drop(columns="sse_events"))
    assert "mean SSE events" not in analysis.throughput_table(old)


def test_generator_outcomes_are_not_server_errors_and_lag_warns() -> None:
    from dashboards.analysis.runs import generator_warnings, summarize_requests

    base = {"run_id": "r", "worker_id": "w", "bucket": "short", "endpoint": "completions",
            "sent_wall_ns": 1_000_000_000, "scheduled_wall_ns": 1_000_000_000,
            "e2e_s": 0.5, "ttft_s": 0.1, "tpot_s": 0.01, "itl_s": [0.01],
            "output_tokens": 8, "prompt_tokens": 4}
    rows = [{**base, "request_id": str(i), "outcome": "ok", "schedule_lag_s": 0.001}
            for i in range(98)]
    rows.append({**base, "request_id": "late", "outcome": "ok", "schedule_lag_s": 0.5})
    rows.append({**base, "request_id": "d", "outcome": "dropped", "ttft_s": None,
                 "e2e_s": None, "schedule_lag_s": None})
    frame = pd.DataFrame(rows)
    for column in REQUEST_SCHEMA.names:
        if column not in frame:
            frame[column] = None
    summary = summarize_requests(frame)
    assert summary.loc["all", "errors"] == 0
    assert summary.loc["all", "error_rate"] == 0
    assert summary.loc["all", "not_sent"] == 1
    warnings = generator_warnings(summary)
    assert any("FELL BEHIND" in w for w in warnings)
    assert any("DID NOT SEND 1" in w for w in warnings)
    assert generator_warnings(summarize_requests(frame.iloc[:98])) == []


def test_a_late_read_alone_bends_nothing_but_events_read_together_warn() -> None:
    from dashboards.analysis.runs import format_summary, generator_warnings, summarize_requests

    base = {"run_id": "r", "worker_id": "w", "bucket": "short", "endpoint": "completions",
            "sent_wall_ns": 1_000_000_000, "e2e_s": 0.5, "ttft_s": 0.1, "tpot_s": 0.01,
            "itl_s": [0.01, 0.012, 0.01], "output_tokens": 4, "prompt_tokens": 4,
            "outcome": "ok"}
    quick = [{**base, "request_id": str(i), "read_delay_s": 0.0005} for i in range(95)]
    # read 40 ms late, each event alone: the kernel's stamps hold, the figures are the server's
    late = [{**base, "request_id": f"s{i}", "read_delay_s": 0.040} for i in range(5)]
    frame = pd.DataFrame(quick + late)
    for column in REQUEST_SCHEMA.names:
        if column not in frame:
            frame[column] = None
    summary = summarize_requests(frame)
    assert summary.loc["all", "read_delay_p99_s"] == pytest.approx(0.040)
    assert "generator read delay P99 40.00 ms" in format_summary(summary)
    assert generator_warnings(summary) == []
    # the first token read with the next two (two gaps of 0): TTFT may be two gaps late
    merged = frame.copy()
    merged["itl_s"] = [[0.0, 0.0, 0.011, 0.013] if i >= 95 else v
                       for i, v in enumerate(merged["itl_s"])]
    summary = summarize_requests(merged)
    assert summary.loc["all", "ttft_bound_max_s"] == pytest.approx(0.024)
    assert summary.loc["all", "merged_first_share"] == pytest.approx(0.05)
    (warning,) = generator_warnings(summary, remedy="Do X.")
    assert warning.startswith("GENERATOR READ EVENTS TOGETHER (each takes the later one's "
                              "time): the first token of 5.0% of requests was read with later")
    assert "late by up to 24.0 ms at P99" in warning and warning.endswith("Do X.")
    assert "3.3% of ITL gaps were read together" in warning
