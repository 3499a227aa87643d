"""Where each request's TTFT went: the client's record joined to the server's own span.

With ``--server-traces`` a run holds, beside ``requests`` (the client's view), ``server_requests``:
one row per request from vLLM's OpenTelemetry span (``collectors.otlp_traces``). This module joins
the two per request and splits the client's TTFT into parts that add up to it exactly
(docs/METRICS.md, "Where TTFT goes")::

    joined = join_server_spans(requests, server)      # every request, its span's columns or NaN
    parts = ttft_parts(joined)                        # ok streamed requests with a span
    table = ttft_parts_summary(parts)                 # per bucket (+ "all"): P50/P95 of each part
    print(format_ttft_parts(table))

The join key: vLLM names a request after the client's ``X-Request-Id`` header
(``OpenAIServing._base_request_id``): ``cmpl-<id>-<prompt index>`` for ``/v1/completions`` (one
prompt: ``-0``), ``chatcmpl-<id>`` for ``/v1/chat/completions``; the span's ``gen_ai.request.id``
is that name (:func:`server_request_id`).

The parts, on the wall clock (client send and first token: ``sent_wall_ns`` and ``ttft_s`` of the
request; span start: vLLM's arrival time, stamped when the API server began to render the prompt):

- ``before_server_s`` = span start - sent: network, HTTP parsing, request validation and waiting
  for the API server's event loop, before vLLM stamps the request's arrival;
- ``api_server_s`` = server TTFT - queue - prefill: inside vLLM's TTFT but not in the engine's
  queue or prefill: tokenization, the hand-off to the engine core and the first output's way back
  to the API server;
- ``queue_s``: waiting in the engine's scheduler (vLLM's ``time_in_queue``);
- ``prefill_s``: scheduled to first token (vLLM's ``time_in_model_prefill``);
- ``delivery_s`` = client first token - (span start + server TTFT): detokenizing, the SSE chunk,
  the network back and the client's read.

``before_server_s`` and ``delivery_s`` compare two hosts' wall clocks when the client and the
server do not share one: an offset between them moves time from one part to the other (their sum
is unaffected). On one host (or with NTP-synced hosts, within its error) both are as measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.run_folder import load_requests, load_table
from collectors.schemas import OUTCOME_OK, SERVER_REQUESTS_SCHEMA, SERVER_REQUESTS_TABLE

# (column, label) in the order they happen
TTFT_PARTS = (
    ("before_server_s", "before vLLM: network, HTTP"),
    ("api_server_s", "API server: tokenize, IPC"),
    ("queue_s", "engine queue"),
    ("prefill_s", "prefill (first step)"),
    ("delivery_s", "delivery: detok, SSE, net"),
)
SERVER_COLUMNS = ("server_request_id", "start_wall_ns", "end_wall_ns", "ttft_s", "queue_s",
                  "prefill_s", "decode_s", "e2e_s", "prompt_tokens", "output_tokens")
PERCENTILES = (50, 95)
# the request columns the join and the parts read (a run's itl_s lists stay on disk)
REQUEST_COLUMNS = ("request_id", "http_request_id", "endpoint", "bucket", "outcome", "streamed",
                   "sent_wall_ns", "ttft_s")


def server_request_id(endpoint: str | None, http_request_id: str | None) -> str | None:
    """The id vLLM gives a request sent with ``X-Request-Id: http_request_id`` (one prompt)."""
    if not http_request_id:
        return None
    if endpoint == "chat":
        return f"chatcmpl-{http_request_id}"
    return f"cmpl-{http_request_id}-0"


def load_server_requests(run_dir: str | Path) -> pd.DataFrame:
    """The run's ``server_requests`` table (empty frame when the run has none)."""
    return load_table(run_dir, SERVER_REQUESTS_TABLE, SERVER_REQUESTS_SCHEMA)


def join_server_spans(requests: pd.DataFrame, server: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with the span's columns beside each row (prefixed ``server_``; NaN when the
    request has no span). A span seen twice (an export retried) counts once."""
    out = requests.copy()
    out["server_request_id"] = [server_request_id(e, h) for e, h in
                                zip(out.get("endpoint", pd.Series([None] * len(out))),
                                    out["http_request_id"], strict=True)]
    spans = server.loc[:, [c for c in SERVER_COLUMNS if c in server.columns]]
    spans = spans.drop_duplicates("server_request_id", keep="first")
    spans = spans.rename(columns={c: f"server_{c}" for c in spans.columns
                                  if c != "server_request_id"})
    return out.merge(spans, on="server_request_id", how="left", validate="many_to_one")


def ttft_parts(joined: pd.DataFrame) -> pd.DataFrame:
    """One row per ok, streamed request that has a span: the TTFT parts of the module docstring
    (seconds), with ``client_ttft_s``, ``server_ttft_s`` and ``bucket``. The five parts add up
    to ``client_ttft_s`` (up to float rounding)."""
    ok = joined[(joined["outcome"] == OUTCOME_OK) & joined["ttft_s"].notna()
                & joined["server_start_wall_ns"].notna()]
    if "streamed" in ok.columns:
        ok = ok[ok["streamed"].fillna(True).astype(bool)]
    client_ttft = ok["ttft_s"].to_numpy(dtype=np.float64)
    server_ttft = ok["server_ttft_s"].to_numpy(dtype=np.float64)
    queue = ok["server_queue_s"].to_numpy(dtype=np.float64)
    prefill = ok["server_prefill_s"].to_numpy(dtype=np.float64)
    # differences of int64 nanoseconds first, then seconds: keeps sub-microsecond precision
    before = (ok["server_start_wall_ns"].astype("int64") - ok["sent_wall_ns"].astype("int64")
              ).to_numpy(dtype=np.float64) / 1e9
    return pd.DataFrame({
        "request_id": ok["request_id"].to_numpy(),
        "bucket": ok["bucket"].to_numpy() if "bucket" in ok.columns else None,
        "sent_wall_ns": ok["sent_wall_ns"].to_numpy(),
        "client_ttft_s": client_ttft,
        "server_ttft_s": server_ttft,
        "before_server_s": before,
        "api_server_s": server_ttft - queue - prefill,
        "queue_s": queue,
        "prefill_s": prefill,
        "delivery_s": client_ttft - before - server_ttft,
    })


def ttft_parts_summary(parts: pd.DataFrame, joined: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per bucket and ``all``: requests explained, ok requests (from ``joined`` when given), and
    P50/P95 of the client's TTFT, the server's TTFT and each part (columns ``<part>_p50`` ...)."""
    rows = []
    groups = [("all", parts)]
    if "bucket" in parts.columns and parts["bucket"].notna().any():
        order = {"short": 0, "medium": 1, "long": 2}  # as every other swarmload table
        buckets = sorted(parts["bucket"].dropna().unique(), key=lambda b: (order.get(b, 3), b))
        groups = [(str(b), parts[parts["bucket"] == b]) for b in buckets] + groups
    for name, group in groups:
        row: dict[str, object] = {"bucket": name, "explained": len(group)}
        if joined is not None:
            ok = joined[joined["outcome"] == OUTCOME_OK]
            if name != "all":
                ok = ok[ok["bucket"] == name]
            row["ok"] = len(ok)
        for column in ("client_ttft_s", "server_ttft_s", *(c for c, _ in TTFT_PARTS)):
            for q in PERCENTILES:
                row[f"{column[:-2]}_p{q}_s"] = percentile(group[column], q)
        rows.append(row)
    return pd.DataFrame(rows).set_index("bucket")


def ttft_parts_table_ms(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as a display table: one row per part (client and server TTFT first), one
    column per bucket and percentile, in ms."""
    labels = [("client_ttft", "client TTFT"), ("server_ttft", "vLLM's TTFT (span)"),
              *((c[:-2], label) for c, label in TTFT_PARTS)]
    table = {}
    for bucket in summary.index:
        for q in PERCENTILES:
            table[f"{bucket} P{q}"] = [summary.loc[bucket, f"{key}_p{q}_s"] * 1e3
                                       for key, _ in labels]
    return pd.DataFrame(table, index=[label for _, label in labels])


def format_ttft_parts(summary: pd.DataFrame) -> str:
    """Fixed-width text of :func:`ttft_parts_table_ms` with how many requests it explains."""
    if summary.empty or summary.loc["all", "explained"] == 0:
        return "where TTFT goes: no request has a server span"
    table = ttft_parts_table_ms(summary)
    width = max(len(label) for label in table.index)
    lines = []
    all_row = summary.loc["all"]
    share = (f" of {int(all_row['ok'])} ok" if "ok" in summary.columns else "")
    lines.append(f"where TTFT goes (ms; {int(all_row['explained'])} requests with a server "
                 f"span{share}):")
    lines.append(" " * width + "".join(f"{c:>11}" for c in table.columns))
    for label, values in table.iterrows():
        lines.append(f"{label:<{width}}" + "".join(
            f"{v:>11.2f}" if np.isfinite(v) else f"{'-':>11}" for v in values))
    return "\n".join(lines)


def run_ttft_parts(run_dir: str | Path) -> pd.DataFrame | None:
    """:func:`ttft_parts_summary` of a run folder; None when it has no server spans."""
    server = load_server_requests(run_dir)
    if server.empty:
        return None
    joined = join_server_spans(load_requests(run_dir, REQUEST_COLUMNS), server)
    return ttft_parts_summary(ttft_parts(joined), joined)


STEP_PREFIX = "span_"  # steps.parquet columns of a study with server_traces


def step_ttft_parts(run_dir: str | Path, window: tuple[int, int]) -> pd.DataFrame | None:
    """A study step's parts over its measured window (requests sent in it), one row per bucket
    (and ``all``), columns prefixed ``span_``: ``span_explained`` and ``span_<part>_p50_s`` /
    ``_p95_s``. None when the step has no server spans."""
    server = load_server_requests(run_dir)
    if server.empty:
        return None
    requests = load_requests(run_dir, REQUEST_COLUMNS)
    sent = requests["sent_wall_ns"]
    requests = requests[(sent >= window[0]) & (sent < window[1])]
    summary = ttft_parts_summary(ttft_parts(join_server_spans(requests, server)))
    return summary.add_prefix(STEP_PREFIX).reset_index()
