"""Shared fixtures: the repo root, a helper to run ``swarmload`` as a real subprocess, and the
expensive things several modules can share: one real vLLM server and one simulator study.

Why shared: on a two-core CI host a vLLM start costs 1-2 minutes and a two-configuration study
about two minutes; starting each once per session instead of once per module is most of the
suite's wall time.

How the suite runs in parallel (``make test``; ``docs/guides/testing.md``): pytest-xdist with
``--dist loadgroup``. Every test joins one xdist group, so a session or module fixture is built
once, in one worker: an explicit ``@pytest.mark.xdist_group("name")`` wins, else the group of a
shared fixture it uses (:data:`FIXTURE_GROUPS`), else its module. Tests marked ``vllm`` (and
every user of ``shared_vllm``, marked so here) or ``alone`` run after the rest, one at a time:
vLLM takes both cores, and an ``alone`` test's timing or noise check was tuned with nothing
beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import shared_server
from e2e_checks import swarmload

REPO_ROOT = Path(__file__).resolve().parent.parent

STOPS_SHARED_VLLM = "stops_shared_vllm"
ALONE = "alone"  # make test runs these after the parallel part, with the vllm tests

# The shared simulator study: two configurations whose capacity is known by construction (a fixed
# 25 ms decode step, no prefill cost, 16 output tokens: a request holds one of max_num_seqs slots
# for 0.4 s, so C = max_num_seqs / 0.4 s), swept open-loop with Poisson steps around C.
SIM_DECODE_STEP_S = 0.025
SIM_OUTPUT_TOKENS = 16
SIM_ARGS = [f"--decode-base-s={SIM_DECODE_STEP_S}", "--decode-per-seq-s=0", "--prefill-base-s=0",
            "--prefill-per-token-s=0"]
SIM_SLOTS = {"seqs-4": 4, "seqs-8": 8}
# Steps as fractions of C. 0.75 and 1.4 lie outside the 10% band, so a wrong knee or limit can
# show; 0.92 (not 0.95) because within an 8 s step the queue of a server loaded to 95% has not
# settled, and its cohort finishes about 5% later than it arrived: a coin toss at the 95% rule.
# Four steps are the fewest that leave the knee an interior point on either side of C.
SIM_FRACTIONS = (0.75, 0.92, 1.08, 1.4)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        _poll_the_work_queue(config)
    config.addinivalue_line(
        "markers", f"{ALONE}: runs after the parallel part, with the vllm tests, with nothing "
                   "else of the suite beside it (a check of timing or noise that a second test "
                   "on the other core disturbs)")
    config.addinivalue_line(
        "markers", f"{STOPS_SHARED_VLLM}: stops the session's shared vLLM server, so it runs "
                   "after every other test that uses it")


# A session fixture built once for the whole suite: every test using it runs in the one xdist
# worker that holds it (a second worker would build its own: a second vLLM, a second study).
# A fixture that reaches one of them through request.getfixturevalue (the browser test's
# study_results, which can reuse a folder instead) is not in the test's fixture names: it is listed
# with the group of the one it reaches (without it the study ran twice, once in each worker).
FIXTURE_GROUPS = {"shared_vllm": "shared-vllm", "sim_capacity_study": "sim-capacity-study",
                  "study_results": "sim-capacity-study"}
# where the workers write each test's group for the controller's scheduler (a workerinput key)
GROUPS_FILE_KEY = "swarmload_xdist_groups"


def _poll_the_work_queue(config: pytest.Config) -> None:
    """An xdist worker waits for its next test by polling, not on a threading.Event.

    Importing locust (at collection) monkey-patches threading with gevent in the worker, as in
    any pytest run; xdist's queue then waits on an Event whose waiter is a gevent lock while its
    setter is execnet's receiving thread, a real thread: gevent sees nothing that could wake it
    and raises LoopExit ("This operation would block forever"). A sleep of 5 ms between looks
    (gevent's, once patched) keeps the hub's timer alive; the queue's own lock is a real lock
    made before the patch. The queue is the worker's own object (its module runs as execnet's
    ``__channelexec__``, not as ``xdist.remote``), found through the plugin holding it."""
    import time
    import types

    queues = [plugin.torun for plugin in config.pluginmanager.get_plugins()
              if hasattr(plugin, "torun") and hasattr(plugin.torun, "lock")]

    def get(self):  # noqa: ANN001, ANN202 (xdist's TestQueue)
        while True:
            with self.lock() as items:
                if items:
                    return items.popleft()
            time.sleep(0.005)

    for queue in queues:
        queue.get = types.MethodType(get, queue)


# fixture scopes that bind a test to the other tests of its module: built once per module, so
# the module's tests run in one worker
MODULE_SCOPES = ("module", "class", "package")


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in: its own mark, else a shared fixture's, else its module
    when it uses a fixture of a module's (or class's) scope, else the test alone. A module of
    independent tests is spread over the workers: one group of a module's 11 sessions runs
    (480 s) was the critical path of the parallel part, the other workers idle for 2 minutes."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    fixtures = getattr(item, "fixturenames", ())
    for fixture, group in FIXTURE_GROUPS.items():
        if fixture in fixtures:
            return group
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return module
    for name in fixtures:
        definitions = info.name2fixturedefs.get(name) or ()
        if definitions and definitions[-1].scope in MODULE_SCOPES:
            return module
    return item.nodeid


# tryfirst: before pytest's own -m selection, so the vllm mark added here selects
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks, order and groups. A user of the shared vLLM server is marked ``vllm``. Slow groups
    come first (the parallel run's workers take groups in this order, so the long ones do not
    finish alone at the end); the tests using the shared vLLM server run together at the end,
    those marked ``stops_shared_vllm`` last: the server (gigabytes of memory) lives only while
    they run. In a pytest-xdist worker, each test's group (:func:`xdist_group_of`) goes to the
    controller's scheduler (:func:`pytest_xdist_make_scheduler`)."""
    groups = {item: xdist_group_of(item) for item in items}
    for item in items:
        if "shared_vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
    slow_groups = {group for item, group in groups.items() if item.get_closest_marker("slow")}

    def place(item: pytest.Item) -> int:
        if item.get_closest_marker(STOPS_SHARED_VLLM):
            return 3
        if "shared_vllm" in getattr(item, "fixturenames", ()):
            return 2
        return 0 if groups[item] in slow_groups else 1

    items.sort(key=place)  # stable: collection order within each place
    groups_file = getattr(config, "workerinput", {}).get(GROUPS_FILE_KEY)
    if groups_file:  # every worker collects the same tests: the last one's write stands
        from collectors.atomic import write_json_atomic

        write_json_atomic(Path(groups_file), {item.nodeid: group for item, group in groups.items()})


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 (xdist's WorkerController)
    """The controller tells each worker where to write the groups (one file per run)."""
    node.workerinput[GROUPS_FILE_KEY] = str(_groups_file(node.config))


def _groups_file(config: pytest.Config) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"swarmload-xdist-groups-{os.getpid()}.json"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """``--dist loadgroup`` by this suite's groups (:func:`xdist_group_of`), in collection order.

    pytest-xdist 3.8's own loadgroup cannot group on pytest 9.2 (it rewrites a node id attribute
    pytest no longer reads: pytest-dev/pytest-xdist#1386), and would group only marked tests;
    here every test has a group, sent by the workers through a file."""
    if config.getvalue("dist") != "loadgroup":
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] = {}

        def schedule(self) -> None:
            if self.collection is None:  # the first call: every worker has collected
                path = _groups_file(self.config)
                self.groups = json.loads(path.read_text()) if path.exists() else {}
                path.unlink(missing_ok=True)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an older pytest, where xdist's works
                return nodeid.rsplit("@", 1)[1]
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems chose
    return GroupScheduling(config, log)


# SWARMLOAD_TEST_TIMES=PATH: every test's phases (setup, call, teardown) as JSON lines in
# PATH.<xdist worker or "main">.jsonl: wall start and seconds, and the CPU seconds of this process
# and the children it reaped meanwhile (a subprocess a test starts and waits for). The suite's
# time is measured with it (docs/results/speed): which tests hold a core and which only wait.
TEST_TIMES_ENV = "SWARMLOAD_TEST_TIMES"


def _cpu_s() -> float:
    import resource

    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(TEST_TIMES_ENV)
    if not path:
        yield
        return
    import json
    import time

    phases: dict[str, float] = {}
    item.stash[_PHASES] = phases  # filled by pytest_runtest_makereport
    started, cpu = time.time(), _cpu_s()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"test": item.nodeid, "worker": worker, "start": started,
            "wall_s": time.time() - started, "cpu_s": _cpu_s() - cpu,
            "phases": {name: round(seconds, 3) for name, seconds in phases.items()}}
    with open(f"{path}.{worker}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


_PHASES = pytest.StashKey[dict[str, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    yield
    phases = item.stash.get(_PHASES, None)
    if phases is not None:
        phases[call.when] = call.duration


@pytest.fixture
def run_swarmload(tmp_path: Path):
    """Run ``swarmload ARGS`` in a subprocess with a hard timeout; returns CompletedProcess."""
    return swarmload


@pytest.fixture(scope="session")
def shared_vllm() -> Iterator[object]:
    """One real vLLM server (tiny model, ``--max-model-len 2048 --enforce-eager``, its spans to
    ``server.traces_endpoint``; :mod:`shared_server` has its configuration) for the whole
    session: the one ``make test`` started early (``$SWARMLOAD_SHARED_VLLM_STATE``), or one
    started here.

    Tests may send it requests but must not change it; the one test that stops it is marked
    ``stops_shared_vllm`` and so runs after every other user (see pytest_collection_modifyitems).
    """
    from infra.targets.vllm_venv import vllm_python

    if not vllm_python().exists():
        pytest.skip(f"no vLLM interpreter at {vllm_python()} (run `make vllm-venv`)")
    state = os.environ.get(shared_server.STATE_ENV)
    early = shared_server.adopt(Path(state)) if state else None
    server = early or shared_server.make_server()
    if early is None:
        server.start()
    try:
        try:
            server.wait_ready(timeout_s=shared_server.READY_TIMEOUT_S)
        except shared_server.EarlyServerGone as gone:
            # The early server died before its tests (its log's end is in the warning, so the
            # cause is in the suite's output): they get a server of their own instead.
            warnings.warn(f"{gone}\nstarting a shared vLLM server here instead", stacklevel=1)
            server = shared_server.make_server()
            server.start()
            server.wait_ready(timeout_s=shared_server.READY_TIMEOUT_S)
        yield server
    finally:
        server.stop()


def sim_capacity(slots: int) -> float:
    """Requests per second the simulator of :data:`SIM_ARGS` serves with ``slots`` slots."""
    return slots / (SIM_DECODE_STEP_S * SIM_OUTPUT_TOKENS)


@dataclass(frozen=True)
class SimStudy:
    name: str
    results: Path  # the results folder: studies/<study folder> below it
    study_dir: Path
    capacities: dict[str, float]  # configuration -> known capacity, req/s
    steps_per_config: int
    stdout: str


@pytest.fixture(scope="session")
def sim_capacity_study(tmp_path_factory: pytest.TempPathFactory) -> SimStudy:
    """One finished ``swarmload study run`` of the two known-capacity simulator configurations.

    The capacity test checks its figures; the browser test opens its pages.
    """
    import yaml

    name = "sim-capacity"
    study = {
        "name": name,
        "configurations": [
            {"name": config, "target": "sim", "args": [f"--max-num-seqs={n}", *SIM_ARGS],
             "steps": [round(sim_capacity(n) * f, 2) for f in SIM_FRACTIONS]}
            for config, n in SIM_SLOTS.items()],
        "workload": {"mix": "100/0/0", "max_tokens": SIM_OUTPUT_TOKENS, "rows": 500},
        "load": {"kind": "rate", "arrival": "poisson"},
        "step_duration_s": 8, "warmup_s": 1.5, "cooldown_s": 0.5, "drain_s": 30, "workers": 1,
        "slo": {"ttft_ms": 1500, "tpot_ms": 50, "error_rate": 0.01, "percentile": "p95"},
        "stop_when": {"error_rate": 0.5, "latency_growth": 100},
        "labels": {"engine": "sim"},
        "refine": False,  # the sweep as listed (tests/test_infra_study_search.py: the search)
    }
    root = tmp_path_factory.mktemp("sim-capacity-study")
    study_file = root / "study.yaml"
    study_file.write_text(yaml.safe_dump(study))
    results = root / "results"
    done = swarmload("study", "run", str(study_file), "--results", str(results / "studies"),
                     timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (study_dir,) = [p for p in (results / "studies").iterdir() if p.is_dir()]
    return SimStudy(name, results, study_dir,
                    {config: sim_capacity(n) for config, n in SIM_SLOTS.items()},
                    len(SIM_FRACTIONS), done.stdout)


@pytest.fixture(scope="session")
def poisson_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An open-loop workload: 8 output tokens a request, a Poisson plan at 20 req/s (about
    120 requests in a 6 s run), built from a small generated log (no trace files needed).
    Open-loop runs drain, so every scheduled request ends with one record: counts can be
    compared exactly with a server's or a load balancer's."""
    folder = tmp_path_factory.mktemp("poisson-workload")
    log = folder / "log.csv"
    log.write_text("timestamp,prompt_tokens,output_tokens\n"
                   + "".join(f"{i * 0.05},{20 + i % 40},8\n" for i in range(200)))
    subprocess.run(
        [sys.executable, "-m", "infra.cli", "workload", "build", "--source", f"generic:{log}",
         "--map", "timestamp=timestamp,prompt_tokens=prompt_tokens,output_tokens=output_tokens",
         "--n", "120", "--mix", "native", "--tokenizer", "words", "--out", str(folder / "wl"),
         "--arrivals", "poisson:rate_rps=20", "--quiet"],
        cwd=REPO_ROOT, check=True, timeout=120)
    return folder / "wl"
