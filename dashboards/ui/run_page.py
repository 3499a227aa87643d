"""The run page of the dashboard: one run of the results folder at a time.

Served through :mod:`dashboards.app` (``swarmload dashboard``), which picks the results folder.
The page only lays things out: every figure comes from :mod:`dashboards.analysis.runs`; loaders are
keyed on the run's part files and manifest (``run_fingerprint``), with no time-to-live, so a run
that is still being written refreshes as its files land and a finished one is read once per server
(with a time-to-live of seconds, every view after it expired read a long run again: 4-15 s).
Only the list of runs (new runs appear) and the manifest (a crashed run shows so) expire.
Runs are the results folder's own run folders and the step runs of its studies (listed as
``<study>/<config>/step-<k>``).

The first view is kept light for the browser, as the Study page's is: the tables are Markdown,
the charts are drawn on the server (:mod:`dashboards.run_charts`, through the Study page's
``show_chart``) and shown as Markdown images: the TTFT scatter (up to 20,000 points) as a palette
PNG, the lines as SVG of their envelope per pixel column. "Interactive charts" in the sidebar
draws the same specs with Vega in the browser; manifest.json is shown on request. Charts sit in
containers keyed ``chart-run-<column>`` (``chart-run-ttft`` for the scatter), tables in
``table-run-latency``, ``table-run-errors``, ``table-run-throughput``. A run with agent tasks
has a Tasks section (container ``tasks``: ``chart-tasks-times``, ``chart-tasks-timeline``,
``table-tasks-calls``, ``table-tasks-cache``; figures from :mod:`dashboards.analysis.tasks`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import streamlit as st

from collectors import run_folder
from dashboards import burst_charts, run_charts
from dashboards.analysis import (
    faults,
    replicas,
    server_traces,
    sessions,
    study_data,
    tasks,
    telemetry,
)
from dashboards.analysis import runs as analysis
from dashboards.app import results_dir_from
from dashboards.ui.widgets import as_written, markdown_table, show_chart

CACHE_TTL_S = 5.0
AUTO_REFRESH_S = 5.0
# the latency tiles: each latency's headline percentiles (collectors/request_columns.py)
HEADLINE_METRICS = analysis.HEADLINE_METRICS


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def cached_runs(results_dir: str) -> pd.DataFrame:
    runs = run_folder.list_runs(results_dir)
    step_runs = study_data.list_step_runs(results_dir)
    return pd.concat([runs, step_runs], ignore_index=True) if len(step_runs) else runs


# a time-to-live: a run whose orchestrator died shows as crashed without any file changing
@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def cached_manifest(run_dir: str, fingerprint: tuple[int, int]) -> dict[str, Any]:
    return run_folder.load_manifest(run_dir)


@st.cache_data(show_spinner=False, max_entries=32)
def cached_summary(
    run_dir: str, fingerprint: tuple[int, int], warmup_s: float, cooldown_s: float
) -> pd.DataFrame:
    requests = run_folder.load_requests(run_dir, analysis.RUN_PAGE_COLUMNS)
    window = analysis.trimmed_window(requests, warmup_s, cooldown_s)
    return analysis.summarize_requests(requests, window)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_ttft_points(run_dir: str, fingerprint: tuple[int, int], origin_ns: int) -> pd.DataFrame:
    columns = ["outcome", "bucket", "sent_wall_ns", "ttft_s"]
    return analysis.latency_over_time(run_folder.load_requests(run_dir, columns), origin_ns)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_ttft_chart(run_dir: str, fingerprint: tuple[int, int], origin_ns: int) -> str | None:
    """The TTFT scatter's spec as JSON with sorted keys (the image's cache key), once per run
    and server: building and serialising its 20,000 points took most of the script's time
    on each view. None without completed requests."""
    points = cached_ttft_points(run_dir, fingerprint, origin_ns)
    return None if points.empty else json.dumps(run_charts.ttft_scatter(points), sort_keys=True)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_gpu(run_dir: str, fingerprint: tuple[int, int], origin_ns: int) -> pd.DataFrame:
    return analysis.gpu_timeseries(run_folder.load_gpu(run_dir), origin_ns)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_replicas(run_dir: str, fingerprint: tuple[int, int]) -> pd.DataFrame:
    requests = run_folder.load_requests(
        run_dir, ["outcome", "replica", "ttft_s", "e2e_s", "output_tokens"])
    return replicas.per_replica(requests, run_folder.load_server_metrics(run_dir),
                                run_folder.load_manifest(run_dir))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_ttft_parts(run_dir: str, fingerprint: tuple[int, int]) -> pd.DataFrame | None:
    return server_traces.run_ttft_parts(run_dir)


@st.cache_data(show_spinner=False, max_entries=8)
def cached_absent(run_dir: str, fingerprint: tuple[int, int]) -> dict[str, str]:
    return telemetry.absent_columns(telemetry.server_engine(run_dir))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_windows(run_dir: str, fingerprint: tuple[int, int], origin_ns: int) -> pd.DataFrame:
    return telemetry.windows_since(run_dir, origin_ns, freq="5s")


def pick_run(runs: pd.DataFrame) -> pd.Series:
    """Sidebar list of runs; the choice is kept in the URL (``?run=<run_id>``) for links."""
    run_ids = list(runs["run_id"])
    chosen = st.session_state.get("run_id")
    if chosen not in run_ids:
        # first visit (or the chosen run folder vanished): the URL's run, else the newest
        wanted = st.query_params.get("run")
        st.session_state["run_id"] = wanted if wanted in run_ids else run_ids[0]
    by_id = runs.set_index("run_id")

    def label(run_id: str) -> str:
        row = by_id.loc[run_id]
        status = " (running)" if pd.isna(row["ended_at"]) else ""
        return f"{run_id} · {row['target_kind'] or '?'} · {row['requests']} req{status}"

    # keyed, not indexed: a changing index would make a new widget and undo the user's choice
    run_id = st.sidebar.selectbox("Run", run_ids, key="run_id", format_func=label)
    st.query_params["run"] = run_id
    return runs[runs["run_id"] == run_id].iloc[0]


def show_manifest(manifest: dict[str, Any]) -> None:
    facts = list(analysis.manifest_facts(manifest).items())
    # one Markdown element, four facts a line (not one element each in four columns: every
    # element is work for the browser on the first view); manifest text (URLs, "-", mixes) is
    # shown as written, never as markdown
    cells = [f"**{label}** {as_written(value)}" for label, value in facts]
    with st.container(key="run-manifest-facts"):
        st.markdown("  \n".join(" · ".join(cells[i:i + 4]) for i in range(0, len(cells), 4)))
    # on request: the JSON viewer's code is about 150 kB for the browser to fetch and run
    if st.toggle("Show manifest.json", key="run_manifest_json"):
        st.json(manifest, expanded=False)


def show_headline(summary: pd.DataFrame) -> None:
    overall = summary.loc[analysis.ALL_ROW]
    counts = st.columns(4)
    counts[0].metric("Requests", f"{int(overall['requests'])}")
    counts[1].metric("Error rate", analysis.format_percent(overall["error_rate"]))
    counts[2].metric("Throughput (req/s)", analysis.format_number(overall["req_per_s"]))
    counts[3].metric("Output tok/s", analysis.format_number(overall["output_tok_per_s"], 1))
    latencies = st.columns(len(HEADLINE_METRICS))
    for column, (label, key) in zip(latencies, HEADLINE_METRICS, strict=True):
        column.metric(label, analysis.format_ms(overall[key]))


def show_tables(summary: pd.DataFrame) -> None:
    # Markdown tables: a data grid's code is the heaviest thing a first view would load
    st.subheader("Latency per bucket (ms, ok requests)")
    with st.container(key="table-run-latency"):
        st.markdown(markdown_table(analysis.latency_table_ms(summary).round(2)))
    st.subheader("Errors per class (% of requests)")
    if int(summary.loc[analysis.ALL_ROW, "errors"]) == 0:
        st.markdown("No failed requests.")
    else:
        with st.container(key="table-run-errors"):
            st.markdown(markdown_table(analysis.error_table(summary).round(2)))
    st.subheader("Throughput")
    window_s = float(summary.loc[analysis.ALL_ROW, "window_s"])
    st.caption(f"over a measured window of {window_s:.2f} s; req/s counts ok requests")
    with st.container(key="table-run-throughput"):
        st.markdown(markdown_table(analysis.throughput_table(summary).round(2)))


def show_replicas(run_dir: str, fingerprint: tuple[int, int]) -> None:
    """Per replica, when the run had several (HAProxy or client-side balancing)."""
    table = cached_replicas(run_dir, fingerprint)
    if table.empty:
        return
    st.subheader("Per replica")
    st.caption("requests by the replica that answered (HAProxy's X-Served-By, or the URL a "
               "worker chose); server ok: that replica's own vllm:request_success_total "
               "increase; LB 2xx: HAProxy's count. ms for latencies.")
    shown = table.copy()
    for column in [c for c in shown.columns if c.endswith("_s")]:
        shown[column.removesuffix("_s") + "_ms"] = shown.pop(column) * 1e3
    st.dataframe(shown.round(2))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_faults(run_dir: str, fingerprint: tuple[int, int]) -> faults.FaultReport | None:
    return faults.fault_report(run_dir)


FAULT_TABLE = {  # column -> heading of the Faults table
    "fault": "fault", "action": "action", "replica": "replica", "undo": "undone by",
    "start_s": "at (s)", "out_s": "out (s)", "requests": "requests", "failed": "failed",
    "failed_by_class": "failed by class", "lb_failed": "HAProxy saw failed",
    "lb_retried": "HAProxy retried", "lb_removed_after_s": "LB removed after (s)",
    "lb_returned_after_s": "LB back after undo (s)", "lb_check_interval_s": "check every (s)",
    "client_first_error_s": "first error to it (s)", "peak_ttft_p95_s": "peak P95 TTFT (s)",
    "baseline_ttft_p95_s": "baseline P95 TTFT (s)", "recovery_s": "recovery (s)",
    "after_end_s": "after undo (s)", "queue_recovery_s": "queue back (s)",
}


def show_faults(run_dir: str, fingerprint: tuple[int, int]) -> None:
    """Runs with a fault plan: each fault's timeline and the table per fault."""
    report = cached_faults(run_dir, fingerprint)
    if report is None or report.faults.empty:
        return
    st.subheader("Faults")
    st.caption("each fault of the run's fault plan: the requests of its span (from the oldest "
               "still in flight when it struck until recovery), what HAProxy saw and when it "
               "took the replica out and back (s after the action, and after its undo), and "
               "the recovery time: until P95 TTFT, the error rate and the server's queue were "
               "back within the band of the minutes before (1 s windows; METRICS.md).")
    for line in faults.fault_lines(report.faults):
        st.markdown(f"- {line}")
    table = report.faults[[c for c in FAULT_TABLE if c in report.faults]].rename(
        columns=FAULT_TABLE)
    st.dataframe(table.round(3), hide_index=True)
    for row in report.faults.to_dict("records"):
        number = int(row["fault"])
        spike = faults.spike_like(pd.Series(row))
        view = report.timelines[number].assign(config=spike["config"].iloc[0])
        st.markdown(f"**fault {number}: {row['action']} {row['replica']}** (shaded while "
                    "out; dashed: recovered)")
        charts = st.columns(3)
        for column, spec in zip(charts, (burst_charts.ttft_timeline(view, spike),
                                         burst_charts.error_timeline(view, spike),
                                         burst_charts.queue_timeline(view, spike)),
                                strict=True):
            with column:
                st.vega_lite_chart(spec, use_container_width=True)


def show_ttft_parts(run_dir: str, fingerprint: tuple[int, int]) -> None:
    """Runs with --server-traces: each request's TTFT split at vLLM's own span (METRICS.md)."""
    summary = cached_ttft_parts(run_dir, fingerprint)
    if summary is None:
        return
    st.subheader("Where TTFT goes (ms, ok requests with a server span)")
    explained = int(summary.loc["all", "explained"])
    ok = int(summary.loc["all", "ok"])
    st.caption(f"{explained} of {ok} ok requests joined to vLLM's span by X-Request-Id. The "
               "five parts add up to each request's client TTFT; before vLLM and delivery "
               "compare the client's and the server's wall clocks.")
    if explained:
        st.dataframe(server_traces.ttft_parts_table_ms(summary).round(2))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_sessions(run_dir: str, fingerprint: tuple[int, int]) -> dict[str, pd.DataFrame]:
    requests = sessions.plain_sessions(
        run_folder.load_requests(run_dir, [*sessions.SESSION_COLUMNS, "depends_on"]))
    if requests.empty:
        return {}
    return {"turns": sessions.per_turn(requests), "sessions": sessions.per_session(requests),
            "loops": sessions.tool_loops(requests), "points": sessions.turn_points(requests)}


@st.cache_data(show_spinner=False, max_entries=8)
def cached_history_chart(run_dir: str, fingerprint: tuple[int, int]) -> str:
    """The sessions' TTFT-against-history scatter as JSON, once per run and server (as
    :func:`cached_ttft_chart`)."""
    points = cached_sessions(run_dir, fingerprint)["points"]
    return json.dumps(run_charts.history_scatter(points), sort_keys=True)


def show_sessions(run_dir: str, fingerprint: tuple[int, int], interactive: bool) -> None:
    """Runs with sessions: per turn index, against history length, and per session."""
    figures = cached_sessions(run_dir, fingerprint)
    if not figures:
        return
    with st.container(key="sessions"):
        _sessions_section(figures, cached_history_chart(run_dir, fingerprint), interactive)


def _sessions_section(figures: dict[str, pd.DataFrame], history_chart: str,
                      interactive: bool) -> None:
    turns, per_session = figures["turns"], figures["sessions"]
    st.subheader("Sessions")
    done = per_session["ended"].eq("ok")
    cols = st.columns(4)
    cols[0].metric("Sessions", f"{len(per_session)}")
    cols[1].metric("Complete", f"{int(done.sum())}")
    cols[2].metric("Session goodput", analysis.format_percent(per_session["goodput"].mean()))
    cols[3].metric("Duration P50 (s)", f"{per_session['duration_s'].median():.2f}")
    st.caption("one point per ok turn (a tool loop's call request; its final answer is in the "
               "tool-loop line); goodput: every turn ok and within TTFT <= "
               f"{sessions.DEFAULT_SESSION_SLO['ttft_ms']:g} ms, TPOT <= "
               f"{sessions.DEFAULT_SESSION_SLO['tpot_ms']:g} ms. Hit rate: the server's "
               "cached_tokens over prompt tokens; perfect: what a perfect prefix cache would "
               "reuse (the session's history, or its group's shared prefix at turn 0).")
    by_turn = turns.assign(**{"TTFT P50 (ms)": turns["ttft_p50_s"] * 1e3,
                              "TTFT P95 (ms)": turns["ttft_p95_s"] * 1e3,
                              "hit rate (%)": turns["hit_rate"] * 100,
                              "perfect cache (%)": turns["perfect_share"] * 100})
    charts = st.columns(2)
    with charts[0], st.container(key="chart-sessions-ttft-turn"):
        show_chart(run_charts.turn_lines(by_turn, ["TTFT P50 (ms)", "TTFT P95 (ms)"],
                                         title="TTFT by turn", y_title="TTFT (ms)"),
                   interactive)
    with charts[1], st.container(key="chart-sessions-ttft-history"):
        show_chart(history_chart, interactive, raster=True)
    charts = st.columns(2)
    with charts[0], st.container(key="chart-sessions-hit-rate"):
        if turns["hit_rate"].notna().any():
            show_chart(run_charts.turn_lines(by_turn, ["hit rate (%)", "perfect cache (%)"],
                                             title="Prefix-cache hit rate by turn",
                                             y_title="% of prompt tokens"), interactive)
        else:
            st.markdown("**Prefix-cache hit rate by turn:** the server reported no cached "
                        "tokens (vLLM: --enable-prompt-tokens-details)")
    with charts[1], st.container(key="chart-sessions-durations"):
        show_chart(run_charts.duration_bars(sessions.duration_histogram(per_session)),
                   interactive)
    table = turns.copy()
    for column in [c for c in table.columns if c.endswith("_s")]:
        table[column.removesuffix("_s") + "_ms"] = table.pop(column) * 1e3
    with st.container(key="table-sessions-turns"):
        st.markdown(markdown_table(table.round(3).set_index("turn")))
    loops = figures["loops"]
    if not loops.empty:
        st.caption(sessions.tool_loop_line(loops))


@st.cache_data(show_spinner=False, max_entries=8)
def cached_tasks(run_dir: str, fingerprint: tuple[int, int]) -> dict[str, pd.DataFrame]:
    calls = tasks.per_call(run_folder.load_requests(run_dir, tasks.TASK_COLUMNS))
    if calls.empty:
        return {}
    per_task = tasks.per_task(calls=calls)
    return {"calls": calls, "tasks": per_task, "by_call": tasks.call_table(calls),
            "cache": tasks.cache_table(calls), "histogram": tasks.task_histogram(per_task)}


def show_tasks(run_dir: str, fingerprint: tuple[int, int], interactive: bool) -> None:
    """Runs with agent tasks (sessions whose calls form a graph): task time, one task's graph
    on a timeline with its critical path, the calls by depth and agent, the prefix cache."""
    figures = cached_tasks(run_dir, fingerprint)
    if figures:
        with st.container(key="tasks"):
            _tasks_section(figures, interactive)


def _tasks_section(figures: dict[str, pd.DataFrame], interactive: bool) -> None:
    per_task = figures["tasks"]
    head = tasks.headline(per_task)
    st.subheader("Tasks")
    cols = st.columns(5)
    cols[0].metric("Tasks", f"{len(per_task)}")
    cols[1].metric("Tasks ok", f"{int(head['tasks_ok'])}")
    for col, q in zip(cols[2:], ("p50", "p95", "p99"), strict=True):
        col.metric(f"Task {q.upper()} (s)", analysis.format_number(head[f"task_{q}_s"], 3))
    note = tasks.interval_note(head["tasks_ok"])
    st.caption("task time, 95% intervals from a bootstrap over ok tasks: " + ", ".join(
        tasks.percentile_text(head, q) for q in tasks.TASK_PERCENTILES)
        + (f" ({note})" if note else ""))
    st.caption(
        "task time: the start calls' scheduled send to the last call's last byte (ok tasks: "
        "every call ok); critical path: the longest path through the graph, each call "
        "weighing its delay after its dependencies and its own time; generator delay P99 "
        f"{analysis.format_ms(head['generator_delay_p99_s'])} ms (task time - critical path). "
        f"Critical path on the server {analysis.format_percent(head['path_server_share'])}, "
        f"on tools {analysis.format_percent(head['path_tool_share'])}, in delays "
        f"{analysis.format_percent(head['path_delay_share'])}.")
    charts = st.columns(2)
    with charts[0], st.container(key="chart-tasks-times"):
        show_chart(run_charts.task_bars(figures["histogram"]), interactive)
    with charts[1]:
        choice = st.selectbox("Task drawn", tasks.TASK_CHOICES, index=1, key="task_choice")
    task = tasks.pick_task(per_task, choice)
    with st.container(key="chart-tasks-timeline"):
        if task is None:
            st.caption(f"no task is {choice}")
        else:
            line = tasks.timeline(figures["calls"], task)
            row = per_task.set_index("session_id").loc[task]
            show_chart(run_charts.task_timeline(
                line, f"Task {task}: {row['task_s']:.3f} s, critical path "
                f"{row['critical_path_s']:.3f} s ({row['outcome']})"), interactive)
            st.caption("a bar per call, its send to its last byte (a tool loop's final answer "
                       "included); dashed: a dependency, from the end of the call waited on to "
                       "the dependent's scheduled send; orange: sent late by the generator")
    by_call = figures["by_call"].copy()
    by_call["critical"] = (by_call["critical"] * 100).round(1)
    for column in [c for c in by_call.columns if c.endswith("_s")]:
        by_call[column.removesuffix("_s") + "_ms"] = (by_call.pop(column) * 1e3).round(1)
    with st.container(key="table-tasks-calls"):
        st.markdown(markdown_table(by_call.rename(columns={"critical": "critical (%)"})
                                   .set_index(["depth", "agent"])))
    cache = figures["cache"]
    st.caption("prefix cache per call (ok calls): perfect = the share of the prompt a perfect "
               "prefix cache would reuse (the shared system prompt, the parent's context); "
               "server hit = the server's cached_tokens; 95% intervals from a bootstrap over "
               "tasks (5 or more)")
    with st.container(key="table-tasks-cache"):
        if not cache["reported"].any():
            st.markdown("**Prefix cache:** the server reported no cached tokens (vLLM: "
                        "--enable-prompt-tokens-details); the perfect share alone")
        st.markdown(markdown_table(tasks.cache_text(cache).set_index(["depth", "agent"])))


SERVER_SECTION_KEY = "run-server"  # the section's container (infra/tools/screenshots.py finds it)


def show_server_windows(run_dir: str, fingerprint: tuple[int, int], origin_ns: int,
                        interactive: bool, thin: int | None) -> None:
    """The requests and the server's own figures per 5 s window; a figure the run's engine
    does not expose is a line saying so in place of its chart."""
    st.subheader("Requests and server telemetry, per 5 s window")
    windows = cached_windows(run_dir, fingerprint, origin_ns)
    if windows.empty:
        st.info("no server telemetry joined yet")
        return
    charts = st.columns(2)
    missing = cached_absent(run_dir, fingerprint)  # the engine has no such figure
    for i, (column, label) in enumerate(telemetry.WINDOW_CHART_COLUMNS.items()):
        if column in missing:
            with charts[i % 2], st.container(key=f"chart-run-{column}"):
                st.caption(f"**{label}**: {missing[column]}")
        elif column in windows and windows[column].notna().any():
            with charts[i % 2], st.container(key=f"chart-run-{column}"):
                show_chart(run_charts.line(windows, "t_s", column, title=label,
                                           x_title="s since run start", max_points=thin),
                           interactive)


def show_charts(
    run_dir: str, fingerprint: tuple[int, int], manifest: dict[str, Any], origin_ns: int,
    interactive: bool,
) -> None:
    # drawn on the server as images unless "Interactive charts": Vega in the browser took most
    # of a first view (a 20,000-point scatter, a line chart per window series and GPU figure)
    thin = None if interactive else 4 * run_charts.WIDTH
    st.subheader("TTFT by sent time")
    scatter = cached_ttft_chart(run_dir, fingerprint, origin_ns)
    if scatter is None:
        st.info("No completed requests yet.")
    else:
        with st.container(key="chart-run-ttft"):
            show_chart(scatter, interactive, raster=True)
    with st.container(key=SERVER_SECTION_KEY):
        show_server_windows(run_dir, fingerprint, origin_ns, interactive, thin)
    st.subheader("GPU telemetry")
    gpu = cached_gpu(run_dir, fingerprint, origin_ns)
    if gpu.empty:
        reason = (manifest.get("gpu") or {}).get("reason") or "no reason recorded"
        st.info(f"no GPU telemetry ({reason})")
        return
    charts = st.columns(2)
    for i, (column, label) in enumerate(analysis.GPU_CHART_COLUMNS.items()):
        with charts[i % 2], st.container(key=f"chart-run-{column}"):
            show_chart(run_charts.line(gpu, "t_s", column, title=label,
                                       x_title="s since run start", color="gpu",
                                       max_points=thin), interactive)


def show_run(run_dir: str, warmup_s: float, cooldown_s: float, interactive: bool) -> None:
    fingerprint = run_folder.run_fingerprint(run_dir)
    try:
        manifest = cached_manifest(run_dir, fingerprint)
        summary = cached_summary(run_dir, fingerprint, warmup_s, cooldown_s)
    except ValueError as exc:  # trims longer than the run
        st.warning(str(exc))
        return
    except (OSError, pa.ArrowException) as exc:
        st.error(f"could not read {run_dir}: {exc}")
        return
    st.title(f"Run {manifest.get('run_id') or Path(run_dir).name}")
    show_manifest(manifest)
    # The generator's verdict on itself (lag, unsent requests, read delay, CPU), written at the
    # end of the run: a stakeholder must see it before trusting any latency below.
    validity = manifest.get("validity") or {}
    if validity.get("verdict") not in (None, "valid"):
        st.error(f"Not all the server's figures: {analysis.validity_text(validity)}")
    for warning in manifest.get("warnings") or []:
        st.warning(f"Load generator: {warning}")
    if int(summary.loc[analysis.ALL_ROW, "requests"]) == 0:
        st.info("No request records yet.")
    else:
        show_headline(summary)
        show_tables(summary)
        show_replicas(run_dir, fingerprint)
        show_faults(run_dir, fingerprint)
        show_ttft_parts(run_dir, fingerprint)
        show_sessions(run_dir, fingerprint, interactive)
        show_tasks(run_dir, fingerprint, interactive)
    origin = analysis.run_origin_ns(manifest) or 0
    show_charts(run_dir, fingerprint, manifest, origin, interactive)


def main() -> None:
    results_dir = results_dir_from(sys.argv[1:], os.environ)
    st.sidebar.title("swarmload")
    st.sidebar.caption(f"results: {results_dir.resolve()}")
    runs = cached_runs(str(results_dir))
    if runs.empty:
        st.title("swarmload")
        st.info(f"No runs in {results_dir.resolve()} (a run folder needs a manifest.json).")
        return
    run = pick_run(runs)
    warmup_s = st.sidebar.number_input("Skip warm-up (s)", min_value=0.0, value=0.0, step=5.0)
    cooldown_s = st.sidebar.number_input("Skip cool-down (s)", min_value=0.0, value=0.0, step=5.0)
    still_running = bool(pd.isna(run["ended_at"]))
    live = st.sidebar.toggle(f"Auto-refresh every {AUTO_REFRESH_S:.0f} s", value=still_running)
    interactive = st.sidebar.toggle("Interactive charts", key="run_interactive")
    if live:
        st.fragment(show_run, run_every=AUTO_REFRESH_S)(run["path"], warmup_s, cooldown_s,
                                                          interactive)
    else:
        show_run(run["path"], warmup_s, cooldown_s, interactive)


if __name__ == "__main__":
    main()
