"""Task workloads (agents): an OpenTelemetry export of an agent run, the JSON tasks format and the
synthetic spec become calls in a graph, through `swarmload workload build --tasks` as a user
runs it; bad inputs are named in one line."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_workloads_synth import trained_tokenizer  # noqa: F401 (a fixture)

from workloads.builtin_mix import call_messages
from workloads.cli import main
from workloads.schema import read_workload
from workloads.synth import WordCounter
from workloads.tasks import tasks_json

REPO_ROOT = Path(__file__).resolve().parent.parent
T0 = 1_760_000_000_000_000_000  # ns
PLANNER_SYSTEM = "You plan the research: split the question, then merge what comes back."
RESEARCHER_SYSTEM = json.dumps([{"type": "text", "content": (
    "You are a researcher. Search, read the results and answer in three short sentences.")}])
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def build(capsys: pytest.CaptureFixture[str]) -> Any:
    """`swarmload workload build ARGS` in this process (its main, as the command calls it)."""
    def run(*args: str) -> Done:
        code = main(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)
    return run


def test_the_swarmload_command_builds_tasks(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(otlp(agent_run_spans())))
    done = subprocess.run([sys.executable, "-m", "infra.cli", "workload", "build", "--tasks",
                           f"otel:{path}", "--tokenizer", "words", "--out", str(tmp_path / "w")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tasks 1, calls 8" in done.stdout and len(read_workload(tmp_path / "w")) == 8


def _span(sid: str, parent: str | None, name: str, start_ms: int, end_ms: int,
          **attrs: Any) -> dict[str, Any]:
    return {"traceId": TRACE, "spanId": sid, "parentSpanId": parent or "", "name": name,
            "kind": 1, "startTimeUnixNano": str(T0 + start_ms * 1_000_000),
            "endTimeUnixNano": str(T0 + end_ms * 1_000_000),
            "attributes": [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int)
                            else {"stringValue": v}} for k, v in attrs.items()]}


def agent_run_spans() -> list[dict[str, Any]]:
    """An agent run as an OpenTelemetry SDK exports it (GenAI conventions): the planner plans,
    three researchers run in parallel (each: a model call, a search tool, a model call), the
    planner joins their answers. Times in ms from the trace's start."""
    op, model = "gen_ai.operation.name", "gen_ai.request.model"
    inp, out = "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"
    spans = [
        _span("a000000000000001", None, "invoke_agent planner", 0, 7200,
              **{op: "invoke_agent", "gen_ai.agent.name": "planner",
                 "gen_ai.system_instructions": PLANNER_SYSTEM}),
        _span("a000000000000002", "a000000000000001", "create_agent researcher", 20, 30,
              **{op: "create_agent", "gen_ai.agent.name": "researcher"}),
        _span("a000000000000003", "a000000000000001", "chat m", 100, 1100,
              **{op: "chat", model: "m", inp: 300, out: 80}),
        _span("a000000000000004", "a000000000000001", "GET /config", 1110, 1150),  # not GenAI
        _span("a000000000000005", "a000000000000001", "chat m", 6100, 7000,
              **{op: "chat", model: "m", inp: 900, out: 200}),
    ]
    for i in range(3):
        agent, a, tool, b = (f"b00000000000000{i}", f"c00000000000000{i}",
                             f"d00000000000000{i}", f"e00000000000000{i}")
        spans += [
            _span(agent, "a000000000000001", "invoke_agent researcher", 1200 + 10 * i,
                  5000 + 500 * i, **{op: "invoke_agent", "gen_ai.agent.name": "researcher",
                                     "gen_ai.system_instructions": RESEARCHER_SYSTEM}),
            _span(a, agent, "chat m", 1300 + 10 * i, 2000 + 100 * i,
                  **{op: "chat", model: "m", inp: 400, out: 40}),
            _span(tool, agent, "execute_tool search", 2050 + 100 * i, 3000 + 100 * i,
                  **{op: "execute_tool", "gen_ai.tool.name": "search"}),
            _span(b, agent, "chat m", 3100 + 100 * i, 4800 + 500 * i,
                  **{op: "chat", model: "m", inp: 500, out: 120}),
        ]
    return spans


def otlp(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agents"}}]},
        "scopeSpans": [{"scope": {"name": "agent-framework"}, "spans": spans}]}]}


def protobuf_json(spans: list[dict[str, Any]], proto_names: bool) -> dict[str, Any]:
    """The same request as OTLP protobuf messages written by protobuf's own JSON printer (ids
    base64, 64-bit integers as strings; ``proto_names``: snake_case field names)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for s in spans:
        span = scope.spans.add(
            trace_id=bytes.fromhex(s["traceId"]), span_id=bytes.fromhex(s["spanId"]),
            parent_span_id=bytes.fromhex(s["parentSpanId"]), name=s["name"],
            start_time_unix_nano=int(s["startTimeUnixNano"]),
            end_time_unix_nano=int(s["endTimeUnixNano"]))
        for a in s["attributes"]:
            value = span.attributes.add(key=a["key"]).value
            if "intValue" in a["value"]:
                value.int_value = int(a["value"]["intValue"])
            else:
                value.string_value = a["value"]["stringValue"]
    doc: dict[str, Any] = json.loads(json_format.MessageToJson(
        request, preserving_proto_field_name=proto_names))
    assert base64.b64decode(doc["resource_spans" if proto_names else "resourceSpans"][0][
        "scope_spans" if proto_names else "scopeSpans"][0]["spans"][0][
        "span_id" if proto_names else "spanId"]).hex() == spans[0]["spanId"]
    return doc


def flat_list(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A plain JSON list of spans, attributes a flat map, times as integers."""
    return [{**s, "startTimeUnixNano": int(s["startTimeUnixNano"]),
             "endTimeUnixNano": int(s["endTimeUnixNano"]),
             "attributes": {a["key"]: next(iter(a["value"].values())) for a in s["attributes"]}}
            for s in spans]


def sdk_console(spans: list[dict[str, Any]]) -> str:
    """As the Python SDK's console exporter prints them: each span's ``to_json()`` (indented, ids
    0x-hex, ISO 8601 times, a flat attribute map), one after another."""
    def iso(ns: str) -> str:
        seconds, rest = divmod(int(ns), 1_000_000_000)
        stamp = datetime.fromtimestamp(seconds, tz=UTC) + timedelta(microseconds=rest // 1000)
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    return "\n".join(json.dumps({
        "name": s["name"], "context": {"trace_id": f"0x{s['traceId']}",
                                       "span_id": f"0x{s['spanId']}"},
        "parent_id": f"0x{s['parentSpanId']}" if s["parentSpanId"] else None,
        "start_time": iso(s["startTimeUnixNano"]), "end_time": iso(s["endTimeUnixNano"]),
        "attributes": {a["key"]: next(iter(a["value"].values())) for a in s["attributes"]}},
        indent=4) for s in spans)


@pytest.mark.parametrize("shape", ["otlp", "otlp-lines", "protobuf-json", "protobuf-names",
                                   "list", "sdk"])
def test_an_opentelemetry_agent_run_becomes_its_calls_graph_and_delays(
        tmp_path: Path, shape: str, build: Any) -> None:
    spans = agent_run_spans()
    path = tmp_path / "trace.json"
    if shape == "otlp-lines":  # the collector's file exporter: one request a line
        path.write_text("\n".join(json.dumps(otlp([s])) for s in spans) + "\n")
    elif shape == "sdk":
        path.write_text(sdk_console(spans))
    else:
        doc = {"otlp": otlp, "list": flat_list,
               "protobuf-json": lambda s: protobuf_json(s, proto_names=False),
               "protobuf-names": lambda s: protobuf_json(s, proto_names=True)}[shape](spans)
        path.write_text(json.dumps(doc))
    done = build("--tasks", f"otel:{path}", "--tokenizer", "words", "--out", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    assert "tasks 1, calls 8" in done.stdout and "tool spans 3 (2.85 s)" in done.stdout
    frame = read_workload(tmp_path / "w")
    assert list(frame["turn"]) == list(range(8)) and frame["session_id"].nunique() == 1
    # calls in start order: the plan, the three researchers' first calls, their second, the join
    assert list(frame["agent"]) == ["planner", "researcher-1", "researcher-2", "researcher-3",
                                    "researcher-1", "researcher-2", "researcher-3", "planner"]
    # the join waits on the researchers' last calls, on the plan's conversation (its context)
    assert [list(d) for d in frame["depends_on"]] == [[], [0], [0], [0], [1], [2], [3],
                                                      [0, 4, 5, 6]]
    assert [None if c != c else int(c) for c in frame["context_turn"]] == [
        None, None, None, None, 1, 2, 3, 0]
    # delay: none for the task's first call, from the parent call's end (the sub-agents'
    # overhead), over the tool's span (the second calls), after the last researcher (the join)
    assert list(frame["think_time_s"]) == pytest.approx(
        [0.0, 0.2, 0.21, 0.22, 1.1, 1.1, 1.1, 0.3])
    assert list(frame["prompt_tokens"]) == [300, 400, 400, 400, 500, 500, 500, 900]
    assert list(frame["output_tokens"]) == [80, 40, 40, 40, 120, 120, 120, 200]
    # the agents' system instructions: their lengths, one synthesized text per instructions (a
    # prefix the researchers share), never the traced text
    assert list(frame["shared_tokens"]) == [12, 14, 14, 14, 14, 14, 14, 12]  # words
    systems = [json.loads(m)[0] for m in frame["messages"].iloc[:4]]
    assert [m["role"] for m in systems] == ["system"] * 4
    assert systems[1] == systems[2] == systems[3] != systems[0]
    assert "research" not in frame["messages"].str.cat()
    # the join's prompt: the plan's conversation, then the researchers' answers and its message
    answers = dict(zip(frame["turn"], frame["answer"], strict=True))
    own = json.loads(frame["messages"].iloc[7])
    plan = json.loads(frame["messages"].iloc[0]) + [{"role": "assistant", "content": answers[0]}]
    join = call_messages(plan, own, [answers[4], answers[5], answers[6]])
    assert WordCounter().count_chat(join) == 900
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    tasks = report["tasks"]
    assert tasks["fanout"]["counts"] == {"3": 1} and tasks["depth"]["counts"] == {"4": 1}
    assert tasks["calls_per_task"]["counts"] == {"8": 1} and tasks["fanin"]["max"] == 3
    assert tasks["prompts_logged"] == {"calls": 8, "exact": 8, "longer": 0, "shorter": 0,
                                       "max_off": 0}
    assert report["source"]["traces"] == 1 and report["source"]["models"] == ["m"]
    assert tasks["system_prompts"] == {"distinct": 2, "calls": 4}


def test_traced_prompt_lengths_are_exact_in_a_bpe_tokenizer_with_a_chat_template(
        tmp_path: Path, build: Any, trained_tokenizer: Path) -> None:  # noqa: F811
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(otlp(agent_run_spans())))
    done = build("--tasks", f"otel:{path}", "--tokenizer", str(trained_tokenizer), "--out",
                 str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    assert "logged prompts  8 of 8 exact" in done.stdout
    assert list(read_workload(tmp_path / "w")["prompt_tokens"]) == [
        300, 400, 400, 400, 500, 500, 500, 900]


def test_calls_outside_agents_follow_each_other_or_overlap_from_the_start(
        tmp_path: Path, build: Any) -> None:
    op, inp = "gen_ai.operation.name", "gen_ai.usage.input_tokens"
    out = "gen_ai.usage.output_tokens"
    spans = [_span("f000000000000001", None, "workflow", 0, 5000),
             _span("f000000000000002", "f000000000000001", "chat m", 100, 1000,
                   **{op: "chat", inp: 50, out: 10}),
             _span("f000000000000003", "f000000000000001", "chat m", 600, 1400,  # overlaps
                   **{op: "chat", inp: 50, out: 10}),
             _span("f000000000000004", "f000000000000001", "chat m", 1500, 2000,
                   **{op: "chat", inp: 200, out: 10})]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(otlp(spans)))
    done = build("--tasks", f"otel:{path}", "--tokenizer", "words", "--out", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    assert "1 calls that depend on nothing started after their task's first (0.5 s in all)" \
        in done.stdout
    frame = read_workload(tmp_path / "w")
    # no agent span: one agent, its calls in time order; the overlapping one waits on none
    # and goes as late after the task's start as it was traced
    assert list(frame["agent"]) == ["agent"] * 3
    assert [list(d) for d in frame["depends_on"]] == [[], [], [0, 1]]  # both had ended
    assert list(frame["context_turn"].fillna(-1)) == [-1, -1, 1]  # the last one ended
    assert list(frame["think_time_s"]) == pytest.approx([0, 0.5, 0.1])


def _write_spans(tmp_path: Path, spans: list[dict[str, Any]]) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(otlp(spans)))
    return f"otel:{path}"


def _one_line_error(build: Any, source: str, tmp_path: Path) -> str:
    done = build("--tasks", source, "--tokenizer", "words", "--out", str(tmp_path / "w"))
    assert done.returncode == 2 and not (tmp_path / "w").exists()
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def test_bad_traces_are_named_in_one_line(tmp_path: Path, build: Any) -> None:
    spans = agent_run_spans()
    orphan = [*spans[:2], {**spans[2], "parentSpanId": "ffffffffffffffff"}, *spans[3:]]
    err = _one_line_error(build, _write_spans(tmp_path, orphan), tmp_path)
    assert "span a000000000000003 (chat m) has parent ffffffffffffffff, which is not in the " \
           "trace" in err
    cycle = [{**spans[0], "parentSpanId": "c000000000000000"}, *spans[1:]]
    err = _one_line_error(build, _write_spans(tmp_path, cycle), tmp_path)
    assert "parents form a cycle" in err and "a000000000000001" in err
    no_tokens = [*spans[:2], {**spans[2], "attributes": spans[2]["attributes"][:3]}, *spans[3:]]
    err = _one_line_error(build, _write_spans(tmp_path, no_tokens), tmp_path)
    assert f"trace {TRACE}: span a000000000000003 (chat m): gen_ai.usage.output_tokens: " \
           "missing" in err
    err = _one_line_error(build, _write_spans(tmp_path, spans[:2]), tmp_path)
    assert "no trace holds a model call" in err
    (tmp_path / "junk.json").write_text("{not json\n")
    err = _one_line_error(build, f"otel:{tmp_path / 'junk.json'}", tmp_path)
    assert "line 1: not JSON" in err
    err = _one_line_error(build, "jaeger:x", tmp_path)
    assert "KIND one of ['synthetic', 'otel', 'json']" in err


TASKS = {"tasks": [
    {"id": "review", "system_prompt_tokens": 30, "start_s": 0.0, "calls": [
        {"id": "join", "agent": "lead", "depends_on": ["style", "tests"], "context": "plan",
         "user_tokens": 12, "output_tokens": 50, "delay_s": 0.25},
        {"id": "plan", "agent": "lead", "user_tokens": 40, "output_tokens": 20},
        {"id": "style", "agent": "linter", "depends_on": ["plan"], "prompt_tokens": 90,
         "output_tokens": 30, "delay_s": 0.1},
        {"id": "tests", "agent": "tester", "depends_on": ["plan"], "user_tokens": 25,
         "output_tokens": 35, "tool_time_s": 1.5, "tool_result_tokens": 16,
         "system_prompt_tokens": 0}]},
    {"id": "lone", "start_s": 2.5, "calls": [{"id": "q", "prompt_tokens": 64,
                                               "output_tokens": 8, "delay_s": 0.4}]},
]}


def test_json_tasks_build_as_written_and_round_trip(tmp_path: Path, build: Any) -> None:
    src = tmp_path / "tasks.json"
    src.write_text(json.dumps(TASKS))
    done = build("--tasks", f"json:{src}", "--tokenizer", "words", "--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    frame = read_workload(tmp_path / "a")
    review = frame[frame["session_id"] == "review"]
    # calls ordered so each follows its dependencies (file order where free)
    assert list(review["agent"]) == ["lead", "linter", "tester", "lead"]
    assert [list(d) for d in review["depends_on"]] == [[], [0], [0], [0, 1, 2]]  # + context
    assert list(review["context_turn"].fillna(-1)) == [-1, -1, -1, 0]
    assert list(review["think_time_s"]) == [0, 0.1, 0, 0.25]
    assert list(review["shared_tokens"]) == [30, 30, 0, 30]  # the join on the plan's context
    assert review["prompt_tokens"].iloc[1] == 90  # a whole prompt's length as given
    assert list(review["user_tokens"])[0::2] == [40, 25]
    assert review["tool_time_s"].iloc[2] == 1.5 and review["tools"].iloc[2]
    assert list(frame["trace_offset_s"].dropna()) == [0.0, 2.5]
    # a call that depends on nothing keeps its delay: sent that long after its task's start
    assert frame.loc[frame["session_id"] == "lone", "think_time_s"].tolist() == [0.4]
    # plan 30+40=70 tokens, answer 20; the join: that, the other answers (30, 35) and 12 words
    assert review["prompt_tokens"].iloc[3] == 70 + 20 + 30 + 35 + 12
    again = tasks_json(frame, WordCounter())
    (tmp_path / "again.json").write_text(json.dumps(again))
    done = build("--tasks", f"json:{tmp_path / 'again.json'}", "--tokenizer", "words",
                  "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr
    rebuilt = read_workload(tmp_path / "b")
    same = ["session_id", "turn", "agent", "prompt_tokens", "output_tokens", "think_time_s",
            "context_turn", "tool_time_s", "shared_tokens", "trace_offset_s"]
    assert rebuilt[same].equals(frame[same])
    assert [list(d) for d in rebuilt["depends_on"]] == [list(d) for d in frame["depends_on"]]
    assert tasks_json(rebuilt, WordCounter()) == again
    done = build("--tasks", f"json:{src}", "--n", "1", "--tokenizer", "words", "--out",
                 str(tmp_path / "c"))
    assert done.returncode == 0 and set(read_workload(tmp_path / "c")["session_id"]) == {"review"}


@pytest.mark.parametrize(("change", "words"), [
    (lambda t: t["calls"][0]["depends_on"].append("nope"),
     "call 'join': depends_on names 'nope', not a call of the task"),
    (lambda t: t["calls"][1].update(depends_on=["join"]),
     "depends_on forms a cycle: 'join' -> 'style' -> 'plan' -> 'join'"),
    (lambda t: t["calls"][2].update(user_tokens=5),
     "call 'style': give exactly one of user_tokens, prompt_tokens"),
    (lambda t: t["calls"][2].pop("output_tokens"), "call 'style': output_tokens: missing"),
    (lambda t: t["calls"][2].update(delay_s=-1), "call 'style': delay_s=-1: expected a number"),
    (lambda t: t["calls"][2].update(context="tests"),
     "call 'style': context 'tests' is not a call it depends on"),
    (lambda t: t["calls"][2].update(colour="red"), "call #3: unknown key(s) ['colour']"),
])
def test_bad_json_tasks_name_the_task_call_and_key(tmp_path: Path, change: Any, words: str,
                                                   build: Any) -> None:
    doc = json.loads(json.dumps(TASKS))
    change(doc["tasks"][0])
    src = tmp_path / "tasks.json"
    src.write_text(json.dumps(doc))
    err = _one_line_error(build, f"json:{src}", tmp_path)
    assert f"json:{src}: task 'review'" in err and words in err


def test_synthetic_tasks_follow_their_distributions(tmp_path: Path, build: Any) -> None:
    done = build("--tasks", "synthetic:tasks=60,fanout=3..5,steps=2,system_tokens=40,groups=2,"
                  "plan_tokens=30,plan_output_tokens=10,sub_tokens=20,sub_output_tokens=15,"
                  "tool_s=0.5..1.5,tool_result_tokens=8,join_tokens=6,join_output_tokens=12,think_s=0.25",
                  "--tokenizer", "words", "--out", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    assert "tasks 60" in done.stdout and "fan-out" in done.stdout
    frame = read_workload(tmp_path / "w")
    report = json.loads((tmp_path / "w" / "report.json").read_text())["tasks"]
    fanout = report["fanout"]["counts"]
    assert set(fanout) == {"3", "4", "5"} and min(fanout.values()) >= 10  # each about 20
    assert report["depth"]["counts"] == {"4": 60}  # plan, a sub-agent's two calls, join
    for _, rows in frame.groupby("session_id"):
        deps = [list(d) for d in rows["depends_on"]]
        n = (len(rows) - 2) // 2
        assert deps[0] == [] and deps[-1] == [0] + [2 + 2 * i for i in range(n)]
        assert all(d == [0] for d in deps[1:-1:2]) and all(
            d == [k] for k, d in zip(range(1, 2 * n, 2), deps[2:-1:2], strict=True))
    second = frame[frame["context_turn"].notna() & (frame["agent"] != "planner")]
    assert second["think_time_s"].between(0.75, 1.75).all()  # the tool's time, the agent's
    roots = frame["depends_on"].map(len) == 0
    assert (frame.loc[roots, "think_time_s"] == 0).all()  # the planner starts the task
    assert (frame.loc[~roots & frame["context_turn"].isna(), "think_time_s"] == 0.25).all()
    assert (second["user_tokens"] == 8).all() and (second["output_tokens"] == 15).all()
    first = frame[frame["context_turn"].isna()]
    systems = {json.loads(m)[0]["content"] for m in first["messages"]}
    assert len(systems) == 2 and (frame["shared_tokens"] == 40).all()  # two groups
    assert (first[first["agent"] == "planner"]["prompt_tokens"] == 70).all()
    assert (first[first["agent"] != "planner"]["prompt_tokens"] == 40 + 10 + 20).all()


def test_synthetic_depth_nests_sub_agents(tmp_path: Path, build: Any) -> None:
    done = build("--tasks", "synthetic:tasks=2,fanout=2,depth=2,steps=1", "--tokenizer",
                  "words", "--out", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr
    frame = read_workload(tmp_path / "w")
    rows = frame[frame["session_id"] == "t000000"]
    # planner, worker-1 plans, its two leaves, worker-1 joins, the same for worker-2, the join
    assert list(rows["agent"]) == ["planner", "worker-1", "worker-1-1", "worker-1-2", "worker-1",
                                   "worker-2", "worker-2-1", "worker-2-2", "worker-2", "planner"]
    assert [list(d) for d in rows["depends_on"]] == [[], [0], [1], [1], [1, 2, 3], [0], [5], [5],
                                                     [5, 6, 7], [0, 4, 8]]
    report = json.loads((tmp_path / "w" / "report.json").read_text())["tasks"]
    assert report["depth"]["counts"] == {"5": 2} and report["fanout"]["counts"] == {"2": 2}


@pytest.mark.parametrize(("spec", "words"), [
    ("fanout=x", "fanout='x'"), ("tasks=0", "tasks=0"), ("colour=red", "'colour=red'"),
    ("fanout=exp:3", "fanout=exp:3: expected N or A..B"),
    ("fanout=16,depth=4", "over 4096"),
])
def test_bad_synthetic_task_specs_name_the_key(tmp_path: Path, spec: str, words: str,
                                               build: Any) -> None:
    assert words in _one_line_error(build, f"synthetic:{spec}", tmp_path)


def _traces(count: int) -> list[dict[str, Any]]:
    """``count`` runs of :func:`agent_run_spans`, each its own trace, 0.4 s apart."""
    spans = []
    for t in range(count):
        shift = t * 400 * 1_000_000
        spans += [{**s, "traceId": f"{t + 1:032x}",
                   "startTimeUnixNano": str(int(s["startTimeUnixNano"]) + shift),
                   "endTimeUnixNano": str(int(s["endTimeUnixNano"]) + shift)}
                  for s in agent_run_spans()]
    return spans


@pytest.mark.slow
def test_an_opentelemetry_trace_replays_on_the_simulator_as_traced(tmp_path: Path,
                                                                    build: Any) -> None:
    from collectors.run_folder import load_requests
    from dashboards.analysis.tasks import per_call

    path = tmp_path / "traces.json"
    path.write_text(json.dumps(otlp(_traces(6))))
    wl = tmp_path / "wl"
    done = build("--tasks", f"otel:{path}", "--tokenizer", "words", "--arrivals",
                 "trace:time_scale=1", "--out", str(wl))
    assert done.returncode == 0, done.stderr
    assert list(read_workload(wl)["trace_offset_s"].dropna()) == pytest.approx(
        [0.4 * t for t in range(6)])
    run = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--target", "sim", "--workers", "2",
         "--workload", str(wl), "--duration", "4", "--drain", "30",
         "--results", str(tmp_path / "results"), "--no-collectors"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (folder,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    records = load_requests(folder)
    assert set(records["outcome"]) == {"ok"} and records["request_id"].is_unique
    calls = per_call(records)
    assert calls["session_id"].nunique() == 6  # every trace replayed once
    for _, task in calls.groupby("session_id"):
        task = task.sort_values("turn").reset_index(drop=True)
        # every call recorded once, its dependencies and agent as in the trace
        assert list(task["turn"]) == list(range(8))
        assert [list(d) for d in task["depends_on"]] == [[], [0], [0], [0], [1], [2], [3],
                                                         [0, 4, 5, 6]]
        assert list(task["agent"]) == ["planner", "researcher-1", "researcher-2",
                                       "researcher-3", "researcher-1", "researcher-2",
                                       "researcher-3", "planner"]
        # the fan-out: the three researchers in flight at once, after the plan's answer
        first = task.loc[1:3]
        assert first["sent_ns"].max() < first["end_ns"].min()
        assert (first["sent_ns"] >= task.loc[0, "end_ns"]).all()
        # no call sent before its dependencies' last byte plus the traced delay (1 ms: clocks)
        think = [0.0, 0.2, 0.21, 0.22, 1.1, 1.1, 1.1, 0.3]
        for k in range(1, 8):
            ends = max(task.loc[d, "end_ns"] for d in task.loc[k, "depends_on"])
            assert task.loc[k, "sent_ns"] >= ends + think[k] * 1e9 - 1e6, k
