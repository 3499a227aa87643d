"""Loopback ports for the processes swarmload starts (Locust master, vLLM, the dashboard)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# The kernel hands ports from its ephemeral range to every outgoing connection. A port picked
# there can be taken by one (a load test opens thousands) between the pick and the server's
# bind, so picks come from below that range.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_RANGE_DEFAULT = (32768, 60999)
LOWEST_PICK = 10000
PICK_ATTEMPTS = 200

_picker = random.Random(os.urandom(16))  # its own: a test's random.seed() must not align picks
_handed_out: set[tuple[str, int]] = set()


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_RANGE_DEFAULT
    return low, high


def _pick_span() -> tuple[int, int]:
    """Ports outside the ephemeral range: below it where there is room, else above it."""
    low, high = ephemeral_range()
    if low - LOWEST_PICK >= 1000:
        return LOWEST_PICK, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    return 1024, 65535


def _socket_for(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)


def _bindable(host: str, port: int) -> bool:
    with _socket_for(host) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the dashboard's, the orchestrator's
    Locust master's, a vLLM server's), outside the kernel's ephemeral range and not handed out
    before by this process."""
    first, last = _pick_span()
    for _ in range(PICK_ATTEMPTS):
        port = _picker.randint(first, last)
        if (host, port) not in _handed_out and _bindable(host, port):
            _handed_out.add((host, port))
            return port
    with _socket_for(host) as sock:  # a crowded host: the kernel's pick
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
