"""Fault drills on a schedule: a fault plan beside the arrival plan, acted out on the replicas a
run started (``swarmload run --replicas N --fault-plan FILE``).

A fault plan is a small YAML file; times are seconds from the load's start (open loop: the
schedule's start; closed loop: the first request sent)::

    actions:
      - {at_s: 20, action: kill, replica: r0}             # SIGKILL to its process group
      - {at_s: 60, action: restart, replica: r0}          # start it again on the same port
      - {at_s: 90, action: stop, replica: r1, for_s: 10}  # SIGSTOP, then SIGCONT 10 s later
      - {at_s: 120, action: slow, replica: r0, factor: 4, for_s: 10}
      - {at_s: 140, action: slow, replica: r1, knobs: {decode_base_s: 0.3}}
      - {at_s: 150, action: restore, replica: r1}

Actions: ``kill`` (SIGKILL), ``stop`` / ``cont`` (SIGSTOP / SIGCONT: a stall with its
connections open), ``restart`` (stop it, or reap a killed one, and start it again on the same
port: the balancer knows that address), ``slow`` and ``restore``. ``slow`` on a simulator changes
its own latency knobs while it serves (``POST /admin/knobs``: ``knobs:`` sets them, ``factor: F``
multiplies every time cost by F); on vLLM it is a stall: a duty cycle of SIGSTOP/SIGCONT that
leaves it running 1/F of every 100 ms. ``restore`` puts the launch values back (ends the duty
cycle). ``for_s`` on ``kill``, ``stop`` or ``slow`` adds the action that undoes it (``restart``,
``cont``, ``restore``) that many seconds later. ``replica``: its name (``r0``, ``r1`` ...) or
index (0, 1 ...).

Errors read ``FILE:LINE: actions[2].action: ...`` (the line of the key, as arrival plans and
study files do). Each action that was acted out is recorded with the wall-clock time it was
planned for, the time it was done, what it took and its outcome (``done``, or ``failed: why``)
in ``<run>/faults.json`` while the run goes on, and in the manifest's ``faults`` at its end.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from collectors.atomic import write_json_atomic
from infra.targets.replicas import ReplicaError
from infra.targets.simulator.settings import RUNTIME_KNOBS, TIME_KNOBS
from workloads.yaml_lines import key_lines, locate, yaml_error_line

ACTIONS = ("kill", "stop", "cont", "restart", "slow", "restore")
# the action that undoes one (``for_s``), and what a fault's end is
UNDO = {"kill": "restart", "stop": "cont", "slow": "restore"}
FAULTS_FILE = "faults.json"  # <run>/: the actions as they were acted out
DUTY_PERIOD_S = 0.1  # a vLLM's slow: SIGSTOP/SIGCONT within every 100 ms
ORIGIN_WAIT_S = 120.0  # longest wait for the load's start


class FaultPlanError(ValueError):
    """The fault plan is malformed or does not fit the run; the message names the key."""


@dataclass(frozen=True)
class FaultAction:
    at_s: float
    action: str
    replica: str  # r0, r1 ...
    factor: float | None = None  # slow
    knobs: dict[str, float] | None = None  # slow on a simulator
    line: int | None = None  # where it is in the plan file
    implied: bool = False  # added by for_s


@dataclass(frozen=True)
class FaultPlan:
    actions: tuple[FaultAction, ...]
    path: str = ""

    def check(self, replicas: int, kind: str) -> None:
        """The plan fits a run of ``replicas`` started replicas of ``kind`` (``sim``,
        ``vllm-cpu``, ``vllm``); raises FaultPlanError naming the action's line."""
        for action in self.actions:
            where = f"{self.path}:{action.line}: " if action.line else ""
            index = int(action.replica[1:])
            if index >= replicas:
                raise FaultPlanError(f"{where}actions: replica {action.replica} does not exist: "
                                     f"the run starts {replicas} (r0 .. r{replicas - 1})")
            if action.knobs and kind != "sim":
                raise FaultPlanError(f"{where}actions: knobs are the simulator's; a {kind} "
                                     "replica is slowed by a duty cycle: slow with factor: F")

    def manifest(self) -> dict[str, Any]:
        return {"path": self.path, "planned": [
            {k: v for k, v in asdict(a).items() if v is not None and v is not False}
            for a in self.actions]}


def _replica_name(value: Any, where: str) -> str:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and value >= 0:
        return f"r{value}"
    if isinstance(value, str) and value.startswith("r") and value[1:].isdigit():
        return f"r{int(value[1:])}"
    raise FaultPlanError(f"{where}.replica: a replica name r0, r1 ... or its index 0, 1 ..., "
                         f"got {value!r}")


def _number(item: dict[str, Any], key: str, where: str, *, above: float) -> float | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= above:
        raise FaultPlanError(f"{where}.{key}: a number > {above:g}, got {value!r}")
    return float(value)


def plan_from_dict(data: Any, lines: dict[str, int] | None = None,
                   path: str = "") -> FaultPlan:
    """A checked :class:`FaultPlan` from the file's parsed YAML."""
    lines = lines or {}
    if not isinstance(data, dict) or not isinstance(data.get("actions"), list) or not data[
            "actions"]:
        raise FaultPlanError("actions: a fault plan is a list of actions under 'actions:', "
                             "e.g. - {at_s: 20, action: kill, replica: r0}")
    extra = sorted(set(data) - {"actions"})
    if extra:
        raise FaultPlanError(f"{extra[0]}: unknown key; a fault plan has only 'actions'")
    known = {"at_s", "action", "replica", "for_s", "factor", "knobs"}
    actions: list[FaultAction] = []
    for i, item in enumerate(data["actions"]):
        where = f"actions[{i}]"
        if not isinstance(item, dict):
            raise FaultPlanError(f"{where}: an action is a mapping like {{at_s: 20, action: "
                                 f"kill, replica: r0}}, got {item!r}")
        unknown = sorted(set(item) - known)
        if unknown:
            raise FaultPlanError(f"{where}.{unknown[0]}: unknown key; an action takes "
                                 f"{', '.join(sorted(known))}")
        kind = item.get("action")
        if kind not in ACTIONS:
            raise FaultPlanError(f"{where}.action: one of {', '.join(ACTIONS)}, got {kind!r}")
        at = item.get("at_s")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or at < 0:
            raise FaultPlanError(f"{where}.at_s: seconds from the load's start, a number >= 0, "
                                 f"got {at!r}")
        replica = _replica_name(item.get("replica"), where)
        for_s = _number(item, "for_s", where, above=0)
        if for_s is not None and kind not in UNDO:
            raise FaultPlanError(f"{where}.for_s: only {', '.join(UNDO)} are undone after "
                                 f"for_s; {kind} is not")
        factor = _number(item, "factor", where, above=1)
        knobs = item.get("knobs")
        if kind != "slow" and (factor is not None or knobs is not None):
            raise FaultPlanError(f"{where}.{'factor' if factor is not None else 'knobs'}: only "
                                 "slow takes it")
        if kind == "slow" and (factor is None) == (knobs is None):
            raise FaultPlanError(f"{where}.action: slow takes factor: F (> 1) or knobs: "
                                 "{decode_base_s: ...} (one of them)")
        if knobs is not None and (not isinstance(knobs, dict) or not knobs or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool)
                for v in knobs.values())):
            raise FaultPlanError(f"{where}.knobs: a mapping of the simulator's knobs to numbers "
                                 f"(decode_base_s: 0.2), got {knobs!r}")
        if knobs is not None:
            bad = sorted(set(knobs) - set(RUNTIME_KNOBS))
            if bad:
                raise FaultPlanError(f"{where}.knobs: {bad[0]} is not a runtime knob; they are "
                                     f"{', '.join(RUNTIME_KNOBS)}")
        line = lines.get(where)
        actions.append(FaultAction(float(at), kind, replica, factor,
                                   {k: float(v) for k, v in knobs.items()} if knobs else None,
                                   line))
        if for_s is not None:
            actions.append(FaultAction(float(at) + for_s, UNDO[kind], replica, line=line,
                                       implied=True))
    ordered = sorted(enumerate(actions), key=lambda pair: (pair[1].at_s, pair[0]))
    _check_sequence([a for _, a in ordered], path)
    return FaultPlan(tuple(a for _, a in ordered), path)


def _check_sequence(actions: list[FaultAction], path: str) -> None:
    """Each replica's actions in time order make sense: nothing acts on a killed replica but
    restart, cont follows a stop, restore follows a slow."""
    state: dict[str, str] = {}
    for action in actions:
        now = state.get(action.replica, "up")
        where = f"{path}:{action.line}: " if path and action.line else ""
        problem = None
        if now == "killed" and action.action != "restart":
            problem = "it was killed (only restart brings it back)"
        elif action.action == "cont" and now != "stopped":
            problem = "cont continues a stopped replica; it is not stopped"
        elif action.action == "restore" and now != "slowed":
            problem = "restore ends a slow; it is not slowed"
        elif action.action in ("kill", "slow", "stop") and now == "stopped":
            problem = f"it is stopped: cont it before {action.action}"
        elif action.action == "slow" and now == "slowed":
            problem = "it is slowed already: restore it first"
        if problem:
            raise FaultPlanError(f"{where}{action.action} of {action.replica} at "
                                 f"{action.at_s:g} s: {problem}")
        state[action.replica] = {"kill": "killed", "stop": "stopped", "slow": "slowed"}.get(
            action.action, "up")


def load_fault_plan(path: str | Path) -> FaultPlan:
    """The fault plan in a YAML file; errors read ``FILE:LINE: problem``."""
    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise FaultPlanError(f"{path}: cannot read the fault plan: {exc.strerror or exc}"
                             ) from exc
    except yaml.YAMLError as exc:
        raise FaultPlanError(yaml_error_line(path, exc)) from exc
    lines = key_lines(text)
    try:
        return plan_from_dict(data, lines, str(path))
    except FaultPlanError as exc:
        message = str(exc)
        if message.startswith(f"{path}:"):
            raise
        line = locate(message, lines)
        raise FaultPlanError(f"{path}{f':{line}' if line else ''}: {message}") from None


# -------------------------------------------------------------------------------- acting out


def load_origin_ns(run_dir: Path) -> int | None:
    """When the load started, from the run folder as it is being written: the open-loop
    schedule's start (``replay_events.json``) or the first request sent (``progress.json``)."""
    for name, pick in (("replay_events.json", _schedule_start), ("progress.json", _first_sent)):
        try:
            data = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            continue
        found = pick(data)
        if found:
            return found
    return None


def _schedule_start(events: Any) -> int | None:
    for event in events if isinstance(events, list) else []:
        if event.get("event") == "schedule_start" and event.get("t0_wall_ns"):
            return int(event["t0_wall_ns"])
    return None


def _first_sent(progress: Any) -> int | None:
    value = progress.get("first_sent_wall_ns") if isinstance(progress, dict) else None
    return int(value) if value else None


@dataclass
class _Slowed:
    knobs: dict[str, Any] | None = None  # a simulator's knobs before the slow
    stop: threading.Event | None = None  # a duty cycle's end
    thread: threading.Thread | None = None


@dataclass
class FaultDriver:
    """Acts out ``plan`` on ``replicas`` (:class:`infra.targets.replicas.Replicas`) in a thread:
    waits for the load's start, then does each action at its time; ``watch`` (a
    :class:`infra.targets.haproxy.BalancerWatch`) takes HAProxy's counters at each action."""

    plan: FaultPlan
    replicas: Any
    run_dir: Path
    watch: Any = None
    say: Any = print
    done: list[dict[str, Any]] = field(default_factory=list)
    origin_ns: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _idle: threading.Event = field(default_factory=threading.Event)
    _slowed: dict[str, _Slowed] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def start(self) -> FaultDriver:
        self._thread = threading.Thread(target=self._run, name="fault-driver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the drill (the run is over): actions not yet due are recorded ``not done``; a
        stopped or slowed replica is continued so the run can stop it."""
        self._stop.set()
        if self._thread is not None:
            self._idle.wait(60.0)
        for name, slowed in list(self._slowed.items()):
            self._end_duty_cycle(slowed)
            del self._slowed[name]
        self._write()

    def manifest(self) -> dict[str, Any]:
        return {**self.plan.manifest(), "origin_ns": self.origin_ns, "actions": list(self.done)}

    def _write(self) -> None:
        write_json_atomic(self.run_dir / FAULTS_FILE, self.manifest())

    def _run(self) -> None:
        deadline = time.monotonic() + ORIGIN_WAIT_S
        while self.origin_ns is None and not self._stop.is_set():
            self.origin_ns = load_origin_ns(self.run_dir)
            if self.origin_ns is None:
                if time.monotonic() > deadline:
                    self.say("WARNING: fault plan: the load never started; no action done")
                    break
                self._stop.wait(0.05)
        for action in self.plan.actions:
            if self.origin_ns is None:
                self._record(action, None, time.time_ns(), "not done: the load never started")
                continue
            planned = self.origin_ns + int(action.at_s * 1e9)
            while not self._stop.is_set() and time.time_ns() < planned:
                self._stop.wait(min(0.05, max(0.0, (planned - time.time_ns()) / 1e9)))
            if self._stop.is_set():
                self._record(action, planned, time.time_ns(), "not done: the run ended first")
                continue
            self._act(action, planned)
        self._write()
        self._idle.set()
        # A replica this thread started again (restart) gets SIGTERM when the thread that
        # forked it ends (Linux's parent-death signal follows the thread): so the thread stays,
        # parked, until the process ends (it is a daemon), by when the run has stopped them.
        threading.Event().wait()

    def _record(self, action: FaultAction, planned_ns: int | None, wall_ns: int,
                outcome: str, **extra: Any) -> None:
        entry = {"at_s": action.at_s, "action": action.action, "replica": action.replica,
                 "planned_wall_ns": planned_ns, "wall_ns": wall_ns,
                 "late_s": (wall_ns - planned_ns) / 1e9 if planned_ns else None,
                 "outcome": outcome, **({"factor": action.factor} if action.factor else {}),
                 **({"knobs": action.knobs} if action.knobs else {}), **extra}
        self.done.append(entry)
        self._write()
        self.say(f"fault plan: {action.action} {action.replica} at {action.at_s:g} s: {outcome}")

    def _act(self, action: FaultAction, planned_ns: int) -> None:
        server = self.replicas.server(action.replica)
        wall_ns = time.time_ns()
        pid = server.pid
        extra: dict[str, Any] = {"pid": pid}
        outcome = "done"
        started = time.monotonic()
        try:
            if action.action == "kill":
                server.signal(signal.SIGKILL)
            elif action.action == "stop":
                server.signal(signal.SIGSTOP)
            elif action.action == "cont":
                server.signal(signal.SIGCONT)
            elif action.action == "restart":
                self._end_duty_cycle(self._slowed.pop(action.replica, None))
                extra["serving_after_s"] = round(server.restart(), 3)
                extra["new_pid"] = server.pid
            elif action.action == "slow":
                self._slowed[action.replica] = self._slow(server, action)
            elif action.action == "restore":
                slowed = self._slowed.pop(action.replica, None)
                if slowed is not None and slowed.knobs is not None:
                    server.knobs(slowed.knobs)
                self._end_duty_cycle(slowed)
        except ReplicaError as exc:
            outcome = f"failed: {exc}"
        extra["took_s"] = round(time.monotonic() - started, 3)
        if self.watch is not None:
            with contextlib.suppress(OSError):
                extra["balancer"] = self.watch.snapshot(f"{action.action} {action.replica}")
        self._record(action, planned_ns, wall_ns, outcome, **extra)

    def _slow(self, server: Any, action: FaultAction) -> _Slowed:
        if server.kind == "sim":
            before = server.knobs()
            if action.knobs:
                knobs = dict(action.knobs)
            else:
                assert action.factor is not None
                knobs = {k: before[k] * action.factor for k in TIME_KNOBS
                         if isinstance(before.get(k), (int, float))}
            server.knobs(knobs)
            return _Slowed(knobs={k: before[k] for k in knobs})
        assert action.factor is not None
        stop = threading.Event()
        running_s = DUTY_PERIOD_S / action.factor

        def cycle() -> None:
            while not stop.is_set():
                try:
                    server.signal(signal.SIGSTOP)
                    stop.wait(DUTY_PERIOD_S - running_s)
                    server.signal(signal.SIGCONT)
                except ReplicaError:
                    return
                stop.wait(running_s)

        thread = threading.Thread(target=cycle, name=f"slow-{action.replica}", daemon=True)
        thread.start()
        return _Slowed(stop=stop, thread=thread)

    def _end_duty_cycle(self, slowed: _Slowed | None) -> None:
        if slowed is None or slowed.stop is None:
            return
        slowed.stop.set()
        if slowed.thread is not None:
            slowed.thread.join(2.0)
