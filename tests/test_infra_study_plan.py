"""The study planner: steps sized from what the study measured of the server (its E2E P95 and
the noise of the precision metric), and ``--budget`` giving up loads, the search and repeats
before step length, never planning a step under the E2E floor (infra/study/plan.py), and the
runner sizing each part from the same figures (infra/study/runner.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from infra.study.plan import (
    Measured,
    fit_budget,
    fit_for_run,
    main,
    plan_steps,
    spread_k,
    thin_loads,
    total_seconds,
    unit_seconds,
)
from infra.study.spec import MIN_E2E_MULTIPLE, StudySpecError, load_study, study_from_dict

E2E_S = 3.5  # a 7B shape's E2E P95 at its first load (128 output tokens), the H100 study's


def _gpu_study(**overrides: object) -> dict:
    """The issue's study: two vLLM configurations of a 7B shape, closed loop, 2+ repeats."""
    config = {"target": "vllm", "model": "/root/models/qwen2.5-7b", "python": "python3"}
    return {"name": "h100-7b", "load": {"kind": "concurrency", "steps": [24, 48, 72, 144, 216]},
            "configurations": [{"name": "seqs-64", **config, "args": ["--max-num-seqs=64"]},
                               {"name": "seqs-256", **config, "args": ["--max-num-seqs=256"]}],
            "repeats": 3, "refine": {"share": 0.05, "max_steps": 4},
            "precision": {"metric": "ttft_p95", "half_width_pct": 5, "min_s": 15, "max_s": 90},
            "slo": {"ttft_ms": 1000}, **overrides}


def _measured_state(e2e_s: float = E2E_S, noise: float = 60.0, starts: float = 158.0
                    ) -> dict:
    return {"starts": [{"config": "seqs-64", "target": "vllm", "seconds": starts}],
            "configs": {"seqs-64": {"e2e_p95_s": {"24": e2e_s},
                                    "noise": {"metric": "ttft_p95", "bootstrap": noise}}},
            "first": {"config": "seqs-64", "load": 24.0, "e2e_p95_s": e2e_s, "noise": noise}}


def _measured(e2e_s: float = E2E_S, noise: float = 60.0, starts: float = 158.0) -> Measured:
    return Measured.from_state(_measured_state(e2e_s, noise, starts))


@pytest.mark.parametrize("budget_min", [12, 15, 20, 30, 45, 90])
def test_a_budget_never_plans_a_step_under_the_e2e_floor(budget_min: int) -> None:
    spec = study_from_dict(_gpu_study())
    measured = _measured()
    floor = MIN_E2E_MULTIPLE * E2E_S  # 35 s, more than min_s (15)
    fitted, notes = fit_budget(spec, budget_min * 60, measured)
    steps, _starts = plan_steps(fitted, measured)
    assert steps and min(s.length_s for s in steps) >= floor
    if total_seconds(spec, measured) > budget_min * 60:
        assert notes, "a study cut to fit says what it gave up"
    # step length is the last thing given up: max_s only moves once the search is off,
    # repeats are 1 and every configuration is down to two loads
    if fitted.precision != spec.precision:
        assert fitted.repeats == 1 and (fitted.refine is None or fitted.refine.max_steps == 0)
        assert all(len(fitted.steps_for(c)) == 2 for c in fitted.configurations)
        assert notes[-1].startswith("precision.max_s 90 -> ")


def test_a_budget_gives_up_the_search_repeats_and_loads_first_and_says_so(capsys) -> None:
    spec = study_from_dict(_gpu_study())
    fitted, lines = fit_for_run(spec, 20 * 60, _measured(noise=30.0))
    assert fitted.precision == spec.precision  # no step shortened
    assert fitted.repeats == 2 and fitted.refine is not None and fitted.refine.max_steps == 0
    assert fitted.steps_for(fitted.configurations[0]) == (24, 72, 216)  # 48 and 144 went
    print("\n".join(lines))
    assert lines == [
        "budget 20 min: the study as written needs about 56.4 min; given up, least needed "
        "first:",
        "  - refine.max_steps 4 -> 0 (search loads per configuration, at most)",
        "  - repeats 3 -> 2",
        "  - loads of seqs-64: 48, 144 (keeps 24, 72, 216 users)",
        "  - loads of seqs-256: 48, 144 (keeps 24, 72, 216 users)",
        "  kept: no step shorter than 10 x E2E P95 (3.50 s measured: 35 s); precision.max_s "
        "90 s",
        "  estimate 16.5 min (server starts 5.1 min, 1 of 2 measured)",
        "  ttft_p95 interval of one repeat: about ±5.0% at the noisiest load measured (the "
        "target is ±5%)"]
    # a budget even the least study misses: refused before the study, or (already running:
    # the first step measured a slower server) run over, never with shorter steps
    with pytest.raises(ValueError, match=r"^got 5 min; this study needs at least 8.3 min "
                                         r"\(repeats 1, refine.max_steps 0, 2 loads, "
                                         r"precision.max_s 35\); allowed: 9m or more"):
        fit_for_run(spec, 5 * 60, _measured())
    least, lines = fit_for_run(spec, 5 * 60, _measured(), strict=False)
    assert lines[-1].startswith("  over budget: got 5 min")
    assert min(s.length_s for s in plan_steps(least, _measured().fitting())[0]) >= 35


def test_steps_are_as_long_as_the_measured_noise_needs() -> None:
    spec = study_from_dict(_gpu_study())
    name = "seqs-64"
    # nothing measured: a precise step is planned at max_s
    assert unit_seconds(spec, Measured(), name, 72.0) == 90
    # k = 60 (±60% over a 1 s window): ±5% needs a 144 s window, more than max_s allows
    assert unit_seconds(spec, _measured(noise=60.0), name, 72.0) == 90
    # k = 30: (30 / 5)^2 = 36 s of window + 5 + 3 s warm-up and cool-down
    assert unit_seconds(spec, _measured(noise=30.0), name, 72.0) == pytest.approx(44.0)
    # k = 10: 4 s of window, but never under 10 x E2E P95
    assert unit_seconds(spec, _measured(noise=10.0), name, 72.0) == pytest.approx(35.0)
    # a larger E2E at a higher load sets that load's floor, past max_s too, and the loads
    # between by the power law through the two (E2E ~ load^0.56 here)
    measured = Measured({name: {24.0: 3.5, 216.0: 12.0}}, {name: 10.0})
    assert unit_seconds(spec, measured, name, 216.0) == pytest.approx(120.0)
    growth = math.log(12.0 / 3.5) / math.log(9)
    assert unit_seconds(spec, measured, name, 72.0) == pytest.approx(35.0 * 3 ** growth)


def test_measured_figures_and_what_a_budget_fits_with() -> None:
    measured = Measured.from_state({
        "starts": [{"config": "a", "target": "vllm", "seconds": 150.0},
                   {"config": "a", "target": "vllm", "seconds": 160.0}],
        "configs": {"a": {"e2e_p95_s": {"24": 3.0, "72": 4.0},
                          "noise": {"metric": "ttft_p95", "bootstrap": 20.0, "parts": 35.0,
                                    "repeats": None}}},
        "first": {"config": "a", "load": 24.0, "e2e_p95_s": 3.0, "noise": 20.0}})
    assert measured.start_s("a", "vllm") == 155.0 and measured.start_s("b", "vllm") == 150.0
    assert measured.noise_k("a") == 35.0 and measured.noise_k("b") == 20.0  # b: the first's
    # between and above the loads measured: E2E ~ load^g through the two beside (or highest)
    growth = math.log(4.0 / 3.0) / math.log(3.0)
    assert measured.e2e("a", 50.0) == pytest.approx(3.0 * (50 / 24) ** growth)
    assert measured.e2e("a", 100.0) == pytest.approx(4.0 * (100 / 72) ** growth)
    assert measured.e2e("a", 72.0) == 4.0 and measured.e2e("a", None) == 4.0
    assert measured.e2e("a", 10.0) == 3.0 and measured.e2e("b", 10.0) == 3.0
    # a closed loop past saturation (E2E tripled with the users): each user more waits in
    # line, g = 1; a shrinking E2E never lowers the estimate under the largest below
    assert Measured({"a": {72.0: 4.0, 216.0: 12.0}}).e2e("a", 432.0) == pytest.approx(24.0)
    assert Measured({"a": {72.0: 4.0, 216.0: 3.0}}).e2e("a", 432.0) == 4.0
    fitting = measured.fitting()  # the first measurement only: a resumed study fits the same
    assert fitting.noise_k("a") == 20.0 and fitting.e2e("a", 100.0) == 3.0
    assert Measured.from_state(None).e2e("a", 1.0) is None
    # two repeats of one load 42.6 and 58.6 req/s (the 15 s steps, 7 s windows)
    assert spread_k([42.6, 58.6], [7.0, 7.0]) == pytest.approx(
        1.96 * (16.0 / math.sqrt(2)) / 50.6 * 100 * math.sqrt(7.0))
    assert math.isnan(spread_k([50.0], [7.0]))


def test_the_loads_given_up_first_are_those_closest_to_their_neighbours() -> None:
    assert thin_loads((24, 48, 72, 216)) == (24, 72, 216)
    assert thin_loads((24, 72, 216)) == (24, 216)
    assert thin_loads((24, 216)) is None


def test_bad_multiple_is_one_line_naming_the_key(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nconfigurations: [{name: a, target: sim}]\n"
                     "load: {kind: concurrency, steps: [1, 2]}\n"
                     "precision: {min_s: 10, max_s: 20, min_e2e_multiple: 0.5}\n")
    with pytest.raises(StudySpecError) as caught:
        load_study(study)
    assert str(caught.value) == (f"{study}:4: precision.min_e2e_multiple: must be >= 1, "
                                 "got 0.5")


def test_study_plan_budget_with_a_measured_study(tmp_path: Path, capsys) -> None:
    import yaml

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(_gpu_study()))
    measured_dir = tmp_path / "earlier"
    measured_dir.mkdir()
    state = {"measured": {"configs": {"seqs-64": {"e2e_p95_s": {"24": 4.0}}},
                          "first": {"config": "seqs-64", "load": 24, "e2e_p95_s": 4.0,
                                    "noise": None}}}
    (measured_dir / "study_state.json").write_text(json.dumps(state))
    assert main([str(study), "--budget", "20m", "--measured", str(measured_dir)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "given up, least needed first:\n  - refine.max_steps 4 -> 0" in out
    assert "kept: no step shorter than 10 x E2E P95 (4.00 s measured: 40 s)" in out
    assert main([str(study), "--measured", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("swarmload study plan: --measured: ")


def test_the_runner_sizes_each_part_from_the_measured_server(tmp_path: Path, capsys) -> None:
    from infra.study import runner as study_runner

    spec = study_from_dict(_gpu_study())
    state = study_runner.StudyState(tmp_path, spec)
    runner = study_runner.StudyRunner(spec, tmp_path, state, unfitted=spec)
    config = spec.configurations[0]
    # nothing measured: the first step is min_s long
    assert runner._part_seconds(config, 24.0, [], math.nan) == 15
    # it measured E2E P95 3.5 s and a noise k of 30 (±30% over a 1 s window)
    state.data["measured"] = {"configs": {"seqs-64": {"e2e_p95_s": {"24": 3.5},
                                                      "noise": {"bootstrap": 30.0}}}}
    # precise, but 15 s is under 10 x 3.5 s: once more, 35 s
    assert runner._part_seconds(config, 24.0, [{"duration_s": 15.0}], 3.0) == 35
    assert runner._part_seconds(config, 24.0, [{"duration_s": 40.0}], 3.0) is None
    # ±8%: the window must grow 2.56x (32 s -> 82 s): 58 s more, 50 s left of max_s
    assert runner._part_seconds(config, 24.0, [{"duration_s": 40.0}], 8.0) == 50
    # 30 s left of max_s is under the floor: the repeat ends imprecise
    assert runner._part_seconds(config, 24.0, [{"duration_s": 60.0}], 8.0) is None
    # the next load's first step: what k = 30 needs for ±5% (36 s window + 8 s)
    assert runner._part_seconds(config, 72.0, [], math.nan) == 44
    # at 216 users E2E P95 came out 12 s: a 44 s step there was under 4 E2E, so once more,
    # as long as the floor (past max_s); one of 80 s (6.7 E2E) stands, and repeat 2 starts
    # from 120 s
    state.data["measured"]["configs"]["seqs-64"]["e2e_p95_s"]["216"] = 12.0
    assert runner._part_seconds(config, 216.0, [{"duration_s": 44.0}], 3.0) == 120
    assert runner._part_seconds(config, 216.0, [{"duration_s": 80.0}], 3.0) is None
    assert runner._part_seconds(config, 216.0, [], math.nan) == 120
    assert "later repeats are sized from it" in capsys.readouterr().out
    # the study's first measurement fits the budget again, once, and is kept for --resume
    state.data["budget_s"] = 20 * 60
    runner._first_measured(config, 24.0, [{"duration_s": 15.0}, {"duration_s": 35.0}])
    first = state.data["measured"]["first"]
    assert first == {"config": "seqs-64", "load": 24.0, "e2e_p95_s": 3.5, "noise": 30.0,
                     "step_s": 50.0}
    assert runner.spec.repeats == 2 and state.spec is runner.spec
    # the sweep, which holds the configuration as the study file wrote it, measures the
    # loads the budget kept
    assert runner._loads(config) == [24.0, 72.0, 216.0]
    out = capsys.readouterr().out
    assert "the budget fitted again with it:" in out and "  - repeats 3 -> 2" in out
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["measured"]["first"] == first



def test_the_sweep_measures_a_load_the_budget_kept_once_the_first_step_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H100 (budget 12 min): the plan gave up 72 users and the second repeat, the first
    step measured a faster server and the budget fitted again "as written", yet the first
    configuration went on from 24 to 216 users, once, and its capacity came out 55 [55, 216].
    Each next load and repeat is now taken from the study as fitted at that moment."""
    import pandas as pd

    from infra.study import runner as study_runner

    written = study_from_dict(_gpu_study(load={"kind": "concurrency", "steps": [24, 72, 216]},
                                         repeats=2, refine=False, repeat_order="alternate"))
    fitted = study_from_dict(_gpu_study(repeats=1, refine=False, repeat_order="alternate",
                                        configurations=[
        {**c, "steps": [24, 216]} for c in _gpu_study()["configurations"]],
        load={"kind": "concurrency", "steps": [24, 72, 216]}))
    state = study_runner.StudyState(tmp_path, fitted)
    runner = study_runner.StudyRunner(fitted, tmp_path, state, unfitted=written)
    config = fitted.configurations[0]
    assert runner._loads(config) == [24.0, 216.0]
    swept: list[tuple[int, float]] = []

    def unit(config, repeat, load, phase, run) -> pd.Series:
        swept.append((repeat, load))
        if len(swept) == 1:  # the first step measured: the budget fits the study as written
            runner.spec = state.spec = written
        return pd.Series({"step": len(swept)})

    monkeypatch.setattr(runner, "_unit", unit)
    monkeypatch.setattr(runner, "_rows_of", lambda name, exclude=None: [])
    monkeypatch.setattr(study_runner, "over_saturated", lambda row, earlier, spec: None)
    monkeypatch.setattr(runner, "_serve", lambda config, repeats, last: runner._sweep(
        config, "http://127.0.0.1:1", "m", "vllm", [], repeats, last))
    runner._run_configuration(config)
    assert swept == [(1, 24.0), (1, 72.0), (1, 216.0), (2, 216.0), (2, 72.0), (2, 24.0)]


@pytest.mark.parametrize("apart", [True, False])
def test_restart_between_repeats_starts_a_server_per_repeat_and_only_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apart: bool) -> None:
    """restart_between_repeats: each repeat on a server of its own, the refinement after the
    last; without it one server measures every repeat."""
    import pandas as pd

    from infra.study import runner as study_runner

    spec = study_from_dict(_gpu_study(load={"kind": "concurrency", "steps": [24, 72]},
                                      repeats=3, refine=False, repeat_order="up",
                                      restart_between_repeats=apart))
    state = study_runner.StudyState(tmp_path, spec)
    runner = study_runner.StudyRunner(spec, tmp_path, state)
    served: list[tuple[list[int], bool]] = []
    swept: list[tuple[int, float]] = []

    def serve(config, repeats, last) -> None:
        served.append((repeats, last))
        runner._sweep(config, "http://127.0.0.1:1", "m", "vllm", [], repeats, last)

    def unit(config, repeat, load, phase, run) -> pd.Series:
        swept.append((repeat, load))
        return pd.Series({"step": len(swept)})

    monkeypatch.setattr(runner, "_unit", unit)
    monkeypatch.setattr(runner, "_rows_of", lambda name, exclude=None: [])
    monkeypatch.setattr(study_runner, "over_saturated", lambda row, earlier, spec: None)
    monkeypatch.setattr(runner, "_serve", serve)
    runner._run_configuration(spec.configurations[0])
    assert served == ([([1], False), ([2], False), ([3], True)] if apart
                      else [([1, 2, 3], True)])
    assert swept == [(r, load) for r in (1, 2, 3) for load in (24.0, 72.0)]

def test_repeat_to_repeat_agreement_is_printed_at_one_load() -> None:
    import pandas as pd

    from infra.study.plan import repeat_lines

    spec = study_from_dict(_gpu_study())
    # the two repeats at 126 users: 42.6 against 58.6 req/s; 24 users agreed
    steps = pd.DataFrame({
        "config": ["seqs-64"] * 5, "bucket": ["all"] * 5,
        "offered_load": [24.0, 24.0, 126.0, 126.0, 126.0], "repeat": [1, 2, 1, 2, 2],
        "part": [1, 1, 1, 1, 2], "ttft_p95_s": [0.5, 0.5, 0.716, 1.0, 1.05],
        "achieved_req_per_s": [20.0, 20.0, 42.6, 58.0, 59.2]})
    assert repeat_lines(spec, steps) == [
        "seqs-64 at 126 users, 2 repeats: ttft_p95 716 / 1025 ms (35.5% apart); achieved "
        "42.6 / 58.6 req/s (31.6% apart)"]
    assert repeat_lines(spec, steps[steps["repeat"] == 1]) == []


def test_the_search_stops_where_the_budget_would_run_over(tmp_path: Path) -> None:
    from infra.study import runner as study_runner

    spec = study_from_dict(_gpu_study())
    state = study_runner.StudyState(tmp_path, spec)
    runner = study_runner.StudyRunner(spec, tmp_path, state)
    config = spec.configurations[0]
    assert runner.over_budget(config, 100.0) == ""  # no --budget
    state.data["measured"] = {
        "starts": [{"config": "seqs-64", "target": "vllm", "seconds": 158.0}],
        "configs": {"seqs-64": {"e2e_p95_s": {"24": 3.5}, "noise": {"bootstrap": 30.0}}}}
    state.data["steps"] = [{"config": "seqs-64", "step": n, "status": "done",
                            "duration_s": 35.0} for n in range(1, 11)]
    # spent 158 s + 10 x 48 s; this load 3 x (44 + 13) s; seqs-256's whole plan after it (its
    # noise not measured yet: max_s steps)
    state.data["budget_s"] = 20 * 60
    assert runner.over_budget(config, 100.0) == (
        "--budget 20 min would run over: 10.6 min spent, 2.9 min for this load, 48.9 min "
        "planned after it")
    state.data["budget_s"] = 65 * 60
    assert runner.over_budget(config, 100.0) == ""


def test_a_step_overhead_measured_on_the_host_replaces_the_estimate(tmp_path: Path) -> None:
    """On the 16-core GPU host a step took 4-6 s beyond its load, not the 13 s measured on
    2 busy cores: the plan (and so what a budget keeps) uses what the study measured."""
    from infra.study import runner as study_runner

    spec = study_from_dict(_gpu_study())
    state = study_runner.StudyState(tmp_path, spec)
    runner = study_runner.StudyRunner(spec, tmp_path, state, unfitted=spec)
    steps = state.data["steps"]
    steps += [{"config": "seqs-64", "step": 1, "status": "done", "duration_s": 20.0,
               "started_at": "2026-12-06T08:07:04.759+00:00",
               "ended_at": "2026-12-06T08:07:29.087+00:00"},
              {"config": "seqs-64", "step": 2, "status": "done", "duration_s": 20.0,
               "started_at": "2026-12-06T08:07:30.531+00:00",
               "ended_at": "2026-12-06T08:07:54.316+00:00"}]
    runner._note_overhead(steps[0])
    runner._note_overhead(steps[1])  # its wall time beyond 20 s, and the 1.4 s gap before it
    assert state.data["measured"]["step_overheads_s"] == [4.33, 5.23]
    measured = runner.measured()
    assert measured.step_overheads_s == (4.33, 5.23)
    before = total_seconds(spec, _measured())
    after = total_seconds(spec, Measured.from_state({**state.data["measured"],
                                                     **_measured_state()}))
    planned = len(plan_steps(spec, measured)[0])
    assert before - after == pytest.approx(planned * (13.0 - 4.78), abs=0.01)

