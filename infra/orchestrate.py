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
import os
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.journal import reconcile
from collectors.manifest import (
    package_versions,
    parse_labels,
    redacted_command,
    this_host,
    update_manifest,
    utc_now_iso,
)
from infra.ports import free_port
from infra.procs import ProcessGroup
from infra.progress import RunProgress
from infra.remote_collect import RemoteCollectorError, RemoteCollectors
from infra.targets.haproxy import HaproxyError
from infra.targets.replicas import BALANCE_CHOICES, Replicas, balanced

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = REPO_ROOT / "locustfiles" / "llm_user.py"


class RunError(RuntimeError):
    """The run could not be set up or did not complete; the message says what to fix."""


def parse_duration(text: str) -> float:
    """'45', '45s', '2m', '1h30m' -> seconds."""
    text = str(text).strip().lower()
    if not text:
        raise argparse.ArgumentTypeError("empty duration")
    try:
        return float(text)
    except ValueError:
        pass
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total += float(number) * units[char]
            number = ""
        else:
            raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 45, 45s, 2m, 1h30m")
    if number:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: trailing number without unit")
    return total


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmload run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="sim",
                   help="sim (built-in simulator), vllm-cpu (real vLLM on the CPU), vllm (real "
                        "vLLM on this machine's GPU: give --vllm-model), a base URL, or several "
                        "base URLs, comma-separated (replicas)")
    p.add_argument("--vllm-model", default=None, metavar="DIR",
                   help="--target vllm: the model folder to serve")
    p.add_argument("--vllm-python", default=None, metavar="PYTHON",
                   help="--target vllm: interpreter that imports vllm (default "
                        "$SWARMLOAD_VLLM_PYTHON, .venv-vllm, python3)")
    p.add_argument("--replicas", type=int, default=1,
                   help="--target sim: start this many simulators, balanced by --balance")
    p.add_argument("--balance", default="round-robin", choices=list(BALANCE_CHOICES),
                   help="several replicas: round-robin / least-busy in each worker, or HAProxy "
                        "in front (haproxy = its roundrobin, haproxy-leastconn)")
    p.add_argument("--target-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the started target (repeatable), e.g. "
                        "--target-arg=--max-num-seqs=8")
    p.add_argument("--workers", type=int, default=2, help="Locust worker processes (default 2)")
    p.add_argument("--users", type=int, default=16, help="concurrent streaming users")
    p.add_argument("--spawn-rate", type=float, default=None, help="users/s (default: all at once)")
    p.add_argument("--duration", type=parse_duration, default=45.0, help="e.g. 45s, 2m")
    p.add_argument("--results", default="results", help="results folder (default results/)")
    p.add_argument("--run-id", default=None)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--model", default="", help="model name (default: first of /v1/models)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--ignore-eos", choices=["true", "false"], default="true")
    p.add_argument("--mix", default="45/40/15", help="short/medium/long shares")
    p.add_argument("--thresholds", default="64,512", help="SHORT_MAX,LONG_MIN prompt tokens")
    p.add_argument("--long-max-tokens", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stream", action="store_true",
                   help="non-streaming requests: E2E and usage only (no TTFT, said in the summary)")
    p.add_argument("--ca-bundle", default=None, metavar="PEM",
                   help="https targets: trust these CA certificates instead of the system store")
    p.add_argument("--insecure", action="store_true",
                   help="https targets: do NOT verify the certificate (said in summary and "
                        "manifest)")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the API key, sent as 'Authorization: "
                        "Bearer' (default: OPENAI_API_KEY when set); never the key itself")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="file holding the API key (instead of an environment variable)")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra header on every request (repeatable); values stay out of the "
                        "run folder")
    p.add_argument("--prompt-salt", default=None, metavar="SALT",
                   help="opens every prompt (default: a fresh one per run, so no run meets "
                        "another's prompts in the server's prefix cache); pass a run's "
                        "manifest prompt_salt to repeat its prompts exactly, 'none' for none")
    p.add_argument("--workload", default=None,
                   help="workload folder (swarmload workload build): replay it open-loop")
    p.add_argument("--plan", default=None,
                   help="arrival plan file (default: the workload's arrivals.yaml)")
    p.add_argument("--drain", type=parse_duration, default=60.0,
                   help="open-loop: longest wait for in-flight requests after the schedule")
    p.add_argument("--inflight-cap", type=int, default=2000,
                   help="open-loop: most requests in flight per worker")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to wait for a TCP connect (outcome connect_error)")
    p.add_argument("--first-token-timeout", type=parse_duration, default=120.0,
                   help="sent -> first token limit (outcome timeout_before_first_token; "
                        "default 120 s: queueing and prefill of long prompts)")
    p.add_argument("--stall-timeout", type=parse_duration, default=30.0,
                   help="longest silence after the first token (outcome timeout_mid_stream; "
                        "default 30 s)")
    p.add_argument("--gpu-interval", type=float, default=1.0, help="GPU sample interval, s")
    p.add_argument("--telemetry-tail", type=parse_duration, default=3.0,
                   help="keep sampling telemetry this long after the load stops")
    p.add_argument("--no-collectors", action="store_true", help="skip telemetry collectors")
    p.add_argument("--remote-collector", action="append", default=[], metavar="URL",
                   help="a `swarmload collect --serve` on another host (repeatable): its clock "
                        "offset is measured and its files are copied into the run folder")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--progress", choices=["auto", "rich", "plain", "off"], default="auto",
                   help="live progress: auto = a panel on a terminal, plain lines every 10 s "
                        "otherwise (off with --quiet unless asked for)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label stored in the manifest (repeatable), e.g. engine=vllm-0.26; "
                   "the Compare page and `swarmload compare` filter and show them")
    return p


@dataclass
class Target:
    kind: str
    base_url: str
    model: str | None = None
    pid: int | None = None
    launch_args: list[str] = field(default_factory=list)
    launch: dict[str, Any] | None = None  # how the target was started (vllm: launch_spec)
    replicas: Replicas | None = None  # several replicas (infra.targets.replicas)


@contextlib.contextmanager
def start_replicated(args: argparse.Namespace, run_dir: Path, say: Any) -> Iterator[Target]:
    """The target with ``--replicas N`` or several ``--target`` URLs, behind ``--balance``."""
    urls = [u.strip() for u in args.target.split(",") if u.strip()]
    many = len(urls) > 1 or args.replicas > 1
    if not many:
        with start_target(args.target, args.target_arg, say,
                          {"model": args.vllm_model, "python": args.vllm_python}) as target:
            yield target
        return
    if len(urls) > 1 and args.replicas > 1:
        raise RunError("--replicas starts simulators; with several --target URLs leave it out")
    with contextlib.ExitStack() as stack:
        model = None
        if len(urls) == 1:
            if args.target != "sim":
                raise RunError("--replicas N works with --target sim; for other servers pass "
                               "their URLs: --target http://a:8000,http://b:8000")
            from infra.targets.simulator import running_simulator
            from infra.targets.simulator.config import parse_args

            config = parse_args(args.target_arg)
            model = config.model
            say(f"starting {args.replicas} simulator replicas ...")
            urls = [stack.enter_context(running_simulator(config))
                    for _ in range(args.replicas)]
        elif not all(u.startswith(("http://", "https://")) for u in urls):
            raise RunError(f"--target {args.target!r}: several replicas are base URLs")
        try:
            replicas = stack.enter_context(balanced(urls, args.balance, run_dir / "balancer"))
        except HaproxyError as exc:
            raise RunError(str(exc)) from exc
        say(f"{len(urls)} replicas, balance {args.balance}: {', '.join(urls)}")
        yield Target("sim" if model else "endpoints", replicas.base_url, model,
                     pid=replicas.haproxy.pid if replicas.haproxy else None,
                     launch_args=replicas.haproxy.launch_args if replicas.haproxy else [],
                     replicas=replicas)


@contextlib.contextmanager
def start_target(kind: str, extra_args: list[str], say: Any,
                 options: dict[str, Any] | None = None) -> Iterator[Target]:
    """Start ``kind`` and yield it serving; ``options`` (target ``vllm``): ``model`` (folder,
    required), ``python``, ``env`` (see infra.targets.vllm_gpu)."""
    options = options or {}
    if kind == "sim":
        from infra.targets.simulator import running_simulator
        from infra.targets.simulator.config import parse_args

        config = parse_args(extra_args)
        say("starting the built-in simulator ...")
        with running_simulator(config) as base_url:
            yield Target("sim", base_url, config.model, launch_args=config.to_argv())
    elif kind == "vllm-cpu":
        from infra.targets.vllm_cpu import VllmCpuTarget

        say("starting real vLLM on the CPU (vllm-cpu); this takes 1-2 minutes ...")
        with VllmCpuTarget(extra_args=tuple(extra_args)) as target:
            yield Target("vllm-cpu", target.base_url, target.model_name, target.pid,
                         list(target.launch_args))
    elif kind == "vllm":
        from infra.targets.vllm_gpu import VllmTarget
        from infra.targets.vllm_venv import VllmError

        if not options.get("model"):
            raise RunError("target vllm needs a model folder (--vllm-model DIR, or model: in the "
                           "study configuration)")
        say(f"starting vLLM serving {options['model']} (GPU start-up takes 1-3 minutes) ...")
        try:
            server = VllmTarget(options["model"], python=options.get("python"),
                                extra_args=tuple(extra_args), env=options.get("env"))
        except VllmError as exc:
            raise RunError(str(exc)) from exc
        try:
            server.start()
            say(f"vLLM pid {server.pid}, log {server.log_path}")
            server.wait_ready()
        except (VllmError, KeyboardInterrupt) as exc:
            server.stop()
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise RunError(str(exc)) from exc
        try:
            say(f"vLLM ready after {server.ready_after_s:.0f} s")
            yield Target("vllm", server.base_url, server.model_name, server.pid,
                         list(server.launch_args), server.launch_spec)
        finally:
            server.stop()
    elif kind.startswith(("http://", "https://")):
        yield Target("endpoint", kind.rstrip("/"))
    else:
        raise RunError(f"--target {kind!r}: use sim, vllm-cpu, vllm or a URL like "
                       "http://127.0.0.1:8000")


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


def locust_common_args(args: argparse.Namespace, run_id: str, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
        "--swarmload-run-id", run_id, "--swarmload-run-dir", str(run_dir),
        "--swarmload-endpoint", args.endpoint, "--swarmload-max-tokens", str(args.max_tokens),
        "--swarmload-ignore-eos", args.ignore_eos, "--swarmload-mix", args.mix,
        "--swarmload-thresholds", args.thresholds, "--swarmload-seed", str(args.seed),
        "--swarmload-prompt-salt", args.prompt_salt,
        "--swarmload-long-max-tokens", str(args.long_max_tokens),
        "--swarmload-connect-timeout", str(args.connect_timeout),
        "--swarmload-first-token-timeout", str(args.first_token_timeout),
        "--swarmload-stall-timeout", str(args.stall_timeout),
        *(["--swarmload-model", args.model] if args.model else []),
        *(["--swarmload-workload", str(Path(args.workload).resolve()),
           "--swarmload-schedule-duration", str(args.duration),
           "--swarmload-inflight-cap", str(args.inflight_cap)] if args.workload else []),
        *(["--swarmload-plan", str(Path(args.plan).resolve())] if args.plan else []),
        *(["--swarmload-no-stream", "true"] if args.no_stream else []),
        *(["--swarmload-ca-bundle", str(Path(args.ca_bundle).resolve())] if args.ca_bundle
          else []),
        *(["--swarmload-insecure", "true"] if args.insecure else []),
        *(["--swarmload-api-key-env", args.api_key_env] if args.api_key_env else []),
        *(["--swarmload-api-key-file", str(Path(args.api_key_file).resolve())]
          if args.api_key_file else []),
        # `swarmload soak` adds its --swarmload-soak-* options here
        *getattr(args, "extra_locust_args", []),
    ]


def _endpoint_env(args: argparse.Namespace) -> dict[str, str]:
    """Header values travel to the Locust processes in their environment, never on a command
    line (which `ps`, logs and the manifest would show)."""
    return {"SWARMLOAD_HEADERS": "\n".join(args.header)} if args.header else {}


def check_endpoint(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    """Try the target's ``/v1/models`` with the run's TLS settings, key and headers before any
    load starts, so a wrong CA or key fails once with a message that says what to do. Returns
    the manifest's ``endpoint`` facts (names and paths only; never a key or a header value)."""
    from locustfiles.context import SettingsError, UserSettings, api_key, client_settings
    from locustfiles.context import parse_headers as parse_header_lines
    from locustfiles.streaming import get_json, make_client

    tls = base_url.startswith("https://")
    if (args.ca_bundle or args.insecure) and not tls:
        raise RunError("--ca-bundle and --insecure are for https:// targets")
    if args.ca_bundle and not Path(args.ca_bundle).is_file():
        raise RunError(f"--ca-bundle {args.ca_bundle}: no such file")
    try:
        headers = parse_header_lines(args.header)
        _key, key_source = api_key(args.api_key_env, args.api_key_file)
        settings = UserSettings(
            run_id="check", run_dir=None, ca_bundle=args.ca_bundle, insecure=args.insecure,
            api_key_env=args.api_key_env, api_key_file=args.api_key_file, headers=headers)
        client = make_client(base_url, client_settings(settings))
    except (SettingsError, ValueError) as exc:
        raise RunError(str(exc)) from None
    try:
        get_json(client, "/v1/models")
    except Exception as exc:  # noqa: BLE001 - classified below, the run decides
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            reason = re.sub(r"\s*\(_ssl\.c:\d+\)", "", text.split("verify failed:")[-1])
            reason = reason.strip(" )'\"") or text
            raise RunError(
                f"TLS certificate verification failed for {base_url}: {reason}. Pass "
                "--ca-bundle FILE with the CA that signed the server's certificate, or "
                "--insecure to skip verification (the summary and manifest will say so)"
            ) from None
        if "HTTP 401" in text or "HTTP 403" in text:
            raise RunError(
                f"{base_url} refused the request ({text.rsplit(': ', 1)[-1]}): "
                + (f"the key from {key_source} was not accepted" if key_source else
                   "no API key was sent; set OPENAI_API_KEY, or pass --api-key-env NAME or "
                   "--api-key-file FILE")) from None
        # anything else (not up yet, no /v1/models) is the workers' to report, as before
    finally:
        client.close()
    return {"tls": tls, "verify": tls and not args.insecure, "insecure": bool(args.insecure),
            "ca_bundle": str(Path(args.ca_bundle).resolve()) if args.ca_bundle else None,
            "api_key": key_source, "headers": [name for name, _ in headers],
            "stream": not args.no_stream, "request_id_header": "X-Request-Id"}


def run(args: argparse.Namespace) -> Path:
    say = (lambda *_a: None) if args.quiet else (lambda msg: print(f"[swarmload] {msg}",
                                                                    flush=True))
    if args.workers < 1 or args.users < 1:
        raise RunError("--workers and --users must be at least 1")
    try:
        labels = parse_labels(args.label)
    except ValueError as exc:
        raise RunError(f"--label: {exc}") from None
    open_loop = _open_loop_plan(args)
    resuming = getattr(args, "resume_dir", None) is not None  # `swarmload soak --resume`
    run_id = args.run_id or new_run_id()
    if not args.prompt_salt:
        from workloads.builtin_mix import new_prompt_salt

        args.prompt_salt = new_prompt_salt()
    run_dir = Path(args.results).resolve() / run_id
    if run_dir.exists() and not resuming:
        raise RunError(f"run folder {run_dir} already exists; pick another --run-id")
    run_dir.mkdir(parents=True, exist_ok=resuming)
    procs = _process_group(run_dir / "logs" / getattr(args, "log_subdir", ""))
    users = 0 if open_loop else args.users  # open-loop replay runs no Locust users at all
    run_time = args.duration + args.drain + 10 if open_loop else args.duration
    spawn_rate = args.spawn_rate or float(max(users, 1))
    status = "failed"
    interrupted = False
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(start_replicated(args, run_dir, say))
        replicas = target.replicas
        # every replica itself (not through the load balancer, whose counts the records are
        # checked against)
        for url in (replicas.urls if replicas else [target.base_url]):
            endpoint = check_endpoint(args, url)
        if endpoint["insecure"]:
            say("WARNING: --insecure: the target's TLS certificate is NOT verified")
        gpu = _probe_gpus()
        first = ({} if resuming else
                 {"started_at": utc_now_iso(), "command": redacted_command(sys.argv)})
        update_manifest(
            run_dir, run_id=run_id, status="running", ended_at=None, **first,
            endpoint=endpoint,
            target={"kind": target.kind, "base_url": target.base_url,
                    "model": args.model or target.model,
                    "launch_args": target.launch_args, "pid": target.pid,
                    "replicas": replicas.manifest() if replicas else [],
                    "balance": replicas.balance if replicas else None,
                    "launch": target.launch},
            workload=_workload_facts(args, open_loop), prompt_salt=args.prompt_salt,
            load={"kind": open_loop["kind"] if open_loop else "closed-loop",
                  "plan": open_loop, "workers": args.workers, "users": users,
                  "spawn_rate": spawn_rate, "duration_s": args.duration,
                  "inflight_cap": args.inflight_cap if open_loop else None},
            versions=package_versions(), hosts=[this_host("orchestrator")], gpu=gpu,
            labels=labels,
        )
        on_target = getattr(args, "on_target_ready", None)
        if on_target is not None:  # `swarmload soak`: the server's pid, the segment's start
            on_target(run_dir, target)
        load_text = (f"open-loop {open_loop['kind']} replay of {args.workload}" if open_loop
                     else f"{args.users} users")
        say(f"run {run_id}: target {target.base_url}, {args.workers} workers, "
            f"{load_text}, {args.duration:g} s")
        remote = RemoteCollectors(getattr(args, "remote_collector", None) or [])
        try:
            remote.measure()  # each remote collector's clock, before any load
        except RemoteCollectorError as exc:
            raise RunError(f"--remote-collector: {exc}") from exc
        try:
            if not args.no_collectors:
                _start_collectors(procs, args, run_id, run_dir, target)
            # `swarmload master` (infra.roles) binds where remote workers reach it and starts
            # no local worker; `run` keeps everything on loopback.
            bind = getattr(args, "master_bind", "127.0.0.1")
            port = getattr(args, "master_port", 0) or free_port(bind)
            local_workers = getattr(args, "local_workers", args.workers)
            common = locust_common_args(args, run_id, run_dir)
            env = _endpoint_env(args)
            if replicas is not None and replicas.client_targets:
                common += ["--swarmload-targets", ",".join(replicas.client_targets),
                           "--swarmload-balance", replicas.balance]
            procs.start("master", [
                *common, "--master", "--headless", "--master-bind-host", bind,
                "--master-bind-port", str(port), "--expect-workers", str(args.workers),
                "--expect-workers-max-wait", str(int(getattr(args, "worker_wait_s", 60))),
                "-u", str(users), "-r", str(spawn_rate),
                "-t", f"{int(round(run_time))}s", "--host", target.base_url,
                "--stop-timeout", "0", "--only-summary",
                # failed requests are in the records; a non-zero exit means the master failed
                "--exit-code-on-error", "0",
            ], env)
            if local_workers < args.workers:
                say(f"master listening on {bind}:{port}; waiting for "
                    f"{args.workers - local_workers} workers "
                    f"(swarmload worker --master HOST:{port})")
            for i in range(local_workers):
                procs.start(f"worker-{i}", [*common, "--worker", "--master-host", "127.0.0.1",
                                            "--master-port", str(port)], env)
            deadline = time.monotonic() + run_time + 90.0 + getattr(args, "worker_wait_s", 0)
            mode = args.progress if not (args.quiet and args.progress == "auto") else "off"
            with RunProgress(run_dir, args.duration, mode=mode, title=getattr(
                    args, "progress_title", None) or f"run {run_id}") as view:
                while time.monotonic() < deadline:
                    code = procs.wait("master", 1.0)
                    view.tick()
                    # a worker or the collector that dies before the master is a crash; the
                    # run goes on with the others (the manifest says so)
                    for name in procs.check([n for n in procs.procs if n != "master"]):
                        say(f"WARNING: {name} died ({procs.deaths[name]['exit']})")
                    if code is not None:
                        if code != 0:
                            procs.check(["master"])
                            say("WARNING: the Locust master died "
                                f"({procs.deaths['master']['exit']})")
                        break
                    dead = [n for n, p in procs.procs.items()
                            if n.startswith("worker") and p.poll() is not None]
                    if dead and len(dead) == local_workers and (
                            procs.wait("master", 15.0) is None):
                        raise RunError(f"all workers exited early; see {run_dir / 'logs'}")
                else:
                    raise RunError("the Locust master did not finish in time; see "
                                   f"{run_dir / 'logs'}")
            status = "finished"
        except KeyboardInterrupt:
            interrupted, status = True, "interrupted"
            say("interrupted: stopping the master (it collects the workers' last records) ...")
        finally:
            procs.stop("master", timeout_s=20.0)
            for name in [n for n in procs.procs if n.startswith("worker")]:
                procs.stop(name, timeout_s=10.0)
            if not interrupted and ("collectors" in procs.procs or remote.urls):
                time.sleep(args.telemetry_tail)  # so telemetry shows the server settling
            procs.stop("collectors", timeout_s=10.0)
            remote_hosts = remote.finish(run_dir)  # their files into this run folder
            procs.stop_all()
            codes = {n: p.returncode for n, p in procs.procs.items()}
            recorder = _read_json(run_dir / "recorder_stats.json") or {}
            if replicas is not None and replicas.haproxy is not None:
                # HAProxy's own counts, read while it still runs: the records are checked
                # against them (summary's per-replica table)
                with contextlib.suppress(OSError):
                    update_manifest(run_dir, balancer=replicas.balancer_stats())
            horizon_s = getattr(args, "reconcile_horizon_s", None)  # `swarmload soak`
            since_ns = None if horizon_s is None else min(
                [int(d["wall_ns"]) for d in procs.deaths.values() if d.get("wall_ns")]
                + [time.time_ns()]) - int(horizon_s * 1e9)
            reconciled = reconcile(run_dir, run_id, procs.deaths,
                                   {n: p.pid for n, p in procs.procs.items()}, since_ns=since_ns)
            recorder["reconciled"] = reconciled
            if procs.deaths:
                status = "crashed"  # never "finished" when a process of the run died
            update_manifest(run_dir, status=status, ended_at=utc_now_iso(), exit_codes=codes,
                            crashes=list(procs.deaths.values()),
                            crash_warnings=crash_warnings(procs.deaths, reconciled),
                            recorder=recorder, hosts=_hosts(procs, recorder) + remote_hosts,
                            clock=recorder.get("clock") or {},
                            replay_events=_read_json(run_dir / "replay_events.json"))
            say("stopping the target ...")
    if interrupted:
        say(f"run {run_id} interrupted; records so far are in {run_dir}")
    return run_dir


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


def _open_loop_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    """The arrival plan of ``--workload`` as a dict, or None for closed-loop users."""
    if not args.workload:
        if args.plan:
            raise RunError("--plan needs --workload")
        return None
    from dataclasses import asdict

    from workloads.arrivals import load_plan
    from workloads.errors import WorkloadError
    from workloads.schema import PLAN_FILE, WORKLOAD_FILE

    folder = Path(args.workload)
    if not (folder / WORKLOAD_FILE).is_file():
        raise RunError(f"--workload {folder}: no {WORKLOAD_FILE}; build one with "
                       "`swarmload workload build`")
    plan_path = Path(args.plan) if args.plan else folder / PLAN_FILE
    if not plan_path.is_file():
        raise RunError(f"no arrival plan at {plan_path}; pass --plan or build the workload "
                       "with --arrivals")
    try:
        plan = load_plan(plan_path)
    except WorkloadError as exc:
        raise RunError(f"arrival plan {plan_path}: {exc}") from exc
    if plan.kind == "closed":
        raise RunError("a closed plan is closed-loop: use --users N without --workload")
    return {"path": str(plan_path.resolve()), **asdict(plan)}


def _workload_facts(args: argparse.Namespace, open_loop: dict[str, Any] | None) -> dict[str, Any]:
    if open_loop:
        report = _read_json(Path(args.workload) / "report.json")
        return {"kind": "log-replay", "path": str(Path(args.workload).resolve()),
                "report": report, "ignore_eos": args.ignore_eos, "prompt_salt": args.prompt_salt}
    return {"kind": "builtin-mix", "mix": args.mix, "thresholds": args.thresholds,
            "max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos,
            "endpoint": args.endpoint, "seed": args.seed, "long_max_tokens": args.long_max_tokens,
            "prompt_salt": args.prompt_salt}


def _probe_gpus() -> dict[str, Any]:
    try:
        from collectors.gpu import probe_gpus
    except ImportError as exc:
        return {"available": False, "reason": f"GPU collector not installed: {exc}"}
    return probe_gpus()


def _start_collectors(procs: ProcessGroup, args: argparse.Namespace, run_id: str,
                      run_dir: Path, target: Target) -> None:
    try:
        import collectors.standalone  # noqa: F401 - only checks that it exists
    except ImportError:
        return
    argv = [sys.executable, "-m", "infra.cli", "collect", "--run-dir", str(run_dir),
            "--run-id", run_id, "--gpu-interval", str(args.gpu_interval),
            "--metrics-url", *([f"{u}/metrics" for u in target.replicas.urls]
                               if target.replicas else [f"{target.base_url}/metrics"])]
    if target.base_url.startswith("https://"):  # the run's TLS settings for /metrics too
        argv += (["--metrics-insecure"] if args.insecure else
                 ["--metrics-ca-bundle", str(Path(args.ca_bundle).resolve())] if args.ca_bundle
                 else [])
    key_env = args.api_key_env or ("OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY")
                                   and not args.api_key_file else None)
    if key_env:  # the variable's name; the collector reads the key from its environment
        argv += ["--metrics-api-key-env", key_env]
    if target.pid:
        argv += ["--pid", str(target.pid), "--children-of", str(target.pid)]
    argv += getattr(args, "extra_collector_args", [])
    # issue 6: sample this run's own Locust processes too (matched by command line, which
    # carries the run id), so the summary can warn when a worker sat at a full core.
    # Worker first: its command line also holds "--master-host".
    argv += ["--process-name", f"{run_id}.*--worker", f"{run_id}.*--master(?!-)"]
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
    import json

    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _raise_interrupt(*_args: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str], args: argparse.Namespace | None = None) -> int:
    """``swarmload run``; ``swarmload master`` passes its own parsed ``args``."""
    args = args if args is not None else build_parser().parse_args(argv)
    # SIGTERM (e.g. from a CI runner) stops the run like Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run_dir = run(args)
    except RunError as exc:
        print(f"swarmload run: {exc}", file=sys.stderr)
        return 2
    from dashboards.analysis.generator_cpu import generator_cpu_warnings  # issue 6: generator CPU
    from dashboards.analysis.runs import (
        format_summary,
        generator_warnings,
        load_requests,
        print_replicas,
        summarize_requests,
    )

    records = load_requests(run_dir)
    summary = summarize_requests(records)
    cpu_warnings = generator_cpu_warnings(run_dir)
    endpoint_notes = endpoint_warnings(args)
    lag_warnings = generator_warnings(summary)
    manifest = _read_json(run_dir / "manifest.json") or {}
    crashed = manifest.get("crash_warnings") or []
    update_manifest(run_dir, warnings=crashed + endpoint_notes + lag_warnings + cpu_warnings,
                    validity=run_validity(lag_warnings + cpu_warnings, crashed),
                    # every record by outcome: cancelled (in flight at the end), worker_lost and
                    # record_lost included
                    requests={"records": len(records), "by_outcome": {
                        str(k): int(v) for k, v in records["outcome"].value_counts().items()}})
    for warning in crashed:
        print(f"WARNING: {warning}")
    for note in endpoint_notes:
        print(f"WARNING: {note}")
    print(format_summary(summary))
    from dashboards.analysis.burst import burst_report, format_bursts  # one line per spike

    bursts = format_bursts(burst_report(run_dir))
    if bursts:
        print(bursts)
    print_replicas(run_dir)
    for warning in cpu_warnings:
        print(f"WARNING: {warning}")
    for note in endpoint_notes:
        print(f"WARNING: {note}")
    print(f"\nrun folder: {run_dir}")
    print(f"dashboard:  swarmload dashboard --results {run_dir.parent}")
    if manifest.get("status") == "crashed":
        print(f"run {manifest.get('run_id')} CRASHED: see the warnings above and "
              f"{run_dir / 'logs'}", file=sys.stderr)
        return 1
    return 0


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


def endpoint_warnings(args: argparse.Namespace) -> list[str]:
    """What the user chose that changes what the figures mean, said before and after them."""
    notes = []
    if getattr(args, "insecure", False):
        notes.append("INSECURE: TLS certificate verification was OFF for this run (--insecure)")
    if getattr(args, "no_stream", False):
        notes.append("NON-STREAMING requests (--no-stream): E2E and usage only; TTFT, ITL and "
                     "TPOT were not measured")
    return notes
