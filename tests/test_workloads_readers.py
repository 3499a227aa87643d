"""Log readers: each format's happy path and its bad-input paths (counted, strict, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from trace_data import AZURE_CONV

from workloads.errors import (
    BadRowsError,
    EmptyLogError,
    LogFormatError,
    TimestampError,
    WorkloadError,
)
from workloads.readers import LOG_COLUMNS, parse_mapping, parse_source, read_log


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- Azure -------------------------------------------------------------------------------------


def test_azure_real_trace_head(tmp_path: Path) -> None:
    head = "".join(AZURE_CONV.open().readlines()[:201])
    log = read_log("azure", write(tmp_path / "conv.csv", head))
    assert list(log.frame.columns) == list(LOG_COLUMNS)
    assert len(log.frame) == 200 and log.bad_rows == []
    first = log.frame.iloc[0]
    assert (first.source_line, first.prompt_tokens, first.output_tokens) == (2, 374, 44)
    # 18:15:46.6805900 -> 18:15:50.9951690: 4.314579 s, to the microsecond
    assert log.frame.timestamp_s.iloc[1] == pytest.approx(4.314579, abs=1e-6)
    assert log.frame.timestamp_s.is_monotonic_increasing


def test_azure_bad_rows_counted_with_lines_then_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.68,374,44\n"
                 "2023-11-16 18:15:47.00,0,10\n"          # line 3: zero prompt
                 "not a time,100,10\n"                     # line 4: bad timestamp
                 "2023-11-16 18:15:48.00,100,-3\n"         # line 5: negative output
                 "2023-11-16 18:15:49.00,12.5,3\n"         # line 6: fractional
                 "2023-11-16 18:15:50.00,,3\n"             # line 7: missing
                 "2023-11-16 18:15:51.00,200,20\n")
    log = read_log("azure", path)
    assert [(b.line, b.reason) for b in log.bad_rows] == [
        (3, "prompt tokens <= 0"),
        (4, "missing or unparsable timestamp"),
        (5, "output tokens <= 0"),
        (6, "prompt tokens not an integer"),
        (7, "missing or unparsable prompt tokens"),
    ]
    assert log.frame.source_line.tolist() == [2, 8]
    assert log.frame.timestamp_s.tolist() == pytest.approx([0.0, 4.32])
    summary = log.bad_rows_summary()
    assert summary["count"] == 5 and summary["by_reason"]["prompt tokens <= 0"]["lines"] == [3]
    with pytest.raises(BadRowsError) as err:
        read_log("azure", path, strict=True)
    assert len(err.value.bad_rows) == 5 and "line 3" in str(err.value)


def test_azure_missing_column_and_backwards_time(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match=r"missing column\(s\) \['GeneratedTokens'\]"):
        read_log("azure", write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens\nx,1\n"))
    backwards = write(tmp_path / "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                      "2023-11-16 18:00:02,10,1\n2023-11-16 18:00:01,20,2\n")
    with pytest.raises(TimestampError, match="backwards at line 3"):
        read_log("azure", backwards)
    log = read_log("azure", backwards, sort_timestamps=True)
    assert log.frame.source_line.tolist() == [3, 2]
    assert log.frame.timestamp_s.tolist() == [0.0, 1.0]


def test_all_rows_bad_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:00:02,0,1\n")
    with pytest.raises(EmptyLogError):
        read_log("azure", path)


# --- Mooncake ----------------------------------------------------------------------------------


def test_mooncake_happy_and_bad(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 12, "hash_ids": [0, 1, 2]},
        {"timestamp": 250, "input_length": 600, "output_length": 5, "hash_ids": [0, 3]},
        "{not json",
        {"timestamp": 300, "input_length": 600, "output_length": 0, "hash_ids": [4, 5]},
        {"timestamp": 400, "input_length": 10, "output_length": 5, "hash_ids": "x"},
        {"timestamp": 500, "output_length": 5, "hash_ids": [6]},
        {"timestamp": 1500, "input_length": 20, "output_length": 7, "hash_ids": [7]},
    ]
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    log = read_log("mooncake", write(tmp_path / "m.jsonl", text))
    assert log.frame.source_line.tolist() == [1, 2, 7]
    assert log.frame.timestamp_s.tolist() == [0.0, 0.25, 1.5]   # ms -> s
    assert log.frame.prefix_block_ids.tolist() == [[0, 1, 2], [0, 3], [7]]
    assert log.frame.prompt_tokens.tolist() == [1100, 600, 20]
    assert {(b.line, b.reason) for b in log.bad_rows} == {
        (3, "invalid JSON"), (4, "output tokens <= 0"),
        (5, "hash_ids not a list of integers"), (6, "missing or unparsable prompt tokens")}
    with pytest.raises(BadRowsError):
        read_log("mooncake", tmp_path / "m.jsonl", strict=True)


def test_mooncake_wrong_keys(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", json.dumps({"ts": 1, "in": 2}) + "\n")
    with pytest.raises(LogFormatError, match="no record has"):
        read_log("mooncake", path)


# --- BurstGPT ----------------------------------------------------------------------------------

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_happy_and_failed_requests(tmp_path: Path) -> None:
    path = write(tmp_path / "b.csv", BURST_HEADER
                 + "5,ChatGPT,472,18,490,Conversation log\n"
                 + "45,ChatGPT,1087,0,1087,Conversation log\n"   # failed: 0 response tokens
                 + "118,GPT-4,417,276,693,API log\n")
    log = read_log("burstgpt", path)
    assert log.frame.timestamp_s.tolist() == [0.0, 113.0]
    assert log.frame.output_tokens.tolist() == [18, 276]
    assert [(b.line, b.reason) for b in log.bad_rows] == [(3, "output tokens <= 0")]


def test_burstgpt_missing_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "b.csv", "Timestamp,Model,Request tokens\n1,x,3\n")
    with pytest.raises(LogFormatError, match="Response tokens"):
        read_log("burstgpt", path)


# --- ShareGPT ----------------------------------------------------------------------------------


def test_sharegpt_happy_and_bad(tmp_path: Path) -> None:
    data = [
        {"id": "a1", "conversations": [{"from": "human", "value": "Hi, mail ann@example.com"},
                                        {"from": "gpt", "value": "Sure thing."}]},
        {"id": "a2", "conversations": [{"from": "human", "value": "only a question"}]},
        {"id": "a3", "conversations": [{"from": "robot", "value": "x"}]},
        ["not", "an", "object"],
        {"id": "a5", "conversations": [{"from": "system", "value": "Be brief."},
                                        {"from": "human", "value": "Why?"},
                                        {"from": "gpt", "value": "Because."}]},
    ]
    log = read_log("sharegpt", write(tmp_path / "s.json", json.dumps(data)))
    assert log.frame.source_line.tolist() == [1, 5]
    assert log.frame.prompt.tolist() == ["Hi, mail ann@example.com", "Why?"]
    assert log.frame.messages.iloc[1] == [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Why?"}]
    assert log.frame.output_text.tolist() == ["Sure thing.", "Because."]
    assert log.frame.timestamp_s.isna().all() and not log.has_timing
    assert {(b.line, b.reason) for b in log.bad_rows} == {
        (2, "no user turn followed by a reply"), (3, "unknown speaker in 'from'"),
        (4, "not a JSON object")}


def test_sharegpt_not_an_array(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="array"):
        read_log("sharegpt", write(tmp_path / "s.json", '{"conversations": []}'))
    with pytest.raises(LogFormatError, match="cannot read"):
        read_log("sharegpt", write(tmp_path / "t.json", "[{"))


# --- generic -----------------------------------------------------------------------------------


def test_generic_jsonl_csv_parquet(tmp_path: Path) -> None:
    rows = [
        {"ts": 1700000000.0, "text": "hello there", "out": 5, "user": "u1", "pfx": ["p", "q"]},
        {"ts": 1700000000.5, "text": "", "out": 5, "user": "u1", "pfx": []},        # empty
        {"ts": 1700000002.0, "text": "again", "out": 7, "user": "u2", "pfx": ["p"]},
    ]
    mapping = "timestamp=ts,prompt=text,output_tokens=out,session_id=user,prefix_ids=pfx"
    jsonl = write(tmp_path / "g.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    log = read_log("generic", jsonl, mapping=mapping)
    assert log.frame.prompt.tolist() == ["hello there", "again"]
    assert log.frame.timestamp_s.tolist() == [0.0, 2.0]
    assert log.frame.session_id.tolist() == ["u1", "u2"]
    ids = log.frame.prefix_block_ids.tolist()
    assert ids[0][0] == ids[1][0] and len(ids[0]) == 2   # same prefix id -> same int
    assert [(b.line, b.reason) for b in log.bad_rows] == [
        (2, "missing or unparsable prompt tokens")]

    table = pd.DataFrame({"when": ["2024-01-01T00:00:00Z", "2024-01-01T00:00:03Z"],
                          "n_in": [10, 20], "n_out": [1, 2]})
    table.to_csv(tmp_path / "g.csv", index=False)
    table.to_parquet(tmp_path / "g.parquet")
    for name in ("g.csv", "g.parquet"):
        log = read_log("generic", tmp_path / name,
                       mapping={"timestamp": "when", "prompt_tokens": "n_in",
                                "output_tokens": "n_out"})
        assert log.frame.timestamp_s.tolist() == [0.0, 3.0]
        assert log.frame.prompt_tokens.tolist() == [10, 20]


def test_generic_messages_and_ms_timestamps(tmp_path: Path) -> None:
    rows = [{"t": 1000, "msgs": json.dumps([{"role": "user", "content": "hi"}]), "o": 3},
            {"t": 1500, "msgs": "not json", "o": 3},
            {"t": 3000, "msgs": json.dumps([{"from": "human", "value": "yo"}]), "o": 4}]
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    log = read_log("generic", tmp_path / "c.csv",
                   mapping="timestamp=t,timestamp_unit=ms,messages=msgs,output_tokens=o")
    assert log.frame.timestamp_s.tolist() == [0.0, 2.0]
    assert log.frame.messages.iloc[1] == [{"role": "user", "content": "yo"}]
    assert [(b.line, b.reason) for b in log.bad_rows] == [
        (3, "messages not a list of {role, content}")]


def test_generic_mapping_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "g.jsonl", json.dumps({"a": 1, "b": 2}) + "\n")
    with pytest.raises(LogFormatError, match=r"not in the file: \{'output_tokens': 'zzz'\}.*'a'"):
        read_log("generic", path, mapping="prompt_tokens=a,output_tokens=zzz")
    with pytest.raises(LogFormatError, match=r"unknown mapping key\(s\) \['colour'\]"):
        parse_mapping("colour=a,output_tokens=b,prompt_tokens=a")
    with pytest.raises(LogFormatError, match="needs one of prompt"):
        parse_mapping("output_tokens=b")
    with pytest.raises(LogFormatError, match="needs a column mapping"):
        read_log("generic", path)
    with pytest.raises(LogFormatError, match="extension"):
        read_log("generic", write(tmp_path / "g.txt", "x"), mapping="prompt_tokens=a,"
                 "output_tokens=b")
    unsorted = write(tmp_path / "u.jsonl", "".join(json.dumps({"t": t, "a": 1, "b": 1}) + "\n"
                                                   for t in (5, 3, 9)))
    with pytest.raises(TimestampError, match="line 2"):
        read_log("generic", unsorted, mapping="timestamp=t,prompt_tokens=a,output_tokens=b")


def test_source_spec_and_unknown_kind(tmp_path: Path) -> None:
    assert parse_source("azure:/x/y.csv") == ("azure", "/x/y.csv")
    with pytest.raises(LogFormatError, match="KIND one of"):
        parse_source("splunk:/x")
    with pytest.raises(LogFormatError, match="no such file"):
        read_log("azure", tmp_path / "missing.csv")
    assert issubclass(LogFormatError, WorkloadError)
