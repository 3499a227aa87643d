"""How late a worker's event loop wakes up, with the record path running: ``python -m
infra.tools.bench.loop_stalls``.

A token's timestamp is taken when the worker's gevent loop gets to the socket; any stretch of
time in which the loop does something else (serialising a batch of records, a garbage
collection) is added to every TTFT and ITL that falls into it. This probe runs, in one
gevent-patched process with the worker's imports (its heap), a greenlet that sleeps 1 ms and
records how late it wakes, while ``--rate`` records/s go through :func:`locustfiles.timing.
build_record` and :class:`collectors.request_recorder.RequestRecorder` on a worker runner whose
``send_message`` msgpack-serialises like Locust's, plus Locust's 3 s report; Python's cyclic GC
collections are timed by generation (``gc.callbacks``).

Compare ``--batch`` (records per message; 128 shipped, 20000 before) and ``--freeze`` (what a
worker does at test start). On a shared machine the floor (``--rate 0``) is the OS's
scheduling noise, not the loop's.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any


def probe(batch: int, freeze: bool, seconds: float, rate: int) -> dict[str, Any]:
    import gevent
    import pyarrow.parquet  # noqa: F401  the worker's heap: Locust, gevent, pyarrow, ...
    from locust.rpc.protocol import Message
    from locust.runners import WorkerRunner

    import locustfiles.llm_user  # noqa: F401
    from collectors.request_recorder import RequestRecorder
    from locustfiles.streaming import StreamTiming
    from locustfiles.timing import build_record

    class SerialisingWorker(WorkerRunner):
        def __init__(self) -> None:  # no master, no ZeroMQ: only the serialisation
            pass

        def send_message(self, msg_type: str, data: Any = None,
                         client_id: str | None = None) -> None:
            Message(msg_type, data, "node").serialize()

    class Env:
        runner = SerialisingWorker()

    recorder = RequestRecorder(Env(), None, max_buffered_records=batch)  # type: ignore[arg-type]
    if freeze:
        gc.collect()
        gc.freeze()
    gc_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
    gc_start = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter_ns()
        else:
            gc_ms[info["generation"]].append((time.perf_counter_ns() - gc_start[0]) / 1e6)

    late_ns: list[int] = []
    stop = time.monotonic() + seconds

    def monitor() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter_ns()
            gevent.sleep(0.001)
            late_ns.append(time.perf_counter_ns() - t0 - 1_000_000)

    def one(i: int) -> None:
        timing = StreamTiming(sent_ns=time.perf_counter_ns(), sent_wall_ns=time.time_ns())
        timing.content_ns = [timing.sent_ns + 5_000_000 * k for k in range(32)]
        timing.last_byte_ns = timing.content_ns[-1]
        timing.usage = {"prompt_tokens": 16, "completion_tokens": 32}
        recorder.on_record(build_record(
            timing, run_id="r", worker_id="h:1:w0", request_id=f"w0-{i}", bucket="short",
            endpoint="completions", target_prompt_tokens=16, max_tokens=32))

    def load() -> None:
        i = 0
        while time.monotonic() < stop:
            for _ in range(rate // 100):
                gevent.spawn(one, i)
                i += 1
            gevent.sleep(0.01)

    def report() -> None:
        while time.monotonic() < stop:
            gevent.sleep(3.0)
            data: dict[str, Any] = {}
            recorder.on_report_to_master("w0", data)
            Message("stats", data, "node").serialize()

    gc.callbacks.append(on_gc)
    try:
        gevent.joinall([gevent.spawn(monitor), gevent.spawn(load), gevent.spawn(report)],
                       timeout=seconds + 30)
    finally:
        gc.callbacks.remove(on_gc)
    late_ns.sort()
    n = len(late_ns)

    def q(p: float) -> float:
        return late_ns[min(n - 1, int(p * n))] / 1e6

    return {"batch": batch, "freeze": freeze, "rate": rate, "wakeups": n,
            "late_p50_ms": q(0.5), "late_p99_ms": q(0.99), "late_p999_ms": q(0.999),
            "late_max_ms": late_ns[-1] / 1e6, "late_over_1ms": sum(x > 1_000_000 for x in late_ns),
            "gc": {g: {"n": len(v), "max_ms": max(v, default=0.0)} for g, v in gc_ms.items()}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.tools.bench.loop_stalls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128, help="records per swarmload_records message")
    p.add_argument("--freeze", action="store_true", help="gc.freeze() first, as workers do")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=2000, help="records per second")
    args = p.parse_args(argv)
    from gevent import monkey

    monkey.patch_all()
    r = probe(args.batch, args.freeze, args.seconds, args.rate)
    gcs = "; ".join(f"gen{g} n={v['n']} max={v['max_ms']:.2f} ms" for g, v in r["gc"].items())
    print(f"batch={r['batch']} freeze={int(r['freeze'])} rate={r['rate']}/s: "
          f"wake-up lateness ms p50 {r['late_p50_ms']:.3f} p99 {r['late_p99_ms']:.3f} "
          f"p99.9 {r['late_p999_ms']:.2f} max {r['late_max_ms']:.2f} "
          f"(>1 ms: {r['late_over_1ms']} of {r['wakeups']}); GC {gcs}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
