"""Streamlit dashboard over a results folder: a Run page and a Study page.

Run it with ``swarmload dashboard --results results`` or
``streamlit run dashboards/app.py -- --results results``. The results folder comes from
``--results`` after ``--``, else the ``SWARMLOAD_RESULTS`` environment variable, else
``results``. This file only sets the page up and routes:

- ``/`` (the default page, "Run"): one run folder, :mod:`dashboards.ui.run_page`;
- ``/study``: a study folder (one holding ``study.json``, e.g. ``results/studies/<name>``),
  its configurations side by side, :mod:`dashboards.ui.study_page`;
- ``/compare``: any runs, study steps or studies side by side, with verdicts,
  :mod:`dashboards.ui.compare_page`;
- ``/bursts``: spikes of an open-loop run or of a burst study, and the recovery from each,
  :mod:`dashboards.ui.burst_page`;
- ``/soak``: a long run's series with a drift verdict each, any hour zoomable,
  :mod:`dashboards.ui.soak_page`.

Both keep their choice in the URL (``?run=<run_id>``, ``?study=<name>``) so a view can be linked.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

import streamlit as st

RESULTS_ENV = "SWARMLOAD_RESULTS"
DEFAULT_RESULTS = "results"
RUN_PAGE = "ui/run_page.py"  # relative to this script, as st.Page resolves it; served at /
STUDY_PAGE = "ui/study_page.py"
COMPARE_PAGE = "ui/compare_page.py"
BURST_PAGE = "ui/burst_page.py"
SOAK_PAGE = "ui/soak_page.py"


def results_dir_from(argv: Sequence[str], environ: Mapping[str, str]) -> Path:
    """``--results`` from the script's arguments, else ``$SWARMLOAD_RESULTS``, else results."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--results", default=None)
    # parse_known_args: under AppTest sys.argv is the test runner's, which must not break this
    args, _ = parser.parse_known_args(list(argv))
    return Path(args.results or environ.get(RESULTS_ENV) or DEFAULT_RESULTS)


def main() -> None:
    st.set_page_config(page_title="swarmload", layout="wide")
    pages = [
        st.Page(RUN_PAGE, title="Run", default=True),  # the default page is served at /
        st.Page(STUDY_PAGE, title="Study", url_path="study"),
        st.Page(COMPARE_PAGE, title="Compare", url_path="compare"),
        st.Page(BURST_PAGE, title="Bursts", url_path="bursts"),
        st.Page(SOAK_PAGE, title="Soak", url_path="soak"),
    ]
    st.navigation(pages).run()


if __name__ == "__main__":
    main()
