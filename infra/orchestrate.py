"""``swarmload run``: target, Locust master + N workers, collectors, summary, in one command.

    swarmload run                                  # simulator, 2 workers, 16 users, 45 s
    swarmload run --target vllm-cpu --users 32 --duration 60
    swarmload run --target http://127.0.0.1:8000 --workers 4 --users 256

Every child runs in its own session so Ctrl-C reaches only this process, which then stops them in
order: the master first (it collects the workers' last records), then workers, collectors, the
target. The summary is computed from the Parquet records, never from Locust's rounded stats.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.auth import TOKEN_ENV, new_token, token_from_env, token_problem
from collectors.balancer_log import BALANCER_DIR, HAPROXY_LOG
from collectors.gpu import probe_gpus
from collectors.headers import parse_headers
from collectors.journal import reconcile
from collectors.manifest import (
    package_versions,
    parse_labels,
    redacted_command,
    this_host,
    utc_now_iso,
)
from collectors.run_folder import load_manifest, load_requests, update_manifest
from dashboards.analysis.generator_cpu import (
    HOST_STARVED,
    generator_cpu_warnings,
    host_starved_warning,
    run_remedy,
)
from dashboards.analysis.runs import (
    error_bound,
    format_summary,
    generator_warnings,
    summarize_requests,
)
from infra.cores import CorePlan, CorePlanError, core_plan, rest_of_the_run, set_cores
from infra.faults import FaultDriver, FaultPlanError, load_fault_plan
from infra.ports import free_port
from infra.preflight import PreflightError, UnknownModel, check_target
from infra.procs import ProcessGroup
from infra.progress_panel import RunProgress
from infra.remote_collect import RemoteCollectorError, RemoteCollectors
from infra.summary import print_details
from infra.targets.engine import Engine, EngineError, LaunchSpec, Target
from infra.targets.haproxy import BalancerWatch, HaproxyError, HealthCheck
from infra.targets.registry import KINDS, engine_of, kinds_help, kinds_text, kinds_that
from infra.targets.replicas import (
    ReplicaError,
    balanced,
    started_replicas,
)
from infra.workers_auto import WORKER_EVENTS_PER_S, size_workers
from locustfiles import LOCUSTFILE
from locustfiles.config import (
    ConfigError,
    RunArgumentParser,
    RunConfig,
    add_cli_arguments,
    cli_flag,
    new_run_id,
)
from locustfiles.context import SettingsError, api_key, client_settings
from locustfiles.streaming import get_json, make_client
from workloads.arrivals import ClosedPlan, load_plan, save_plan
from workloads.builtin_mix import new_prompt_salt
from workloads.errors import WorkloadError
from workloads.schema import PLAN_FILE, WORKLOAD_FILE, arrival_unit

# Exit codes of `swarmload run` and `swarmload study run` (the docs site's exit-code page is
# generated from these lines, comments included).
EXIT_OK = 0  # the run finished
EXIT_FAILED = 1  # the run started but failed (a process died, nothing finished in time)
EXIT_BAD_INPUT = 2  # a flag, file or combination that cannot work: nothing was started
EXIT_UNREACHABLE = 3  # the target did not answer the preflight: no load was sent
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (records so far are kept)


# --target's help: every registered kind, and what else it takes
TARGET_HELP = f"{kinds_help()}, or a base URL (comma-separated: several replicas)"


class RunError(RuntimeError):
    """The run could not be set up or did not complete; the message says what to fix."""

    exit_code = EXIT_FAILED


class InputError(RunError):
    """Bad input found before any load (a folder, file or combination that cannot work)."""

    exit_code = EXIT_BAD_INPUT


class TargetError(RunError):
    """The target does not answer as needed (refused, DNS, TLS, 401/403, no API)."""

    exit_code = EXIT_UNREACHABLE


def build_parser(command: str = "run", description: str | None = None,
                 prog: str | None = None) -> argparse.ArgumentParser:
    """The flags of ``swarmload <command>`` (run, master, soak, worker, study-run): one per
    :class:`RunConfig` field whose ``cli`` names the command (locustfiles/config.py)."""
    p = RunArgumentParser(prog=prog or f"swarmload {command}", description=description or __doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_arguments(p, command)
    for action in p._actions:  # the kinds are the registry's (locustfiles knows no infra)
        if "--target" in action.option_strings:
            action.help = TARGET_HELP
    return p


def parse_args(argv: list[str], command: str = "run") -> RunConfig:
    """argv -> a validated :class:`RunConfig`; raises InputError naming the flag."""
    return config_from(build_parser(command).parse_args(argv))


def parse_or_exit(parser: argparse.ArgumentParser, argv: list[str]) -> RunConfig:
    """The validated :class:`RunConfig` of ``argv``; a check across flags that fails ends the
    command as argparse does for one flag: ``<prog>: --flag: problem`` and exit status 2."""
    try:
        return config_from(parser.parse_args(argv))
    except InputError as exc:
        parser.exit(EXIT_BAD_INPUT, f"{parser.prog}: {exc}\n")


def config_from(namespace: argparse.Namespace, **overrides: Any) -> RunConfig:
    """The :class:`RunConfig` of a parsed command line (the checks across fields too, and the
    target kind against the registry); raises InputError naming the flag."""
    try:
        config = RunConfig.from_cli(namespace, **overrides)
    except ConfigError as exc:
        raise InputError(f"{cli_flag(exc.field)}: {exc.problem}") from None
    if "://" not in config.target and engine_of(config.target) is None:
        raise InputError(f"--target: got {config.target!r}; allowed: {', '.join(KINDS)}, or "
                         "base URLs like http://127.0.0.1:8000 (comma-separated for replicas)")
    return config


@dataclass
class RunHooks:
    """What a caller (``swarmload soak``) adds to a run's orchestration: not run options,
    which are all :class:`RunConfig`'s."""

    log_subdir: str = ""  # the processes' logs under logs/<log_subdir>/ (a soak's segment)
    resume: bool = False  # the run folder exists: a soak's next segment goes on in it
    reconcile_horizon_s: float | None = None  # journals are read this far back only
    collector_args: list[str] = field(default_factory=list)  # `swarmload collect` flags
    # called once the target serves (run folder, target); returns more collector flags
    on_target_ready: Callable[[Path, Target], list[str]] | None = None
    on_tick: Callable[[Path], None] | None = None  # every second while the load runs


def launch_spec(config: RunConfig, traces_endpoint: str | None = None) -> LaunchSpec:
    """How ``config``'s target is started (``traces_endpoint``: where a server started here
    sends its spans)."""
    return LaunchSpec(
        kind=config.target, args=tuple(config.target_args), model=config.target_model or None,
        python=config.target_python or None, traces_endpoint=traces_endpoint,
        replicas=config.replicas, balance=config.balance,
        health_check=(HealthCheck(config.health_check_interval, config.health_check_fall,
                                  config.health_check_rise)
                      if config.health_check_interval > 0 else None),
        session_header=config.session_header or None)


@contextlib.contextmanager
def start_replicated(spec: LaunchSpec, run_dir: Path, say: Any) -> Iterator[Target]:
    """The target of ``spec``; with ``replicas`` N or several base URLs, behind its balance."""
    urls = [u.strip() for u in spec.kind.split(",") if u.strip()]
    many = len(urls) > 1 or spec.replicas > 1
    if not many:
        with start_target(spec, say) as target:
            yield target
        return
    if len(urls) > 1 and spec.replicas > 1:
        raise RunError("--replicas starts replicas; with several --target URLs leave it out")
    with contextlib.ExitStack() as stack:
        model = None
        servers: list[Any] = []
        if len(urls) == 1:
            servers, model = replica_servers(spec, run_dir)
            say(f"starting {spec.replicas} {spec.kind} replicas ...")
            try:
                urls = stack.enter_context(started_replicas(servers, say))
            except ReplicaError as exc:
                raise RunError(str(exc)) from exc
        elif not spec.urls:
            raise RunError(f"--target {spec.kind!r}: several replicas are base URLs")
        try:
            replicas = stack.enter_context(balanced(
                urls, spec.balance, run_dir / BALANCER_DIR, spec.health_check,
                session_header=spec.session_header))
        except HaproxyError as exc:
            raise RunError(str(exc)) from exc
        replicas.servers = servers
        say(f"{len(urls)} replicas, balance {spec.balance}: {', '.join(urls)}")
        yield Target(spec.kind if servers else "endpoints", replicas.base_url, model,
                     pid=replicas.haproxy.pid if replicas.haproxy else None,
                     launch_args=replicas.haproxy.launch_args if replicas.haproxy else [],
                     replicas=replicas)


def replica_servers(spec: LaunchSpec, run_dir: Path) -> tuple[list[Any], str | None]:
    """``replicas`` N of ``spec.kind``: the servers to start (unstarted) and the model name,
    each made by its engine's ``replica`` (infra.targets.engine)."""
    engine = _engine(spec)
    if engine.replica is None:
        raise RunError(f"--replicas N starts --target {kinds_text(kinds_that('replicas'))}, not "
                       f"{spec.kind!r}; for other servers pass their URLs: "
                       "--target http://a:8000,http://b:8000")
    try:
        servers = [engine.replica(spec, f"r{i}", i, run_dir) for i in range(spec.replicas)]
    except EngineError as exc:
        raise RunError(str(exc)) from exc
    return servers, engine.model_name(spec)


@contextlib.contextmanager
def start_target(spec: LaunchSpec, say: Any) -> Iterator[Target]:
    """Start ``spec.kind`` (a registered kind: infra.targets.registry) and yield it serving; a
    base URL is used as it is."""
    if spec.kind.startswith(("http://", "https://")):
        yield Target("endpoint", spec.kind.rstrip("/"))
        return
    engine = _engine(spec)
    if engine.needs_model and not spec.model:
        raise RunError(f"target {spec.kind} needs a model folder (--target-model DIR, or model: "
                       "in the study configuration)")
    with contextlib.ExitStack() as stack:
        try:
            target = stack.enter_context(engine.start(spec, say))
        except EngineError as exc:
            raise RunError(str(exc)) from exc
        yield target


def _engine(spec: LaunchSpec) -> Engine:
    engine = engine_of(spec.kind)
    if engine is None:
        raise RunError(f"--target {spec.kind!r}: use {kinds_text(KINDS)} or a URL like "
                       "http://127.0.0.1:8000")
    return engine


def _process_group(log_dir: Path) -> ProcessGroup:
    # SIGKILL when the orchestrator dies (kill -9): a crashed run's master and workers must not
    # go on writing into a run folder that ``swarmload soak --resume`` then continues.
    return ProcessGroup(log_dir, parent_death_signal=signal.SIGKILL)


def crash_warnings(deaths: dict[str, dict[str, Any]], reconciled: dict[str, Any]) -> list[str]:
    """One line per process of the run that died while it was needed, and what it cost."""
    lines = []
    for name, info in deaths.items():
        effect = {"master": "the run stopped; records it had not stored are record_lost",
                  "collectors": "telemetry stops at that moment"}.get(
            name, "its unfinished requests are worker_lost; the others went on")
        lines.append(f"CRASHED: {name} (pid {info['pid']}) died: {info['exit']}; {effect}")
    if reconciled.get("reconciled"):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(reconciled["by_outcome"].items()))
        lines.append(f"{reconciled['reconciled']} request(s) sent without a stored record were "
                     f"recorded from the workers' send journals ({counts})")
    return lines


def locust_common_args(config: RunConfig, run_id: str, run_dir: Path) -> list[str]:
    """Locust's command line for this run's master and workers: the ``--swarmload-*`` options
    come from the same :class:`RunConfig`, with paths made absolute for the children (secret
    ones, header values, travel in the environment: :meth:`RunConfig.locust_env`)."""
    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if path else ""

    worker_config = replace(
        config, run_id=run_id, run_dir=str(run_dir), workload=absolute(config.workload),
        plan=absolute(config.plan), ca_bundle=absolute(config.ca_bundle),
        api_key_file=absolute(config.api_key_file),
        schedule_duration=config.duration if config.workload else 0.0)
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
            *worker_config.locust_argv()]


def check_endpoint(config: RunConfig, base_url: str) -> dict[str, Any]:
    """Try the target's ``/v1/models`` with the run's TLS settings, key and headers before any
    load starts, so a wrong CA or key fails once with a message that says what to do. Returns
    the manifest's ``endpoint`` facts (names and paths only; never a key or a header value)."""
    tls = base_url.startswith("https://")
    if (config.ca_bundle or config.insecure) and not tls:
        raise InputError("--ca-bundle and --insecure are for https:// targets")
    if config.ca_bundle and not Path(config.ca_bundle).is_file():
        raise InputError(f"--ca-bundle {config.ca_bundle}: no such file")
    try:
        headers = parse_headers(config.headers)
        _key, key_source = api_key(config.api_key_env or None, config.api_key_file or None)
        client = make_client(base_url, client_settings(config))
    except (SettingsError, ValueError) as exc:
        raise InputError(str(exc)) from None
    try:
        get_json(client, "/v1/models")
    except Exception as exc:  # noqa: BLE001 - classified below, the run decides
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            reason = re.sub(r"\s*\(_ssl\.c:\d+\)", "", text.split("verify failed:")[-1])
            reason = reason.strip(" )'\"") or text
            raise TargetError(
                f"TLS certificate verification failed for {base_url}: {reason}. Pass "
                "--ca-bundle FILE with the CA that signed the server's certificate, or "
                "--insecure to skip verification (the summary and manifest will say so)"
            ) from None
        if "HTTP 401" in text or "HTTP 403" in text:
            raise TargetError(
                f"{base_url} refused the request ({text.rsplit(': ', 1)[-1]}): "
                + (f"the key from {key_source} was not accepted" if key_source else
                   "no API key was sent; set OPENAI_API_KEY, or pass --api-key-env NAME or "
                   "--api-key-file FILE")) from None
        # anything else (refused, DNS, no /v1/models ...) is the preflight's to say
    finally:
        client.close()
    return {"tls": tls, "verify": tls and not config.insecure, "insecure": config.insecure,
            "ca_bundle": str(Path(config.ca_bundle).resolve()) if config.ca_bundle else None,
            "api_key": key_source, "headers": [name for name, _ in headers],
            "stream": config.stream, "request_id_header": "X-Request-Id"}


def preflight(config: RunConfig, base_url: str) -> str | None:
    """The target answers ``/v1/models`` and streams one token (:mod:`infra.preflight`), with
    the run's key, headers and TLS settings; returns the model to use. Skipped (None) when
    ``--preflight-timeout 0``."""
    if config.preflight_timeout <= 0:
        return None
    settings = client_settings(config)
    verify: Any = True
    if config.insecure:
        verify = False
    elif config.ca_bundle:
        verify = ssl.create_default_context(cafile=config.ca_bundle)
    try:
        return check_target(base_url, model=config.model, endpoint=config.endpoint,
                            timeout_s=config.preflight_timeout, headers=dict(settings.headers),
                            verify=verify, stream=config.stream)
    except UnknownModel as exc:
        raise InputError(f"--model: {exc}") from None
    except PreflightError as exc:
        raise TargetError(f"target {base_url}: {exc}") from None


@dataclass
class _Session:
    """One run's state, handed from stage to stage of :func:`run`."""

    config: RunConfig
    hooks: RunHooks
    say: Callable[[str], None]
    launch: LaunchSpec  # how the target is started (unless a study started it)
    run_id: str
    run_dir: Path
    procs: ProcessGroup
    labels: dict[str, str]
    live_url: str | None
    token: str
    traces: dict[str, Any] | None
    open_loop: dict[str, Any] | None
    fault_plan: Any
    users: int  # open-loop replay runs no Locust users at all
    run_time: float
    spawn_rate: float
    cores: CorePlan | None  # --pin-workers: each local worker's core, and the rest's
    sized: str = ""  # --workers auto: how the count was chosen (the manifest keeps it)
    status: str = "failed"
    interrupted: bool = False


def run(config: RunConfig, hooks: RunHooks | None = None,
        started: Target | None = None) -> Path:
    """One run of ``config`` (``hooks``: what ``swarmload soak`` adds). Raises RunError
    (InputError, TargetError) before any load on bad input.

    ``started``: replicas started already (a study's configuration: :func:`start_replicated`),
    loaded instead of starting the target; the part of their shared logs (HAProxy's, the
    simulators' request logs) written during this run is copied into its run folder.

    The stages, in order: :func:`_plan` (every check that needs nothing started, the run
    folder), the target (started here or ``started``), :func:`_check_target` (preflight of
    every replica), :func:`_write_start_manifest`, :func:`_start_watchers` (HAProxy's view,
    the fault drill), :func:`_launch` (collectors, master, workers), :func:`_supervise` (until
    the master ends), :func:`_finish` (stop in order, reconcile, the final manifest)."""
    s = _plan(config, hooks or RunHooks())
    with contextlib.ExitStack() as stack:
        if s.cores is not None:  # before the target starts: it and the rest start there
            stack.enter_context(rest_of_the_run(s.cores))
        target = stack.enter_context(contextlib.nullcontext(started) if started is not None
                                     else start_replicated(s.launch, s.run_dir, s.say))
        shared_logs = _log_marks(target) if started is not None else []
        endpoint = _check_target(s, target)
        _write_start_manifest(s, target, endpoint)
        watch, faults = _start_watchers(stack, s, target)
        collector_args = list(s.hooks.collector_args)
        if s.hooks.on_target_ready is not None:  # `swarmload soak`: the server's pid, segment
            collector_args += s.hooks.on_target_ready(s.run_dir, target)
        _announce(s, target)
        remote = RemoteCollectors(list(s.config.remote_collector))
        try:
            remote.measure()  # each remote collector's clock, before any load
        except RemoteCollectorError as exc:
            raise RunError(f"--remote-collector: {exc}") from exc
        try:
            local_workers = _launch(s, target, collector_args)
            _supervise(s, local_workers)
            s.status = "finished"
        except KeyboardInterrupt:
            s.interrupted, s.status = True, "interrupted"
            s.say("interrupted: stopping the master (it collects the workers' last records) ...")
        finally:
            _finish(s, target, remote, faults, watch, shared_logs)
    if s.interrupted:
        s.say(f"run {s.run_id} interrupted; records so far are in {s.run_dir}")
    return s.run_dir


def _plan(config: RunConfig, hooks: RunHooks) -> _Session:
    """Every check that needs nothing started (raises InputError), then the run folder."""
    if config.workload and config.endpoint != "chat" and _is_session_workload(
            Path(config.workload)):
        config = replace(config, endpoint="chat")  # a session is a conversation: always chat
    config, sized = _size_workers(config)
    say = (lambda *_a: None) if config.quiet else (lambda msg: print(f"[swarmload] {msg}",
                                                                    flush=True))
    if sized:
        say(sized)
    labels = parse_labels(config.labels)
    _check_target_args(config)
    live_url = _check_prometheus_port(config)
    token = _run_token(config)
    traces = _server_traces_listen(config)
    open_loop = _open_loop_plan(config)
    if config.workload and open_loop is None:
        config = replace(config, closed_replay=True)
        say(f"{config.workload} has no arrival plan: {config.users} closed-loop users send its "
            "requests in turn (--users; --plan or --arrivals for open loop)")
    fault_plan = _fault_plan(config)
    cores = _core_plan(config)
    resuming = hooks.resume  # `swarmload soak --resume`
    run_id = config.run_id or new_run_id()
    if not config.prompt_salt:
        config = replace(config, prompt_salt=new_prompt_salt())
    run_dir = Path(config.results).resolve() / run_id
    if run_dir.exists() and not resuming:
        raise InputError(f"run folder {run_dir} already exists; pick another --run-id")
    run_dir.mkdir(parents=True, exist_ok=resuming)
    if open_loop is not None and open_loop["path"] is None:
        path = save_plan(ClosedPlan(concurrency=config.users), run_dir / PLAN_FILE).resolve()
        open_loop["path"] = str(path)
        config = replace(config, plan=str(path))
        say(f"{config.workload} has no arrival plan: {config.users} sessions at a time, "
            f"closed loop (--users; the plan: {path})")
    users = 0 if open_loop else config.users
    return _Session(
        config=config, hooks=hooks, say=say, run_id=run_id, run_dir=run_dir,
        launch=launch_spec(config, traces["endpoint"] if traces and traces["launched"] else None),
        procs=_process_group(run_dir / "logs" / hooks.log_subdir), labels=labels,
        live_url=live_url, token=token, traces=traces, open_loop=open_loop,
        fault_plan=fault_plan, users=users, cores=cores, sized=sized,
        run_time=config.duration + config.drain + 10 if open_loop else config.duration,
        spawn_rate=config.spawn_rate or float(max(users, 1)))


def _check_target(s: _Session, target: Target) -> dict[str, Any]:
    """Every replica itself (not through the load balancer, whose counts the records are
    checked against); a server given by URL is asked for one token first (its model becomes
    the run's when none was given). Returns the endpoint facts of the last one."""
    replicas = target.replicas
    try:
        for url in (replicas.urls if replicas else [target.base_url]):
            endpoint = check_endpoint(s.config, url)
            # one started here has just been waited for until it served, by its own start-up
            if target.kind in ("endpoint", "endpoints"):
                model = preflight(s.config, url)
                if model and not s.config.model:
                    s.config = replace(s.config, model=model)
    except RunError:
        if not s.hooks.resume:
            shutil.rmtree(s.run_dir, ignore_errors=True)  # made just now; nothing ran
        raise
    if endpoint["insecure"]:
        s.say("WARNING: --insecure: the target's TLS certificate is NOT verified")
    return endpoint


def _write_start_manifest(s: _Session, target: Target, endpoint: dict[str, Any]) -> None:
    """The manifest as the load starts: the target, workload, load, versions, collectors."""
    config, replicas, open_loop = s.config, target.replicas, s.open_loop
    gpu = probe_gpus()
    first = ({} if s.hooks.resume else
             {"started_at": utc_now_iso(), "command": redacted_command(sys.argv)})
    update_manifest(
        s.run_dir, run_id=s.run_id, status="running", ended_at=None, **first,
        endpoint=endpoint,
        target={"kind": target.kind, "base_url": target.base_url,
                "model": config.model or target.model,
                "launch_args": target.launch_args, "pid": target.pid,
                "replicas": replicas.manifest() if replicas else [],
                "balance": replicas.balance if replicas else None,
                "launch": target.launch},
        workload=_workload_facts(config, open_loop), prompt_salt=config.prompt_salt,
        load={"kind": open_loop["kind"] if open_loop else "closed-loop",
              "plan": open_loop, "workers": config.workers, "users": s.users,
              "workers_auto": s.sized or None,
              "spawn_rate": s.spawn_rate, "duration_s": config.duration,
              "inflight_cap": config.inflight_cap if open_loop else None},
        versions=package_versions(), hosts=[this_host("orchestrator")], gpu=gpu,
        labels=s.labels, live_metrics={"url": s.live_url} if s.live_url else None,
        # what the collectors cost the server depends on these (BENCHMARKS.md)
        collectors={"enabled": not config.no_collectors, "gpu_interval_s": config.gpu_interval,
                    "metrics_interval_s": config.metrics_interval, "server_traces": s.traces},
    )


def _start_watchers(stack: contextlib.ExitStack, s: _Session,
                    target: Target) -> tuple[Any, Any]:
    """HAProxy's view of each replica (UP/DOWN and when) through the whole run, and the fault
    drill acted out on the replicas; (None, None) where there are none."""
    replicas = target.replicas
    watch = faults = None
    if replicas is not None and replicas.haproxy is not None:
        watch = stack.enter_context(BalancerWatch(replicas.haproxy))
    if s.fault_plan is not None and replicas is not None:
        faults = FaultDriver(s.fault_plan, replicas, s.run_dir, watch, s.say).start()
    return watch, faults


def _announce(s: _Session, target: Target) -> None:
    config = s.config
    load_text = (f"open-loop {s.open_loop['kind']} replay of {config.workload}" if s.open_loop
                 else f"{config.users} users")
    s.say(f"run {s.run_id}: target {target.base_url}, {config.workers} workers, "
          f"{load_text}, {config.duration:g} s")
    if s.live_url:
        s.say(f"live metrics for Prometheus: {s.live_url}")


def _launch(s: _Session, target: Target, collector_args: list[str]) -> int:
    """The collectors, the Locust master and the local workers; returns how many workers were
    started here."""
    config, procs = s.config, s.procs
    if not config.no_collectors:
        _start_collectors(procs, config, s.traces, s.run_id, s.run_dir, target, collector_args)
    # `swarmload master` (infra.roles) binds where remote workers reach it and starts
    # no local worker; `run` keeps everything on loopback.
    bind = config.master_bind
    port = config.master_port or free_port(bind)
    local_workers = (config.workers if config.local_workers is None
                     else config.local_workers)
    common = locust_common_args(config, s.run_id, s.run_dir)
    env = {**config.locust_env(), TOKEN_ENV: s.token}  # workers prove they know it
    replicas = target.replicas
    if replicas is not None and replicas.client_targets:
        common += ["--swarmload-targets", ",".join(replicas.client_targets),
                   "--swarmload-balance", replicas.balance]
    procs.start("master", [
        *common, "--master", "--headless", "--master-bind-host", bind,
        "--master-bind-port", str(port), "--expect-workers", str(config.workers),
        "--expect-workers-max-wait", f"{config.worker_wait_s:.0f}",
        "-u", str(s.users), "-r", str(s.spawn_rate),
        "-t", f"{int(round(s.run_time))}s", "--host", target.base_url,
        "--stop-timeout", "0", "--only-summary",
        # failed requests are in the records; a non-zero exit means the master failed
        "--exit-code-on-error", "0",
    ], env)
    if local_workers < config.workers:
        s.say(f"master listening on {bind}:{port}; waiting for "
              f"{config.workers - local_workers} workers "
              f"(swarmload worker --master HOST:{port})")
    pinned: dict[str, list[int]] = {}
    for i in range(local_workers):
        name = f"worker-{i}"
        procs.start(name, [*common, "--worker", "--master-host", "127.0.0.1",
                           "--master-port", str(port)], env)
        if s.cores is not None:  # at once: its interpreter has started no thread yet
            pinned[name] = sorted(set_cores(procs.procs[name].pid, [s.cores.workers[i]]))
    if s.cores is not None:
        update_manifest(s.run_dir, cpu_cores={"workers": pinned, "rest": list(s.cores.rest)})
        s.say("workers on cores of their own: " + ", ".join(
            f"{name} on {cores}" for name, cores in pinned.items()))
    return local_workers


def _supervise(s: _Session, local_workers: int) -> None:
    """Until the master ends, with live progress; a worker or the collector that dies before
    the master is a crash and the run goes on with the others (the manifest says so). Raises
    RunError when every local worker has gone or the master overruns its time."""
    config, procs, run_dir = s.config, s.procs, s.run_dir
    deadline = time.monotonic() + s.run_time + 90.0 + config.worker_wait_s
    mode = config.progress if not (config.quiet and config.progress == "auto") else "off"
    with RunProgress(run_dir, config.duration, mode=mode, title=(
            config.progress_title or f"run {s.run_id}"),
            events_budget_per_s=config.workers * WORKER_EVENTS_PER_S) as view:
        while time.monotonic() < deadline:
            code = procs.wait("master", 1.0)
            view.tick()
            if s.hooks.on_tick is not None:  # `swarmload soak`: the live early warning
                s.hooks.on_tick(run_dir)
            for name in procs.check([n for n in procs.procs if n != "master"]):
                s.say(f"WARNING: {name} died ({procs.deaths[name]['exit']})")
            if code is not None:
                if code != 0:
                    procs.check(["master"])
                    s.say("WARNING: the Locust master died "
                          f"({procs.deaths['master']['exit']})")
                return
            dead = [n for n, p in procs.procs.items()
                    if n.startswith("worker") and p.poll() is not None]
            if dead and len(dead) == local_workers and (
                    procs.wait("master", 15.0) is None):
                raise RunError(f"all workers exited early; see {run_dir / 'logs'}")
    raise RunError("the Locust master did not finish in time; see "
                   f"{run_dir / 'logs'}")


def _finish(s: _Session, target: Target, remote: RemoteCollectors, faults: Any, watch: Any,
            shared_logs: list[tuple[Path, Path, int]]) -> None:
    """Stop in order (the fault drill, the master, workers, collectors after the telemetry
    tail, the remote collectors' files in), then the final manifest: exit codes, crashes, the
    records reconciled with the send journals, hosts, clocks."""
    procs, run_dir, replicas = s.procs, s.run_dir, target.replicas
    if faults is not None:  # actions not due yet are recorded as not done
        faults.stop()
        update_manifest(run_dir, faults=faults.manifest())
    procs.stop("master", timeout_s=20.0)
    for name in [n for n in procs.procs if n.startswith("worker")]:
        procs.stop(name, timeout_s=10.0)
    if not s.interrupted and ("collectors" in procs.procs or remote.urls):
        _telemetry_tail(s, remote)
    procs.stop("collectors", timeout_s=10.0)
    remote_hosts = remote.finish(run_dir)  # their files into this run folder
    procs.stop_all()
    _copy_log_tails(shared_logs, run_dir)
    codes = {n: p.returncode for n, p in procs.procs.items()}
    recorder = _read_json(run_dir / "recorder_stats.json") or {}
    if replicas is not None and replicas.haproxy is not None:
        # HAProxy's own counts, read while it still runs: the records are checked
        # against them (summary's per-replica table)
        with contextlib.suppress(OSError):
            update_manifest(run_dir, balancer={
                **(replicas.balancer_stats() or {}),
                **({"watch": watch.manifest()} if watch is not None else {})})
    horizon_s = s.hooks.reconcile_horizon_s  # `swarmload soak`
    since_ns = None if horizon_s is None else min(
        [int(d["wall_ns"]) for d in procs.deaths.values() if d.get("wall_ns")]
        + [time.time_ns()]) - int(horizon_s * 1e9)
    reconciled = reconcile(run_dir, s.run_id, procs.deaths,
                           {n: p.pid for n, p in procs.procs.items()}, since_ns=since_ns)
    recorder["reconciled"] = reconciled
    if procs.deaths:
        s.status = "crashed"  # never "finished" when a process of the run died
    update_manifest(run_dir, status=s.status, ended_at=utc_now_iso(), exit_codes=codes,
                    crashes=list(procs.deaths.values()),
                    crash_warnings=crash_warnings(procs.deaths, reconciled),
                    recorder=recorder, hosts=_hosts(procs, recorder) + remote_hosts,
                    clock=recorder.get("clock") or {},
                    replay_events=_read_json(run_dir / "replay_events.json"))
    s.say("stopping the target ...")


def _telemetry_tail(s: _Session, remote: RemoteCollectors) -> None:
    """After the load: the server's last spans arrive (it exports them in batches:
    OTEL_BSP_SCHEDULE_DELAY, ``traces["wait_s"]``), then the collectors sample on until each
    of them has a sample showing the server settled (SIGUSR1: ``swarmload collect``), for at
    most ``--telemetry-tail`` seconds in all. Collectors on other hosts are not told: the run
    waits the whole tail for them."""
    spans_s = s.traces["wait_s"] if s.traces else 0.0
    tail_s = max(s.config.telemetry_tail, spans_s)
    collectors = s.procs.procs.get("collectors")
    if remote.urls or collectors is None or tail_s <= spans_s:
        time.sleep(tail_s)
        return
    started = time.monotonic()
    time.sleep(spans_s)
    collectors.popen.send_signal(signal.SIGUSR1)
    collectors.wait(max(0.0, tail_s - (time.monotonic() - started)))


def _size_workers(config: RunConfig) -> tuple[RunConfig, str]:
    """``--workers auto`` sized to the load (infra/workers_auto.py); bad plan input: one line."""
    try:
        return size_workers(config)
    except (WorkloadError, OSError, ValueError) as exc:
        raise InputError(f"--workers auto: {exc}") from None


def _core_plan(config: RunConfig) -> CorePlan | None:
    """``--pin-workers``: a core for each worker started here and one at least for the rest."""
    if not config.pin_workers:
        return None
    local = config.workers if config.local_workers is None else config.local_workers
    try:
        return core_plan(local)
    except CorePlanError as exc:
        raise InputError(f"--pin-workers: {exc}") from exc


def _run_token(config: RunConfig) -> str:
    """The token the master asks every worker for (``SWARMLOAD_TOKEN``, never written to the
    run folder): the caller's, or, when every worker is started here, a fresh one. Workers on
    other hosts and remote collectors need the caller's own (set on both sides)."""
    token = token_from_env()
    remote_workers = config.local_workers is not None and config.local_workers < config.workers
    if remote_workers or config.remote_collector:
        problem = token_problem(token)
        if problem:
            who = "workers on other hosts" if remote_workers else "--remote-collector"
            raise InputError(f"{who}: {problem}; it is never written to the run folder")
    return token or new_token()


def _check_prometheus_port(config: RunConfig) -> str | None:
    """The master's ``/metrics`` URL when ``--prometheus-port`` is set, after making sure it can
    listen there (a port in use fails before any load, not in the master)."""
    if not config.prometheus_port:
        return None
    host, port = config.prometheus_bind, config.prometheus_port
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, port))
    except OSError as exc:
        raise InputError(f"--prometheus-port: cannot listen on {host}:{port} "
                         f"({exc.strerror or exc})") from None
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def _server_traces_listen(config: RunConfig) -> dict[str, Any] | None:
    """``--server-traces``: where the collector receives the server's spans, the endpoint vLLM
    is given (a vLLM this run starts) or must be given (a server given by URL), and how long the
    run waits after the load for the last export. None when off."""
    if not config.server_traces:
        return None
    engine = engine_of(config.target)
    launched = engine is not None and engine.spans
    if engine is not None and not engine.spans:
        raise InputError(f"--server-traces: the {engine.title} sends no spans; use --target "
                         f"{kinds_text(kinds_that('spans'))}, or the URL of a server started "
                         "with its OTLP traces endpoint (vLLM: --otlp-traces-endpoint)")
    port = config.server_traces_port or (free_port(config.server_traces_host) if launched
                                         else 4318)
    host = config.server_traces_host
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return {"host": host, "port": port, "launched": launched,
            "endpoint": f"http://{shown}:{port}/v1/traces",
            # a vLLM started here exports every 0.5 s (infra.targets.vllm_cpu.TRACES_ENV)
            "wait_s": min(config.server_traces_wait, 1.5) if launched
            else config.server_traces_wait}


def _check_target_args(config: RunConfig) -> None:
    """Launch arguments an engine checks itself before anything starts (the simulator's are
    ours; vLLM's are vLLM's: it says what is wrong when it starts)."""
    engine = engine_of(config.target)
    if engine is None or engine.check_args is None or not config.target_args:
        return
    try:
        engine.check_args(config.target_args)
    except ValueError as exc:
        raise InputError(f"--target-arg {' '.join(config.target_args)}: {exc}") from None


def _hosts(procs: ProcessGroup, recorder: dict[str, Any]) -> list[dict[str, Any]]:
    """Every process of the run with its host and that host's clock offset to the master.

    Workers come from the master's clock exchange (``locustfiles.clock_sync``): one entry per
    worker with its measured offset and round trip. A worker on the master's own host shares its
    clock, so its offset is 0 by construction (the measurement, within its error bound, is kept
    beside it as ``measured_offset_s``).
    """
    master_host = recorder.get("master_host") or socket.gethostname()
    hosts = [this_host("orchestrator")]
    for name, proc in procs.procs.items():  # started here, on this host's clock
        role = "worker" if name.startswith("worker") else name
        hosts.append({"host": socket.gethostname(), "role": role, "name": name,
                      "pid": proc.pid, "clock_offset_s": 0.0})
    for client_id, clock in sorted((recorder.get("clock") or {}).items()):
        host = clock.get("host") or client_id
        same_clock = host == master_host
        hosts.append({"host": host, "role": "worker", "client_id": client_id,
                      "clock_offset_s": 0.0 if same_clock else clock.get("offset_s"),
                      "measured_offset_s": clock.get("offset_s"),
                      "clock_error_bound_s": clock.get("error_bound_s"),
                      "clock_samples": clock.get("samples")})
    return hosts


def clock_lines(manifest: dict[str, Any]) -> list[str]:
    """One line per host whose clock is not the master's: its measured offset and bound."""
    lines = []
    for entry in manifest.get("hosts") or []:
        offset = entry.get("clock_offset_s")
        if entry.get("role") not in ("worker", "collector") or not offset:
            continue
        bound = entry.get("clock_error_bound_s")
        lines.append(f"clock: {entry['host']} ({entry['role']}) {offset * 1e3:+.3f} ms from the "
                     f"master's" + (f" (within {bound * 1e3:.3f} ms)" if bound else "")
                     + "; its times are corrected by it")
    return lines


def _open_loop_plan(config: RunConfig) -> dict[str, Any] | None:
    """The arrival plan of ``--workload`` as a dict, or None for closed-loop users."""
    if not config.workload:
        if config.plan:
            raise InputError("--plan needs --workload")
        return None
    folder = Path(config.workload)
    if not (folder / WORKLOAD_FILE).is_file():
        raise InputError(f"--workload {folder}: no {WORKLOAD_FILE}; build one with "
                       "`swarmload workload build`")
    plan_path = Path(config.plan) if config.plan else folder / PLAN_FILE
    if not plan_path.is_file():
        if not config.plan and _is_session_workload(folder):
            # --users N on a session workload built without a plan: N sessions at a time,
            # closed loop; _plan writes the plan into the run folder (path None until then)
            return {"path": None, **asdict(ClosedPlan(concurrency=config.users))}
        if config.plan:
            raise InputError(f"--plan {plan_path}: no such file")
        return None  # --users closed-loop users send its requests in turn (_plan)
    try:
        plan = load_plan(plan_path)
    except WorkloadError as exc:
        raise InputError(str(exc) if str(plan_path) in str(exc) else
                         f"arrival plan {plan_path}: {exc}") from None
    if plan.kind == "closed" and not _is_session_workload(folder):
        raise InputError("a closed plan is closed-loop: use --users N without --workload "
                         "(a session workload runs K sessions at a time under it)")
    return {"path": str(plan_path.resolve()), **asdict(plan)}


def _is_session_workload(folder: Path) -> bool:
    return bool(arrival_unit(folder))  # no workload: _open_loop_plan names what is missing


def _log_marks(target: Target) -> list[tuple[Path, Path, int]]:
    """The logs of replicas started before this run (source, path in the run folder, size
    now), so that what this run added can be copied in at its end."""
    replicas = target.replicas
    if replicas is None:
        return []
    logs = []
    if replicas.haproxy is not None:
        logs.append((replicas.haproxy.config_path.parent / HAPROXY_LOG,
                     Path(BALANCER_DIR) / HAPROXY_LOG))
    for server in replicas.servers:
        request_log = server.request_log()
        if request_log is not None:
            logs.append((request_log, Path("replicas") / f"{server.name}-requests.jsonl"))
    return [(src, dest, src.stat().st_size if src.exists() else 0) for src, dest in logs]


def _copy_log_tails(marks: list[tuple[Path, Path, int]], run_dir: Path) -> None:
    for src, dest, offset in marks:
        with contextlib.suppress(OSError):
            with src.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            (run_dir / dest).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / dest).write_bytes(data)


def _fault_plan(config: RunConfig) -> Any:
    """The ``--fault-plan`` file, read and checked against the replicas the run starts (None
    without one); a bad plan is an InputError that names its file and line."""
    if not config.fault_plan:
        return None
    if config.target not in kinds_that("replicas"):
        raise InputError("--fault-plan acts on replicas the run starts: --target "
                         f"{kinds_text(kinds_that('replicas'))} with --replicas N")
    try:
        plan = load_fault_plan(config.fault_plan)
        plan.check(config.replicas, config.target)
    except FaultPlanError as exc:
        raise InputError(f"--fault-plan {exc}") from None
    return plan


def _workload_facts(config: RunConfig, open_loop: dict[str, Any] | None) -> dict[str, Any]:
    if open_loop or config.closed_replay:
        report = _read_json(Path(config.workload) / "report.json")
        return {"kind": "log-replay", "path": str(Path(config.workload).resolve()),
                "report": report, "ignore_eos": config.ignore_eos,
                "prompt_salt": config.prompt_salt}
    return {"kind": "builtin-mix", "mix": config.mix, "thresholds": config.thresholds,
            "max_tokens": config.max_tokens, "ignore_eos": config.ignore_eos,
            "endpoint": config.endpoint, "seed": config.seed,
            "long_max_tokens": config.long_max_tokens,
            "prompt_salt": config.prompt_salt}


def _start_collectors(procs: ProcessGroup, config: RunConfig, traces: dict[str, Any] | None,
                      run_id: str, run_dir: Path, target: Target, extra: list[str]) -> None:
    argv = [sys.executable, "-m", "infra.cli", "collect", "--run-dir", str(run_dir),
            "--run-id", run_id, "--gpu-interval", str(config.gpu_interval),
            "--metrics-interval", str(config.metrics_interval),
            "--metrics-url", *([f"{u}/metrics" for u in target.replicas.urls]
                               if target.replicas else [f"{target.base_url}/metrics"])]
    if target.base_url.startswith("https://"):  # the run's TLS settings for /metrics too
        argv += (["--metrics-insecure"] if config.insecure else
                 ["--metrics-ca-bundle", str(Path(config.ca_bundle).resolve())] if config.ca_bundle
                 else [])
    key_env = config.api_key_env or ("OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY")
                                   and not config.api_key_file else None)
    if key_env:  # the variable's name; the collector reads the key from its environment
        argv += ["--metrics-api-key-env", key_env]
    if target.pid:
        argv += ["--pid", str(target.pid), "--children-of", str(target.pid)]
    if traces:
        argv += ["--otlp-port", str(traces["port"]), "--otlp-host", traces["host"]]
    argv += extra
    # sample this run's own Locust processes too (matched by command line, which
    # carries the run id), so the summary can warn when a worker sat at a full core.
    # Worker first: its command line also holds "--master-host".
    # The run id as a whole word after its option: run "soak" must not watch run "soak2".
    own = f"--swarmload-run-id {re.escape(run_id)} "
    argv += ["--process-name", f"{own}.*--worker", f"{own}.*--master(?!-)"]
    procs.start("collectors", argv)
    # Its signal handlers exist once it says "running"; a SIGTERM before that would kill it
    # without a final flush.
    report = run_dir / f"telemetry-{socket.gethostname()}.json"
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline and procs.procs["collectors"].poll() is None:
        if (_read_json(report) or {}).get("status") == "running":
            return
        time.sleep(0.1)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _raise_interrupt(*_args: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str], config: RunConfig | None = None) -> int:
    """``swarmload run``; ``swarmload master`` passes its own configuration (the role fields
    of :class:`RunConfig` set). Exit codes: ``EXIT_*`` above."""
    if config is None:
        try:
            config = parse_args(argv)
        except InputError as exc:
            print(f"swarmload run: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # SIGTERM (e.g. from a CI runner) stops the run like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run_dir = run(config)
    except RunError as exc:
        print(f"swarmload run: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # before the load started (e.g. while the target started)
        print("swarmload run: interrupted before the load started", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report_run(run_dir, config)


def _report_run(run_dir: Path, config: RunConfig) -> int:
    """After the run: its warnings, validity and record counts into the manifest, the summary
    and warnings printed; the exit code from the run's status."""
    records = load_requests(run_dir)
    summary = summarize_requests(records)
    remedy = run_remedy(run_dir)
    endpoint_notes = endpoint_warnings(config)
    lag_warnings = generator_warnings(summary, remedy=remedy)
    cpu_warnings = generator_cpu_warnings(run_dir)
    if not lag_warnings + cpu_warnings:  # else they say it already, as their remedy
        cpu_warnings = host_starved_warning(run_dir)
    manifest = load_manifest(run_dir)
    crashed = manifest.get("crash_warnings") or []
    validity = run_validity(lag_warnings + [w for w in cpu_warnings
                                            if not w.startswith(HOST_STARVED)], crashed)
    update_manifest(run_dir, warnings=crashed + endpoint_notes + lag_warnings + cpu_warnings,
                    validity={**validity, **error_bound(summary)},
                    # every record by outcome: cancelled (in flight at the end), worker_lost and
                    # record_lost included
                    requests={"records": len(records), "by_outcome": {
                        str(k): int(v) for k, v in records["outcome"].value_counts().items()}})
    _print_report(run_dir, config, format_summary(summary, remedy), crashed, endpoint_notes,
                  cpu_warnings)
    status = load_manifest(run_dir).get("status")
    if status == "crashed":
        print(f"run {manifest.get('run_id')} CRASHED: see the warnings above and "
              f"{run_dir / 'logs'}", file=sys.stderr)
        return EXIT_FAILED
    if status == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK if status == "finished" else EXIT_FAILED


def _print_report(run_dir: Path, config: RunConfig, summary_text: str, crashed: list[str],
                  endpoint_notes: list[str], cpu_warnings: list[str]) -> None:
    for warning in crashed:
        print(f"WARNING: {warning}")
    for note in endpoint_notes:
        print(f"WARNING: {note}")
    print(summary_text)
    print_details(run_dir, expect_spans=config.server_traces)
    for line in clock_lines(load_manifest(run_dir)):
        print(line)
    for warning in cpu_warnings:
        print(f"WARNING: {warning}")
    for note in endpoint_notes:
        print(f"WARNING: {note}")
    print(f"\nrun folder: {run_dir}")
    print(f"dashboard:  swarmload dashboard --results {run_dir.parent}")


def run_validity(generator_notes: list[str], crash_notes: list[str]) -> dict[str, Any]:
    """The manifest's verdict on whether the run measured the server: ``valid``, or
    ``generator_limited`` (the load generator fell behind: schedule lag, read delay, a worker at
    a full core, requests it could not send) or ``crashed``, with the reasons. A study does not
    take such a step for its knee without saying so."""
    if crash_notes:
        verdict = "crashed"
    elif generator_notes:
        verdict = "generator_limited"
    else:
        verdict = "valid"
    return {"verdict": verdict, "reasons": crash_notes + generator_notes}


def endpoint_warnings(config: RunConfig) -> list[str]:
    """What the user chose that changes what the figures mean, said before and after them."""
    notes = []
    if config.insecure:
        notes.append("INSECURE: TLS certificate verification was OFF for this run (--insecure)")
    if config.no_stream:
        notes.append("NON-STREAMING requests (--no-stream): E2E and usage only; TTFT, ITL and "
                     "TPOT were not measured")
    return notes
