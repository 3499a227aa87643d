"""The run's side of ``swarmload collect --serve`` on another host (``collectors.remote``).

    swarmload collect --serve 0.0.0.0:9109 --run-dir /tmp/gpu-1 --metrics-url http://127.0.0.1:8000
    swarmload run --target http://gpu-1:8000 --remote-collector http://gpu-1:9109 ...

Before the load, the run measures each remote collector's clock offset (:func:`measure_offset`:
``ROUNDS`` NTP-style exchanges over HTTP, the one with the smallest round trip kept); after it,
the offset once more, then it stops the collector's samplers and copies every file into its own
run folder (:func:`pull`), so the run folder holds everything. The manifest's ``hosts`` gets one
entry per collector host with ``clock_offset_s`` (the better of the two measurements) and its
error bound; the telemetry join subtracts it from that host's rows.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from collectors.auth import bearer, token_from_env, token_problem
from locustfiles.clock_sync import OffsetEstimator, ntp_sample

ROUNDS = 16
TIMEOUT_S = 10.0


class RemoteCollectorError(RuntimeError):
    """A remote collector did not answer as expected; the message names it."""


def _headers() -> dict[str, str]:
    """The shared token (``SWARMLOAD_TOKEN``) every collector request carries."""
    token = token_from_env()
    problem = token_problem(token)
    if problem or token is None:
        raise RemoteCollectorError(f"{problem} (the collector was started with it)")
    return bearer(token)


def _why(url: str, exc: OSError) -> str:
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
        return f"{url}: refused (401): this run's SWARMLOAD_TOKEN is not the collector's"
    return f"{url}: {exc}"


def _get(url: str, timeout_s: float = TIMEOUT_S) -> bytes:
    request = urllib.request.Request(url, headers=_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return bytes(response.read())
    except OSError as exc:
        raise RemoteCollectorError(_why(url, exc)) from exc


def _post(url: str, timeout_s: float = 60.0) -> Any:
    request = urllib.request.Request(url, data=b"", method="POST", headers=_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return json.loads(response.read() or b"{}")
    except OSError as exc:
        raise RemoteCollectorError(_why(url, exc)) from exc


def measure_offset(base_url: str, rounds: int = ROUNDS,
                   estimator: OffsetEstimator | None = None) -> tuple[str, OffsetEstimator]:
    """(collector host, estimator of its clock minus ours) from ``rounds`` exchanges."""
    estimator = estimator or OffsetEstimator()
    host = ""
    for _ in range(rounds):
        t1 = time.time_ns()
        answer = json.loads(_get(f"{base_url.rstrip('/')}/clock"))
        t4 = time.time_ns()
        host = str(answer["host"])
        estimator.add(*ntp_sample(t1, int(answer["t2"]), int(answer["t3"]), t4))
        time.sleep(0.01)
    return host, estimator


def pull(base_url: str, run_dir: Path) -> list[str]:
    """Stop the collector's samplers, copy its files into ``run_dir``; the copied paths."""
    base = base_url.rstrip("/")
    _post(f"{base}/stop")
    listing = json.loads(_get(f"{base}/files"))
    copied = []
    for rel in listing["files"]:
        target = (run_dir / rel).resolve()
        if run_dir.resolve() not in target.parents:
            raise RemoteCollectorError(f"{base}: refusing file outside the run folder: {rel}")
        if target.exists() and not rel.endswith(".json"):
            continue  # a local collector's part of the same name: never overwrite
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_get(f"{base}/file?path={urllib.parse.quote(rel)}", 120.0))
        copied.append(rel)
    _post(f"{base}/done", 10.0)
    return copied


class RemoteCollectors:
    """The run's remote collectors: offsets before and after the load, files at the end."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.hosts: dict[str, str] = {}
        self.estimators: dict[str, OffsetEstimator] = {}
        self.at_start: dict[str, dict[str, Any]] = {}

    def measure(self) -> None:
        """Before the load: each collector's offset (raises RemoteCollectorError)."""
        for url in self.urls:
            self.measure_one(url)
            self.at_start.setdefault(url, self.estimators[url].as_dict())

    def finish(self, run_dir: Path) -> list[dict[str, Any]]:
        """Measure again, pull every collector's files; the manifest's host entries."""
        entries = []
        for url in self.urls:
            entry: dict[str, Any] = {"host": self.hosts.get(url), "role": "collector",
                                     "url": url}
            try:
                self.measure_one(url)
                entry["files"] = len(pull(url, run_dir))
            except RemoteCollectorError as exc:
                entry["error"] = str(exc)
            estimator = self.estimators.get(url)
            if estimator is not None:
                clock = estimator.as_dict()
                entry.update(clock_offset_s=clock["offset_s"],
                             clock_error_bound_s=clock["error_bound_s"],
                             clock_samples=clock["samples"],
                             clock_at_start=self.at_start.get(url))
            entries.append(entry)
        return entries

    def measure_one(self, url: str) -> None:
        host, estimator = measure_offset(url, estimator=self.estimators.get(url))
        self.hosts[url], self.estimators[url] = host, estimator
