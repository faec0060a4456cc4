"""Cube I/O: the release layout, Parquet tables and DuckDB views, publishing, manifests, releases,
diffs, checks and chip stores.
"""
