"""Real endpoints through `swarmload run`: HTTPS with verification on (a CA and a server
certificate made here with openssl), a wrong CA failing with a message that says what to do, an
API key from the environment that never lands in a run file, extra headers, X-Request-Id, and
non-streaming requests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from collectors.run_folder import load_requests
from infra.targets.simulator import running_simulator
from locustfiles.streaming import ClientSettings, make_client, stream_request

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-test-3f9c1e7a5b2d4c6e8f0a1b2c3d4e5f60"  # what must never be written down


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(folder: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}", cwd=folder)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem signs server.pem (for 127.0.0.1 and localhost); other-ca.pem signs nothing here."""
    folder = tmp_path_factory.mktemp("certs")
    _make_ca(folder, "ca")
    _make_ca(folder, "other-ca")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "san.ext",
             cwd=folder)
    return folder


@pytest.fixture(scope="module")
def https_sim(certs: Path) -> Iterator[str]:
    """The simulator over HTTPS, answering only requests that carry the key (as vLLM's
    --api-key does)."""
    os.environ["SIM_TEST_KEY"] = KEY
    try:
        with running_simulator(ssl_certfile=str(certs / "server.pem"),
                               ssl_keyfile=str(certs / "server.key"), api_key_env="SIM_TEST_KEY",
                               fixed_ttft_s=0.02, fixed_itl_s=0.002) as url:
            yield url
    finally:
        del os.environ["SIM_TEST_KEY"]


USERS = 2  # closed-loop users of every run here


def _swarmload_run(results: Path, *args: str, key: str | None = KEY, timeout: float = 120,
                   collectors: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", "run", "--workers", "1", "--users", str(USERS),
         "--duration", "3", "--max-tokens", "8", "--results", str(results),
         *([] if collectors else ["--no-collectors"]), *args],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=timeout,
        env={**env, "PYTHONUNBUFFERED": "1"})


def _without_the_end_cut(records: pd.DataFrame, users: int = USERS) -> pd.DataFrame:
    """The records less those the run's end cut: a closed-loop run stops at its duration, and
    each user's request still in flight then is recorded ``cancelled`` (run ended while in
    flight). At most one a user, and none for another reason."""
    cancelled = records.outcome == "cancelled"
    assert cancelled.sum() <= users, records.outcome.value_counts()
    assert records.error[cancelled].str.startswith("run ended while in flight").all(), (
        records.error[cancelled].tolist())
    return records[~cancelled]


def _only_run(results: Path) -> Path:
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return run_dir


def test_https_with_verification_key_from_env_never_written(https_sim: str, certs: Path,
                                                            tmp_path: Path) -> None:
    assert https_sim.startswith("https://")
    done = _swarmload_run(tmp_path, "--target", https_sim, "--ca-bundle",
                          str(certs / "ca.pem"), "--header", "X-Tenant: team-blue-7",
                          "--run-id", "tls-run", collectors=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_dir = _only_run(tmp_path)
    records = _without_the_end_cut(load_requests(run_dir))
    assert len(records) > 5 and (records.outcome == "ok").all(), records.error.dropna()[:3]
    assert records.ttft_s.notna().all() and records.streamed.all()
    ids = records.http_request_id
    assert ids.str.startswith("tls-run-").all() and ids.is_unique
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["endpoint"]["verify"] is True and manifest["endpoint"]["tls"] is True
    assert manifest["endpoint"]["api_key"] == "environment variable OPENAI_API_KEY"
    assert manifest["endpoint"]["headers"] == ["X-Tenant"]
    # the collector scraped /metrics over the same verified TLS
    from collectors.run_folder import load_server_metrics

    scraped = load_server_metrics(run_dir)
    assert len(scraped) > 0 and scraped["error"].isna().all(), scraped["error"].dropna()[:3]
    # every file the run wrote, Parquet and logs included: neither the key nor a header value
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) >= 4
    leaks = [str(p) for p in files if KEY.encode() in p.read_bytes()
             or b"team-blue-7" in p.read_bytes()]
    assert leaks == []
    assert KEY not in done.stdout + done.stderr


def test_wrong_ca_and_missing_key_fail_with_what_to_do(https_sim: str, certs: Path,
                                                       tmp_path: Path) -> None:
    wrong = _swarmload_run(tmp_path / "a", "--target", https_sim, "--ca-bundle",
                           str(certs / "other-ca.pem"))
    # exit 3: the target cannot be used as given (README "Exit codes"); nothing was started
    assert wrong.returncode == 3, wrong.stdout[-1500:]
    assert "TLS certificate verification failed" in wrong.stderr, wrong.stderr
    assert "--ca-bundle" in wrong.stderr and "--insecure" in wrong.stderr
    system_store = _swarmload_run(tmp_path / "b", "--target", https_sim)  # verification is on
    assert system_store.returncode == 3 and "verification failed" in system_store.stderr
    no_key = _swarmload_run(tmp_path / "c", "--target", https_sim, "--ca-bundle",
                            str(certs / "ca.pem"), key=None)
    assert no_key.returncode == 3 and "no API key was sent" in no_key.stderr, no_key.stderr


def test_insecure_and_no_stream_are_said_loudly(https_sim: str, tmp_path: Path) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    done = _swarmload_run(tmp_path / "r", "--target", https_sim, "--insecure", "--no-stream",
                          "--api-key-file", str(key_file), key=None)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "INSECURE" in done.stdout and "NON-STREAMING" in done.stdout
    run_dir = _only_run(tmp_path / "r")
    records = _without_the_end_cut(load_requests(run_dir))
    assert len(records) > 5 and (records.outcome == "ok").all()
    assert records.ttft_s.isna().all() and records.e2e_s.notna().all()
    assert (~records.streamed).all() and (records.output_tokens == 8).all()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["endpoint"]["insecure"] is True and manifest["endpoint"]["verify"] is False
    assert any("INSECURE" in w for w in manifest["warnings"])
    assert manifest["endpoint"]["api_key"] == f"file {key_file}"
    assert not [p for p in run_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


def test_every_request_carries_headers_and_its_request_id() -> None:
    """What goes over the wire, read by a raw socket server."""
    heads: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    body = (b'data: {"choices":[{"index":0,"text":" hi"}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
            b"data: [DONE]\n\n")

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for _ in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += conn.recv(65536)
                heads.append(head)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = make_client(f"http://127.0.0.1:{listener.getsockname()[1]}", ClientSettings(
        headers=(("X-Tenant", "t1"), ("Authorization", "Bearer k"))))
    for rid in ("run-1-a", "run-1-b"):
        assert stream_request(client, "/v1/completions", {"prompt": "x"}, rid).outcome == "ok"
    client.close()
    thread.join(5)
    listener.close()
    for head, rid in zip(heads, ("run-1-a", "run-1-b"), strict=True):
        lines = head.decode().split("\r\n")
        assert "X-Tenant: t1" in lines and "Authorization: Bearer k" in lines
        assert f"X-Request-Id: {rid}" in lines


def test_a_study_names_the_variable_never_the_key(https_sim: str, certs: Path,
                                                 tmp_path: Path) -> None:
    import yaml

    study = {"name": "tls-study", "configurations": [{"name": "sim", "target": https_sim}],
             "workload": {"mix": "100/0/0", "max_tokens": 8},
             "load": {"kind": "concurrency", "steps": [2]},
             "step_duration_s": 3, "warmup_s": 0.5, "cooldown_s": 0.5, "workers": 1,
             "endpoint": {"api_key_env": "MY_STUDY_KEY", "ca_bundle": str(certs / "ca.pem"),
                          "headers": ["X-Tenant: team-blue-7"]}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    env = {**os.environ, "MY_STUDY_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "infra.cli", "study", "run",
                           str(tmp_path / "study.yaml"), "--results", str(tmp_path / "out")],
                          cwd=REPO_ROOT, text=True, capture_output=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (study_dir,) = (tmp_path / "out").iterdir()
    study_json = json.loads((study_dir / "study.json").read_text())
    assert study_json["endpoint"]["api_key_env"] == "MY_STUDY_KEY"
    assert study_json["endpoint"]["headers"] == ["X-Tenant"]
    (step,) = study_dir.glob("sim/step-*")
    records = _without_the_end_cut(load_requests(step), users=2)  # the study's one step
    assert len(records) > 5 and (records.outcome == "ok").all()
    leaks = [str(p) for p in study_dir.rglob("*") if p.is_file() and (
        KEY.encode() in p.read_bytes() or b"team-blue-7" in p.read_bytes())]
    assert leaks == []
    bad = dict(study, endpoint={"api_key": KEY})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    refused = subprocess.run([sys.executable, "-m", "infra.cli", "study", "run",
                              str(tmp_path / "bad.yaml"), "--results", str(tmp_path / "bad")],
                             cwd=REPO_ROOT, text=True, capture_output=True, timeout=60, env=env)
    assert refused.returncode != 0 and "never the key itself" in refused.stderr
    assert KEY not in refused.stderr + refused.stdout


def test_haproxy_terminating_tls_in_front_of_the_simulator(certs: Path, tmp_path: Path) -> None:
    """Debian's HAProxy holds the certificate, as in front of a production server."""
    from infra.targets.haproxy import running_haproxy

    pem = tmp_path / "haproxy.pem"  # certificate then key, HAProxy's crt format
    pem.write_bytes((certs / "server.pem").read_bytes() + (certs / "server.key").read_bytes())
    with running_simulator(fixed_ttft_s=0.02, fixed_itl_s=0.002) as sim, \
            running_haproxy([sim], tmp_path / "haproxy", tls_pem=str(pem)) as proxy:
        assert proxy.base_url.startswith("https://")
        done = _swarmload_run(tmp_path / "r", "--target", proxy.base_url, "--ca-bundle",
                              str(certs / "ca.pem"))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        records = load_requests(_only_run(tmp_path / "r"))
        # closed loop: a request still in flight when the run ends is recorded "cancelled"
        assert (records.outcome == "ok").sum() > 5
        assert set(records.outcome) <= {"ok", "cancelled"}, records.outcome.value_counts()
        assert proxy.server_stats()["r0"]["hrsp_2xx"] >= (records.outcome == "ok").sum()
        wrong = _swarmload_run(tmp_path / "w", "--target", proxy.base_url, "--ca-bundle",
                               str(certs / "other-ca.pem"))
        assert wrong.returncode == 3 and "TLS certificate verification failed" in wrong.stderr
