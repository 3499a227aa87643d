"""The master admits only workers that know the run's token (``SWARMLOAD_TOKEN``).

Locust's master takes any worker that connects to its port: it answers ``client_ready`` with
``ack``, hands it users (or, open loop, leases) and stores whatever it sends, records included.
With a token set, :func:`install` changes that, on both sides of Locust's own handshake:

- a worker appends a proof to the ``client_ready`` it sends on connecting: an HMAC of its client
  id under the token (:func:`collectors.auth.worker_proof`), so the token never crosses the
  network and a proof overheard is good for that client id only;
- the master checks it before Locust sees the message. A worker without it, or with a wrong one,
  is not added: the master tells it why (``swarmload_refused``), sends it ``quit``, logs it once,
  and drops every message that client id sends (stats, records, acknowledgements).
  Our worker process exits on the refusal, saying why (exit status 3); a plain Locust worker
  just gets ``quit``.

The proof rides in the version string of ``client_ready`` (``"2.47.0;swarmload-proof=..."``):
Locust's master only compares its first characters with its own version, so a master without
this module still admits such a worker. Installed at import of the locustfile, before Locust
makes its runner (a worker sends ``client_ready`` from its constructor).
"""

from __future__ import annotations

import hmac
import logging
import os
from typing import Any

from collectors.auth import token_from_env, worker_proof

log = logging.getLogger(__name__)
PROOF_SEP = ";swarmload-proof="
REFUSED_MESSAGE = "swarmload_refused"
"""master -> a refused worker: ``{"reason": text}``, then Locust's ``quit``."""
REFUSED_EXIT = 3
_installed: dict[str, Any] = {}


def install(token: str | None = None) -> None:
    """Patch Locust's worker and master runners for ``token`` (default ``SWARMLOAD_TOKEN``);
    the master checks only when a token is set. Idempotent."""
    # late: Locust patches the process for gevent when imported: only in a Locust process
    from locust.rpc import Message  # noqa: PLC0415
    from locust.runners import MasterRunner, WorkerRunner  # noqa: PLC0415

    if _installed:
        return
    token = token if token is not None else token_from_env()
    _installed["token"] = token
    worker_connect = WorkerRunner.connect_to_master
    worker_handle = WorkerRunner.handle_message
    master_handle = MasterRunner.handle_message

    def connect_to_master(self: Any) -> None:
        if token:
            _send_proof(self.client, token, Message)
        worker_connect(self)

    def worker_handle_message(self: Any, msg: Any) -> None:
        if msg.type == REFUSED_MESSAGE:
            reason = (msg.data or {}).get("reason", "refused")
            log.error("the master refused this worker: %s", reason)
            logging.shutdown()
            os._exit(REFUSED_EXIT)  # mid-handshake: nothing of this worker's is kept anyway
        worker_handle(self, msg)

    def master_handle_message(self: Any, client_id: str, msg: Any) -> None:
        if token:
            msg = _admitted(self, token, client_id, msg, Message)
            if msg is None:
                return None
        return master_handle(self, client_id, msg)

    WorkerRunner.connect_to_master = connect_to_master  # type: ignore[method-assign]
    WorkerRunner.handle_message = worker_handle_message  # type: ignore[method-assign]
    MasterRunner.handle_message = master_handle_message  # type: ignore[method-assign]


def _send_proof(client: Any, token: str, message: Any) -> None:
    """The worker's ``client``, from now on, appends its proof to the ``client_ready`` it
    sends (once per client)."""
    if getattr(client, "_swarmload_proof", False):
        return
    send = client.send

    def send_with_proof(msg: Any) -> None:
        if msg.type == "client_ready" and isinstance(msg.data, str):
            msg = message(msg.type, msg.data + PROOF_SEP + worker_proof(token, msg.node_id),
                          msg.node_id)
        send(msg)

    client.send = send_with_proof
    client._swarmload_proof = True


def _admitted(runner: Any, token: str, client_id: str, msg: Any, message: Any) -> Any:
    """What the master's Locust may see of ``msg`` from ``client_id``: the message (a
    ``client_ready`` without its proof), or None when it is dropped: a ``client_ready`` without
    the right proof (the worker is told why and sent ``quit``), anything from a worker never
    admitted."""
    admitted: set[str] = runner.__dict__.setdefault("_swarmload_admitted", set())
    refused: set[str] = runner.__dict__.setdefault("_swarmload_refused", set())
    if msg.type == "client_ready" and client_id not in admitted:
        data = msg.data if isinstance(msg.data, str) else ""
        version, _, proof = data.partition(PROOF_SEP)
        if proof and hmac.compare_digest(proof, worker_proof(token, client_id)):
            admitted.add(client_id)
            refused.discard(client_id)
            return message(msg.type, version, msg.node_id)
        reason = ("a wrong token (its SWARMLOAD_TOKEN is not the master's)" if proof
                  else "no token (set SWARMLOAD_TOKEN to the master's)")
        if client_id not in refused:
            log.error("refused worker %s: %s", client_id, reason)
        refused.add(client_id)
        runner.server.send_to_client(message(REFUSED_MESSAGE, {"reason": reason}, client_id))
        runner.server.send_to_client(message("quit", None, client_id))
        return None
    if msg.type == "client_ready":
        return message(msg.type, msg.data.partition(PROOF_SEP)[0] if isinstance(
            msg.data, str) else msg.data, msg.node_id)
    if client_id not in admitted:
        if client_id not in refused:
            refused.add(client_id)
            log.error("dropped %s from worker %s, which never presented the token",
                      msg.type, client_id)
        return None
    return msg


def refused_workers(runner: Any) -> list[str]:
    """Client ids the master refused (for the manifest)."""
    return sorted(getattr(runner, "__dict__", {}).get("_swarmload_refused", set()))
