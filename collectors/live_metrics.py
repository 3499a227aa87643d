"""Live figures of a run for Prometheus: what the master has seen, served on ``/metrics``.

A Locust plugin in the manner of :mod:`collectors.progress`: on the master (or a local runner)
it is fed every batch of records the request recorder stores (``recorder.batch_listeners``), so
it counts exactly what reaches the run folder; on a worker it adds the worker's sent count to
Locust's periodic report, from which the master knows how many requests are in flight.

Series (all with the run's labels: ``run_id``, ``endpoint`` and every ``--label KEY=VALUE``)::

    swarmload_requests_total{bucket, outcome}          counter: records stored, by outcome class
    swarmload_output_tokens_total{bucket}              counter: output tokens of ok requests
    swarmload_ttft_seconds{bucket}                     histogram (ok, streamed requests)
    swarmload_tpot_seconds{bucket}                     histogram
    swarmload_itl_seconds{bucket}                      histogram: every gap between tokens
    swarmload_e2e_seconds{bucket}                      histogram (ok requests)
    swarmload_schedule_lag_seconds                     histogram: sent - scheduled (open loop)
    swarmload_read_delay_seconds                       histogram: bytes waiting in the kernel
    swarmload_sent_total                               counter: requests the workers have sent
    swarmload_in_flight                                gauge: sent, record not yet stored
    swarmload_offered_rate / swarmload_achieved_rate   gauges, requests/s over the last 10 s
    swarmload_schedule_lag_p99_seconds, swarmload_read_delay_p99_seconds   gauges, last 10 s
    swarmload_merged_gap_share                         gauge: ITL gaps read together, last 10 s
    swarmload_generator_healthy                        gauge: 1 while the lag p99 stays <= 10 ms
                                                       and at most 1% of gaps were read together
    swarmload_workers                                  gauge: workers connected
    swarmload_info{...}                                gauge 1, the run's labels
    swarmload_drift_*{series}                          a soak's early warning (below)

A soak's early warning (``dashboards.analysis.early_warning``, computed by ``swarmload soak``
while it runs into :data:`EARLY_WARNING_FILE` in the run folder) is served as it was last
written: ``swarmload_drift_flagged``, ``_slope_share_per_h``, ``_projected_at_end`` and
``_hours_to_limit`` per series of the soak (a fixed set: its latency, rate and memory series).

Memory is bounded whatever the run's length: every series has a fixed label set (buckets
``short``/``medium``/``long``/``other``, which add up to the run; the outcome classes of
``collectors/schemas.py``; no request ever makes a label value), histograms are arrays of
bucket counts, and the 10 s figures come from one-second bins of which the newest 70 are kept.
The histograms' bounds are vLLM's own (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``), so a client series and the server's line up bucket for
bucket in one PromQL query.

Served by gevent's WSGI server inside the master's event loop (``prometheus_client``'s WSGI app
over this module's collector): on ``127.0.0.1`` unless the run says otherwise.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from collectors.itl_gaps import MERGED_GAP_WARN_SHARE
from collectors.schemas import OUTCOME_DROPPED, OUTCOME_OK, OUTCOMES

log = logging.getLogger(__name__)

BUCKETS = ("short", "medium", "long", "other")  # a record of no known bucket: "other"
# vLLM's own histogram bounds (vllm/v1/metrics/loggers.py), so client and server line up
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
              120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
GENERATOR_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
HEALTHY_P99_S = 0.010  # METRICS.md: above 10 ms the generator did not keep up
RATE_WINDOW_S = 10
RECORD_DELAY_S = 4  # a worker reports every 3 s
_KEEP_BINS = RATE_WINDOW_S + 60  # records of a second arrive up to a minute late (long streams)
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
LIVE_KEY = "swarmload_live"  # worker -> master, in Locust's report: {"sent": n}
METRICS_PREFIX = "swarmload_"
EARLY_WARNING_FILE = "early_warning.json"  # written by `swarmload soak`, served from here
_MAX_DRIFT_SERIES = 64


def label_name(key: str) -> str:
    """A run label's key as a Prometheus label name (``engine.version`` -> ``engine_version``)."""
    name = _LABEL_NAME.sub("_", key.strip()) or "label"
    return "_" + name if name[0].isdigit() or name.startswith("__") else name


class _Histogram:
    """Cumulative bucket counts and a sum, per label value; many values added at once."""

    def __init__(self, bounds: tuple[float, ...], keys: Iterable[str]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = {key: np.zeros(len(bounds) + 1, dtype=np.int64) for key in keys}
        self.sums = dict.fromkeys(self.counts, 0.0)

    def add(self, key: str, values: np.ndarray) -> None:
        values = values[~np.isnan(values)]
        if values.size:
            index = np.searchsorted(self.bounds, values, side="left")  # le: value <= bound
            self.counts[key] += np.bincount(index, minlength=self.bounds.size + 1)
            self.sums[key] += float(values.sum())

    def samples(self, key: str) -> tuple[list[tuple[str, float]], float]:
        cumulative = np.cumsum(self.counts[key])
        buckets = [(_le(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        return [*buckets, ("+Inf", float(cumulative[-1]))], self.sums[key]


def _le(bound: float) -> str:
    return repr(float(bound))


def _floats(column: Iterable[Any]) -> np.ndarray:
    return np.asarray([math.nan if v is None else v for v in column], dtype=np.float64)


def _p99(values: list[float]) -> float:
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), 99.0))


class LiveMetrics:
    """The master's live figures; :meth:`on_records` takes each stored batch of records."""

    def __init__(self, labels: Mapping[str, str], *, clock: Callable[[], float] = time.time,
                 workers: Callable[[], int] | None = None,
                 early_warning: Path | None = None) -> None:
        self.early_warning = early_warning
        self._early: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self.labels = {label_name(k): str(v) for k, v in labels.items()}
        self.clock = clock
        self.workers = workers
        self.outcomes = tuple(OUTCOMES)
        self.requests = {(b, o): 0 for b in BUCKETS for o in self.outcomes}
        self.output_tokens = dict.fromkeys(BUCKETS, 0)
        self.ttft = _Histogram(TTFT_BOUNDS, BUCKETS)
        self.tpot = _Histogram(TOKEN_BOUNDS, BUCKETS)
        self.itl = _Histogram(TOKEN_BOUNDS, BUCKETS)
        self.e2e = _Histogram(E2E_BOUNDS, BUCKETS)
        self.lag = _Histogram(GENERATOR_BOUNDS, ("",))
        self.read_delay = _Histogram(GENERATOR_BOUNDS, ("",))
        self.sent_by_worker: dict[str, int] = {}
        self.recorded_sent = 0  # stored records of requests that were sent
        # (time, requests sent by all workers) at each worker report, the last 10 s or so
        self.sent_history: deque[tuple[float, int]] = deque()
        # second -> [ok finished, dropped (offered, never sent), lags, read delays, gaps,
        # gaps read together (collectors.itl_gaps)]
        self.bins: dict[int, list[Any]] = {}

    # --- feeding

    def on_records(self, columns: Mapping[str, list[Any]]) -> None:
        outcomes = columns["outcome"]
        if not outcomes:
            return
        buckets = [b if b in BUCKETS else "other" for b in columns["bucket"]]
        ok = np.asarray([o == OUTCOME_OK for o in outcomes], dtype=bool)
        for bucket, outcome in zip(buckets, outcomes, strict=True):
            key = (bucket, outcome if outcome in self.outcomes else "malformed_event")
            self.requests[key] += 1
        sent = columns["sent_wall_ns"]
        self.recorded_sent += sum(1 for s in sent if s)
        tokens = _floats(columns["output_tokens"])
        ttft, tpot, e2e = (_floats(columns[c]) for c in ("ttft_s", "tpot_s", "e2e_s"))
        itl = columns.get("itl_s") or [None] * len(outcomes)
        by_bucket: dict[str, list[int]] = {}
        for i, bucket in enumerate(buckets):
            if ok[i]:
                by_bucket.setdefault(bucket, []).append(i)
        for bucket, rows in by_bucket.items():
            index = np.asarray(rows)
            self.output_tokens[bucket] += int(np.nansum(tokens[index]))
            self.ttft.add(bucket, ttft[index])
            self.tpot.add(bucket, tpot[index])
            self.e2e.add(bucket, e2e[index])
            gaps = [itl[i] for i in rows if itl[i] is not None and len(itl[i])]
            if gaps:
                self.itl.add(bucket, np.concatenate([np.asarray(g, dtype=np.float64)
                                                     for g in gaps]))
        lag, delay = _floats(columns["schedule_lag_s"]), _floats(columns["read_delay_s"])
        self.lag.add("", lag)
        self.read_delay.add("", delay)
        for i, outcome in enumerate(outcomes):
            if outcome == OUTCOME_DROPPED and columns["scheduled_wall_ns"][i]:
                self._bin(columns["scheduled_wall_ns"][i] / 1e9)[1] += 1  # offered, never sent
            if ok[i] and sent[i]:
                entry = self._bin(sent[i] / 1e9 + (e2e[i] if not math.isnan(e2e[i]) else 0.0))
                entry[0] += 1
                if not math.isnan(lag[i]):
                    entry[2].append(lag[i])
                if not math.isnan(delay[i]):
                    entry[3].append(delay[i])
                gaps = itl[i]
                if gaps is not None and len(gaps):
                    entry[4] += len(gaps)
                    entry[5] += int(np.count_nonzero(np.asarray(gaps) == 0.0))
        self._prune()

    def on_worker_live(self, client_id: str, live: Mapping[str, Any]) -> None:
        """A worker's report: how many requests it has sent so far."""
        self.sent_by_worker[client_id] = int(live.get("sent", 0))
        now = self.clock()
        self.sent_history.append((now, sum(self.sent_by_worker.values())))
        while len(self.sent_history) > 2 and self.sent_history[1][0] < now - RATE_WINDOW_S:
            self.sent_history.popleft()

    def _bin(self, t_s: float) -> list[Any]:
        second = int(t_s)
        entry = self.bins.get(second)
        if entry is None:
            entry = self.bins[second] = [0, 0, [], [], 0, 0]
        return entry

    def _prune(self) -> None:
        if len(self.bins) > _KEEP_BINS:
            newest = int(self.clock())
            for second in [s for s in self.bins if s < newest - _KEEP_BINS]:
                del self.bins[second]
            while len(self.bins) > 4 * _KEEP_BINS:  # clock far behind the records' stamps
                del self.bins[min(self.bins)]

    # --- reading

    def window(self) -> dict[str, float]:
        """Rates and generator p99s over the last :data:`RATE_WINDOW_S` seconds: offered from the
        workers' sent counts (plus requests dropped over the in-flight cap), achieved and the
        p99s from the records of requests that finished in the window ending
        :data:`RECORD_DELAY_S` ago (records reach the master a few seconds after the finish)."""
        self._prune()
        end = int(self.clock()) - RECORD_DELAY_S
        entries = [self.bins[s] for s in range(end - RATE_WINDOW_S, end) if s in self.bins]
        offered = sum(e[1] for e in entries) / RATE_WINDOW_S
        if len(self.sent_history) >= 2:
            (t0, n0), (t1, n1) = self.sent_history[0], self.sent_history[-1]
            offered += (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        return {
            "offered": offered,
            "achieved": sum(e[0] for e in entries) / RATE_WINDOW_S,
            "lag_p99": _p99([v for e in entries for v in e[2]]),
            "read_delay_p99": _p99([v for e in entries for v in e[3]]),
            "merged_share": (sum(e[5] for e in entries) / gaps if (gaps := sum(
                e[4] for e in entries)) else math.nan),
        }

    def collect(self) -> Iterable[Any]:
        """prometheus_client's collector protocol: every series, built at scrape time."""
        names, values = list(self.labels), list(self.labels.values())
        p = METRICS_PREFIX
        info = GaugeMetricFamily(p + "info", "the run's labels", labels=names)
        info.add_metric(values, 1.0)
        yield info
        requests = CounterMetricFamily(p + "requests", "requests recorded, by bucket and "
                                       "outcome class", labels=[*names, "bucket", "outcome"])
        for (bucket, outcome), count in self.requests.items():
            requests.add_metric([*values, bucket, outcome], count)
        yield requests
        tokens = CounterMetricFamily(p + "output_tokens", "output tokens of ok requests",
                                     labels=[*names, "bucket"])
        for bucket, count in self.output_tokens.items():
            tokens.add_metric([*values, bucket], count)
        yield tokens
        for metric, hist, text in (
                ("ttft_seconds", self.ttft, "time to first token (METRICS.md), ok requests"),
                ("tpot_seconds", self.tpot, "time per output token, ok requests"),
                ("itl_seconds", self.itl, "every gap between tokens, ok requests"),
                ("e2e_seconds", self.e2e, "end-to-end latency, ok requests")):
            family = HistogramMetricFamily(p + metric, text, labels=[*names, "bucket"])
            for bucket in BUCKETS:
                buckets, total = hist.samples(bucket)
                family.add_metric([*values, bucket], buckets, total)
            yield family
        for metric, hist, text in (
                ("schedule_lag_seconds", self.lag, "sent - scheduled (open-loop plans)"),
                ("read_delay_seconds", self.read_delay, "longest wait of a response's bytes "
                                                        "in the kernel before the worker read")):
            family = HistogramMetricFamily(p + metric, text, labels=names)
            buckets, total = hist.samples("")
            family.add_metric(values, buckets, total)
            yield family
        sent = sum(self.sent_by_worker.values())
        counter = CounterMetricFamily(p + "sent", "requests the workers have sent",
                                      labels=names)
        counter.add_metric(values, sent)
        yield counter
        win = self.window()
        lag_p99, delay_p99 = win["lag_p99"], win["read_delay_p99"]
        merged = win["merged_share"]
        # a late read alone bends nothing; events read together do (collectors.itl_gaps)
        healthy = (math.isnan(lag_p99) or lag_p99 <= HEALTHY_P99_S) and (
            math.isnan(merged) or merged <= MERGED_GAP_WARN_SHARE)
        gauges = [
            ("in_flight", "requests sent whose record has not been stored yet",
             max(0, sent - self.recorded_sent) if self.sent_by_worker else 0),
            ("offered_rate", f"requests/s sent or dropped over the cap, last {RATE_WINDOW_S} s",
             win["offered"]),
            ("achieved_rate", f"ok requests/s finished, last {RATE_WINDOW_S} s",
             win["achieved"]),
            ("schedule_lag_p99_seconds", f"P99 schedule lag, last {RATE_WINDOW_S} s", lag_p99),
            ("read_delay_p99_seconds", f"P99 read delay, last {RATE_WINDOW_S} s", delay_p99),
            ("merged_gap_share", f"ITL gaps read together (0), last {RATE_WINDOW_S} s",
             merged),
            ("generator_healthy", "1 while the generator keeps up (lag P99 <= 10 ms, at most "
             "1% of gaps read together)", 1.0 if healthy else 0.0),
        ]
        if self.workers is not None:
            gauges.append(("workers", "Locust workers connected", self.workers()))
        for name, text, value in gauges:
            gauge = GaugeMetricFamily(p + name, text, labels=names)
            gauge.add_metric(values, float(value))
            yield gauge
        yield from self._drift_families(names, values)

    def _early_rows(self) -> list[dict[str, Any]]:
        """The soak's last early warning, re-read when the file changes."""
        path = self.early_warning
        if path is None:
            return []
        try:
            mtime = path.stat().st_mtime
            if mtime != self._early[0]:
                rows = json.loads(path.read_text()).get("warnings") or []
                self._early = (mtime, rows[:_MAX_DRIFT_SERIES])
        except (OSError, ValueError):
            pass
        return self._early[1]

    def _drift_families(self, names: list[str], values: list[str]) -> Iterable[Any]:
        rows = self._early_rows()
        if not rows:
            return
        for key, text in (
                ("flagged", "1: the trend reaches its limit, or moves the series by the drift "
                            "share, by the soak's planned end"),
                ("slope_share_per_h", "Theil-Sen slope per hour / the series' start"),
                ("projected_at_end", "the trend's value at the planned end, series' units"),
                ("hours_to_limit", "hours until the trend reaches its limit")):
            gauge = GaugeMetricFamily(METRICS_PREFIX + "drift_" + key, text,
                                      labels=[*names, "series"])
            for row in rows:
                value = row.get(key)
                if value is not None:
                    gauge.add_metric([*values, str(row["series"])], float(value))
            yield gauge


def serve(metrics: Any, bind: str, port: int) -> Any:
    """``/metrics`` for ``metrics`` (any prometheus_client collector) on ``bind:port``, served
    by gevent in this process's event loop; returns the started server (``.stop()``)."""
    # late: gevent's server only inside a Locust process (which patched the process)
    from gevent.pywsgi import WSGIServer  # noqa: PLC0415
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    server = WSGIServer((bind, port), make_wsgi_app(registry), log=None,
                        error_log=logging.getLogger(__name__))
    server.start()
    return server


def register(environment: Any, recorder: Any, settings: Any,
             sent_count: Callable[[], int] | None = None) -> LiveMetrics | None:
    """Attach to a Locust process: on the master / local runner with ``prometheus_port`` set,
    serve the figures; on a worker, report ``sent_count()`` to the master."""
    # late: Locust patches the process for gevent when imported: only in a Locust process
    from locust.runners import MasterRunner, WorkerRunner  # noqa: PLC0415

    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        if sent_count is not None:
            def report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
                data[LIVE_KEY] = {"sent": sent_count()}

            environment.events.report_to_master.add_listener(report)
        return None
    if not settings.prometheus_port:
        return None
    labels = {"run_id": settings.run_id, "endpoint": settings.endpoint}
    for pair in settings.labels:
        key, _, value = pair.partition("=")
        if label_name(key) not in ("run_id", "endpoint", "bucket", "outcome", "le"):
            labels[key] = value.strip()
    workers = ((lambda: len(runner.clients.ready) + len(runner.clients.running))
               if isinstance(runner, MasterRunner) else None)
    early = Path(settings.run_dir) / EARLY_WARNING_FILE if settings.run_dir else None
    metrics = LiveMetrics(labels, workers=workers, early_warning=early)
    recorder.batch_listeners.append(metrics.on_records)
    if isinstance(runner, MasterRunner):
        def on_report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            live = data.get(LIVE_KEY)
            if live:
                metrics.on_worker_live(client_id, live)

        environment.events.worker_report.add_listener(on_report)
    server = serve(metrics, settings.prometheus_bind, settings.prometheus_port)
    log.info("Prometheus metrics on http://%s:%d/metrics", settings.prometheus_bind,
             settings.prometheus_port)
    environment.events.quit.add_listener(lambda **_kw: server.stop(timeout=1))
    return metrics
