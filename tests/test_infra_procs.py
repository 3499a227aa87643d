"""infra/procs.py, the one process helper: ready by log line, port or URL; a stop reaches the
child's own children; a child dies with the process that started it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from infra import procs

SERVER = textwrap.dedent("""
    import http.server, subprocess, sys, time
    # a grandchild that ignores SIGTERM: only a group SIGKILL ends it
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(60)"])
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    print("listening on", server.server_address[1], flush=True)
    server.serve_forever()
""")


def test_ready_by_log_port_and_url_then_the_group_stops(tmp_path: Path) -> None:
    proc = procs.start([sys.executable, "-c", SERVER], name="server",
                       log_path=tmp_path / "server.log", cwd=tmp_path)
    try:
        port = int(proc.wait_ready(log_pattern=r"listening on (\d+)", timeout_s=20))
        proc.wait_ready(port=port, url=f"http://127.0.0.1:{port}/", timeout_s=20)
        deadline = time.monotonic() + 10
        while len(psutil.Process(proc.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = psutil.Process(proc.pid).children()
    finally:
        code = proc.stop(grace_s=1.0)
    assert code == -signal.SIGTERM
    assert procs.describe_exit(code) == "signal SIGTERM"
    assert not proc.group_alive()
    assert not psutil.pid_exists(grandchild.pid) or grandchild.status() == psutil.STATUS_ZOMBIE


def test_a_child_that_exits_early_fails_readiness_with_its_log() -> None:
    proc = procs.start([sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"],
                       name="early")
    with pytest.raises(procs.ProcessStartError, match="exit code 3") as info:
        proc.wait_ready(port=1, timeout_s=10)
    assert "bad flag" in str(info.value)
    proc.stop()
    assert not Path(proc.log_path).exists()  # a temporary log goes with the stop


def test_children_die_with_the_process_that_started_them() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from infra import procs
            child = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
            print(child.pid, flush=True)
            time.sleep(60)
        """)],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()  # kill -9: no clean-up code runs in the parent
    parent.wait(10)
    _gone, alive = psutil.wait_procs([child], timeout=5)
    assert not alive
