"""Where TTFT goes (dashboards.analysis.server_traces) over hand-made client records and server
spans, and the OTLP/HTTP receiver (collectors.otlp_traces) fed a real protobuf export."""

from __future__ import annotations

import gzip

import httpx
import pandas as pd
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.otlp_traces import OtlpTraceReceiver
from collectors.parquet_sink import RollingParquetWriter
from collectors.run_folder import load_table
from collectors.schemas import REQUEST_SCHEMA, SERVER_REQUESTS_SCHEMA, SERVER_REQUESTS_TABLE
from dashboards.analysis.server_traces import (
    format_ttft_parts,
    join_server_spans,
    server_request_id,
    ttft_parts,
    ttft_parts_summary,
)

MS = 1_000_000  # ns


def _requests() -> pd.DataFrame:
    # r1: sent at 0, first token at 100 ms; r2 (chat): sent at 1000 ms, first token 60 ms later;
    # r3: failed; r4: ok but its span never came
    return pd.DataFrame({
        "request_id": ["r1", "r2", "r3", "r4"],
        "http_request_id": ["run-r1", "run-r2", "run-r3", "run-r4"],
        "endpoint": ["completions", "chat", "completions", "completions"],
        "bucket": ["short", "long", "short", "short"],
        "outcome": ["ok", "ok", "http_5xx", "ok"],
        "streamed": [True, True, True, True],
        "sent_wall_ns": [0, 1000 * MS, 2000 * MS, 3000 * MS],
        "ttft_s": [0.100, 0.060, None, 0.050],
    })


def _spans() -> pd.DataFrame:
    return pd.DataFrame({
        # the server stamped r1 10 ms after the send; its TTFT 80 ms (queue 30, prefill 40):
        # api server 10 ms, delivery 100 - 10 - 80 = 10 ms
        "server_request_id": ["cmpl-run-r1-0", "chatcmpl-run-r2", "cmpl-run-r1-0",
                              "cmpl-someone-else-0"],
        "start_wall_ns": [10 * MS, 1002 * MS, 10 * MS, 5 * MS],
        "end_wall_ns": [500 * MS, 1500 * MS, 500 * MS, 9 * MS],
        "ttft_s": [0.080, 0.050, 0.080, 0.001],
        "queue_s": [0.030, 0.0, 0.030, 0.0],
        "prefill_s": [0.040, 0.045, 0.040, 0.001],
        "decode_s": [0.4, 0.4, 0.4, 0.0], "e2e_s": [0.49, 0.5, 0.49, 0.004],
        "prompt_tokens": [10, 20, 10, 1], "output_tokens": [8, 8, 8, 1],
    })


def test_vllm_request_id_follows_the_x_request_id_per_endpoint():
    assert server_request_id("completions", "run-7") == "cmpl-run-7-0"
    assert server_request_id("chat", "run-7") == "chatcmpl-run-7"
    assert server_request_id("completions", None) is None


def test_each_ok_request_with_a_span_splits_into_parts_that_add_up_to_its_ttft():
    joined = join_server_spans(_requests(), _spans())
    assert len(joined) == 4  # a span sent twice does not double a request
    parts = ttft_parts(joined).set_index("request_id")
    assert list(parts.index) == ["r1", "r2"]  # failed and span-less requests are not explained
    r1 = parts.loc["r1"]
    assert r1["before_server_s"] == pytest.approx(0.010)
    assert r1["api_server_s"] == pytest.approx(0.010)
    assert r1["queue_s"] == pytest.approx(0.030)
    assert r1["prefill_s"] == pytest.approx(0.040)
    assert r1["delivery_s"] == pytest.approx(0.010)
    r2 = parts.loc["r2"]
    assert (r2["before_server_s"], r2["delivery_s"]) == pytest.approx((0.002, 0.008))
    names = ["before_server_s", "api_server_s", "queue_s", "prefill_s", "delivery_s"]
    assert parts[names].sum(axis=1).to_numpy() == pytest.approx(
        parts["client_ttft_s"].to_numpy(), abs=1e-12)


def test_summary_gives_p50_p95_per_bucket_and_says_how_many_it_explains():
    joined = join_server_spans(_requests(), _spans())
    summary = ttft_parts_summary(ttft_parts(joined), joined)
    assert list(summary.index) == ["short", "long", "all"]
    assert summary.loc["short", "explained"] == 1 and summary.loc["short", "ok"] == 2
    assert summary.loc["all", "explained"] == 2 and summary.loc["all", "ok"] == 3
    assert summary.loc["short", "queue_p95_s"] == pytest.approx(0.030)
    assert summary.loc["all", "before_server_p50_s"] == pytest.approx(0.006)  # of 10 and 2 ms
    text = format_ttft_parts(summary)
    assert "2 requests with a server span of 3 ok" in text
    assert "engine queue" in text


def _export(request_id: str, start_ns: int) -> bytes:
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    pid = resource_spans.resource.attributes.add()
    pid.key, pid.value.string_value = "vllm.process_id", "4242"
    scope = resource_spans.scope_spans.add()
    span = scope.spans.add()
    span.name, span.trace_id, span.span_id = "llm_request", bytes(range(16)), bytes(range(8))
    span.start_time_unix_nano, span.end_time_unix_nano = start_ns, start_ns + 5 * MS
    for key, value in {"gen_ai.request.id": request_id}.items():
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = key, value
    for key, value in {"gen_ai.latency.time_to_first_token": 0.002,
                       "gen_ai.latency.time_in_queue": 0.0005}.items():
        attribute = span.attributes.add()
        attribute.key, attribute.value.double_value = key, value
    tokens = span.attributes.add()
    tokens.key, tokens.value.int_value = "gen_ai.usage.completion_tokens", 16
    other = scope.spans.add()  # a span of something else: counted, not a row
    other.name, other.start_time_unix_nano = "startup", start_ns
    return message.SerializeToString()


def test_receiver_stores_one_row_per_request_span_from_protobuf_and_gzip(tmp_path):
    receiver = OtlpTraceReceiver(tmp_path, "run-x", ("127.0.0.1", 0), flush_interval_s=60)
    assert receiver.start()
    try:
        plain = httpx.post(receiver.url, content=_export("cmpl-a-0", 1_000),
                           headers={"Content-Type": "application/x-protobuf"})
        zipped = httpx.post(receiver.url, content=gzip.compress(_export("cmpl-b-0", 2_000)),
                            headers={"Content-Type": "application/x-protobuf",
                                     "Content-Encoding": "gzip"})
        junk = httpx.post(receiver.url, content=b"\xff\xfe not protobuf",
                          headers={"Content-Type": "application/x-protobuf"})
    finally:
        receiver.stop()
    assert (plain.status_code, zipped.status_code, junk.status_code) == (200, 200, 400)
    rows = load_table(tmp_path, SERVER_REQUESTS_TABLE, SERVER_REQUESTS_SCHEMA)
    rows = rows.sort_values("start_wall_ns")
    assert list(rows["server_request_id"]) == ["cmpl-a-0", "cmpl-b-0"]
    assert list(rows["server_pid"]) == [4242, 4242]
    assert rows["ttft_s"].tolist() == [0.002, 0.002]
    assert rows["output_tokens"].tolist() == [16, 16]
    assert rows["trace_id"].iloc[0] == bytes(range(16)).hex()
    stats = receiver.stats()
    assert (stats["spans"], stats["other_spans"], stats["bad_exports"]) == (2, 2, 1)


def test_a_study_with_server_traces_gives_every_step_the_receiver_and_splits_ttft(tmp_path):
    from infra.study.runner import StudyRunner, StudyState
    from infra.study.spec import StudySpecError, study_from_dict

    study = {"name": "s", "server_traces": True, "load": {"kind": "concurrency", "steps": [2]},
             "configurations": [{"name": "a", "target": "http://127.0.0.1:8000"}]}
    spec = study_from_dict(study)
    runner = StudyRunner(spec, tmp_path, StudyState(tmp_path, spec))
    runner._traces = {"port": 4318, "wait_s": 6.0}  # as _run_configuration sets it
    run = runner.step_config("a", 1, 2.0, "http://127.0.0.1:8000", "m")
    assert (run.server_traces, run.server_traces_port, run.users) == (True, 4318, 2)
    with pytest.raises(StudySpecError, match="simulator sends no spans"):
        study_from_dict({**study, "configurations": [{"name": "a", "target": "sim"}]})

    # the step's roll-up rows gain the parts over its measured window
    from dashboards.analysis.server_traces import step_ttft_parts

    run_dir = tmp_path / "step"
    for table, schema, frame in (
            ("requests", REQUEST_SCHEMA, _requests().assign(run_id="x", worker_id="w")),
            (SERVER_REQUESTS_TABLE, SERVER_REQUESTS_SCHEMA,
             _spans().assign(run_id="x", host="h", received_wall_ns=0))):
        sink = RollingParquetWriter(run_dir / table, schema)
        sink.append_rows(frame.astype(object).where(frame.notna(), None).to_dict("records"))
        sink.close()
    rows = step_ttft_parts(run_dir, (0, 999 * MS)).set_index("bucket")  # r1 only
    assert rows.loc["all", "span_explained"] == 1
    assert rows.loc["short", "span_api_server_p50_s"] == pytest.approx(0.010)
