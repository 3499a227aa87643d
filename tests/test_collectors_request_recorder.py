"""The worker side of collectors.request_recorder: records leave in small batches (serialising a
big batch blocks the loop that timestamps tokens) and none is lost or duplicated."""

from __future__ import annotations

from typing import Any

from locust.runners import WorkerRunner

from collectors.request_recorder import RECORDS_KEY, RequestRecorder


class _Worker(WorkerRunner):
    """A WorkerRunner that only collects what it would send (no ZeroMQ, no master)."""

    def __init__(self) -> None:  # the real one connects to a master
        self.sent_messages: list[tuple[str, Any]] = []

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent_messages.append((msg_type, data))


class _Env:
    def __init__(self) -> None:
        self.runner = _Worker()


def test_worker_sends_records_in_small_batches_and_the_rest_on_the_report() -> None:
    env = _Env()
    recorder = RequestRecorder(env, None)  # type: ignore[arg-type]
    for i in range(300):
        recorder.on_record({"request_id": f"r{i}", "worker_id": "w0", "ttft_s": 0.01 * i})
    batches = [data for kind, data in env.runner.sent_messages if kind == RECORDS_KEY]
    assert [len(b["request_id"]) for b in batches] == [128, 128]
    report: dict[str, Any] = {}
    recorder.on_report_to_master("w0", report)
    ids = [i for b in batches for i in b["request_id"]] + report[RECORDS_KEY]["request_id"]
    assert ids == [f"r{i}" for i in range(300)]
    assert recorder.sent == 300
    report = {}
    recorder.on_report_to_master("w0", report)
    assert RECORDS_KEY not in report  # nothing twice
