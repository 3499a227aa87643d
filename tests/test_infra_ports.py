"""Ports for the processes swarmload starts come from outside the kernel's ephemeral range, so
the outgoing connections of a load test cannot take one between the pick and the bind."""

from __future__ import annotations

import socket

import pytest

from infra.ports import ephemeral_range, free_port


def test_picked_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert not any(low <= p <= high for p in ports), (low, high, ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    from infra import ports

    base = free_port()
    span = (base, base + 2)
    monkeypatch.setattr(ports, "_pick_span", lambda: span)
    monkeypatch.setattr(ports, "_handed_out", set())
    held = []
    try:
        for port in (base, base + 1):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        assert free_port() == base + 2
    finally:
        for sock in held:
            sock.close()


def test_an_ipv6_loopback_port() -> None:
    port = free_port("::1")
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::1", port))
