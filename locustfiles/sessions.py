"""One session, run on one worker: its turns in order, the history growing turn by turn.

A session item (``locustfiles.schedule_items.session_items``) holds every turn's new messages.
:class:`SessionRun` sends turn 0 at the session's scheduled time and each later turn once the
previous answer is in and its think time has passed. The history is the previous prompt plus the
server's real answer (text and tool calls, from the kept stream lines), or the workload's logged
answer under ``session_history: logged``.

A turn that offers tools is a loop of two requests: the first (``turn_step`` "tool_call", with
``tools`` and ``tool_choice``) is answered with a call; the tool "runs" for the turn's tool time;
its result goes back as a ``tool`` message and the second request (``final``) is timed as the
answer. Its record's ``tool_wait_s`` is the time from the call's last byte to that send.

Every turn ends with exactly one record (the tool loop's ``final`` request adds one of its own):
sent turns carry their outcome; after a failed turn the session ends and its unsent turns are
recorded ``session_ended``; when the run stops mid-session the in-flight turn is ``cancelled``
and the rest ``cancelled`` as never sent. The turn's ``scheduled`` time is the session's arrival
(turn 0) or the previous answer's end plus the think time, so ``schedule_lag_s`` of a later
turn is the generator's own delay in keeping the think time.

A task (an agent's calls, ``docs/guides/agents.md``; its item is marked ``task``) runs as a
graph: one greenlet per call, each waiting until every call it depends on has finished (last
byte; a tool loop's final answer included) and its think time has passed after the last of them,
so calls that do not wait on each other are in flight at once, all on this worker and all with
the task's session header. A call's prompt is its context call's conversation (that prompt as
sent and its answer), then the call's own messages, the other dependencies' answers added to its
first user message (:func:`workloads.builtin_mix.call_messages`). Its ``scheduled`` time is the
dependencies' end plus the think time (a call that depends on none: the task's arrival plus
its think time). A failed call ends
the calls that depend on it, directly or not (``session_ended``); the others run on. When the
run stops, calls in flight are ``cancelled``, as are those never sent.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import gevent
from gevent.event import Event
from gevent.pool import Group

from collectors.schemas import OUTCOME_CANCELLED, OUTCOME_OK, OUTCOME_SESSION_ENDED
from locustfiles.clock_sync import wall_ns
from locustfiles.sse import assemble_answer
from locustfiles.streaming import StreamTiming, cancelled_timing
from locustfiles.timing import build_record
from workloads.builtin_mix import call_messages

CHAT_PATH = "/v1/chat/completions"


def replica_index(session_id: str, replicas: int) -> int:
    """The replica a session sticks to when the worker balances (stable across workers)."""
    return zlib.crc32(session_id.encode()) % replicas


def logged_tool_exchange(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool call and result a logged history holds for a tool turn."""
    call_id = f"call{turn['turn']}"
    return [
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": _tool_name(turn), "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": _tool_result(turn)},
    ]


def _tools(turn: dict[str, Any]) -> list[dict[str, Any]]:
    tools = turn.get("tools") or {}
    return list(tools.get("tools") or []) if isinstance(tools, dict) else list(tools)


def _tool_name(turn: dict[str, Any]) -> str:
    tools = _tools(turn)
    return str(tools[0]["function"]["name"]) if tools else "tool"


def _tool_result(turn: dict[str, Any]) -> str:
    tools = turn.get("tools")
    return str(tools.get("result") or "done") if isinstance(tools, dict) else "done"


class SessionRun:
    """Runs one leased session item; ``record`` stores one REQUEST_SCHEMA row."""

    def __init__(self, ctx: Any, item: dict[str, Any], record: Callable[[dict[str, Any]], None],
                 live: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.ctx = ctx
        self.item = item
        self.record = record
        self.live = live
        self.recorded: set[int] = set()  # turns that have their record
        self._ends: dict[int, int] = {}  # monotonic ns: each turn's last byte (tool loop's final)
        settings = ctx.settings
        self.logged = settings.session_history == "logged"
        header = settings.session_header
        self.headers = {header: item["sid"]} if header else None

    # ------------------------------------------------------------------ the turns
    def run(self, due_mono: int, due_wall: int) -> None:
        if self.item.get("task"):
            self._run_task(due_mono, due_wall)
            return
        turns = self.item["turns"]
        history: list[dict[str, Any]] = []
        scheduled_mono, scheduled_wall = due_mono, due_wall
        prev_total: int | None = None
        try:
            for turn in turns:
                k = turn["turn"]
                if k > 0 and turn["think"] > 0:
                    gevent.sleep(turn["think"])
                messages = history + turn["messages"]
                hist = 0 if k == 0 else (prev_total if prev_total is not None else turn["hist"])
                ok, history, prev_total = self._turn(turn, messages, hist, scheduled_mono,
                                                     scheduled_wall)
                if not ok:
                    self._unsent(OUTCOME_SESSION_ENDED,
                                 f"turn {k} of its session failed; the session ended there")
                    return
                if k + 1 < len(turns):
                    nxt = turns[k + 1]["think"]
                    scheduled_mono = self._ends[k] + int(nxt * 1e9)
                    scheduled_wall = wall_ns() + int(nxt * 1e9)
        except gevent.GreenletExit:
            self._unsent(OUTCOME_CANCELLED, "run ended before it was sent")
            raise

    def _turn(self, turn: dict[str, Any], messages: list[dict[str, Any]], hist: int,
              scheduled_mono: int, scheduled_wall: int
              ) -> tuple[bool, list[dict[str, Any]], int | None]:
        """Send one turn (both requests of a tool loop); (ok, history after it, its tokens)."""
        tools = _tools(turn)
        step = "tool_call" if tools else None
        prompt = messages
        body = self._payload(turn, messages, tools)
        timing, content, calls = self._send(turn, turn["rid"], body, hist, step,
                                            scheduled_mono, scheduled_wall)
        if timing is None:
            return False, messages, None
        answer = {"role": "assistant", "content": content}
        total = _total_tokens(timing)
        if tools and calls:
            exchange = self._exchange(turn, calls)
            gevent.sleep(turn["tool_time"])
            final_messages = messages + exchange
            body = self._payload(turn, final_messages, [])
            final, content, _ = self._send(turn, turn["rid"] + ".final", body, total or hist,
                                           "final", None, None, tool_end=timing.last_byte_ns)
            if final is None:
                return False, messages, None
            messages, answer = final_messages, {"role": "assistant", "content": content}
            total = _total_tokens(final)
        if self.logged:  # the prompt as sent, then the logged exchange and answer
            exchange = logged_tool_exchange(turn) if tools else []
            return True, prompt + exchange + [
                {"role": "assistant", "content": turn["answer"]}], None
        return True, messages + [answer], total

    def _exchange(self, turn: dict[str, Any], calls: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
        """The assistant's calls and one tool message per call (its result from the workload)."""
        calls = [{**c, "id": c.get("id") or f"call{turn['turn']}-{i}"}
                 for i, c in enumerate(calls)]
        return [{"role": "assistant", "content": "", "tool_calls": calls},
                *({"role": "tool", "tool_call_id": c["id"], "content": _tool_result(turn)}
                  for c in calls)]

    def _payload(self, turn: dict[str, Any], messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]]) -> dict[str, Any]:
        settings = self.ctx.settings
        body = self.ctx.item_payload({"endpoint": "chat", "messages": messages,
                                      "max_tokens": turn["max_tokens"]})
        if tools:
            body["tools"] = tools
            body["tool_choice"] = settings.tool_choice
            body["max_tokens"] = settings.tool_max_tokens
            body.pop("ignore_eos", None)  # the call ends where its JSON ends
        return body

    # ------------------------------------------------------------------ a task's graph
    def _run_task(self, due_mono: int, due_wall: int) -> None:
        turns = self.item["turns"]
        self._finished = [Event() for _ in turns]
        self._failed: set[int] = set()
        self._conversations: dict[int, list[dict[str, Any]]] = {}
        self._totals: dict[int, int | None] = {}
        calls = Group()
        try:
            for turn in turns:
                calls.spawn(self._call, turn, due_mono, due_wall)
            calls.join()
        except gevent.GreenletExit:
            calls.kill(block=True)  # a call in flight records itself cancelled
            self._unsent(OUTCOME_CANCELLED, "run ended before it was sent")
            raise

    def _call(self, turn: dict[str, Any], due_mono: int, due_wall: int) -> None:
        """One call of a task: wait for its dependencies, then send it (a greenlet of its own)."""
        k = turn["turn"]
        try:
            for dep in turn["deps"]:
                self._finished[dep].wait()
                if dep in self._failed:
                    self._failed.add(k)
                    self._unsent_call(turn, OUTCOME_SESSION_ENDED,
                                      f"call {dep} of its task failed; the calls after it ended")
                    return
            delay_ns = int(turn["think"] * 1e9)
            # the delay runs from the dependencies' end; a call that depends on nothing waits
            # its delay from the task's arrival (a traced agent that started later)
            scheduled_mono, scheduled_wall = due_mono + delay_ns, due_wall + delay_ns
            if turn["deps"]:
                scheduled_mono = max(self._ends[d] for d in turn["deps"]) + delay_ns
                scheduled_wall = scheduled_mono + wall_ns() - time.perf_counter_ns()
            now = time.perf_counter_ns()
            if scheduled_mono > now:
                gevent.sleep((scheduled_mono - now) * 1e-9)
            ctx = turn["ctx"]
            hist = 0 if ctx is None else self._totals[ctx] or turn["hist"]
            ok, conversation, total = self._turn(turn, self._task_prompt(turn), hist,
                                                 scheduled_mono, scheduled_wall)
            if ok:
                self._conversations[k], self._totals[k] = conversation, total
            else:
                self._failed.add(k)
        except gevent.GreenletExit:
            raise
        except BaseException:
            self._failed.add(k)
            raise
        finally:
            self._finished[k].set()

    def _task_prompt(self, turn: dict[str, Any]) -> list[dict[str, Any]]:
        """The context call's conversation, then the call's own messages, the other
        dependencies' answers added to its first user message."""
        ctx = turn["ctx"]
        answers = [str(self._conversations[d][-1]["content"] or "")
                   for d in turn["deps"] if d != ctx]
        return call_messages(self._conversations[ctx] if ctx is not None else None,
                             turn["messages"], answers)

    # ------------------------------------------------------------------ one request
    def _send(self, turn: dict[str, Any], rid: str, body: dict[str, Any], hist: int,
              step: str | None, scheduled_mono: int | None, scheduled_wall: int | None,
              tool_end: int | None = None
              ) -> tuple[StreamTiming | None, str, list[dict[str, Any]]]:
        """One request of a turn, recorded; (timing, answer text, tool calls), timing None when
        it failed (the session ends)."""
        ctx = self.ctx
        http_id = ctx.request_id(rid)
        ctx.note_sent(rid, http_id, turn["bucket"], "chat", turn["ptoks"], body["max_tokens"],
                      scheduled_wall)
        columns = {"session_id": self.item["sid"], "turn": turn["turn"], "history_tokens": hist,
                   "reusable_tokens": max(hist, turn["shared"]), "turn_step": step,
                   **_task_columns(turn)}
        try:
            timing = ctx.stream(CHAT_PATH, body, http_id, keep_answer=True,
                                headers=self.headers, session=self.item["sid"])
        except gevent.GreenletExit as exc:
            cancelled = cancelled_timing(exc)
            if cancelled is not None:
                self._store(turn, rid, cancelled, columns, scheduled_mono, scheduled_wall,
                            body, final=step == "final")
            raise
        content, calls = assemble_answer(timing.answer_lines or [])
        timing.answer_lines = None
        if step == "tool_call":
            columns["tool_calls"] = len(calls)
        if tool_end is not None:
            columns["tool_wait_s"] = (timing.sent_ns - tool_end) * 1e-9
        self._store(turn, rid, timing, columns, scheduled_mono, scheduled_wall, body,
                    final=step == "final")
        self._ends[turn["turn"]] = timing.last_byte_ns or timing.sent_ns
        return (timing if timing.outcome == OUTCOME_OK else None), content, calls

    def _store(self, turn: dict[str, Any], rid: str, timing: StreamTiming,
               columns: dict[str, Any], scheduled_mono: int | None,
               scheduled_wall: int | None, body: dict[str, Any], *, final: bool) -> None:
        ctx = self.ctx
        record = build_record(
            timing, run_id=ctx.settings.run_id, worker_id=ctx.worker_id, request_id=rid,
            bucket=turn["bucket"], endpoint="chat", target_prompt_tokens=turn["ptoks"],
            max_tokens=body["max_tokens"], scheduled_ns=scheduled_mono,
            scheduled_wall_ns=scheduled_wall, http_request_id=ctx.request_id(rid),
            session=columns)
        if not final:
            self.recorded.add(turn["turn"])
        if self.live is not None:
            self.live(record)
        self.record(record)

    def _unsent(self, outcome: str, why: str) -> None:
        """One record for every turn not yet recorded: never sent, counted, not lost."""
        for turn in self.item["turns"]:
            self._unsent_call(turn, outcome, why)

    def _unsent_call(self, turn: dict[str, Any], outcome: str, why: str) -> None:
        if turn["turn"] in self.recorded:
            return
        self.recorded.add(turn["turn"])
        self.record(unsent_turn_record(
            self.item, turn, outcome, why, run_id=self.ctx.settings.run_id,
            worker_id=self.ctx.worker_id))


def _total_tokens(timing: StreamTiming) -> int | None:
    usage = timing.usage or {}
    prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return int(prompt) + int(output) if prompt is not None and output is not None else None


def _task_columns(turn: dict[str, Any]) -> dict[str, Any]:
    """A task call's own record columns (none for a session's turn)."""
    return {"depends_on": turn["deps"], "agent": turn["agent"]} if "deps" in turn else {}


def root_scheduled_wall(turn: dict[str, Any], arrival_wall_ns: int) -> int | None:
    """When a turn was meant to go out if it waits on no other: a session's first at the
    session's arrival, a task's call that depends on none its delay after; None for others
    (their time depends on answers never given)."""
    if turn.get("deps") == []:
        return arrival_wall_ns + int(turn["think"] * 1e9)
    return arrival_wall_ns if turn["turn"] == 0 and "deps" not in turn else None


def unsent_turn_record(item: dict[str, Any], turn: dict[str, Any], outcome: str, error: str, *,
                       run_id: str, worker_id: str,
                       scheduled_wall_ns: int | None = None) -> dict[str, Any]:
    """The record of a session turn that was never sent (worker, master or session ended)."""
    timing = StreamTiming(sent_ns=0, sent_wall_ns=wall_ns(), outcome=outcome, error=error)
    record = build_record(
        timing, run_id=run_id, worker_id=worker_id, request_id=turn["rid"],
        bucket=turn["bucket"], endpoint=item.get("endpoint", "chat"),
        target_prompt_tokens=turn["ptoks"], max_tokens=turn["max_tokens"],
        session={"session_id": item["sid"], "turn": turn["turn"], **_task_columns(turn)})
    record["scheduled_wall_ns"] = scheduled_wall_ns
    record["e2e_s"] = None
    return record
