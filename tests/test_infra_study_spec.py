"""infra.study.spec: the example study files parse; mistakes are named by their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.study import example_names
from infra.study.runner import plan_around
from infra.study.spec import StudySpecError, load_study, study_from_dict

STUDIES = Path(__file__).resolve().parent.parent / "infra" / "study" / "examples"


def _study(**overrides: object) -> dict:
    base = {
        "name": "s",
        "configurations": [{"name": "a", "target": "sim", "args": ["--max-num-seqs=4"]}],
        "load": {"kind": "rate", "steps": [2, 4]},
    }
    return {**base, **overrides}


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_studies_parse(path: Path) -> None:
    spec = load_study(path)
    assert len(spec.configurations) == 2
    assert all(spec.steps_for(c) or spec.load.auto for c in spec.configurations)


def test_defaults_and_slo_forms() -> None:
    spec = study_from_dict(_study(slo={"ttft_p95_ms": 500, "tpot_ms": 50, "error_rate": 0.02}))
    assert spec.slo.thresholds_s() == {"ttft": 0.5, "tpot": 0.05}
    assert spec.slo.percentile == "p95" and spec.slo.error_rate == 0.02
    assert spec.steps_for(spec.configurations[0]) == (2.0, 4.0)
    assert spec.workload.folder is None and spec.workload.mix == "45/40/15"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"load": {"kind": "speed", "steps": [1]}}, "load.kind"),
        ({"load": {"kind": "concurrency", "steps": [1, 2.5]}}, "load.steps[1]"),
        ({"load": {"kind": "rate", "steps": [1], "auto": {"start": 1}}}, "load:"),
        ({"load": {"kind": "rate", "auto": {"start": 1, "factor": 1}}}, "load.auto.factor"),
        ({"slo": {"ttft_p99_ms": 500}}, "slo.ttft_p99_ms"),
        ({"slo": {"latency_ms": 5}}, "slo.latency_ms"),
        ({"stop_when": {"errors": 0.1}}, "stop_when"),
        ({"configurations": [{"name": "a", "target": "tgi"}]}, "configurations[0].target"),
        ({"configurations": [{"name": "a b", "target": "sim"}]}, "configurations[0].name"),
        ({"configurations": [{"name": "a", "target": "http://127.0.0.1:1", "args": ["-x"]}]},
         "configurations[0].args"),
        ({"workload": {"mix": "50/60/0"}}, "workload.mix"),
        ({"workload": {"thresholds": "64"}}, "workload.thresholds"),
        ({"warmup_s": 20, "step_duration_s": 10}, "warmup_s"),
        ({"knee_metric": "tps"}, "knee_metric"),
        ({"step_duration": 10}, "step_duration"),
        ({"labels": ["engine=x"]}, "labels"),
    ],
)
def test_mistakes_name_their_key(overrides: dict, named: str) -> None:
    with pytest.raises(StudySpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        study_from_dict(_study(**overrides))


def test_plan_around_skips_loads_already_measured() -> None:
    assert plan_around(10.0, (0.5, 0.9, 1.0, 1.1), "rate", [5.0, 20.0]) == [9.0, 10.0, 11.0]
    assert plan_around(7.6, (0.5, 1.0, 1.25), "concurrency", [4.0]) == [8.0, 10.0]


def test_auto_probes_until_saturation_then_sweeps_around_capacity(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """The auto planner against a stand-in server of capacity 10 req/s (no processes)."""
    import pandas as pd

    from infra.study import runner as study_module

    around = [0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5]
    spec = study_from_dict(_study(load={"kind": "rate", "auto": {"start": 2, "factor": 2,
                                                                 "around": around}},
                                  stop_when={"latency_growth": 20}))
    state = study_module.StudyState(tmp_path, spec)
    runner = study_module.StudyRunner(spec, tmp_path, state)
    offered: list[tuple[float, str]] = []
    rows: dict[int, pd.Series] = {}

    def fake_step(self, config, number, load, phase, *_args, repeat=1, part=1):  # noqa: ANN001, ANN202
        offered.append((load, phase))
        state.data["steps"].append({"config": config.name, "step": number, "offered_load": load,
                                    "status": "done", "phase": phase, "repeat": repeat,
                                    "part": part})
        achieved = min(load, 10.0)
        rows[number] = pd.Series({
            "config": config.name, "step": number, "offered_load": load,
            "achieved_req_per_s": achieved, "achieved_ratio": achieved / load,
            "error_rate": 0.0, "e2e_p50_s": 0.4,
            "ttft_p95_s": 0.05 if load < 10 else 0.05 * 4 ** (load - 10)})
        return rows[number]

    monkeypatch.setattr(study_module.StudyRunner, "_run_step", fake_step)
    monkeypatch.setattr(study_module.StudyRunner, "_cached_row",
                        lambda self, entry: rows[entry["step"]])
    runner._sweep(spec.configurations[0], "http://127.0.0.1:1", "m", "sim", [], [1], True)
    probes = [load for load, phase in offered if phase == "probe"]
    sweep = [load for load, phase in offered if phase == "sweep"]
    assert probes == [2, 4, 8, 16]  # 16 req/s: achieved 10, below 95% of offered
    assert state.config("a")["capacity_estimate"] == 10.0
    # around 10: 5, 7.5, 9, 10, 11, 12.5, 15; at 12.5 P95 TTFT is 1.6 s, 32x the lowest
    # (more than latency_growth 20x): over-saturated, so 15 is never run
    assert sweep == [5.0, 7.5, 9.0, 10.0, 11.0, 12.5]
    assert "x the lowest" in state.config("a")["stopped"]


def test_a_burst_study_gives_every_step_the_same_spike(tmp_path: Path) -> None:
    from infra.study.runner import _plan_file
    from workloads.arrivals import load_plan

    spec = study_from_dict(_study(load={
        "kind": "rate", "steps": [2, 4], "arrival": "bursts",
        "burst": {"peak_rps": 30, "spike_s": 5, "count": 1, "first_spike_s": 10}}))
    plan = load_plan(_plan_file(tmp_path, "a", 2, 4.0, spec))
    assert plan.kind == "bursts" and plan.base_rps == 4.0 and plan.peak == 30
    assert plan.spikes(60) == [(10.0, 15.0)]


@pytest.mark.parametrize(("load", "named"), [
    ({"arrival": "bursts"}, r"load.burst: required with arrival: bursts"),
    ({"arrival": "poisson", "burst": {"peak_rps": 3}}, r"load.burst: only with arrival: bursts"),
    ({"arrival": "bursts", "burst": {"base_rps": 1, "peak_rps": 3, "spike_s": 1, "count": 1,
                                     "first_spike_s": 2}}, r"leave out base_rps"),
    ({"arrival": "bursts", "burst": {"peak_rps": 30, "spike_s": 90, "period_s": 60}},
     r"load.burst: bursts plan: spike_s \(90\) is longer than period_s \(60\)"),
    ({"arrival": "bursts", "burst": {"peak_rps": 30, "spike_s": 5, "period_s": 60,
                                     "shape": "square"}},
     r"load.burst: bursts plan: shape 'square' is not one of \['step', 'ramp'\]"),
])
def test_bad_burst_studies_name_the_key(load: dict, named: str) -> None:
    with pytest.raises(StudySpecError, match=named):
        study_from_dict(_study(load={"kind": "rate", "steps": [2], **load}))


def test_labels_are_kept_as_text() -> None:
    spec = study_from_dict(_study(labels={"engine": "vllm-0.26", "gpus": 8}))
    assert spec.labels == {"engine": "vllm-0.26", "gpus": "8"}


def test_a_packaged_example_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "sim-two-configs" in example_names()
    assert load_study("sim-two-configs").name == load_study("sim-two-configs.yaml").name
    with pytest.raises(StudySpecError, match="packaged example: .*sim-two-configs"):
        load_study("no-such-study")
    # a file of that name in the folder wins over the example
    (tmp_path / "sim-two-configs.yaml").write_text("name: [")
    with pytest.raises(StudySpecError, match="sim-two-configs.yaml:1"):
        load_study("sim-two-configs.yaml")


def test_decision_grade_keys_parse() -> None:
    spec = study_from_dict(_study(
        repeats=3, repeat_order="shuffle", seed=7, restart_between_repeats=True,
        steady_state="fixed", precision={"metric": "ttft_p95", "half_width_pct": 5, "min_s": 10,
                                         "max_s": 40},
        refine={"share": 0.03, "max_steps": 4}, expected_cache_hit_rate=0.2))
    assert (spec.repeats, spec.repeat_order, spec.seed) == (3, "shuffle", 7)
    assert spec.restart_between_repeats and spec.steady_state == "fixed"
    assert spec.precision is not None and spec.precision.column == "ttft_p95_s"
    assert spec.step_duration_s == 10  # a precise step starts with min_s
    assert spec.refine is not None and (spec.refine.share, spec.refine.max_steps) == (0.03, 4)
    defaults = study_from_dict(_study())
    assert defaults.repeats == 1 and defaults.steady_state == "mser5"
    assert defaults.precision is None and defaults.refine is None


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"repeats": 0}, "repeats: expected an integer >= 1"),
        ({"repeat_order": "down"}, "repeat_order: 'down' is not one of"),
        ({"steady_state": "mser"}, "steady_state: 'mser' is not one of ['mser5', 'fixed']"),
        ({"precision": {"metric": "ttft_p97"}}, "precision.metric: 'ttft_p97' is not one of"),
        ({"precision": {"half_width_pct": 0}}, "precision.half_width_pct: must be > 0"),
        ({"precision": {"min_s": 30, "max_s": 10}}, "precision.max_s: must be >= precision.min_s"),
        ({"precision": {"min_s": 20}, "step_duration_s": 20}, "step_duration_s: give either"),
        ({"precision": {"bogus": 1}}, "precision: unknown key(s) ['bogus']"),
        ({"refine": {"share": 2}}, "refine.share: must be <= 1"),
        ({"refine": {"max_steps": -1}}, "refine.max_steps: expected an integer >= 0"),
        ({"reset_prefix_cache": True}, "reset_prefix_cache: configurations[0] (a) has target"),
        ({"reset_prefix_cache": "yes"}, "reset_prefix_cache: expected true or false"),
        ({"restart_between_repeats": 1}, "restart_between_repeats: expected true or false"),
        ({"expected_cache_hit_rate": 1.5}, "expected_cache_hit_rate: must be <= 1"),
    ],
)
def test_bad_decision_grade_keys_are_named(overrides: dict, named: str) -> None:
    with pytest.raises(StudySpecError) as error:
        study_from_dict(_study(**overrides))
    assert named in str(error.value) and "\n" not in str(error.value)


def test_repeats_run_up_then_down_or_shuffled_by_the_seed(tmp_path: Path) -> None:
    from infra.study.runner import StudyRunner, StudyState

    def order(repeat_order: str, seed: int = 0) -> list[list[float]]:
        spec = study_from_dict(_study(repeats=3, repeat_order=repeat_order, seed=seed,
                                      load={"kind": "rate", "steps": [1, 2, 3, 4]}))
        runner = StudyRunner(spec, tmp_path, StudyState(tmp_path, spec))
        config = spec.configurations[0]
        return [runner.repeat_order(config, [1.0, 2.0, 3.0, 4.0], r) for r in (1, 2, 3)]

    assert order("alternate") == [[1, 2, 3, 4], [4, 3, 2, 1], [1, 2, 3, 4]]
    assert order("up") == [[1, 2, 3, 4]] * 3
    shuffled = order("shuffle", seed=1)
    assert all(sorted(r) == [1, 2, 3, 4] for r in shuffled) and shuffled == order("shuffle", 1)
    assert shuffled != order("shuffle", seed=2)


def test_the_search_bisects_the_slo_boundary_then_refines_the_knee() -> None:
    import pandas as pd

    from infra.study.runner import next_refinement

    points = pd.DataFrame({"offered_load": [10.0, 20.0, 30.0, 40.0],
                           "sustainable": [True, True, False, False]})
    wide = pd.Series({"max_sustainable_load": 20.0, "max_load_lo": 20.0, "max_load_hi": 30.0,
                      "knee_load": 30.0, "knee_lo": 25.0, "knee_hi": 35.0})
    load, why = next_refinement(points, wide, 0.05, "rate")
    assert load == 25.0 and "bisect 20..30" in why
    narrow = wide.copy()
    narrow["max_load_hi"] = 20.5  # the boundary is known to 1.25%: now the knee
    load, why = next_refinement(points, narrow, 0.05, "rate")
    assert load in (25.0, 35.0) and "knee" in why  # halves a gap beside 30
    done = narrow.copy()
    done["knee_lo"], done["knee_hi"] = 29.5, 30.5
    assert next_refinement(points, done, 0.05, "rate")[0] is None
    # rate steps: a load that saturated the server measured its ceiling; a load just under it
    # (the share, or the ceiling's lower end when closer) is tried before the bracket's middle
    ceiling = wide.copy()
    ceiling["throughput_ceiling"], ceiling["throughput_ceiling_lo"] = 28.0, 26.0
    load, why = next_refinement(points, ceiling, 0.05, "rate")
    assert load == 26.6 and "throughput ceiling" in why  # 28 x 0.95
    ceiling["throughput_ceiling_lo"] = 27.4
    assert next_refinement(points, ceiling, 0.05, "rate")[0] == 27.4
    measured = pd.DataFrame({"offered_load": [10.0, 20.0, 27.4, 30.0, 40.0],
                             "sustainable": [True, True, True, False, False]})
    ceiling["max_sustainable_load"], ceiling["max_load_lo"] = 27.4, 27.4
    ceiling["throughput_ceiling"] = 27.5  # measured just under: now the bracket
    assert next_refinement(measured, ceiling, 0.01, "rate")[0] == 28.7  # then bisects
    # concurrency loads are whole users: no new load between 2 and 3
    users = pd.DataFrame({"offered_load": [2.0, 3.0], "sustainable": [True, False]})
    tight = pd.Series({"max_sustainable_load": 2.0, "max_load_lo": 2.0, "max_load_hi": 3.0,
                       "knee_load": float("nan")})
    assert next_refinement(users, tight, 0.05, "concurrency")[0] is None


def test_the_knee_gets_its_turn_while_the_slo_boundary_is_still_wide() -> None:
    import pandas as pd

    from infra.study.runner import next_refinement

    points = pd.DataFrame({"offered_load": [10.0, 20.0, 30.0, 40.0],
                           "sustainable": [True, True, False, False]})
    both_wide = pd.Series({"max_sustainable_load": 20.0, "max_load_lo": 20.0,
                           "max_load_hi": 30.0, "knee_load": 30.0, "knee_lo": 25.0,
                           "knee_hi": 35.0})
    assert next_refinement(points, both_wide, 0.05, "rate", "max_load")[0] == 25.0
    load, why = next_refinement(points, both_wide, 0.05, "rate", "knee")
    assert load in (25.0, 35.0) and "knee" in why
    # the knee's turn with its interval narrow already: the max load takes it
    knee_done = both_wide.copy()
    knee_done["knee_lo"], knee_done["knee_hi"] = 29.5, 30.5
    load, why = next_refinement(points, knee_done, 0.05, "rate", "knee")
    assert load == 25.0 and "bisect" in why
    with pytest.raises(ValueError, match="first must be one of"):
        next_refinement(points, both_wide, 0.05, "rate", "ceiling")


def test_plan_prints_every_step_and_the_budget_says_what_it_gave_up() -> None:
    from infra.study.plan import fit_budget, format_plan, total_seconds

    spec = study_from_dict(_study(repeats=3, precision={"min_s": 10, "max_s": 60},
                                  refine={"share": 0.05, "max_steps": 4}))
    text = format_plan(spec)
    assert text.count(" sweep ") == 2 * 3 and text.count(" refine ") == 4 * 3
    assert "estimate" in text
    fitted, notes = fit_budget(spec, 6 * 60)
    assert total_seconds(fitted) <= 6 * 60 < total_seconds(spec)
    assert notes and notes[0].startswith("precision.max_s 60 ->")


def test_study_run_budget_fits_the_study_or_refuses_in_one_line(tmp_path: Path, capsys) -> None:
    import math

    import pandas as pd
    import yaml

    from infra.study.plan import precision_lines, total_seconds
    from infra.study.runner import fit_to_budget, main
    from locustfiles.config import RunConfig

    raw = _study(repeats=3, precision={"min_s": 10, "max_s": 60},
                 refine={"share": 0.05, "max_steps": 4})
    spec = study_from_dict(raw)
    fitted, budget, line = fit_to_budget(RunConfig(study_budget=6 * 60), spec)
    assert budget == 360 and total_seconds(fitted) <= 360 < total_seconds(spec)
    assert line.startswith("budget 6 min: precision.max_s 60 -> ") and "interval" in line
    assert fit_to_budget(RunConfig(), spec) == (spec, 0.0, "")
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(raw))
    assert main([str(study), "--budget", "30s"]) == 2  # even repeats 1, no search: 0.9 min
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("swarmload study run: --budget: got 0.5 min;")
    assert "allowed: 1m or more" in err, err
    # what it reached: each interval's half-width, the precision metric's widest
    capacity = pd.DataFrame([{"config": "a", "max_sustainable_load": 40.0, "max_load_lo": 39.0,
                              "max_load_hi": 41.0, "knee_load": 40.0, "knee_lo": 36.0,
                              "knee_hi": math.inf}])
    points = pd.DataFrame({"config": ["a", "a"], "bucket": ["all", "all"],
                           "offered_load": [32.0, 40.0], "ttft_p95_s": [0.2, 0.5],
                           "ttft_p95_s_lo": [0.19, 0.4], "ttft_p95_s_hi": [0.21, 0.6]})
    (reached,) = precision_lines(spec, capacity, points)
    assert reached == ("a: max sustainable load ±2.5%, knee open above (no load failed), "
                       "ttft_p95 at worst ±20.0% (at 40; the target was ±5%)")


def test_replicas_and_a_fault_plan_per_configuration(tmp_path: Path) -> None:
    (tmp_path / "faults.yaml").write_text("actions:\n  - {at_s: 5, action: kill, replica: r1, "
                                          "for_s: 5}\n")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nconfigurations:\n"
                     "  - {name: one, target: sim}\n"
                     "  - {name: two, target: sim, replicas: 2, fault_plan: faults.yaml,\n"
                     "     fault_loads: [4]}\n"
                     "load: {kind: rate, steps: [2, 4]}\n")
    one, two = load_study(study).configurations
    assert (one.replicas, one.fault_plan) == (1, None)
    assert two.replicas == 2 and two.balance == "haproxy-leastconn"
    assert two.fault_plan == str((tmp_path / "faults.yaml").resolve())
    assert two.faults_in(4.0) == two.fault_plan and two.faults_in(2.0) is None


@pytest.mark.parametrize(("item", "named"), [
    ({"replicas": 0}, "configurations[0].replicas: expected an integer >= 1"),
    ({"target": "http://127.0.0.1:9", "replicas": 2}, "configurations[0].replicas: starts"),
    ({"replicas": 2, "balance": "random"}, "configurations[0].balance: 'random' is not one of"),
    ({"fault_plan": "f.yaml"}, "configurations[0].fault_plan: acts on replicas"),
    ({"replicas": 2, "fault_loads": [2]}, "configurations[0].fault_loads: needs fault_plan"),
])
def test_bad_replica_keys_are_named(item: dict, named: str) -> None:
    config = {"name": "a", "target": "sim", **item}
    with pytest.raises(StudySpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        study_from_dict(_study(configurations=[config]))


def test_a_bad_fault_plan_names_the_study_line_and_its_own(tmp_path: Path) -> None:
    (tmp_path / "faults.yaml").write_text("actions:\n  - {at_s: 5, action: kill, replica: r2}\n")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nconfigurations:\n"
                     "  - {name: two, target: sim, replicas: 2,\n"
                     "     fault_plan: faults.yaml}\n"
                     "load: {kind: rate, steps: [2]}\n")
    with pytest.raises(StudySpecError) as caught:
        load_study(study)
    assert str(caught.value).startswith(f"{study}:4: configurations[0].fault_plan: ")
    assert f"{(tmp_path / 'faults.yaml')}:2: actions: replica r2 does not exist" in str(
        caught.value)
