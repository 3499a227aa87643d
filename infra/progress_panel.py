"""Live progress of ``swarmload run`` and ``swarmload study run``, drawn from ``progress.json``.

The master rewrites ``<run>/progress.json`` every second (``collectors/progress.py``); this view
reads it on the orchestrator's wait loop and shows, on a terminal, one updating rich panel
(elapsed / remaining, ok and failed per bucket, failures per class, req/s and P95 TTFT of the
last 10 s, generator warnings as they happen), or, when stdout is not a terminal (CI, a pipe, a
log file), one plain line every ``plain_every_s`` seconds and each warning once as it appears.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from collectors.progress import PROGRESS_FILE
from dashboards.analysis.runs import LAG_WARN_S

MODES = ("auto", "rich", "plain", "off")
WARN_REPEAT_S = 30.0  # a warning that holds is said again at most this often (plain lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def live_warnings(window: dict[str, Any], events_budget_per_s: float | None = None
                  ) -> list[str]:
    """Generator warnings of the last window, with the summary's own limits; with the workers'
    budget of streamed events (``infra/workers_auto.py``: workers x one worker's), a load
    that outgrows it, before events start to be read together."""
    out = []
    events = window.get("events_per_s")
    if events_budget_per_s and events and events > events_budget_per_s:
        out.append(f"OUTGROWING ITS WORKERS: {events:,.0f} streamed events/s > the workers' "
                   f"budget of {events_budget_per_s:,.0f}; past it a worker reads events "
                   "together and its times become the later ones': add workers or lower the "
                   "load")
    lag = window.get("schedule_lag_p99_s")
    if lag is not None and lag > LAG_WARN_S:
        out.append(f"FELL BEHIND: P99 schedule lag {_ms(lag)} > {_ms(LAG_WARN_S)} "
                   "(the generator, not the server, is shaping the load)")
    if window.get("generator_dropped"):
        out.append(f"DROPPED {window['generator_dropped']} arrivals in the last "
                   f"{window.get('seconds', 10):g} s (in-flight cap)")
    return out


class RunProgress:
    """Use as a context manager around the wait loop; call :meth:`tick` about once a second."""

    def __init__(self, run_dir: Path, duration_s: float, *, title: str, mode: str = "auto",
                 plain_every_s: float = 10.0, stream: Any = None,
                 events_budget_per_s: float | None = None) -> None:
        self.events_budget_per_s = events_budget_per_s
        self.path = Path(run_dir) / PROGRESS_FILE
        self.duration_s = duration_s
        self.title = title
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self.plain_every_s = plain_every_s
        self.started = time.monotonic()
        self._last_plain = self.started
        self._said: dict[str, float] = {}
        self.warnings: list[tuple[float, str]] = []  # (elapsed s, text), as they happened
        self._live: Any = None

    def __enter__(self) -> RunProgress:
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self._live = Live(self._render({}), console=console, refresh_per_second=2,
                              transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self.tick()
            self._live.__exit__(*exc)
            self._live = None

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _elapsed(self, state: dict[str, Any]) -> float:
        first = state.get("first_sent_wall_ns")
        if first:
            return max(0.0, time.time() - first / 1e9)
        return 0.0

    def tick(self) -> None:
        if self.mode == "off":
            return
        state = self._read()
        elapsed = self._elapsed(state)
        for text in live_warnings(state.get("window") or {}, self.events_budget_per_s):
            key = text.split(":")[0]
            last = self._said.get(key)
            now = time.monotonic()
            if last is None or now - last > WARN_REPEAT_S:
                self._said[key] = now
                self.warnings.append((elapsed, text))
                if self.mode == "plain":
                    print(f"[swarmload] {elapsed:5.0f}s WARNING {text}", file=self.stream,
                          flush=True)
        if self._live is not None:
            self._live.update(self._render(state))
        elif self.mode == "plain" and time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            print(self.plain_line(state), file=self.stream, flush=True)

    def plain_line(self, state: dict[str, Any]) -> str:
        elapsed = self._elapsed(state)
        ok = sum(c["ok"] for c in (state.get("by_bucket") or {}).values())
        failed = sum(c["failed"] for c in (state.get("by_bucket") or {}).values())
        window = state.get("window") or {}
        classes = ", ".join(f"{k} {v}" for k, v in sorted(
            (state.get("failed_by_outcome") or {}).items()))
        return (f"[swarmload] {self.title}: {elapsed:.0f}/{self.duration_s:.0f} s, ok {ok}, "
                f"failed {failed}{f' ({classes})' if classes else ''}; last "
                f"{window.get('seconds', 10):g} s: {window.get('req_per_s', 0.0):.1f} req/s, "
                f"P95 TTFT {_ms(window.get('ttft_p95_s'))}")

    def _render(self, state: dict[str, Any]) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        elapsed = self._elapsed(state)
        remaining = max(0.0, self.duration_s - elapsed)
        head = Text(f"elapsed {elapsed:4.0f} s   remaining {remaining:4.0f} s   "
                    f"requests {state.get('requests', 0)}")
        table = Table(box=None, pad_edge=False)
        for column in ("bucket", "ok", "failed"):
            table.add_column(column, justify="left" if column == "bucket" else "right")
        for bucket, counts in sorted((state.get("by_bucket") or {}).items()):
            table.add_row(bucket, str(counts["ok"]),
                          Text(str(counts["failed"]), style="red" if counts["failed"] else ""))
        window = state.get("window") or {}
        parts: list[Any] = [head, table, Text(
            f"last {window.get('seconds', 10):g} s: {window.get('req_per_s', 0.0):.1f} req/s, "
            f"P95 TTFT {_ms(window.get('ttft_p95_s'))}")]
        failures = state.get("failed_by_outcome") or {}
        if failures:
            parts.append(Text("failures: " + ", ".join(
                f"{k} {v}" for k, v in sorted(failures.items())), style="red"))
        generator = state.get("generator_outcomes") or {}
        if generator:
            parts.append(Text("not sent or not finished (generator side): " + ", ".join(
                f"{k} {v}" for k, v in sorted(generator.items()))))
        for at, text in self.warnings[-4:]:
            parts.append(Text(f"{at:4.0f} s WARNING {text}", style="bold yellow"))
        return Panel(Group(*parts), title=self.title, expand=False)
