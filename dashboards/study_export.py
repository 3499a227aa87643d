"""``swarmload study export``: a study as one self-contained HTML file, for people who will not
run anything.

Usage::

    swarmload study export results/studies/my-study --out report.html
    swarmload study export STUDY_DIR --out report.html --metric tpot --percentile p99 --bucket long
    swarmload study export STUDY_DIR --out report.html --gpu-hour-usd 2.49   # priced anew

The file holds the verdict (with the throughput-interactivity frontier chart and each
configuration's efficiency), the study page's figures (the same Vega-Lite specs, from
:mod:`dashboards.study_charts`, with their data inline), the capacity headline, P95/P99 tables per
bucket for every latency metric, errors, throughput and telemetry per step, and for a burst study
(``arrival: bursts``) the configurations' recovery from the same spike with its timelines. Vega,
Vega-Lite and vega-embed are inlined from the ``vl-convert-python`` package (about 0.9 MB), so the
file opens offline and years later; with ``--cdn``, or when that package is absent, the page loads
them from jsDelivr instead and needs the internet to draw its charts (the tables show either way).
Like the page, it reads only ``study.json`` and the roll-ups.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from collectors import run_folder
from dashboards import burst_charts, study_charts
from dashboards.analysis import burst, study_data
from dashboards.analysis.study import add_price_option
from dashboards.analysis.study_data import METRIC_LABELS, PERCENTILE_TAGS, Study

VEGA_LITE_VERSION = "6.4"  # one that vl-convert bundles and Streamlit's frontend draws alike
CDN_SCRIPTS = (
    "https://cdn.jsdelivr.net/npm/vega@6",
    f"https://cdn.jsdelivr.net/npm/vega-lite@{VEGA_LITE_VERSION}",
    "https://cdn.jsdelivr.net/npm/vega-embed@7",
)
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1200px; color: #222; padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } .meta { color: #555; margin-top: 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 1rem; }
.chart { border: 1px solid #eee; border-radius: 6px; padding: 0.5rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1.5rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: right; }
th { background: #f6f6f6; } td:first-child, th:first-child { text-align: left; }
code { background: #f4f4f4; padding: 0 0.2rem; } .note { color: #666; font-size: 0.85rem; }
"""


def javascript(cdn: bool = False) -> tuple[str, str]:
    """(``"inline"`` or ``"cdn"``, the ``<script>`` tags that define ``vegaEmbed``)."""
    if not cdn:
        try:
            import vl_convert
        except ImportError:
            cdn = True
        else:
            bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE_VERSION)  # type: ignore[call-arg]
            return "inline", f"<script>{_script_safe(bundle)}</script>"
    tags = "\n".join(f'<script src="{url}"></script>' for url in CDN_SCRIPTS)
    return "cdn", tags


def _script_safe(text: str) -> str:
    """Text that cannot end the ``<script>`` element it is placed in."""
    return text.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def _table(frame: pd.DataFrame, digits: int = 2) -> str:
    if frame.empty:
        return '<p class="note">nothing in the roll-up</p>'
    return frame.to_html(
        na_rep="-", float_format=lambda v: f"{v:.{digits}f}", border=0, escape=True
    )


def _charts_for(
    study: Study, metric: str, percentile: str, bucket: str
) -> list[tuple[str, dict[str, Any]]]:
    view = study_data.select_steps(study.curves, bucket)
    configs = study.configs
    slo_s = study_data.slo_threshold_s(study.slo, metric, percentile)
    capacity = study.capacity
    charts = [
        ("throughput-load", study_charts.throughput_vs_load(view, capacity, configs=configs)),
        (
            "latency-throughput",
            study_charts.latency_vs_throughput(
                view, capacity, metric, percentile, configs, slo_s
            ),
        ),
        (
            "latency-load",
            study_charts.latency_vs_load(view, capacity, metric, percentile, configs, slo_s),
        ),
        ("errors-load", study_charts.error_rate_vs_load(view, configs)),
    ]
    telemetry = study_data.select_steps(study.steps, "all")
    for column in study_data.telemetry_columns(telemetry):
        charts.append(
            (f"telemetry-{column}", study_charts.telemetry_vs_load(telemetry, column, configs))
        )
    return charts


def _burst_section(study: Study) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """A burst study's recovery comparison and its first spike's timelines (nothing for other
    studies), from the burst roll-up."""
    loaded = burst.load_study_bursts(study.path)
    if loaded is None:
        return [], []
    spikes, timelines = loaded
    configs = study.configs or list(dict.fromkeys(spikes["config"]))
    comparison = burst.recovery_comparison(spikes, configs)
    first = spikes.sort_values(["step", "spike"]).iloc[0]
    chosen = spikes[(spikes["step"] == first["step"]) & (spikes["spike"] == first["spike"])]
    lines = timelines[(timelines["step"] == first["step"])
                      & (timelines["spike"] == first["spike"])]
    charts = [
        ("burst-recovery", burst_charts.recovery_bars(comparison, configs)),
        ("burst-load", burst_charts.load_timeline(lines, chosen, configs)),
        ("burst-ttft", burst_charts.ttft_timeline(lines, chosen, configs)),
        ("burst-queue", burst_charts.queue_timeline(lines, chosen, configs)),
    ]
    table = comparison.set_index("config")
    for column in ("recovery_s", "recovery_max_s", "queue_recovery_s"):
        table[column] = table[column].round(1)
    for column in ("peak_ttft_p95_s", "baseline_ttft_p95_s"):
        table[column.replace("_s", "_ms")] = (table.pop(column) * 1e3).round(0)
    parts = [
        "<h2>Bursts: recovery from the same spike</h2>",
        _table(table, digits=1),
        f'<p class="note">Spike {int(first["spike"])} at {first["start_s"]:.0f} s for '
        f'{first["duration_s"]:g} s on a base of {first["offered_load"]:g} req/s. Recovery '
        "time: from the spike's end to the first 1 s window after which P95 TTFT stays within "
        "10% of the pre-spike baseline and the waiting queue is back to its baseline.</p>",
        '<div class="charts">',
        *(f'<div class="chart" id="chart-{html.escape(key)}"></div>' for key, _ in charts),
        "</div>",
    ]
    return parts, charts


def render_html(
    study: Study,
    metric: str = "ttft",
    percentile: str = "p95",
    bucket: str = "all",
    cdn: bool = False,
    gpu_hour_usd: float | None = None,
) -> str:
    """The report as one HTML document (see the module docstring); ``gpu_hour_usd`` prices
    the efficiency anew (else the roll-up's cost)."""
    study_data.metric_column(metric, percentile)  # an unknown metric or percentile fails here
    meta = study.meta
    unit = study_data.load_unit(study.steps)
    mode, scripts = javascript(cdn)
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Study {esc(study.name)} · swarmload</title>",
        f"<style>{_STYLE}</style>",
        scripts,
        "</head><body>",
        f'<h1 id="study-title">Study {esc(study.name)}</h1>',
        '<p class="meta">'
        f"status <b>{esc(str(meta.get('status') or 'unknown'))}</b> · "
        f"{esc(str(meta.get('started_at') or '?'))} → {esc(str(meta.get('ended_at') or '…'))}"
        + (f" · SLO: {esc(study_data.slo_text(study.slo))}" if study.slo else "")
        + "</p>",
    ]
    configurations = meta.get("configurations") or []
    if configurations:
        parts.append("<ul>")
        for config in configurations:
            args = config.get("args")
            args_text = " ".join(map(str, args)) if isinstance(args, list) else str(args or "")
            parts.append(
                f"<li><b>{esc(str(config.get('name')))}</b> ({esc(str(config.get('target')))}): "
                f"<code>{esc(args_text)}</code></li>"
            )
        parts.append("</ul>")
    sentences, verdict = study_data.verdict_tables(study.verdict, unit, study.capacity,
                                                   gpu_hour_usd)
    frontier_chart: list[tuple[str, dict[str, Any]]] = []
    if sentences:
        parts.append('<h2 id="verdict">Verdict</h2>')
        parts += [f"<p>{'<b>' * (i == 0)}{esc(line)}{'</b>' * (i == 0)}</p>"
                  for i, line in enumerate(sentences)]
        if len(study.frontier):
            frontier_chart.append(("frontier", study_charts.frontier(study.frontier,
                                                                     study.configs)))
            parts.append('<div class="chart" id="chart-frontier"></div>')
        if len(verdict):  # a row per pair and load, a column per figure, as on the page
            parts.append(_table(study_data.verdict_by_load(verdict).set_index("pair")))
        parts.append('<p class="note">95% intervals from a cluster bootstrap (repeats, then '
                     'requests within them); "within noise": the interval of the change holds '
                     "zero. Per-user speed: 1 / P50 TPOT. Efficiency at each configuration's "
                     "max sustainable load; energy from NVML over each step's window"
                     + (f"; cost at ${gpu_hour_usd:g} per GPU-hour" if gpu_hour_usd else "")
                     + ".</p>")
    parts.append("<h2>Capacity</h2>")
    parts.append(_table(study_data.capacity_table(study.capacity, unit)))
    parts.append(
        '<p class="note">Max sustainable load: the highest offered load where every SLO held, '
        "errors stayed under the limit and achieved throughput was at least 95% of offered. "
        "Knee: where latency starts growing fast on the monotone latency-vs-load curve. "
        '"≥" (a "+" on the charts): the sweep never went past it.</p>'
    )
    label = f"{PERCENTILE_TAGS[percentile]} {METRIC_LABELS[metric]}"
    parts.append(f"<h2>Figures ({esc(label)}, bucket {esc(bucket)})</h2>")
    parts.append('<div class="charts">')
    charts = _charts_for(study, metric, percentile, bucket)
    for key, _ in charts:
        parts.append(f'<div class="chart" id="chart-{esc(key)}"></div>')
    parts.append("</div>")
    burst_parts, burst_specs = _burst_section(study)
    parts += burst_parts
    charts += burst_specs
    for tag in study_data.metrics_present(study.steps):
        parts.append(f"<h2>{esc(study_data.latency_table_title(tag))}</h2>")
        parts.append(_table(study_data.latency_table_ms(study.steps, tag, ("p50", "p95", "p99"))))
    parts.append(f"<h2>Errors (% of attempts, bucket {esc(bucket)})</h2>")
    parts.append(_table(study_data.error_table_pct(study.steps, bucket), digits=3))
    parts.append(f"<h2>Throughput (bucket {esc(bucket)})</h2>")
    parts.append(_table(study_data.throughput_table(study.steps, bucket)))
    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    js_note = "inlined" if mode == "inline" else "loaded from jsDelivr (needs the internet)"
    parts.append(
        f'<p class="note">Written by swarmload study export at {generated} from '
        f"{esc(str(Path(study.path).name))}; charts drawn by Vega-Lite, {js_note}.</p>"
    )
    specs = {f"#chart-{key}": spec for key, spec in [*frontier_chart, *charts]}
    parts.append(
        "<script>\n"
        f"const specs = {_script_safe(json.dumps(specs))};\n"
        "for (const [target, spec] of Object.entries(specs)) {\n"
        '  vegaEmbed(target, spec, {mode: "vega-lite", actions: false, renderer: "svg"})\n'
        "    .catch((error) => { document.querySelector(target).textContent = String(error); });\n"
        "}\n</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def export(
    study_dir: str | Path,
    out: str | Path,
    metric: str = "ttft",
    percentile: str = "p95",
    bucket: str = "all",
    cdn: bool = False,
    gpu_hour_usd: float | None = None,
) -> Path:
    """Write the report of ``study_dir`` to ``out``; returns the path written."""
    study = study_data.load_study(study_dir)
    if not study.meta and study.steps.empty:
        raise FileNotFoundError(f"{study_dir} holds no {run_folder.STUDY_FILE} and no roll-up")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(study, metric, percentile, bucket, cdn, gpu_hour_usd),
                   encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="swarmload study export",
        description="Write a study as one self-contained HTML file (charts and tables).",
    )
    parser.add_argument("study_dir", type=Path, help="study folder (holds study.json)")
    parser.add_argument("--out", type=Path, default=Path("report.html"), help="report.html")
    parser.add_argument("--metric", choices=list(METRIC_LABELS), default="ttft")
    parser.add_argument("--percentile", choices=list(PERCENTILE_TAGS), default="p95")
    parser.add_argument("--bucket", default="all", help="all, short, medium or long")
    parser.add_argument(
        "--cdn", action="store_true", help="load the chart libraries from a CDN, not inline"
    )
    add_price_option(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        out = export(args.study_dir, args.out, args.metric, args.percentile, args.bucket, args.cdn,
                     args.gpu_hour_usd)
    except FileNotFoundError as exc:
        print(f"swarmload study export: {exc}", file=sys.stderr)
        return 2
    size_kb = out.stat().st_size / 1024
    print(f"wrote {out} ({size_kb:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
