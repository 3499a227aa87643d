"""Buckets and sampling: the Azure conversation trace (natively ~2/38/60) drawn to 45/40/15,
seeded; and the ``swarmload workload build`` command end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from trace_data import AZURE_CONV

from workloads.build import BuildConfig, allocate, build_workload
from workloads.cli import main as build_main
from workloads.errors import SamplingError
from workloads.schema import WORKLOAD_SCHEMA, read_workload

TARGET = {"short": 0.45, "medium": 0.40, "long": 0.15}


def test_allocate_sums_exactly() -> None:
    assert allocate(5000, TARGET) == {"short": 2250, "medium": 2000, "long": 750}
    assert sum(allocate(7, TARGET).values()) == 7


def test_azure_conv_to_45_40_15() -> None:
    built = build_workload(BuildConfig("azure", str(AZURE_CONV), n=5000, shares=TARGET, seed=0))
    frame, report = built.frame, built.report
    native = {b: report["per_bucket"][b]["native_share"] for b in TARGET}
    assert native["short"] < 0.03 and native["long"] > 0.55      # the log is ~2/38/60
    achieved = frame["bucket"].value_counts(normalize=True)
    for bucket, share in TARGET.items():
        assert abs(achieved[bucket] - share) <= 0.01
        row = report["per_bucket"][bucket]
        # distinct rows behind each bucket: what the log really has, never more
        assert row["distinct_log_rows"] == frame.loc[frame.bucket == bucket,
                                                     "source_line"].nunique()
        assert row["distinct_log_rows"] <= row["log_rows"]
    assert report["per_bucket"]["short"]["distinct_log_rows"] == 302   # all short rows, reused
    assert report["per_bucket"]["long"]["distinct_log_rows"] == 750    # no reuse needed
    # each bucket keeps its own length distribution: medians close to the log's
    for bucket in TARGET:
        lengths = report["per_bucket"][bucket]["prompt_tokens"]
        assert lengths["workload"]["p50"] == pytest.approx(lengths["log"]["p50"], rel=0.05)
    # arrivals: the log's own timeline, in order
    assert frame.trace_offset_s.is_monotonic_increasing
    assert report["arrivals"]["log"]["rate_rps"] == pytest.approx(5.53, abs=0.01)
    assert 0.8 < report["arrivals"]["workload"]["interarrival_cv"] < 1.4


def test_seeded_and_reproducible() -> None:
    def build(seed: int) -> pd.DataFrame:
        return build_workload(BuildConfig("azure", str(AZURE_CONV), n=500, seed=seed)).frame
    a, b, c = build(1), build(1), build(2)
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a.source_line, c.source_line)


def test_empty_bucket_with_a_share_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,100,1\n")
    with pytest.raises(SamplingError, match="bucket 'short' has no rows"):
        build_workload(BuildConfig("azure", str(path), n=10))


def test_native_mix_keeps_log_order(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    rows = [f"2023-11-16 18:00:{s:02d},{p},3" for s, p in ((0, 10), (1, 100), (3, 1000))]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    frame = build_workload(BuildConfig("azure", str(path), n=5, shares=None)).frame
    assert frame.prompt_tokens.tolist() == [10, 100, 1000, 10, 100]
    # looped after the end: one mean gap (1.5 s) after the last request
    assert frame.trace_offset_s.tolist() == [0.0, 1.0, 3.0, 4.5, 5.5]


def test_cli_build_with_text_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ShareGPT log with identifiers: the stored workload holds scrubbed text only."""
    data = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"question {i} from bob{i}@corp.example " + "w " * (i * 9)},
        {"from": "gpt", "value": "answer " * (i + 1)}]} for i in range(1, 60)]
    src = tmp_path / "share.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "wl"
    rc = build_main(["--source", f"sharegpt:{src}", "--n", "40", "--mix", "30/40/30",
                     "--thresholds", "64,256", "--out", str(out), "--tokenizer", "words",
                     "--arrivals", "poisson:rate_rps=3"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "scrub    59 of 59 texts changed {'email': 59}" in printed
    frame = read_workload(out)
    assert list(frame.columns) == WORKLOAD_SCHEMA.names
    assert not frame.prompt.str.contains("@corp").any() and frame.prompt.str.contains(
        "<EMAIL>").all()
    assert (frame.prompt_source == "log").all() and frame.trace_offset_s.isna().all()
    assert frame.session_id.str.startswith("s-").all()
    report = json.loads((out / "report.json").read_text())
    assert report["scrub"]["replaced"] == {"email": 59}
    assert report["arrivals"]["log"] is None
    assert (out / "arrivals.yaml").read_text().startswith("kind: poisson")
    raw = (out / "workload.parquet").read_bytes()
    assert b"corp.example" not in raw


def test_cli_bad_input_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "a.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,0,1\n"
                   "2023-11-16 18:00:01,10,1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "workload", "build", "--source", f"azure:{bad}",
         "--strict", "--n", "3", "--mix", "100/0/0", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "1 bad row(s)" in proc.stderr and "line 2: prompt tokens <= 0" in proc.stderr


def test_max_model_len_leaves_rows_out_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    rows = [f"2023-11-16 18:00:{s:02d},{p},50" for s, p in ((0, 10), (1, 100), (3, 3000))]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    built = build_workload(BuildConfig("azure", str(path), n=4, shares=None, max_model_len=2048))
    assert built.frame.prompt_tokens.tolist() == [10, 100, 10, 100]
    assert built.report["source"]["rows_over_max_model_len"] == 1
