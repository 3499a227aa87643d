"""The server's own figures in one vocabulary, whatever engine served the run.

The ``server_metrics`` table keeps every sample under the engine's own name, as scraped, so old
run folders read as they always did. Each engine's names for the figures below are its *metric
map*: a module of ``collectors/metric_maps/`` holding ``MAP = MetricMap(...)``, found there by
itself. The analysis asks for a figure by its neutral name and gets the rows of whichever engine
served the run::

    rows = select(server_metrics, RUNNING)  # vllm:num_requests_running, sglang:num_running_reqs,
                                            # tgi_batch_current_size, llamacpp:requests_processing
    rows = select(server_metrics, TTFT, "_sum")  # a histogram's _sum (or _count, _bucket)

The vocabulary (kind; meaning):

=====================  =========  =================================================================
``running``            gauge      requests in the running batch
``waiting``            gauge      requests waiting in the queue
``kv_cache_usage``     gauge      share of the KV cache in use, 0-1
``preemptions``        counter    requests preempted (SGLang: retracted)
``prefix_cache_hits``  counter    prompt tokens served from the prefix cache
``prefix_cache_queries`` counter  prompt tokens looked up in it
``requests_ok``        counter    requests the server finished
``generation_tokens``  counter    output tokens generated
``prompt_tokens``      counter    prompt tokens processed
``server_ttft``        histogram  the server's own time to first token, seconds
``server_itl``         histogram  the server's own inter-token latency, seconds
``server_e2e``         histogram  the server's own request latency, seconds
``spec_accepted_tokens`` counter  speculative decoding: draft tokens accepted
``spec_draft_tokens``  counter    speculative decoding: draft tokens proposed
``spec_accept_rate``   gauge      speculative decoding: accepted share, 0-1 (SGLang's own figure)
=====================  =========  =================================================================

A figure an engine does not expose is *absent*, never an empty series: :func:`absent` names the
figures a run's engine (:func:`engine_of`) does not have, and pages say "not exposed by <engine>".
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # read by the worker's run folder code, which never loads pandas
    import pandas as pd

RUNNING = "running"
WAITING = "waiting"
KV_USAGE = "kv_cache_usage"
PREEMPTIONS = "preemptions"
PREFIX_HITS = "prefix_cache_hits"
PREFIX_QUERIES = "prefix_cache_queries"
SUCCESS = "requests_ok"
GENERATION_TOKENS = "generation_tokens"
PROMPT_TOKENS = "prompt_tokens"
TTFT = "server_ttft"
ITL = "server_itl"
E2E = "server_e2e"
SPEC_ACCEPTED = "spec_accepted_tokens"
SPEC_DRAFTED = "spec_draft_tokens"
SPEC_ACCEPT_RATE = "spec_accept_rate"


@dataclass(frozen=True)
class Figure:
    name: str
    kind: str  # gauge | counter | histogram
    title: str  # a few words for a page


FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure(RUNNING, "gauge", "running requests"),
    Figure(WAITING, "gauge", "waiting requests"),
    Figure(KV_USAGE, "gauge", "KV-cache usage"),
    Figure(PREEMPTIONS, "counter", "preemptions"),
    Figure(PREFIX_HITS, "counter", "prefix-cache hits"),
    Figure(PREFIX_QUERIES, "counter", "prefix-cache queries"),
    Figure(SUCCESS, "counter", "requests finished"),
    Figure(GENERATION_TOKENS, "counter", "generated tokens"),
    Figure(PROMPT_TOKENS, "counter", "prompt tokens"),
    Figure(TTFT, "histogram", "server TTFT"),
    Figure(ITL, "histogram", "server inter-token latency"),
    Figure(E2E, "histogram", "server request latency"),
    Figure(SPEC_ACCEPTED, "counter", "accepted draft tokens"),
    Figure(SPEC_DRAFTED, "counter", "draft tokens"),
    Figure(SPEC_ACCEPT_RATE, "gauge", "draft acceptance rate"),
)}
_SCRAPE_KEYS = ["run_id", "host", "wall_ns", "target"]


@dataclass(frozen=True)
class MetricMap:
    """One engine's Prometheus names for the figures it exposes.

    ``names``: figure -> the sample names that carry it, newest first (the first present in a
    run wins; a histogram's family name, without ``_sum``/``_count``/``_bucket``). ``sums``:
    figure -> samples whose sum at each scrape is the figure (llama.cpp's prompt tokens).
    ``prefix`` tells its samples apart from other engines'."""

    engine: str
    title: str
    prefix: str
    names: Mapping[str, tuple[str, ...]]
    sums: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def exposes(self, figure: str) -> bool:
        return figure in self.names or figure in self.sums


@functools.cache
def maps() -> dict[str, MetricMap]:
    """Every engine's map, by engine name: the ``MAP`` of each ``collectors/metric_maps/`` module
    (found by itself: adding an engine's map touches no other file)."""
    # late: the map modules import this module's names
    from collectors import metric_maps  # noqa: PLC0415

    found = {}
    for info in sorted(pkgutil.iter_modules(metric_maps.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{metric_maps.__name__}.{info.name}")
        found[module.MAP.engine] = module.MAP
    return found


def aliases(figure: str, suffix: str = "") -> tuple[str, ...]:
    """The sample names that carry ``figure`` (with ``suffix``: a histogram's ``_sum``,
    ``_count`` or ``_bucket``): the neutral name first, then each engine's in its map's order."""
    names = [figure + suffix]
    for metric_map in maps().values():
        names += [name + suffix for name in metric_map.names.get(figure, ())]
    return tuple(dict.fromkeys(names))


def select(frame: pd.DataFrame, figure: str, suffix: str = "") -> pd.DataFrame:
    """The rows of ``frame`` (``server_metrics`` rows) that carry ``figure``, renamed to it: of
    the first of its :func:`aliases` present, or else the per-scrape sum of an engine's
    ``sums`` parts. Error rows are left out; empty when no engine's name for it is there."""
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    samples = ok["sample"]
    for name in aliases(figure, suffix):
        rows = ok[samples == name]
        if not rows.empty:
            return rows.assign(sample=figure + suffix)
    for metric_map in maps().values():
        parts = metric_map.sums.get(figure, ()) if not suffix else ()
        rows = ok[samples.isin(parts)]
        if parts and set(rows["sample"]) == set(parts):
            keys = [k for k in _SCRAPE_KEYS if k in rows]
            summed = rows.groupby(keys, as_index=False, sort=False)["value"].sum()
            return summed.assign(sample=figure)
    return ok.iloc[0:0]


def engine_of(samples: Iterable[str]) -> MetricMap | None:
    """The engine whose names these samples are (the map with the most of them by prefix);
    None when no map's prefix is among them."""
    counts: dict[str, int] = {}
    for sample in set(samples):
        for metric_map in maps().values():
            if sample.startswith(metric_map.prefix):
                counts[metric_map.engine] = counts.get(metric_map.engine, 0) + 1
    return maps()[max(counts, key=lambda e: counts[e])] if counts else None


def absent(engine: MetricMap | None, figures: Iterable[str]) -> dict[str, str]:
    """``{figure: "not exposed by <engine>"}`` for each of ``figures`` the engine's map does not
    have (nothing when the engine is unknown: no scrape, or an engine without a map)."""
    if engine is None:
        return {}
    return {f: f"not exposed by {engine.title}" for f in figures if not engine.exposes(f)}


def samples_of(names: Iterable[str]) -> list[str]:
    """Every sample name that may carry ``names`` (figures, with a histogram's ``_sum`` and
    ``_count``, and the parts of a sum; any other name as it is): a filter for loading."""
    out: list[str] = []
    for name in names:
        figure = FIGURES.get(name)
        if figure is None:
            out.append(name)
            continue
        suffixes = ("", "_sum", "_count") if figure.kind == "histogram" else ("",)
        for suffix in suffixes:
            out += aliases(name, suffix)
        for metric_map in maps().values():
            out += metric_map.sums.get(name, ())
    return list(dict.fromkeys(out))


def include_prefixes(figures: Iterable[str]) -> tuple[str, ...]:
    """Family-name prefixes that keep every engine's samples of ``figures`` in a scrape filter
    (``swarmload collect --metrics-include``): a counter's family has no ``_total``."""
    prefixes = []
    for figure in figures:
        for metric_map in maps().values():
            for name in (*metric_map.names.get(figure, ()), *metric_map.sums.get(figure, ())):
                prefixes.append(name.removesuffix("_total").removesuffix("_sum"))
    return tuple(dict.fromkeys(prefixes))
