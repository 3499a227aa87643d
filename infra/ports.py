"""Loopback ports for the processes swarmload starts (Locust master, vLLM, the dashboard)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the dashboard's, the orchestrator's
    Locust master's, a vLLM server's)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
