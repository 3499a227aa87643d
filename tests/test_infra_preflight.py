"""infra.preflight: before any load, the target is asked for /v1/models and one token, and each
way to fail says what is wrong (local servers only: a free port, a 401 server, a server of one
model)."""

from __future__ import annotations

import pytest

from infra.ports import free_port
from infra.preflight import TargetUnreachable, UnknownModel, check_target
from infra.tools.bad_inputs import FakeTarget


def test_a_serving_target_passes_and_names_its_model() -> None:
    with FakeTarget("ok") as target:
        assert check_target(target.url, timeout_s=5) == "tiny"
        assert check_target(target.url, model="tiny", endpoint="chat", timeout_s=5) == "tiny"


def test_refused_port() -> None:
    with pytest.raises(TargetUnreachable, match="connection refused by 127.0.0.1:.*nothing "
                                                "listens there"):
        check_target(f"http://127.0.0.1:{free_port()}", timeout_s=5)


def test_401_says_credentials() -> None:
    with FakeTarget("auth") as target, pytest.raises(TargetUnreachable,
                                                     match="HTTP 401.*credentials"):
        check_target(target.url, timeout_s=5)


def test_unknown_model_lists_the_served_ones() -> None:
    with FakeTarget("ok") as target, pytest.raises(UnknownModel,
                                                   match="'gpt-9' is not served.*lists tiny"):
        check_target(target.url, model="gpt-9", timeout_s=5)


def test_tls_to_plain_http_and_a_wrong_path() -> None:
    with FakeTarget("ok") as target:
        with pytest.raises(TargetUnreachable, match="TLS handshake.*is it plain http"):
            check_target(target.url.replace("http://", "https://"), timeout_s=5)
        with pytest.raises(TargetUnreachable, match="HTTP 404: no OpenAI-compatible API"):
            check_target(target.url + "/api", timeout_s=5)


def test_dns_failure() -> None:
    with pytest.raises(TargetUnreachable, match="DNS: cannot resolve host 'no-such-host.invalid'"):
        check_target("http://no-such-host.invalid:8000", timeout_s=5)
