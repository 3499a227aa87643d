"""The benchmark's parts and their tables: ceiling (+ ratio to ``vllm bench serve``), timing
accuracy against the target's truth log, agreement on real vLLM, and worker scaling.

Every part writes its figures to ``<results>/<bench id>/bench.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collectors.itl_gaps import gaps_by_row, merged_reads
from collectors.percentiles import percentile
from infra.cores import CorePlanError, core_plan
from infra.tools.bench.lean_target import BenchError, running_lean_target
from infra.tools.bench.steps import (
    StepResult,
    keeps_up,
    parse_codes,
    passes,
    run_swarmload,
    step_results,
    stepped_offsets,
    vllm_steps,
    write_bench_workload,
)

DEFAULT_RATES = "50,100,150,200,300,400,600,800,1000"
ACCURACY_FRACTIONS = (0.1, 0.5, 0.7, 0.9)
ACCURACY_WORKERS = "1"  # --workers of the accuracy part by default (scaling: SCALING_WORKERS)
SCALING_WORKERS = "1,2,4,8"


def _rates(text: str) -> list[float]:
    return [float(r) for r in text.split(",") if r.strip()]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def format_steps(steps: list[StepResult]) -> str:
    lines = [f"{'client':<17} {'wk':>2} {'offered':>8} {'req/s':>8} {'tok/s':>9} {'ok':>6} "
             f"{'fail':>5} {'ttft p50':>8} {'ttft p99':>8} {'lag p50':>8} {'lag p99':>8}  "
             "strict keeps-up"]
    for s in steps:
        lines.append(f"{s.client:<17} {s.workers:>2} {s.offered_rps:>8.0f} {s.achieved_rps:>8.0f}"
                     f" {s.output_tok_s:>9.0f} {s.ok:>6} {s.failed:>5} {_ms(s.ttft_p50_s):>8}"
                     f" {_ms(s.ttft_p99_s):>8} {_ms(s.extra.get('lag_p50_s')):>8}"
                     f" {_ms(s.lag_p99_s):>8}  {passes(s)!s:<6} {keeps_up(s)}")
    return "\n".join(lines)


def ceiling_of(steps: list[StepResult], strict: bool = True,
               ttft_floor_s: float = 0.0) -> StepResult | None:
    """The passing step with the most streamed tokens/s (None: no step passed); ``strict``:
    :func:`passes`, else :func:`keeps_up`."""
    ok = [s for s in steps if (passes(s, ttft_floor_s) if strict else keeps_up(s))]
    return max(ok, key=lambda s: s.output_tok_s) if ok else None


def swarmload_ceiling(base_url: str, rates: list[float], args: argparse.Namespace,
                      workdir: Path, tag: str, workers: int = 1, code: Path | None = None,
                      label: str = "") -> list[StepResult]:
    """One ``swarmload run`` over all steps; a first warm-up step at the lowest rate (worker
    start, first connections) is run and left out of the figures. ``code``/``label``: the
    source tree that runs (:func:`infra.tools.bench.steps.run_swarmload`), named in each step."""
    stepped = [rates[0], *rates]
    offsets, step_of_row = stepped_offsets(stepped, args.step_s, args.gap_s)
    workload = write_bench_workload(workdir / f"workload-{tag}", offsets, args.prompt_words,
                                    args.tokens)
    df = run_swarmload(base_url, workload, float(offsets.max()) + 0.5, workers=workers,
                       results=workdir, run_id=f"swarmload-{tag}", code=code,
                       worker_cores=args.worker_cores[:workers])
    steps = step_results(df, offsets, step_of_row, stepped, args.step_s, args.gap_s,
                         workers)[1:]
    for step in steps:
        step.client = f"swarmload:{label}" if label else step.client
    return steps


def code_rounds(args: argparse.Namespace) -> list[tuple[int, str, Path | None]]:
    """(round, label, tree) in running order: with ``--code`` A and B and ``--rounds 2``,
    A B A B, so a machine's drift and its neighbours' load weigh on each tree alike."""
    codes = parse_codes(args.code)
    rounds = args.rounds if args.code else 1
    return [(r + 1, label, tree) for r in range(rounds) for label, tree in codes]


def format_code_ceilings(rows: list[dict[str, Any]]) -> str:
    """One line per tree and round: its strict and keeps-up ceilings, and its lag per step."""
    lines = [f"{'code':<10} {'round':>5} {'strict req/s':>12} {'keeps-up req/s':>14}  "
             "lag p50/p99 ms per step (offered req/s)"]
    for row in rows:
        lags = "  ".join(f"{s['offered_rps']:.0f}: {_ms(s['extra'].get('lag_p50_s'))}/"
                         f"{_ms(s['lag_p99_s'])}" for s in row["steps"])
        strict, loose = row["strict"] or {}, row["keeps_up"] or {}
        lines.append(f"{row['code']:<10} {row['round']:>5} {strict.get('achieved_rps', 0):>12.0f}"
                     f" {loose.get('achieved_rps', 0):>14.0f}  {lags}")
    return "\n".join(lines)


def part_ceiling(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> float | None:
    rates = _rates(args.rates)
    by_code: list[dict[str, Any]] = []
    with running_lean_target(args.target) as url:
        swarm: list[StepResult] = []
        for round_no, label, tree in code_rounds(args):
            steps = swarmload_ceiling(url, rates, args, workdir,
                                      f"ceiling-{label}-{round_no}" if args.code else "ceiling",
                                      code=tree, label=label if args.code else "")
            strict, loose = ceiling_of(steps, True), ceiling_of(steps, False)
            by_code.append({"code": label, "tree": str(tree or ""), "round": round_no,
                            "strict": strict.as_dict() if strict else None,
                            "keeps_up": loose.as_dict() if loose else None,
                            "steps": [s.as_dict() for s in steps]})
            swarm = swarm or steps  # the ratio to vllm bench serve: the first tree's
            if args.code:
                print(f"\n-- {label}, round {round_no} --\n{format_steps(steps)}", flush=True)
        vllm: list[StepResult] = []
        if not args.skip_vllm:
            vllm = vllm_steps(url, rates, args.step_s, model="swarmload-bench",
                              tokenizer=_tokenizer(), input_len=args.prompt_words,
                              output_len=args.tokens)
    print("\n== ceiling: one worker process vs vllm bench serve, same lean target ==")
    print(format_steps(swarm + vllm))
    summary: dict[str, Any] = {"steps": [s.as_dict() for s in swarm + vllm]}
    for strict_only, label in ((True, "strict: p99 lag and TTFT < 10 ms, keeps up"),
                               (False, "keeps up: >= 95% of offered, no errors")):
        mine, ref = ceiling_of(swarm, strict_only), ceiling_of(vllm, strict_only)
        ratio = (mine.output_tok_s / ref.output_tok_s) if mine and ref else None
        print(f"ceiling ({label}):\n  swarmload        {_ceiling_text(mine)}\n"
              f"  vllm bench serve {_ceiling_text(ref)}\n  ratio (tok/s) "
              f"{'-' if ratio is None else f'{ratio:.2f}'}")
        summary["strict" if strict else "keeps_up"] = {
            "ratio": ratio, "swarmload": mine.as_dict() if mine else None,
            "vllm": ref.as_dict() if ref else None}
    if args.code:
        print("\n== ceiling by source tree, in running order (strict: p99 lag and TTFT < 10 ms) "
              "==")
        print(format_code_ceilings(by_code))
        summary["by_code"] = by_code
    out["ceiling"] = summary
    mine = ceiling_of(swarm, True) or ceiling_of(swarm, False)
    return mine.output_tok_s if mine else None


def _ceiling_text(step: StepResult | None) -> str:
    if step is None:
        return "no step passed"
    return (f"{step.output_tok_s:.0f} output tok/s, {step.achieved_rps:.0f} req/s "
            f"(offered {step.offered_rps:.0f} req/s)")


def _tokenizer() -> Path:
    from infra.targets.vllm_cpu import TINY_MODEL_DIR

    if not (TINY_MODEL_DIR / "tokenizer.json").exists():
        raise BenchError(f"no tokenizer at {TINY_MODEL_DIR}: run `swarmload target vllm-cpu` "
                         "once to prepare the tiny model")
    return TINY_MODEL_DIR


def paced_ceiling(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> float | None:
    """One worker's ceiling against the paced target (one write, hence one recv, per token):
    the load the accuracy steps take fractions of, since per-event cost is what limits there."""
    tokens = args.tokens
    args.tokens = args.accuracy_tokens
    try:
        with running_lean_target(None, ttft_s=args.ttft_s, itl_s=args.itl_s,
                                 processes=args.target_processes) as url:
            steps = swarmload_ceiling(url, _rates(args.rates), args, workdir, "paced")
    finally:
        args.tokens = tokens
    print("\n== ceiling against the paced target (accuracy's shape) ==")
    print(format_steps(steps))
    best = ceiling_of(steps, True, args.ttft_s) or ceiling_of(steps, False)
    print(f"paced ceiling (p99 lag < 10 ms, p99 TTFT < target's + 10 ms, keeps up): "
          f"{_ceiling_text(best)}")
    out["paced_ceiling"] = {"steps": [s.as_dict() for s in steps],
                            "ceiling": best.as_dict() if best else None}
    return best.output_tok_s if best else None


def part_accuracy(args: argparse.Namespace, workdir: Path, out: dict[str, Any],
                  ceiling_tok_s: float) -> None:
    """Client TTFT/ITL vs the target's truth log at fractions of the ceiling.

    With ``--compare-read-times`` the same steps run again with the worker's read times instead
    of the kernel's receive times (``SWARMLOAD_KERNEL_RX_TIMES=0``), alternating, so the two
    are compared in one run on the same machine.
    """
    tokens = args.accuracy_tokens
    rates = [max(f * ceiling_tok_s / tokens, 1.0) for f in ACCURACY_FRACTIONS]
    offsets, step_of_row = stepped_offsets(rates, args.step_s, args.gap_s, seed=1)
    workload = write_bench_workload(workdir / "workload-accuracy", offsets, args.prompt_words,
                                    tokens)
    modes = ["kernel", "read"] if args.compare_read_times else ["kernel"]
    results: dict[str, list[list[dict[str, Any]]]] = {mode: [] for mode in modes}
    by_code: list[dict[str, Any]] = []
    codes = parse_codes(args.code)
    counts = worker_counts(args.workers or ACCURACY_WORKERS)
    by_workers: list[dict[str, Any]] = []
    for round_index, workers in ((r, w) for r in range(args.rounds) for w in counts):
        for (label, tree), mode in ((c, m) for c in codes for m in modes):
            tag = f"{mode}-{round_index + 1}" if not args.code else (
                f"{label}-{mode}-{round_index + 1}")
            tag += f"-w{workers}" if len(counts) > 1 else ""
            run_id = f"swarmload-accuracy-{tag}"
            truth_dir = workdir / f"truth-{tag}"
            truth_dir.mkdir()
            env = {"SWARMLOAD_KERNEL_RX_TIMES": "1" if mode == "kernel" else "0"}
            with running_lean_target(None, ttft_s=args.ttft_s, itl_s=args.itl_s,
                                     processes=args.target_processes,
                                     truth_dir=str(truth_dir)) as url:
                df = run_swarmload(url, workload, float(offsets.max()) + 0.5, workers=workers,
                                   results=workdir, run_id=run_id, env=env, code=tree,
                                   worker_cores=args.worker_cores[:workers])
            truth = [r for f in truth_dir.glob("truth-*.json")
                     for r in json.loads(f.read_text())["requests"]]
            rows = accuracy_rows(df, truth, rates, step_of_row, tokens)
            if label == codes[0][0] and workers == counts[0]:
                results[mode].append(rows)
            by_workers.append({"workers": workers, "round": round_index + 1, "mode": mode,
                               "code": label, "rows": rows})
            by_code.append({"code": label, "round": round_index + 1, "mode": mode,
                            "rows": rows})
            print(f"\n== accuracy{f' [{label}]' if args.code else ''}, {workers} worker(s), "
                  f"{mode} times, round {round_index + 1}: client TTFT/ITL minus the target's "
                  "times "
                  "(CLOCK_MONOTONIC) ==")
            print(f"target: first token {args.ttft_s * 1e3:g} ms after arrival, then one every "
                  f"{args.itl_s * 1e3:g} ms; {tokens} tokens; error = client - server, in ms; "
                  f"event times: {'kernel receive' if mode == 'kernel' else 'worker read'}")
            print(format_accuracy(rows))
    out["accuracy"] = {"ttft_s": args.ttft_s, "itl_s": args.itl_s, "tokens": tokens,
                       "rows": results["kernel"][-1], "rounds": results,
                       "by_workers": by_workers}
    if args.code:
        print("\n== accuracy by source tree, in running order: |client - target| TTFT error "
              "p50/p99 and lag p99 (ms) per load ==")
        for entry in by_code:
            cells = "  ".join(f"{r['fraction']:.0%}: {_ms(r['ttft_err_p50_s'])}/"
                              f"{_ms(r['ttft_err_p99_s'])} lag {_ms(r['lag_p99_s'])}"
                              for r in entry["rows"])
            print(f"{entry['code']:<10} {entry['round']:>2} {entry['mode']:<6} {cells}")
        out["accuracy"]["by_code"] = by_code
    if args.with_vllm:
        out["accuracy"]["vs_vllm"] = accuracy_vs_vllm(args, workdir, rates, tokens,
                                                      results["kernel"][-1])


def accuracy_vs_vllm(args: argparse.Namespace, workdir: Path, rates: list[float],
                     tokens: int, swarm_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`vllm bench serve` at the same rates against the same paced target: its TTFT
    distribution beside the target's own (vLLM's client sends random prompts, so requests are
    not joined one by one; the target answers every request in the same time, so the
    distributions are directly comparable)."""
    rows = []
    for index, (fraction, rate) in enumerate(zip(ACCURACY_FRACTIONS, rates, strict=True)):
        truth_dir = workdir / f"truth-vllm-{index}"
        truth_dir.mkdir()
        with running_lean_target(None, ttft_s=args.ttft_s, itl_s=args.itl_s,
                                 processes=args.target_processes,
                                 truth_dir=str(truth_dir)) as url:
            (step,) = vllm_steps(url, [rate], args.step_s, model="swarmload-bench",
                                 tokenizer=_tokenizer(), input_len=args.prompt_words,
                                 output_len=tokens, keep_ttfts=True)
        truth = [(writes[0] - arrival) * 1e-9
                 for f in truth_dir.glob("truth-*.json")
                 for _key, arrival, writes in json.loads(f.read_text())["requests"] if writes]
        client = np.asarray([t for t in step.extra.get("ttfts") or [] if t], dtype=float)
        server = np.asarray(truth, dtype=float)
        row: dict[str, Any] = {"fraction": fraction, "offered_rps": rate, "n": int(client.size)}
        for q in (50, 99):
            c, t = percentile(client, q, None), percentile(server, q, None)
            row[f"client_ttft_p{q}_s"], row[f"server_ttft_p{q}_s"] = c, t
            row[f"ttft_p{q}_diff_s"] = c - t if c is not None and t is not None else None
        rows.append(row)
    print("\n== vllm bench serve against the same paced target: TTFT, client vs the target's "
          "own (ms) ==")
    print(f"{'load':>5} {'req/s':>7} {'n':>6} {'client p50':>11} {'server p50':>11} "
          f"{'diff p50':>9} {'client p99':>11} {'server p99':>11} {'diff p99':>9} "
          f"{'swarmload diff p50/p99':>23}")
    for row, mine in zip(rows, swarm_rows, strict=True):
        print(f"{row['fraction']:>5.0%} {row['offered_rps']:>7.0f} {row['n']:>6} "
              f"{_ms(row['client_ttft_p50_s']):>11} {_ms(row['server_ttft_p50_s']):>11} "
              f"{_ms(row['ttft_p50_diff_s']):>9} {_ms(row['client_ttft_p99_s']):>11} "
              f"{_ms(row['server_ttft_p99_s']):>11} {_ms(row['ttft_p99_diff_s']):>9} "
              f"{_ms(mine['ttft_p50_diff_s']):>11} / {_ms(mine['ttft_p99_diff_s']):<9}")
    return rows


def accuracy_rows(df: pd.DataFrame, truth: list[list[Any]], rates: list[float],
                  step_of_row: np.ndarray, tokens: int) -> list[dict[str, Any]]:
    """Per load step: |client - server| TTFT and ITL errors (p50/p99/max), p99 schedule lag and
    read delay. ``truth`` rows are the target's ``[key, arrival_ns, [write_ns, ...]]``."""
    server = {key: (arrival, writes) for key, arrival, writes in truth}
    rows = []
    for index, (fraction, rate) in enumerate(zip(ACCURACY_FRACTIONS, rates, strict=True)):
        part = df[(step_of_row[df["row"].to_numpy()] == index) & (df["outcome"] == "ok")]
        part = part.reset_index(drop=True)
        # events the worker read together: what the run itself can tell of its own error
        merged = merged_reads(*gaps_by_row(part["itl_s"]), len(part))
        ttft_err, itl_err, client_ttft, server_ttft = [], [], [], []
        bounds, merged_n, itl_err_alone = [], [], []
        for k, (key, ttft, itl) in enumerate(zip(part["key"], part["ttft_s"], part["itl_s"],
                                                 strict=True)):
            if key not in server:
                continue
            arrival, writes = server[key]
            client_ttft.append(ttft)
            server_ttft.append((writes[0] - arrival) * 1e-9)
            ttft_err.append(ttft - (writes[0] - arrival) * 1e-9)
            bounds.append(float(merged["ttft_bound_s"].iloc[k]))
            merged_n.append(int(merged["merged_gaps"].iloc[k]))
            if itl is not None and len(itl) == len(writes) - 1:
                errors = np.asarray(itl, dtype=float) - np.diff(writes) * 1e-9
                itl_err.extend(errors)
                if not merged_n[-1]:
                    itl_err_alone.extend(errors)
        t, i = np.abs(np.asarray(ttft_err)), np.abs(np.asarray(itl_err))
        bound, alone = np.asarray(bounds), np.asarray(merged_n) == 0
        off = t > 1e-3  # TTFT more than 1 ms off: did the run's own bound flag it?
        flagged = off & (bound > 0)
        lag = part["schedule_lag_s"].dropna().to_numpy(dtype=float)
        # how late the worker read what had landed: kept out of the times above
        read_delay = part["read_delay_s"].dropna().to_numpy(dtype=float)
        rows.append({"fraction": fraction, "offered_rps": rate, "offered_tok_s": rate * tokens,
                     "n": int(t.size), "ttft_err_p50_s": percentile(t, 50, None),
                     "ttft_err_p99_s": percentile(t, 99, None),
                     "ttft_err_max_s": float(t.max()) if t.size else None,
                     "itl_err_p50_s": percentile(i, 50, None),
                     "itl_err_p99_s": percentile(i, 99, None),
                     "itl_err_max_s": float(i.max()) if i.size else None,
                     "lag_p99_s": percentile(lag, 99, None),
                     "read_delay_p99_s": percentile(read_delay, 99, None),
                     "merged_requests": int((~alone).sum()),
                     "ttft_err_alone_p99_s": percentile(t[alone], 99, None),
                     "itl_err_alone_max_s": float(np.abs(itl_err_alone).max())
                     if itl_err_alone else None,
                     "ttft_off_1ms": int(off.sum()), "ttft_off_flagged": int(flagged.sum()),
                     "bound_minus_err_p50_s": percentile(bound[flagged] - t[flagged], 50, None),
                     "bound_p99_s": percentile(bound, 99, None)})
        # the distributions as well, comparable with a client whose requests cannot be joined
        for q in (50, 99):
            c, v = percentile(client_ttft, q, None), percentile(server_ttft, q, None)
            rows[-1][f"ttft_p{q}_diff_s"] = c - v if c is not None and v is not None else None
    return rows


def format_accuracy(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'load':>5} {'req/s':>7} {'tok/s':>8} {'n':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
             f"{'TTFT max':>9} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} {'lag p99':>8} "
             f"{'read p99':>8}"]
    for row in rows:
        lines.append(
            f"{row['fraction']:>5.0%} {row['offered_rps']:>7.0f} {row['offered_tok_s']:>8.0f} "
            f"{row['n']:>6} {_ms(row['ttft_err_p50_s']):>9} {_ms(row['ttft_err_p99_s']):>9} "
            f"{_ms(row['ttft_err_max_s']):>9} {_ms(row['itl_err_p50_s']):>8} "
            f"{_ms(row['itl_err_p99_s']):>8} {_ms(row['itl_err_max_s']):>8} "
            f"{_ms(row['lag_p99_s']):>8} {_ms(row['read_delay_p99_s']):>8}")
    lines += ["", "events read together (ITL gaps of 0), as the run itself sees them: requests "
              "with any; TTFT error p99 and ITL error max of the others; requests whose TTFT "
              "was > 1 ms off, and how many of those the run's bound flagged; bound - error "
              "p50 over those; bound p99 (ms)",
              f"{'load':>5} {'merged':>7} {'TTFT p99 alone':>15} {'ITL max alone':>14} "
              f"{'off >1ms':>9} {'flagged':>8} {'bound-err':>10} {'bound p99':>10}"]
    for row in rows:
        lines.append(
            f"{row['fraction']:>5.0%} {row['merged_requests']:>7} "
            f"{_ms(row['ttft_err_alone_p99_s']):>15} {_ms(row['itl_err_alone_max_s']):>14} "
            f"{row['ttft_off_1ms']:>9} {row['ttft_off_flagged']:>8} "
            f"{_ms(row['bound_minus_err_p50_s']):>10} {_ms(row['bound_p99_s']):>10}")
    return "\n".join(lines)


def part_agreement(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """swarmload and vllm bench serve against real vLLM (vllm-cpu), same offered load."""
    from infra.targets.vllm_cpu import VllmCpuTarget

    rate = args.agreement_rate
    offsets, step_of_row = stepped_offsets([rate], args.agreement_s, 0.0, seed=2)
    workload = write_bench_workload(workdir / "workload-agreement", offsets,
                                    args.prompt_words, args.tokens)
    print("\nstarting real vLLM (vllm-cpu); 1-2 minutes ...", flush=True)
    server: dict[str, dict[str, float]] = {}
    with VllmCpuTarget() as target:
        before = _server_sums(target.base_url)
        df = run_swarmload(target.base_url, workload, float(offsets.max()) + 0.5, workers=1,
                           results=workdir, run_id="swarmload-agreement")
        middle = _server_sums(target.base_url)
        (swarm,) = step_results(df, offsets, step_of_row, [rate], args.agreement_s, 0.0)
        swarm.extra["prompt_tokens_mean"] = float(df["prompt_tokens"].mean())
        swarm.extra["ttft_mean_s"] = float(df[df["outcome"] == "ok"]["ttft_s"].mean())
        (ref,) = vllm_steps(target.base_url, [rate], args.agreement_s,
                            model=target.model_name, tokenizer=target.model_dir,
                            # the same prompt length in the target's tokens as swarmload's
                            input_len=int(round(swarm.extra["prompt_tokens_mean"])),
                            output_len=args.tokens, keep_ttfts=True)
        after = _server_sums(target.base_url)
        server = {"swarmload": _means(before, middle), "vllm": _means(middle, after)}
    print(f"\n== agreement on real vLLM (vllm-cpu), Poisson {rate:g} req/s, "
          f"{args.agreement_s:g} s, {args.tokens} output tokens ==")
    print(f"prompt tokens: swarmload {swarm.extra.get('prompt_tokens_mean') or 0:.1f}, "
          f"vllm bench serve {ref.extra['total_input_tokens'] / max(ref.ok, 1):.1f} per request")
    figures = [("TTFT p50 ms", "ttft_p50_s", 1e3), ("TTFT p95 ms", "ttft_p95_s", 1e3),
               ("TPOT p50 ms", "tpot_p50_s", 1e3), ("TPOT p95 ms", "tpot_p95_s", 1e3),
               ("output tok/s", "output_tok_s", 1.0), ("requests/s", "achieved_rps", 1.0)]
    print(f"{'figure':<14} {'swarmload':>10} {'vllm bench':>10} {'diff':>7}")
    rows = []
    for label, attr, scale in figures:
        a, b = getattr(swarm, attr), getattr(ref, attr)
        diff = (a - b) / b if a is not None and b else None
        rows.append({"figure": label, "swarmload": a, "vllm": b, "rel_diff": diff})
        flag = "  >5%" if diff is not None and abs(diff) > 0.05 else ""
        print(f"{label:<14} {a * scale:>10.2f} {b * scale:>10.2f} "
              f"{'-' if diff is None else f'{diff:+.1%}':>7}{flag}")
    print("server-side truth over each client's own window (vLLM /metrics, mean):")
    for name, step in (("swarmload", swarm), ("vllm", ref)):
        truth = server[name]
        print(f"  {name:<10} server TTFT {truth['ttft_mean_s'] * 1e3:7.2f} ms, client TTFT "
              f"{step.extra['ttft_mean_s'] * 1e3:7.2f} ms (client - server "
              f"{(step.extra['ttft_mean_s'] - truth['ttft_mean_s']) * 1e3:+.2f} ms); server "
              f"ITL {truth['itl_mean_s'] * 1e3:.2f} ms, requests {truth['requests']:.0f}")
    # Where the tails come from: the first tenth of each client's requests (in sending order)
    # against the rest, so a start-up burst is told apart from steady-state behaviour.
    ok = df[df["outcome"] == "ok"].sort_values("sent_wall_ns")
    ttft_by_client = {"swarmload": ok["ttft_s"].to_numpy(dtype=float),
                      "vllm": np.asarray([t for t in ref.extra.get("ttfts") or [] if t],
                                         dtype=float)}
    print("TTFT p95 ms, first 10% of requests vs the rest (sending order):")
    for name, values in ttft_by_client.items():
        head = max(len(values) // 10, 1)
        first, rest = percentile(values[:head], 95, None), percentile(values[head:], 95, None)
        print(f"  {name:<10} {_ms(first):>8} vs {_ms(rest):>8}")
    out["agreement"] = {"rate": rate, "duration_s": args.agreement_s, "rows": rows,
                        "swarmload": swarm.as_dict(), "vllm": ref.as_dict(), "server": server}


_SERVER_SERIES = {"ttft": "vllm:time_to_first_token_seconds",
                  "itl": "vllm:inter_token_latency_seconds"}


def _server_sums(base_url: str) -> dict[str, float]:
    """``_sum`` and ``_count`` of vLLM's TTFT and ITL histograms (all label sets added up)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        for key, series in _SERVER_SERIES.items():
            for suffix in ("_sum", "_count"):
                if line.startswith(series + suffix):
                    value = float(line.rsplit(" ", 1)[1])
                    sums[key + suffix] = sums.get(key + suffix, 0.0) + value
    return sums


def _means(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    def mean(key: str) -> float:
        count = b.get(key + "_count", 0.0) - a.get(key + "_count", 0.0)
        return (b.get(key + "_sum", 0.0) - a.get(key + "_sum", 0.0)) / count if count else math.nan

    return {"ttft_mean_s": mean("ttft"), "itl_mean_s": mean("itl"),
            "requests": b.get("ttft_count", 0.0) - a.get("ttft_count", 0.0)}


def worker_counts(text: str) -> list[int]:
    """'1,2,4,8,16' -> [1, 2, 4, 8, 16]; each a positive integer, no repeats."""
    try:
        counts = [int(w) for w in text.split(",") if w.strip()]
    except ValueError as exc:
        raise BenchError(f"--workers {text!r}: want comma-separated counts, e.g. 1,2,4,8,16"
                         ) from exc
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise BenchError(f"--workers {text!r}: want distinct positive counts, e.g. 1,2,4,8,16")
    return counts


def scaling_efficiency(table: list[dict[str, Any]], key: str = "ceiling") -> None:
    """Add ``<key>_vs_one`` to each row: its tok/s over (workers x the 1-worker row's tok/s);
    1.0 is perfect scaling (the goal: at least 0.9). None without a 1-worker row."""
    base = next((r for r in table if r["workers"] == 1 and r[key]), None)
    one = base[key]["output_tok_s"] if base is not None else 0
    for row in table:
        ok = row[key] and one > 0
        row[f"{key}_vs_one"] = (row[key]["output_tok_s"] / (row["workers"] * one) if ok
                                else None)


def part_scaling(args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    """The ceiling with 1, 2, 4, 8, 16 ... workers (rates scaled by the worker count)."""
    rates = _rates(args.rates)
    counts = worker_counts(args.workers or SCALING_WORKERS)
    table: list[dict[str, Any]] = []
    with running_lean_target(args.target, processes=args.target_processes) as url:
        for workers in counts:
            for round_no, label, tree in code_rounds(args):
                tag = f"scaling-{workers}" + (f"-{label}-{round_no}" if args.code else "")
                steps = swarmload_ceiling(url, [r * workers for r in rates], args, workdir,
                                          tag, workers=workers, code=tree,
                                          label=label if args.code else "")
                which = f" [{label}, round {round_no}]" if args.code else ""
                print(f"\n-- {workers} worker(s){which} --\n{format_steps(steps)}", flush=True)
                strict, loose = ceiling_of(steps, True), ceiling_of(steps, False)
                table.append({"workers": workers, "code": label, "round": round_no,
                              "ceiling": strict.as_dict() if strict else None,
                              "keeps_up": loose.as_dict() if loose else None,
                              "steps": [s.as_dict() for s in steps]})
    first = parse_codes(args.code)[0][0]
    scaling_efficiency([r for r in table if r["code"] == first], "ceiling")
    scaling_efficiency([r for r in table if r["code"] == first], "keeps_up")
    for row in table:
        row.setdefault("ceiling_vs_one", None)
        row.setdefault("keeps_up_vs_one", None)
    print("\n== scaling: ceiling by worker count (strict: p99 lag and TTFT < 10 ms) ==")
    print(f"{'code':<10} {'workers':>7} {'strict req/s':>12} {'strict tok/s':>12} {'x N*one':>7} "
          f"{'keeps-up req/s':>14} {'keeps-up tok/s':>14} {'x N*one':>7}")
    for row in table:
        c, k = row["ceiling"] or {}, row["keeps_up"] or {}
        print(f"{row['code']:<10} {row['workers']:>7} {c.get('achieved_rps', 0):>12.0f} "
              f"{c.get('output_tok_s', 0):>12.0f} {_ratio(row['ceiling_vs_one']):>7} "
              f"{k.get('achieved_rps', 0):>14.0f} {k.get('output_tok_s', 0):>14.0f} "
              f"{_ratio(row['keeps_up_vs_one']):>7}")
    out["scaling"] = table


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmload bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", nargs="?", default="all",
                   choices=["all", "ceiling", "accuracy", "agreement", "scaling"])
    p.add_argument("--rates", default=DEFAULT_RATES,
                   help="offered req/s of the ceiling steps (per worker for scaling)")
    p.add_argument("--step-s", type=float, default=5.0, help="seconds per load step")
    p.add_argument("--gap-s", type=float, default=1.5, help="pause between steps")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--prompt-words", type=int, default=16)
    p.add_argument("--target", default=None, help="use this base URL instead of the lean target")
    p.add_argument("--skip-vllm", action="store_true", help="no vllm bench serve steps")
    p.add_argument("--ceiling-tok-s", type=float, default=None,
                   help="accuracy alone: the ceiling to take fractions of")
    p.add_argument("--accuracy-tokens", type=int, default=32)
    p.add_argument("--paced-ceiling", action="store_true",
                   help="accuracy: first find the ceiling against the paced target (--rates) "
                        "and take the fractions of that one")
    p.add_argument("--compare-read-times", action="store_true",
                   help="accuracy: also run with the worker's read times instead of kernel "
                        "receive times, alternating, and print both")
    p.add_argument("--rounds", type=int, default=1,
                   help="accuracy: repeat the steps N times; ceiling/scaling with --code: run "
                        "the trees in turn N times (A B A B)")
    p.add_argument("--code", action="append", metavar="LABEL=DIR",
                   help="run the swarmload of this source tree (a checkout of another commit) "
                        "instead of this one; repeat to compare trees in one run, in turn, "
                        "against the same target (e.g. --code old=../wt-old --code new=.)")
    p.add_argument("--with-vllm", action="store_true",
                   help="accuracy: also run vllm bench serve at the same rates against the "
                        "same paced target and compare its TTFT with the target's own")
    p.add_argument("--ttft-s", type=float, default=0.020, help="accuracy target's TTFT")
    p.add_argument("--itl-s", type=float, default=0.005, help="accuracy target's token gap")
    p.add_argument("--agreement-rate", type=float, default=6.0, help="req/s on real vLLM")
    p.add_argument("--agreement-s", type=float, default=40.0)
    p.add_argument("--workers", default=None,
                   help=f"worker counts, e.g. 1,2,4,8,16 on a 16-core machine; scaling: the "
                        f"ceiling with each (default {SCALING_WORKERS}); accuracy: the steps "
                        f"with each, in turn (default {ACCURACY_WORKERS})")
    p.add_argument("--target-processes", type=int, default=1,
                   help="scaling/accuracy: lean target processes (SO_REUSEPORT)")
    p.add_argument("--pin-workers", action="store_true",
                   help="give each worker process a core of its own (the last ones) and keep "
                        "the target, the master and this process on the others, as a worker on "
                        "a load-generator host of its own has it; any --code tree")
    p.add_argument("--results", default="results")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.worker_cores = ()
    bench_id = time.strftime("bench-%Y%m%d-%H%M%S", time.gmtime())
    workdir = Path(args.results).resolve() / bench_id
    workdir.mkdir(parents=True)
    out: dict[str, Any] = {"bench_id": bench_id, "args": vars(args)}
    try:
        if args.pin_workers:
            most = max(worker_counts(args.workers or (
                SCALING_WORKERS if args.part == "scaling" else ACCURACY_WORKERS)))
            try:
                plan = core_plan(most)
            except CorePlanError as exc:
                raise BenchError(f"--pin-workers: {exc}") from exc
            os.sched_setaffinity(0, plan.rest)  # the target and the runs start from here
            args.worker_cores = plan.workers
            print(f"worker processes on cores {list(plan.workers)}, the rest on "
                  f"{list(plan.rest)}", flush=True)
        ceiling = args.ceiling_tok_s
        if args.part in ("all", "ceiling"):
            ceiling = part_ceiling(args, workdir, out) or ceiling
        if args.part in ("all", "accuracy"):
            if args.paced_ceiling:
                ceiling = paced_ceiling(args, workdir, out) or ceiling
            if not ceiling:
                raise BenchError("accuracy needs a ceiling: run `all`, or pass --ceiling-tok-s")
            part_accuracy(args, workdir, out, ceiling)
        if args.part in ("all", "agreement"):
            part_agreement(args, workdir, out)
        if args.part == "scaling":
            part_scaling(args, workdir, out)
    except BenchError as exc:
        print(f"swarmload bench: {exc}")
        return 2
    finally:
        (workdir / "bench.json").write_text(json.dumps(out, indent=1, default=str))
        print(f"\nfigures: {workdir / 'bench.json'}")
    return 0
