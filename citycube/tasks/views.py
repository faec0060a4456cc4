"""The benchmark tasks' views in a release's DuckDB database, over the files each task wrote.

The cube's database is built by :mod:`citycube.cube.release`, which knows nothing of the tasks;
it takes :func:`task_views` to add theirs, and :func:`stage_views` adds them to a staged
database once the tasks' files are written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from citycube.catalogue.modalities import Catalogue
from citycube.cube.release import (
    Release,
    atomic_database,
    stage_benchmark,
    tables_from_file_views,
)
from citycube.tasks.ev_charging import create_ev_views
from citycube.tasks.food_access import create_food_access_views
from citycube.tasks.forecast import create_forecast_views
from citycube.tasks.pairs import modality_order
from citycube.tasks.school_capacity import create_school_views
from citycube.tasks.translation import create_views

if TYPE_CHECKING:
    import duckdb


def create_task_views(
    con: duckdb.DuckDBPyConnection, folder: Path, order: Iterable[str]
) -> list[str]:
    """Views over every task's files present now in ``folder`` (a snapshot's benchmark
    folder); the names created."""
    return (
        create_views(con, folder, order)
        + create_forecast_views(con, folder)
        + create_ev_views(con, folder)
        + create_food_access_views(con, folder)
        + create_school_views(con, folder)
    )


def task_views(catalogue: Catalogue) -> Callable[[duckdb.DuckDBPyConnection, Path], list[str]]:
    """What :func:`citycube.cube.release.build_duckdb` calls to add the tasks' views."""
    order = modality_order(catalogue)
    return lambda con, folder: create_task_views(con, folder, order)


def stage_views(release: Release, catalogue: Catalogue) -> list[str]:
    """Add the draft's benchmark files to the staged database's snapshot and their views to
    the staged database (replaced in one rename); both are published with the tables.

    The database is copied whole (one sequential copy); the views that read one file are then
    replaced by tables of its rows (:func:`tables_from_file_views`). Without a staged database
    (a benchmark step run on its own) nothing is staged: the files wait in the draft for the
    next build, and no view is created.
    """
    folder = stage_benchmark(release)
    if folder is None:
        return []
    with atomic_database(release.staged_duckdb_file, copy=True) as con:
        created = create_task_views(con, folder, modality_order(catalogue))
        tables_from_file_views(con)  # the rows travel with the database
        return created
