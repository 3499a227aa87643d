"""infra.study.spec: the example study files parse; mistakes are named by their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.study import example_names, study_file
from infra.study.runner import plan_around
from infra.study.spec import (
    MIN_E2E_MULTIPLE,
    RUN_SECTIONS,
    STRUCTURED,
    Precision,
    StudySpecError,
    default_of,
    load_study,
    study_from_dict,
    study_keys,
)

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


def test_a_study_may_replay_the_logged_answers_of_sessions_and_tasks() -> None:
    """Two configurations compared on the same prompts: a prefix cache on against off."""
    spec = study_from_dict(_study(workload={"session_history": "logged"}))
    assert spec.run.session_history == "logged"
    assert spec.workload.to_dict()["session_history"] == "logged"  # study.json says so
    assert study_from_dict(_study()).run.session_history == "real"
    with pytest.raises(StudySpecError, match="session_history.*logged"):
        study_from_dict(_study(workload={"session_history": "old"}))


def test_the_slo_may_name_task_time() -> None:
    spec = study_from_dict(_study(slo={"task_p95_ms": 20000, "ttft_ms": 500}))
    assert spec.slo.task_ms == 20000 and spec.slo.to_dict()["task_ms"] == 20000
    assert spec.slo.thresholds_s() == {"ttft": 0.5}  # a per-request limit it is not
    with pytest.raises(StudySpecError, match="slo.task_ms: .*> 0"):
        study_from_dict(_study(slo={"task_ms": 0}))
    import pandas as pd

    from infra.study.runner import format_step

    row = pd.Series({"config": "a", "step": 1, "offered_load": 2.0, "offered_req_per_s": 2.0,
                     "achieved_ratio": 1.0, "achieved_req_per_s": 2.0, "output_tok_per_s": 50.0,
                     "goodput_req_per_s": 2.0, "ttft_p95_s": 0.1, "tpot_p95_s": 0.01,
                     "e2e_p95_s": 0.5, "task_p95_s": 21.25, "error_rate": 0.0,
                     "sustainable": False})
    assert "E2E 500 ms, task 21.25 s; errors 0.0%; NOT sustainable" in format_step(row, spec)


def test_a_rate_plan_of_a_task_or_session_folder_counts_them(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from workloads.schema import WORKLOAD_FILE

    columns = {"tasks": {"turn": [0, 1], "depends_on": [[], [0]]},
               "sessions": {"turn": [0, 1], "depends_on": pa.array([None, None],
                                                                   pa.list_(pa.int32()))},
               "lone": {"request_id": ["a", "b"]}}
    for name, table in columns.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table(table), tmp_path / name / WORKLOAD_FILE)
    units = {name: study_from_dict(_study(workload={"folder": str(tmp_path / name)})).load_unit
             for name in columns}
    assert units == {"tasks": "tasks/s", "sessions": "sessions/s", "lone": "req/s"}
    closed = _study(workload={"folder": str(tmp_path / "tasks")},
                    load={"kind": "concurrency", "steps": [1]})
    with pytest.raises(StudySpecError):  # a folder is replayed open-loop only
        study_from_dict(closed)
    assert study_from_dict(_study()).load_unit == "req/s"  # the built-in mix


def test_a_rate_step_of_tasks_says_tasks() -> None:
    """The load, offered and achieved of a task workload's rate step count tasks; its calls
    stay req/s (a step once read "achieved 8.30 req/s of 1.52 offered (546%)")."""
    import pandas as pd

    from infra.study.runner import format_step

    spec = study_from_dict(_study())
    row = pd.Series({"config": "a", "step": 1, "offered_load": 2.0, "offered_req_per_s": 16.0,
                     "achieved_ratio": 0.97, "achieved_req_per_s": 15.87,
                     "arrival_unit": "tasks", "offered_arrivals_per_s": 2.17,
                     "achieved_arrivals_per_s": 2.10, "output_tok_per_s": 254.0,
                     "goodput_req_per_s": 15.87, "ttft_p95_s": 0.055, "tpot_p95_s": 0.025,
                     "e2e_p95_s": 0.427, "error_rate": 0.0, "sustainable": True})
    line = format_step(row, spec)
    assert "step 1: 2 tasks/s: achieved 2.10 tasks/s of 2.17 offered (97%), 15.87 req/s," in line
    lone = format_step(row.drop(["arrival_unit", "offered_arrivals_per_s",
                                 "achieved_arrivals_per_s"]), spec)
    assert "step 1: 2 req/s: achieved 15.87 req/s of 16.00 offered (97%)," in lone


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
                                  stop_when={"latency_growth": 20}, refine=False))
    state = study_module.StudyState(tmp_path, spec)
    runner = study_module.StudyRunner(spec, tmp_path, state)
    offered: list[tuple[float, str]] = []
    rows: dict[int, pd.Series] = {}

    def fake_step(self, config, number, load, phase, *_args, repeat=1, part=1, **_kw):  # noqa: ANN001, ANN202, E501
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


def test_a_packaged_examples_fault_plan_is_found_beside_it(tmp_path, monkeypatch):
    """sim-replicas-failover names its fault plan relative to itself: by name, from any
    folder, it loads as it does by its full path."""
    monkeypatch.chdir(tmp_path)
    by_name = load_study("sim-replicas-failover")
    by_path = load_study(study_file("sim-replicas-failover"))
    assert by_name == by_path


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
    assert defaults.precision is None
    # the search is on by default; refine: off (YAML reads it as false) or "off" keeps a sweep
    from infra.study.spec import Refine
    assert defaults.refine == Refine()
    assert study_from_dict(_study(refine=False)).refine is None
    assert study_from_dict(_study(refine="off")).refine is None
    assert study_from_dict(_study(refine=True)).refine == Refine()
    # bursts keep their listed loads unless refine: is given
    bursts = {"kind": "rate", "steps": [2], "arrival": "bursts",
              "burst": {"peak_rps": 30, "spike_s": 5, "count": 1, "first_spike_s": 10}}
    assert study_from_dict(_study(load=bursts)).refine is None


def test_every_key_left_out_takes_its_one_declared_default() -> None:
    """Each default is read from its declaration (study_keys), and a study that leaves the key
    out (its section given empty) gets that value: no default is written a second time."""
    spec = study_from_dict(_study(load={"kind": "rate", "auto": {"start": 1}}, slo={},
                                  stop_when={}, precision={}, refine={}, workload={},
                                  endpoint={}))
    where = {"": spec, "configurations[]": spec.configurations[0], "load": spec.load,
             "load.auto": spec.load.auto, "workload": spec.workload, "slo": spec.slo,
             "stop_when": spec.stop_when, "precision": spec.precision, "refine": spec.refine}
    checked = 0
    for key in study_keys():
        if key.spec.required or key.spec.kind in STRUCTURED or (
                key.section, key.name) in (("", "step_duration_s"), ("configurations[]", "args")):
            continue  # required; read by its own parser; precision: sets the step's length
        if key.run_option:
            value = spec.run.study_section(RUN_SECTIONS[key.section])[key.name]
        else:
            value = getattr(where[key.section], key.name)
        assert value == key.default, (key.section, key.name, value, key.default)
        checked += 1
    assert checked >= 50
    assert spec.step_duration_s == spec.precision.min_s == default_of(Precision, "min_s")
    # the declaration is the default a dataclass built in code gets too
    assert Precision().min_e2e_multiple == MIN_E2E_MULTIPLE == default_of(
        Precision, "min_e2e_multiple")


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
        ({"refine": "sometimes"}, "refine: expected off (a plain sweep), on, or a mapping"),
        ({"refine": 3}, "refine: expected off"),
        ({"refine": {"method": "golden"}}, "refine.method: 'golden' is not one of"),
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


def test_a_load_the_generator_bent_in_the_bracket_is_measured_beside_not_given_up() -> None:
    """A study on a loaded machine: 44 users failed only because the generator was starved,
    so 34..54 stays the bracket. Its middle is 44, already measured: the search measured
    nothing more and said the bracket was "as fine as loads go". Now it measures beside it."""
    import pandas as pd

    from infra.study.runner import next_refinement

    points = pd.DataFrame({"offered_load": [20.0, 34.0, 44.0, 54.0],
                           "sustainable": [True, True, False, False],
                           "validity": ["valid", "valid", "generator_limited", "valid"]})
    bracket = pd.Series({"max_sustainable_load": 34.0, "max_load_lo": 34.0,
                         "max_load_hi": 54.0, "knee_load": float("nan")})
    load, why = next_refinement(points, bracket, 0.05, "concurrency")
    assert load == 39.0 and "beside 44, bent by the generator" in why, why
    points.loc[4] = [39.0, True, "valid"]
    bracket["max_sustainable_load"] = bracket["max_load_lo"] = 39.0
    load, why = next_refinement(points, bracket, 0.05, "concurrency")
    assert load == 46.0 and "bisect 39..54" in why, why



def test_a_load_only_the_generator_failed_above_the_best_is_searched_below_not_given_up() -> None:
    """A study in a busy CI run: 54 users failed only because the worker was starved, and no
    load failed on the server's account. The search said "nothing to bisect" and kept 34+ as
    seqs-20's limit; it now measures between them, where the generator has less to do."""
    import pandas as pd

    from infra.study.runner import next_refinement

    points = pd.DataFrame({"offered_load": [20.0, 34.0, 54.0],
                           "sustainable": [True, True, False],
                           "validity": ["valid", "valid", "generator_limited"]})
    above = pd.Series({"max_sustainable_load": 34.0, "max_load_lo": 34.0,
                       "max_load_hi": float("inf"), "knee_load": float("nan")})
    load, why = next_refinement(points, above, 0.05, "concurrency")
    assert load == 44.0 and "the generator failed at 54: measure 34..54" in why, why
    # 44 held: the search goes on towards 54, then stops where whole users leave no load
    points.loc[3] = [44.0, True, "valid"]
    above["max_sustainable_load"] = above["max_load_lo"] = 44.0
    assert next_refinement(points, above, 0.05, "concurrency")[0] == 49.0
    points.loc[4], points.loc[5] = [49.0, True, "valid"], [53.0, False, "generator_limited"]
    above["max_sustainable_load"] = above["max_load_lo"] = 49.0
    assert next_refinement(points, above, 0.05, "concurrency")[0] == 51.0
    points.loc[6], points.loc[7] = [51.0, True, "valid"], [52.0, True, "valid"]
    above["max_sustainable_load"] = above["max_load_lo"] = 52.0
    load, why = next_refinement(points, above, 0.05, "concurrency")
    assert load is None and "nothing to bisect" in why, why

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
    # the search and repeats go before step length (tests/test_infra_study_plan.py)
    assert notes[0].startswith("refine.max_steps 4 -> 0") and notes[1] == "repeats 3 -> 2"
    assert fitted.precision == spec.precision


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
    fitted, budget, lines = fit_to_budget(RunConfig(study_budget=6 * 60), spec)
    assert budget == 360 and total_seconds(fitted) <= 360 < total_seconds(spec)
    assert lines[0] == ("budget 6 min: the study as written needs about 23.1 min; given up, "
                        "least needed first:")
    assert "  - repeats 3 -> 2" in lines and "interval" in lines[-1]
    assert fit_to_budget(RunConfig(), spec) == (spec, 0.0, [])
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


@pytest.mark.parametrize(("value", "named"), [
    (-1, "gpu_hour_usd: must be > 0, got -1"),
    ("2.49$", "gpu_hour_usd: expected a number, got '2.49$'"),
])
def test_the_gpu_hour_price_is_a_positive_number(value: object, named: str) -> None:
    assert study_from_dict(_study(gpu_hour_usd=2.49)).gpu_hour_usd == 2.49
    assert study_from_dict(_study()).gpu_hour_usd is None
    with pytest.raises(StudySpecError) as error:
        study_from_dict(_study(gpu_hour_usd=value))
    assert str(error.value) == named


def test_a_sweep_stopped_at_a_load_the_generator_bent_says_whose_it_was() -> None:
    import pandas as pd

    from infra.study.runner import over_saturated

    spec = study_from_dict(_study(slo={"ttft_p95_ms": 500}, stop_when={"latency_growth": 5}))
    low = pd.Series({"error_rate": 0.0, "ttft_p95_s": 0.1, "validity": "valid"})
    high = pd.Series({"error_rate": 0.0, "ttft_p95_s": 0.9, "validity": "valid"})
    assert over_saturated(high, [low], spec) == "ttft_p95_s 900 ms > 5 x the lowest (100 ms)"
    bent = over_saturated(high.replace("valid", "generator_limited"), [low], spec)
    assert bent == ("the generator's, not the server's: ttft_p95_s 900 ms > 5 x the lowest "
                    "(100 ms)")
