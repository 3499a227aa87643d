"""Sessions as the master leases them (locustfiles/schedule_items.py): each session's first user
message opens with the session's own salt, letters only, different on every pass."""

from __future__ import annotations

import itertools
import re

from locustfiles.schedule_items import session_items
from workloads.arrivals import parse_plan_spec
from workloads.sessions import build_sessions, session_salt
from workloads.synth import make_counter


def test_a_session_replayed_again_opens_with_its_own_salt_for_that_pass() -> None:
    build = build_sessions("synthetic:sessions=3,turns=2,user_tokens=10,output_tokens=4",
                           make_counter("words"))
    items = list(itertools.islice(session_items(
        build.frame, parse_plan_spec("closed:concurrency=2"), 10.0, salt="Q"), 6))
    openings = [item["turns"][0]["messages"][0]["content"].split()[0] for item in items]
    # the session's letters, then which pass over the workload (b = 1), never digits
    assert all(re.fullmatch("[a-zA-Z]+", o) for o in openings), openings
    sid = str(build.frame["session_id"].iloc[0])
    assert openings[0] == session_salt(sid, "", 0) and openings[3] == session_salt(sid, "", 1)
    assert len(set(openings)) == 6  # no two leases share a first prefix by accident
    assert all(" Q " in item["turns"][0]["messages"][0]["content"] for item in items)
