"""HAProxy's own line per request (``<run>/balancer/haproxy.log``): what the load balancer saw.

``infra.targets.haproxy`` configures HAProxy to log every request with :data:`LOG_FORMAT` on its
stderr, which is the run's balancer log. Each line names the request by the client's
``X-Request-Id`` (the record's ``http_request_id``), the server that took it (``<NOSRV>``: none,
e.g. a 503 while every server was down), the status, HAProxy's termination state (``SD--``: the
server aborted during the data; ``----``: normal) and its retries (``+N``: redispatched to
another server), so a fault's failures can be checked request by request against the records.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pandas as pd

BALANCER_DIR = "balancer"  # <run>/balancer/: HAProxy's configuration, admin socket and log
HAPROXY_LOG = "haproxy.log"
REQUEST_LOG_PREFIX = "swarmload-request"
# HAProxy log-format: the captured X-Request-Id is capture.req.hdr(0)
LOG_FORMAT = (f"{REQUEST_LOG_PREFIX} id=%[capture.req.hdr(0)] srv=%s status=%ST term=%tsc "
              "retries=%rc ta_ms=%Ta bytes=%B")
COLUMNS = ("request_id", "server", "status", "term", "retries", "redispatched", "ta_ms",
           "bytes")


def parse_request_log(text: str) -> pd.DataFrame:
    """The request lines of a balancer log as rows of :data:`COLUMNS` (``status`` -1: none)."""
    rows = []
    for line in text.splitlines():
        at = line.find(REQUEST_LOG_PREFIX + " ")
        if at < 0:
            continue
        fields = dict(part.split("=", 1) for part in line[at:].split(" ")[1:] if "=" in part)
        retries = fields.get("retries", "0")
        with contextlib.suppress(ValueError):
            rows.append({"request_id": fields.get("id", "-"), "server": fields.get("srv", ""),
                         "status": int(fields.get("status", "-1")),
                         "term": fields.get("term", ""),
                         "retries": int(retries.lstrip("+")),
                         "redispatched": retries.startswith("+"),
                         "ta_ms": int(fields.get("ta_ms", "-1")),
                         "bytes": int(fields.get("bytes", "0"))})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def load_balancer_requests(run_dir: str | Path) -> pd.DataFrame | None:
    """The run's balancer log as rows, or None when the run had no HAProxy."""
    path = Path(run_dir) / BALANCER_DIR / HAPROXY_LOG
    if not path.is_file():
        return None
    return parse_request_log(path.read_text(errors="replace"))


def balancer_failed(rows: pd.DataFrame) -> pd.Series:
    """Requests HAProxy saw fail: a server-side termination (``S...``: aborted, closed) or a
    5xx of its own or of the server (-1: no answer)."""
    term = rows["term"].astype(str)
    return term.str.startswith("S") | (rows["status"] >= 500) | (rows["status"] < 0)
