"""The study's search end to end on the simulator (real targets, masters, workers): on by default,
it lands close to what the SLO allows; a figure flat across its SLO is reported unresolved.

Known answers (``infra/tools/bench/study_search.py`` runs them with 5 seeds, both searches): the
batching simulator with a fixed 100 ms decode step and 8 output tokens holds each request for
0.8 s in one of ``max_num_seqs`` slots, so its capacity is C = max_num_seqs / 0.8 s; the fixed
timing simulator with ``--fixed-itl-per-seq-s`` keeps TTFT flat at any load while TPOT grows.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from collectors import run_folder

REPO_ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
QUEUE = ["--decode-base-s=0.1", "--decode-per-seq-s=0", "--prefill-base-s=0",
         "--prefill-per-token-s=0"]


def _run(study: dict, tmp_path: Path) -> tuple[Path, str]:
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study))
    results = tmp_path / "studies"
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "study", "run", str(study_file), "--results",
         str(results), "--progress", "off"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, text=True,
        capture_output=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (study_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return study_dir, done.stdout


def issue_study(method: str | None = None) -> dict:
    """The issue's case, closed loop: two simulator configurations of 16 and 20 slots, each
    request 8 tokens of a 100 ms step (0.8 s), no think time. Past the slots a request waits
    (N - c) x 0.8 s / c, so P95 TTFT = 0.1 + (N / c - 1) x 0.8 s reaches the 1 s SLO at
    N = 2.125 c: 34 and 42.5 users. The listed steps, 60-75% apart, read 28 and 34 (18% and
    20% under). ``method``: refine.method, None for no ``refine:`` key."""
    study = {
        "name": "issue",
        "configurations": [
            {"name": "seqs-16", "target": "sim", "args": ["--max-num-seqs=16", *QUEUE],
             "steps": [16, 28, 45]},
            {"name": "seqs-20", "target": "sim", "args": ["--max-num-seqs=20", *QUEUE],
             "steps": [20, 34, 54]}],
        "workload": {"mix": "100/0/0", "max_tokens": 8, "rows": 2000},
        "load": {"kind": "concurrency"},
        "step_duration_s": 8, "warmup_s": 1.5, "cooldown_s": 0.5, "workers": 1,
        "slo": {"ttft_ms": 1000, "tpot_ms": 150, "error_rate": 0.01, "percentile": "p95"},
        "stop_when": {"error_rate": 0.5, "latency_growth": 1000},
    }
    return study if method is None else {**study, "refine": {"method": method}}


ISSUE_LIMITS = {"seqs-16": 34.0, "seqs-20": 42.5}


@pytest.mark.alone  # lands within 12%: a busy CI run starved its worker at 54 users, and the
# search (rightly) took no limit from a load the generator failed
def test_a_study_without_refine_lands_close_to_what_the_slo_allows(tmp_path: Path) -> None:
    """No ``refine:``: the search is on and measures beside where the fitted P95 TTFT crosses
    the SLO. The first configuration's max sustainable load lands within 12% of the limit the
    mean wait gives (P95 TTFT crosses earlier, the users queueing in waves: between 32 and 33
    users, and 41 and 42, as the bisection measured them on a 2-core machine), at least 8%
    over the listed steps' (28), with the next load up failing within 10% of it; the second's
    search stops once the verdict against the first is decided (its interval holds its limit),
    or lands as close."""
    study_dir, stdout = _run(issue_study(), tmp_path)
    print(stdout[-4000:])
    capacity = pd.read_parquet(study_dir / "rollup" / "capacity.parquet").set_index("config")
    decided = "seqs-20: search stopped, the verdict is decided: seqs-20 sustains" in stdout
    for config, limit in ISSUE_LIMITS.items():
        row = capacity.loc[config]
        best = row["max_sustainable_load"]
        assert row["resolved"] and row["refined"] >= 1 and row["binding_slo"] == "TTFT", (
            row.to_dict())
        assert best >= 1.08 * {"seqs-16": 28, "seqs-20": 34}[config], (config, row.to_dict())
        assert row["max_load_lo"] <= best <= row["max_load_hi"]
        if config == "seqs-16" or not decided:
            assert abs(best - limit) / limit <= 0.12, (config, row.to_dict())
        else:
            assert row["max_load_lo"] <= limit <= row["max_load_hi"], row.to_dict()
    points = pd.read_parquet(study_dir / "rollup" / "points.parquet")
    seqs16 = points[(points["config"] == "seqs-16") & (points["bucket"] == "all")]
    first = capacity.loc["seqs-16", "max_sustainable_load"]
    failing = seqs16[~seqs16["sustainable"].astype(bool) & (seqs16["offered_load"] > first)]
    assert failing["offered_load"].min() <= 1.1 * first
    record = json.loads((study_dir / run_folder.STUDY_FILE).read_text())
    assert record["refine"]["method"] == "curve"
    assert "crosses its SLO" in stdout and "seqs-20 sustains" in stdout


def test_a_flat_figure_is_reported_unresolved_and_the_binding_slo_named(tmp_path: Path) -> None:
    """P95 TTFT flat at 491 ms at any load (fixed timing, log-normal spread) against a 491 ms
    SLO; TPOT = 5 ms + 1 ms per user against 45 ms (40 users). No capacity is made up, the TPOT
    SLO is named, and the search asks for no load."""
    study = {
        "name": "flat",
        "configurations": [{"name": "flat", "target": "sim", "args": [
            "--fixed-ttft-s=0.3", "--fixed-ttft-jitter=0.3", "--fixed-itl-s=0.005",
            "--fixed-itl-per-seq-s=0.001"], "steps": [10, 20, 60]}],
        "workload": {"mix": "100/0/0", "max_tokens": 16, "rows": 2000},
        "load": {"kind": "concurrency"},
        "step_duration_s": 8, "warmup_s": 1.5, "cooldown_s": 0.5, "workers": 1,
        "slo": {"ttft_ms": 491, "tpot_ms": 45, "error_rate": 0.01, "percentile": "p95"},
        "stop_when": {"error_rate": 0.5, "latency_growth": 1000},
    }
    study_dir, stdout = _run(study, tmp_path)
    print(stdout[-4000:])
    row = pd.read_parquet(study_dir / "rollup" / "capacity.parquet").iloc[0]
    assert not row["resolved"] and math.isnan(row["max_sustainable_load"]), row.to_dict()
    assert row["binding_slo"] == "TPOT"
    assert row["resolution_note"].startswith("P95 TTFT stays within")
    assert "the TTFT SLO does not bound this configuration at this precision" in stdout
    assert "the TPOT SLO alone allows" in stdout and "not resolved" in stdout
    assert row["refined"] == 0 and "not resolvable" in stdout
