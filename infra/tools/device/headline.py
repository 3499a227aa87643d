"""The headline runs on the lent GPU machine, in as few device calls as the time allows.

Run by ``infra/tools/device/h200.sh all`` after the install; each call does what is left, in order,
within ``--budget-s`` seconds, and leaves its state under ``--work`` (``/root/results``), which
survives between calls while the machine stays warm::

    1. study     swarmload study run STUDY (resumed where a call ran out of time)
    2. soak      on a server of the better configuration (higher max sustainable load, then
                 higher knee): one ``swarmload soak`` at ``--soak-fraction`` of its knee,
                 ``--soak-s`` long or as long as the call's time allows (at least
                 ``--min-soak-s``), with its windows and drift report
    3. effect    the collectors' effect on the server: runs with each collector setting of
                 ``--effect-arms`` (none; NVML alone; /metrics scrapes alone at two intervals;
                 both), interleaved (ABC..CBA, so a drift of the server weighs on every arm
                 alike), at ``--effect-fraction`` of the knee, vLLM's own histograms read before
                 and after each run (the server's mean TTFT/TPOT/E2E per run)
    4. sessions  multi-turn sessions with a long shared system prompt (``--sessions-spec``) on the
                 better configuration, its prefix cache on and then off: TTFT and hit share per
                 turn against what a perfect cache would reuse
    5. scaling   swarmload bench scaling over --scaling-workers

``--study-dir`` takes the study of an earlier session (its ``rollup/capacity.parquet``) instead of
running phase 1 again. ``infra/tools/device/h200.sh bg`` runs all this in the background (a process
session of its own outlives the device call while the machine stays warm) and ``h200.sh wait``
follows it across calls, so that a soak may be longer than one call.

Every finished phase is packed into ``--out`` (``$OUT``: 8 files of 16 MiB at most come back;
an archive over 15 MB is split into ``.partN`` pieces, joined again with ``cat``):
``study.tar.gz`` (the study folder without worker logs), ``soak.tar.gz``, ``effect.tar.gz``,
``scaling.tar.gz``, ``vllm-logs.tar.gz`` (the servers' logs)
and ``headline.json`` (what each phase did, with the commands). A local rehearsal passes a study
whose configurations point at a stand-in interpreter (``infra/tools/device/rehearse.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
STATE = "headline_state.json"
SERVER_HISTOGRAMS = {  # vLLM's own per-request histograms: mean = delta _sum / delta _count
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
}


def say(message: str) -> None:
    print(f"[headline {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def load_state(work: Path) -> dict[str, Any]:
    path = work / STATE
    return json.loads(path.read_text()) if path.is_file() else {"phases": {}}


def save_state(work: Path, state: dict[str, Any]) -> None:
    (work / STATE).write_text(json.dumps(state, indent=2, default=str) + "\n")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "infra.cli", *args]


def run_bounded(argv: list[str], limit_s: float, log: Path) -> int:
    """Run ``argv`` (own process group) for at most ``limit_s``; SIGTERM then SIGKILL after 45 s,
    so a study or run can stop its target and write its files. Output goes to ``log`` and here."""
    say(f"$ {' '.join(argv)}  (limit {limit_s:.0f} s)")
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + limit_s
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        killed_at = None
        while proc.poll() is None:
            chunk = proc.stdout.read()
            if chunk:
                out.write(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            now = time.monotonic()
            if now > deadline and killed_at is None:
                say(f"time is up: SIGTERM to {argv[3:5]}")
                os.killpg(proc.pid, signal.SIGTERM)
                killed_at = now
            elif killed_at is not None and now > killed_at + 45:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.2)
        rest = proc.stdout.read() or b""
        out.write(rest)
        sys.stdout.write(rest.decode(errors="replace"))
    return proc.returncode


PART_BYTES = 15_000_000  # the device tool returns files of at most 16 MiB, 8 files in all


def pack(folder: Path, archive: Path, skip_logs: bool = True,
         only: tuple[str, ...] = ()) -> list[Path]:
    """``folder`` as a tar.gz (worker/master logs left out: large, and in the summary; with
    ``only``, just files of those names), split into ``<archive>.partN`` pieces of at most
    :data:`PART_BYTES` when larger, so that it comes back (``cat parts | tar -xz``)."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if skip_logs and "logs" in parts and not info.name.endswith(("collectors.log",)):
            return None
        if only and info.isfile() and parts[-1] not in only:
            return None
        return info

    for old in archive.parent.glob(f"{archive.name}*"):
        old.unlink()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name, filter=keep)
    size = archive.stat().st_size
    pieces = [archive]
    if size > PART_BYTES:
        data = archive.read_bytes()
        archive.unlink()
        pieces = []
        for i in range(0, size, PART_BYTES):
            piece = archive.with_name(f"{archive.name}.part{i // PART_BYTES}")
            piece.write_bytes(data[i:i + PART_BYTES])
            pieces.append(piece)
    say(f"packed {folder} -> {', '.join(p.name for p in pieces)} ({size / 1e6:.1f} MB)")
    return pieces


# ------------------------------------------------------------------------------------- study


def phase_study(args: argparse.Namespace, work: Path, state: dict[str, Any], clock: Clock) -> bool:
    phase = state["phases"].setdefault("study", {"calls": 0})
    if phase.get("status") == "finished":
        return True
    limit = clock.left() - 30
    if limit < 120:
        say(f"study: {clock.left():.0f} s left, too little to start; next call")
        return False
    argv = cli("study", "run", str(args.study), "--results", str(work / "studies"))
    if phase.get("dir"):
        argv += ["--resume", phase["dir"]]
    phase["calls"] += 1
    phase.setdefault("commands", []).append(" ".join(argv[2:]))
    save_state(work, state)
    code = run_bounded(argv, limit, work / "study.log")
    if not phase.get("dir"):
        dirs = sorted((work / "studies").glob("*/study.json"), key=lambda p: p.stat().st_mtime)
        phase["dir"] = str(dirs[-1].parent) if dirs else None
    record = json.loads((Path(phase["dir"]) / "study.json").read_text()) if phase["dir"] else {}
    phase["status"] = record.get("status", f"exit {code}")
    save_state(work, state)
    if phase["dir"]:
        pack(Path(phase["dir"]), args.out / "study.tar.gz")
    return phase["status"] == "finished"


def better_configuration(study_dir: Path) -> dict[str, Any]:
    """The configuration with the higher max sustainable load (then knee), and its knee."""
    import pandas as pd

    capacity = pd.read_parquet(study_dir / "rollup" / "capacity.parquet")
    capacity = capacity.assign(
        msl=capacity["max_sustainable_load"].fillna(0), knee=capacity["knee_load"].fillna(0))
    best = capacity.sort_values(["msl", "knee"], ascending=False).iloc[0]
    knee = float(best["knee_load"]) if best["knee_load"] == best["knee_load"] else float(
        best["max_sustainable_load"])
    return {"config": str(best["config"]), "knee_load": knee,
            "max_sustainable_load": float(best["msl"]),
            "table": capacity.drop(columns=["msl", "knee"]).to_dict("records")}


def chosen_configuration(state: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The study's better configuration; its first one when the study left no roll-up (failed,
    or not run), so that the later phases still run."""
    study_dir = state["phases"].get("study", {}).get("dir")
    if study_dir and (Path(study_dir) / "rollup" / "capacity.parquet").is_file():
        return better_configuration(Path(study_dir))
    say("no study roll-up: serving the study's first configuration")
    return {"config": spec.configurations[0].name, "knee_load": None,
            "max_sustainable_load": None}


# ------------------------------------------------------------------------------------- serve


def histogram_sums(base_url: str) -> dict[str, tuple[float, float]]:
    """{tag: (_sum, _count)} of vLLM's histograms (summed over label sets and API servers)."""
    from collectors.server_metrics import parse_metrics

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        rows = parse_metrics(response.read().decode())
    out: dict[str, list[float]] = {tag: [0.0, 0.0] for tag in SERVER_HISTOGRAMS}
    for row in rows:
        for tag, name in SERVER_HISTOGRAMS.items():
            if row["sample"] == f"{name}_sum":
                out[tag][0] += row["value"]
            elif row["sample"] == f"{name}_count":
                out[tag][1] += row["value"]
    return {tag: (s, c) for tag, (s, c) in out.items()}


def server_means(before: dict[str, tuple[float, float]],
                 after: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    means: dict[str, float | None] = {}
    for tag in SERVER_HISTOGRAMS:
        count = after[tag][1] - before[tag][1]
        means[f"server_{tag}_mean_ms"] = (
            round((after[tag][0] - before[tag][0]) / count * 1e3, 3) if count > 0 else None)
    means["server_requests"] = after["e2e"][1] - before["e2e"][1]
    return means


def client_figures(run_dir: Path) -> dict[str, Any]:
    from collectors.run_folder import load_manifest, load_requests
    from dashboards.analysis.runs import summarize_requests

    summary = summarize_requests(load_requests(run_dir)).loc["all"]
    manifest = load_manifest(run_dir)
    figures = {key: float(summary[key]) for key in (
        "requests", "ok", "errors", "req_per_s", "output_tok_per_s", "ttft_p50_s", "ttft_p95_s",
        "tpot_p50_s", "tpot_p95_s", "e2e_p50_s") if key in summary}
    records = load_requests(run_dir, ["outcome", "ttft_s", "tpot_s", "e2e_s"])
    ok = records[records["outcome"] == "ok"]
    figures.update(client_ttft_mean_ms=round(float(ok["ttft_s"].mean()) * 1e3, 3),
                   client_tpot_mean_ms=round(float(ok["tpot_s"].mean()) * 1e3, 3),
                   client_e2e_mean_ms=round(float(ok["e2e_s"].mean()) * 1e3, 3),
                   warnings=manifest.get("warnings", []))
    return figures


# The collectors' settings compared by the effect phase: name -> (GPU interval, /metrics
# interval), seconds, 0 = that sampler off; None = no collector process at all.
EFFECT_ARMS: dict[str, tuple[float, float] | None] = {
    "off": None,
    "nvml-10hz": (0.1, 0.0),
    "scrape-0.5s": (0.0, 0.5),
    "scrape-2s": (0.0, 2.0),
    "nvml-10hz+scrape-2s": (0.1, 2.0),
}

SERVER_START_S = 120  # a vLLM start-up on the H200 (93 s seen, compile cache cold), with margin
RUN_OVERHEAD_S = 12  # a swarmload run's own start and stop around its load


def _serve_better(args: argparse.Namespace, work: Path, state: dict[str, Any], name: str,
                  body: Any, extra_server_args: tuple[str, ...] = (),
                  finish: bool = True) -> None:
    """Start the better configuration of the study (its server arguments and then
    ``extra_server_args``) and call ``body(phase, target, run)``."""
    from infra.orchestrate import parse_args, start_target
    from infra.orchestrate import run as run_swarmload
    from infra.study.spec import load_study

    phase = state["phases"][name]
    spec = load_study(args.study)
    choice = chosen_configuration(state, spec)
    config = spec.configuration(choice["config"])
    phase.update(config=choice["config"], knee_load=choice["knee_load"],
                 max_sustainable_load=choice["max_sustainable_load"], status="running")
    save_state(work, state)
    folder = work / name
    folder.mkdir(exist_ok=True)

    def run(run_id: str, users: int, duration_s: float, collectors: tuple[float, float] | None,
            base_url: str, model: str, soak_args: list[str] | None = None) -> Path:
        """One ``swarmload run`` (``soak`` with ``soak_args``); ``collectors``: (GPU interval,
        /metrics interval) or None for no collectors."""
        wl = spec.workload
        argv = ["--target", base_url, "--model", model, "--workers", str(spec.workers),
                "--users", str(users), "--duration", f"{duration_s:.0f}",
                "--results", str(folder), "--run-id", run_id, "--quiet",
                "--seed", str(wl.seed + 1000 + len(list(folder.iterdir()))),
                "--max-tokens", str(wl.max_tokens), "--mix", wl.mix,
                "--thresholds", wl.thresholds, "--long-max-tokens", str(wl.long_max_tokens)]
        if collectors is None:
            argv.append("--no-collectors")
        elif soak_args is None:
            argv += ["--gpu-interval", f"{collectors[0]:g}",
                     "--metrics-interval", f"{collectors[1]:g}"]
        if soak_args is not None:
            from infra.soak import main as soak_main

            argv += soak_args
            phase.setdefault("commands", []).append("swarmload soak " + " ".join(argv))
            code = soak_main(argv)
            if code != 0:
                raise RuntimeError(f"swarmload soak exited {code}")
            return folder / run_id
        phase.setdefault("commands", []).append("swarmload run " + " ".join(argv))
        return run_swarmload(parse_args(argv))

    launch = replace(config.launch(), args=(*config.args, *extra_server_args))
    with start_target(launch, say) as target:
        phase.setdefault("launch", []).append(target.launch)
        body(phase, target, run)
    if finish:
        phase["status"] = "finished"
        save_state(work, state)
        pack(folder, args.out / f"{name}.tar.gz")


def soak_and_record(args: argparse.Namespace, record: dict[str, Any], target: Any, run: Any,
                    users: int, length: float) -> None:
    """One soak run on ``target`` (serving already): its client figures, the server's own means
    over it and its drift report, into ``record``."""
    before = histogram_sums(target.base_url)
    soak_args = ["--window", args.soak_window, "--warmup", args.soak_warmup,
                 "--sample-interval", f"{args.soak_sample_s:g}"]
    run_dir = run("soak", users, length, (args.soak_sample_s, args.soak_sample_s),
                  target.base_url, target.model, soak_args)
    record["result"] = {**client_figures(run_dir),
                        **server_means(before, histogram_sums(target.base_url))}
    drift = run_dir / "drift.json"
    if drift.is_file():
        record["drift"] = json.loads(drift.read_text())


def phase_soak(args: argparse.Namespace, work: Path, state: dict[str, Any], clock: Clock) -> bool:
    """One long run at ``--soak-fraction`` of the better configuration's knee."""
    phase = state["phases"].setdefault("soak", {})
    if phase.get("status") == "finished":
        return True
    soak_s = min(args.soak_s, clock.left() - SERVER_START_S - 45)
    if soak_s < args.min_soak_s:
        say(f"soak: {clock.left():.0f} s left, too little for {args.min_soak_s:.0f} s; next call")
        return False

    def body(phase: dict[str, Any], target: Any, run: Any) -> None:
        users = max(1, round(args.soak_fraction * phase["knee_load"]))
        length = min(soak_s, clock.left() - 75)  # the soak's report, the stop, the pack
        phase.update(users=users, duration_s=round(length), asked_s=args.soak_s)
        save_state(work, state)
        say(f"soak: {users} users ({args.soak_fraction:.0%} of the knee {phase['knee_load']:g}) "
            f"for {length:.0f} s (asked {args.soak_s:.0f} s)")
        soak_and_record(args, phase, target, run, users, length)

    _serve_better(args, work, state, "soak", body)
    return True


def phase_effect(args: argparse.Namespace, work: Path, state: dict[str, Any],
                 clock: Clock) -> bool:
    """Runs with and without the collectors, interleaved (ABBA...), on one server."""
    phase = state["phases"].setdefault("effect", {})
    if phase.get("status") == "finished":
        return True
    arms = args.effect_arms.split(",")
    unknown = [a for a in arms if a not in EFFECT_ARMS]
    if unknown:
        raise SystemExit(f"--effect-arms: unknown {unknown}; known: {list(EFFECT_ARMS)}")
    per_run = args.effect_run_s + RUN_OVERHEAD_S
    rounds = min(args.effect_rounds,
                 int((clock.left() - SERVER_START_S - 30) // (len(arms) * per_run)))
    if rounds < 1:
        say(f"effect: {clock.left():.0f} s left, too little for one round; next call")
        return False

    def body(phase: dict[str, Any], target: Any, run: Any) -> None:
        users = max(1, round(args.effect_fraction * phase["knee_load"]))
        rows = phase.setdefault("runs", [])
        phase.update(users=users, rounds=rounds, run_s=args.effect_run_s, arms=arms)
        order: list[str] = []
        for r in range(rounds):  # ABC CBA ABC: a drift of the server weighs on every arm alike
            order += arms if r % 2 == 0 else arms[::-1]
        for i, arm in enumerate(order, 1):
            if clock.left() < per_run + 20:
                say("effect: out of time; stopping the interleaved runs here")
                break
            name = f"effect-{i}-{arm.replace('+', '-')}"
            before = histogram_sums(target.base_url)
            run_dir = run(name, users, args.effect_run_s, EFFECT_ARMS[arm], target.base_url,
                          target.model)
            settings = EFFECT_ARMS[arm]
            row = {"run": name, "arm": arm, "collectors": settings is not None,
                   "gpu_interval_s": settings[0] if settings else None,
                   "metrics_interval_s": settings[1] if settings else None, "users": users,
                   **client_figures(run_dir),
                   **server_means(before, histogram_sums(target.base_url))}
            rows.append(row)
            save_state(work, state)
            say(f"{name}: {json.dumps(row)}")

    _serve_better(args, work, state, "effect", body)
    return True


# ----------------------------------------------------------------------------------- sessions


def per_turn_table(run_dir: Path) -> list[dict[str, Any]]:
    """Per turn index: requests, TTFT P50/P95, the measured prefix-cache hit share (vLLM's
    ``cached_tokens`` over prompt tokens) beside what a perfect cache would reuse
    (``reusable_tokens`` over prompt tokens)."""
    from collectors.run_folder import load_requests

    records = load_requests(run_dir, ["outcome", "turn", "ttft_s", "prompt_tokens",
                                      "cached_tokens", "reusable_tokens", "history_tokens"])
    ok = records[(records["outcome"] == "ok") & records["turn"].notna()]
    rows = []
    for turn, group in ok.groupby("turn"):
        prompt = float(group["prompt_tokens"].sum())
        rows.append({
            "turn": int(turn), "requests": len(group),
            "prompt_tokens_mean": round(float(group["prompt_tokens"].mean()), 1),
            "history_tokens_mean": round(float(group["history_tokens"].mean()), 1),
            "ttft_p50_ms": round(float(group["ttft_s"].quantile(0.5)) * 1e3, 2),
            "ttft_p95_ms": round(float(group["ttft_s"].quantile(0.95)) * 1e3, 2),
            "hit_share": round(float(group["cached_tokens"].fillna(0).sum()) / prompt, 4)
            if prompt else None,
            "perfect_share": round(float(group["reusable_tokens"].fillna(0).sum()) / prompt, 4)
            if prompt else None,
        })
    return rows


def phase_sessions(args: argparse.Namespace, work: Path, state: dict[str, Any],
                   clock: Clock) -> bool:
    """Multi-turn sessions with a long shared system prompt on the better configuration, its
    prefix cache on (vLLM's default) and then off (``--no-enable-prefix-caching``): TTFT and the
    measured hit share per turn against what a perfect cache would reuse."""
    from infra.cli import main as swarmload_main
    from infra.orchestrate import parse_args
    from infra.orchestrate import run as run_swarmload
    from infra.study.spec import load_study

    phase = state["phases"].setdefault("sessions", {})
    if phase.get("status") == "finished":
        return True
    need = 2 * (SERVER_START_S + args.sessions_run_s + 30)
    if clock.left() < need:
        say(f"sessions: {clock.left():.0f} s left, {need:.0f} s needed; next call")
        return False
    spec = load_study(args.study)
    model = spec.configuration(chosen_configuration(state, spec)["config"]).model
    folder = work / "sessions"
    workload = folder / "workload"
    if not (workload / "workload.parquet").is_file():
        build = ["workload", "build", "--source", f"synthetic:{args.sessions_spec}",
                 "--tokenizer", str(model), "--out", str(workload)]
        phase.setdefault("commands", []).append("swarmload " + " ".join(build))
        if swarmload_main(build) != 0:
            raise RuntimeError("swarmload workload build failed")
    plan = folder / "closed.yaml"  # K sessions running at once, the next when one ends
    plan.write_text(f"kind: closed\nconcurrency: {args.sessions_concurrency}\n")
    arms = phase.setdefault("arms", {})

    def sessions_run(cache: str) -> Any:
        def body(phase: dict[str, Any], target: Any, run: Any) -> None:
            argv = ["--target", target.base_url, "--model", target.model, "--endpoint", "chat",
                    "--workload", str(workload), "--plan", str(plan),
                    "--workers", str(spec.workers), "--duration", f"{args.sessions_run_s:.0f}",
                    "--results", str(folder), "--run-id", f"sessions-cache-{cache}", "--quiet",
                    "--gpu-interval", "0.5", "--metrics-interval", "1"]
            phase.setdefault("commands", []).append("swarmload run " + " ".join(argv))
            run_dir = run_swarmload(parse_args(argv))
            arms[cache] = {"summary": client_figures(run_dir), "per_turn": per_turn_table(run_dir)}
            save_state(work, state)
            say(f"sessions, cache {cache}: {json.dumps(arms[cache]['per_turn'])}")
            if cache == "on" and args.sessions_soak_s > 0 and phase.get("knee_load"):
                soak_on_this_server(phase, target, run)
        return body

    def soak_on_this_server(phase: dict[str, Any], target: Any, run: Any) -> None:
        """The soak of the chosen configuration on the server already up (one start less)."""
        soak = state["phases"].setdefault("soak", {})
        length = min(args.sessions_soak_s,
                     clock.left() - SERVER_START_S - args.sessions_run_s - 90)
        if length < args.min_soak_s:
            say(f"soak: {length:.0f} s left for it, under {args.min_soak_s:.0f} s; skipped")
            return
        users = max(1, round(args.soak_fraction * float(phase.get("max_sustainable_load")
                                                        or phase["knee_load"])))
        soak.update(config=phase["config"], users=users, duration_s=round(length),
                    of="max sustainable load", status="running")
        save_state(work, state)
        soak_and_record(args, soak, target, run, users, length)
        soak["status"] = "finished"
        save_state(work, state)

    for cache, extra in (("on", ()), ("off", ("--no-enable-prefix-caching",))):
        if cache in arms:
            continue
        if clock.left() < SERVER_START_S + args.sessions_run_s + 30:
            say("sessions: out of time before the cache-off arm; next call")
            return False
        _serve_better(args, work, state, "sessions", sessions_run(cache),
                      extra_server_args=extra, finish=cache == "off")
    return True


# ------------------------------------------------------------------------------------ scaling


def phase_scaling(args: argparse.Namespace, work: Path, state: dict[str, Any],
                  clock: Clock) -> bool:
    phase = state["phases"].setdefault("scaling", {})
    if phase.get("status") == "finished":
        return True
    if clock.left() < 150:
        say(f"scaling: {clock.left():.0f} s left, too little; next call")
        return False
    argv = cli("bench", "scaling", "--workers", args.scaling_workers, "--rates",
               args.scaling_rates, "--step-s", "3", "--gap-s", "1", "--target-processes", "6",
               "--results", str(work / "bench"))
    phase["command"] = " ".join(argv[2:])
    code = run_bounded(argv, clock.left() - 20, work / "scaling.log")
    phase["status"] = "finished" if code == 0 else f"exit {code}"
    save_state(work, state)
    pack(work / "bench", args.out / "scaling.tar.gz", only=("bench.json",))
    return code == 0


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", type=Path,
                   default=REPO / "infra" / "study" / "examples" / "h200-api-servers.yaml")
    p.add_argument("--work", type=Path, default=Path("/root/results"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/headline-out")))
    p.add_argument("--budget-s", type=float, default=560.0, help="this call's time, seconds")
    p.add_argument("--phases", default="study,soak,effect,scaling")
    p.add_argument("--soak-s", type=float, default=900.0)
    p.add_argument("--min-soak-s", type=float, default=240.0)
    p.add_argument("--soak-fraction", type=float, default=0.7)
    p.add_argument("--effect-fraction", type=float, default=0.7)
    p.add_argument("--effect-rounds", type=int, default=2,
                   help="each arm this many times, in ABC CBA order")
    p.add_argument("--effect-arms", default=",".join(EFFECT_ARMS),
                   help=f"collector settings compared, of {list(EFFECT_ARMS)}")
    p.add_argument("--soak-window", default="30s")
    p.add_argument("--soak-warmup", default="2m")
    p.add_argument("--soak-sample-s", type=float, default=2.0,
                   help="the soak's telemetry interval (NVML, /metrics, host), seconds")
    p.add_argument("--study-dir", type=Path, default=None,
                   help="an earlier session's study folder (rollup/capacity.parquet) instead of "
                        "running the study again")
    p.add_argument("--effect-run-s", type=float, default=25.0)
    p.add_argument("--sessions-spec", default=(
        "sessions=400,turns=5,system_tokens=4000,groups=1,user_tokens=150,output_tokens=96,"
        "think_s=1"), help="the synthetic session workload (docs/guides/sessions.md)")
    p.add_argument("--sessions-concurrency", type=int, default=32)
    p.add_argument("--sessions-run-s", type=float, default=75.0)
    p.add_argument("--sessions-soak-s", type=float, default=0.0,
                   help="after the cache-on sessions run, a soak of this length on the same "
                        "server at --soak-fraction of the max sustainable load (0: none)")
    p.add_argument("--scaling-workers", default="1,2,4,8,16")
    p.add_argument("--scaling-rates", default="500,900,1300")
    args = p.parse_args(argv)
    clock = Clock(args.budget_s)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    state = load_state(args.work)
    if args.study_dir and "study" not in state["phases"]:
        state["phases"]["study"] = {"status": "finished", "dir": str(args.study_dir.resolve()),
                                    "from": "an earlier session (--study-dir)"}
    phases = {"study": phase_study, "soak": phase_soak, "effect": phase_effect,
              "sessions": phase_sessions, "scaling": phase_scaling}
    try:
        for name in args.phases.split(","):
            # a study that failed still leaves the later phases their server (its first
            # configuration); any other phase that stops ends this call
            if not phases[name](args, args.work, state, clock) and name != "study":
                break
    finally:
        save_state(args.work, state)
        (args.out / "headline.json").write_text(json.dumps(state, indent=2, default=str) + "\n")
        logs = REPO / ".cache" / "vllm"
        if logs.is_dir():  # the servers' own logs: start-up timings, vLLM's periodic stats
            pack(logs, args.out / "vllm-logs.tar.gz", skip_logs=False)
    done = [n for n in args.phases.split(",")
            if state["phases"].get(n, {}).get("status") == "finished"]
    say(f"finished phases: {done}; {clock.left():.0f} s of this call's budget left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
