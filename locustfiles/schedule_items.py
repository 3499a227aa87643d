"""Turn a workload and its arrival plan into the items the master leases to workers."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workloads.builtin_mix import BuiltinMix, salt_text


def build_items(workload_dir: str, plan_path: str | None, duration_s: float,
                seed: int = 0, salt: str = "") -> list[dict[str, Any]]:
    """One dict per scheduled arrival: seq, rid, bucket, endpoint, prompt/messages, offset.

    Every prompt opens with the run's ``salt`` (the first message's text for chat), so that a
    workload replayed again (the next run, the next study step) meets a cold prefix cache, while
    requests of one run still share what the workload itself shares (Mooncake prefix blocks,
    a common system prompt). A plan longer than its workload uses rows again: each further pass
    gets its own opening, so no prompt of a run repeats one sent before in it.
    """
    from workloads.arrivals import load_plan, schedule
    from workloads.schema import PLAN_FILE, read_workload

    frame = read_workload(workload_dir)
    plan_file = Path(plan_path) if plan_path else Path(workload_dir) / PLAN_FILE
    plan = load_plan(plan_file)
    arrivals = schedule(plan, frame, duration_s, seed)
    filler = BuiltinMix(seed=seed)
    rows = frame.to_dict("records")
    uses = [0] * len(rows)  # times each row has been scheduled so far
    items = []
    for seq, (index, offset) in enumerate(
        zip(arrivals["request_index"].tolist(), arrivals["offset_s"].tolist(), strict=True)
    ):
        items.append(_item(rows[int(index)], seq, float(offset), filler, salt,
                           uses[int(index)]))
        uses[int(index)] += 1
    return items


def _item(row: dict[str, Any], seq: int, offset: float, filler: BuiltinMix, salt: str,
          repeat: int) -> dict[str, Any]:
    rid = f"{row['request_id']}#{seq}"
    messages = row.get("messages")
    prompt = row.get("prompt")
    if isinstance(messages, str):
        endpoint, messages = "chat", json.loads(messages)
    else:
        endpoint, messages = "completions", None
        if not isinstance(prompt, str):
            # A log with token counts only and no tokenizer at build time: approximate
            # words (one token each on the simulator); `workload build --tokenizer` is exact.
            prompt = filler.text_of_length(int(row["prompt_tokens"]), rid)
    if endpoint == "chat":
        messages = [dict(m) for m in messages]
        messages[0]["content"] = salt_text(str(messages[0].get("content") or ""), salt, repeat)
    else:
        prompt = salt_text(prompt, salt, repeat)
    return {
        "seq": seq, "rid": rid, "bucket": row["bucket"], "endpoint": endpoint,
        "prompt": prompt if endpoint == "completions" else None, "messages": messages,
        "max_tokens": int(row["output_tokens"]), "ptoks": int(row["prompt_tokens"]),
        "off": offset,
    }


# A synthetic plan's schedule is generated this many seconds at a time (rounded up to whole
# burst periods), so a soak holds one chunk of arrival times, never the whole run's.
SOAK_CHUNK_S = 600.0


def iter_items(workload_dir: str, plan_path: str | None, duration_s: float, seed: int = 0,
               salt: str = "", *, start_seq: int = 0,
               chunk_s: float = SOAK_CHUNK_S) -> Iterator[dict[str, Any]]:
    """The items of :func:`build_items`, generated lazily for runs of hours or days.

    The workload is replayed on repeat: a trace plan pass after pass (its own length each),
    synthetic plans (poisson, gamma, bursts) ``chunk_s`` at a time walking the workload row
    after row. Every prompt opens with the run's ``salt`` and, from the second pass over the
    workload on, the pass's number (:func:`workloads.builtin_mix.salt_text`), so a server's
    prefix cache does not serve the repeats. ``seq`` numbers every arrival of the run from 0;
    with ``start_seq`` (a resumed run) the items before it are skipped without being built.
    Same inputs, seed and salt: same items.
    """
    from workloads.arrivals import TracePlan, load_plan, schedule, trace_pass
    from workloads.schema import PLAN_FILE, read_workload

    frame = read_workload(workload_dir)
    plan = load_plan(Path(plan_path) if plan_path else Path(workload_dir) / PLAN_FILE)
    filler = BuiltinMix(seed=seed)
    rows = frame.to_dict("records")
    limit = plan.max_requests if plan.max_requests is not None else math.inf
    if isinstance(plan, TracePlan):
        pass_rows, pass_times, span = trace_pass(plan, frame)
        chunks = ((k, k * span, pass_rows, pass_times) for k in range(int(1e12)))
    else:
        period = getattr(plan, "period_s", None)
        chunk = math.ceil(chunk_s / period) * period if period else chunk_s

        def synthetic() -> Iterator[tuple[int, float, Any, Any]]:
            for k in range(int(1e12)):
                part = schedule(plan, frame, chunk, seed + k)
                yield k, k * chunk, None, part["offset_s"].to_numpy()

        chunks = synthetic()
    seq = 0
    for k, start, chunk_rows, times in chunks:
        if start >= duration_s or seq >= limit:
            return
        if seq + len(times) <= start_seq:  # a resumed run: skip whole chunks unbuilt
            seq += len(times)
            continue
        for i, offset in enumerate(times.tolist()):
            at = start + offset
            if at >= duration_s or seq >= limit:
                return
            if seq >= start_seq:
                # A trace pass replays its own rows; synthetic plans walk the workload in order.
                index = int(chunk_rows[i]) if chunk_rows is not None else seq % len(rows)
                passes = k if chunk_rows is not None else seq // len(rows)
                yield _item(rows[index], seq, at, filler, salt, passes)
            seq += 1
