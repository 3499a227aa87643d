"""Turn a workload and its arrival plan into the items the master leases to workers."""

from __future__ import annotations

import json
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
    items: list[dict[str, Any]] = []
    rows = frame.to_dict("records")
    uses = [0] * len(rows)  # times each row has been scheduled so far
    for seq, (index, offset) in enumerate(
        zip(arrivals["request_index"].tolist(), arrivals["offset_s"].tolist(), strict=True)
    ):
        row = rows[int(index)]
        repeat = uses[int(index)]
        uses[int(index)] += 1
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
        items.append({
            "seq": seq, "rid": rid, "bucket": row["bucket"], "endpoint": endpoint,
            "prompt": prompt if endpoint == "completions" else None, "messages": messages,
            "max_tokens": int(row["output_tokens"]), "ptoks": int(row["prompt_tokens"]),
            "off": float(offset),
        })
    return items
