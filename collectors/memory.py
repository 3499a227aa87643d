"""Hand a long-running process's free memory back to the system (soaks: days of RSS).

A burst (a stalled master catching up on its workers' records, a worker holding records while
its master is away) leaves memory that Python and Arrow have already freed inside the process:
glibc keeps freed heap pages for reuse and Arrow's allocator (mimalloc or jemalloc) keeps freed
segments, so RSS stays at the burst's high-water mark for the rest of the run although nothing
is held. :func:`release_free_memory` returns both to the system; a soak's master and workers
call it every :data:`RELEASE_EVERY_S`. It costs a few milliseconds (a walk of the heap).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time

RELEASE_EVERY_S = 30.0

_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet; None: not glibc


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is False:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
            _libc = libc
        except (OSError, AttributeError):  # not glibc: nothing to trim this way
            _libc = None
    return _libc if isinstance(_libc, ctypes.CDLL) else None


def release_free_memory() -> float:
    """Return freed memory that this process keeps to the system; seconds it took."""
    started = time.perf_counter()
    pyarrow = sys.modules.get("pyarrow")  # only if the process uses Arrow at all
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    return time.perf_counter() - started
