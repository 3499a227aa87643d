"""Per-process state of a swarmload Locust process: settings, HTTP client, request source.

Built once per process when the test starts (on workers, after the master's options arrived),
so Locust users stay thin and nothing happens at import time.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from locustfiles.clock_sync import host_name
from locustfiles.streaming import ClientSettings, get_json, make_client
from workloads.buckets import BucketSpec, parse_shares
from workloads.builtin_mix import BuiltinMix, PromptRequest

DEFAULT_MIX = {"short": 0.45, "medium": 0.40, "long": 0.15}
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class SettingsError(ValueError):
    """A swarmload option has a value that cannot work; the message names it."""


@dataclass(frozen=True)
class UserSettings:
    """What a swarmload user sends, read from Locust's parsed options (``--swarmload-*``)."""

    run_id: str
    run_dir: str | None
    endpoint: str = "completions"
    model: str | None = None
    max_tokens: int = 64
    ignore_eos: bool = True
    seed: int = 0
    prompt_salt: str = ""  # resolved once on the master / local runner (see llm_user)
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    short_max: int = 64
    long_min: int = 512
    long_max_tokens: int = 1500
    read_timeout_s: float = 300.0
    workload: str | None = None
    plan: str | None = None
    schedule_duration_s: float = 0.0
    inflight_cap: int = 2000

    @classmethod
    def from_options(cls, options: Any) -> UserSettings:
        def opt(name: str, default: Any = None) -> Any:
            value = getattr(options, f"swarmload_{name}", None)
            return default if value in (None, "") else value

        endpoint = opt("endpoint", "completions")
        if endpoint not in ENDPOINT_PATHS:
            raise SettingsError(
                f"--swarmload-endpoint {endpoint!r} is not one of {sorted(ENDPOINT_PATHS)}"
            )
        thresholds = str(opt("thresholds", "64,512")).split(",")
        if len(thresholds) != 2:
            raise SettingsError(
                f"--swarmload-thresholds wants SHORT_MAX,LONG_MIN, got {thresholds}"
            )
        run_id = opt("run_id") or time.strftime("run-%Y%m%d-%H%M%S")
        run_dir = opt("run_dir") or os.path.join("results", run_id)
        return cls(
            run_id=run_id,
            run_dir=run_dir,
            endpoint=endpoint,
            model=opt("model"),
            max_tokens=int(opt("max_tokens", 64)),
            ignore_eos=str(opt("ignore_eos", "true")).lower() not in ("0", "false", "no"),
            seed=int(opt("seed", 0)),
            prompt_salt=str(opt("prompt_salt", "")),
            mix=parse_shares(str(opt("mix", "45/40/15"))),
            short_max=int(thresholds[0]),
            long_min=int(thresholds[1]),
            long_max_tokens=int(opt("long_max_tokens", 1500)),
            read_timeout_s=float(opt("read_timeout", 300.0)),
            workload=opt("workload"),
            plan=opt("plan"),
            schedule_duration_s=float(opt("schedule_duration", 0.0)),
            inflight_cap=int(opt("inflight_cap", 2000)),
        )


class ProcessContext:
    """Everything the users of one Locust process share."""

    def __init__(self, settings: UserSettings, host: str, worker_index: int | None) -> None:
        if not host:
            raise SettingsError("no target: pass --host http://127.0.0.1:PORT")
        self.settings = settings
        tag = f"w{worker_index}" if worker_index is not None else "local"
        self.worker_id = f"{host_name()}:{os.getpid()}:{tag}"
        self.request_tag = f"{tag}-"
        self.client = make_client(host, ClientSettings(read_timeout_s=settings.read_timeout_s))
        self.path = ENDPOINT_PATHS[settings.endpoint]
        self.model = settings.model or self._discover_model()
        self.mix = BuiltinMix(
            buckets=BucketSpec(settings.short_max, settings.long_min, settings.mix),
            max_tokens=settings.max_tokens,
            seed=settings.seed,
            long_max_tokens=settings.long_max_tokens,
            salt=settings.prompt_salt,
        )
        self._counter = itertools.count()

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

    def payload(self, request: PromptRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.settings.ignore_eos:
            body["ignore_eos"] = True
        if self.settings.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        return body

    def item_payload(self, item: dict[str, Any]) -> dict[str, Any]:
        """Body for one replayed workload item (see ``locustfiles.replay``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": item["max_tokens"],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.settings.ignore_eos:
            body["ignore_eos"] = True
        if item["endpoint"] == "chat":
            body["messages"] = item["messages"]
        else:
            body["prompt"] = item["prompt"]
        return body

    def close(self) -> None:
        self.client.close()
