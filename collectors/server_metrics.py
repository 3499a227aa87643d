"""Scrape a Prometheus ``/metrics`` on a beat into the long-format ``server_metrics`` table.

Usage::

    scraper = ServerMetricsScraper(run_dir, run_id, "http://127.0.0.1:8000/metrics", interval_s=0.5)
    scraper.start()
    ...
    scraper.stop()      # table <run_dir>/server_metrics/, rows as SERVER_METRICS_SCHEMA

The text is parsed with ``prometheus_client.parser.text_string_to_metric_families`` (never by hand),
and every sample becomes one row under the engine's own name (vLLM's
``vllm:num_requests_running``, SGLang's ``sglang:num_queue_reqs``, ...; each histogram bucket too),
without a schema change when a server adds a metric; :mod:`collectors.server_figures` reads them
in one vocabulary. ``include`` keeps only families whose name starts with one of the given
prefixes (e.g. ``("vllm:",)``) to keep a long run small. An unreachable or failing target is one
error row per attempt (``errors`` counts them) and the scraper keeps trying at the same beat.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collectors.parquet_sink import RollingParquetWriter
from collectors.periodic import RunSampler
from collectors.schemas import SERVER_METRICS_SCHEMA, SERVER_METRICS_TABLE
from collectors.server_figures import RUNNING, WAITING, aliases

# The gauges that say a server still has work (every engine's running and waiting requests): a
# tail's sample with both at 0 on every target shows the server settled
# (PeriodicSampler.settled). A server without them has nothing to show.
BUSY_GAUGES = frozenset((*aliases(RUNNING), *aliases(WAITING)))


def metrics_url(url: str) -> str:
    """Accept a base URL (``http://host:8000``) or the full ``/metrics`` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"


def parse_metrics(text: str, include: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Prometheus exposition text -> rows (metric, metric_type, sample, labels, value)."""
    prefixes = tuple(include) if include else None
    rows = []
    for family in text_string_to_metric_families(text):
        if prefixes and not family.name.startswith(prefixes):
            continue
        for sample in family.samples:
            rows.append({
                "metric": family.name,
                "metric_type": family.type,
                "sample": sample.name,
                "labels": json.dumps(sample.labels, sort_keys=True, separators=(",", ":")),
                "value": float(sample.value),
            })
    return rows


class ServerMetricsScraper(RunSampler):
    name = "server_metrics"

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        run_id: str,
        url: str | Sequence[str],
        interval_s: float = 0.5,
        *,
        host: str | None = None,
        include: Iterable[str] | None = None,
        timeout_s: float | None = None,
        flush_interval_s: float = 2.0,
        verify: bool | str = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(run_dir, run_id, interval_s, host, flush_interval_s)
        # https targets: the run's CA bundle (a path), True (system store) or False (--insecure);
        # headers: an API key for gateways that guard /metrics too (never stored)
        self.verify = verify
        self.headers = dict(headers or {})
        # several targets (replicas) are scraped one after the other in each tick
        self.urls = [metrics_url(u) for u in ([url] if isinstance(url, str) else url)]
        self.url = self.urls[0]
        self.include = tuple(include) if include else None
        # A busy server can answer /metrics late; waiting up to 2 beats keeps the beat honest.
        self.timeout_s = timeout_s if timeout_s is not None else max(1.0, 2 * interval_s)
        self.scrapes_ok = 0
        self.errors = 0
        self.rows = 0
        self.busy = False  # the last tick: some target had requests running or waiting
        self._client: httpx.Client | None = None
        self._writer: RollingParquetWriter | None = None

    def setup(self) -> bool:
        self._client = httpx.Client(timeout=self.timeout_s, verify=self.verify,
                                    headers=self.headers)
        self._writer = self.open_table(SERVER_METRICS_TABLE, SERVER_METRICS_SCHEMA)
        return True

    def teardown(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._writer is not None:
            self._writer.close()

    def sample(self, wall_ns: int) -> None:
        busy = [self._scrape(url, wall_ns) for url in self.urls]
        self.busy = any(busy)
        assert self._writer is not None
        self._writer.maybe_flush()

    def idle(self) -> bool:
        return not self.busy

    def _scrape(self, url: str, wall_ns: int) -> bool:
        """One target's scrape into the table; True when it had requests running or waiting
        (a failed scrape shows nothing: False)."""
        assert self._client is not None and self._writer is not None
        base = {"run_id": self.run_id, "host": self.host, "wall_ns": wall_ns, "target": url}
        started = time.perf_counter()
        try:
            response = self._client.get(url)
            response.raise_for_status()
            parsed = parse_metrics(response.text, self.include)
        except (httpx.HTTPError, ValueError) as exc:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            rows = [{**base, "scrape_s": time.perf_counter() - started,
                     "error": self.last_error[:500]}]
            busy = False
        else:
            self.scrapes_ok += 1
            scrape_s = time.perf_counter() - started
            rows = [{**base, **row, "scrape_s": scrape_s} for row in parsed]
            busy = any(row["value"] > 0 for row in parsed if row["sample"] in BUSY_GAUGES)
        self._writer.append_rows(rows)
        self.rows += len(rows)
        return busy

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out.update(url=self.url, urls=self.urls, scrapes_ok=self.scrapes_ok, errors=self.errors,
                   rows=self.rows)
        return out
