"""Prompt-length buckets: short / medium / long by prompt tokens, with target shares.

Defaults follow the product: short < 64 prompt tokens, medium 64-512, long > 512, mixed 45/40/15.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workloads.errors import WorkloadError

# The product's bucket defaults, written once here (the lowest module that needs them):
# locustfiles.config, the study file and `swarmload workload build` take them from these.
DEFAULT_MIX = "45/40/15"
DEFAULT_THRESHOLDS = "64,512"


class BucketSpecError(WorkloadError, ValueError):
    """A bucket specification is inconsistent (thresholds or shares)."""


@dataclass(frozen=True)
class BucketSpec:
    """Thresholds in prompt tokens and the target share of each bucket.

    ``short_max`` is exclusive (short: tokens < short_max); ``long_min`` is exclusive too
    (long: tokens > long_min); medium is everything in between, both ends included.
    """

    short_max: int = field(default_factory=lambda: parse_thresholds(DEFAULT_THRESHOLDS)[0])
    long_min: int = field(default_factory=lambda: parse_thresholds(DEFAULT_THRESHOLDS)[1])
    shares: dict[str, float] = field(default_factory=lambda: parse_shares(DEFAULT_MIX))

    def __post_init__(self) -> None:
        if not 0 < self.short_max <= self.long_min:
            raise BucketSpecError(
                f"need 0 < short_max <= long_min, got short_max={self.short_max} "
                f"long_min={self.long_min}"
            )
        unknown = set(self.shares) - set(BUCKETS)
        if unknown:
            raise BucketSpecError(f"unknown bucket(s) {sorted(unknown)}; valid: {list(BUCKETS)}")
        if any(v < 0 for v in self.shares.values()):
            raise BucketSpecError(f"shares must be >= 0, got {self.shares}")
        total = sum(self.shares.values())
        if abs(total - 1.0) > 1e-6:
            raise BucketSpecError(f"shares must sum to 1, got {total:.6f} from {self.shares}")

    def bucket_of(self, prompt_tokens: int) -> str:
        if prompt_tokens < self.short_max:
            return "short"
        if prompt_tokens > self.long_min:
            return "long"
        return "medium"

    def to_dict(self) -> dict[str, object]:
        return {"short_max": self.short_max, "long_min": self.long_min, "shares": self.shares}


BUCKETS = ("short", "medium", "long")


def parse_shares(text: str) -> dict[str, float]:
    """Parse "45/40/15" (percent, short/medium/long) or "short=0.45,medium=0.4,long=0.15"."""
    text = text.strip()
    try:
        if "=" in text:
            pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
            shares = {k.strip(): float(v) for k, v in pairs}
        else:
            parts = [float(p) for p in text.split("/")]
            if len(parts) != len(BUCKETS):
                raise BucketSpecError(f"expected 3 shares like 45/40/15, got {text!r}")
            shares = dict(zip(BUCKETS, parts, strict=True))
    except ValueError as exc:  # float('x'), or a pair without '='
        if isinstance(exc, BucketSpecError):
            raise
        raise BucketSpecError(f"expected shares like 45/40/15 or short=0.45,medium=0.4,"
                              f"long=0.15, got {text!r}") from exc
    total = sum(shares.values())
    if total > 1.5:  # given in percent
        shares = {k: v / 100.0 for k, v in shares.items()}
    return shares


def parse_thresholds(text: str) -> tuple[int, int]:
    """Parse "SHORT_MAX,LONG_MIN" prompt tokens, e.g. "64,512" (order checked by BucketSpec)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        short_max, long_min = int(parts[0]), int(parts[1])
    except ValueError:
        raise BucketSpecError(f"expected SHORT_MAX,LONG_MIN (two integers) like "
                              f"{DEFAULT_THRESHOLDS}, got {text!r}") from None
    return short_max, long_min
