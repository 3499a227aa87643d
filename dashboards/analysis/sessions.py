"""Session figures (docs/guides/sessions.md): per turn, per session, per tool loop. Pure pandas.

- :func:`per_turn`: by turn index, the ok turns' TTFT/TPOT/E2E P50 and P95, history length, the
  prefix-cache hit rate the server reported (``cached_tokens`` / ``prompt_tokens`` over the
  turn's requests) beside the share a perfect cache would reuse (``reusable_tokens`` /
  ``prompt_tokens``), and the turns not sent (``session_ended``, ``worker_lost``, ...).
- :func:`per_session`: duration (first send to last byte), turns done (ok) of turns, how it
  ended, and session goodput: every turn ok and within the SLO (TTFT, TPOT, E2E limits, as a
  study's per-request SLO).
- :func:`tool_loops`: per loop, the time to the tool call (the ``tool_call`` request's E2E), the
  tool round trip (``tool_wait_s``) and the final answer's TTFT.
- :func:`ttft_by_history`: TTFT P50 against history length, in bins.
- :func:`arrival_figures`: what a rate plan offered and the server achieved, counted in the
  plan's own units, sessions (or agent tasks) that arrived, not their turns
  (``docs/METRICS-STUDIES.md``, "Sessions and tasks under a rate plan").

The terminal's lines and the Run page's Sessions section show plain sessions
(:func:`plain_sessions`); agent tasks have their own (:mod:`dashboards.analysis.tasks`).

A turn that is a tool loop counts once in :func:`per_turn` (its ``tool_call`` request, the one
every turn has); the final answer's figures are in :func:`tool_loops`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from collectors.percentiles import percentile
from collectors.schemas import GENERATOR_OUTCOMES, OUTCOME_OK
from dashboards.analysis.envelope import even_positions
from dashboards.analysis.slo import meets_request_slos

# The SLO a session must meet on every turn for session goodput when the caller names none.
DEFAULT_SESSION_SLO: dict[str, Any] = {"ttft_ms": 2000.0, "tpot_ms": 200.0}
# the requests columns the session figures read
SESSION_COLUMNS = ["session_id", "turn", "turn_step", "outcome", "ttft_s", "tpot_s", "e2e_s",
                   "sent_wall_ns", "prompt_tokens", "history_tokens", "reusable_tokens",
                   "cached_tokens", "tool_calls", "tool_wait_s"]


def session_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests of a run that belong to sessions (empty when it has none)."""
    if "session_id" not in requests:
        return requests.iloc[0:0]
    return requests[requests["session_id"].notna()]


def plain_sessions(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests of plain sessions: agent tasks' calls (``depends_on`` set) left out, since a
    task's call index is no turn of one conversation (their figures:
    :mod:`dashboards.analysis.tasks`)."""
    sessions = session_requests(requests)
    if "depends_on" not in sessions:
        return sessions
    return sessions[sessions["depends_on"].isna()]


ARRIVAL_COLUMNS = ["session_id", "depends_on", "outcome", "scheduled_wall_ns", "sent_wall_ns",
                   "e2e_s"]


def arrival_unit(requests: pd.DataFrame) -> str:
    """What a rate plan's arrivals are for these requests: "tasks" (agent tasks: records with
    ``depends_on``), "sessions", or "" (lone requests)."""
    sessions = session_requests(requests)
    if sessions.empty:
        return ""
    if "depends_on" in sessions and sessions["depends_on"].notna().any():
        return "tasks"
    return "sessions"


def per_arrival(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per session (or task): ``session_id``, ``arrival_ns`` (its earliest scheduled
    time: the arrival plan's, at which its first turn or its calls that wait on none were due;
    its first send where nothing was scheduled), ``end_ns`` (its last byte; NaN when nothing was
    sent), ``ok`` (every record ok) and ``requests`` (its records)."""
    sessions = session_requests(requests)
    sent = ~sessions["outcome"].isin(GENERATOR_OUTCOMES)
    frame = pd.DataFrame({
        "session_id": sessions["session_id"],
        "scheduled": sessions["scheduled_wall_ns"].astype("float64"),
        "first": sessions["sent_wall_ns"].astype("float64"),
        "end": (sessions["sent_wall_ns"].astype("float64")
                + sessions["e2e_s"].astype("float64").fillna(0.0) * 1e9).where(sent),
        "ok": sessions["outcome"] == OUTCOME_OK})
    by = frame.groupby("session_id", sort=False)
    arrival = by["scheduled"].min().fillna(by["first"].min())
    return pd.DataFrame({"session_id": arrival.index, "arrival_ns": arrival.to_numpy(),
                         "end_ns": by["end"].max().to_numpy(),
                         "ok": by["ok"].all().to_numpy(dtype=bool),
                         "requests": by.size().to_numpy()})


def completion_stretch(arrival_ns: np.ndarray, end_ns: np.ndarray) -> float:
    """How much faster the ends spread out than the arrivals: the least-squares slope of each
    end against its arrival. 1 when the last to arrive take as long as the first (however
    their own durations vary); above 1 when the server falls behind (a queue that grows). NaN
    with fewer than two, or arrivals all at once, or a slope <= 0."""
    a = np.asarray(arrival_ns, dtype=np.float64)
    e = np.asarray(end_ns, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(e)
    a, e = a[keep], e[keep]
    if a.size < 2:
        return float("nan")
    a = a - a.mean()
    if not (a ** 2).sum() > 0:
        return float("nan")
    slope = float((a * (e - e.mean())).sum() / (a ** 2).sum())
    return slope if slope > 0 else float("nan")


def arrival_figures(requests: pd.DataFrame, window: tuple[int, int]) -> dict[str, float]:
    """A rate step's load in the arrival plan's units, over the sessions (tasks) that arrived in
    ``window`` (``arrival_ns``, :func:`per_arrival`): ``arrivals``, ``arrivals_ok`` (every
    turn ok), ``offered_arrivals_per_s`` = arrivals / window, ``arrival_span_s`` = the window x
    :func:`completion_stretch` of the ok ones (the span over which they completed, their own
    durations left out), ``achieved_arrivals_per_s`` = ok / that span, and
    ``requests_per_arrival`` (the ok ones' mean requests). Empty without sessions."""
    if session_requests(requests).empty:
        return {}
    units = per_arrival(requests)
    arrival = units["arrival_ns"].to_numpy(dtype=np.float64)
    cohort = units[(arrival >= window[0]) & (arrival < window[1])]
    window_s = (window[1] - window[0]) / 1e9
    done = cohort[cohort["ok"]]
    span = window_s * completion_stretch(done["arrival_ns"].to_numpy(),
                                         done["end_ns"].to_numpy())
    return {"arrivals": float(len(cohort)), "arrivals_ok": float(len(done)),
            "requests_per_arrival": (float(done["requests"].mean()) if len(done)
                                     else float("nan")),
            "offered_arrivals_per_s": len(cohort) / window_s if window_s > 0 else float("nan"),
            "arrival_span_s": span,
            "achieved_arrivals_per_s": len(done) / span if span > 0 else float("nan")}


def _turn_records(requests: pd.DataFrame) -> pd.DataFrame:
    """One record per turn: a tool loop's final request left out."""
    sessions = session_requests(requests)
    return sessions[sessions["turn_step"].ne("final")]


def _pct(values: pd.Series, q: float) -> float:
    v = values.dropna().to_numpy(dtype=np.float64)
    return float(percentile(v, q)) if v.size else float("nan")


def per_turn(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per turn index (columns in the module docstring)."""
    turns = _turn_records(requests)
    rows = []
    for k, group in turns.groupby("turn"):
        ok = group[group["outcome"] == OUTCOME_OK]
        prompt = ok["prompt_tokens"].astype("float64")
        has_cache = ok["cached_tokens"].notna() if "cached_tokens" in ok else pd.Series(
            False, index=ok.index)
        cached = ok["cached_tokens"].astype("float64")
        rows.append({
            "turn": int(k), "turns": len(group), "ok": len(ok),
            "not_sent": int(group["outcome"].isin(GENERATOR_OUTCOMES).sum()),
            "failed": int((~group["outcome"].isin((OUTCOME_OK, *GENERATOR_OUTCOMES))).sum()),
            "ttft_p50_s": _pct(ok["ttft_s"], 50), "ttft_p95_s": _pct(ok["ttft_s"], 95),
            "tpot_p50_s": _pct(ok["tpot_s"], 50), "e2e_p50_s": _pct(ok["e2e_s"], 50),
            "prompt_tokens_p50": _pct(prompt, 50),
            "history_tokens_p50": _pct(ok["history_tokens"].astype("float64"), 50),
            "hit_rate": (float(cached[has_cache].sum() / prompt[has_cache].sum())
                         if has_cache.any() and prompt[has_cache].sum() else float("nan")),
            "perfect_share": (float(ok["reusable_tokens"].astype("float64").sum() / prompt.sum())
                              if prompt.sum() else float("nan")),
        })
    return pd.DataFrame(rows)


def per_session(requests: pd.DataFrame,
                slo: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per session: session_id, turns, turns_ok, duration_s, ended (the first outcome
    that is not ok, or ok), goodput (every turn ok and within ``slo``)."""
    sessions = session_requests(requests)
    if sessions.empty:
        return pd.DataFrame(columns=["session_id", "turns", "turns_ok", "duration_s", "ended",
                                     "goodput"])
    good = meets_request_slos(sessions, slo or DEFAULT_SESSION_SLO)
    frame = sessions.assign(_good=good, _ok=sessions["outcome"] == OUTCOME_OK,
                            _end=sessions["sent_wall_ns"] + sessions["e2e_s"].fillna(0.0) * 1e9)
    # whole-column group-bys (a loop over sessions took 99 s for 10,000 of them here)
    ids = pd.Index(frame["session_id"].drop_duplicates())
    by_session = frame.groupby("session_id", sort=False)
    turns = frame[frame["turn_step"].ne("final")].groupby("session_id", sort=False)["turn"]
    # a turn is ok when its every request (a tool loop's two) was
    turn_ok = frame.groupby(["session_id", "turn"], sort=False)["_ok"].all()
    sent = frame[~frame["outcome"].isin(GENERATOR_OUTCOMES)].groupby("session_id", sort=False)
    first_bad = (frame[~frame["_ok"]].sort_values("turn", kind="stable")
                 .groupby("session_id", sort=False)["outcome"].first())
    return pd.DataFrame({
        "session_id": ids,
        "turns": turns.nunique().reindex(ids, fill_value=0).astype(int).to_numpy(),
        "turns_ok": turn_ok.groupby(level=0, sort=False).sum().reindex(ids, fill_value=0)
        .astype(int).to_numpy(),
        "duration_s": ((sent["_end"].max() - sent["sent_wall_ns"].min()) * 1e-9).reindex(ids)
        .astype(float).to_numpy(),
        "ended": first_bad.reindex(ids).fillna(OUTCOME_OK).astype(str).to_numpy(),
        "goodput": by_session["_good"].all().reindex(ids).astype(bool).to_numpy(),
    })


def tool_loops(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per tool loop that got its call: session_id, turn, time_to_call_s, tool_calls,
    tool_wait_s, final_ttft_s, final_outcome (null when the final answer was never sent)."""
    sessions = session_requests(requests)
    calls = sessions[sessions["turn_step"] == "tool_call"]
    finals = sessions[sessions["turn_step"] == "final"].set_index(["session_id", "turn"])
    rows = []
    for call in calls.itertuples(index=False):
        key = (call.session_id, call.turn)
        final = finals.loc[key] if key in finals.index else None
        rows.append({
            "session_id": call.session_id, "turn": int(call.turn),
            "outcome": call.outcome, "tool_calls": call.tool_calls,
            "time_to_call_s": call.e2e_s if call.outcome == OUTCOME_OK else np.nan,
            "tool_wait_s": final["tool_wait_s"] if final is not None else np.nan,
            "final_ttft_s": final["ttft_s"] if final is not None else np.nan,
            "final_outcome": final["outcome"] if final is not None else None,
        })
    return pd.DataFrame(rows)


def ttft_by_history(requests: pd.DataFrame, bins: int = 8) -> pd.DataFrame:
    """TTFT P50 (and count) of ok turns by history length, in equal-width bins."""
    turns = _turn_records(requests)
    ok = turns[(turns["outcome"] == OUTCOME_OK) & turns["ttft_s"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=["history_tokens", "ttft_p50_s", "count"])
    history = ok["history_tokens"].astype("float64")
    edges = np.linspace(history.min(), history.max() + 1, bins + 1)
    which = np.clip(np.digitize(history, edges) - 1, 0, bins - 1)
    rows = []
    for b in range(bins):
        part = ok[which == b]
        if len(part):
            rows.append({"history_tokens": float((edges[b] + edges[b + 1]) / 2),
                         "ttft_p50_s": _pct(part["ttft_s"], 50), "count": len(part)})
    return pd.DataFrame(rows)


def step_figures(requests: pd.DataFrame, window: tuple[int, int],
                 slo: Mapping[str, Any]) -> dict[str, float]:
    """A study step's session figures, over the sessions that began in ``window``: sessions,
    session goodput (every turn ok and within the study's SLO), sessions complete, the last
    turn's TTFT P50, and the hit rate and perfect-cache share over all their turns. Empty for a
    step without sessions."""
    sessions = session_requests(requests)
    if sessions.empty:
        return {}
    began = sessions.groupby("session_id")["sent_wall_ns"].transform("min")
    cohort = sessions[(began >= window[0]) & (began < window[1])]
    if cohort.empty:
        return {}
    per = per_session(cohort, slo)
    turns = per_turn(cohort)
    ok = _turn_records(cohort)
    ok = ok[ok["outcome"] == OUTCOME_OK]
    prompt = ok["prompt_tokens"].astype("float64").sum()
    cached = ok["cached_tokens"].astype("float64")
    return {
        "sessions": float(len(per)),
        "session_goodput": float(per["goodput"].mean()),
        "sessions_complete": float(per["ended"].eq(OUTCOME_OK).mean()),
        "last_turn_ttft_p50_s": float(turns["ttft_p50_s"].iloc[-1]),
        "session_hit_rate": (float(cached.sum() / prompt) if cached.notna().any() and prompt
                             else float("nan")),
        "session_perfect_share": (float(ok["reusable_tokens"].astype("float64").sum() / prompt)
                                  if prompt else float("nan")),
    }


def turn_points(requests: pd.DataFrame, max_points: int = 20_000) -> pd.DataFrame:
    """One point per ok turn: turn (as text, for colour), history_tokens, ttft_ms; at most
    ``max_points`` of them, by an even stride over send order, so a chart stays light."""
    turns = _turn_records(requests)
    ok = turns[(turns["outcome"] == OUTCOME_OK) & turns["ttft_s"].notna()]
    ok = ok.sort_values("sent_wall_ns")
    ok = ok.iloc[even_positions(len(ok), max_points)]
    return pd.DataFrame({"turn": ok["turn"].astype(int).astype(str),
                         "history_tokens": ok["history_tokens"].astype("float64"),
                         "ttft_ms": ok["ttft_s"] * 1e3})


def duration_histogram(sessions: pd.DataFrame, bins: int = 20) -> pd.DataFrame:
    """Sessions per duration bin (bin centres in seconds)."""
    durations = sessions["duration_s"].dropna().to_numpy(dtype=np.float64)
    if not durations.size:
        return pd.DataFrame({"duration_s": [], "sessions": []})
    counts, edges = np.histogram(durations, bins=bins)
    return pd.DataFrame({"duration_s": np.round((edges[:-1] + edges[1:]) / 2, 3),
                         "sessions": counts})


def tool_loop_line(loops: pd.DataFrame) -> str:
    """Tool loops in one line: how many got a call and a final answer, and the P50 times."""
    called = loops["tool_calls"].fillna(0) > 0
    return (f"tool loops {len(loops)}: with a call {int(called.sum())}, final answer ok "
            f"{int(loops['final_outcome'].eq(OUTCOME_OK).sum())}; ms P50: to the call "
            f"{_ms(_pct(loops['time_to_call_s'], 50))}, tool round trip "
            f"{_ms(_pct(loops['tool_wait_s'], 50))}, final TTFT "
            f"{_ms(_pct(loops['final_ttft_s'], 50))}")


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:.1f}"  # NaN check


def _share(value: float) -> str:
    return "-" if value != value else f"{value:.1%}"


def format_sessions(requests: pd.DataFrame, slo: Mapping[str, Any] | None = None) -> str:
    """The terminal's per-turn table, session totals and tool loops of the plain sessions
    (:func:`plain_sessions`); '' for a run without them."""
    requests = plain_sessions(requests)
    turns = per_turn(requests)
    if turns.empty:
        return ""
    lines = ["", "sessions: per turn (ok turns; hit rate from the server's cached_tokens, "
             "perfect = what a perfect prefix cache would reuse)",
             f"{'turn':>4} {'turns':>6} {'ok':>5} {'not sent':>8} {'TTFT P50':>9} "
             f"{'TTFT P95':>9} {'TPOT P50':>9} {'E2E P50':>9} {'history':>8} {'hit':>7} "
             f"{'perfect':>7}"]
    for r in turns.itertuples(index=False):
        lines.append(f"{r.turn:>4} {r.turns:>6} {r.ok:>5} {r.not_sent:>8} "
                     f"{_ms(r.ttft_p50_s):>9} {_ms(r.ttft_p95_s):>9} {_ms(r.tpot_p50_s):>9} "
                     f"{_ms(r.e2e_p50_s):>9} {r.history_tokens_p50:>8.0f} "
                     f"{_share(r.hit_rate):>7} {_share(r.perfect_share):>7}")
    sessions = per_session(requests, slo)
    slo = slo or DEFAULT_SESSION_SLO
    limits = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.items()
                       if k.endswith("_ms"))
    done = sessions["ended"].eq(OUTCOME_OK)
    lines.append(
        f"sessions {len(sessions)}: complete {int(done.sum())}, ended early "
        f"{int((~done).sum())} {dict(sessions.loc[~done, 'ended'].value_counts())}; duration "
        f"P50 {sessions['duration_s'].median():.2f} s; session goodput "
        f"{sessions['goodput'].mean():.1%} (every turn ok and {limits})")
    lag = _turn_records(requests)
    if "schedule_lag_s" in lag and lag["schedule_lag_s"].notna().any():
        arrivals = lag.loc[lag["turn"] == 0, "schedule_lag_s"]
        later = lag.loc[lag["turn"] > 0, "schedule_lag_s"]
        lines.append(f"schedule lag ms: session arrivals P50 {_ms(_pct(arrivals, 50))}, P99 "
                     f"{_ms(_pct(arrivals, 99))}; later turns after their think time P99 "
                     f"{_ms(_pct(later, 99))}")
    loops = tool_loops(requests)
    if not loops.empty:
        lines.append(tool_loop_line(loops))
    return "\n".join(lines)
