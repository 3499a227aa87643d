"""The Compare page: any runs, study steps or whole studies side by side, and whether a
difference is real.

Served through :mod:`dashboards.app` at ``/compare``. It reads the dashboard's results folder
and any others named in the URL (``?roots=<folder>,<folder>``). The picked items stay in the
URL (``?items=<id>,<id>``, ids as :func:`item_id` writes them; the first is the baseline), so a
comparison can be linked; a linked view opens on the comparison alone, and the button "Change
what is compared, filters and verdict rules" brings the picker and, in the sidebar, the filters
(label, kind, target, dates) and the rules (bucket, interval level, smallest change that
matters, regression threshold). A view with no items in the URL opens with them.

What it draws, all computed by :mod:`dashboards.analysis.compare`:

- the side-by-side table (one column per run or step, or per configuration of a study);
- for studies, their latency-versus-load curves on one chart with knees and max sustainable
  loads, and their capacity table;
- for runs and steps, each candidate against the baseline: change, interval, sample sizes and
  verdict per figure, regressions in red. Studies are compared step by step at matched offered
  loads on request ("Compare matched steps"), since that reads every matched step's raw requests.

The first view costs the browser about what Streamlit's own frontend does (docs/BENCHMARKS.md,
"Compare"): Streamlit loads each element kind's code on first use, so the first view holds only
Markdown and buttons: tables are Markdown, the chart is an SVG drawn on the server (vl-convert)
shown as a Markdown image (raw HTML would load a renderer first), and the picker, filters and
matched-step verdicts come on a click. Stable hooks: widgets keyed ``compare_items``,
``compare_labels``, ``compare_edit``, ``compare_steps`` (buttons: the last two); containers
keyed ``table-side``, ``chart-curves`` (its ``img``), ``table-verdicts-<n>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from collectors.run_folder import CAPACITY_FILE, ROLLUP_DIR, STEPS_FILE
from dashboards import study_charts
from dashboards.analysis import compare
from dashboards.analysis import study as study_analysis
from dashboards.analysis.runs import ALL_ROW
from dashboards.app import results_dir_from
from dashboards.ui.widgets import chart_image, markdown_table

CACHE_TTL_S = 5.0


def item_id(root: Path, path: str, kind: str) -> str:
    """``run:<folder relative to its results root>`` (or ``study:``/``step:``): short, stable."""
    try:
        rel = Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = str(path)
    return f"{kind}:{rel}"


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def cached_items(roots: tuple[str, ...]) -> pd.DataFrame:
    items = compare.discover([Path(r) for r in roots])
    ids = []
    for _, item in items.iterrows():
        root = next((Path(r) for r in roots if Path(item["path"]).resolve().is_relative_to(
            Path(r).resolve())), Path(roots[0]))
        ids.append(item_id(root, item["path"], item["kind"]))
    items.insert(0, "id", ids)
    return items


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=32)
def cached_side(roots: tuple[str, ...], ids: tuple[str, ...], bucket: str) -> pd.DataFrame:
    items = cached_items(roots).set_index("id").loc[list(ids)].reset_index()
    return compare.side_by_side(items, bucket)


@st.cache_data(show_spinner=False, max_entries=64)
def cached_pair(a: dict[str, Any], b: dict[str, Any], options_json: str) -> pd.DataFrame:
    options = json.loads(options_json)
    thresholds = options.pop("thresholds")
    default = options.pop("default_threshold")
    changes = compare.compare_items(a, b, **options)
    return compare.flag_regressions(changes, thresholds, default)


def filters(items: pd.DataFrame) -> pd.DataFrame:
    pairs = sorted({f"{k}={v}" for labels in items["labels"] for k, v in labels.items()})
    chosen = st.sidebar.multiselect("Labels (all must hold)", pairs, key="compare_labels")
    kinds = st.sidebar.multiselect("Kinds", ["run", "step", "study"], key="compare_kinds")
    targets = sorted(t for t in items["target"].dropna().unique())
    target = st.sidebar.selectbox("Target", ["any", *targets], key="compare_target")
    days = st.sidebar.date_input("Started between", value=(), key="compare_dates")
    since = until = None
    if isinstance(days, tuple) and len(days) == 2:
        since = datetime.combine(days[0], datetime.min.time(), UTC)
        until = datetime.combine(days[1], datetime.max.time(), UTC)
    return compare.filter_items(
        items, labels=dict(p.split("=", 1) for p in chosen), kinds=kinds or None,
        target=None if target == "any" else target, since=since, until=until)


def pick_items(items: pd.DataFrame, shown: pd.DataFrame) -> list[str]:
    """The multiselect of items, kept in the URL; default: the two newest of one kind."""
    if "compare_items" not in st.session_state:
        wanted = [i for i in st.query_params.get("items", "").split(",") if i in set(items["id"])]
        for kind in (compare.KIND_STUDY, compare.KIND_RUN, compare.KIND_STEP):
            if not wanted:  # studies first: the comparison stakeholders come for
                wanted = list(items[items["kind"] == kind]["id"].head(2))
        st.session_state["compare_items"] = wanted
    options = list(dict.fromkeys([*st.session_state["compare_items"], *shown["id"]]))
    by_id = items.set_index("id")

    def label(value: str) -> str:
        row = by_id.loc[value]
        tags = compare.format_labels({k: v for k, v in row["labels"].items()
                                      if k not in ("swarmload",)})
        return f"{row['kind']} · {row['name']}" + (f" · {tags}" if tags else "")

    picked = st.multiselect("Compare (the first is the baseline)", options, key="compare_items",
                            format_func=label)
    st.query_params["items"] = ",".join(picked)
    return picked


def _rollup_stamp(study_path: str) -> float:
    """The roll-up's latest modification time: a re-rolled study draws its chart again."""
    stamps = []
    for name in (STEPS_FILE, CAPACITY_FILE):
        with contextlib.suppress(OSError):
            stamps.append(os.stat(Path(study_path) / ROLLUP_DIR / name).st_mtime)
    return max(stamps, default=0.0)


@st.cache_data(show_spinner=False, max_entries=64)
def curves_image(studies: tuple[tuple[str, str, float], ...], metric: str) -> str | None:
    """The studies' latency-versus-load curves on one chart, as a Markdown image of its SVG
    (a ``data:`` URI), or None when no study has a roll-up yet. ``studies``: (name, path,
    :func:`_rollup_stamp`). A Markdown image needs neither raw HTML (whose renderer the browser
    would load first) nor an image element's code; cached whole, so a view of the same
    studies skips building the Vega-Lite spec."""
    curves, capacities = [], []
    for name, path, _ in studies:
        steps, capacity = study_analysis.load_rollup(path)
        if "bucket" in steps:
            steps = steps[steps["bucket"] == ALL_ROW]
        curves.append((name, steps))
        capacities.append((name, capacity))
    steps = compare.study_curves(curves)
    if steps.empty:
        return None
    capacity = compare.study_capacities(capacities)
    spec = study_charts.latency_vs_load(steps, capacity, metric, "p95")
    return chart_image(json.dumps(spec, sort_keys=True))


def show_studies(picked: pd.DataFrame, metric: str) -> None:
    studies = picked[picked["kind"] == compare.KIND_STUDY]
    if studies.empty:
        return
    image = curves_image(tuple((row["name"], row["path"], _rollup_stamp(row["path"]))
                               for _, row in studies.iterrows()), metric)
    if image is None:
        st.info("The picked studies have no roll-up yet (swarmload study rollup).")
        return
    st.subheader(f"{metric.upper()} P95 against offered load")
    with st.container(key="chart-curves"):
        st.markdown(image)


def verdict_markdown(table: pd.DataFrame) -> str:
    lines = ["| figure | baseline | candidate | change [interval] | n A/B | verdict |",
             "|---|---|---|---|---|---|"]
    for _, row in table.iterrows():
        verdict = str(row["verdict"])
        if row["regression"]:
            verdict = f":red[**{verdict}: regression**]"
        elif verdict == "worse":
            verdict = f":orange[{verdict}]"
        elif verdict == "better":
            verdict = f":green[{verdict}]"
        lines.append(f"| {row['figure']} | {compare.format_value(row['figure'], row['a'])} | "
                     f"{compare.format_value(row['figure'], row['b'])} | "
                     f"{compare.format_change(row)} | {row['n_a']}/{row['n_b']} | {verdict} |")
    return "\n".join(lines)


def _record(item: pd.Series) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in item.items()}


def show_verdicts(picked: pd.DataFrame, all_items: pd.DataFrame, options: dict[str, Any]) -> None:
    st.subheader("Is the difference real")
    level = options["level"]
    st.caption(
        f"Each candidate against the baseline ({picked['name'].iloc[0]}): the change with a "
        f"bootstrap interval from the raw per-request values of each measured window, "
        f"{level:.0%} simultaneous over the figures; 'within noise' when the interval holds 0 "
        f"or the change is under {options['min_effect']:.0%}; a 'worse' change past the "
        f"threshold is a regression.")
    option_text = json.dumps(options, sort_keys=True)
    base = picked.iloc[0]
    if base["kind"] == compare.KIND_STUDY:
        # a button, not a toggle: a toggle's code would load with the first view
        if not st.session_state.get("compare_steps_shown") and not st.button(
                "Compare matched steps (reads their raw requests)", key="compare_steps"):
            st.caption("Studies are compared step by step at equal offered load on request.")
            return
        st.session_state["compare_steps_shown"] = True  # stays open on later reruns
        for n, (_, other) in enumerate(picked.iloc[1:].iterrows()):
            if other["kind"] != compare.KIND_STUDY:
                continue
            matched = compare.matched_steps(all_items, base["path"], other["path"])
            by_key = all_items.set_index("key")
            for m, (_, pair) in enumerate(matched.iterrows()):
                table = cached_pair(_record(by_key.loc[pair["key_a"]]),
                                    _record(by_key.loc[pair["key_b"]]), option_text)
                st.markdown(f"**{other['name']} / {pair['config_b']}** vs **{base['name']} / "
                            f"{pair['config_a']}** at offered load {pair['offered_load']:g}")
                with st.container(key=f"table-verdicts-{n}-{m}"):
                    st.markdown(verdict_markdown(table))
        return
    for n, (_, other) in enumerate(picked.iloc[1:].iterrows()):
        if other["kind"] == compare.KIND_STUDY:
            st.warning(f"{other['name']} is a study: compare it with studies.")
            continue
        table = cached_pair(_record(base), _record(other), option_text)
        if (table["verdict"] == "no data").all():
            st.info(f"{other['name']} vs {base['name']}: no raw requests on one side (a "
                    "roll-up only), nothing to resample.")
            continue
        flagged = int(table["regression"].sum())
        st.markdown(f"**{other['name']}** vs baseline **{base['name']}**"
                    + (f" · :red[**{flagged} regression(s)**]" if flagged else ""))
        with st.container(key=f"table-verdicts-{n}"):
            st.markdown(verdict_markdown(table))


def main() -> None:
    default_root = results_dir_from(sys.argv[1:], os.environ)
    st.title("Compare")
    extra = st.query_params.get("roots", "")  # more results folders, comma-separated
    roots = tuple(dict.fromkeys([str(default_root)] + [p.strip() for p in extra.split(",")
                                                       if p.strip()]))
    items = cached_items(roots)
    if items.empty:
        st.info(f"No runs or studies under {', '.join(roots)}.")
        return
    # A linked comparison (?items=...) opens on the comparison alone: the picker, filters and
    # rules are widgets whose code the browser loads on first use, which the first view would
    # pay for before anything is compared; one button brings them.
    linked = [i for i in st.query_params.get("items", "").split(",") if i in set(items["id"])]
    editing = st.session_state.get("compare_editing") or not linked
    shown, bucket, level, min_effect, threshold = items, ALL_ROW, 0.95, 2.0, 5.0
    if editing:
        st.session_state["compare_editing"] = True
        shown = filters(items)
        bucket = st.sidebar.selectbox("Bucket", [ALL_ROW, "short", "medium", "long"],
                                      key="compare_bucket")
        level = st.sidebar.select_slider("Interval level", [0.9, 0.95, 0.99], value=0.95,
                                         key="compare_level")
        min_effect = st.sidebar.number_input("Smallest change that matters (%)", 0.0, 100.0,
                                             2.0, key="compare_min_effect")
        threshold = st.sidebar.number_input("Regression threshold (%)", 0.0, 1000.0, 5.0,
                                            key="compare_threshold")
        picked_ids = pick_items(items, shown)
    else:
        picked_ids = linked
        if st.button("Change what is compared, filters and verdict rules",
                     key="compare_edit"):
            st.session_state["compare_editing"] = True
            st.rerun()
    if len(picked_ids) < 1:
        st.info("Pick runs, study steps or studies to compare.")
        return
    picked = items.set_index("id").loc[picked_ids].reset_index()
    st.caption(" · ".join(f"**{row['name']}**: {compare.format_labels(row['labels'])}"
                          for _, row in picked.iterrows()))
    side = cached_side(roots, tuple(picked_ids), bucket)
    with st.container(key="table-side"):
        st.markdown(markdown_table(compare.side_by_side_text(side), index_name=""))
    show_studies(picked, "ttft")
    if len(picked) >= 2:
        show_verdicts(picked, items, {
            "bucket": bucket, "level": float(level), "min_effect": min_effect / 100,
            "thresholds": {}, "default_threshold": threshold / 100})


main()
