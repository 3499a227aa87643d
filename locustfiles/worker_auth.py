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
        client = self.client
        if token and not getattr(client, "_swarmload_proof", False):
            send = client.send

            def send_with_proof(msg: Any) -> None:
                if msg.type == "client_ready" and isinstance(msg.data, str):
                    msg = Message(msg.type, msg.data + PROOF_SEP +
                                  worker_proof(token, msg.node_id), msg.node_id)
                send(msg)

            client.send = send_with_proof
            client._swarmload_proof = True
        worker_connect(self)

    def worker_handle_message(self: Any, msg: Any) -> None:
        if msg.type == REFUSED_MESSAGE:
            reason = (msg.data or {}).get("reason", "refused")
            log.error("the master refused this worker: %s", reason)
            logging.shutdown()
            os._exit(REFUSED_EXIT)  # mid-handshake: nothing of this worker's is kept anyway
        worker_handle(self, msg)

    def master_handle_message(self: Any, client_id: str, msg: Any) -> None:
        if not token:
            return master_handle(self, client_id, msg)
        admitted: set[str] = self.__dict__.setdefault("_swarmload_admitted", set())
        refused: set[str] = self.__dict__.setdefault("_swarmload_refused", set())
        if msg.type == "client_ready" and client_id not in admitted:
            data = msg.data if isinstance(msg.data, str) else ""
            version, _, proof = data.partition(PROOF_SEP)
            if proof and hmac.compare_digest(proof, worker_proof(token, client_id)):
                admitted.add(client_id)
                refused.discard(client_id)
                msg = Message(msg.type, version, msg.node_id)
            else:
                reason = ("a wrong token (its SWARMLOAD_TOKEN is not the master's)" if proof
                          else "no token (set SWARMLOAD_TOKEN to the master's)")
                if client_id not in refused:
                    log.error("refused worker %s: %s", client_id, reason)
                refused.add(client_id)
                self.server.send_to_client(Message(REFUSED_MESSAGE, {"reason": reason},
                                                   client_id))
                self.server.send_to_client(Message("quit", None, client_id))
                return None
        elif msg.type == "client_ready":
            msg = Message(msg.type, msg.data.partition(PROOF_SEP)[0] if isinstance(
                msg.data, str) else msg.data, msg.node_id)
        elif client_id not in admitted:
            if client_id not in refused:
                refused.add(client_id)
                log.error("dropped %s from worker %s, which never presented the token",
                          msg.type, client_id)
            return None
        return master_handle(self, client_id, msg)

    WorkerRunner.connect_to_master = connect_to_master  # type: ignore[method-assign]
    WorkerRunner.handle_message = worker_handle_message  # type: ignore[method-assign]
    MasterRunner.handle_message = master_handle_message  # type: ignore[method-assign]


def refused_workers(runner: Any) -> list[str]:
    """Client ids the master refused (for the manifest)."""
    return sorted(getattr(runner, "__dict__", {}).get("_swarmload_refused", set()))
