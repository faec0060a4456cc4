"""A small published London release with school capacity cases and traps for leaks.

London 2 km tiles, 2014–2025: HEAT (annual) whose values from 2024 on are ``FUTURE_MARK``;
POP (an epoch product) served from the 2015 epoch before 2020 and from a 2025 epoch after,
whose values are all ``FUTURE_MARK``; OPT chips for 2022, 2023 and 2024, every pixel of year
``y`` equal to ``y - 2000``. The school cases come from the sample twin's files through the
source reader and the core selection, as a build makes them.
"""

from __future__ import annotations

from pathlib import Path

from citycube.cube.release import Release
from citycube.grid.tiles import city_grid
from citycube.tasks.school_capacity import select_cases, write_school_cases
from sources.dfe_schools import item_records
from sources.sample.school_capacity import sample_school_item
from tests.agent_fixtures import (
    observation_row,
    publish,
    stage_release,
    write_observations,
    write_opt_chips,
)

CITY = "London"
YEARS = tuple(range(2014, 2026))
FUTURE_MARK = 987_654.0
CHIP_YEARS = (2022, 2023, 2024)
CHIP_RES = 200


def _row(tile: str, year: int, code: str, field: str, value: float, **kw: object) -> dict:
    return observation_row(
        CITY, tile, "2km", year, code, field, value, **{"source_id": f"test {year}", **kw}
    )


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
            write_observations(release, CITY, year, code, rows)


def _write_london(release: Release) -> None:
    _observations(release)
    write_opt_chips(release, CITY, CHIP_YEARS, CHIP_RES, scales=("2km",), band_step=0)


def stage_london(root: Path) -> tuple[Release, dict]:
    """The London release written and staged, not yet with school cases (and its metadata)."""
    return stage_release(root, _write_london)


def make_school_release(root: Path) -> Release:
    """Write, stage and publish the release with its school capacity cases."""
    release, meta = stage_london(root)
    item = sample_school_item(CITY, root / "sources", seed=0)
    found = select_cases(item_records(item, CITY))
    write_school_cases(release, found, {"source_id": "sample", "synthetic": True})
    publish(release, meta)
    return release
