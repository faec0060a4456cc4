"""A small real release for the representation evaluation: smooth fields over two cities.

Observations of one year for Amsterdam (10 × 14 tiles at 2 km) and Christchurch (30 × 32) are
written as the pipeline writes them (one Parquet partition per city, year and modality) and
the release's ``cube.duckdb`` is built over them. Every target is a smooth function of the tile
position plus a little noise, so that nearby tiles look alike: the setting where a random
split leaks. Amsterdam also gets a land-cover chip store (west half one class) for the
class-fraction task, and the release gets the dataset's 10 km parent split as a ``splits`` view.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import (
    OBSERVATION_SCHEMA,
    Release,
    build_duckdb,
    release_metadata,
    write_parquet_atomic,
    write_tiles,
)
from citycube.grid.tiles import city_grid
from citycube.tasks.splits import tile_parent_table, tile_splits
from tests.release_fixtures import write_mixed_lc_chips

CITIES = ("Amsterdam", "Christchurch")
YEAR = 2020
CAT = load_catalogue()

FIELDS = {
    "POP": "population_density",
    "NTL": "radiance",
    "HEAT": "mean_c",
    "DEM": "elevation_m",
    "NDVI": "ndvi",
}
"""Numeric fields written (the rest of the catalogue stays unwritten)."""


def smooth_fields(row: np.ndarray, col: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Values of each field at grid index (row, col): smooth waves plus small noise."""
    rng = np.random.default_rng(seed)
    noise = lambda: rng.normal(0.0, 0.05, row.shape)  # noqa: E731
    wave = np.sin(row / 4.0) * np.cos(col / 5.0)
    return {
        "POP": 1000.0 * (1.5 + wave + noise()),
        "NTL": 20.0 * (1.2 + np.cos(row / 6.0) * np.sin(col / 3.5) + noise()),
        "HEAT": 15.0 + 5.0 * np.sin((row + col) / 7.0) + noise(),
        "DEM": 50.0 * (1.0 + np.cos(row / 9.0)) + noise(),
        "NDVI": 0.4 + 0.3 * np.sin(col / 8.0) + noise(),
        "LC": np.where(wave > 0.2, 190, np.where(wave < -0.2, 10, 51)).astype(float),
    }


def _partition(city: str, code: str, field: str, unit: str, tiles, values, available) -> pa.Table:
    n = len(tiles)
    return pa.table(
        {
            "tile_id": [t.tile_id for t in tiles],
            "city": [city] * n,
            "scale": [t.scale for t in tiles],
            "year": np.full(n, YEAR, np.int16),
            "modality": [code] * n,
            "field": [field] * n,
            "value": pa.array(values, mask=~available),
            "unit": [unit] * n,
            "valid_fraction": np.where(available, 1.0, 0.2),
            "available": available,
            "reason": pa.array(
                np.where(available, None, "insufficient_valid_support"), pa.string()
            ),
            "temporal_basis": ["annual"] * n,
            "source_year": np.full(n, YEAR, np.int16),
            "source_id": [f"test:{code}"] * n,
            "source_version": ["0"] * n,
            "synthetic": np.ones(n, bool),
        }
    ).cast(OBSERVATION_SCHEMA)


def _observations(release: Release, city: str, seed: int) -> None:
    tiles = [t for scale in SCALES for t in city_grid(city, scale).tiles()]
    row = np.array([t.row for t in tiles], float)
    col = np.array([t.col for t in tiles], float)
    values = smooth_fields(row, col, seed)
    rng = np.random.default_rng(seed + 1)
    for code, field in [*FIELDS.items(), ("LC", "dominant_class")]:
        unit = next(f.unit for f in CAT.get(code).fields if f.name == field)
        available = np.ones(len(tiles), bool)
        if code == "POP":
            available = rng.random(len(tiles)) > 0.05  # a few tiles lack support
        table = _partition(city, code, field, unit, tiles, values[code], available)
        write_parquet_atomic(table, release.observations_file(city, YEAR, code))


def _lc_chips(release: Release, city: str) -> None:
    """LC chips of the city: west half class 10, east half a mix of 10, 51 and 190."""
    write_mixed_lc_chips(release, city, YEAR, (YEAR,))


def build_smooth_release(data_root: Path, version: str = "rep") -> Release:
    """Build and publish the release; its database has a ``splits`` view (10 km parents)."""
    release = Release(data_root, version)
    write_tiles(release)
    for i, city in enumerate(CITIES):
        _observations(release, city, seed=i)
    _lc_chips(release, "Amsterdam")
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta)
    splits = tile_splits(tile_parent_table(CITIES))
    path = release.root / "parent_splits.parquet"
    write_parquet_atomic(splits, path)
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute(f"CREATE VIEW splits AS SELECT * FROM read_parquet('{path}')")
    return release


def build_single_modality_release(data_root: Path, version: str = "pop-only") -> Release:
    """Amsterdam 2020 with POP alone: the ``cube`` embedding has nothing to offer POP."""
    release = Release(data_root, version)
    write_tiles(release)
    tiles = list(city_grid("Amsterdam", "2km").tiles())
    row = np.array([t.row for t in tiles], float)
    col = np.array([t.col for t in tiles], float)
    values = smooth_fields(row, col, 0)["POP"]
    unit = next(f.unit for f in CAT.get("POP").fields)
    table = _partition("Amsterdam", "POP", FIELDS["POP"], unit, tiles, values, np.ones(140, bool))
    write_parquet_atomic(table, release.observations_file("Amsterdam", YEAR, "POP"))
    build_duckdb(release, CAT, release_metadata(release, source_set="test", synthetic=True))
    return release
