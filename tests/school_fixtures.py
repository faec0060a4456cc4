"""A small published London release with school capacity cases and traps for leaks.

London 2 km tiles, 2014–2025: HEAT (annual) whose values from 2024 on are ``FUTURE_MARK``;
POP (an epoch product) served from the 2015 epoch before 2020 and from a 2025 epoch after,
whose values are all ``FUTURE_MARK``; OPT chips for 2022, 2023 and 2024, every pixel of year
``y`` equal to ``y - 2000``. The school cases come from the sample twin's files through the
source reader and the core selection, as a build makes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.chips import chip_writer
from citycube.cube.release import (
    CHIP_INDEX_SCHEMA,
    OBSERVATION_SCHEMA,
    Release,
    build_duckdb,
    publish_database,
    release_metadata,
    write_tiles,
)
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.tasks.school_capacity import select_cases, write_school_cases
from citycube.tasks.views import stage_views
from sources.dfe_schools import item_records
from sources.sample.school_capacity import sample_school_item

CAT = load_catalogue()
CITY = "London"
YEARS = tuple(range(2014, 2026))
FUTURE_MARK = 987_654.0
CHIP_YEARS = (2022, 2023, 2024)
CHIP_RES = 200


def _row(tile: str, year: int, code: str, field: str, value: float, **kw: object) -> dict:
    return {
        "tile_id": tile,
        "city": CITY,
        "scale": "2km",
        "year": year,
        "modality": code,
        "field": field,
        "value": value,
        "unit": kw.get("unit", "1"),
        "valid_fraction": 1.0,
        "available": True,
        "reason": None,
        "temporal_basis": kw.get("basis", "annual"),
        "source_year": kw.get("source_year", year),
        "source_id": kw.get("source_id", f"test {year}"),
        "source_version": "0",
        "synthetic": True,
    }


def _observations(release: Release) -> None:
    tiles = city_grid(CITY, "2km").tile_ids()
    for year in YEARS:
        heat = [
            _row(t, year, "HEAT", "mean_c", FUTURE_MARK if year >= 2024 else 14.0 + 0.01 * i)
            for i, t in enumerate(tiles)
        ]
        epoch = 2015 if year < 2020 else 2025
        pop = [
            _row(
                t,
                year,
                "POP",
                "population_density",
                1_000.0 + i if epoch == 2015 else FUTURE_MARK,
                unit="persons/km²",
                basis="epoch",
                source_year=epoch,
                source_id=f"epoch {epoch}",
            )
            for i, t in enumerate(tiles)
        ]
        for code, rows in (("HEAT", heat), ("POP", pop)):
            path = release.observations_file(CITY, year, code)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=OBSERVATION_SCHEMA), path)


def _chips(release: Release) -> None:
    grid = pixel_grid(CITY, CHIP_RES)
    tiles = list(city_grid(CITY, "2km").tiles())
    for year in CHIP_YEARS:
        store = f"chips/OPT/{CITY}/{year}.zarr"
        values = np.full((3, *grid.shape), year - 2000, dtype=np.uint8)
        valid = np.ones(grid.shape, dtype=bool)
        with chip_writer(
            release.root / store, grid, ["red", "green", "blue"], np.uint8, 0, {}
        ) as w:
            w.write_block(0, 0, values, valid)
        rows = []
        for tile in tiles:
            r, c, h, wd = grid.window(tile)
            rows.append(
                {
                    "tile_id": tile.tile_id,
                    "city": CITY,
                    "scale": "2km",
                    "year": year,
                    "modality": "OPT",
                    "store": store,
                    "row_off": r,
                    "col_off": c,
                    "height": h,
                    "width": wd,
                    "resolution_m": float(CHIP_RES),
                    "valid_fraction": 1.0,
                    "available": True,
                    "temporal_basis": "annual",
                    "source_year": year,
                    "classes": None,
                }
            )
        path = release.chip_index_file(CITY, year, "OPT")
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=CHIP_INDEX_SCHEMA), path)


def stage_london(root: Path) -> tuple[Release, dict]:
    """The London release written and staged, not yet with school cases (and its metadata)."""
    release = Release(root / "data", "t")
    write_tiles(release)
    _observations(release)
    _chips(release)
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    return release, meta


def make_school_release(root: Path) -> Release:
    """Write, stage and publish the release with its school capacity cases."""
    release, meta = stage_london(root)
    item = sample_school_item(CITY, root / "sources", seed=0)
    found = select_cases(item_records(item, CITY))
    write_school_cases(release, found, {"source_id": "sample", "synthetic": True})
    stage_views(release, CAT)
    publish_database(release, meta)
    return release
