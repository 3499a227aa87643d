"""Session figures over a hand-made request table: per turn, per session, per tool loop."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboards.analysis.sessions import format_sessions, per_session, per_turn, tool_loops


def _requests() -> pd.DataFrame:
    rows = []
    for s, fail in (("a#0", False), ("b#1", True)):
        for k in range(3):
            outcome = "ok" if not (fail and k >= 1) else ("http_5xx" if k == 1 else
                                                          "session_ended")
            rows.append({"session_id": s, "turn": k, "turn_step": "tool_call" if k == 1 else None,
                         "outcome": outcome, "ttft_s": 0.1 * (k + 1) if outcome == "ok" else None,
                         "tpot_s": 0.01, "e2e_s": 0.5 if outcome != "session_ended" else None,
                         "sent_wall_ns": int((10 * (s == "b#1") + k) * 1e9),
                         "prompt_tokens": 1000 + 100 * k, "history_tokens": 0 if k == 0 else
                         900 + 100 * k, "reusable_tokens": 800 if k == 0 else 900 + 100 * k,
                         "cached_tokens": 768 if k == 0 else 896 + 96 * k,
                         "tool_calls": 1 if k == 1 else None, "tool_wait_s": None})
        if not fail:
            rows.append({"session_id": s, "turn": 1, "turn_step": "final", "outcome": "ok",
                         "ttft_s": 0.05, "tpot_s": 0.01, "e2e_s": 0.3,
                         "sent_wall_ns": int(1.8e9), "prompt_tokens": 1150,
                         "history_tokens": 1120, "reusable_tokens": 1120, "cached_tokens": 1120,
                         "tool_calls": None, "tool_wait_s": 0.25})
    return pd.DataFrame(rows)


def test_per_turn_counts_each_turn_once_with_hit_rate_beside_the_perfect_share() -> None:
    turns = per_turn(_requests())
    assert turns["turns"].tolist() == [2, 2, 2]  # the final answer is not a turn of its own
    assert turns["ok"].tolist() == [2, 1, 1] and turns["not_sent"].tolist() == [0, 0, 1]
    first = turns.iloc[0]
    assert first["hit_rate"] == 768 / 1000 and first["perfect_share"] == 800 / 1000
    assert np.isclose(turns.iloc[1]["ttft_p50_s"], 0.2)


def test_a_session_with_a_failed_turn_is_not_goodput() -> None:
    sessions = per_session(_requests()).set_index("session_id")
    assert sessions.loc["a#0", "goodput"] and sessions.loc["a#0", "ended"] == "ok"
    assert sessions.loc["a#0", "turns_ok"] == 3
    assert not sessions.loc["b#1", "goodput"] and sessions.loc["b#1", "ended"] == "http_5xx"
    assert sessions.loc["b#1", "turns_ok"] == 1
    assert np.isclose(sessions.loc["a#0", "duration_s"], 2.5)  # first send to last byte


def test_tool_loops_pair_the_call_with_its_final_answer() -> None:
    loops = tool_loops(_requests()).set_index("session_id")
    assert loops.loc["a#0", "final_ttft_s"] == 0.05 and loops.loc["a#0", "tool_wait_s"] == 0.25
    assert pd.isna(loops.loc["b#1", "final_outcome"])  # its call failed: no final answer
    text = format_sessions(_requests())
    assert "sessions 2: complete 1, ended early 1" in text and "tool loops 2" in text


def test_a_study_step_gets_the_figures_of_the_sessions_that_began_in_its_window() -> None:
    from dashboards.analysis.sessions import step_figures

    requests = _requests()
    figures = step_figures(requests, (0, int(5e9)), {"ttft_ms": 1000})  # session a#0 only
    assert figures["sessions"] == 1 and figures["session_goodput"] == 1.0
    assert np.isclose(figures["last_turn_ttft_p50_s"], 0.3)
    both = step_figures(requests, (0, int(20e9)), {"ttft_ms": 1000})
    assert both["sessions"] == 2 and both["session_goodput"] == 0.5
    assert both["sessions_complete"] == 0.5
    assert step_figures(requests.assign(session_id=None), (0, int(20e9)), {}) == {}
