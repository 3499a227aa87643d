"""The facts a manifest records about the processes and the machine (versions, hosts, labels,
the redacted command), and the manifest of a plain ``locust -f`` run.

The manifest itself (its fields, the reader and the one writer) is
:class:`collectors.run_folder.Manifest`.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from collectors.headers import redact_header
from collectors.run_folder import MANIFEST_NAME, update_manifest

_PACKAGES = ("swarmload", "locust", "gevent", "httpx", "pyarrow", "pandas", "nvidia-ml-py")


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def this_host(role: str, pid: int | None = None) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "role": role,
        "pid": pid if pid is not None else os.getpid(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": sys.executable,
    }


def parse_labels(pairs: Iterable[str]) -> dict[str, str]:
    """``["engine=vllm-0.26", ...]`` -> ``{"engine": "vllm-0.26"}``, the manifest's ``labels``.

    A pair without ``=`` or with an empty key is an error that names it; a later pair of the
    same key wins.
    """
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {pair!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


_SECRET_VALUED = ("--header", "--swarmload-headers")


def redacted_command(argv: list[str]) -> list[str]:
    """``argv`` with header values replaced by ``<redacted>``: they may hold credentials. (API
    keys never appear: they are read from the environment or a file.)"""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if hide_next:
            out.append(_redact_headers(arg))
            hide_next = False
        elif arg in _SECRET_VALUED:
            out.append(arg)
            hide_next = True
        elif eq and flag in _SECRET_VALUED:
            out.append(f"{flag}={_redact_headers(value)}")
        else:
            out.append(arg)
    return out


def _redact_headers(text: str) -> str:
    return "\n".join(redact_header(line) for line in text.splitlines())


def register_own_manifest(environment: Any, run_dir: str | os.PathLike[str] | None,
                          facts: Callable[[], dict[str, Any]]) -> bool:
    """For a Locust master or local runner started without ``swarmload run`` (plain ``locust
    -f locustfiles/llm_user.py``): write the run folder's manifest at test start (``facts()`` plus
    status, times, command, versions, host) and finish it at quit, so the run shows in the
    dashboard like any other. Does nothing (returns False) when a manifest exists already: the
    orchestrator that wrote it owns it."""
    if not run_dir or (Path(run_dir) / MANIFEST_NAME).exists():
        return False

    def started(**_kwargs: Any) -> None:
        update_manifest(run_dir, status="running", started_at=utc_now_iso(), ended_at=None,
                        command=redacted_command(sys.argv), launcher="locust",
                        versions=package_versions(), hosts=[this_host("locust")], **facts())

    def finished(**_kwargs: Any) -> None:
        manifest = Path(run_dir) / MANIFEST_NAME
        if not manifest.exists():
            return
        recorder_stats = Path(run_dir) / "recorder_stats.json"
        recorder = json.loads(recorder_stats.read_text()) if recorder_stats.exists() else None
        update_manifest(run_dir, status="finished", ended_at=utc_now_iso(), recorder=recorder)

    environment.events.test_start.add_listener(started)
    environment.events.quit.add_listener(finished)  # after the recorder's own quit listener
    return True
