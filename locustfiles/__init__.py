"""The Locust side of swarmload: the user class, open-loop replay, clocks, streaming and timing.

:data:`LOCUSTFILE` is the locustfile that ``swarmload run`` gives the master and the workers,
found in the installed package (``importlib.resources``), so a plain Locust run works from any
folder: ``locust -f "$(swarmload locustfile)" --headless -u 8 -r 8 -t 30s --host URL``.
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path

LOCUSTFILE = Path(str(files(__name__) / "llm_user.py"))


def main(argv: list[str] | None = None) -> int:
    """``swarmload locustfile``: print the packaged locustfile's path."""
    argparse.ArgumentParser(
        prog="swarmload locustfile",
        description="Print the path of the packaged locustfile, for plain Locust: "
                    'locust -f "$(swarmload locustfile)" --host URL ...').parse_args(argv)
    print(LOCUSTFILE)
    return 0
