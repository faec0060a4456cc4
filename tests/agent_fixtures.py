"""A small published release with forecasting cases and traps for leaks, for the agent tests.

Boston, 2009–2025, 2 km and 5 km tiles: HEAT, CO2 and PROP panels (as the forecasting tests
make them) with PROP's unit naming its price year, plus

* POP, an epoch product: years before 2015 come from the 2010 epoch, later years from the 2020
  epoch, whose values are all ``FUTURE_MARK`` (so a tool that serves a year of a case's history
  from a product of period 0 or later shows it);
* OPT chips (a real Zarr chip store per year with its chip index) for 2018, 2019 and 2020–2024,
  every pixel of year ``y`` equal to ``y - 2000`` (so period 0's chip is recognisable).

Cases are made and published through the core, as a build does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
from citycube.tasks.forecast import write_forecast_cases
from citycube.tasks.views import stage_views

CAT = load_catalogue()
CITY = "Boston"
YEARS = tuple(range(2009, 2026))
ELIGIBLE = 6
"""The first 2 km tiles with a complete HEAT panel (the others miss 2012)."""
FUTURE_MARK = 987_654.0
"""POP's value in every year served by the 2020 epoch."""
CHIP_YEARS = (2018, 2019, 2020, 2021, 2022, 2023, 2024)
CHIP_RES = 100
ASKED = {"lst": 10, "carbon": 10, "property": 10}


def _value(code: str, tile: int, year: int) -> float:
    t = year - 2010
    if code == "HEAT":
        return 14.0 + 0.1 * tile + 0.05 * t + 0.3 * np.sin(tile + year)
    if code == "CO2":
        return 500.0 + 40.0 * tile - 5.0 * t + 3.0 * np.cos(tile * year)
    return (300_000.0 + 1_000.0 * tile) * 1.03**t + 500.0 * np.sin(3 * tile + year)


def observation_row(
    city: str,
    tile: str,
    scale: str,
    year: int,
    code: str,
    field: str,
    value: float | None,
    **kw: object,
) -> dict:
    """One observation (a missing value is unavailable with a reason, never zero)."""
    return {
        "tile_id": tile,
        "city": city,
        "scale": scale,
        "year": year,
        "modality": code,
        "field": field,
        "value": value,
        "unit": kw.get("unit", "1"),
        "valid_fraction": kw.get("fraction", 1.0),
        "available": value is not None,
        "reason": None if value is not None else "insufficient_valid_support",
        "temporal_basis": kw.get("basis", "annual"),
        "source_year": kw.get("source_year", year),
        "source_id": kw.get("source_id", "test"),
        "source_version": "0",
        "synthetic": True,
    }


def write_observations(release: Release, city: str, year: int, code: str, rows: list[dict]) -> None:
    """One city × year × modality partition of the release's draft observations."""
    path = release.observations_file(city, year, code)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=OBSERVATION_SCHEMA), path)


def _row(tile: str, scale: str, year: int, code: str, field: str, value: float | None, **kw):
    return observation_row(CITY, tile, scale, year, code, field, value, **kw)


def _rows(year: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"HEAT": [], "CO2": [], "PROP": [], "POP": []}
    for scale in ("2km", "5km"):
        for i, tile in enumerate(city_grid(CITY, scale).tile_ids()):
            heat_ok = scale == "5km" or i < ELIGIBLE or year != 2012
            out["HEAT"].append(
                _row(
                    tile,
                    scale,
                    year,
                    "HEAT",
                    "mean_c",
                    _value("HEAT", i, year) if heat_ok else None,
                    unit="°C",
                )
            )
            out["CO2"].append(
                _row(
                    tile,
                    scale,
                    year,
                    "CO2",
                    "carbon_tc_km2",
                    _value("CO2", i, year),
                    unit="tonne C/km²/year",
                )
            )
            unit = f"USD (nominal, {year})"
            for field, factor in (("property_mean_local", 1.0), ("property_median_local", 0.9)):
                out["PROP"].append(
                    _row(
                        tile,
                        scale,
                        year,
                        "PROP",
                        field,
                        _value("PROP", i, year) * factor,
                        unit=unit,
                        basis="city_record",
                        source_id=f"records {year}",
                    )
                )
            epoch = 2010 if year < 2015 else 2020
            pop = 1_000.0 + i if epoch == 2010 else FUTURE_MARK
            out["POP"].append(
                _row(
                    tile,
                    scale,
                    year,
                    "POP",
                    "population_density",
                    pop,
                    unit="persons/km²",
                    basis="epoch",
                    source_year=epoch,
                )
            )
    return out


def write_opt_chips(
    release: Release,
    city: str,
    years: Iterable[int],
    res: int,
    scales: Iterable[str] = ("2km", "5km"),
    band_step: int = 1,
) -> None:
    """OPT chips of ``city`` (a Zarr store per year and its chip index) for the tiles of
    ``scales``: band ``b`` of year ``y`` is ``y - 2000 + b * band_step`` at every pixel."""
    grid = pixel_grid(city, res)
    tiles = [t for s in scales for t in city_grid(city, s).tiles()]
    for year in years:
        store = f"chips/OPT/{city}/{year}.zarr"
        values = np.full((3, *grid.shape), year - 2000, dtype=np.uint8)
        for band in (1, 2):
            values[band] += band * band_step
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
                    "city": city,
                    "scale": tile.scale,
                    "year": year,
                    "modality": "OPT",
                    "store": store,
                    "row_off": r,
                    "col_off": c,
                    "height": h,
                    "width": wd,
                    "resolution_m": float(res),
                    "valid_fraction": 1.0,
                    "available": True,
                    "temporal_basis": "annual",
                    "source_year": year,
                    "classes": None,
                }
            )
        path = release.chip_index_file(city, year, "OPT")
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=CHIP_INDEX_SCHEMA), path)


def stage_release(root: Path, write: Callable[[Release], None]) -> tuple[Release, dict]:
    """Release ``t`` under ``root/data``: its tiles and what ``write`` adds to the draft, with
    a staged database over them (not published); the release and its metadata."""
    release = Release(root / "data", "t")
    write_tiles(release)
    write(release)
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    return release, meta


def publish(release: Release, meta: dict) -> None:
    """Stage the task views and publish the release, as a build does."""
    stage_views(release, CAT)
    publish_database(release, meta)


def _write_boston(release: Release) -> None:
    for year in YEARS:
        for code, rows in _rows(year).items():
            write_observations(release, CITY, year, code, rows)
    write_opt_chips(release, CITY, CHIP_YEARS, CHIP_RES)


def stage_boston(root: Path) -> tuple[Release, dict]:
    """The Boston release written and staged, without cases yet (and its metadata)."""
    return stage_release(root, _write_boston)


def make_agent_release(root: Path) -> Release:
    """Write, stage and publish the release with its forecasting cases."""
    release, meta = stage_boston(root)
    write_forecast_cases(release, ASKED)
    publish(release, meta)
    return release
