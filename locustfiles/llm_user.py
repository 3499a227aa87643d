"""swarmload's Locust user: closed-loop streaming completions, timed per METRICS.md.

Plain Locust works::

    locust -f locustfiles/llm_user.py --headless -u 8 -r 8 -t 30s --host http://127.0.0.1:8000

and shows ``TTFT`` and ``E2E`` as separate live entries per bucket; exact figures come from the
per-request Parquet records written to ``--swarmload-run-dir`` (default ``results/<run id>``).
``swarmload run`` starts this file as a master with N workers.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import gevent
from locust import User, constant, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from collectors import live_metrics, progress, request_recorder
from collectors.headers import header_name
from collectors.manifest import register_own_manifest
from locustfiles import clock_sync, master_waits, replay, worker_auth
from locustfiles.config import ENDPOINT_PATHS, RunConfig, add_locust_arguments
from locustfiles.context import ProcessContext, settings_from_options
from locustfiles.events import LEASE_MESSAGE, SENT_MESSAGE, fire_live_stats, fire_record
from locustfiles.pacer import TURN, make_way
from locustfiles.soak import SoakServices, release_memory_loop, soak_enabled
from locustfiles.streaming import cancelled_timing
from locustfiles.timing import build_record
from workloads.builtin_mix import PromptRequest, new_prompt_salt

_process: dict[str, Any] = {}  # this process's services: context, recorder, clock, ...
# before Locust makes its runner: a worker says client_ready from its constructor
worker_auth.install()


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any, **_kwargs: Any) -> None:
    add_locust_arguments(parser)


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    # httpx logs every request at INFO: at thousands of requests/s that is the generator's
    # biggest cost, and the records already hold everything.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir = None
    options = environment.parsed_options
    runner = environment.runner
    if options is not None and not isinstance(runner, WorkerRunner):
        # Resolve the run id once, here: the master's options travel to every worker.
        settings = settings_from_options(options)
        options.swarmload_run_id, options.swarmload_run_dir = settings.run_id, settings.run_dir
        # A fresh prompt salt per run, chosen here once, unless one was given to repeat a run.
        options.swarmload_prompt_salt = settings.prompt_salt or new_prompt_salt()
        run_dir = settings.run_dir
    recorder = _process["recorder"] = request_recorder.register(environment, run_dir)
    # a batch of records waits for an open-loop send due while it is serialised; while the
    # open-loop scheduler paces sends, full batches go in the gaps between them
    recorder.before_batch = make_way
    recorder.spare_time = lambda: TURN.send_due is not None
    recorder.room_ns = TURN.room_ns
    TURN.spare_work[:] = [(recorder.batch_cost_ns, recorder.send_spare_batch)]
    sync = clock_sync.register(environment)
    if sync is not None:
        _process["clock"] = sync
        recorder.clock_report = sync.report
    recorder.master_host = clock_sync.host_name()
    # Every message handler before anything below that may yield to the event loop (the
    # Prometheus endpoint's bind looks its address up): the master answers a waiting worker's
    # client_ready then, and that worker's first messages would find no handler.
    if isinstance(runner, WorkerRunner):
        runner.register_message(LEASE_MESSAGE, _on_lease)
    elif isinstance(runner, MasterRunner):
        runner.register_message(SENT_MESSAGE, _on_sent)
        inits = _process["inits"] = master_waits.WorkerInits(runner)
        if sync is not None:  # the clock exchange starts once the worker can answer it
            inits.listeners.append(sync.on_worker_connect)
        runner.register_message(master_waits.INIT_MESSAGE, inits.on_message)
    if not isinstance(runner, WorkerRunner):
        progress.register(environment, recorder, run_dir)  # progress.json for live views
        if options is not None:  # plain `locust -f`: its run folder gets a manifest too
            register_own_manifest(environment, run_dir, lambda: _plain_run_facts(environment))
    if options is not None:  # the Prometheus endpoint (master), the sent count (workers)
        live_metrics.register(environment, recorder, settings_from_options(options),
                              sent_count=lambda: _process["ctx"].sent if "ctx" in _process
                              else 0)
    # gevent's loop keeps the time of its last turn, and none has run while Locust imported this
    # file (seconds on a loaded machine): Locust's --run-time timer, set right after this event,
    # would count from then and fire at once (a `-t 3s` run of 0 requests). Now, not then.
    gevent.get_hub().loop.update_now()
    if isinstance(runner, WorkerRunner):  # last: every handler of this file is registered
        master_waits.announce(runner)
    elif isinstance(runner, MasterRunner) and options is not None and options.headless:
        master_waits.wait_for_workers(runner, int(options.expect_workers or 0),
                                      _process["inits"],
                                      float(options.expect_workers_max_wait or 0))


def _plain_run_facts(environment: Environment) -> dict[str, Any]:
    """What a run started by plain Locust records in its manifest (names, never secrets)."""
    options: Any = environment.parsed_options
    settings = settings_from_options(options)
    workers = getattr(options, "expect_workers", None) if isinstance(
        environment.runner, MasterRunner) else 0
    return {
        "run_id": settings.run_id, "prompt_salt": options.swarmload_prompt_salt,
        "target": {"kind": "endpoint", "base_url": environment.host, "model": settings.model},
        "workload": ({"kind": "log-replay", "path": settings.workload} if settings.workload
                     else {"kind": "builtin-mix", "mix": options.swarmload_mix,
                           "max_tokens": settings.max_tokens, "seed": settings.seed,
                           "endpoint": settings.endpoint}),
        "load": {"kind": "open-loop" if settings.workload and not settings.closed_replay
                 else "closed-loop",
                 "users": getattr(options, "num_users", None), "workers": workers,
                 "spawn_rate": getattr(options, "spawn_rate", None),
                 "duration_s": getattr(options, "run_time", None)},
        "endpoint": {"tls": (environment.host or "").startswith("https://"),
                     "insecure": settings.insecure, "ca_bundle": settings.ca_bundle or None,
                     "api_key_env": settings.api_key_env or None,
                     "api_key_file": settings.api_key_file or None,
                     "headers": [header_name(h) for h in settings.headers],
                     "stream": settings.stream},
    }


def _context(environment: Environment) -> ProcessContext:
    if "ctx" not in _process:
        runner = environment.runner
        settings = settings_from_options(environment.parsed_options)
        worker_index = runner.worker_index if isinstance(runner, WorkerRunner) else None
        _process["ctx"] = ProcessContext(settings, environment.host or "", worker_index)
    return _process["ctx"]


def _scheduler(environment: Environment) -> replay.WorkerScheduler:
    if "scheduler" not in _process:
        ctx = _context(environment)
        _process["scheduler"] = replay.WorkerScheduler(
            environment, ctx, in_flight_cap=ctx.settings.inflight_cap,
            awake_ns=int(ctx.settings.pacer_awake_us * 1_000))
    return _process["scheduler"]


def _on_lease(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    if not _process.get("started"):
        # A lease can overtake the master's spawn message, which carries the host and options:
        # keep it until the test has started here (its times are absolute, so nothing slips).
        _process.setdefault("early_leases", []).append(msg)
        return
    _scheduler(environment).on_lease(msg)


def _on_sent(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    dispatcher = _process.get("dispatcher")
    if dispatcher is not None:
        dispatcher.on_sent(msg)


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    runner = environment.runner
    options = environment.parsed_options
    settings = settings_from_options(options)
    soak = soak_enabled(options)
    if soak and not isinstance(runner, WorkerRunner) and "soak" not in _process:
        services = SoakServices(
            environment, _process["recorder"], str(settings.run_dir),
            window_s=settings.window,
            compact_every_s=settings.compact_every,
            stats_keep_s=settings.stats_keep, segment=settings.segment)
        environment.events.quit.add_listener(services.close)
        services.start()
        _process["soak"] = services
    if soak and isinstance(runner, WorkerRunner) and "memory_release" not in _process:
        _process["memory_release"] = gevent.spawn(release_memory_loop)
    if isinstance(runner, MasterRunner):
        if settings.workload and not settings.closed_replay and "dispatcher" not in _process:
            # only the process that schedules reads the workload: pandas, at 0.35 s of CPU
            # per start, stays out of the workers
            from locustfiles.schedule_items import (  # noqa: PLC0415
                build_items,
                iter_items,
                plan_concurrency,
            )

            duration = _schedule_duration(settings, options)
            start_seq = settings.start_seq
            # A soak draws its schedule lazily (days of arrivals never sit in memory).
            items: Any = (
                iter_items(settings.workload, settings.plan, duration, settings.seed,
                           settings.prompt_salt, start_seq=start_seq) if soak
                else build_items(settings.workload, settings.plan, duration, settings.seed,
                                 settings.prompt_salt))
            recorder = _process["recorder"]
            sync = _process.get("clock")
            dispatcher = replay.ScheduleDispatcher(
                environment, items, run_id=settings.run_id, run_dir=settings.run_dir,
                records_received=lambda: recorder.received, resume=start_seq > 0,
                clock_offset_ns=sync.offset_ns if sync is not None else None,
                clock_ready=sync.ready if sync is not None else None,
                clock_bound_ns=sync.error_bound_ns if sync is not None else None,
                concurrency=plan_concurrency(settings.workload, settings.plan or None),
                duration_s=duration)
            recorder.batch_listeners.append(dispatcher.on_records)
            _process["dispatcher"] = dispatcher
            if "soak" in _process:  # its structures' sizes go to soak_state.json
                _process["soak"].probes.update(
                    acked=lambda: len(dispatcher.acked),
                    outstanding=lambda: len(dispatcher.outstanding),
                    schedule_buffered=lambda: len(dispatcher.pending),
                    replay_events=lambda: len(dispatcher.events))
            dispatcher.start()
        return
    if runner is None:
        return
    _context(environment)
    _process["started"] = True
    for early in _process.pop("early_leases", []):
        _scheduler(environment).on_lease(early)
    # Everything loaded so far (Locust, gevent, pyarrow, the request plan) lives for the whole
    # run: out of the cyclic GC's sight, a full collection no longer walks it, and a full
    # collection on the loop that timestamps tokens is a stall of tens of milliseconds.
    gc.collect()
    gc.freeze()
    if settings.workload and not settings.closed_replay and (
            runner.__class__.__name__ == "LocalRunner") and "scheduler" not in _process:
        from locustfiles.schedule_items import build_items  # noqa: PLC0415 - as above

        items = build_items(settings.workload, settings.plan,
                            _schedule_duration(settings, options), settings.seed,
                            settings.prompt_salt)
        scheduler = _scheduler(environment)
        scheduler.start()
        scheduler.add(clock_sync.wall_ns() + 1_000_000_000, items)


def _schedule_duration(settings: RunConfig, options: Any) -> float:
    if settings.schedule_duration > 0:
        return settings.schedule_duration
    run_time = getattr(options, "run_time", None) or 60
    return max(float(run_time) - 10.0, float(run_time) * 0.5)


@events.test_stop.add_listener
def _on_test_stop(**_kwargs: Any) -> None:
    dispatcher = _process.get("dispatcher")
    if dispatcher is not None:
        dispatcher.stop()
    scheduler = _process.get("scheduler")
    if scheduler is not None:
        scheduler.stop()


@events.quitting.add_listener
def _on_quitting(**_kwargs: Any) -> None:
    ctx = _process.pop("ctx", None)
    if ctx is not None:
        ctx.close()


class StreamingLLMUser(User):
    """One closed-loop user: send a streaming request, wait for it to finish, send the next."""

    wait_time = constant(0)

    @task
    def stream_one(self) -> None:
        ctx = _context(self.environment)
        if ctx.replay is not None:
            self.replay_one(ctx, next(ctx.replay))
            return
        request = ctx.next_request()
        http_request_id = ctx.request_id(request.request_id)
        ctx.note_sent(request.request_id, http_request_id, request.bucket, ctx.settings.endpoint,
                      request.target_prompt_tokens, request.max_tokens)
        try:
            timing = ctx.stream(ctx.path, ctx.payload(request), http_request_id)
        except gevent.GreenletExit as exc:
            # Stopped in flight (run over, Ctrl-C): the request still gets its one record,
            # ``cancelled`` with how long it had waited; the worker's final report carries it.
            cancelled = cancelled_timing(exc)
            if cancelled is not None:
                self._write_record(ctx, request, cancelled, http_request_id)
            raise
        self._write_record(ctx, request, timing, http_request_id)

    def replay_one(self, ctx: ProcessContext, item: dict[str, Any]) -> None:
        """The workload's next request (``closed_replay``), as :meth:`stream_one` sends one of
        the mix: its own endpoint, prompt or messages and max tokens."""
        request = PromptRequest(item["rid"], item["bucket"], "", item["ptoks"],
                                item["max_tokens"])
        http_request_id = ctx.request_id(request.request_id)
        ctx.note_sent(request.request_id, http_request_id, request.bucket, item["endpoint"],
                      request.target_prompt_tokens, request.max_tokens)
        try:
            timing = ctx.stream(ENDPOINT_PATHS[item["endpoint"]], ctx.item_payload(item),
                                http_request_id)
        except gevent.GreenletExit as exc:
            cancelled = cancelled_timing(exc)
            if cancelled is not None:
                self._write_record(ctx, request, cancelled, http_request_id, item["endpoint"])
            raise
        self._write_record(ctx, request, timing, http_request_id, item["endpoint"])

    def _write_record(self, ctx: ProcessContext, request: Any, timing: Any,
                      http_request_id: str, endpoint: str | None = None) -> None:
        record = build_record(
            timing,
            http_request_id=http_request_id,
            run_id=ctx.settings.run_id,
            worker_id=ctx.worker_id,
            request_id=request.request_id,
            bucket=request.bucket,
            endpoint=endpoint or ctx.settings.endpoint,
            target_prompt_tokens=request.target_prompt_tokens,
            max_tokens=request.max_tokens,
        )
        fire_live_stats(self.environment, record)
        fire_record(self.environment, record)

