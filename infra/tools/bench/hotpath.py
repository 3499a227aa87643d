"""Compare, on numbers, the clients that can stream SSE under gevent (``swarmload bench hotpath``).

Each candidate runs in its own gevent-patched process against the lean zero-latency target
(:mod:`infra.tools.bench.target`): ``--concurrency`` greenlets stream back to back for
``--seconds``. The figure that matters on a shared machine is the client's **CPU time per streamed
event** (``time.process_time``), which does not depend on how busy the other cores are; requests/s
and events/s are printed beside it.

Candidates:
- ``shipped``: :mod:`locustfiles.streaming` as shipped (geventhttpclient's ``readline`` with its
  pool's idle limit and retry, byte-level event classification, full JSON decode only until the
  first content event, usage and errors);
- ``httpx-lines``: httpx ``iter_lines`` + :func:`locustfiles.sse.parse_line` on every line (the
  previous hot path);
- ``httpx-raw``: httpx ``iter_raw`` + own line splitting + the byte-level classifier;
- ``shipped-read-times``: ``shipped`` with kernel receive timestamps off
  (``SWARMLOAD_KERNEL_RX_TIMES=0``): what the timestamps cost;
- ``ghc-readline``: geventhttpclient's low-level response ``readline`` (C parser, llhttp) + the
  byte-level classifier, bare: what ``shipped`` costs beyond it is its own per-event work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

CANDIDATES = ("shipped", "shipped-read-times", "httpx-lines", "httpx-raw", "ghc-readline")


def _payload(tokens: int) -> dict[str, Any]:
    return {"model": "swarmload-bench", "prompt": "r0 hello world", "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


def _make_streamer(kind: str, base_url: str) -> Any:
    """A function () -> content events of one request, for each candidate."""
    import httpx

    from locustfiles.sse import parse_line
    from locustfiles.streaming import make_client, stream_request

    if kind in ("shipped", "shipped-read-times"):
        client = make_client(base_url)

        def run(payload: dict[str, Any]) -> int:
            timing = stream_request(client, "/v1/completions", payload)
            assert timing.outcome == "ok", timing.error
            return len(timing.content_ns)
        return run
    if kind in ("httpx-lines", "httpx-raw"):
        hx = httpx.Client(base_url=base_url, timeout=httpx.Timeout(300.0, pool=None),
                          limits=httpx.Limits(max_connections=10_000,
                                              max_keepalive_connections=10_000))

        def run_lines(payload: dict[str, Any]) -> int:
            events = 0
            with hx.stream("POST", "/v1/completions", json=payload) as response:
                for line in response.iter_lines():
                    time.perf_counter_ns()
                    if line and parse_line(line).has_content:
                        events += 1
            return events

        def run_raw(payload: dict[str, Any]) -> int:
            from locustfiles.streaming import has_content_bytes

            events, pending = 0, b""
            with hx.stream("POST", "/v1/completions", json=payload) as response:
                for block in response.iter_raw():
                    time.perf_counter_ns()
                    lines = (pending + block).split(b"\n")
                    pending = lines.pop()
                    for line in lines:
                        if line.startswith(b"data:") and has_content_bytes(line):
                            events += 1
            return events
        return run_lines if kind == "httpx-lines" else run_raw
    if kind == "ghc-readline":
        from urllib.parse import urlsplit

        from geventhttpclient import HTTPClient

        parts = urlsplit(base_url)
        ghc = HTTPClient(parts.hostname or "127.0.0.1", parts.port, concurrency=10_000,
                         network_timeout=300.0, connection_timeout=10.0)

        def run_ghc(payload: dict[str, Any]) -> int:
            from locustfiles.streaming import has_content_bytes

            response = ghc.post("/v1/completions", body=json.dumps(payload),
                                headers={"Content-Type": "application/json"})
            events = 0
            while True:
                line = response.readline(b"\n")
                if not line:
                    break
                time.perf_counter_ns()
                if line.startswith(b"data:") and has_content_bytes(line):
                    events += 1
            response.release()
            return events
        return run_ghc
    raise ValueError(f"unknown candidate {kind!r}; valid: {CANDIDATES}")


def measure(kind: str, base_url: str, concurrency: int, seconds: float,
            tokens: int) -> dict[str, Any]:
    """Run one candidate in this (already gevent-patched) process; figures as a dict."""
    import gevent

    run = _make_streamer(kind, base_url)
    payload = _payload(tokens)
    for _ in range(3):
        run(payload)  # warm up: connections, imports
    counts = {"requests": 0, "events": 0}
    deadline = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < deadline:
            events = run(payload)  # not `+= run()`: the read would race other greenlets
            counts["events"] += events
            counts["requests"] += 1

    cpu0, wall0 = time.process_time(), time.monotonic()
    gevent.joinall([gevent.spawn(loop) for _ in range(concurrency)], timeout=seconds + 30)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    return {
        "candidate": kind, "concurrency": concurrency, "tokens": tokens,
        "requests_per_s": counts["requests"] / wall, "events_per_s": counts["events"] / wall,
        "cpu_share": cpu / wall,
        "cpu_us_per_request": 1e6 * cpu / max(counts["requests"], 1),
        "cpu_us_per_event": 1e6 * cpu / max(counts["events"], 1),
    }


def _child(argv: list[str]) -> int:
    from gevent import monkey

    monkey.patch_all()
    kind, base_url, concurrency, seconds, tokens = argv
    result = measure(kind, base_url, int(concurrency), float(seconds), int(tokens))
    print(json.dumps(result), flush=True)
    return 0


def compare(base_url: str, candidates: list[str], concurrency: int, seconds: float,
            tokens: int, profile_dir: str | None = None) -> list[dict[str, Any]]:
    results = []
    for kind in candidates:
        argv = [sys.executable, "-m", "infra.tools.bench.hotpath", "--child", kind, base_url,
                str(concurrency), str(seconds), str(tokens)]
        if profile_dir:  # cProfile (stdlib); read with python -m pstats FILE
            argv = [sys.executable, "-m", "cProfile", "-o", f"{profile_dir}/{kind}.prof",
                    *argv[1:]]
        env = {**os.environ,
               "SWARMLOAD_KERNEL_RX_TIMES": "0" if kind == "shipped-read-times" else "1"}
        out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120,
                             env=env)
        if out.returncode != 0:
            raise RuntimeError(f"candidate {kind} failed:\n{out.stderr[-2000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def format_table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'candidate':<18} {'req/s':>8} {'events/s':>10} {'CPU':>5} "
             f"{'CPU us/req':>11} {'CPU us/event':>13}"]
    for r in results:
        lines.append(f"{r['candidate']:<18} {r['requests_per_s']:>8.0f} {r['events_per_s']:>10.0f}"
                     f" {r['cpu_share']:>5.2f} {r['cpu_us_per_request']:>11.0f}"
                     f" {r['cpu_us_per_event']:>13.2f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="swarmload bench hotpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--target", default=None, help="base URL (default: start the lean target)")
    p.add_argument("--profile-dir", default=None,
                   help="also write a cProfile profile per candidate (KIND.prof) into this folder")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    from infra.tools.bench.lean_target import running_lean_target

    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    for c in candidates:
        if c not in CANDIDATES:
            p.error(f"unknown candidate {c!r}; valid: {', '.join(CANDIDATES)}")
    with running_lean_target(args.target) as base_url:
        results = compare(base_url, candidates, args.concurrency, args.seconds, args.tokens,
                          args.profile_dir)
    print(json.dumps(results, indent=1) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
