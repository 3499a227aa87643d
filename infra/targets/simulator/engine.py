"""When tokens come out: the continuous-batching engine and the two load-independent pacers.

A :class:`Sequence` is one request in flight. A *producer* (``BatchingEngine``, ``FixedPacer``,
``ZeroLatencyPacer``) decides when each of its tokens exists and calls
:meth:`Sequence.emit_token` (append the pre-encoded SSE event) then :meth:`Sequence.flush` (write
it to the socket as one HTTP chunk). The HTTP handler that owns the response only sends the
headers, waits for ``seq.ended`` and finishes the body. Handlers never decide timing.

Batching model (one engine loop, like vLLM's scheduler at token granularity): at most
``max_num_seqs`` sequences run, the rest wait FIFO. Each step first admits waiting sequences (while
a slot and KV cache room are free), costing ``prefill_base_s + prefill_per_token_s * tokens`` of
the admitted ones, then decodes one token for every running sequence in
``decode_base_s + decode_per_seq_s * running``. When the KV cache cannot hold the next token of
every running sequence, the newest is preempted back to the head of the queue (recompute: its
prompt and generated tokens are prefilled again on re-admission).

All deadlines are absolute ``loop.time()`` values: a late wake-up never shifts later tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import mmap
import random
from collections import deque
from typing import TYPE_CHECKING, Protocol

from infra.targets.simulator.protocol import VOCAB_SIZE, ChunkEncoder, GenerationRequest

if TYPE_CHECKING:
    from infra.targets.simulator.metrics import SimulatorMetrics
    from infra.targets.simulator.settings import SimulatorConfig

# Tokens written per wake-up in zero-latency mode: large enough to amortise a write, small enough
# that thousands of streams interleave; and the unread bytes at which a stream pauses.
ZERO_LATENCY_BATCH = 16
ZERO_LATENCY_BACKLOG_BYTES = 256 * 1024
# Fixed-timing deadlines share one timer per slot of this width (see FixedPacer).
FIXED_TIMER_SLOT_S = 0.00025
FIXED_WAKE_EARLY_S = 0.0012
FIXED_SPIN_TOLERANCE_S = 0.00002
# The engine makes up at most this much lost time after a stall (see BatchingEngine._run).
MAX_STEP_CATCH_UP_S = 0.1
SLOW_START_IDLE_S = 2.0  # idle this long, and the engine is slow again (slow_start_s)


class LatencyCreep:
    """A slow, known slowdown for soak tests: ``factor(t) = 1 + pct/100 * hours since start``.

    Times are ``loop.time()`` values; before :meth:`start` (or with 0 %/h) the factor is 1.
    """

    def __init__(self, pct_per_h: float) -> None:
        self.per_s = pct_per_h / 100.0 / 3600.0
        self.t0: float | None = None

    def start(self) -> None:
        if self.per_s:
            self.t0 = asyncio.get_running_loop().time()

    def factor(self, now: float) -> float:
        if self.t0 is None:
            return 1.0
        return 1.0 + self.per_s * max(0.0, now - self.t0)


class SlowStart:
    """Step costs x ``factor(t)``: ``slow_start_factor`` at the first request after the engine
    was idle for :data:`SLOW_START_IDLE_S` or more (or ever), falling linearly to 1 over
    ``slow_start_s``: a server that is slow for the first seconds of every load it is given."""

    def __init__(self, seconds: float, factor: float) -> None:
        self.seconds = seconds
        self.extra = factor - 1.0
        self.t0: float | None = None

    def idle(self, seconds: float) -> None:
        """The engine had nothing to do for ``seconds``: after long enough, start cold again."""
        if seconds >= SLOW_START_IDLE_S:
            self.t0 = None

    def factor(self, now: float) -> float:
        if not self.seconds or not self.extra:
            return 1.0
        if self.t0 is None:
            self.t0 = now
        return 1.0 + self.extra * max(0.0, 1.0 - (now - self.t0) / self.seconds)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has unwound."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class MemoryLeak:
    """A slow, known leak for soak tests: ``mb_per_min`` MiB of touched memory a minute, kept.

    Grows five times a second, so the process's RSS rises as a straight line. The memory is
    anonymous mappings of ``CHUNK_BYTES`` whose pages are written step by step (a written page
    is resident): nothing goes through malloc, so the leak neither fragments the heap nor makes
    the rest of the process grow, and the RSS rises by exactly the rate asked.
    """

    STEP_S = 0.2
    CHUNK_BYTES = 64 * 1024 * 1024

    def __init__(self, mb_per_min: float) -> None:
        self.bytes_per_step = int(mb_per_min * 1024 * 1024 / 60.0 * self.STEP_S)
        self.kept: list[mmap.mmap] = []
        self.leaked_bytes = 0
        self._pattern = b"\xa5" * min(self.bytes_per_step, self.CHUNK_BYTES)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.bytes_per_step > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-leak")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def step(self) -> None:
        left = self.bytes_per_step
        while left > 0:
            used = self.leaked_bytes % self.CHUNK_BYTES
            if used == 0:
                self.kept.append(mmap.mmap(-1, self.CHUNK_BYTES))
            n = min(left, self.CHUNK_BYTES - used, len(self._pattern))
            self.kept[-1][used:used + n] = self._pattern[:n]
            self.leaked_bytes += n
            left -= n

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_step = loop.time()
        while True:
            self.step()
            next_step += self.STEP_S
            await asyncio.sleep(max(0.0, next_step - loop.time()))


class Sequence:
    """One request in flight: its plan (lengths, faults), progress, and undelivered bytes.

    Streaming bytes go straight from :meth:`flush` to the socket as HTTP/1.1 chunks (the
    handler has already sent chunked headers through aiohttp, and sends the final zero chunk
    through it too), so a token costs one ``transport.write`` and no task switch. This relies on
    aiohttp's ``StreamResponse.prepare`` writing the headers at once (true for 3.x, which sends
    them immediately); the wire-format tests would catch a version that buffered them.
    """

    __slots__ = (
        "request", "encoder", "stream", "output_len", "finish_reason", "cut_after",
        "token_offset", "generated", "kv_tokens", "arrival", "admitted_at", "first_token_at",
        "finished_at", "pending", "ended", "done", "cut", "aborted", "client_left", "transport",
        "request_id",
    )

    def __init__(
        self, request: GenerationRequest, encoder: ChunkEncoder, *, output_len: int,
        cut_after: int | None, token_offset: int, arrival: float,
        transport: asyncio.Transport | None = None,
    ) -> None:
        self.request = request
        self.encoder = encoder
        self.stream = request.stream
        self.output_len = output_len
        self.finish_reason = "length" if output_len >= request.max_tokens else "stop"
        self.cut_after = cut_after
        self.token_offset = token_offset
        self.generated = 0
        self.kv_tokens = 0
        self.arrival = arrival
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.pending: list[bytes] = []
        # Resolved when the handler has something to do: generation over, or the client left.
        self.ended: asyncio.Future[None] | None = None
        self.done = False
        self.cut = False
        self.aborted = False
        self.client_left = False
        # Set by the handler once the chunked response headers are out; None: buffer only.
        self.transport = transport
        self.request_id: str | None = None  # the client's X-Request-Id (--request-log)

    def emit_token(self, now: float) -> None:
        """Produce the next token (and, after the last, the usage chunk and ``[DONE]``)."""
        n = self.generated + 1
        self.generated = n
        if n == 1:
            self.first_token_at = now
        last = n >= self.output_len
        if self.stream:
            k = self.token_offset + n - 1
            encoder = self.encoder
            if n == 1 and encoder.tool_name is not None:
                self.pending.append(encoder.tool_call_head())
            if last:
                self.pending.append(encoder.last_token_chunk(k, self.finish_reason, n))
            elif n <= encoder.reasoning_events:
                self.pending.append(encoder.reasoning_prefix + encoder.token_tails[k % VOCAB_SIZE])
            else:
                self.pending.append(encoder.token_prefix + encoder.token_tails[k % VOCAB_SIZE])
        if n == self.cut_after:
            self.cut = True
            self.done = True
            self.finished_at = now
        elif last:
            self.done = True
            self.finished_at = now
            if self.stream:
                if self.request.include_usage:
                    self.pending.append(self.encoder.usage_chunk(self.request.prompt_tokens, n))
                self.pending.append(self.encoder.done_event)

    def flush(self) -> None:
        """Write pending events as one HTTP chunk; tell the handler when the end has come."""
        transport = self.transport
        if self.pending and transport is not None:
            if transport.is_closing():
                self.client_left = True
            else:
                pending = self.pending
                data = pending[0] if len(pending) == 1 else b"".join(pending)
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))
            self.pending = []
        if self.done or self.client_left:
            ended = self.ended
            if ended is not None and not ended.done():
                ended.set_result(None)

    def backlog(self) -> int:
        """Bytes written but not yet taken by the client (kernel buffer excluded)."""
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def client_gone(self) -> bool:
        return self.client_left or (self.transport is not None and self.transport.is_closing())


class Producer(Protocol):
    def start(self) -> None: ...
    async def stop(self) -> None: ...
    def submit(self, seq: Sequence) -> None: ...
    def abort(self, seq: Sequence) -> None: ...
    def state(self) -> tuple[int, int, float]:
        """(running, waiting, KV cache usage as a fraction of capacity)."""
        ...


def plan_output_len(request: GenerationRequest, rng: random.Random) -> int:
    """``ignore_eos`` -> exactly ``max_tokens``; else a seeded uniform stop in [min, max]."""
    if request.ignore_eos:
        return request.max_tokens
    return rng.randint(max(request.min_tokens, 1), request.max_tokens)


def _wake_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    """Sleep to an absolute ``loop.time()`` deadline (no drift from computing a delay)."""
    if deadline <= loop.time():
        await asyncio.sleep(0)
        return
    future: asyncio.Future[None] = loop.create_future()
    handle = loop.call_at(deadline, _wake_future, future)
    try:
        await future
    finally:
        handle.cancel()


class BatchingEngine:
    """Continuous batching with a capacity: see the module docstring for the cost model."""

    def __init__(self, config: SimulatorConfig, metrics: SimulatorMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_used = 0
        self._idle: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.creep = LatencyCreep(config.ttft_creep_pct_per_h)
        self.slow_start = SlowStart(config.slow_start_s, config.slow_start_factor)

    def start(self) -> None:
        self.creep.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def submit(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        if self._idle is not None:
            _wake_future(self._idle)

    def abort(self, seq: Sequence) -> None:
        if seq.done or seq.aborted:
            return
        seq.aborted = True
        try:
            self.waiting.remove(seq)  # running ones are dropped at the next step
        except ValueError:
            pass

    def state(self) -> tuple[int, int, float]:
        return len(self.running), len(self.waiting), self.kv_used / self.config.kv_cache_tokens

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        while True:
            cfg = self.config  # read each step: POST /admin/knobs may change it (a slow fault)
            if not self.running and not self.waiting:
                self._idle = loop.create_future()
                idle_since = loop.time()
                await self._idle
                self._idle = None
                next_start = loop.time()
                self.slow_start.idle(next_start - idle_since)
            # Steps follow each other on an absolute schedule, so the simulator's own work per
            # step (thousands of writes) does not stretch the modelled step time; a stall
            # longer than MAX_STEP_CATCH_UP_S is not made up in a burst.
            start = max(next_start, loop.time() - MAX_STEP_CATCH_UP_S)
            duration = self._admit(start)
            self._preempt_to_fit()
            if not self.running:
                continue
            duration += cfg.decode_base_s + cfg.decode_per_seq_s * len(self.running)
            duration *= self.slow_start.factor(start)
            deadline = start + duration
            await sleep_until(loop, deadline)
            self._decode(loop.time())
            next_start = deadline

    def _admit(self, now: float) -> float:
        """Move waiting sequences into the batch; return the prefill time they add."""
        cfg = self.config
        admitted_tokens = 0
        admitted = 0
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            if seq.aborted or seq.client_gone():
                self.waiting.popleft()
                seq.client_left = True
                seq.flush()  # lets its handler finish
                continue
            need = seq.request.prompt_tokens + seq.generated
            # Keep room for this step's token of every running sequence, the new one included.
            if self.kv_used + need + len(self.running) + 1 > cfg.kv_cache_tokens:
                break
            self.waiting.popleft()
            seq.kv_tokens = need
            self.kv_used += need
            self.running.append(seq)
            if seq.admitted_at is None:
                seq.admitted_at = max(now, seq.arrival)
            admitted_tokens += need
            admitted += 1
        if not admitted:
            return 0.0
        prefill = cfg.prefill_base_s + cfg.prefill_per_token_s * admitted_tokens
        return prefill * self.creep.factor(now)

    def _preempt_to_fit(self) -> None:
        capacity = self.config.kv_cache_tokens
        while len(self.running) > 1 and self.kv_used + len(self.running) > capacity:
            victim = self.running.pop()
            self.kv_used -= victim.kv_tokens
            victim.kv_tokens = 0
            self.waiting.appendleft(victim)
            self.metrics.num_preemptions.inc()

    def _decode(self, now: float) -> None:
        still_running: list[Sequence] = []
        produced = 0
        for seq in self.running:
            if seq.aborted:
                self.kv_used -= seq.kv_tokens
                continue
            seq.emit_token(now)
            seq.flush()
            produced += 1
            if seq.done or seq.client_left:
                self.kv_used -= seq.kv_tokens
            else:
                seq.kv_tokens += 1
                self.kv_used += 1
                still_running.append(seq)
        self.running = still_running
        self.metrics.pending_generation_tokens += produced


class _PacerBase:
    """Shared bookkeeping of the load-independent modes: every request runs at once."""

    def __init__(self, config: SimulatorConfig, metrics: SimulatorMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.active: set[Sequence] = set()
        self.creep = LatencyCreep(config.ttft_creep_pct_per_h)

    def start(self) -> None:
        self.creep.start()

    async def stop(self) -> None:
        pass

    def abort(self, seq: Sequence) -> None:
        seq.aborted = True
        self.active.discard(seq)

    def state(self) -> tuple[int, int, float]:
        used = sum(s.request.prompt_tokens + s.generated for s in self.active)
        return len(self.active), 0, used / self.config.kv_cache_tokens


class FixedPacer(_PacerBase):
    """Token ``i`` (from 0) exists at ``arrival + fixed_ttft_s + i * fixed_itl_s``, any load;
    with ``fixed_itl_per_seq_s`` each gap after the first token is ``fixed_itl_s`` plus that
    much per stream in flight when the token before it went out (TPOT grows with the load,
    TTFT does not).

    Deadlines share timers in slots of ``FIXED_TIMER_SLOT_S``: with thousands of streams one
    timer serves many tokens, which keeps asyncio's timer heap (a Python-level comparison per
    sift step) off the per-token cost. Slots are centred on the deadlines (rounding, not
    truncation), so the error they add averages zero and stays under half a slot.
    """

    def __init__(self, config: SimulatorConfig, metrics: SimulatorMetrics) -> None:
        super().__init__(config, metrics)
        self.set_config(config)
        self._jitter = config.fixed_ttft_jitter
        self._jitter_rng = random.Random(config.seed)
        self._slots: dict[int, list[Sequence]] = {}
        self._ttft_of: dict[int, float] = {}  # id(seq) -> its first-token delay, with jitter

    def set_config(self, config: SimulatorConfig) -> None:
        """New timing knobs (POST /admin/knobs); requests already in flight keep their first
        token's delay, their later tokens follow the new gap."""
        self.config = config
        self._ttft_s = config.fixed_ttft_s or 0.0
        self._itl_s = config.fixed_itl_s or 0.0
        self._itl_per_seq_s = config.fixed_itl_per_seq_s

    def _first_token_delay(self) -> float:
        if not self._jitter:
            return self._ttft_s
        return self._ttft_s * math.exp(self._jitter_rng.gauss(0.0, self._jitter))

    def submit(self, seq: Sequence) -> None:
        self.active.add(seq)
        seq.admitted_at = seq.arrival
        delay = self._first_token_delay() * self.creep.factor(seq.arrival)
        if self._jitter or self.creep.per_s:
            self._ttft_of[id(seq)] = delay
        self._schedule(seq, seq.arrival + delay)

    def _schedule(self, seq: Sequence, deadline: float) -> None:
        slot = round(deadline / FIXED_TIMER_SLOT_S)
        waiting = self._slots.get(slot)
        if waiting is not None:
            waiting.append(seq)
            return
        self._slots[slot] = [seq]
        # Wake a little early, then yield to the loop until the slot's time: epoll rounds its
        # timeout up to whole milliseconds, so a plain timer fires up to 1 ms late, which is
        # the whole error budget of a timing test. Only this mode (meant for timing tests) pays
        # for the short spin.
        asyncio.get_running_loop().call_at(
            slot * FIXED_TIMER_SLOT_S - FIXED_WAKE_EARLY_S, self._fire, slot
        )

    def _fire(self, slot: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < slot * FIXED_TIMER_SLOT_S - FIXED_SPIN_TOLERANCE_S:
            loop.call_soon(self._fire, slot)
            return
        produced = 0
        for seq in self._slots.pop(slot):
            if seq.aborted:
                self._ttft_of.pop(id(seq), None)
                continue
            seq.emit_token(now)
            seq.flush()
            produced += 1
            if seq.done or seq.client_left:
                self.active.discard(seq)
                self._ttft_of.pop(id(seq), None)
            elif self._itl_per_seq_s:  # the gap from this token on grows with the streams
                self._schedule(seq, slot * FIXED_TIMER_SLOT_S + self._itl_s
                               + self._itl_per_seq_s * len(self.active))
            else:
                ttft = self._ttft_of.get(id(seq), self._ttft_s)
                self._schedule(seq, seq.arrival + ttft + seq.generated * self._itl_s)
        self.metrics.pending_generation_tokens += produced


class ZeroLatencyPacer(_PacerBase):
    """Tokens as fast as the loop can write them, ``ZERO_LATENCY_BATCH`` per turn.

    Back-pressure: while a client has more than ``ZERO_LATENCY_BACKLOG_BYTES`` unread, its
    stream pauses (polled every millisecond), so a slow reader never piles up memory.
    """

    def submit(self, seq: Sequence) -> None:
        self.active.add(seq)
        seq.admitted_at = seq.arrival
        asyncio.get_running_loop().call_soon(self._tick, seq)

    def _tick(self, seq: Sequence) -> None:
        if seq.aborted or seq.done:
            return
        loop = asyncio.get_running_loop()
        if seq.backlog() > ZERO_LATENCY_BACKLOG_BYTES:
            loop.call_later(0.001, self._tick, seq)
            return
        now = loop.time()
        budget = ZERO_LATENCY_BATCH if seq.stream else seq.output_len
        produced = 0
        while produced < budget and not seq.done:
            seq.emit_token(now)
            produced += 1
        seq.flush()
        self.metrics.pending_generation_tokens += produced
        if seq.done or seq.client_left:
            self.active.discard(seq)
        else:
            loop.call_soon(self._tick, seq)


def make_producer(config: SimulatorConfig, metrics: SimulatorMetrics) -> Producer:
    mode = config.mode
    if mode == "zero":
        return ZeroLatencyPacer(config, metrics)
    if mode == "fixed":
        return FixedPacer(config, metrics)
    return BatchingEngine(config, metrics)
