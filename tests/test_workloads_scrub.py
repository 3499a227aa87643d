"""Anonymization guard: identifiers replaced and counted; stored workloads refuse raw text."""

from __future__ import annotations

import pandas as pd
import pytest

from workloads.errors import ScrubError
from workloads.schema import write_workload
from workloads.scrub import Scrubber, assert_clean, scrub_text


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        ("write to ann.lee+x@mail.example.co.uk today", "write to <EMAIL> today", "email"),
        ("call +1 (555) 123-4567 now", "call <PHONE> now", "phone"),
        ("call 555-123-4567", "call <PHONE>", "phone"),
        ("ring +44 20 7946 0958", "ring <PHONE>", "phone"),
        ("account 12345678901", "account <NUMBER>", "digits"),
        ("card 4111 1111 1111 1111 ok", "card <CARD> ok", "card"),
        ("ssn 078-05-1120", "ssn <ID>", "ssn"),
        ("host 192.168.10.42 down", "host <IP> down", "ipv4"),
        ("v6 2001:db8:85a3::8a2e:370:7334 up", "v6 <IP> up", "ipv6"),
        ("git clone https://bob:hunter2@git.example.com/x.git",
         "git clone https://<CREDENTIALS>@git.example.com/x.git", "url_credentials"),
        ("key sk-abcdefghijklmnop1234 used", "key <SECRET> used", "secret"),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345",
         "Authorization: <SECRET>", "secret"),
    ],
)
def test_identifiers_replaced(text: str, expected: str, kind: str) -> None:
    clean, counts = scrub_text(text)
    assert clean == expected
    assert counts[kind] == 1 and sum(counts.values()) == 1


@pytest.mark.parametrize(
    "text",
    [
        "The meeting is on 2023-11-16 at 18:15:46, room 12.",
        "version 1.2.3 of the library, pi is 3.14159",
        "int main() { return 0; }  // std::vector<int> v(100);",
        "The year 1999 had 365 days.",
    ],
)
def test_ordinary_text_left_alone(text: str) -> None:
    assert scrub_text(text) == (text, {})


def test_report_counts_and_idempotence() -> None:
    scrubber = Scrubber()
    first = scrubber.scrub("a@b.io and c@d.io at 10.0.0.1")
    scrubber.scrub("nothing here")
    msgs = scrubber.scrub_messages([{"role": "user", "content": "mail x@y.org"}])
    assert first == "<EMAIL> and <EMAIL> at <IP>"
    assert msgs == [{"role": "user", "content": "mail <EMAIL>"}]
    assert scrubber.report.to_dict() == {
        "replaced": {"email": 3, "ipv4": 1}, "texts_seen": 3, "texts_changed": 2}
    assert scrub_text(first) == (first, {})  # placeholders match no pattern


def test_write_refuses_raw_text(tmp_path) -> None:
    frame = pd.DataFrame({
        "request_id": ["r0"], "bucket": ["short"], "prompt_tokens": [3], "output_tokens": [2],
        "prompt": ["reach me at ann@example.com"], "messages": [None],
        "trace_offset_s": [0.0], "session_id": [None], "prefix_block_ids": [[]],
        "source_line": [2], "prompt_source": ["log"],
    })
    with pytest.raises(ScrubError, match="email"):
        write_workload(frame, tmp_path, {})
    assert not (tmp_path / "workload.parquet").exists()
    assert_clean(["reach me at <EMAIL>"], what="x")
