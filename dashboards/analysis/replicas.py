"""Per-replica breakdown of a run with several replicas (HAProxy or client-side balancing).

Pure pandas. Three views of the same requests, one row per replica, side by side:

- the client's records, grouped by their ``replica`` column (HAProxy's ``X-Served-By`` server
  name, or the base URL a worker chose): requests, ok, errors, share of ok, output tokens, exact
  TTFT/E2E percentiles of the ok ones (METRICS.md);
- the replica's own ``/metrics`` (``server_metrics`` rows whose ``target`` is that replica's
  ``/metrics`` URL): ``server_ok``, the increase of ``vllm:request_success_total`` (summed over
  label sets) from the first to the last scrape, and ``server_generation_tokens``, the same for
  ``vllm:generation_tokens_total``;
- the load balancer's counters (``manifest["balancer"]``, HAProxy's ``show stat``):
  ``lb_2xx`` responses with a 2xx status, ``lb_sessions``.

Usage::

    table = per_replica(load_requests(run), load_server_metrics(run), load_manifest(run))
    print(format_replicas(table))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.schemas import OUTCOME_OK
from collectors.server_figures import GENERATION_TOKENS, SUCCESS, select


def replica_urls(manifest: Mapping[str, Any] | None) -> dict[str, str]:
    """Replica name (as records carry it) -> base URL, from ``manifest.target.replicas``."""
    replicas = ((manifest or {}).get("target") or {}).get("replicas") or []
    return {str(r["name"]): str(r["url"]).rstrip("/") for r in replicas}


def _counter_increase(server: pd.DataFrame, sample: str) -> dict[str, float]:
    """target URL -> increase of a counter (summed over label sets) over the run's scrapes."""
    ok = select(server, sample)
    if ok.empty:
        return {}
    per_scrape = ok.groupby(["target", "wall_ns"])["value"].sum().reset_index()
    out = {}
    for target, rows in per_scrape.groupby("target"):
        values = rows.sort_values("wall_ns")["value"].to_numpy()
        out[str(target)] = float(values[-1] - values[0])
    return out


def per_replica(requests: pd.DataFrame, server: pd.DataFrame | None = None,
                manifest: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per replica (index ``replica``); empty when no record names a replica."""
    named = requests[requests["replica"].notna()] if "replica" in requests else requests.iloc[:0]
    urls = replica_urls(manifest)
    names = sorted(set(named["replica"].astype(str)) | set(urls))
    if not names:
        return pd.DataFrame()
    rows = []
    total_ok = int((named["outcome"] == OUTCOME_OK).sum())
    for name in names:
        mine = named[named["replica"].astype(str) == name]
        ok = mine[mine["outcome"] == OUTCOME_OK]
        rows.append({
            "replica": name, "url": urls.get(name, name if "://" in name else None),
            "requests": len(mine), "ok": len(ok), "errors": len(mine) - len(ok),
            "ok_share": len(ok) / total_ok if total_ok else float("nan"),
            "output_tokens": int(ok["output_tokens"].fillna(0).sum()),
            "ttft_p50_s": percentile(ok["ttft_s"], 50), "ttft_p95_s": percentile(ok["ttft_s"], 95),
            "e2e_p50_s": percentile(ok["e2e_s"], 50), "e2e_p95_s": percentile(ok["e2e_s"], 95),
        })
    table = pd.DataFrame(rows).set_index("replica")
    if server is not None and not server.empty:
        for column, sample in (("server_ok", SUCCESS),
                               ("server_generation_tokens", GENERATION_TOKENS)):
            increase = _counter_increase(server, sample)
            table[column] = [increase.get(f"{url}/metrics", float("nan")) if url else float("nan")
                             for url in table["url"]]
    servers = ((manifest or {}).get("balancer") or {}).get("servers") or []
    if servers:
        by_name = {str(s["server"]): s for s in servers}
        table["lb_2xx"] = [by_name.get(n, {}).get("hrsp_2xx", np.nan) for n in table.index]
        table["lb_sessions"] = [by_name.get(n, {}).get("stot", np.nan) for n in table.index]
    return table


def format_replicas(table: pd.DataFrame) -> str:
    """The per-replica table as text for the terminal summary."""
    if table.empty:
        return ""
    cols = ["requests", "ok", "errors", "ok_share", "ttft_p50_s", "ttft_p95_s", "e2e_p50_s",
            "output_tokens", "server_ok", "lb_2xx"]
    head = (f"{'replica':<24} {'requests':>8} {'ok':>7} {'errors':>6} {'share':>6} "
            f"{'TTFT p50':>9} {'TTFT p95':>9} {'E2E p50':>9} {'out tok':>8} {'/metrics ok':>11} "
            f"{'LB 2xx':>7}")
    lines = ["per replica (TTFT/E2E in ms; /metrics ok: the replica's own "
             "request_success increase; LB 2xx: HAProxy's count)", head]
    for name, row in table.iterrows():
        values = {c: row.get(c, float("nan")) for c in cols}

        def num(v: Any, fmt: str) -> str:
            return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v)

        lines.append(
            f"{str(name)[:24]:<24} {values['requests']:>8} {values['ok']:>7} "
            f"{values['errors']:>6} {num(values['ok_share'], '{:.1%}'):>6} "
            f"{num(values['ttft_p50_s'] * 1e3, '{:.2f}'):>9} "
            f"{num(values['ttft_p95_s'] * 1e3, '{:.2f}'):>9} "
            f"{num(values['e2e_p50_s'] * 1e3, '{:.2f}'):>9} {values['output_tokens']:>8} "
            f"{num(values['server_ok'], '{:.0f}'):>11} {num(values['lb_2xx'], '{:.0f}'):>7}")
    return "\n".join(lines)
