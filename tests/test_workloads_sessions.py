"""Session workloads: the synthetic generator, multi-turn logs (ShareGPT, Mooncake, generic) and
the build report, through `swarmload workload build` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.errors import WorkloadError
from workloads.readers import read_log
from workloads.schema import read_workload
from workloads.sessions import SessionSpec, build_sessions, mooncake_sessions
from workloads.synth import WordCounter

REPO_ROOT = Path(__file__).resolve().parent.parent


def _build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra.cli", "workload", "build", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_synthetic_sessions_share_the_group_system_prompt_and_grow_turn_by_turn(
        tmp_path: Path) -> None:
    out = tmp_path / "wl"
    done = _build("--source", "synthetic:sessions=6,turns=4,system_tokens=40,groups=2,"
                  "user_tokens=15,output_tokens=7,think_s=1..2,tool_every=2",
                  "--tokenizer", "words", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "sessions 6, turns 24" in done.stdout  # the report names sessions and turns
    frame = read_workload(out)
    assert len(frame) == 24 and frame["session_id"].nunique() == 6
    assert frame.groupby("session_id")["turn"].apply(list).map(lambda t: t == [0, 1, 2, 3]).all()
    first = frame[frame["turn"] == 0]
    systems = [json.loads(m)[0]["content"] for m in first["messages"]]
    assert len(set(systems)) == 2 and systems[0] == systems[2] != systems[1]  # by group
    assert (first["shared_tokens"] == 40).all()
    later = frame[frame["turn"] > 0]
    assert all(len(json.loads(m)) == 1 and json.loads(m)[0]["role"] == "user"
               for m in later["messages"])
    assert (frame["user_tokens"] == 15).all() and (frame["output_tokens"] == 7).all()
    assert later["think_time_s"].between(1, 2).all() and (first["think_time_s"] == 0).all()
    assert frame["tools"].notna().sum() == 12  # turns 1 and 3 of every session
    tools = json.loads(frame["tools"].dropna().iloc[0])
    assert tools["tools"][0]["function"]["name"] == "lookup" and tools["result"]
    # a turn's prompt is the logged history plus its message: it grows every turn
    for _, rows in frame.groupby("session_id"):
        assert rows["prompt_tokens"].is_monotonic_increasing
    report = json.loads((out / "report.json").read_text())["sessions"]
    assert report["sessions"] == 6 and report["turns_per_session"]["p50"] == 4
    assert [t["history_tokens_p50"] > 0 for t in report["per_turn"]] == [False, True, True, True]


def test_bad_synthetic_specs_name_the_key() -> None:
    for spec, words in (("turns=x", "turns='x'"), ("sessions=0", "sessions=0"),
                        ("color=blue", "'color=blue'"), ("think_s=-1", "think_s")):
        with pytest.raises(WorkloadError, match=words):
            SessionSpec.parse(spec)
    with pytest.raises(WorkloadError, match="tokenizer"):
        build_sessions("synthetic:sessions=2", None)


SHAREGPT = [
    {"id": "c1", "conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi you"},
        {"from": "human", "value": "how are things"}, {"from": "gpt", "value": "fine thanks a lot"},
        {"from": "human", "value": "bye"}]},  # the last user turn has no reply: not a turn
    {"id": "c2", "conversations": [{"from": "alien", "value": "?"}]},
    {"id": "c3", "conversations": [
        {"from": "human", "value": "one"}, {"from": "gpt", "value": "two three"}]},
    "not an object",
]


def test_sharegpt_multi_turn_conversations_become_sessions(tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    out = tmp_path / "wl"
    done = _build("--source", f"sharegpt:{path}", "--sessions", "--tokenizer", "words",
                  "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "bad 2" in done.stdout and "lines [2]" in done.stdout  # counted with line numbers
    frame = read_workload(out)
    assert frame.groupby("session_id").size().sort_values().tolist() == [1, 2]
    c1 = frame[frame["session_id"] == frame["session_id"].iloc[0]]
    assert json.loads(c1["messages"].iloc[0]) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert json.loads(c1["messages"].iloc[1]) == [{"role": "user", "content": "how are things"}]
    assert c1["answer"].tolist() == ["hi you", "fine thanks a lot"]
    assert c1["output_tokens"].tolist() == [2, 4]
    assert frame["session_id"].str.startswith("s-").all()  # anonymized like every log id


def _mooncake(tmp_path: Path) -> Path:
    # two conversations sharing block 1 (a common system prompt), each growing by whole blocks
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 600, "output_length": 10, "hash_ids": [1, 5]},
        {"timestamp": 3000, "input_length": 1300, "output_length": 30, "hash_ids": [1, 2, 3]},
        {"timestamp": 3500, "input_length": 1200, "output_length": 30, "hash_ids": [1, 5, 6]},
        {"timestamp": 4000, "input_length": -4, "output_length": 10, "hash_ids": [9]},
        {"timestamp": 6000, "input_length": 1800, "output_length": 5, "hash_ids": [1, 2, 3, 4]},
    ]
    path = tmp_path / "conversation_trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_conversations_are_inferred_from_hash_ids(tmp_path: Path) -> None:
    path = _mooncake(tmp_path)
    log = read_log("mooncake", path)
    assert mooncake_sessions(log.frame) == [0, 1, 0, 1, 0]
    built = build_sessions(f"mooncake:{path}", WordCounter())
    frame = built.frame
    assert built.report["source"]["bad_rows"]["count"] == 1
    assert frame.groupby("session_id").size().tolist() == [3, 2]
    conv0 = frame[frame["session_id"] == "conv0"]
    assert conv0["think_time_s"].tolist() == [0.0, 3.0, 3.0]  # arrival gaps
    assert conv0["trace_offset_s"].iloc[0] == 0.0
    # turn 0 is built from its blocks: the block both conversations share is the same text
    first = [json.loads(m)[-1]["content"].split() for m in frame[frame["turn"] == 0]["messages"]]
    assert first[0][:512] == first[1][:512] and (frame[frame["turn"] == 0]["shared_tokens"]
                                                  == 512).all()
    # later turns add what the input grew by beyond the previous prompt and answer
    assert conv0["user_tokens"].tolist()[1:] == [1300 - 700 - 20, 1800 - 1300 - 30]


def test_generic_logs_with_a_session_column_and_turn_order(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    rows = [
        {"sess": "a", "n": 2, "text": "third of a", "out": 3, "ts": 5},
        {"sess": "b", "n": 1, "text": "first of b", "out": 4, "ts": 1},
        {"sess": "a", "n": 1, "text": "second of a", "out": 2, "ts": 2},
        {"sess": "a", "n": "x", "text": "bad turn", "out": 2, "ts": 3},
        {"sess": "a", "n": 0, "text": "first of a", "out": 2, "ts": 0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = build_sessions(f"generic:{path}", WordCounter(),
                           mapping="session_id=sess,turn=n,prompt=text,output_tokens=out")
    frame = built.frame
    bad = built.report["source"]["bad_rows"]
    assert bad["count"] == 1 and bad["by_reason"]["turn not a number"]["lines"] == [4]
    users = [json.loads(m)[-1]["content"] for m in frame["messages"]]
    assert users == ["first of a", "second of a", "third of a", "first of b"]
    assert frame["turn"].tolist() == [0, 1, 2, 0]
    assert frame["think_time_s"].tolist() == [0.0] * 4  # no timestamps: no think time
    with pytest.raises(WorkloadError, match="session"):
        build_sessions(f"generic:{path}", WordCounter(), mapping="prompt=text,output_tokens=out")
