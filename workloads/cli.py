"""``swarmload workload build``: a workload from request logs, sessions or agent tasks.

Example::

    swarmload workload build --source azure:AzureLLMInferenceTrace_conv.csv --n 5000 \\
        --mix 45/40/15 --thresholds 64,512 --seed 0 --tokenizer .cache/tiny-model --out wl/

writes ``wl/workload.parquet`` (``workloads.schema``), ``wl/report.json`` and, with
``--arrivals``, ``wl/arrivals.yaml``; prints the report. Exit status 2 on bad input.
``--tasks SOURCE`` instead of ``--source`` builds agent tasks (``workloads.tasks``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workloads.arrivals import parse_plan_spec, save_plan
from workloads.buckets import (
    BUCKETS,
    DEFAULT_MIX,
    DEFAULT_THRESHOLDS,
    BucketSpec,
    BucketSpecError,
    parse_shares,
    parse_thresholds,
)
from workloads.build import BuildConfig, build_workload
from workloads.errors import WorkloadError
from workloads.readers import parse_source
from workloads.schema import PLAN_FILE, REPORT_FILE, write_workload
from workloads.sessions import SYNTHETIC_KIND, build_sessions, format_session_report
from workloads.synth import ENDPOINTS, make_counter
from workloads.tasks import TASK_KINDS, build_tasks, format_task_report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmload workload build",
                                description="Build a workload from request logs, sessions or "
                                            "agent tasks.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--source",
                      help="KIND:PATH, KIND one of azure, mooncake, burstgpt, sharegpt, generic; "
                           "or synthetic:KEY=VALUE,... (a session workload, "
                           "docs/guides/sessions.md)")
    what.add_argument("--tasks", default=None, metavar="SOURCE",
                      help=f"agent tasks (calls in a graph): KIND:..., KIND one of "
                           f"{', '.join(TASK_KINDS)}: synthetic:KEY=VALUE,... (fanout=3..5,"
                           "depth=1,...), otel:PATH (OpenTelemetry GenAI spans, OTLP JSON), "
                           "json:PATH (the tasks format); docs/guides/agents.md")
    p.add_argument("--sessions", action="store_true",
                   help="build multi-turn sessions from the log (sharegpt, mooncake, generic "
                        "with session_id= and turn=): one row per turn")
    p.add_argument("--map", dest="mapping", default=None,
                   help="generic logs: key=column,... (timestamp, timestamp_unit, prompt, "
                        "messages, prompt_tokens, output_tokens, session_id, prefix_ids, "
                        "format) or a YAML/JSON file holding them")
    p.add_argument("--n", type=int, default=None,
                   help="requests in the workload (5000); with sessions or tasks: the first N "
                        "sessions or tasks (all)")
    p.add_argument("--mix", default=DEFAULT_MIX,
                   help=f"short/medium/long shares ({DEFAULT_MIX}), or 'native' for the log's own")
    p.add_argument("--thresholds", default=DEFAULT_THRESHOLDS,
                   help=f"short below A, long above B prompt tokens ({DEFAULT_THRESHOLDS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder (tokenizer.json) of the target, or 'words'")
    p.add_argument("--tokenize-url", default=None,
                   help="the target's base URL; its /tokenize endpoint counts tokens")
    p.add_argument("--model", default=None, help="model name for --tokenize-url")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions")
    p.add_argument("--strict", action="store_true", help="any bad log row is fatal")
    p.add_argument("--sort-timestamps", action="store_true",
                   help="sort a log whose timestamps go backwards instead of failing")
    p.add_argument("--no-prefix-sharing", action="store_true",
                   help="ignore logged prefix block ids when synthesizing")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="leave out log rows whose prompt + output tokens exceed this (counted)")
    p.add_argument("--arrivals", default=None,
                   help="write an arrival plan beside the workload: KIND:key=value,... "
                        "e.g. trace:fit_window_s=120 or bursts:base_rps=2,multiplier=10,"
                        "spike_s=10,period_s=60")
    p.add_argument("--quiet", action="store_true", help="do not print the report")
    return p


def _fmt_stats(stats: dict[str, float]) -> str:
    if not stats:
        return "-"
    return " ".join(f"{k}={stats[k]:g}" for k in ("min", "p50", "p90", "p99", "max"))


def format_report(report: dict[str, Any]) -> str:
    src = report["source"]
    lines = [
        f"source   {src['kind']}:{src['path']}",
        f"rows     read {src['rows_read']}, valid {src['rows_valid']}, "
        f"bad {src['bad_rows']['count']}",
    ]
    if src.get("max_model_len") is not None:
        lines.append(f"  left out {src['rows_over_max_model_len']} rows over max_model_len "
                     f"{src['max_model_len']}")
    if src.get("rows_below_template"):
        lines.append(f"  left out {src['rows_below_template']} count-only rows shorter than the "
                     "endpoint's own template tokens (cannot be matched exactly)")
    for reason, info in src["bad_rows"]["by_reason"].items():
        lines.append(f"  bad: {reason}: {info['count']} (lines {info['lines'][:8]})")
    scrub = report["scrub"]
    lines.append(f"scrub    {scrub['texts_changed']} of {scrub['texts_seen']} texts changed "
                 f"{scrub['replaced'] or ''}")
    lines.append(f"workload n={report['n']} seed={report['seed']} "
                 f"thresholds={report['buckets']['short_max']},{report['buckets']['long_min']}")
    lines.append(f"{'bucket':<7} {'target':>7} {'native':>7} {'got':>7} {'count':>6} "
                 f"{'distinct':>8} {'log rows':>8}  (distinct: log rows behind the bucket)")
    for b in BUCKETS:
        r = report["per_bucket"][b]
        target = "-" if r["target_share"] is None else f"{r['target_share']:.1%}"
        lines.append(
            f"{b:<7} {target:>7} {r['native_share']:>7.1%} {r['share']:>7.1%} {r['count']:>6} "
            f"{r['distinct_log_rows']:>8} {r['log_rows']:>8}")
        lines.append(f"{'':<9}prompt tokens {_fmt_stats(r['prompt_tokens']['workload'])}")
        lines.append(f"{'':<9}output tokens {_fmt_stats(r['output_tokens']['workload'])}")
    for name, arr in report["arrivals"].items():
        if arr:
            lines.append(f"arrivals ({name}) {arr['requests']} over {arr['span_s']:.1f} s: "
                         f"{arr['rate_rps']:.3f} req/s, inter-arrival CV {arr['interarrival_cv']}")
        else:
            lines.append(f"arrivals ({name}) none (no timestamps)")
    syn = report["synthesis"]
    lines.append(f"prompts  endpoint={syn['endpoint']} tokenizer={syn['counter']} "
                 f"from_log={syn['from_log']} synthesized={syn['synthesized']} "
                 f"exact={syn['exact']} inexact={syn['inexact']} "
                 f"without_nonce={syn['without_nonce']} not_built={syn['not_built']} "
                 f"overhead_tokens={syn['overhead_tokens']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.tasks is not None or args.sessions or args.source.startswith(f"{SYNTHETIC_KIND}:"):
        return _main_rows(args)
    try:
        kind, path = parse_source(args.source)
        shares = None if args.mix.strip() == "native" else parse_shares(args.mix)
        try:
            short_max, long_min = parse_thresholds(args.thresholds)
        except BucketSpecError as exc:
            print(f"--thresholds: {exc}", file=sys.stderr)
            return 2
        plan = parse_plan_spec(args.arrivals) if args.arrivals else None
        config = BuildConfig(
            source_kind=kind, source_path=path, n=5000 if args.n is None else args.n,
            shares=shares, short_max=short_max,
            long_min=long_min, seed=args.seed, endpoint=args.endpoint, mapping=args.mapping,
            strict=args.strict, sort_timestamps=args.sort_timestamps,
            prefix_sharing=not args.no_prefix_sharing, max_model_len=args.max_model_len,
        )
        config.bucket_spec()  # validate thresholds and shares before reading anything
        counter = make_counter(args.tokenizer, args.tokenize_url, args.model)
        built = build_workload(config, counter)
        out = Path(args.out)
        write_workload(built.frame, out, built.metadata)
        (out / REPORT_FILE).write_text(json.dumps(built.report, indent=2) + "\n")
        if plan is not None:
            save_plan(plan, out / PLAN_FILE)
    except WorkloadError as exc:
        print(f"swarmload workload build: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(format_report(built.report))
        print(f"wrote {out / 'workload.parquet'}, {out / REPORT_FILE}"
              + (f", {out / PLAN_FILE}" if plan is not None else ""))
    return 0


def _main_rows(args: argparse.Namespace) -> int:
    """``--sessions`` / ``--source synthetic:...`` (one row per turn) or ``--tasks SOURCE``
    (one row per call)."""
    tasks = args.tasks is not None
    try:
        if args.endpoint != "completions" and args.endpoint != "chat":
            raise WorkloadError(f"--endpoint {args.endpoint}: {'tasks' if tasks else 'sessions'}"
                                " use chat")
        short_max, long_min = parse_thresholds(args.thresholds)
        plan = parse_plan_spec(args.arrivals) if args.arrivals else None
        counter = make_counter(args.tokenizer, args.tokenize_url, args.model)
        buckets = BucketSpec(short_max=short_max, long_min=long_min)
        if tasks and args.sessions:
            raise WorkloadError("--sessions goes with --source; --tasks builds tasks")
        built = build_tasks(args.tasks, counter, n=args.n, seed=args.seed, buckets=buckets) \
            if tasks else build_sessions(
                args.source, counter, n=args.n, seed=args.seed, mapping=args.mapping,
                strict=args.strict, sort_timestamps=args.sort_timestamps, buckets=buckets)
        out = Path(args.out)
        write_workload(built.frame, out, built.metadata)
        (out / REPORT_FILE).write_text(json.dumps(built.report, indent=2) + "\n")
        if plan is not None:
            save_plan(plan, out / PLAN_FILE)
    except (WorkloadError, BucketSpecError) as exc:
        print(f"swarmload workload build: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        src = built.report["source"]
        if "bad_rows" in src:
            print(f"source   {src['kind']}:{src['path']} rows read {src['rows_read']}, valid "
                  f"{src['rows_valid']}, bad {src['bad_rows']['count']}")
            for reason, info in src["bad_rows"]["by_reason"].items():
                print(f"  bad: {reason}: {info['count']} (lines {info['lines'][:8]})")
        if "traces" in src:
            print(f"source   otel:{src['path']} spans {src['spans']}, traces {src['traces']} "
                  f"({src['traces_without_calls']} without a model call, left out), tool spans "
                  f"{src['tool_spans']} ({src['tool_s']:g} s)")
            if src["late_roots"]:
                print(f"  {src['late_roots']} calls that depend on nothing started after their "
                      f"task's first ({src['late_roots_s']:g} s in all): sent as late")
        print(format_task_report(built.report["tasks"]) if tasks
              else format_session_report(built.report["sessions"]))
        print(f"wrote {out / 'workload.parquet'}, {out / REPORT_FILE}"
              + (f", {out / PLAN_FILE}" if plan is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
