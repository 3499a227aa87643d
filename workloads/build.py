"""Build a workload from a request log: read, scrub, bucket, sample to the mix, synthesize.

Usage::

    config = BuildConfig(source_kind="azure", source_path="conv.csv", n=5000,
                         shares={"short": .45, "medium": .40, "long": .15}, seed=0)
    built = build_workload(config, counter=LocalTokenizer("model/"))
    write_workload(built.frame, "out/", built.metadata)   # workloads.schema
    built.report                                          # dict, saved as report.json

Sampling (``sample_mix``): each bucket gets round(share * n) requests (largest remainder), drawn
from that bucket's own log rows, so the bucket keeps its logged length distribution. Rows are
drawn without replacement while they last and then reused in whole shuffled passes (each row used
floor or ceil of count/rows times); the report gives the distinct log rows behind each bucket.
``shares=None`` keeps the log's native mix: the first n rows in log order (looped if n is larger).

Arrival times (``trace_offset_s``): with the native mix each request keeps its row's timestamp;
with a target mix, the content is resampled but the timeline is the log's own: request i gets the
i-th arrival time of the log (looped after the end, one mean gap after the last), so the log's
burstiness survives the change of mix. Arrival plans (``workloads.arrivals``) then scale,
window or replace these times.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workloads.buckets import BUCKETS, BucketSpec
from workloads.errors import SamplingError, WorkloadError
from workloads.readers import LogMapping, LogRead, read_log
from workloads.schema import WORKLOAD_SCHEMA, workload_table
from workloads.scrub import Scrubber
from workloads.synth import PromptSynthesizer, TokenCounter

_PERCENTILES = (50, 90, 95, 99)
_CHARS_PER_TOKEN_ESTIMATE = 4.0  # only when text must be counted and no tokenizer was given


@dataclass
class BuildConfig:
    source_kind: str
    source_path: str
    n: int = 5000
    shares: dict[str, float] | None = field(
        default_factory=lambda: dict(BucketSpec().shares)
    )  # None: the log's native mix
    short_max: int = 64
    long_min: int = 512
    seed: int = 0
    endpoint: str = "completions"
    mapping: str | dict[str, Any] | LogMapping | None = None
    strict: bool = False
    sort_timestamps: bool = False
    prefix_sharing: bool = True
    max_model_len: int | None = None  # drop log rows whose prompt + output would not fit

    def bucket_spec(self) -> BucketSpec:
        shares = self.shares if self.shares is not None else dict(BucketSpec().shares)
        return BucketSpec(short_max=self.short_max, long_min=self.long_min, shares=shares)


@dataclass
class BuiltWorkload:
    frame: pd.DataFrame  # WORKLOAD_SCHEMA columns
    report: dict[str, Any]
    metadata: dict[str, Any]


def allocate(n: int, shares: dict[str, float]) -> dict[str, int]:
    """Split ``n`` by ``shares`` with the largest-remainder method (counts sum to n exactly)."""
    exact = {b: n * shares.get(b, 0.0) for b in BUCKETS}
    counts = {b: int(np.floor(v)) for b, v in exact.items()}
    by_remainder = sorted(BUCKETS, key=lambda b: (exact[b] - counts[b], -BUCKETS.index(b)),
                          reverse=True)
    for b in by_remainder[: n - sum(counts.values())]:
        counts[b] += 1
    return counts


def sample_mix(
    buckets: pd.Series, n: int, shares: dict[str, float], rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, int]]:
    """Positions (into ``buckets``) of n rows drawn to ``shares``, interleaved in random order,
    and the count of distinct rows behind each bucket."""
    counts = allocate(n, shares)
    chosen: list[np.ndarray] = []
    distinct: dict[str, int] = {}
    for bucket in BUCKETS:
        want = counts[bucket]
        rows = np.flatnonzero(buckets.to_numpy() == bucket)
        if want and not rows.size:
            raise SamplingError(
                f"bucket {bucket!r} has no rows in the log but its target share is "
                f"{shares.get(bucket, 0):.0%}; change --mix or --thresholds"
            )
        passes = [rng.permutation(rows) for _ in range(-(-want // max(rows.size, 1)))]
        picked = np.concatenate(passes)[:want] if passes else np.empty(0, dtype=int)
        chosen.append(picked)
        distinct[bucket] = int(np.unique(picked).size)
    order = np.concatenate(chosen)
    return order[rng.permutation(order.size)], distinct


def _looped(times: np.ndarray, n: int) -> np.ndarray:
    """The first n of ``times`` repeated end to end, one mean gap between the copies."""
    if times.size >= n:
        return times[:n]
    span = float(times[-1] - times[0])
    period = span + (span / (times.size - 1) if times.size > 1 else 1.0)
    loops = -(-n // times.size)
    return np.concatenate([times - times[0] + i * period for i in range(loops)])[:n]


def _stats(values: pd.Series) -> dict[str, float]:
    v = values.dropna().to_numpy(dtype="float64")
    if not v.size:
        return {}
    out = {f"p{p}": round(float(np.percentile(v, p)), 3) for p in _PERCENTILES}
    out.update(min=float(v.min()), max=float(v.max()), mean=round(float(v.mean()), 3))
    return out


def arrival_stats(offsets: pd.Series) -> dict[str, float | None] | None:
    """Span, mean rate and inter-arrival variability (coefficient of variation) of arrivals."""
    t = np.sort(offsets.dropna().to_numpy(dtype="float64"))
    if t.size < 2:
        return None
    gaps = np.diff(t)
    span = float(t[-1] - t[0])
    mean_gap = float(gaps.mean())
    return {
        "requests": int(t.size),
        "span_s": round(span, 6),
        "rate_rps": round((t.size - 1) / span, 6) if span > 0 else float("inf"),
        "interarrival_mean_s": round(mean_gap, 6),
        "interarrival_cv": round(float(gaps.std()) / mean_gap, 4) if mean_gap > 0 else None,
    }


def _session_hasher(source_path: str) -> Any:
    """Session ids become keyed hashes; the key is the log file's digest, so the same log gives
    the same ids while someone holding only the workload cannot test guesses of the raw ids."""
    key = hashlib.blake2b(Path(source_path).read_bytes(), digest_size=32).digest()

    def anonymize(value: Any) -> str | None:
        if value is None:
            return None
        return "s-" + hashlib.blake2b(str(value).encode(), key=key, digest_size=8).hexdigest()

    return anonymize


def _count_text_rows(
    frame: pd.DataFrame, endpoint: str, counter: TokenCounter | None
) -> tuple[pd.Series, pd.Series, int]:
    """Fill prompt/output token counts of rows that logged text only; estimate w/o a counter."""
    prompt_tokens = frame["prompt_tokens"].copy()
    output_tokens = frame["output_tokens"].copy()
    estimated = 0
    for i in np.flatnonzero(prompt_tokens.isna().to_numpy()):
        prompt, messages = frame.at[i, "prompt"], frame.at[i, "messages"]
        if endpoint == "chat":
            messages = messages or [{"role": "user", "content": prompt}]
            if counter is not None:
                prompt_tokens.iat[i] = counter.count_chat(messages)
                continue
            text = "".join(m["content"] for m in messages)
        else:
            if not isinstance(prompt, str):
                raise WorkloadError(
                    f"log line {frame.at[i, 'source_line']} holds chat messages only; build "
                    "with --endpoint chat"
                )
            if counter is not None:
                prompt_tokens.iat[i] = counter.count_prompt(prompt)
                continue
            text = prompt
        prompt_tokens.iat[i] = max(1, round(len(text) / _CHARS_PER_TOKEN_ESTIMATE))
        estimated += 1
    for i in np.flatnonzero(output_tokens.isna().to_numpy()):
        text = frame.at[i, "output_text"] or ""
        count = counter.count_text(text) if counter is not None else round(
            len(text) / _CHARS_PER_TOKEN_ESTIMATE)
        output_tokens.iat[i] = max(1, count)
    return prompt_tokens, output_tokens, estimated


def build_workload(config: BuildConfig, counter: TokenCounter | None = None) -> BuiltWorkload:
    """A workload from a request log, in stages: read, scrub (everything after sees scrubbed
    text only), count, keep the rows that fit, bucket, draw ``n``, synthesize the prompts."""
    spec = config.bucket_spec()
    if config.n <= 0:
        raise SamplingError(f"--n must be positive, got {config.n}")
    log: LogRead = read_log(config.source_kind, config.source_path, mapping=config.mapping,
                            strict=config.strict, sort_timestamps=config.sort_timestamps)
    scrubber = Scrubber()
    frame = _scrubbed(log.frame.copy(), scrubber, config.source_path)
    frame["prompt_tokens"], frame["output_tokens"], estimated = _count_text_rows(
        frame, config.endpoint, counter)
    frame, over_limit, below_template = _rows_that_fit(frame, config, counter)
    frame["bucket"] = [spec.bucket_of(int(t)) for t in frame["prompt_tokens"]]
    drawn, distinct, offsets = _draw(frame, log, config, spec)
    out = workload_table(
        drawn["bucket"], drawn["prompt_tokens"], drawn["output_tokens"],
        trace_offset_s=offsets if log.has_timing else None,
        session_id=drawn["session_id"],
        prefix_block_ids=[ids if isinstance(ids, list) else []
                          for ids in drawn["prefix_block_ids"]],
        source_line=drawn["source_line"])
    synthesis = _fill_prompts(out, drawn, config, counter)
    synthesis["prompt_tokens_estimated_rows"] = estimated

    report = _report(config, spec, log, scrubber, frame, out, distinct, synthesis)
    report["source"]["rows_over_max_model_len"] = over_limit
    report["source"]["max_model_len"] = config.max_model_len
    report["source"]["rows_below_template"] = below_template
    metadata = {
        "source": {"kind": config.source_kind, "path": str(config.source_path)},
        "endpoint": config.endpoint,
        "tokenizer": counter.name if counter is not None else None,
        "buckets": spec.to_dict() if config.shares is not None else
        {"short_max": spec.short_max, "long_min": spec.long_min, "shares": "native"},
        "n": config.n,
        "seed": config.seed,
        "prefix_sharing": config.prefix_sharing,
    }
    return BuiltWorkload(out[WORKLOAD_SCHEMA.names], report, metadata)


def _scrubbed(frame: pd.DataFrame, scrubber: Scrubber, source_path: str) -> pd.DataFrame:
    """Prompts and messages scrubbed (a prompt that is the last message's text, once), the
    session ids hashed."""
    prompts: list[str | None] = []
    messages: list[list[dict[str, Any]] | None] = []
    for prompt, msgs in zip(frame["prompt"], frame["messages"], strict=True):
        clean_msgs = scrubber.scrub_messages(msgs) if isinstance(msgs, list) else None
        if isinstance(prompt, str) and clean_msgs and prompt == msgs[-1]["content"]:
            prompts.append(clean_msgs[-1]["content"])  # the same text: scrub (and count) once
        else:
            prompts.append(scrubber.scrub(prompt) if isinstance(prompt, str) else None)
        messages.append(clean_msgs)
    frame["prompt"], frame["messages"] = prompts, messages
    frame["session_id"] = frame["session_id"].map(_session_hasher(source_path))
    return frame


def _rows_that_fit(frame: pd.DataFrame, config: BuildConfig, counter: TokenCounter | None
                   ) -> tuple[pd.DataFrame, int, int]:
    """The rows within ``max_model_len`` and, with a tokenizer, longer than the endpoint's
    template; with how many were left out for each. Raises SamplingError when none is left."""
    over_limit = 0
    if config.max_model_len is not None:
        fits = (frame["prompt_tokens"] + frame["output_tokens"]) <= config.max_model_len
        over_limit = int((~fits).sum())
        frame = frame[fits.to_numpy()].reset_index(drop=True)
        if frame.empty:
            raise SamplingError(f"no log row fits max_model_len={config.max_model_len}")
    below_template = 0
    if counter is not None:
        # A count-only row shorter than what the endpoint adds around any prompt (BOS, chat
        # template) cannot be matched exactly: leave it out and count it, like over-long rows.
        overhead = PromptSynthesizer(counter, config.endpoint, config.seed).measure("")
        has_text = [isinstance(p, str) or isinstance(m, list)
                    for p, m in zip(frame["prompt"], frame["messages"], strict=True)]
        feasible = np.asarray(has_text) | (frame["prompt_tokens"].to_numpy() > overhead)
        below_template = int((~feasible).sum())
        frame = frame[feasible].reset_index(drop=True)
        if frame.empty:
            raise SamplingError(f"no log row is longer than the endpoint's {overhead} "
                                "template tokens")
    return frame, over_limit, below_template


def _draw(frame: pd.DataFrame, log: LogRead, config: BuildConfig, spec: BucketSpec
          ) -> tuple[pd.DataFrame, dict[str, int], np.ndarray]:
    """``n`` rows: the log in order, looped (no ``shares``), or sampled to the bucket mix;
    with the distinct rows per bucket and each row's offset on the log's timeline."""
    if config.shares is None:
        positions = np.resize(np.arange(len(frame)), config.n)
        distinct = {b: int(frame["bucket"].iloc[np.unique(positions)].eq(b).sum())
                    for b in BUCKETS}
        offsets = _looped(frame["timestamp_s"].to_numpy(dtype="float64"), config.n)
    else:
        rng = np.random.default_rng(config.seed)
        positions, distinct = sample_mix(frame["bucket"], config.n, spec.shares, rng)
        # the whole log's timeline, rows left out for length included: its arrival process
        offsets = _looped(log.frame["timestamp_s"].to_numpy(dtype="float64"), config.n)
    return frame.iloc[positions].reset_index(drop=True), distinct, offsets


def _fill_prompts(
    out: pd.DataFrame, drawn: pd.DataFrame, config: BuildConfig, counter: TokenCounter | None
) -> dict[str, Any]:
    """Logged text goes in as is (scrubbed); rows with counts only get synthesized prompts."""
    synth = PromptSynthesizer(counter, config.endpoint, config.seed) if counter else None
    stats: dict[str, Any] = {
             "counter": counter.name if counter else None, "endpoint": config.endpoint,
             "from_log": 0, "synthesized": 0, "exact": 0, "inexact": 0, "without_nonce": 0,
             "not_built": 0,
             # tokens the endpoint adds around any prompt (BOS, chat template): shorter logged
             # prompts cannot be matched and are the usual reason for "inexact"
             "overhead_tokens": synth.measure("") if synth else None}
    for i in range(len(out)):
        prompt, messages = drawn.at[i, "prompt"], drawn.at[i, "messages"]
        if isinstance(prompt, str) or isinstance(messages, list):
            if config.endpoint == "chat":
                msgs = messages if isinstance(messages, list) else [
                    {"role": "user", "content": prompt}]
                out.at[i, "messages"] = json.dumps(msgs, ensure_ascii=False)
            else:
                out.at[i, "prompt"] = prompt
            out.at[i, "prompt_source"] = "log"
            stats["from_log"] += 1
            continue
        if synth is None:
            stats["not_built"] += 1
            continue
        ids = out.at[i, "prefix_block_ids"] if config.prefix_sharing else None
        built = synth.build(out.at[i, "request_id"], int(out.at[i, "prompt_tokens"]), ids)
        out.at[i, "prompt"] = built.prompt
        if built.messages is not None:
            out.at[i, "messages"] = json.dumps(built.messages, ensure_ascii=False)
        out.at[i, "prompt_tokens"] = built.prompt_tokens
        out.at[i, "prompt_source"] = "synthesized"
        stats["synthesized"] += 1
        stats["exact" if built.exact else "inexact"] += 1
        stats["without_nonce"] += 0 if built.has_nonce else 1
    return stats


def _report(
    config: BuildConfig,
    spec: BucketSpec,
    log: LogRead,
    scrubber: Scrubber,
    log_frame: pd.DataFrame,
    out: pd.DataFrame,
    distinct: dict[str, int],
    synthesis: dict[str, Any],
) -> dict[str, Any]:
    per_bucket = {}
    for b in BUCKETS:
        in_log = log_frame[log_frame["bucket"] == b]
        in_out = out[out["bucket"] == b]
        per_bucket[b] = {
            "target_share": None if config.shares is None else spec.shares.get(b, 0.0),
            "native_share": round(len(in_log) / len(log_frame), 6),
            "log_rows": int(len(in_log)),
            "count": int(len(in_out)),
            "share": round(len(in_out) / len(out), 6),
            "distinct_log_rows": distinct.get(b, 0),
            "uses_per_row": round(len(in_out) / distinct[b], 3) if distinct.get(b) else None,
            "prompt_tokens": {"workload": _stats(in_out["prompt_tokens"]),
                              "log": _stats(in_log["prompt_tokens"].astype("float64"))},
            "output_tokens": {"workload": _stats(in_out["output_tokens"]),
                              "log": _stats(in_log["output_tokens"].astype("float64"))},
        }
    return {
        "source": {
            "kind": log.kind, "path": log.path, "rows_read": log.rows_read,
            "rows_valid": len(log.frame), "has_timing": log.has_timing,
            "bad_rows": log.bad_rows_summary(),
        },
        "scrub": scrubber.report.to_dict(),
        "buckets": {"short_max": spec.short_max, "long_min": spec.long_min,
                    "mix": "native" if config.shares is None else spec.shares},
        "n": len(out),
        "seed": config.seed,
        "per_bucket": per_bucket,
        "arrivals": {"log": arrival_stats(log_frame["timestamp_s"]),
                     "workload": arrival_stats(out["trace_offset_s"])},
        "synthesis": synthesis,
    }
