"""The shared token of a run spread over hosts: ``SWARMLOAD_TOKEN`` on every side.

Every open port a run has on another host answers only those who know the token:

- ``swarmload collect --serve`` (:mod:`collectors.remote`): each request carries
  ``Authorization: Bearer <token>``; without it, or with another, the answer is 401 and nothing
  is done (no clock, no file, no stop);
- the Locust master (:mod:`locustfiles.worker_auth`): a worker proves it knows the token when it
  connects (an HMAC of its client id, so the token itself never crosses the network); one that
  cannot is told so and never gets users, and nothing it sends is stored.

The token comes from the environment only, never from a flag or a file of the run, so it is in no
command line (``ps``), manifest, log or run folder. ``swarmload run`` makes a fresh one for its
own local processes when none is set.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

TOKEN_ENV = "SWARMLOAD_TOKEN"
MIN_TOKEN_CHARS = 16


def token_from_env() -> str | None:
    """The shared token, or None when ``SWARMLOAD_TOKEN`` is not set (or empty)."""
    return os.environ.get(TOKEN_ENV) or None


def token_problem(token: str | None) -> str | None:
    """What is wrong with ``token`` as a shared secret (None: fine)."""
    if not token:
        return f"set {TOKEN_ENV} to a shared secret (the same on every host of the run)"
    if len(token) < MIN_TOKEN_CHARS:
        return f"{TOKEN_ENV} is {len(token)} characters; use at least {MIN_TOKEN_CHARS}"
    return None


def new_token() -> str:
    return secrets.token_urlsafe(24)


def bearer(token: str) -> dict[str, str]:
    """The request header that carries ``token``."""
    return {"Authorization": f"Bearer {token}"}


def bearer_ok(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (constant-time compare)."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


def worker_proof(token: str, client_id: str) -> str:
    """What a worker sends to prove it knows ``token``: bound to its own client id."""
    return hmac.new(token.encode(), f"swarmload-worker:{client_id}".encode(),
                    hashlib.sha256).hexdigest()
