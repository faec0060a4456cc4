"""Agent runs' tables in a release: Parquet files under ``<release>/agents/`` and DuckDB views
``agent_runs``, ``agent_tool_calls`` and ``agent_scores`` over them in ``cube.duckdb``.

The views are added to the published database by a copy replaced in one rename, so a reader
sees the database without them or with all three. Every row carries the release id and the
catalogue digest its run was made on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import duckdb

    from citycube.cube.release import Release

AGENT_VIEWS = ("agent_runs", "agent_tool_calls", "agent_scores")
"""The views, in the order they are written."""
AGENTS_DIR = "agents"
"""Folder of the agent tables inside a release."""


def agent_tables_dir(release: Release) -> Path:
    """Where a release's agent tables are."""
    return release.root / AGENTS_DIR


def write_agent_tables(
    folder: Path, tables: Mapping[str, pa.Table], names: Sequence[str] = AGENT_VIEWS
) -> dict[str, Path]:
    """Write each table as ``<view name>.parquet`` (atomically); the paths."""
    import pyarrow.parquet as pq

    from citycube.io.atomic import atomic_path

    unknown = sorted(set(tables) - set(names))
    if unknown:
        raise ValueError(f"not agent tables: {unknown}; expected {tuple(names)}")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        if name in tables:
            path = folder / f"{name}.parquet"
            with atomic_path(path) as tmp:
                pq.write_table(tables[name], tmp)
            paths[name] = path
    return paths


def create_agent_views(
    con: duckdb.DuckDBPyConnection, folder: Path, names: Sequence[str] = AGENT_VIEWS
) -> list[str]:
    """Views over the agent tables present in ``folder``; the names created."""
    from citycube.cube.release import create_file_view

    created = []
    for name in names:
        path = folder / f"{name}.parquet"
        if path.exists():
            create_file_view(con, name, path)
            created.append(name)
    return created


def publish_agent_tables(release: Release, tables: Mapping[str, pa.Table]) -> list[str]:
    """Write the tables into the release and add their views to its published database."""
    from citycube.cube.release import atomic_database, tables_from_file_views
    from citycube.errors import ReleaseNotFoundError

    if not release.duckdb_file.exists():
        raise ReleaseNotFoundError(
            f"no published cube at {release.duckdb_file}: build the release first"
        )
    folder = agent_tables_dir(release)
    write_agent_tables(folder, tables)
    with atomic_database(release.duckdb_file, copy=True) as con:
        created = create_agent_views(con, folder)
        tables_from_file_views(con)  # the rows travel with the database
        return created


def publish_task_tables(release: Release, task: str, tables: Mapping[str, pa.Table]) -> list[str]:
    """A planning task's run tables (``<task>/<name>.parquet`` under the release's agent folder)
    and a table per run table in its published database (the rows travel with the database);
    the names."""
    from citycube.agents.session import validate_run_name
    from citycube.cube.release import atomic_database, tables_from_file_views
    from citycube.errors import ReleaseNotFoundError

    if not release.duckdb_file.exists():
        raise ReleaseNotFoundError(
            f"no published cube at {release.duckdb_file}: build the release first"
        )
    folder = agent_tables_dir(release) / validate_run_name(task)
    names = tuple(tables)
    write_agent_tables(folder, tables, names)
    with atomic_database(release.duckdb_file, copy=True) as con:
        created = create_agent_views(con, folder, names)
        tables_from_file_views(con)
        return created
