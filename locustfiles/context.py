"""Per-process state of a swarmload Locust process: settings, HTTP client, request source.

Built once per process when the test starts (on workers, after the master's options arrived),
so Locust users stay thin and nothing happens at import time.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import gevent
import httpx

from collectors.headers import parse_headers
from collectors.journal import SendJournal
from locustfiles.clock_sync import host_name
from locustfiles.config import ENDPOINT_PATHS, ConfigError, RunConfig, locust_flag, new_run_id
from locustfiles.responses_stream import RESPONSES_PATH, responses_payload, stream_responses
from locustfiles.sessions import replica_index
from locustfiles.streaming import (
    ClientSettings,
    OpenStream,
    StreamTiming,
    cancelled_timing,
    get_json,
    make_client,
    open_stream,
    read_stream,
    request_body,
    stream_request,
)
from workloads.builtin_mix import BuiltinMix, PromptRequest


class SettingsError(ValueError):
    """A swarmload option has a value that cannot work; the message names it."""


DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def api_key(key_env: str | None, key_file: str | None) -> tuple[str | None, str | None]:
    """(key, where it came from) from a file or an environment variable; the key never travels
    as an option. ``key_env`` empty: ``OPENAI_API_KEY`` when it is set, else no key."""
    if key_file:
        try:
            key = open(key_file, encoding="utf-8").read().strip()  # noqa: SIM115
        except OSError as exc:
            raise SettingsError(f"--api-key-file {key_file}: {exc.strerror}") from exc
        if not key:
            raise SettingsError(f"--api-key-file {key_file} is empty")
        return key, f"file {key_file}"
    name = key_env or (DEFAULT_API_KEY_ENV if os.environ.get(DEFAULT_API_KEY_ENV) else "")
    if not name:
        return None, None
    key = os.environ.get(name, "").strip()
    if not key:
        raise SettingsError(f"--api-key-env {name}: the environment variable is not set here")
    return key, f"environment variable {name}"


def settings_from_options(options: Any) -> RunConfig:
    """The run configuration from Locust's parsed ``--swarmload-*`` options, with the run id and
    folder resolved (defaults and checks are :class:`locustfiles.config.RunConfig`'s)."""
    try:
        config = RunConfig.from_locust_options(options)
    except ConfigError as exc:
        raise SettingsError(f"{locust_flag(exc.field)}: {exc.problem}") from None
    run_id = config.run_id or new_run_id()
    return replace(config, run_id=run_id,
                   run_dir=config.run_dir or os.path.join("results", run_id))


def client_settings(settings: RunConfig) -> ClientSettings:
    """The HTTP client's settings: timeouts, TLS, and the headers of every request (the API key
    as ``Authorization: Bearer``, read here from its file or variable)."""
    key, _source = api_key(settings.api_key_env or None, settings.api_key_file or None)
    headers = parse_headers(settings.headers) + (
        (("Authorization", f"Bearer {key}"),) if key else ())
    return ClientSettings(connect_timeout_s=settings.connect_timeout,
                          first_token_timeout_s=settings.first_token_timeout,
                          stall_timeout_s=settings.stall_timeout,
                          ca_bundle=settings.ca_bundle or None, insecure=settings.insecure,
                          headers=headers, replica_header=settings.replica_header or None)


class ProcessContext:
    """Everything the users of one Locust process share."""

    def __init__(self, settings: RunConfig, host: str, worker_index: int | None) -> None:
        if not host:
            raise SettingsError("no target: pass --host http://127.0.0.1:PORT")
        self.settings = settings
        tag = f"w{worker_index}" if worker_index is not None else "local"
        self.worker_id = f"{host_name()}:{os.getpid()}:{tag}"
        # A resumed run's workers start counting again: the segment keeps their ids unique.
        self.request_tag = f"s{settings.segment}{tag}-" if settings.segment else f"{tag}-"
        settings_http = client_settings(settings)
        # One client per replica when the requests are balanced here; ``client`` is the first
        # (model discovery, single-target runs).
        self.replicas = [_Replica(url, make_client(url, settings_http))
                         for url in (settings.target_urls or (host,))]
        self.client = self.replicas[0].client
        self._next_replica = itertools.count()
        self.path = ENDPOINT_PATHS[settings.endpoint]
        # every request is noted on disk before it goes out (collectors/journal.py), so one
        # whose record dies with this process or the master still gets one
        self.journal: SendJournal | None = None
        if settings.run_dir:
            try:
                self.journal = SendJournal(settings.run_dir, self.worker_id)
            except OSError:  # a worker on a host without the run folder: no journal there
                self.journal = None
        self.model = settings.model or self._discover_model()
        self.mix = BuiltinMix(
            buckets=settings.bucket_spec,
            max_tokens=settings.max_tokens,
            seed=settings.seed,
            long_max_tokens=settings.long_max_tokens,
            salt=settings.prompt_salt,
        )
        self._counter = itertools.count()
        # --users on a workload without an arrival plan: its requests in turn, not the mix's
        self.replay: Iterator[dict[str, Any]] | None = None
        if settings.closed_replay and settings.workload:
            # late: pandas (0.35 s of CPU a start) only in workers that replay a workload
            from locustfiles.schedule_items import closed_items  # noqa: PLC0415

            self.replay = closed_items(settings.workload, settings.seed, settings.prompt_salt,
                                       self.request_tag)
        self.sent = 0  # requests noted as sent (live metrics: in flight, offered rate)

    def _discover_model(self) -> str:
        try:
            models = get_json(self.client, "/v1/models")["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise SettingsError(
                f"could not list models at {self.client.base_url}/v1/models ({exc}); "
                "pass --swarmload-model"
            ) from exc
        if not models:
            raise SettingsError(f"{self.client.base_url}/v1/models lists no model")
        return str(models[0]["id"])

    def next_request(self) -> PromptRequest:
        return self.mix.request(next(self._counter), self.request_tag)

    def _stream_fields(self) -> dict[str, Any]:
        if self.settings.stream:
            return {"stream": True, "stream_options": {"include_usage": True}}
        return {"stream": False}

    def request_id(self, request_id: str) -> str:
        """The ``X-Request-Id`` of a request: unique across runs, joins the server's logs."""
        return f"{self.settings.run_id}-{request_id}"

    def payload(self, request: PromptRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            **self._stream_fields(),
            "temperature": 0.0,
        }
        if self.settings.ignore_eos:
            body["ignore_eos"] = True
        if self.settings.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
        elif self.settings.endpoint == "responses":
            return responses_payload(body, request.prompt)
        else:
            body["prompt"] = request.prompt
        return body

    def item_payload(self, item: dict[str, Any]) -> dict[str, Any]:
        """Body for one replayed workload item (see ``locustfiles.replay``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": item["max_tokens"],
            **self._stream_fields(),
            "temperature": 0.0,
        }
        if self.settings.ignore_eos:
            body["ignore_eos"] = True
        if item["endpoint"] == "chat":
            body["messages"] = item["messages"]
        else:
            body["prompt"] = item["prompt"]
        return body

    def stream(self, path: str, payload: dict[str, Any],
               request_id: str | None = None, *, keep_answer: bool = False,
               headers: dict[str, str] | None = None, session: str | None = None
               ) -> StreamTiming:
        """Send one streaming request, to the replica the balance policy picks (a session's
        requests all go to the one its id picks: ``locustfiles.sessions.replica_index``)."""
        if path == RESPONSES_PATH:  # the Responses API's own loop; replicas in turn
            replica = self.replicas[next(self._next_replica) % len(self.replicas)]
            timing = stream_responses(replica.client, path, payload, request_id)
            timing.replica = replica.url if len(self.replicas) > 1 else timing.replica
            return timing
        if len(self.replicas) == 1:
            return stream_request(self.client, path, payload, request_id,
                                  keep_answer=keep_answer, headers=headers)
        replica = self._pick_replica(session)
        try:
            timing = stream_request(replica.client, path, payload, request_id,
                                    keep_answer=keep_answer, headers=headers)
        except gevent.GreenletExit as exc:  # cancelled in flight: its record names the replica
            cancelled = cancelled_timing(exc)
            if cancelled is not None:
                cancelled.replica = replica.url
            raise
        finally:
            replica.in_flight -= 1
        timing.replica = replica.url
        return timing

    def _pick_replica(self, session: str | None = None) -> _Replica:
        """The replica of the next request (counted in flight until :meth:`_done`)."""
        turn = next(self._next_replica)
        count = len(self.replicas)
        if session is not None:
            replica = self.replicas[replica_index(session, count)]
        elif self.settings.balance == "least-busy":  # fewest in flight; ties taken in turn
            replica = min((self.replicas[(turn + i) % count] for i in range(count)),
                          key=lambda r: r.in_flight)
        else:
            replica = self.replicas[turn % count]
        replica.in_flight += 1
        return replica

    def needs_connection(self) -> bool:
        """Some replica's client has no kept-alive connection waiting: its next send would
        connect first."""
        return not all(r.client.has_idle_connection() for r in self.replicas)

    def connect_ahead(self) -> None:
        """A connection waiting on every replica's client (:meth:`StreamClient.connect_ahead`)."""
        for replica in self.replicas:
            replica.client.connect_ahead()

    def connect_at_once(self) -> bool:
        """A connection opened without yielding on every replica's client that has none
        waiting (:meth:`StreamClient.connect_at_once`); False if one of them could not."""
        return all(r.client.has_idle_connection() or r.client.connect_at_once()
                   for r in self.replicas)

    def prepare(self, path: str, payload: dict[str, Any], request_id: str | None = None,
                body: bytes | None = None) -> Prepared:
        """The replica the balance policy picks and the request's bytes, ready to send: the
        open-loop pacer builds them just ahead of the planned time and sends at it (``body``:
        ``request_body(payload)``, built earlier still). A request the pacer does not send
        itself (not streamed, the Responses API) has no bytes: it goes out through
        :meth:`stream`."""
        if payload.get("stream") is False or path == RESPONSES_PATH:
            return Prepared(self.client, None, None, payload, path, request_id)
        replica = self._pick_replica() if len(self.replicas) > 1 else None
        client = replica.client if replica is not None else self.client
        data = client.request_bytes(path, body or request_body(payload), request_id)
        return Prepared(client, replica, data, payload, path, request_id)

    def stream_prepared(self, prepared: Prepared) -> StreamTiming:
        """Send a prepared request and read its answer."""
        if prepared.data is None:
            return self.stream(prepared.path, prepared.payload, prepared.request_id)
        return self.read(prepared, self.send(prepared))

    def send(self, prepared: Prepared, connection: Any = None) -> OpenStream:
        """Put a prepared streaming request on the wire (``sent_ns``: its last byte left), on
        ``connection`` if one was taken ahead (:meth:`StreamClient.take_connection`)."""
        assert prepared.data is not None
        try:
            return open_stream(prepared.client, prepared.data, prepared.payload, connection)
        except gevent.GreenletExit as exc:
            self._done(prepared, cancelled_timing(exc))
            raise

    def read(self, prepared: Prepared, opened: OpenStream) -> StreamTiming:
        """Read and time the answer to a sent request."""
        try:
            timing = read_stream(opened)
        except gevent.GreenletExit as exc:  # cancelled in flight: its record names the replica
            self._done(prepared, cancelled_timing(exc))
            raise
        self._done(prepared, timing)
        return timing

    def _done(self, prepared: Prepared, timing: StreamTiming | None) -> None:
        replica = prepared.replica
        if replica is not None:
            replica.in_flight -= 1
            if timing is not None:
                timing.replica = replica.url

    def note_sent(self, request_id: str, http_request_id: str | None, bucket: str | None,
                  endpoint: str | None, target_prompt_tokens: int | None,
                  max_tokens: int | None, scheduled_wall_ns: int | None = None) -> None:
        self.sent += 1
        if self.journal is not None:
            self.journal.note(request_id, http_request_id, time.time_ns(), bucket, endpoint,
                              target_prompt_tokens, max_tokens, scheduled_wall_ns)

    def close(self) -> None:
        for replica in self.replicas:
            replica.client.close()
        if self.journal is not None:
            self.journal.close()


class Prepared:
    """A request ready to go: its client (replica) and its bytes (None: not streamed)."""

    __slots__ = ("client", "data", "path", "payload", "replica", "request_id")

    def __init__(self, client: Any, replica: _Replica | None, data: bytes | None,
                 payload: dict[str, Any], path: str, request_id: str | None) -> None:
        self.client, self.replica, self.data, self.payload = client, replica, data, payload
        self.path, self.request_id = path, request_id


@dataclass
class _Replica:
    url: str
    client: Any
    in_flight: int = 0
