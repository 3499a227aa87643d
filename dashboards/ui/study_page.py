"""The study page of the dashboard: configurations of one study side by side.

Served through :mod:`dashboards.app` at ``/study`` (``?study=<name>`` picks one). It reads only
``study.json`` and the roll-ups (:mod:`dashboards.analysis.study_data`), never raw request files,
so its first view costs the same for a study of a thousand requests or of ten million; the raw
data of any step is one click away on the run page. Charts come from :mod:`dashboards.study_charts`.

The first view is kept light for the browser, which is where its time went (in headless
Chromium on 2 busy cores, Streamlit's own frontend takes 1.5-2 s for a one-metric page; four
Vega charts added about 1 s of browser CPU, metric cards and a styled table about 1 s each): the
capacity headline is one Markdown table, the charts are static SVG drawn on the server by
vl-convert from the same Vega-Lite specs (cached per spec) and shown as Markdown images, so the
browser loads no raw-HTML renderer and decodes one image a chart, and only one detail section is
drawn,
the step-run list. "Interactive charts" in the sidebar draws them with Vega in the browser
instead (tooltips), as before.

Stable hooks for tests and links: the study, metric, percentile and bucket choices are widgets
keyed ``study_id``, ``study_metric``, ``study_percentile``, ``study_bucket`` (and mirrored in the
URL), ``study_interactive`` (the sidebar toggle); each chart and table sits in a container keyed
``chart-...`` / ``table-...`` (the page gets a CSS class ``st-key-<key>``, e.g.
``.st-key-chart-latency-throughput``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pyarrow as pa
import streamlit as st

from dashboards import study_charts
from dashboards.analysis import faults, study_data
from dashboards.analysis.study_data import PERCENTILE_TAGS, THROUGHPUT_COLUMNS, Study
from dashboards.app import results_dir_from
from dashboards.ui.widgets import as_written, markdown_table, show_chart

CACHE_TTL_S = 5.0
DEFAULT_SECTION = "runs"  # the lightest section: a Markdown list, nothing for the browser to load
AUTO_REFRESH_S = 10.0
DETAIL_SECTIONS = {
    "latency": "Latency per bucket",
    "errors": "Errors",
    "throughput": "Throughput",
    "telemetry": "GPU and server telemetry",
    "runs": "Step runs",
}
CHART_KEYS = (
    "chart-throughput-load",
    "chart-latency-throughput",
    "chart-latency-load",
    "chart-errors-load",
)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def cached_studies(results_dir: str) -> pd.DataFrame:
    return study_data.list_studies(results_dir)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def cached_study(study_dir: str, fingerprint: tuple[int, ...]) -> Study:
    return study_data.load_study(study_dir)


@st.cache_data(show_spinner=False, max_entries=64)
def cached_chart_specs(
    study_dir: str,
    fingerprint: tuple[int, ...],
    metric: str,
    percentile: str,
    bucket: str,
    throughput: str,
    chosen: tuple[str, ...],
) -> list[str]:
    """The four charts of one view as JSON (sorted keys, the images' cache key), keyed on the
    roll-ups' mtimes and the choices: building them from the roll-ups was most of the
    script's time on a first view (20-110 ms of 60-140 ms here), which now a view of the same
    study and choices pays once per server."""
    study = cached_study(study_dir, fingerprint)
    view = study_data.select_steps(study.curves, bucket, list(chosen))
    configs = [c for c in study.configs if "config" not in view or c in set(view["config"])]
    slo_s = study_data.slo_threshold_s(study.slo, metric, percentile)
    charts = [
        study_charts.throughput_vs_load(view, study.capacity, throughput, configs),
        study_charts.latency_vs_throughput(
            view, study.capacity, metric, percentile, configs, slo_s
        ),
        study_charts.latency_vs_load(view, study.capacity, metric, percentile, configs, slo_s),
        study_charts.error_rate_vs_load(view, configs),
    ]
    return [json.dumps(chart, sort_keys=True) for chart in charts]


@st.cache_data(show_spinner=False, max_entries=16)
def cached_frontier_spec(study_dir: str, fingerprint: tuple[int, ...]) -> str:
    """The frontier chart of a study as JSON (sorted keys, the image's cache key)."""
    study = cached_study(study_dir, fingerprint)
    return json.dumps(study_charts.frontier(study.frontier, study.configs), sort_keys=True)


def _choice(
    label: str,
    options: dict[str, str],
    key: str,
    param: str,
    horizontal: bool,
    default: str | None = None,
) -> str:
    """A radio whose value also lives in the URL (``?<param>=<tag>``), so a view can be linked;
    ``default`` (else the first option) when the URL names none."""
    tags = list(options)
    if st.session_state.get(key) not in tags:
        wanted = st.query_params.get(param)
        fallback = default if default in tags else tags[0]
        st.session_state[key] = wanted if wanted in tags else fallback
    tag = st.radio(label, tags, key=key, format_func=options.get, horizontal=horizontal)
    st.query_params[param] = tag
    return tag


def pick_study(studies: pd.DataFrame) -> pd.Series:
    """Sidebar list of studies; the choice is kept in the URL (``?study=<folder or name>``)."""
    ids = list(studies["study_id"])
    if st.session_state.get("study_id") not in ids:
        wanted = study_data.find_study(studies, st.query_params.get("study"))
        st.session_state["study_id"] = ids[0] if wanted is None else wanted["study_id"]
    by_id = studies.set_index("study_id")

    def label(study_id: str) -> str:
        row = by_id.loc[study_id]
        folder = "" if Path(study_id).name == row["name"] else f" ({study_id})"
        return f"{row['name']}{folder} · {row['configs']} configs · {row['status'] or '?'}"

    study_id = st.sidebar.selectbox("Study", ids, key="study_id", format_func=label)
    st.query_params["study"] = study_id
    return studies[studies["study_id"] == study_id].iloc[0]


def show_header(study: Study) -> None:
    meta = study.meta
    st.title(f"Study {study.name}")
    status = meta.get("status") or "unknown"
    period = f"{meta.get('started_at') or '?'} → {meta.get('ended_at') or '…'}"
    slo = study_data.slo_text(study.slo)
    labels = " ".join(f"`{k}={v}`" for k, v in (meta.get("labels") or {}).items())
    # as written: a time (14:13:20) read as an emoji code would fetch the emoji table (250 kB)
    st.caption(f"status **{as_written(status)}** · {as_written(period)}"
               + (f" · SLO: {slo}" if slo else "")
               + (f" · labels {labels}" if labels else ""))
    configurations = meta.get("configurations") or []
    if configurations:
        # one line per configuration, as code: arguments are shown exactly as written
        lines = [
            f"`{c.get('name')}` ({c.get('target') or '-'}): `{_args_text(c.get('args'))}`"
            for c in configurations
        ]
        st.markdown("  \n".join(line.replace("``", "`-`") for line in lines))


def show_table(frame: pd.DataFrame, digits: int = 2) -> None:
    """A small table as static HTML (``st.table``): it draws at once, where the interactive
    grid would load its own code first, and its values are plain text a reader can copy."""
    frame = frame.copy()
    # "6", not "6.0000", for loads in the index (st.table ignores a Styler's index format)
    frame.index = (
        pd.MultiIndex.from_arrays(
            [
                [_index_text(v) for v in frame.index.get_level_values(i)]
                for i in range(frame.index.nlevels)
            ],
            names=frame.index.names,
        )
        if frame.index.nlevels > 1
        else pd.Index([_index_text(v) for v in frame.index], name=frame.index.name)
    )
    st.table(frame.style.format(precision=digits, na_rep="-"))


def _index_text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _args_text(args: object) -> str:
    if isinstance(args, dict):
        return " ".join(f"{k} {v}" for k, v in args.items())
    if isinstance(args, list | tuple):
        return " ".join(str(a) for a in args)
    return "-" if args is None else str(args)


def show_verdict(study: Study, unit: str, fingerprint: tuple[int, ...],
                 interactive: bool) -> None:
    """Which configuration to choose, with 95% intervals: each pair's headline (the ratio of
    max sustainable loads, or, where both held the SLO everywhere, what more one completes),
    where each dominates the throughput-interactivity frontier (drawn beside), each
    configuration's efficiency, and every figure's change at every load both measured."""
    sentences, table = study_data.verdict_tables(study.verdict, unit)
    if not sentences:
        return
    st.subheader("Verdict")
    text, chart = st.columns(2) if len(study.frontier) else (st.container(), None)
    with text, st.container(key="table-verdict"):
        # the headline bold, then the rest (the frontier, each configuration's efficiency)
        st.markdown("\n".join([f"**{sentences[0]}**\n", *(f"- {s}" for s in sentences[1:])]))
    if chart is not None:
        with chart, st.container(key="chart-frontier"):
            show_chart(cached_frontier_spec(study.path, fingerprint), interactive)
    if len(table):
        with st.container(key="table-verdict-loads"):
            st.markdown(markdown_table(study_data.verdict_by_load(table).set_index("pair")))
    st.caption(
        "95% intervals from a cluster bootstrap (repeats, then requests within them). "
        '"within noise": the interval of the change holds zero; a second run could reverse it. '
        "Per-user speed: 1 / P50 TPOT (the median stream's output tok/s). Efficiency at each "
        "configuration's max sustainable load; energy from NVML over each step's window."
    )


def show_capacity(study: Study, unit: str) -> None:
    st.subheader("Capacity")
    if study.capacity.empty:
        st.info("No capacity roll-up yet (rollup/capacity.parquet).")
        return
    # one Markdown table, not metric cards plus a styled table: each of those loads and draws
    # its own component in the browser, about 1 s of its CPU apiece on the first view
    with st.container(key="table-capacity"):
        st.markdown(markdown_table(study_data.capacity_table(study.capacity, unit)))
    st.caption(
        "Max sustainable load: the highest offered load where every SLO held, errors stayed "
        "under the limit and achieved throughput was at least 95% of offered. Knee: where "
        'latency starts growing fast on the monotone latency-vs-load curve. "≥" (a "+" on '
        "the charts) means the sweep never went past it. [lo, hi]: 95% interval, which holds "
        "the gap between the last load that held and the first that did not; bars and bands "
        "on the charts are the same intervals; squares are loads the search added."
    )
    unsettled = study_data.unsettled_steps(study.steps)
    if len(unsettled):
        lines = [
            f"`{r['config']}` step {r['step']} ({r['offered_load']:g}): {r['steady_reasons']}"
            for r in unsettled.to_dict("records")
        ]
        st.warning("Unsettled steps (their series never reached a steady state; the window "
                   "was kept whole):  \n" + "  \n".join(lines))
    limited = study_data.generator_limited_steps(study.steps)
    if len(limited):
        lines = [
            f"`{r['config']}` step {r['step']} ({r['offered_load']:g}"
            f"{'' if r.get('sustainable', True) else ', SLO missed: not the server limit'}): "
            f"{r['validity']}: {r['validity_reasons']}"
            for r in limited.to_dict("records")
        ]
        st.warning("Steps whose load generator bent the figures (by how much, and what to "
                   "change):  \n" + "  \n".join(lines))


def show_charts(charts: list[str], interactive: bool) -> None:
    for row_start in (0, 2):
        columns = st.columns(2)
        for column, key, chart in zip(
            columns,
            CHART_KEYS[row_start : row_start + 2],
            charts[row_start : row_start + 2],
            strict=True,
        ):
            with column, st.container(key=key):
                show_chart(chart, interactive)


def show_latency_table(study: Study, metric: str, percentile: str) -> None:
    percentiles = list(dict.fromkeys(["p95", "p99", percentile]))
    st.subheader(study_data.latency_table_title(metric))
    latency = study_data.latency_table_ms(study.steps, metric, percentiles)
    with st.container(key="table-latency"):
        show_table(latency, digits=2)


def show_error_table(study: Study, bucket: str) -> None:
    st.subheader(f"Errors (% of attempts, bucket {bucket})")
    with st.container(key="table-errors"):
        show_table(study_data.error_table_pct(study.steps, bucket), digits=3)


def show_throughput_table(study: Study, bucket: str) -> None:
    st.subheader(f"Throughput (bucket {bucket})")
    with st.container(key="table-throughput"):
        show_table(study_data.throughput_table(study.steps, bucket), digits=2)


def show_telemetry(view: pd.DataFrame, configs: list[str], interactive: bool) -> None:
    st.subheader("GPU and server telemetry per step")
    columns_present = study_data.telemetry_columns(view)
    if not columns_present:
        st.info("No telemetry means in the roll-up (no GPU or /metrics data for these steps).")
        return
    grid = st.columns(2)
    for i, column in enumerate(columns_present):
        with grid[i % 2], st.container(key=f"chart-telemetry-{column}"):
            show_chart(study_charts.telemetry_vs_load(view, column, configs), interactive)


def show_step_runs(study: Study, results_dir: Path) -> None:
    steps = study_data.step_runs(study.meta, study.path)
    if steps.empty or "run_dir" not in steps:
        return
    root = results_dir.resolve()
    lines = ["| configuration | step | offered load | raw requests |", "|---|---|---|---|"]
    for step in steps.to_dict("records"):
        path = Path(str(step["run_dir"])).resolve()
        run_id = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        keys = ("config", "step", "offered_load")
        cells = [str(step.get(k, "-")).replace("|", "/") for k in keys]
        lines.append(f"| {' | '.join(cells)} | [run page](/?run={quote(run_id)}) |")
    st.subheader("Step runs (raw requests on the Run page)")
    with st.container(key="table-step-runs"):
        st.markdown("\n".join(lines))


def show_fault_drills(study_dir: str) -> None:
    """Configurations with a fault plan: each fault of each step, side by side (the step's Run
    page has its timeline)."""
    table = faults.load_study_faults(study_dir)
    if table is None:
        return
    st.subheader("Fault drills")
    st.caption("each fault of a configuration's fault plan: failed requests (and what HAProxy "
               "saw), when the balancer took the replica out and back, and the recovery time "
               "from the action (P95 TTFT, error rate and queue back within the band before)")
    with st.container(key="table-faults"):
        show_table(table[[c for c in faults.STUDY_FAULT_COLUMNS if c in table]], digits=2)


def show_study(study_dir: str, results_dir: Path, interactive: bool = False) -> None:
    fingerprint = study_data.study_fingerprint(study_dir)
    try:
        study = cached_study(study_dir, fingerprint)
    except (OSError, pa.ArrowException) as exc:  # a roll-up being rewritten right now
        st.error(f"could not read the roll-ups of {study_dir}: {exc}")
        return
    show_header(study)
    if (study.meta.get("load") or {}).get("arrival") == "bursts":
        st.page_link("ui/burst_page.py", label="This study hit every configuration with the same "
                     "spike: compare their recovery on the Bursts page")
    if study.steps.empty:
        st.info(
            "No roll-up yet (rollup/steps.parquet): the study runner writes it as steps finish."
        )
        show_step_runs(study, results_dir)
        return
    show_verdict(study, study_data.load_unit(study.steps, short=True), fingerprint, interactive)
    show_capacity(study, study_data.load_unit(study.steps, short=True))
    show_fault_drills(study_dir)

    controls = st.columns([2, 2, 2, 3])
    with controls[0]:
        metric = _choice("Metric", study_data.metrics_present(study.steps), "study_metric",
                         "metric", horizontal=True)
    with controls[1]:
        percentile = _choice(
            "Percentile",
            PERCENTILE_TAGS,
            "study_percentile",
            "pct",
            True,
            default=study_data.slo_percentile(study.slo),
        )
    with controls[2]:
        buckets = {b: b for b in study_data.buckets_present(study.steps)} or {"all": "all"}
        bucket = _choice("Bucket", buckets, "study_bucket", "bucket", horizontal=True)
    with controls[3]:
        present = {k: v for k, v in THROUGHPUT_COLUMNS.items() if k in study.steps}
        throughput = _choice(
            "Throughput", present or THROUGHPUT_COLUMNS, "study_throughput", "tput", True
        )
    chosen = st.sidebar.multiselect("Configurations", study.configs, default=study.configs)
    view = study_data.select_steps(study.curves, bucket, chosen)
    show_charts(cached_chart_specs(study_dir, fingerprint, metric, percentile, bucket, throughput,
                                   tuple(chosen)), interactive)
    # one detail section at a time, drawn only when chosen: a browser on a busy machine spent
    # seconds drawing every table and telemetry chart before the first view was complete
    section = _choice(
        "Details", DETAIL_SECTIONS, "study_section", "section", True, default=DEFAULT_SECTION
    )
    if section == "latency":
        show_latency_table(study, metric, percentile)
    elif section == "errors":
        show_error_table(study, bucket)
    elif section == "throughput":
        show_throughput_table(study, bucket)
    elif section == "telemetry":
        # telemetry is per step, not per bucket: read it from the "all" rows when there are some
        telemetry_view = study_data.select_steps(study.steps, "all", chosen)
        show_telemetry(telemetry_view if len(telemetry_view) else view, chosen, interactive)
    else:
        show_step_runs(study, results_dir)


def main() -> None:
    results_dir = results_dir_from(sys.argv[1:], os.environ)
    st.sidebar.caption(f"results: {results_dir.resolve()}")
    studies = cached_studies(str(results_dir))
    if studies.empty:
        st.title("Studies")
        st.info(
            f"No studies in {results_dir.resolve()} (a study folder holds a study.json; "
            "`swarmload study run` writes them under results/studies/)."
        )
        return
    study = pick_study(studies)
    running = study["status"] == "running"
    live = st.sidebar.toggle(f"Auto-refresh every {AUTO_REFRESH_S:.0f} s", value=running)
    interactive = st.sidebar.toggle(
        "Interactive charts",
        key="study_interactive",
        help="draw the charts with Vega in the browser (tooltips); static SVG otherwise, "
        "which shows the first view about 1 s sooner",
    )
    if live:
        st.fragment(show_study, run_every=AUTO_REFRESH_S)(study["path"], results_dir, interactive)
    else:
        show_study(study["path"], results_dir, interactive)


if __name__ == "__main__":
    main()
