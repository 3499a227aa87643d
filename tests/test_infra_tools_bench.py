"""`swarmload bench accuracy` end to end: a real master and worker replay stepped load against
the lean target, whose truth log (kernel arrival, each token's write) is joined to the records."""

from __future__ import annotations

import json
from pathlib import Path

from infra.tools.bench.steps import stepped_offsets
from infra.tools.bench.suite import ACCURACY_FRACTIONS


def test_accuracy_joins_every_request_to_the_targets_truth(run_swarmload, tmp_path: Path) -> None:
    ceiling_tok_s, tokens, step_s = 400.0, 8, 3.0
    result = run_swarmload("bench", "accuracy", "--ceiling-tok-s", str(ceiling_tok_s),
                           "--accuracy-tokens", str(tokens), "--step-s", str(step_s),
                           "--gap-s", "0.5", "--results", str(tmp_path), timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "event times: kernel receive" in result.stdout
    (bench_json,) = tmp_path.glob("bench-*/bench.json")
    rows = json.loads(bench_json.read_text())["accuracy"]["rows"]
    assert [row["fraction"] for row in rows] == list(ACCURACY_FRACTIONS)
    # every scheduled request came back ok and found its server-side truth
    rates = [max(f * ceiling_tok_s / tokens, 1.0) for f in ACCURACY_FRACTIONS]
    _, step_of_row = stepped_offsets(rates, step_s, 0.5, seed=1)
    for index, row in enumerate(rows):
        assert row["n"] == int((step_of_row == index).sum()), row
    # at a tenth of the ceiling the median client TTFT is the server's to well under a ms
    assert rows[0]["ttft_err_p50_s"] < 0.001, rows[0]
    assert rows[0]["read_delay_p99_s"] is not None


def test_scaling_takes_1_to_16_workers_and_reports_the_ratio_to_one() -> None:
    from infra.tools.bench.suite import BenchError, scaling_efficiency, worker_counts

    assert worker_counts("1,2,4,8,16") == [1, 2, 4, 8, 16]
    for bad in ("0,1", "1,1", "a", ""):
        try:
            worker_counts(bad)
        except BenchError:
            continue
        raise AssertionError(f"{bad!r} accepted")
    table = [{"workers": 1, "ceiling": {"output_tok_s": 1000.0}},
             {"workers": 16, "ceiling": {"output_tok_s": 14_400.0}},
             {"workers": 8, "ceiling": None}]
    scaling_efficiency(table)
    assert [row["ceiling_vs_one"] for row in table] == [1.0, 0.9, None]


def test_repeatability_names_the_studies_whose_intervals_are_apart() -> None:
    from infra.tools.bench.study_repeatability import repeatability_lines

    def row(study: str, lo: float, hi: float) -> dict[str, object]:
        value = (lo + hi) / 2
        return {"study": study, "config": "seqs-48", "figure": "knee", "value": value,
                "lo": lo, "hi": hi, "half_width_pct": (hi - lo) / 2 / value * 100}

    lines, apart = repeatability_lines([row("s1", 58.0, 61.0), row("s2", 60.0, 62.0)])
    assert apart == 0 and lines == ["  seqs-48 knee: half-widths ±2.5%, 1.6% of the value; "
                                    "all overlap"]
    lines, apart = repeatability_lines([row("s1", 58.0, 59.0), row("s2", 60.0, 62.0),
                                        row("s3", 58.5, 60.5)])
    assert apart == 1 and lines[0].endswith("1 pair(s) apart: s1/s2")
