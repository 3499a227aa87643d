"""Session workloads: multi-turn conversations and tool-call loops, as rows of the workload format.

A session is an ordered list of turns (``workloads.schema``: ``turn``, ``think_time_s``,
``user_tokens``, ``answer``, ``tools``, ``tool_time_s``, ``shared_tokens``). Each turn's
``messages`` holds only what the turn adds (its user message; turn 0 also the system prompt):
the load generator keeps the history, growing it by the server's real answer, or by the logged
``answer`` under ``history: logged`` (AIPerf calls these "deltas with live responses" and
"deltas with logged responses").

Sources (``swarmload workload build --sessions``):

- ``synthetic:KEY=VALUE,...`` (:class:`SessionSpec`): turns per session, a system prompt shared by
  all sessions or by groups of them, user-message, output and think-time distributions, tools;
- ``sharegpt`` conversations as shipped: every user turn followed by a reply is a turn, the reply
  its logged answer (and output length);
- ``mooncake``: the trace has no session ids, so conversations are inferred from ``hash_ids``:
  a request continues the conversation whose last request's full blocks (all its ids but the
  last, partial one) open its own ids. Turn 0 is synthesized from its blocks, so blocks that
  several conversations share are exactly shared text; a later turn's user message is what its
  input adds beyond the previous prompt and answer (at least one token);
- ``generic`` logs with a session column (``session_id=``) and a turn order (``turn=``; file
  order when absent).

Think time from a timed log is the gap between a turn's arrival and the previous turn's (it
includes the logged server latency: the replay waits at least as long as the users did).

Distributions (``SessionSpec`` values): ``N`` (fixed), ``A..B`` (uniform), ``exp:M``
(exponential of mean M), ``lognormal:M:S`` (median M, sigma S).
"""

from __future__ import annotations

import json
import math
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from workloads.buckets import BucketSpec
from workloads.build import _session_hasher
from workloads.errors import WorkloadError
from workloads.readers import parse_source, read_log
from workloads.schema import workload_table
from workloads.scrub import Scrubber
from workloads.synth import PromptSynthesizer, TokenCounter

SYNTHETIC_KIND = "synthetic"
_DIGITS_AS_LETTERS = str.maketrans("0123456789", "abcdefghij")

# The tool offered by synthetic tool turns: its one argument is an enum, so even a random-weight
# model constrained to the schema (tool_choice "required") emits a short, well-formed call.
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a topic up in the knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {"topic": {"type": "string", "enum": ["alpha", "beta", "gamma"]}},
            "required": ["topic"],
        },
    },
}


class SessionSpecError(WorkloadError):
    """A synthetic session spec or a session source that cannot work; names the key."""


@dataclass(frozen=True)
class Dist:
    """Non-negative numbers drawn as ``N``, ``A..B``, ``exp:M`` or ``lognormal:M:S`` says."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, key: str, text: str | float | int) -> Dist:
        raw = str(text).strip()
        try:
            if raw.startswith("exp:"):
                dist = cls("exp", float(raw[4:]))
            elif raw.startswith("lognormal:"):
                median, sigma = raw[10:].split(":")
                dist = cls("lognormal", float(median), float(sigma))
            elif ".." in raw:
                lo, hi = raw.split("..")
                dist = cls("uniform", float(lo), float(hi))
            else:
                dist = cls("fixed", float(raw))
        except ValueError:
            raise SessionSpecError(
                f"{key}={raw!r}: expected N, A..B, exp:MEAN or lognormal:MEDIAN:SIGMA") from None
        if dist.a < 0 or dist.b < 0 or (dist.kind == "uniform" and dist.b < dist.a):
            raise SessionSpecError(f"{key}={raw!r}: values must be >= 0 (and A <= B)")
        return dist

    def draw(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return float(rng.uniform(self.a, self.b))
        if self.kind == "exp":
            return float(rng.exponential(self.a)) if self.a > 0 else 0.0
        return float(self.a * math.exp(self.b * rng.standard_normal()))

    def draw_int(self, rng: np.random.Generator, low: int = 1) -> int:
        return max(low, int(round(self.draw(rng))))

    def __str__(self) -> str:
        return {"fixed": f"{self.a:g}", "uniform": f"{self.a:g}..{self.b:g}",
                "exp": f"exp:{self.a:g}", "lognormal": f"lognormal:{self.a:g}:{self.b:g}"}[
            self.kind]


def spec_values(spec_class: type, spec: str, what: str) -> dict[str, Any]:
    """The ``KEY=VALUE,...`` pairs of ``spec`` for the dataclass ``spec_class``: integers for its
    ``int`` fields, text (distributions, checked by the class) for the others."""
    names = {f.name: f for f in fields(spec_class)}
    values: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise SessionSpecError(
                f"{what} {pair!r}: expected KEY=VALUE with KEY one of {list(names)}")
        if names[key].type in ("int", int):
            try:
                values[key] = int(value)
            except ValueError:
                raise SessionSpecError(f"{key}={value!r}: expected an integer") from None
        else:
            values[key] = value.strip()
    return values


@dataclass(frozen=True)
class SessionSpec:
    """A synthetic session workload (``--source synthetic:sessions=200,turns=5,...``).

    ``system_tokens``: length of the system prompt; ``groups``: how many distinct system prompts
    (session i gets prompt i % groups; 0: every session its own); ``tool_every``: every Nth turn
    (1: all, 0: none) offers the lookup tool, whose result (``tool_result_tokens``) comes back
    after ``tool_time_s``.
    """

    sessions: int = 100
    turns: str = "5"
    system_tokens: int = 0
    groups: int = 1
    user_tokens: str = "100"
    output_tokens: str = "64"
    think_s: str = "0"
    tool_every: int = 0
    tool_time_s: str = "0.5"
    tool_result_tokens: int = 32

    @classmethod
    def parse(cls, spec: str) -> SessionSpec:
        parsed = cls(**spec_values(cls, spec, "synthetic session spec"))
        parsed.check()
        return parsed

    def check(self) -> None:
        for name in ("sessions",):
            if getattr(self, name) < 1:
                raise SessionSpecError(f"{name}={getattr(self, name)}: must be >= 1")
        for name in ("system_tokens", "groups", "tool_every", "tool_result_tokens"):
            if getattr(self, name) < 0:
                raise SessionSpecError(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("turns", "user_tokens", "output_tokens", "think_s", "tool_time_s"):
            Dist.parse(name, getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _TextFitter(PromptSynthesizer):
    """The synthesizer's exact-length fitting, counted as plain text (a message's own tokens)."""

    def measure(self, content: str) -> int:
        return self.counter.count_text(content)

    def text(self, key: str, tokens: int, opening: str = "") -> str:
        if tokens <= 0:
            return ""
        rng = random.Random(f"{self.seed}:text:{key}")
        return self._fit(opening, rng, tokens)[0]


@dataclass
class Turn:
    """One turn while a session is assembled (then a workload row)."""

    session: str
    user: str
    output_tokens: int
    think_time_s: float = 0.0
    answer: str | None = None
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_time_s: float | None = None
    tool_result: str | None = None
    shared_tokens: int = 0
    trace_offset_s: float | None = None
    source_line: int = 0
    prefix_block_ids: list[int] = field(default_factory=list)


def _letters(text: str) -> str:
    return text.translate(_DIGITS_AS_LETTERS)


def synthetic_turns(spec: SessionSpec, counter: TokenCounter, seed: int = 0) -> list[Turn]:
    """The turns of a synthetic session workload, exact token lengths in ``counter``."""
    rng = np.random.default_rng(seed)
    fitter = _TextFitter(counter, "completions", seed)
    dists = {name: Dist.parse(name, getattr(spec, name))
             for name in ("turns", "user_tokens", "output_tokens", "think_s", "tool_time_s")}
    systems: dict[int, tuple[str, int]] = {}
    turns: list[Turn] = []
    for s in range(spec.sessions):
        sid = f"s{s:06d}"
        group = s % spec.groups if spec.groups else s
        if spec.system_tokens and group not in systems:
            text = fitter.text(f"system:{group}", spec.system_tokens,
                               f"system {_letters(str(group))} ")
            systems[group] = (text, counter.count_text(text))
        system = systems.get(group)
        for k in range(dists["turns"].draw_int(rng)):
            user_n = dists["user_tokens"].draw_int(rng)
            out_n = dists["output_tokens"].draw_int(rng)
            tool = spec.tool_every and (k + 1) % spec.tool_every == 0
            # the user message opens with its session and turn: no two turns share text
            user = fitter.text(f"{sid}:{k}", user_n, f"{_letters(sid)} {_letters(str(k))} ")
            turns.append(Turn(
                session=sid, user=user, output_tokens=out_n,
                think_time_s=0.0 if k == 0 else round(dists["think_s"].draw(rng), 6),
                answer=fitter.text(f"{sid}:{k}:answer", out_n),
                system=system[0] if (system and k == 0) else None,
                tools=[LOOKUP_TOOL] if tool else None,
                tool_time_s=round(dists["tool_time_s"].draw(rng), 6) if tool else None,
                tool_result=fitter.text(f"tool:{sid}:{k}", spec.tool_result_tokens)
                if tool else None,
                shared_tokens=system[1] if system else 0))
    return turns


# ------------------------------------------------------------------------------ from logs


def mooncake_sessions(frame: pd.DataFrame) -> list[int]:
    """Conversation index of each row of a read Mooncake log (rows in time order).

    A heuristic (the trace has no session ids): a row continues the conversation whose latest
    row's full blocks (its ids but the last, partial one) open this row's ids, when this row's
    input is at least that row's input plus its output (a next turn holds the previous prompt
    and answer); the longest match wins, and among tips of the same blocks (conversations that
    share only a system prompt) the one whose prompt and answer come closest to this input;
    otherwise the row opens a conversation.
    """
    # full blocks of a conversation's latest row -> [(conversation, its input + output)]
    tips: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    conv_of: list[int] = []
    lengths = (frame["prompt_tokens"].astype("float64").fillna(0)
               + frame["output_tokens"].astype("float64").fillna(0)).to_numpy()
    for ids, prompt, total in zip(frame["prefix_block_ids"],
                                  frame["prompt_tokens"].astype("float64").fillna(0), lengths,
                                  strict=True):
        ids = list(ids) if isinstance(ids, (list, np.ndarray)) else []
        found = None
        for cut in range(len(ids), 0, -1):
            fits = [t for t in tips.get(tuple(ids[:cut]), []) if prompt >= t[1]]
            if fits:
                best = max(fits, key=lambda t: t[1])
                tips[tuple(ids[:cut])].remove(best)
                found = best[0]
                break
        conv = found if found is not None else (max(conv_of) + 1 if conv_of else 0)
        conv_of.append(conv)
        full = tuple(ids[:-1])
        if full:
            tips.setdefault(full, []).append((conv, int(total)))
    return conv_of


def log_turns(kind: str, frame: pd.DataFrame, counter: TokenCounter | None,
              seed: int = 0) -> list[Turn]:
    """Turns of the sessions in a read log frame (``workloads.readers`` columns plus ``turn``).

    Text comes from the log where it has some (scrubbed before this), synthesized to the logged
    lengths where it has counts only (then ``counter`` is needed).
    """
    fitter = _TextFitter(counter, "completions", seed) if counter is not None else None
    turns: list[Turn] = []
    for sid, rows in _sessions_in_order(kind, frame).groupby("session_id", sort=False):
        prev_prompt = prev_ts = None
        prev_output = 0
        for k, row in enumerate(rows.itertuples(index=False)):
            user, system = _user_text(kind, row, str(sid), k, fitter, prev_prompt, prev_output)
            output = int(row.output_tokens) if not pd.isna(row.output_tokens) else None
            answer = row.output_text if isinstance(row.output_text, str) else None
            if output is None:
                output = counter.count_text(answer or "") if counter is not None else max(
                    1, round(len(answer or "") / 4))
            if answer is None and fitter is not None:
                answer = fitter.text(f"{sid}:{k}:answer", output)
            ts = float(row.timestamp_s) if not pd.isna(row.timestamp_s) else None
            think = 0.0 if k == 0 or ts is None or prev_ts is None else max(0.0, ts - prev_ts)
            shared_ids = list(row.prefix_block_ids)[:-1] if k == 0 and isinstance(
                row.prefix_block_ids, (list, np.ndarray)) else []
            turns.append(Turn(
                session=str(sid), user=user, output_tokens=max(1, output),
                think_time_s=round(think, 6), answer=answer, system=system,
                trace_offset_s=ts if k == 0 else None, source_line=int(row.source_line),
                shared_tokens=512 * len(shared_ids) if kind == "mooncake" else 0,
                prefix_block_ids=[int(b) for b in shared_ids]))
            prev_prompt = row.prompt_tokens if not pd.isna(row.prompt_tokens) else None
            prev_output = output
            prev_ts = ts if ts is not None else prev_ts
    return turns


def _sessions_in_order(kind: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The log's rows session by session (in the order each first appears), each session's
    by turn, then by line; Mooncake's conversations found from their shared prefixes."""
    frame = frame.copy()
    if kind == "mooncake":
        frame["session_id"] = [f"conv{c}" for c in mooncake_sessions(frame)]
    if frame["session_id"].isna().all():
        raise SessionSpecError(
            f"{kind} log: no session ids; map one (--map session_id=COLUMN,turn=COLUMN)")
    frame["__order"] = np.arange(len(frame))
    turn_col = frame["turn"] if "turn" in frame else pd.Series([np.nan] * len(frame))
    frame["__turn"] = turn_col.astype("float64").fillna(-1).to_numpy()
    frame["__first"] = frame.groupby("session_id", sort=False)["__order"].transform("min")
    return frame.sort_values(["__first", "__turn", "__order"], kind="stable")


def _user_text(kind: str, row: Any, sid: str, k: int, fitter: _TextFitter | None,
               prev_prompt: Any, prev_output: int) -> tuple[str, str | None]:
    """Turn ``k``'s user message and, on the first turn, the system prompt: the log's text, or
    text synthesized to the logged length (a later turn: what it adds to the history)."""
    msgs = row.messages if isinstance(row.messages, list) else None
    if msgs:
        system = None
        if k == 0:
            system = next((str(m["content"]) for m in msgs if m["role"] == "system"), None)
        return str(msgs[-1]["content"]), system
    if isinstance(row.prompt, str):
        return row.prompt, None
    if fitter is None:
        raise SessionSpecError(
            f"{kind} log holds token counts only: building its sessions needs "
            "--tokenizer DIR|words or --tokenize-url URL")
    logged = int(row.prompt_tokens)
    ids = list(row.prefix_block_ids) if isinstance(
        row.prefix_block_ids, (list, np.ndarray)) else []
    if k == 0:
        head = "".join(fitter.block_text(b) for b in ids[:-1])
        return fitter.text(f"{sid}:{k}", logged, head + f" {_letters(sid)} "), None
    new = max(1, logged - int(prev_prompt or 0) - prev_output)
    return fitter.text(f"{sid}:{k}", new, f"{_letters(sid)} "), None


# ------------------------------------------------------------------------------ to the format


def history_messages(turns: Sequence[Turn], upto: int, counter: TokenCounter | None,
                     seed: int = 0) -> list[dict[str, Any]]:
    """The logged conversation before turn ``upto`` of one session (its turns in order)."""
    msgs: list[dict[str, Any]] = []
    for k, t in enumerate(turns[:upto + 1]):
        msgs.extend(turn_messages(t))
        if k == upto:
            break
        msgs.extend(turn_reply(t, k))
    return msgs


def turn_reply(turn: Turn, k: int) -> list[dict[str, Any]]:
    """What the logged history holds after turn ``k``'s prompt: the tool call and its result
    (a tool turn), then the answer."""
    msgs: list[dict[str, Any]] = []
    if turn.tools:
        call_id = f"call{k}"
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": turn.tools[0]["function"]["name"], "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": call_id,
                     "content": turn.tool_result or "done"})
    msgs.append({"role": "assistant", "content": turn.answer or ""})
    return msgs


def turn_messages(turn: Turn) -> list[dict[str, Any]]:
    """What a turn adds to its session's messages."""
    head = [{"role": "system", "content": turn.system}] if turn.system else []
    return [*head, {"role": "user", "content": turn.user}]


def turns_frame(turns: Sequence[Turn], counter: TokenCounter | None, buckets: BucketSpec,
                seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The workload rows of ``turns`` (sessions consecutive, in turn order) and their report."""
    by_session: dict[str, list[Turn]] = {}
    for t in turns:
        by_session.setdefault(t.session, []).append(t)
    cols: dict[str, list[Any]] = {k: [] for k in (
        "bucket", "prompt_tokens", "output_tokens", "messages", "session_id", "trace_offset_s",
        "source_line", "prefix_block_ids", "turn", "think_time_s", "user_tokens", "answer",
        "tools", "tool_time_s", "shared_tokens", "history_tokens")}
    for sid, session in by_session.items():
        for k, t in enumerate(session):
            if counter is not None:
                prompt_tokens = counter.count_chat(history_messages(session, k, counter, seed))
                user_tokens = counter.count_text(t.user)
            else:  # no tokenizer: about four characters a token
                chars = sum(len(m["content"] or "") for m in history_messages(session, k, None))
                prompt_tokens, user_tokens = max(1, round(chars / 4)), max(1, len(t.user) // 4)
            history = 0 if k == 0 else cols["prompt_tokens"][-1] + cols["output_tokens"][-1]
            cols["bucket"].append(buckets.bucket_of(prompt_tokens))
            cols["prompt_tokens"].append(prompt_tokens)
            cols["output_tokens"].append(t.output_tokens)
            cols["messages"].append(json.dumps(turn_messages(t), ensure_ascii=False))
            cols["session_id"].append(sid)
            cols["trace_offset_s"].append(t.trace_offset_s if t.trace_offset_s is not None
                                          else np.nan)
            cols["source_line"].append(t.source_line)
            cols["prefix_block_ids"].append(t.prefix_block_ids)
            cols["turn"].append(k)
            cols["think_time_s"].append(t.think_time_s)
            cols["user_tokens"].append(user_tokens)
            cols["answer"].append(t.answer)
            cols["tools"].append(json.dumps({"tools": t.tools, "result": t.tool_result or "done"})
                                 if t.tools else None)
            cols["tool_time_s"].append(t.tool_time_s)
            cols["shared_tokens"].append(t.shared_tokens)
            cols["history_tokens"].append(history)
    n = len(cols["bucket"])
    frame = workload_table(
        cols["bucket"], cols["prompt_tokens"], cols["output_tokens"],
        request_id=[f"{sid}.t{k}" for sid, k in zip(cols["session_id"], cols["turn"],
                                                     strict=True)],
        messages=cols["messages"], trace_offset_s=cols["trace_offset_s"],
        session_id=cols["session_id"], prefix_block_ids=cols["prefix_block_ids"],
        source_line=cols["source_line"] if any(cols["source_line"]) else None,
        prompt_source=["synthesized"] * n,
        **{k: cols[k] for k in ("turn", "think_time_s", "user_tokens", "answer", "tools",
                                "tool_time_s", "shared_tokens")})
    return frame, session_report(frame.assign(history_tokens=cols["history_tokens"]))


def session_report(frame: pd.DataFrame) -> dict[str, Any]:
    """Sessions, turns per session and, per turn index, prompt and history lengths (P50, max)."""
    turns_per = frame.groupby("session_id", sort=False).size()
    per_turn = []
    for k, rows in frame.groupby("turn"):
        per_turn.append({
            "turn": int(k), "count": int(len(rows)),
            "prompt_tokens_p50": float(rows["prompt_tokens"].median()),
            "history_tokens_p50": float(rows["history_tokens"].median()),
            "history_tokens_max": int(rows["history_tokens"].max()),
            "user_tokens_p50": float(rows["user_tokens"].astype("float64").median()),
            "output_tokens_p50": float(rows["output_tokens"].median()),
            "with_tools": int(rows["tools"].notna().sum()),
            "think_time_s_p50": float(rows["think_time_s"].astype("float64").median()),
        })
    return {
        "sessions": int(turns_per.size),
        "turns": int(len(frame)),
        "turns_per_session": {"min": int(turns_per.min()), "p50": float(turns_per.median()),
                              "max": int(turns_per.max()), "mean": round(
                                  float(turns_per.mean()), 3)},
        "tool_turns": int(frame["tools"].notna().sum()),
        "per_turn": per_turn,
    }


def format_session_report(report: dict[str, Any]) -> str:
    tps = report["turns_per_session"]
    lines = [f"sessions {report['sessions']}, turns {report['turns']} (per session min "
             f"{tps['min']} p50 {tps['p50']:g} max {tps['max']}), tool turns "
             f"{report['tool_turns']}",
             f"{'turn':>4} {'count':>6} {'prompt p50':>10} {'history p50':>11} "
             f"{'history max':>11} {'user p50':>8} {'output p50':>10} {'think p50 s':>11}"]
    for t in report["per_turn"]:
        lines.append(f"{t['turn']:>4} {t['count']:>6} {t['prompt_tokens_p50']:>10g} "
                     f"{t['history_tokens_p50']:>11g} {t['history_tokens_max']:>11} "
                     f"{t['user_tokens_p50']:>8g} {t['output_tokens_p50']:>10g} "
                     f"{t['think_time_s_p50']:>11g}")
    return "\n".join(lines)


def session_salt(session_id: str, salt: str, repeat: int = 0) -> str:
    """A session's own salt: the run's salt, the session, and which pass over the workload."""
    base = "".join(c for c in _letters(session_id) if c in string.ascii_letters)
    return f"{salt}{base}{_letters(str(repeat)) if repeat else ''}"


# ------------------------------------------------------------------------------ the build


@dataclass
class SessionBuild:
    frame: pd.DataFrame  # WORKLOAD_SCHEMA columns, one row per turn
    report: dict[str, Any]
    metadata: dict[str, Any]


def build_sessions(source: str, counter: TokenCounter | None, *, n: int | None = None,
                   seed: int = 0, mapping: Any = None, strict: bool = False,
                   sort_timestamps: bool = False, buckets: BucketSpec | None = None
                   ) -> SessionBuild:
    """A session workload from ``synthetic:KEY=VALUE,...`` or ``KIND:PATH`` (a multi-turn log).

    ``n`` keeps the first n sessions. Log text is scrubbed before anything else sees it, logged
    answers too (they are stored: ``history: logged`` replays them).
    """
    buckets = buckets or BucketSpec()
    kind, _, rest = source.partition(":")
    report: dict[str, Any] = {}
    if kind == SYNTHETIC_KIND:
        spec = SessionSpec.parse(rest)
        if n is not None:
            spec = SessionSpec(**{**spec.to_dict(), "sessions": min(spec.sessions, n)})
        if counter is None:
            raise SessionSpecError("synthetic sessions need a tokenizer: --tokenizer DIR|words "
                                   "or --tokenize-url URL (user messages are exact lengths)")
        turns = synthetic_turns(spec, counter, seed)
        report["source"] = {"kind": SYNTHETIC_KIND, "spec": spec.to_dict()}
        source_meta: dict[str, Any] = {"kind": SYNTHETIC_KIND, "spec": spec.to_dict()}
    else:
        kind, path = parse_source(source)
        log = read_log(kind, path, mapping=mapping, strict=strict,
                       sort_timestamps=sort_timestamps, sessions=True)
        frame = log.frame.copy()
        scrubber = Scrubber()
        frame["prompt"] = [scrubber.scrub(p) if isinstance(p, str) else None
                           for p in frame["prompt"]]
        frame["messages"] = [scrubber.scrub_messages(m) if isinstance(m, list) else None
                             for m in frame["messages"]]
        frame["output_text"] = [scrubber.scrub(t) if isinstance(t, str) else None
                                for t in frame["output_text"]]
        if kind != "mooncake":
            frame["session_id"] = frame["session_id"].map(_session_hasher(path))
        turns = log_turns(kind, frame, counter, seed)
        if n is not None:
            keep = list(dict.fromkeys(t.session for t in turns))[:n]
            kept = set(keep)
            turns = [t for t in turns if t.session in kept]
        report["source"] = {"kind": kind, "path": path, "rows_read": log.rows_read,
                            "rows_valid": len(log.frame), "has_timing": log.has_timing,
                            "bad_rows": log.bad_rows_summary()}
        report["scrub"] = scrubber.report.to_dict()
        source_meta = {"kind": kind, "path": str(path)}
    if not turns:
        raise SessionSpecError(f"{source}: no session turns")
    frame, sessions = turns_frame(turns, counter, buckets, seed)
    report["sessions"] = sessions
    metadata = {"source": source_meta, "endpoint": "chat",
                "tokenizer": counter.name if counter is not None else None, "seed": seed,
                "sessions": True, "n": len(frame)}
    return SessionBuild(frame, report, metadata)
