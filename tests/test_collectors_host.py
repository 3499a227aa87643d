"""Host sampler: system row, processes by pid, by name, as children; a process that goes away."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pandas as pd
import pytest

from collectors.host import HostSampler
from collectors.schemas import HOST_SCHEMA, HOST_TABLE


def _sleeper(token: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(30)  # {token}"])


def _spinner(token: str) -> subprocess.Popen:
    """Busy for at most 30 s: its cpu_pct must show it."""
    code = f"import time\nend = time.time() + 30\nwhile time.time() < end: pass  # {token}"
    return subprocess.Popen([sys.executable, "-c", code])


def test_watches_pid_name_and_children(tmp_path):
    token = f"swarmload-host-test-{uuid.uuid4().hex[:8]}"
    child = _spinner(token)
    try:
        time.sleep(0.3)  # let the child exec, so its command line carries the token
        sampler = HostSampler(tmp_path, "run-1", interval_s=0.1, pids=[os.getpid()],
                              name_patterns=[token], children_of=[os.getpid()],
                              include_self=False, host="h1", rescan_interval_s=0.1)
        assert sampler.start()
        time.sleep(1.2)
        sampler.stop()
    finally:
        child.kill()
        child.wait(5)
    df = pd.read_parquet(tmp_path / HOST_TABLE)
    assert set(df.columns) == set(HOST_SCHEMA.names)
    system = df[df["kind"] == "system"]
    assert len(system) >= 3  # 12 ticks; a loaded 2-core machine may miss some
    assert (system["sys_mem_total_bytes"] > system["sys_mem_available_bytes"]).all()
    assert system["sys_cpu_pct"].between(0, 100).all()
    me = df[(df["kind"] == "process") & (df["pid"] == os.getpid())]
    assert (me["selector"] == "pid").all() and (me["rss_bytes"] > 10 * 2**20).all()
    mine = df[df["pid"] == child.pid].sort_values("wall_ns")
    assert pd.isna(mine["cpu_pct"].iloc[0])  # psutil needs two readings
    assert mine["cpu_pct"].iloc[1:].max() > 5  # spinning (a sleeper reads ~0; CI is shared)
    # matched by name (first rule that applies) and, as our child, also eligible as child_of
    assert set(mine["selector"]) == {f"name:{token}"}
    assert (mine["rss_bytes"] > 0).all() and mine["error"].isna().all()


def test_children_of_a_launcher_are_followed(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
         "time.sleep(30)"])
    try:
        time.sleep(0.5)
        sampler = HostSampler(tmp_path, "run-1", interval_s=0.1, children_of=[launcher.pid],
                              include_self=False, rescan_interval_s=0.1)
        assert sampler.start()
        time.sleep(0.5)
        sampler.stop()
    finally:
        launcher.kill()
        launcher.wait(5)
    df = pd.read_parquet(tmp_path / HOST_TABLE)
    procs = df[df["kind"] == "process"]
    assert set(procs["selector"]) == {f"child_of:{launcher.pid}"}
    assert set(procs["ppid"]) == {launcher.pid}


def test_a_watched_pid_that_exits_gets_one_error_row(tmp_path):
    child = _sleeper("short-lived")
    sampler = HostSampler(tmp_path, "run-1", interval_s=0.05, pids=[child.pid],
                          rescan_interval_s=0.05)
    assert sampler.start()
    time.sleep(0.3)
    child.kill()
    child.wait(5)
    time.sleep(0.4)
    sampler.stop()
    df = pd.read_parquet(tmp_path / HOST_TABLE)
    rows = df[df["pid"] == child.pid].sort_values("wall_ns")
    assert rows["error"].notna().sum() == 1
    assert rows["error"].iloc[-1] is not None and "NoSuchProcess" in rows["error"].iloc[-1]
    me = df[df["selector"] == "self"]
    assert len(me) >= 10  # the collector itself is watched by default, and kept going


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="Linux schedstat")
def test_a_process_kept_waiting_for_a_core_shows_it(tmp_path):
    """Two spinners on one core: each waits for it about half the time; a sleeper never."""
    token = f"swarmload-wait-test-{uuid.uuid4().hex[:8]}"
    spinners = [_spinner(token), _spinner(token)]
    sleeper = _sleeper(token)
    try:
        for proc in spinners:
            os.sched_setaffinity(proc.pid, {0})
        time.sleep(0.3)
        sampler = HostSampler(tmp_path, "run-1", interval_s=0.2, name_patterns=[token],
                              include_self=False, host="h1", rescan_interval_s=5)
        assert sampler.start()
        time.sleep(1.3)
        sampler.stop()
    finally:
        for proc in [*spinners, sleeper]:
            proc.kill()
            proc.wait(5)
    df = pd.read_parquet(tmp_path / HOST_TABLE)
    wait = df[df["kind"] == "process"].groupby("pid")["wait_pct"]
    assert wait.apply(lambda w: pd.isna(w.iloc[0])).all()  # two readings make a share
    for proc in spinners:
        assert wait.get_group(proc.pid).iloc[1:].mean() > 20, df  # ~50 on an idle machine
    assert wait.get_group(sleeper.pid).iloc[1:].max() < 5
