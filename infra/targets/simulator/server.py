"""The aiohttp application: OpenAI-compatible routes over a producer from ``engine``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming SSE or whole JSON),
``POST /v1/responses`` (the Responses API's typed events; streamed only, as swarmload asks),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``POST /tokenize``, and ``GET``/``POST
/admin/knobs`` (the latency knobs while serving: a fault plan's ``slow``; loopback only).

``--request-log PATH``: one JSON line per generation request when it arrives (``{"event":
"start", "request_id", "wall_ns"}``) and one when it ends (``"event": "end"``, ``how``: its
finish reason, ``abort`` when the client left, ``cut``, or ``http_<status>``): the server's own
account, checked against the client's records after a fault (a killed server's requests have a
start and no end). A generation's end also carries the server's own timings, on its own clock,
from the moment its handler began: ``ttft_s`` (its first token written), ``e2e_s`` (its last) and
``tokens``, so a client's measurement can be compared with what the server did, request by
request, apart from the host's scheduling of the server itself.

The order of checks for a generation request is vLLM's: body and model, then context length (HTTP
400 before any byte of a stream), then the injected faults (``--error-rate`` -> HTTP 500). A
request picked by ``--cut-rate`` streams a seeded number of tokens, then its connection is closed
without the terminating chunk, the usage chunk or ``[DONE]``.

Chat streams send their role-only chunk as soon as the request is accepted (vLLM sends it just
before the first token): a client that counts it as a token then shows a TTFT near zero, which is
the point.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import resource
import signal
import ssl
import sys
import time
from typing import Any

import prometheus_client
from aiohttp import web

from infra.targets.simulator.engine import (
    MemoryLeak,
    Producer,
    Sequence,
    make_producer,
    plan_output_len,
)
from infra.targets.simulator.faults import FaultInjector
from infra.targets.simulator.metrics import PROMETHEUS_CONTENT_TYPE, SimulatorMetrics
from infra.targets.simulator.protocol import (
    TOOL_CALL_TOKENS,
    ChunkEncoder,
    RequestError,
    ResponsesEncoder,
    count_chat_tokens,
    count_prompt_tokens,
    full_response_body,
    generated_text,
    parse_generation_request,
    parse_responses_request,
    tool_call_name,
    word_token_ids,
)
from infra.targets.simulator.settings import (
    READY_LINE_PREFIX,
    RUNTIME_KNOBS,
    SimulatorConfig,
    SimulatorConfigError,
    parse_args,
)

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# Independent random streams, so that enabling one fault does not change the output lengths.
_ERROR_SEED_OFFSET = 1_000_003
_CUT_SEED_OFFSET = 2_000_029


def _echo_request_id(request: web.Request, headers: dict[str, str]) -> dict[str, str]:
    """vLLM echoes ``X-Request-Id`` (``--enable-request-id-headers``); so does the simulator."""
    request_id = request.headers.get("X-Request-Id")
    return {**headers, "X-Request-Id": request_id} if request_id else headers


def _error_response(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


class SimulatorServer:
    """Request handling for one served model; ``make_app`` wires it into aiohttp."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.metrics = SimulatorMetrics(config.model)
        self.producer: Producer = make_producer(config, self.metrics)
        self.leak = MemoryLeak(config.leak_mb_per_min)
        self._length_rng = random.Random(config.seed)
        self._error_rng = random.Random(config.seed + _ERROR_SEED_OFFSET)
        self._cut_rng = random.Random(config.seed + _CUT_SEED_OFFSET)
        self._requests_accepted = 0
        self.faults = FaultInjector(config.fault_cycle, config.fault_log, config.fault_stall_s,
                                    config.model)
        # line-buffered: every line is on disk when written, so a SIGKILL loses none
        self._request_log = (open(config.request_log, "a", buffering=1)  # noqa: SIM115
                             if config.request_log else None)
        self._started = int(time.time())

    def make_app(self) -> web.Application:
        middlewares = []
        if self.config.api_key_env:
            expected = f"Bearer {os.environ.get(self.config.api_key_env, '')}"
            if expected == "Bearer ":
                raise SystemExit(f"--api-key-env {self.config.api_key_env}: variable not set")

            @web.middleware
            async def check_key(request: web.Request, handler: Any) -> web.StreamResponse:
                # vLLM checks only /v1 routes; /health and /metrics stay open
                if request.path.startswith("/v1") and (
                        request.headers.get("Authorization") != expected):
                    return web.json_response({"error": "Unauthorized"}, status=401)
                return await handler(request)

            middlewares.append(check_key)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.router.add_post("/v1/completions", self.handle_completions)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        app.router.add_post("/v1/responses", self.handle_responses)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_post("/tokenize", self.handle_tokenize)
        app.router.add_get("/admin/knobs", self.handle_knobs)
        app.router.add_post("/admin/knobs", self.handle_knobs)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.producer.start()
        self.leak.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.leak.stop()
        await self.producer.stop()
        self.faults.close()
        if self._request_log is not None:
            self._request_log.close()

    def _log(self, event: str, request_id: str | None, **fields: Any) -> None:
        if self._request_log is not None:
            self._request_log.write(json.dumps({"event": event, "request_id": request_id,
                                                "wall_ns": time.time_ns(), **fields}) + "\n")

    # ---- generation -------------------------------------------------------------------------

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def handle_responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True, responses=True)

    async def _generate(self, request: web.Request, *, chat: bool,
                        responses: bool = False) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        cfg = self.config
        # picked (and logged) first: a request the client gives up on while its body is read
        # is in the log all the same
        fault = self.faults.pick(request) if self.faults.active else "ok"
        request_id = request.headers.get("X-Request-Id")
        self._log("start", request_id)
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            self._log("end", request_id, how="http_400")
            return _error_response(RequestError(f"request body is not valid JSON: {exc}"))
        try:
            parse = parse_responses_request if responses else functools.partial(
                parse_generation_request, chat=chat)
            gen = parse(body, served_model=cfg.model, max_model_len=cfg.max_model_len)
        except RequestError as exc:
            self._log("end", request_id, how=f"http_{exc.status}")
            return _error_response(exc)
        if fault != "ok":
            self._log("end", request_id, how=f"fault_{fault}")
            return await self.faults.serve(request, fault, gen, chat=chat,
                                           headers=_echo_request_id(request, {}))
        if cfg.error_rate and self._error_rng.random() < cfg.error_rate:
            self._log("end", request_id, how="http_500")
            return _error_response(
                RequestError("simulated internal server error (--error-rate)", status=500)
            )
        output_len = plan_output_len(gen, self._length_rng)
        tool_name = tool_call_name(body) if chat and gen.stream and not responses else None
        if tool_name is not None:
            output_len = min(output_len, TOOL_CALL_TOKENS)
        cut_after = None
        if gen.stream and cfg.cut_rate and self._cut_rng.random() < cfg.cut_rate:
            cut_after = self._cut_rng.randint(1, output_len)
        self._requests_accepted += 1
        encoder = (ResponsesEncoder(model=cfg.model, reasoning_events=cfg.reasoning_events)
                   if responses else
                   ChunkEncoder(chat=chat, model=cfg.model, reasoning_events=cfg.reasoning_events,
                                reasoning_field=cfg.reasoning_field, tool_name=tool_name))
        seq = Sequence(
            gen, encoder, output_len=output_len,
            cut_after=cut_after, token_offset=self._requests_accepted * 7, arrival=arrival,
        )
        seq.request_id = request_id
        self.metrics.prompt_tokens.inc(gen.prompt_tokens)
        if gen.stream:
            return await self._stream(request, seq)
        return await self._respond_whole(request, seq)

    async def _stream(self, request: web.Request, seq: Sequence) -> web.StreamResponse:
        response = web.StreamResponse(headers=_echo_request_id(request, _SSE_HEADERS))
        response.enable_chunked_encoding()
        await response.prepare(request)  # headers go out now; events follow as raw chunks
        transport = request.transport
        if transport is None:  # the client left before the headers
            self._log("end", seq.request_id, how="abort")
            return response
        seq.transport = transport
        if seq.encoder.chat:
            seq.pending.append(seq.encoder.role_chunk())
            seq.flush()
        await self._run_to_end(seq)
        if seq.cut:
            # Close mid-body: no terminating chunk, so the client sees a truncated stream.
            transport.close()
        elif seq.done:
            await response.write_eof()
        return response

    async def _run_to_end(self, seq: Sequence) -> None:
        """Submit to the producer and wait for the end of generation or of the client."""
        seq.ended = asyncio.get_running_loop().create_future()
        self.producer.submit(seq)
        try:
            await seq.ended
        finally:
            if not seq.done:
                self.producer.abort(seq)
            self._record_end(seq)

    async def _respond_whole(self, request: web.Request, seq: Sequence) -> web.StreamResponse:
        seq.transport = request.transport  # no bytes until the end; lets the engine see a leaver
        await self._run_to_end(seq)
        body = full_response_body(
            seq.encoder,
            text=generated_text(seq.token_offset, seq.generated),
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.request.prompt_tokens,
            completion_tokens=seq.generated,
        )
        return web.json_response(body, headers=_echo_request_id(request, {}))

    def _record_end(self, seq: Sequence) -> None:
        metrics = self.metrics
        if self._request_log is not None:  # its fields built only when logged: every request
            self._log("end", seq.request_id, how="abort" if not seq.done else
                      "cut" if seq.cut else seq.finish_reason, **_server_timings(seq))
        if not seq.done or seq.cut:
            metrics.request_success["abort"].inc()
            return
        metrics.request_success[seq.finish_reason].inc()
        if seq.first_token_at is not None:
            metrics.time_to_first_token.observe(seq.first_token_at - seq.arrival)
        if seq.finished_at is not None:
            metrics.e2e_request_latency.observe(seq.finished_at - seq.arrival)
        if seq.admitted_at is not None:
            metrics.request_queue_time.observe(seq.admitted_at - seq.arrival)

    # ---- everything else --------------------------------------------------------------------

    async def handle_models(self, _request: web.Request) -> web.Response:
        model = self.config.model
        return web.json_response({
            "object": "list",
            "data": [{
                "id": model, "object": "model", "created": self._started, "owned_by": "vllm",
                "root": model, "parent": None, "max_model_len": self.config.max_model_len,
            }],
        })

    async def handle_knobs(self, request: web.Request) -> web.Response:
        """``GET``: the runtime knobs now; ``POST {"decode_base_s": 0.2, ...}``: change them
        (the engine's next step uses them) and answer the new values. 400 names a bad knob."""
        if request.method == "POST":
            try:
                knobs = json.loads(await request.read())
                if not isinstance(knobs, dict):
                    raise SimulatorConfigError("expected a JSON object of knob: value")
                self.config = self.config.with_knobs(knobs)
            except (ValueError, SimulatorConfigError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            producer: Any = self.producer
            if hasattr(producer, "set_config"):
                producer.set_config(self.config)
            else:
                producer.config = self.config
        return web.json_response({name: getattr(self.config, name) for name in RUNTIME_KNOBS})

    async def handle_health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        running, waiting, kv_usage = self.producer.state()
        self.metrics.set_state(running=running, waiting=waiting, kv_usage=kv_usage)
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = PROMETHEUS_CONTENT_TYPE
        return response

    async def handle_tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize`` with the simulator's word tokens (chat adds the template)."""
        try:
            body: Any = json.loads(await request.read())
            if not isinstance(body, dict):
                raise RequestError("request body must be a JSON object")
            if "messages" in body:
                count = count_chat_tokens(body["messages"])
                tokens = list(range(count))
            else:
                prompt = body.get("prompt", "")
                count = count_prompt_tokens(prompt)
                tokens = word_token_ids(prompt) if isinstance(prompt, str) else list(range(count))
        except ValueError as exc:
            return _error_response(RequestError(f"request body is not valid JSON: {exc}"))
        except RequestError as exc:
            return _error_response(exc)
        return web.json_response(
            {"count": count, "max_model_len": self.config.max_model_len, "tokens": tokens}
        )


def _raise_open_file_limit() -> None:
    """Thousands of streams need thousands of sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


async def serve(config: SimulatorConfig) -> None:
    """Serve until SIGINT/SIGTERM; prints one ready line with the bound URL (port 0 resolved)."""
    # vLLM's /metrics carries no *_created series; prometheus_client adds them unless told.
    prometheus_client.disable_created_metrics()
    server = SimulatorServer(config)
    runner = web.AppRunner(server.make_app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    ssl_context = None
    if config.ssl_certfile:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    site = web.TCPSite(runner, config.host, config.port, backlog=4096, ssl_context=ssl_context)
    await site.start()
    host, port = runner.addresses[0][:2]
    scheme = "https" if ssl_context else "http"
    print(f"{READY_LINE_PREFIX}{scheme}://{host}:{port} (mode={config.mode}, "
          f"model={config.model})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    _raise_open_file_limit()
    asyncio.run(serve(config))
    return 0


def _server_timings(seq: Sequence) -> dict[str, Any]:
    """The request-log fields of a generation's end: the server's own TTFT and E2E (seconds from
    its handler's start) and the tokens it produced; a time it never reached is left out."""
    timings: dict[str, Any] = {"tokens": seq.generated}
    if seq.first_token_at is not None:
        timings["ttft_s"] = seq.first_token_at - seq.arrival
    if seq.finished_at is not None:
        timings["e2e_s"] = seq.finished_at - seq.arrival
    return timings
