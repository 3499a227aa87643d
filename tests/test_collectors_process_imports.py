"""What the processes of every run load at start: a Locust process's locustfile and a collector
import no pandas (0.35-0.45 s of CPU each; a study or the suite starts hundreds of them)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from collectors.run_folder import load_host

REPO_ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def test_the_locustfile_imports_no_pandas() -> None:
    """What ``locust --worker -f locustfiles/llm_user.py`` imports; the master reads a workload
    (pandas) only once it has one to schedule."""
    out = _python("""
        import sys
        import locust.main  # noqa: F401 (what `locust` imports before the locustfile)
        import locustfiles.llm_user  # noqa: F401
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("pandas", "yaml")))
        """)
    assert out.strip() == "[]"


def test_a_collector_writes_its_parts_without_loading_pandas(tmp_path: Path) -> None:
    """A real ``swarmload collect``: pandas' libraries are not mapped into the process after
    its host samples are written, and the parts read back with pandas as usual."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "collect", "--run-dir", str(run_dir),
         "--gpu-interval", "0", "--metrics-interval", "0", "--host-interval", "0.1",
         "--duration", "60"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((run_dir / "host").glob("*.parquet")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.1)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        proc.terminate()
        proc.wait(30)
    assert "pyarrow" in maps  # the check would see a library loaded
    assert "/pandas/" not in maps
    system = load_host(run_dir).query("kind == 'system'")
    assert len(system) >= 1 and system["sys_mem_total_bytes"].gt(0).all()


def test_pyarrow_told_of_no_pandas_sees_no_series() -> None:
    """Why only processes that never hand pyarrow a pandas object are told so: a Series' NaN
    then stays NaN instead of becoming null. A process that imported pandas first is left as
    it was."""
    told_first = _python("""
        import pyarrow as pa
        from collectors.parquet_sink import arrow_without_pandas
        arrow_without_pandas()
        import pandas as pd
        print(pa.array(pd.Series([1.0, None])).null_count)
        """)
    pandas_first = _python("""
        import pandas as pd
        import pyarrow as pa
        from collectors.parquet_sink import arrow_without_pandas
        arrow_without_pandas()
        print(pa.array(pd.Series([1.0, None])).null_count)
        """)
    assert (told_first.strip(), pandas_first.strip()) == ("0", "1")


def test_the_master_pays_pyarrows_pandas_import_before_the_load() -> None:
    """The master writes its records from its event loop: pyarrow's first conversion (which
    imports pandas, seconds on a loaded machine) is made when its recorder is set up, not at the
    first Parquet part mid-run, where it stalled a local run's loop past its run time."""
    out = _python("""
        import sys
        from locust.env import Environment
        from collectors import request_recorder
        environment = Environment()
        environment.create_local_runner()
        assert "pandas" not in sys.modules
        request_recorder.register(environment, None)
        print("pandas" in sys.modules)
        """)
    assert out.strip() == "True"
