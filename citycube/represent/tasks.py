"""Downstream tasks read from a release: targets on the cube's tiles.

CityRep §3.4 spans regression, classification and distribution prediction. Here each task is
one field of one modality for one city, scale and year, read from the release's observations
through DuckDB (only available values: an unavailable tile is not a task unit), or, for the
land-cover class fractions, from the land-cover chips of each tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb
import numpy as np

from citycube.errors import EmbeddingError

TaskKind = Literal["regression", "classification", "distribution"]


@dataclass(frozen=True)
class TaskSpec:
    """One downstream task: what it predicts and from which observations."""

    code: str
    kind: TaskKind
    modality: str
    field: str
    description: str

    @property
    def primary(self) -> str:
        """The task's primary metric (CityRep §3.6)."""
        return {"regression": "r2", "classification": "macro_f1", "distribution": "kl"}[self.kind]

    @property
    def higher_is_better(self) -> bool:
        return self.kind != "distribution"


TASKS: dict[str, TaskSpec] = {
    t.code: t
    for t in (
        TaskSpec("POP", "regression", "POP", "population_density", "population density"),
        TaskSpec("NTL", "regression", "NTL", "radiance", "night-time lights radiance"),
        TaskSpec("CO2", "regression", "CO2", "carbon_tc_km2", "CO2 emission density"),
        TaskSpec("LST", "regression", "HEAT", "mean_c", "land-surface temperature, annual mean"),
        TaskSpec("PM25", "regression", "AQ", "annual_mean_pm25", "PM2.5 annual mean"),
        TaskSpec("RDE", "regression", "RD", "road_fraction", "road density (share of pixels)"),
        TaskSpec("PROP", "regression", "PROP", "property_mean_2017ppp", "property value"),
        TaskSpec("LCC", "classification", "LC", "dominant_class", "majority land-cover class"),
        TaskSpec("LUC", "classification", "LU", "dominant_class", "majority land-use class"),
        TaskSpec("LCD", "distribution", "LC", "class_fractions", "land-cover class fractions"),
    )
}


@dataclass(frozen=True)
class Target:
    """A task's units and labels in one city: y is (n,), class ids (n,), or (n, K) fractions."""

    task: TaskSpec
    city: str
    scale: str
    year: int
    tile_ids: np.ndarray
    y: np.ndarray
    classes: np.ndarray | None = None
    """Class ids of a distribution's columns."""

    def __len__(self) -> int:
        return len(self.tile_ids)


def get_task(code: str) -> TaskSpec:
    try:
        return TASKS[code]
    except KeyError:
        raise EmbeddingError(f"unknown task {code!r}; use one of {', '.join(TASKS)}") from None


def latest_year(
    con: duckdb.DuckDBPyConnection, task: TaskSpec, city: str, scale: str
) -> int | None:
    """The latest year in which the task's field has any available tile in the city."""
    row = con.execute(
        "SELECT max(year) FROM observations WHERE city = ? AND scale = ? AND modality = ? "
        "AND field = ? AND available",
        [
            city,
            scale,
            task.modality,
            "dominant_class" if task.kind == "distribution" else task.field,
        ],
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def load_target(
    con: duckdb.DuckDBPyConnection,
    task: TaskSpec,
    city: str,
    scale: str,
    year: int,
    release_root: Path | None = None,
) -> Target:
    """The task's available labels; distribution tasks read the chips under ``release_root``."""
    if task.kind == "distribution":
        if release_root is None:
            raise EmbeddingError(f"task {task.code} reads chips: give the release root")
        return _class_fractions(con, task, city, scale, year, release_root)
    rows = con.execute(
        "SELECT tile_id, value FROM observations WHERE city = ? AND scale = ? AND year = ? "
        "AND modality = ? AND field = ? AND available AND value IS NOT NULL "
        "AND isfinite(value) ORDER BY tile_id",
        [city, scale, year, task.modality, task.field],
    ).fetchall()
    tiles = np.array([r[0] for r in rows], dtype=object)
    values = np.array([r[1] for r in rows], dtype=np.float64)
    if task.kind == "classification":
        return Target(task, city, scale, year, tiles, values.astype(np.int64))
    return Target(task, city, scale, year, tiles, values)


def _class_fractions(
    con: duckdb.DuckDBPyConnection,
    task: TaskSpec,
    city: str,
    scale: str,
    year: int,
    root: Path,
) -> Target:
    """Per tile, the share of each class among its valid chip pixels."""
    from citycube.cube.chips import open_chip_group

    rows = con.execute(
        "SELECT tile_id, store, row_off, col_off, height, width FROM chip_index "
        "WHERE city = ? AND scale = ? AND year = ? AND modality = ? AND available "
        "ORDER BY tile_id",
        [city, scale, year, task.modality],
    ).fetchall()
    groups: dict[str, object] = {}
    counts: list[np.ndarray] = []
    tiles: list[str] = []
    for tile_id, store, r, c, h, w in rows:
        if store not in groups:
            path = (root / store).resolve()
            if not path.is_relative_to(root.resolve()):
                raise EmbeddingError(f"chip store {store} lies outside the release {root}")
            groups[store] = open_chip_group(path)
        group = groups[store]
        data = np.asarray(group["data"][0, r : r + h, c : c + w])  # type: ignore[index]
        valid = np.asarray(group["valid"][r : r + h, c : c + w]).astype(bool)  # type: ignore[index]
        ids = data[valid].astype(np.int64)
        if ids.size == 0:
            continue
        counts.append(np.bincount(ids))
        tiles.append(tile_id)
    if not counts:
        return Target(task, city, scale, year, np.array([], object), np.zeros((0, 0)), np.zeros(0))
    width = max(len(c) for c in counts)
    stacked = np.vstack([np.pad(c, (0, width - len(c))) for c in counts])
    present = np.flatnonzero(stacked.sum(axis=0))
    fractions = stacked[:, present] / stacked.sum(axis=1, keepdims=True)
    return Target(task, city, scale, year, np.array(tiles, object), fractions, present)
