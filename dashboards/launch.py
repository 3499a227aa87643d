"""``swarmload dashboard``: serve the Streamlit dashboard (dashboards/app.py) on a results folder.

Usage::

    swarmload dashboard [--results results] [--port 8501] [--address 127.0.0.1]

Listens on 127.0.0.1 unless ``--address`` says otherwise; runs headless (no browser is opened)
and sends no usage statistics. The process replaces itself with ``python -m streamlit run``, so
stopping this process (Ctrl-C, SIGTERM) stops the server and leaves no child behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.resources import files
from pathlib import Path

APP_PATH = Path(str(files(__package__) / "app.py"))  # the installed package's app


def build_command(results: Path, port: int, address: str, app: Path = APP_PATH) -> list[str]:
    """The ``python -m streamlit run`` command line that serves the dashboard (``app``: another
    script served the same way, as the first-view benches' floor page is)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        address,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button on a local report
        # the app is not edited while it is served; watching files only costs CPU
        "--server.fileWatcherType",
        "none",
        "--",
        "--results",
        str(results.resolve()),
    ]


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1..65535")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="swarmload dashboard", description="Serve the Streamlit dashboard on a results folder."
    )
    parser.add_argument("--results", type=Path, default=Path("results"), help="results folder")
    parser.add_argument("--port", type=_port, default=8501, help="port to listen on (8501)")
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to listen on (127.0.0.1: this host only)"
    )
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        print(f"swarmload dashboard: note: {args.results} does not exist yet", file=sys.stderr)
    command = build_command(args.results, args.port, args.address)
    print(f"swarmload dashboard: http://{args.address}:{args.port}", flush=True)
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # not reached: execv replaces this process
