"""Events a worker read together: why they carry the later time (the kernel's own doing), and
the bound merged_reads puts on each request's TTFT."""

from __future__ import annotations

import socket
import struct
import sys
import time

import numpy as np
import pytest

from collectors.itl_gaps import merged_reads

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
EVENT = b"data: {\"choices\":[{\"text\":\" word\"}]}\n\n"


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive stamps (SO_TIMESTAMPNS)")
def test_events_queued_behind_a_late_reader_all_carry_the_last_ones_stamp() -> None:
    """Four events 20 ms apart, read 50 ms after the last: however small the reads, every one
    is stamped with the last event's arrival (the kernel merges queued segments into one, with
    the later time), so a worker that fell a token behind cannot get the earlier times back:
    it can only bound them (merged_reads)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    reader = socket.create_connection(server.getsockname())
    writer, _ = server.accept()
    writer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    try:
        sent = []
        for _ in range(4):
            writer.send(EVENT)
            sent.append(time.time_ns())
            time.sleep(0.02)
        time.sleep(0.05)
        stamps = []
        for _ in range(4):  # one event's bytes a read
            data, ancillary, _flags, _addr = reader.recvmsg(len(EVENT), 1024)
            assert data == EVENT
            (raw,) = [r for _level, kind, r in ancillary if kind == SO_TIMESTAMPNS]
            seconds, nanos = struct.unpack("qq", raw[:16])
            stamps.append(seconds * 1_000_000_000 + nanos)
    finally:
        for sock in (reader, writer, server):
            sock.close()
    late_ms = [(stamp - at) / 1e6 for stamp, at in zip(stamps, sent, strict=True)]
    assert late_ms[-1] < 5  # the last event's own time ...
    assert late_ms[0] > 40  # ... on the first too: 60 ms after it landed


def test_the_bound_is_the_leading_merged_gaps_times_the_mean_other_gap() -> None:
    rng = np.random.default_rng(0)
    answers = [rng.choice([0.0, 0.01, 0.03], size=rng.integers(0, 7), p=[0.4, 0.3, 0.3])
               for _ in range(2000)]
    lengths = np.array([len(a) for a in answers])
    gaps = np.concatenate(answers)
    merged = merged_reads(gaps, np.repeat(np.arange(len(answers)), lengths), len(answers))
    for i, answer in enumerate(answers):
        lead = next((k for k, gap in enumerate(answer) if gap != 0.0), len(answer))
        others = answer[answer != 0.0]
        assert merged["lead_merged"][i] == lead
        assert merged["merged_gaps"][i] == int((answer == 0.0).sum())
        assert merged["ttft_bound_s"][i] == pytest.approx(
            lead * (others.mean() if others.size else 0.0))
