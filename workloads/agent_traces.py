"""OpenTelemetry traces of an agent framework as task calls (``--tasks otel:PATH``).

Reads an export of spans: OTLP JSON (``resourceSpans[].scopeSpans[].spans[]``, camelCase or
protobuf's snake_case JSON, ids hex or base64, times as integers or strings of nanoseconds), the
collector's file exporter (one such document a line), or a JSON list of spans (attributes as
OTLP key/value pairs or a flat map; the SDK's ``to_json`` with ``context``, ``parent_id`` and ISO
8601 times). Spans follow the GenAI semantic conventions: ``gen_ai.operation.name`` (``chat``,
``text_completion``, ``generate_content``: a model call; ``invoke_agent``; ``execute_tool``;
or the span name's first word), ``gen_ai.agent.name``, ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens`` (or the older ``prompt_tokens``, ``completion_tokens``).

One trace is one task (:func:`otel_task` says how its graph is found), one model-call span one
:class:`TracedCall`; ``workloads.tasks`` turns them into workload rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from workloads.build import _session_hasher
from workloads.errors import WorkloadError


class TraceError(WorkloadError):
    """A trace export that cannot be read as tasks: names the file, trace, span and key."""


@dataclass
class TracedCall:
    """One model call of a trace, in its task's call order."""

    task: str  # the trace id, anonymized
    agent: str
    depends_on: list[int]
    context: int | None
    delay_s: float
    input_tokens: int
    output_tokens: int
    span_number: int  # the span's place in the file (1-based)
    system: str | None = None  # its system instructions where the trace holds them (counted
    # and compared here, never stored: the workload's system prompt is synthesized to length)


OP = "gen_ai.operation.name"
MODEL_OPERATIONS = ("chat", "text_completion", "generate_content")
AGENT_OPERATION = "invoke_agent"
TOOL_OPERATION = "execute_tool"
KNOWN_OPERATIONS = (*MODEL_OPERATIONS, AGENT_OPERATION, TOOL_OPERATION, "create_agent",
                    "invoke_workflow", "embeddings")
INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")  # current, before
OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
AGENT_NAME = ("gen_ai.agent.name", "gen_ai.agent.id")
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"  # opt-in content: parts, or text
INPUT_MESSAGES = "gen_ai.input.messages"  # opt-in content: [{"role", "parts"}]
_ZERO_ID = re.compile(r"^(0x)?0*$")


@dataclass
class Span:
    trace: str
    id: str
    parent: str | None
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    number: int  # its place in the file (1-based), for messages

    @property
    def op(self) -> str:
        op = self.attrs.get(OP)
        if op is None:  # the span name is "{operation} {model|agent|tool}" by the conventions
            first = self.name.split(" ", 1)[0]
            op = first if first in KNOWN_OPERATIONS else ""
        return str(op)

    def label(self) -> str:
        return f"span {self.id} ({self.name})"


def _get(obj: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in obj:
            return obj[key]
    return None


def _attr_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    for key in ("stringValue", "string_value", "boolValue", "bool_value", "doubleValue",
                "double_value", "bytesValue", "bytes_value"):
        if key in value:
            return value[key]
    for key in ("intValue", "int_value"):
        if key in value:
            try:
                return int(value[key])
            except (TypeError, ValueError):
                return value[key]  # left for the reader of the attribute to name
    arr = _get(value, "arrayValue", "array_value")
    if isinstance(arr, dict):
        return [_attr_value(v) for v in arr.get("values", [])]
    return None


def _attributes(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):  # a flat map (the SDK's to_json, plain span lists)
        return {str(k): _attr_value(v) for k, v in raw.items()}
    if isinstance(raw, list):  # OTLP: [{"key": ..., "value": {"stringValue": ...}}]
        return {str(a["key"]): _attr_value(a.get("value")) for a in raw
                if isinstance(a, dict) and "key" in a}
    return {}


def _text_of(value: Any) -> str | None:
    """The text of a content attribute: a string, a JSON array of parts
    (``[{"type": "text", "content": ...}]``), or such an array written as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return value or None
        if isinstance(value, str):
            return value or None
    if isinstance(value, list):
        texts = [str(p.get("content") or "") if isinstance(p, dict) else str(p) for p in value
                 if not isinstance(p, dict) or p.get("type", "text") == "text"]
        return "\n".join(texts) or None
    return None


def system_text(span: Span, agent_span: Span | None) -> str | None:
    """A call's system instructions: its span's ``gen_ai.system_instructions``, else the system
    messages of its ``gen_ai.input.messages``, else its agent invocation's instructions."""
    text = _text_of(span.attrs.get(SYSTEM_INSTRUCTIONS))
    if text is None and span.attrs.get(INPUT_MESSAGES) is not None:
        messages = span.attrs[INPUT_MESSAGES]
        try:
            messages = json.loads(messages) if isinstance(messages, str) else messages
        except json.JSONDecodeError:
            messages = None
        if isinstance(messages, list):
            parts = [_text_of(m.get("parts", m.get("content"))) for m in messages
                     if isinstance(m, dict) and m.get("role") == "system"]
            text = "\n".join(p for p in parts if p) or None
    if text is None and agent_span is not None:
        text = _text_of(agent_span.attrs.get(SYSTEM_INSTRUCTIONS))
    return text


def _time_ns(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000


def _raw_spans(doc: Any) -> Iterator[dict[str, Any]]:
    """The span objects of an OTLP JSON document (camelCase or snake_case), an SDK export, or a
    list of spans."""
    if isinstance(doc, list):
        for item in doc:
            yield from _raw_spans(item)
        return
    if not isinstance(doc, dict):
        return
    resource_spans = _get(doc, "resourceSpans", "resource_spans")
    if isinstance(resource_spans, list):
        for rs in (r for r in resource_spans if isinstance(r, dict)):
            scopes = _get(rs, "scopeSpans", "scope_spans", "instrumentationLibrarySpans",
                          "instrumentation_library_spans") or []
            for scope in (c for c in scopes if isinstance(c, dict)):
                yield from (s for s in scope.get("spans") or [] if isinstance(s, dict))
        return
    if isinstance(doc.get("spans"), list):
        yield from _raw_spans(doc["spans"])
        return
    if _get(doc, "spanId", "span_id", "context") is not None:
        yield doc


def _documents(text: str, where: str) -> list[Any]:
    """The JSON documents of ``text``: one, or several one after another (JSON lines, or the
    SDK console exporter's indented spans)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return docs
        try:
            doc, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: line {exc.lineno}: not JSON ({exc.msg})") from None
        docs.append(doc)


def read_otel_spans(path: str | Path, where: str) -> list[Span]:
    """The spans of an export: one JSON document or several one after another (the collector's
    file exporter writes one a line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{where}: cannot read: {exc.strerror or exc}") from None
    docs = _documents(text, where)
    spans: list[Span] = []
    for raw in _raw_spans(docs):
        n = len(spans) + 1
        context: dict[str, Any] = raw["context"] if isinstance(raw.get("context"), dict) else {}
        trace = _get(raw, "traceId", "trace_id") or _get(context, "trace_id", "traceId")
        sid = _get(raw, "spanId", "span_id") or _get(context, "span_id", "spanId")
        parent = _get(raw, "parentSpanId", "parent_span_id", "parent_id", "parentId")
        name = str(raw.get("name") or "")
        start = _time_ns(_get(raw, "startTimeUnixNano", "start_time_unix_nano", "start_time"))
        end = _time_ns(_get(raw, "endTimeUnixNano", "end_time_unix_nano", "end_time"))
        for key, value in (("traceId", trace), ("spanId", sid), ("startTimeUnixNano", start),
                           ("endTimeUnixNano", end)):
            if value in (None, ""):
                raise TraceError(f"{where}: span #{n} ({name}): {key}: missing or unreadable")
        assert start is not None and end is not None
        if end < start:
            raise TraceError(f"{where}: trace {trace}: span {sid} ({name}) ends before it "
                                  "starts")
        spans.append(Span(
            trace=str(trace), id=str(sid), number=n, name=name, start_ns=start, end_ns=end,
            parent=None if parent is None or _ZERO_ID.match(str(parent)) else str(parent),
            attrs=_attributes(raw.get("attributes"))))
    if not spans:
        raise TraceError(f"{where}: no spans (expected OTLP JSON: resourceSpans[]."
                              "scopeSpans[].spans[], or a JSON list of spans)")
    return spans


@dataclass
class _Agent:
    """One agent invocation (an ``invoke_agent`` span; the trace itself for calls outside any)."""

    span: Span | None
    parent: _Agent | None
    start_ns: int
    end_ns: int
    calls: list[int] = field(default_factory=list)  # indices into the task's call spans
    children: list[_Agent] = field(default_factory=list)


def _tokens(span: Span, names: Sequence[str], where: str) -> int:
    for name in names:
        value = span.attrs.get(name)
        if value is not None:
            try:
                return max(1, int(value))
            except (TypeError, ValueError):
                break
    raise TraceError(f"{where}: {span.label()}: {names[0]}: missing or not a number")


def _check_tree(spans: list[Span], where: str) -> dict[str, Span]:
    """The trace's spans by id; a missing parent, a repeated id or a cycle of parents is named."""
    by_id: dict[str, Span] = {}
    for s in spans:
        if s.id in by_id:
            raise TraceError(f"{where}: span id {s.id} appears twice")
        by_id[s.id] = s
    for s in spans:
        if s.parent is not None and s.parent not in by_id:
            raise TraceError(f"{where}: {s.label()} has parent {s.parent}, which is not in "
                                  "the trace (a span with no parent: export the whole trace)")
    for s in spans:
        path, cur = [s.id], s
        while cur.parent is not None:
            if cur.parent in path:
                loop = path[path.index(cur.parent):] + [cur.parent]
                raise TraceError(f"{where}: parents form a cycle: " + " -> ".join(loop))
            path.append(cur.parent)
            cur = by_id[cur.parent]
    return by_id


def otel_task(spans: list[Span], task: str, where: str
              ) -> tuple[list[TracedCall], dict[str, Any]]:
    """One trace's calls (model-call spans in start order) and its figures (tool spans' time).

    The graph: a model-call span belongs to the agent of its nearest ``invoke_agent`` ancestor
    (the trace itself if none). A call depends on what its agent has done by its start: its
    agent's calls that had ended (the last of a chain; calls that overlapped, each), and the
    last calls of the sub-agents (invocations below it) that had ended; an agent that has done
    nothing yet takes its invoker's state when it was invoked (so a sub-agent's first call
    depends on the parent's call that spawned it). Implied dependencies are dropped, but for
    ``context_turn``: the agent's previous call (the last to end by then), always among them.
    Delay: start minus the last dependency's end (tool spans' time included). The task starts
    with its first call; a later call that depends on nothing waits its delay from that start
    (the load generator sends it then): ``figures`` counts such calls and their delays
    (``late_roots``, ``late_roots_s``). An ``invoke_agent`` span that carries
    token counts and holds no model-call span is one call (a remote agent).
    """
    _check_tree(spans, where)
    kids: dict[str | None, list[Span]] = {}
    for s in spans:
        kids.setdefault(s.parent, []).append(s)
    for group in kids.values():
        group.sort(key=lambda s: (s.start_ns, s.end_ns, s.number))
    t0 = min(s.start_ns for s in spans)
    root = _Agent(None, None, t0, max(s.end_ns for s in spans))
    call_spans: list[Span] = []
    agent_of: list[_Agent] = []

    def has_call(s: Span) -> bool:
        return s.op in MODEL_OPERATIONS or any(has_call(k) for k in kids.get(s.id, []))

    def walk(s: Span, agent: _Agent) -> None:
        if s.op == AGENT_OPERATION:
            sub = _Agent(s, agent, s.start_ns, s.end_ns)
            agent.children.append(sub)
            agent = sub
            if not any(has_call(k) for k in kids.get(s.id, [])) and any(
                    n in s.attrs for n in INPUT_TOKENS):
                call_spans.append(s)
                agent_of.append(agent)
        elif s.op in MODEL_OPERATIONS:
            call_spans.append(s)
            agent_of.append(agent)
        for k in kids.get(s.id, []):
            walk(k, agent)

    for top in kids.get(None, []):
        walk(top, root)
    tools = [s for s in spans if s.op == TOOL_OPERATION]
    figures: dict[str, Any] = {
        "start_ns": min((s.start_ns for s in call_spans), default=0), "tool_spans": len(tools),
        "late_roots": 0, "late_roots_s": 0.0,
        "tool_s": sum(s.end_ns - s.start_ns for s in tools) / 1e9,
        "models": sorted({str(s.attrs["gen_ai.request.model"]) for s in call_spans
                          if "gen_ai.request.model" in s.attrs})}
    if not call_spans:
        return [], figures
    order = sorted(range(len(call_spans)), key=lambda i: (
        call_spans[i].start_ns, call_spans[i].end_ns, call_spans[i].number))
    index = {i: k for k, i in enumerate(order)}
    spans_in = [call_spans[i] for i in order]
    for i in order:
        agent_of[i].calls.append(index[i])

    def last_own(agent: _Agent, t: int, before: int | None = None) -> set[int]:
        own = [c for c in agent.calls if spans_in[c].end_ns <= t
               and (before is None or c < before)]
        return {max(own, key=lambda c: (spans_in[c].end_ns, c))} if own else set()

    def state(agent: _Agent, t: int) -> set[int]:
        """The calls whose ends hold ``agent``'s work by ``t``: its calls that had ended and
        the states of its sub-agents that had ended (those implied by others dropped later)."""
        return {c for c in agent.calls if spans_in[c].end_ns <= t}.union(
            *(state(child, t) for child in agent.children if child.end_ns <= t))

    def done_by(agent: _Agent, t: int) -> set[int]:
        """``agent``'s state at ``t``; its invoker's at its invocation while it has none."""
        found = state(agent, t)
        if not found and agent.parent is not None:
            return done_by(agent.parent, agent.start_ns)
        return found

    ancestors: list[set[int]] = []
    calls: list[TracedCall] = []
    labels = _agent_labels([agent_of[i] for i in order], spans_in)
    start = spans_in[0].start_ns  # the task's start: its first call's
    for k, s in enumerate(spans_in):
        agent = agent_of[order[k]]
        deps = done_by(agent, s.start_ns)
        deps = {d for d in deps if not any(d in ancestors[e] for e in deps if e != d)}
        ancestors.append(set(deps).union(*(ancestors[d] for d in deps)))
        context = next(iter(last_own(agent, s.start_ns, before=k)), None)
        after = max((spans_in[d].end_ns for d in deps), default=start)
        if not deps and s.start_ns > start:
            figures["late_roots"] += 1
            figures["late_roots_s"] += (s.start_ns - start) / 1e9
        if context is not None:
            deps.add(context)
        calls.append(TracedCall(
            task=task, agent=labels[k], depends_on=sorted(deps), context=context,
            delay_s=round(max(0, s.start_ns - after) / 1e9, 6),
            input_tokens=_tokens(s, INPUT_TOKENS, where),
            output_tokens=_tokens(s, OUTPUT_TOKENS, where), span_number=s.number,
            system=system_text(s, agent.span)))
    return calls, figures


def _agent_labels(agents: list[_Agent], spans: list[Span]) -> list[str]:
    """Each call's agent: its invocation's ``gen_ai.agent.name`` (else the call's own, else
    "agent"), numbered "-1", "-2", ... in invocation order where one name is invoked more than
    once in the task."""
    def name(agent: _Agent, span: Span) -> str:
        for attrs in ((agent.span.attrs if agent.span else {}), span.attrs):
            for key in AGENT_NAME:
                if attrs.get(key):
                    return str(attrs[key])
        if agent.span is not None and agent.span.name.startswith(AGENT_OPERATION + " "):
            return agent.span.name[len(AGENT_OPERATION) + 1:]
        return "agent"

    names = [name(a, s) for a, s in zip(agents, spans, strict=True)]
    invocations: dict[str, list[int]] = {}
    for a, n in zip(agents, names, strict=True):
        seen = invocations.setdefault(n, [])
        if id(a) not in seen:
            seen.append(id(a))
    return [n if len(invocations[n]) == 1 else f"{n}-{invocations[n].index(id(a)) + 1}"
            for a, n in zip(agents, names, strict=True)]


def otel_tasks(path: str, where: str) -> tuple[list[list[TracedCall]], list[float | None],
                                               dict[str, Any]]:
    """The tasks of an OpenTelemetry export (one a trace, in start order), each task's start
    offset from the first, and the source figures."""
    spans = read_otel_spans(path, where)
    by_trace: dict[str, list[Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace, []).append(s)
    anonymize = _session_hasher(path)
    built: list[tuple[int, list[TracedCall]]] = []
    without, models = 0, set()
    sums = dict.fromkeys(("tool_spans", "tool_s", "late_roots", "late_roots_s"), 0.0)
    for trace, trace_spans in by_trace.items():
        calls, figures = otel_task(trace_spans, str(anonymize(trace)), f"{where}: trace {trace}")
        for key in sums:
            sums[key] += figures[key]
        models |= set(figures["models"])
        if not calls:
            without += 1
            continue
        built.append((figures["start_ns"], calls))
    if not built:
        raise TraceError(f"{where}: no trace holds a model call (spans with "
                         f"{OP} one of {list(MODEL_OPERATIONS)})")
    built.sort(key=lambda b: b[0])
    first = built[0][0]
    source = {"spans": len(spans), "traces": len(by_trace), "traces_without_calls": without,
              **{k: round(v, 6) if k.endswith("_s") else int(v) for k, v in sums.items()},
              "models": sorted(models)}
    return [c for _, c in built], [(t - first) / 1e9 for t, _ in built], source
