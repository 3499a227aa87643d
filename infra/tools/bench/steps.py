"""Load steps of each client against a target, reduced to the same few figures.

- :func:`run_swarmload` + :func:`step_results`: one ``swarmload run`` (real Locust master + N
  workers, open-loop replay) of a stepped Poisson schedule (:func:`stepped_offsets`, stored as a
  trace workload by :func:`write_bench_workload`), split into steps; figures from the Parquet
  records.
- :func:`vllm_steps`: ``vllm bench serve`` (vLLM's own code, in the vLLM venv) at each rate.

Both yield :class:`StepResult`; :func:`passes` applies the ceiling criteria to either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from infra.paths import PACKAGE_ROOT as REPO_ROOT
from infra.tools.bench.lean_target import BenchError

LAG_LIMIT_S = 0.010  # p99 schedule lag under this: the generator kept its schedule
TTFT_LIMIT_S = 0.010  # against an instant target, TTFT above this is the client's own queueing
ACHIEVED_MIN = 0.95  # achieved requests/s at least this share of offered (METRICS.md)


@dataclass
class StepResult:
    client: str
    offered_rps: float
    achieved_rps: float
    output_tok_s: float
    ok: int
    failed: int
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    lag_p99_s: float | None = None  # swarmload only: vllm bench serve does not measure it
    workers: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def keeps_up(step: StepResult) -> bool:
    """The loose criterion: no errors and achieved >= 95% of offered (METRICS-STUDIES.md's
    sustainable load), whatever the latency."""
    if step.ok == 0 or step.failed > 0.001 * (step.ok + step.failed):
        return False
    return step.achieved_rps >= ACHIEVED_MIN * step.offered_rps


def passes(step: StepResult, ttft_floor_s: float = 0.0) -> bool:
    """The strict criterion: it keeps up, p99 schedule lag (where measured) and p99
    client-side TTFT against an instant target both under 10 ms (``ttft_floor_s``: the
    target's own TTFT, added to the TTFT limit)."""
    if not keeps_up(step):
        return False
    if step.lag_p99_s is not None and step.lag_p99_s >= LAG_LIMIT_S:
        return False
    return step.ttft_p99_s is not None and step.ttft_p99_s < TTFT_LIMIT_S + ttft_floor_s


def letters_key(index: int) -> str:
    """``rq`` and ``index`` in letters (:func:`workloads.scrub.letters_id`): digits would trip
    the workload scrubber."""
    from workloads.scrub import letters_id

    return "rq" + letters_id(index)


def stepped_offsets(rates: list[float], step_s: float, gap_s: float,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrivals at each rate for ``step_s``, steps ``gap_s`` apart (the gap lets the
    previous step drain): (offsets in s, step index of each arrival)."""
    rng = np.random.default_rng(seed)
    offsets, steps = [], []
    start = 0.0
    for index, rate in enumerate(rates):
        t = start + np.cumsum(rng.exponential(1.0 / rate, size=int(rate * step_s * 1.5) + 10))
        t = t[t < start + step_s]
        offsets.append(t)
        steps.append(np.full(t.size, index))
        start += step_s + gap_s
    return np.concatenate(offsets), np.concatenate(steps)


def write_bench_workload(folder: Path, offsets: np.ndarray, prompt_words: int,
                         output_tokens: int) -> Path:
    """A trace workload, one row per arrival, whose row ``i`` has the prompt
    ``<letters_key(i)> the the ...`` and request id ``letters_key(i)``: the target logs the
    prompt's first word, which joins server and client times (``infra.tools.bench.target``)."""
    from workloads.schema import workload_table, write_workload

    ids = [letters_key(i) for i in range(len(offsets))]
    filler = " ".join(["the"] * max(prompt_words - 1, 0))
    frame = workload_table(
        ["short"] * len(ids), [prompt_words] * len(ids), [output_tokens] * len(ids),
        request_id=ids, prompt=[f"{rid} {filler}".strip() for rid in ids],
        trace_offset_s=offsets, prompt_source="synthesized")
    write_workload(frame, folder, {"source": "swarmload bench", "endpoint": "completions"})
    (folder / "arrivals.yaml").write_text("kind: trace\ntime_scale: 1.0\n")
    return folder


def _pin_workers(proc: subprocess.Popen[str], cores: tuple[int, ...]) -> None:
    """Move each Locust worker process ``proc`` starts to the next of ``cores`` as it appears
    (any tree's swarmload: the bench does it from outside), until ``proc`` ends."""
    import psutil

    pinned: set[int] = set()
    try:
        parent = psutil.Process(proc.pid)
        while proc.poll() is None:
            for child in parent.children(recursive=True):
                if child.pid in pinned:
                    continue
                try:
                    if "--worker" in child.cmdline():
                        child.cpu_affinity([cores[len(pinned) % len(cores)]])
                        pinned.add(child.pid)
                except psutil.Error:
                    continue  # gone meanwhile, or not ours to move
            time.sleep(0.05)
    except psutil.Error:
        return  # the run ended


def run_swarmload(base_url: str, workload: Path, duration_s: float, *, workers: int,
                  results: Path, run_id: str, collectors: bool = False,
                  env: dict[str, str] | None = None, code: Path | None = None,
                  worker_cores: tuple[int, ...] = ()) -> pd.DataFrame:
    """``swarmload run`` replaying ``workload`` open-loop; its request records, with the row
    index of each (``row``) parsed from the request id. ``code``: run the swarmload of that
    source tree (another commit's checkout: before/after in one bench run) instead of this one;
    its records are read with this tree's reader. ``worker_cores``: each worker process is
    moved to the next of these cores as it starts (:func:`core_plan`)."""
    from collectors.run_folder import load_requests

    results.mkdir(parents=True, exist_ok=True)
    tree = (code or REPO_ROOT).resolve()
    argv = [sys.executable, "-m", "infra.cli", "run", "--target", base_url,
            "--workers", str(workers), "--workload", str(workload),
            "--duration", f"{duration_s:.3f}", "--drain", "20", "--results", str(results),
            "--run-id", run_id, "--quiet", "--inflight-cap", "100000",
            *([] if collectors else ["--no-collectors"])]
    if _knows_prompt_salt(tree):
        # the bench target joins on each prompt's first word, the key: no salt before it
        argv += ["--prompt-salt", "none"]
    environ = {**os.environ, **(env or {})}
    if code is not None:  # that tree's packages first, in the run and in every child of it
        environ["PYTHONPATH"] = os.pathsep.join(
            [str(tree), *filter(None, [environ.get("PYTHONPATH")])])
    proc = subprocess.Popen(argv, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environ)
    if worker_cores:
        threading.Thread(target=_pin_workers, args=(proc, worker_cores), daemon=True).start()
    try:
        stdout, stderr = proc.communicate(timeout=duration_s + 240)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    out = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    if out.returncode != 0:
        raise BenchError(f"swarmload run failed ({out.returncode}): {out.stderr[-1500:]}")
    df = load_requests(results / run_id)
    df["key"] = df["request_id"].str.split("#").str[0]
    df["row"] = df["key"].map(key_index)
    df.attrs["run_dir"] = str(results / run_id)
    df.attrs["summary"] = out.stdout[-3000:]
    return df


def _knows_prompt_salt(tree: Path) -> bool:
    """Whether the swarmload of ``tree`` has ``--prompt-salt`` (code older than the salt has no
    salt to turn off)."""
    config = tree / "locustfiles" / "config.py"
    return config.exists() and "prompt_salt" in config.read_text()


def parse_codes(values: list[str] | None) -> list[tuple[str, Path | None]]:
    """``--code LABEL=DIR`` values -> [(label, tree)]; none given: [("this", None)], this tree.
    Each DIR must be a swarmload checkout (``git worktree add DIR COMMIT``)."""
    if not values:
        return [("this", None)]
    codes: list[tuple[str, Path | None]] = []
    for value in values:
        label, sep, folder = value.partition("=")
        tree = Path(folder).expanduser().resolve()
        if not sep or not label or not (tree / "infra" / "cli.py").exists():
            raise BenchError(f"--code {value!r}: want LABEL=DIR with DIR a swarmload checkout "
                             "(e.g. old=../wt-old made by git worktree add ../wt-old ec33911)")
        if label in (c[0] for c in codes):
            raise BenchError(f"--code {value!r}: label {label!r} given twice")
        codes.append((label, tree))
    return codes


def key_index(key: str) -> int:
    value = 0
    for char in key[2:]:
        value = value * 26 + ord(char) - ord("a")
    return value


def step_results(df: pd.DataFrame, offsets: np.ndarray, step_of_row: np.ndarray,
                 rates: list[float], step_s: float, gap_s: float,
                 workers: int = 1) -> list[StepResult]:
    """Split one run's records into its load steps; figures per step. Offered = arrivals
    scheduled in the step / step length; achieved = ok / (step start to the later of its end and
    its last completion), so a generator that falls behind shows less than offered."""
    results = []
    rows = df["row"].to_numpy()
    step = step_of_row[rows]
    sched = df["scheduled_wall_ns"].to_numpy(dtype=float)
    t0_ns = float(np.median(sched - offsets[rows] * 1e9))  # the schedule's time zero, wall clock
    for index, _rate in enumerate(rates):
        part = df[step == index]
        ok = part[part["outcome"] == "ok"]
        start_ns = t0_ns + index * (step_s + gap_s) * 1e9
        ends = ok["sent_wall_ns"].to_numpy(dtype=float) + ok["e2e_s"].to_numpy(dtype=float) * 1e9
        # the last completion, less one typical request's length (a paced target's streams
        # last long by design; a generator that fell behind still ends late)
        e2e_med = float(ok["e2e_s"].median()) if len(ok) else 0.0
        span_s = max(step_s, ((ends.max() - start_ns) * 1e-9 - e2e_med) if len(ok) else step_s)
        scheduled = int((step_of_row == index).sum())
        results.append(StepResult(
            client="swarmload", offered_rps=scheduled / step_s, workers=workers,
            achieved_rps=len(ok) / span_s, output_tok_s=float(ok["output_tokens"].sum()) / span_s,
            ok=len(ok), failed=int(len(part) - len(ok)),
            ttft_p50_s=percentile(ok["ttft_s"], 50, None),
            ttft_p95_s=percentile(ok["ttft_s"], 95, None),
            ttft_p99_s=percentile(ok["ttft_s"], 99, None),
            tpot_p50_s=percentile(ok["tpot_s"], 50, None),
            tpot_p95_s=percentile(ok["tpot_s"], 95, None),
            lag_p99_s=percentile(part["schedule_lag_s"], 99, None),
            extra={"outcomes": part["outcome"].value_counts().to_dict(),
                   "lag_p50_s": percentile(part["schedule_lag_s"], 50, None)},
        ))
    return results


def vllm_steps(base_url: str, rates: list[float], duration_s: float, *, model: str,
               tokenizer: Path, input_len: int, output_len: int,
               keep_ttfts: bool = False) -> list[StepResult]:
    """``vllm bench serve`` at each rate (random dataset, ``--ignore-eos``), in one process."""
    from infra.targets.vllm_venv import require_vllm_python

    python = require_vllm_python()
    argv = ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
            "--ready-check-timeout-sec", "0", "--seed", "0"]
    if keep_ttfts:  # vLLM drops the per-request arrays from its result without this
        argv.append("--save-detailed")
    with tempfile.TemporaryDirectory(prefix="swarmload-vllm-bench-") as tmp:
        config, out = Path(tmp) / "config.json", Path(tmp) / "out.json"
        config.write_text(json.dumps({"argv": argv, "rates": rates, "duration_s": duration_s,
                                      "keep_ttfts": keep_ttfts}))
        started = time.monotonic()
        entry = REPO_ROOT / "infra/tools/bench/vllm_sweep_entry.py"
        proc = subprocess.run([str(python), str(entry), str(config), str(out)], cwd=REPO_ROOT,
                              capture_output=True, text=True,
                              timeout=len(rates) * (duration_s + 120) + 120)
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"vllm bench serve failed ({proc.returncode}) after "
                             f"{time.monotonic() - started:.0f} s: {proc.stderr[-2000:]}")
        raw = json.loads(out.read_text())
    steps = []
    for r in raw:
        ms = 1e-3
        steps.append(StepResult(
            client="vllm bench serve", offered_rps=r["rate"],
            achieved_rps=r["request_throughput"], output_tok_s=r["output_throughput"],
            ok=r["completed"], failed=r.get("failed", r["num_prompts"] - r["completed"]),
            ttft_p50_s=r["p50_ttft_ms"] * ms, ttft_p95_s=r["p95_ttft_ms"] * ms,
            ttft_p99_s=r["p99_ttft_ms"] * ms, tpot_p50_s=r["p50_tpot_ms"] * ms,
            tpot_p95_s=r["p95_tpot_ms"] * ms,
            extra={"duration_s": r["duration"], "total_input_tokens": r["total_input_tokens"],
                   "ttft_mean_s": r["mean_ttft_ms"] * ms, "ttfts": r.get("ttfts")},
        ))
    return steps
