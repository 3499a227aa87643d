"""``swarmload study merge``: studies measured apart, joined into one study folder.

The sources are small synthetic studies (the M/D/c queue records of
test_dashboards_study_analysis.py written as the runner's step folders, with the runner's
study_state.json and study.json), so each configuration's capacity is known and the merged
roll-up can be checked against each source's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_dashboards_study_analysis import SLO, STEP_S, _queue_records

from collectors import run_folder
from collectors.schemas import REQUEST_SCHEMA
from dashboards import study_export
from dashboards.analysis import study as sa
from infra.study import merge
from infra.study.runner import STATE_FILE, StudyState
from infra.study.spec import study_from_dict


def _source(folder: Path, name: str, configs: dict[str, tuple[int, list[float]]],
            status: str = "finished", interrupted_last: bool = False, **keys: Any) -> Path:
    """A study folder as ``study run`` leaves it: a step folder per configuration and rate,
    study_state.json, study.json, study.yaml; ``interrupted_last``: its last step was cut."""
    raw = {"name": name, "configurations": [{"name": n, "target": "sim"} for n in configs],
           "load": {"kind": "rate", "steps": sorted({r for _, rs in configs.values()
                                                      for r in rs})},
           "step_duration_s": STEP_S, "warmup_s": 2.0, "cooldown_s": 1.0,
           "steady_state": "fixed", "slo": SLO, "refine": False, **keys}
    spec = study_from_dict(raw, folder)
    steps = []
    for config, (slots, rates) in configs.items():
        for k, rate in enumerate(rates, 1):
            run_dir = folder / config / f"step-{k}"
            (run_dir / "requests").mkdir(parents=True)
            table = pa.Table.from_pylist(_queue_records(rate, slots, seed=k), schema=REQUEST_SCHEMA)
            pq.write_table(table, run_dir / "requests" / "part-0.parquet")
            cut = interrupted_last and k == len(rates)
            steps.append({"config": config, "step": k, "offered_load": rate, "load_kind": "rate",
                          "run_dir": f"{config}/step-{k}", "status": "interrupted" if cut
                          else "done", "phase": "sweep", "stopped": None})
    state = StudyState(folder, spec)
    state.data.update({"status": status, "steps": steps, "ended_at": state.data["started_at"],
                       "measured": {"starts": [{"config": c, "target": "sim", "seconds": 1.0}
                                               for c in configs]}})
    state.save()
    (folder / "study.yaml").write_text(json.dumps(raw))
    return folder


@pytest.fixture
def two_machines(tmp_path: Path) -> tuple[Path, Path]:
    """slots-4 (10 req/s) measured by one study, slots-8 (20 req/s) by another, cut short."""
    a = _source(tmp_path / "a", "study-a", {"slots-4": (4, [5.0, 8.0, 12.0])})
    b = _source(tmp_path / "b", "study-b", {"slots-8": (8, [10.0, 16.0, 24.0, 30.0])},
                status="interrupted", interrupted_last=True)
    return a, b


def test_the_merged_study_compares_what_each_source_measured(two_machines, tmp_path) -> None:
    a, b = two_machines
    out = tmp_path / "merged"
    assert merge.main([str(a), str(b), "--out", str(out), "--gpu-hour-usd", "2.5"]) == 0

    study = run_folder.read_study(out)
    assert [c["name"] for c in study["configurations"]] == ["slots-4", "slots-8"]
    assert study["status"] == "interrupted"  # one source was cut short
    assert study["gpu_hour_usd"] == 2.5
    assert [(s["config"], s["step"], s["status"]) for s in study["steps"]] == [
        ("slots-4", 1, "done"), ("slots-4", 2, "done"), ("slots-4", 3, "done"),
        ("slots-8", 1, "done"), ("slots-8", 2, "done"), ("slots-8", 3, "done"),
        ("slots-8", 4, "interrupted")]
    assert [(m["name"], m["folder"], m["status"]) for m in study["merged_from"]] == [
        ("study-a", str(a), "finished"), ("study-b", str(b), "interrupted")]
    assert [s["config"] for s in study["measured"]["starts"]] == ["slots-4", "slots-8"]
    # each configuration's capacity is what its own study found; the verdict sets them apart
    merged = sa.load_rollup(out)[1].set_index("config")
    for source, config in ((a, "slots-4"), (b, "slots-8")):
        own = sa.rollup_study(source, write=False)[1].set_index("config").loc[config]
        assert merged.loc[config, "max_sustainable_load"] == own["max_sustainable_load"]
        assert merged.loc[config, "knee_load"] == pytest.approx(own["knee_load"], nan_ok=True)
    assert [c["config"] for c in study["capacity"]] == ["slots-4", "slots-8"]
    assert any("slots-8" in line and "slots-4" in line for line in study["verdict"])
    assert {row["config"] for row in study["frontier"]} == {"slots-4", "slots-8"}
    # the step folders came along, the sources stayed as they were
    assert (out / "slots-8" / "step-4" / "requests" / "part-0.parquet").is_file()
    assert json.loads((b / STATE_FILE).read_text())["name"] == "study-b"
    # the export reads it as any study
    assert study_export.main([str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert "slots-8" in (tmp_path / "r.html").read_text()


def test_one_configuration_on_two_machines_is_renamed_in_each(tmp_path: Path, capsys) -> None:
    a = _source(tmp_path / "h100", "h100", {"vllm": (4, [5.0, 8.0, 12.0])})
    b = _source(tmp_path / "h200", "h200", {"vllm": (8, [10.0, 16.0, 24.0])},
                warmup_s=3.0)
    out = tmp_path / "merged"
    assert merge.main([str(a), str(b), "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "warning: warmup_s differs: 2.0 (h100) vs 3.0 (h200)" in printed
    assert "vllm as vllm@h200" in printed
    assert list(sa.load_rollup(out)[1]["config"]) == ["vllm@h100", "vllm@h200"]
    steps = run_folder.read_study(out)["steps"]
    assert {s["run_dir"].split("/")[0] for s in steps} == {"vllm@h100", "vllm@h200"}
    assert all((out / s["run_dir"]).is_dir() for s in steps)
    # each step keeps the window its own study measured
    assert {(s["config"], s["warmup_s"]) for s in steps} == {("vllm@h100", 2.0),
                                                              ("vllm@h200", 3.0)}


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("slo", {**SLO, "ttft_ms": 500.0}, "slo differs"),
    ("workload", {"mix": "100/0/0"}, "workload differs"),
])
def test_studies_that_measured_different_things_are_refused(
        tmp_path: Path, capsys, key: str, value: Any, shown: str) -> None:
    a = _source(tmp_path / "a", "a", {"x": (4, [5.0])})
    b = _source(tmp_path / "b", "b", {"y": (4, [5.0])}, **{key: value})
    out = tmp_path / "merged"
    assert merge.main([str(a), str(b), "--out", str(out)]) == 2

    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and shown in err and "(a) vs" in err and "(b)" in err, err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_folder_that_is_no_study_and_an_out_in_use_are_refused(two_machines, tmp_path,
                                                                   capsys) -> None:
    a, b = two_machines
    assert merge.main([str(a), str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "not a study folder" in capsys.readouterr().err
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    assert merge.main([str(a), str(b), "--out", str(used)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in used.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "m").exists()
