"""Receive a server's OpenTelemetry spans over OTLP/HTTP into the ``server_requests`` table.

vLLM sends one span per finished request (``llm_request``) when started with
``--otlp-traces-endpoint URL`` and ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (its
default protocol is gRPC). This receiver answers ``POST /v1/traces`` as the OTLP/HTTP
specification says: the body is an ``ExportTraceServiceRequest``, binary protobuf
(``application/x-protobuf``, optionally gzip) or its JSON mapping (``application/json``), decoded
with the ``opentelemetry-proto`` package, never by hand. Each span that carries
``gen_ai.request.id`` becomes one row of ``SERVER_REQUESTS_SCHEMA``; other spans are counted only.

Usage::

    receiver = OtlpTraceReceiver(run_dir, run_id, ("127.0.0.1", 4318))
    receiver.start()      # listening; vLLM: --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces
    ...
    receiver.stop()       # closes the socket, flushes <run_dir>/server_requests/

vLLM exports in batches (OpenTelemetry's BatchSpanProcessor, every ``OTEL_BSP_SCHEDULE_DELAY``
ms, 5000 by default): a run waits that long after its last request before stopping the receiver.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import zlib
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from collectors.parquet_sink import RollingParquetWriter
from collectors.periodic import RunSampler
from collectors.remote import wall_ns
from collectors.schemas import SERVER_REQUESTS_SCHEMA, SERVER_REQUESTS_TABLE

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 * 1024 * 1024  # a batch of 512 spans is ~200 KB; refuse what is absurd
# vLLM's span attributes (vllm/tracing/utils.py SpanAttributes) -> columns
ATTRIBUTE_COLUMNS = {
    "gen_ai.latency.time_in_queue": "queue_s",
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.time_in_model_inference": "inference_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
}
REQUEST_ID_ATTRIBUTE = "gen_ai.request.id"


def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as the Python value it holds (arrays/maps as lists/dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes_dict(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in attributes}


def decode_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An export request's body (protobuf, or OTLP JSON) -> the message. Raises ValueError."""
    message = ExportTraceServiceRequest()
    try:
        if "json" in content_type:
            # OTLP/JSON writes trace and span ids as hex, not the base64 of protobuf's generic
            # JSON mapping: the ids decoded here are wrong, and receive() drops them.
            json_format.Parse(body, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError / ParseError
        raise ValueError(f"not an ExportTraceServiceRequest: {exc}") from exc
    return message


def span_rows(message: ExportTraceServiceRequest, *, run_id: str, host: str,
              received_wall_ns: int) -> tuple[list[dict[str, Any]], int]:
    """(one row per span that names a request, number of other spans)."""
    rows: list[dict[str, Any]] = []
    others = 0
    for resource_spans in message.resource_spans:
        resource = attributes_dict(resource_spans.resource.attributes)
        pid = resource.get("vllm.process_id")
        try:
            server_pid = int(pid) if pid is not None else None
        except (TypeError, ValueError):
            server_pid = None
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = attributes_dict(span.attributes)
                request_id = attrs.get(REQUEST_ID_ATTRIBUTE)
                if request_id is None or not span.start_time_unix_nano:
                    others += 1
                    continue
                row: dict[str, Any] = {
                    "run_id": run_id, "host": host, "received_wall_ns": received_wall_ns,
                    "server_request_id": str(request_id), "span_name": span.name,
                    "trace_id": span.trace_id.hex() or None,
                    "span_id": span.span_id.hex() or None,
                    "service": resource.get("service.name"), "server_pid": server_pid,
                    "start_wall_ns": int(span.start_time_unix_nano),
                    "end_wall_ns": int(span.end_time_unix_nano) or None,
                    "attributes": json.dumps(attrs, sort_keys=True, separators=(",", ":"),
                                             default=str),
                }
                for key, column in ATTRIBUTE_COLUMNS.items():
                    value = attrs.get(key)
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        row[column] = None
                    elif column.endswith("_s"):
                        row[column] = float(value)
                    else:
                        row[column] = int(value)
                rows.append(row)
    return rows, others


class OtlpTraceReceiver(RunSampler):
    """An OTLP/HTTP trace endpoint on ``address`` writing ``<run_dir>/server_requests``.

    The HTTP server answers on its own threads; the sampler's beat only flushes the table.
    ``address`` port 0 takes a free port (read :attr:`url` after :meth:`start`).
    """

    name = "server_traces"

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str,
                 address: tuple[str, int], *, host: str | None = None,
                 flush_interval_s: float = 2.0) -> None:
        super().__init__(run_dir, run_id, 1.0, host, flush_interval_s)
        self.address = address
        self.exports = 0
        self.spans = 0
        self.other_spans = 0
        self.bad_exports = 0
        self._server: ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None
        self._writer: RollingParquetWriter | None = None
        self._count_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The endpoint to give vLLM's ``--otlp-traces-endpoint``."""
        address = self._server.server_address if self._server else self.address
        return f"http://{address[0]!s}:{address[1]}{TRACES_PATH}"

    def receive(self, body: bytes, content_type: str, content_encoding: str = "") -> int:
        """Decode one export and store its rows; returns how many. Raises ValueError."""
        if content_encoding == "gzip":
            body = gzip.decompress(body)
        elif content_encoding == "deflate":
            body = zlib.decompress(body)
        message = decode_request(body, content_type)
        rows, others = span_rows(message, run_id=self.run_id, host=self.host,
                                 received_wall_ns=wall_ns())
        if "json" in content_type:
            for row in rows:
                row["trace_id"] = row["span_id"] = None
        assert self._writer is not None
        self._writer.append_rows(rows)
        with self._count_lock:
            self.exports += 1
            self.spans += len(rows)
            self.other_spans += others
        return len(rows)

    def setup(self) -> bool:
        self._writer = self.open_table(SERVER_REQUESTS_TABLE, SERVER_REQUESTS_SCHEMA)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the exporter keeps its connection

            def log_message(self, *_args: Any) -> None:  # no line per export on stderr
                pass

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if self.path.split("?")[0] != TRACES_PATH:
                    self._answer(404, b"only POST /v1/traces", "text/plain")
                    return
                if length <= 0 or length > MAX_BODY_BYTES:
                    self._answer(400, b"missing or oversized body", "text/plain")
                    return
                body = self.rfile.read(length)
                content_type = self.headers.get("Content-Type", "application/x-protobuf")
                try:
                    receiver.receive(body, content_type,
                                     self.headers.get("Content-Encoding", "").lower())
                except (ValueError, OSError, EOFError, zlib.error) as exc:
                    with receiver._count_lock:
                        receiver.bad_exports += 1
                        receiver.last_error = str(exc)[:300]
                    # 400: the exporter must not retry a body it will send the same way again
                    self._answer(400, str(exc)[:300].encode(), "text/plain")
                    return
                if "json" in content_type:
                    self._answer(200, b"{}", "application/json")
                else:
                    self._answer(200, ExportTraceServiceResponse().SerializeToString(),
                                 "application/x-protobuf")

        try:
            self._server = ThreadingHTTPServer(self.address, Handler)
        except OSError as exc:  # port taken: no spans, said in stats and on stderr
            self.last_error = f"cannot listen on {self.address[0]}:{self.address[1]}: {exc}"
            print(f"swarmload collect: {self.last_error}", file=sys.stderr, flush=True)
            self._writer.close()
            return False
        self._server.daemon_threads = True
        self._server_thread = threading.Thread(target=self._server.serve_forever,
                                               name="swarmload-otlp", daemon=True)
        self._server_thread.start()
        return True

    def sample(self, wall_ns: int) -> None:
        assert self._writer is not None
        self._writer.maybe_flush()

    def teardown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._writer is not None:
            self._writer.close()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out.update(url=self.url, exports=self.exports, spans=self.spans,
                   other_spans=self.other_spans, bad_exports=self.bad_exports)
        return out
