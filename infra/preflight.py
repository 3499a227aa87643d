"""Preflight: before any load, check that the target answers and say plainly what is wrong.

Two requests, each bounded by a timeout: ``GET /v1/models`` (is anything there, does it speak
HTTP(S), does it let us in, which models does it serve) and one streamed completion of one token
on the run's endpoint (does the model answer as an event stream). Each way to fail has its own
message: connection refused, DNS failure, TLS failure, timeout, HTTP 401/403, no OpenAI API at
that URL, unknown model, an answer that is not an event stream.

:class:`TargetUnreachable` (exit code 3 in ``swarmload run`` / ``study run``) for a target that
cannot be used; :class:`UnknownModel` (exit code 2: the ``--model`` given is wrong) when the
target is fine but does not serve the model asked for.
"""

from __future__ import annotations

import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import httpx

from locustfiles.config import ENDPOINT_PATHS


class PreflightError(RuntimeError):
    """The target is not ready for load; the message says what is wrong and what to check."""


class TargetUnreachable(PreflightError):
    """Nothing usable answers at the base URL (refused, DNS, TLS, timeout, 401/403, no API)."""


class UnknownModel(PreflightError):
    """The target answers but does not serve the model asked for."""


def _cause_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def describe_connect_error(exc: httpx.HTTPError, base_url: str) -> str:
    """What went wrong connecting to ``base_url``, in words (refused, DNS, TLS, timeout)."""
    parts = urlsplit(base_url)
    host = parts.hostname or base_url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    chain = _cause_chain(exc)
    for cause in chain:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (f"TLS certificate of {host}:{port} not trusted "
                    f"({cause.verify_message or cause.reason})")
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            hint = ("; is it plain http:// ?" if "WRONG_VERSION_NUMBER" in str(reason)
                    or "record layer" in str(reason) else "")
            return f"TLS handshake with {host}:{port} failed ({reason}){hint}"
        if isinstance(cause, socket.gaierror):
            return f"DNS: cannot resolve host {host!r} ({cause.strerror})"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused by {host}:{port}: nothing listens there"
    text = " ".join(str(c) for c in chain).lower()
    if isinstance(exc, httpx.ConnectTimeout):
        return f"no connection to {host}:{port} within the timeout (firewall, wrong host?)"
    if isinstance(exc, httpx.TimeoutException):
        return f"{host}:{port} accepted the connection but did not answer within the timeout"
    if "name or service not known" in text or "nodename nor servname" in text or (
            "temporary failure in name resolution" in text):
        return f"DNS: cannot resolve host {host!r}"
    if "connection refused" in text:
        return f"connection refused by {host}:{port}: nothing listens there"
    if "ssl" in text or "tls" in text or "certificate" in text:
        return f"TLS with {host}:{port} failed ({exc})"
    if isinstance(exc, httpx.RemoteProtocolError) or "illegal" in text:
        return (f"{host}:{port} does not answer plain HTTP ({exc}); is it https:// ?"
                if parts.scheme == "http" else f"{host}:{port}: broken HTTP answer ({exc})")
    return f"{host}:{port}: {type(exc).__name__}: {exc}"


def _server_says(response: httpx.Response) -> str:
    """The server's own error text, shortened to one line."""
    try:
        body = response.read()
        data = json.loads(body)
        message = data.get("message") or (data.get("error") or {}).get("message") or data
    except (ValueError, AttributeError, httpx.HTTPError):
        message = body[:200].decode("utf-8", "replace") if "body" in locals() else ""
    return " ".join(str(message).split())[:200]


def _check_status(response: httpx.Response, what: str, model: str) -> None:
    status = response.status_code
    if status < 400:
        return
    said = _server_says(response)
    if status in (401, 403):
        raise TargetUnreachable(f"{what}: HTTP {status}: the target refuses us without valid "
                                f"credentials (an API key or auth header) ({said})")
    if status == 404 and "model" in said.lower() and model:
        raise UnknownModel(f"{what}: model {model!r} is not served here (HTTP 404: {said})")
    if status == 404:
        raise TargetUnreachable(f"{what}: HTTP 404: no OpenAI-compatible API at this URL "
                                "(check the base URL's path)")
    raise TargetUnreachable(f"{what}: HTTP {status} ({said})")


def check_target(base_url: str, *, model: str = "", endpoint: str = "completions",
                 timeout_s: float = 30.0, headers: dict[str, str] | None = None,
                 verify: Any = True, stream: bool = True) -> str:
    """Check ``base_url`` answers ``/v1/models`` and streams one token; return the model name
    to use (``model``, or the first listed). Raises :class:`PreflightError`. ``stream=False``
    asks for a plain JSON answer instead (``--no-stream`` runs).

    ``headers`` and ``verify`` (httpx's: True, False or a CA bundle path) are where credentials
    and TLS settings of the run go, so the check talks to the target as the load will."""
    base_url = base_url.rstrip("/")
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    try:
        with httpx.Client(timeout=timeout, headers=headers, verify=verify,
                          follow_redirects=False) as client:
            with client.stream("GET", f"{base_url}/v1/models") as response:
                _check_status(response, "GET /v1/models", "")
                try:
                    listed = [str(m["id"]) for m in json.loads(response.read())["data"]]
                except (ValueError, KeyError, TypeError) as exc:
                    raise TargetUnreachable("GET /v1/models: not an OpenAI model list "
                                            f"({type(exc).__name__}); is this an OpenAI-"
                                            "compatible server?") from None
            if model and model not in listed:
                raise UnknownModel(f"model {model!r} is not served here; /v1/models lists "
                                   f"{', '.join(listed) or 'nothing'}")
            if not listed and not model:
                raise TargetUnreachable("GET /v1/models lists no model; pass --model")
            name = model or listed[0]
            _one_token(client, base_url, name, endpoint, stream)
            return name
    except httpx.HTTPError as exc:
        raise TargetUnreachable(describe_connect_error(exc, base_url)) from None


def _one_token(client: httpx.Client, base_url: str, model: str, endpoint: str,
               stream: bool) -> None:
    path = ENDPOINT_PATHS[endpoint]
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "stream": stream,
                            "temperature": 0.0}
    responses = endpoint == "responses"  # the Responses API: typed events, no [DONE]
    if responses:
        body = {"model": model, "input": "Hello", "max_output_tokens": 1, "stream": stream,
                "temperature": 0.0}
    elif endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello"
    what = f"POST {path} (one {'streamed ' if stream else ''}token)"
    with client.stream("POST", f"{base_url}{path}", json=body) as response:
        _check_status(response, what, model)
        if not stream:
            try:
                json.loads(response.read())["output" if responses else "choices"]  # noqa: B018
            except (ValueError, KeyError, TypeError):
                raise TargetUnreachable(f"{what}: the answer is not an OpenAI completion"
                                        ) from None
            return
        kind = response.headers.get("content-type", "")
        if "text/event-stream" not in kind:
            raise TargetUnreachable(f"{what}: answered {kind or 'no content type'}, not an "
                                    "event stream (text/event-stream)")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                raise TargetUnreachable(f"{what}: an event that is not JSON: {data[:120]!r}"
                                        ) from None
            kind = event.get("type") if isinstance(event, dict) else None
            if isinstance(event, dict) and ("error" in event and event["error"] or kind in (
                    "error", "response.failed")):
                raise TargetUnreachable(f"{what}: the stream carries an error: "
                                        f"{json.dumps(event.get('error') or event)[:200]}")
            if responses and kind in ("response.completed", "response.incomplete"):
                return
        raise TargetUnreachable(f"{what}: the stream ended without "
                                f"{'response.completed' if responses else '[DONE]'}")
