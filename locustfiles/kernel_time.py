"""Kernel receive timestamps (``SO_TIMESTAMPNS``) for TCP sockets: what a socket must ask for and
how to read the stamp a ``recvmsg`` brings. Stdlib only, so the bench target uses it too.

The stamp is CLOCK_REALTIME nanoseconds of the last segment the read took (the kernel merges
segments that wait in the socket, and the merged one carries the later time)."""

from __future__ import annotations

import socket
import struct
import sys

# 35 on Linux (asm-generic); Python 3.11's socket module does not name it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35) if sys.platform == "linux" else None
ANCILLARY_SIZE = socket.CMSG_SPACE(16)  # one struct timespec
_TIMESPEC = struct.Struct("@qq")


def ask_for_timestamps(sock: socket.socket) -> bool:
    """Turn receive timestamps on for ``sock``; False where the kernel cannot."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def stamp_of(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The wall-clock ns a ``recvmsg``'s ancillary data carries; 0 when the kernel gave none."""
    if not ancillary:
        return 0
    seconds, nanoseconds = _TIMESPEC.unpack_from(ancillary[-1][2])
    return seconds * 1_000_000_000 + nanoseconds
