"""A standalone collector on another host, read by the run over HTTP (``swarmload collect
--serve``): its clock and, at the end, its files.

Endpoints (stdlib ``http.server``, one thread per request; bind it where the run's master can
reach it, and nowhere else). Every request needs the run's shared token
(``Authorization: Bearer $SWARMLOAD_TOKEN``, :mod:`collectors.auth`); without it the answer is
401 and nothing is done:

- ``GET /clock`` -> ``{"host", "t2", "t3"}``: this host's wall clock (ns) when the request
  arrived and when the answer left. The run reads its own clock before (t1) and after (t4) and
  keeps the exchange with the smallest round trip (NTP's estimate, as for Locust workers in
  ``locustfiles.clock_sync``): offset = ((t2 - t1) + (t3 - t4)) / 2, within rtt / 2.
- ``POST /stop`` -> stops the samplers (each flushes its Parquet) and answers once they have.
- ``GET /files`` -> ``{"files": [relative paths]}``: the tables' part files and the
  ``telemetry-<host>.json`` report under the collector's run folder.
- ``GET /file?path=REL`` -> that file's bytes (only paths that ``/files`` lists).
- ``POST /done`` -> the run has its copy: the collector exits.

``SWARMLOAD_TEST_CLOCK_SKEW_S`` (test-only) moves this process's wall clock, as for workers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from collectors.auth import bearer_ok

SKEW_ENV = "SWARMLOAD_TEST_CLOCK_SKEW_S"


def wall_ns() -> int:
    """The wall clock, plus the test-only skew (read each time: cheap next to a sample)."""
    return time.time_ns() + int(round(float(os.environ.get(SKEW_ENV) or 0.0) * 1e9))


def list_run_files(run_dir: Path) -> list[str]:
    """Relative paths of the files a run should copy: Parquet parts and collector reports."""
    files = [p for p in run_dir.rglob("*.parquet") if not p.name.startswith(".")]
    files += list(run_dir.glob("telemetry-*.json"))
    return sorted(str(p.relative_to(run_dir)) for p in files if p.is_file())


class _Handler(BaseHTTPRequestHandler):
    """One request to a :class:`CollectorServer` (``GET /clock``, ``/files``, ``/file``,
    ``POST /stop``, ``/done``); every one needs the run's token."""

    server: _HTTPServer

    def log_message(self, *_args: Any) -> None:  # no line per request on stderr
        return

    def _send(self, body: bytes, content_type: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, data: Any, status: int = 200) -> None:
        self._send(json.dumps(data).encode(), "application/json", status)

    def _refused(self) -> bool:
        if bearer_ok(self.headers.get("Authorization"), self.server.token):
            return False
        self.server.collector.refused += 1
        self._json({"error": "needs the run's token (Authorization: Bearer "
                             "$SWARMLOAD_TOKEN)"}, 401)
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        t2 = wall_ns()
        if self._refused():
            return
        collector = self.server.collector
        url = urlsplit(self.path)
        if url.path == "/clock":
            self._json({"host": collector.host, "t2": t2, "t3": wall_ns()})
        elif url.path == "/files":
            self._json({"host": collector.host, "files": list_run_files(collector.run_dir)})
        elif url.path == "/file":
            rel = (parse_qs(url.query).get("path") or [""])[0]
            if rel not in list_run_files(collector.run_dir):
                self._json({"error": f"no such file: {rel!r}"}, 404)
                return
            self._send((collector.run_dir / rel).read_bytes(), "application/octet-stream")
        else:
            self._json({"error": "unknown path"}, 404)

    def do_POST(self) -> None:  # noqa: N802
        if self._refused():
            return
        collector = self.server.collector
        path = urlsplit(self.path).path
        if path == "/stop":
            with collector._stop_lock:  # a second /stop waits for the first to finish
                collector.stop_samplers()
            self._json({"status": "stopped"})
        elif path == "/done":
            collector.done.set()
            self._json({"status": "bye"})
        else:
            self._json({"error": "unknown path"}, 404)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], collector: CollectorServer,
                 token: str) -> None:
        super().__init__(address, _Handler)
        self.collector, self.token = collector, token


class CollectorServer:
    """Serves one collector's clock and files; ``stop_samplers`` flushes and returns a report."""

    def __init__(self, address: tuple[str, int], run_dir: Path, host: str,
                 stop_samplers: Callable[[], None], *, token: str) -> None:
        self.run_dir = run_dir
        self.refused = 0  # requests answered 401
        self.host = host
        self.stop_samplers = stop_samplers
        self.done = threading.Event()
        self._stop_lock = threading.Lock()
        self.httpd = _HTTPServer(address, self, token)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="collect-serve",
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        if isinstance(host, bytes):  # socketserver's type allows it; AF_INET gives str
            host = host.decode()
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_address(text: str) -> tuple[str, int]:
    """'PORT', 'HOST:PORT' -> (host, port); host defaults to 127.0.0.1 (loopback only)."""
    host, sep, port = text.rpartition(":")
    return (host if sep and host else "127.0.0.1"), int(port)
