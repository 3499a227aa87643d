"""Pure analysis of run and study folders over pandas/Arrow: summaries, roll-ups, telemetry joins.

Nothing here imports Streamlit; the pages in :mod:`dashboards.ui`, the HTML export and the CLI
(``swarmload summary``, ``swarmload study rollup``) lay out what these functions return.
"""
