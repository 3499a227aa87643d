"""``swarmload summary RUN_DIR``: the run's summary, bursts, replicas and TTFT parts as text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collectors.run_folder import MANIFEST_NAME, load_manifest, load_requests, load_server_metrics
from collectors.schemas import REQUESTS_TABLE
from dashboards.analysis import replicas
from dashboards.analysis.burst import burst_report, format_bursts
from dashboards.analysis.faults import fault_report, format_faults
from dashboards.analysis.generator_cpu import run_remedy
from dashboards.analysis.runs import format_summary, summarize_run, validity_text
from dashboards.analysis.server_traces import format_ttft_parts, run_ttft_parts
from dashboards.analysis.sessions import format_sessions
from dashboards.analysis.tasks import format_tasks


def main(argv: list[str] | None = None) -> int:
    """``swarmload summary RUN_DIR``: print the run's summary table; writes nothing."""
    parser = argparse.ArgumentParser(
        prog="swarmload summary", description="Print the latency/error/throughput summary of a run."
    )
    parser.add_argument("run_dir", type=Path, help="run folder, e.g. results/<run_id>")
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"swarmload summary: {run_dir} is not a folder", file=sys.stderr)
        return 2
    if not (run_dir / MANIFEST_NAME).is_file() and not (run_dir / REQUESTS_TABLE).is_dir():
        print(
            f"swarmload summary: {run_dir} has neither {MANIFEST_NAME} nor {REQUESTS_TABLE}/;"
            " pass a run folder such as results/<run_id>",
            file=sys.stderr,
        )
        return 2
    manifest = load_manifest(run_dir)
    print(f"run {manifest.get('run_id') or run_dir.name}")
    if manifest.get("validity"):  # were the figures the server's (recorded at the run's end)
        print(f"validity: {validity_text(manifest['validity'])}")
    print(format_summary(summarize_run(run_dir), run_remedy(run_dir)))
    print_details(run_dir, manifest)
    return 0


NO_SPANS = ("where TTFT goes: no server span arrived (was the server started with "
            "--otlp-traces-endpoint and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf?)")


def print_details(run_dir: str | Path, manifest: dict[str, Any] | None = None, *,
                  expect_spans: bool = False) -> None:
    """What follows the summary table, each part when the run has it: one line per spike, the
    sessions' and tasks' figures, one line per fault, the per-replica table, and where TTFT
    goes (runs with --server-traces; ``expect_spans`` says so when none arrived)."""
    bursts = format_bursts(burst_report(run_dir))
    if bursts:
        print(bursts)
    requests = load_requests(run_dir)
    for part in (format_sessions(requests), format_tasks(requests)):  # session / task runs
        if part:
            print(part)
    faults = format_faults(fault_report(run_dir))  # one line per fault of a fault plan
    if faults:
        print(faults)
    print_replicas(run_dir, manifest)
    parts = run_ttft_parts(run_dir)
    if parts is not None or expect_spans:
        print()
        print(format_ttft_parts(parts) if parts is not None else NO_SPANS)


def print_replicas(run_dir: str | Path, manifest: dict[str, Any] | None = None) -> None:
    """The per-replica table (dashboards.analysis.replicas), when the run had replicas."""
    requests = load_requests(run_dir, ["outcome", "replica", "ttft_s", "e2e_s", "output_tokens"])
    table = replicas.per_replica(requests, load_server_metrics(run_dir),
                                 manifest if manifest is not None else load_manifest(run_dir))
    if not table.empty:
        print()
        print(replicas.format_replicas(table))
