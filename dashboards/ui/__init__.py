"""Streamlit pages, registered in :mod:`dashboards.app`; each only lays out what
:mod:`dashboards.analysis` computes. Nothing outside ``dashboards`` imports these modules.
"""
