"""The workloads error tree: every error this package raises on bad input derives from one base.

    WorkloadError                 base: catch this to handle any workload problem
    ├── LogFormatError            the file cannot be read as the named format: missing or unknown
    │                             columns, a bad column mapping, unreadable file
    ├── BadRowsError              strict mode only: rows failed validation (``.bad_rows`` lists
    │                             them with their line numbers)
    ├── TimestampError            timestamps go backwards (and sorting was not asked for)
    ├── EmptyLogError             no usable row is left after validation
    ├── SamplingError             the target mix cannot be drawn from the log (an empty bucket)
    ├── SynthesisError            a tokenizer cannot be loaded or reached
    ├── PlanError                 an arrival plan is invalid (unknown kind, bad parameter)
    ├── ScrubError                text that still holds identifiers was about to be stored
    └── BucketSpecError           thresholds or shares are inconsistent (also a ValueError)

Messages name the offending input (file, line, column, value) and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass


class WorkloadError(Exception):
    """Base of every error raised by the workloads package for bad input or configuration."""


class LogFormatError(WorkloadError):
    """The file does not match its format: missing/unknown columns, bad mapping, unreadable."""


@dataclass(frozen=True)
class BadRow:
    """One rejected log row: ``line`` is 1-based in the file (record number for JSON arrays and
    Parquet), ``reason`` a short fixed phrase so rows can be counted per reason."""

    line: int
    reason: str


class BadRowsError(WorkloadError):
    """Raised in strict mode when any row fails validation."""

    def __init__(self, message: str, bad_rows: list[BadRow]):
        super().__init__(message)
        self.bad_rows = bad_rows


class TimestampError(WorkloadError):
    """Timestamps are not monotonic (non-decreasing) in file order."""


class EmptyLogError(WorkloadError):
    """No usable row remains."""


class SamplingError(WorkloadError):
    """The requested mix cannot be sampled from the log."""


class SynthesisError(WorkloadError):
    """A tokenizer cannot be loaded or reached, or a prompt cannot be built."""


class PlanError(WorkloadError):
    """An arrival plan is invalid."""


class ScrubError(WorkloadError):
    """Text about to be stored still matches an identifier pattern."""
