"""City grids: counts, lattice alignment, ids and windows (AgenticCity-Bench Table 7)."""

from __future__ import annotations

import pytest
from pyproj import Transformer

from citycube.catalogue.cities import PARENT_SIZE_M, SCALES, load_cities
from citycube.errors import UnknownCityError
from citycube.grid.tiles import city_grid, city_grids, pixel_grid

SPEC_TABLE = {  # city: (2 km rows, cols), (5 km rows, cols) — AgenticCity-Bench Table 7
    "Amsterdam": ((10, 14), (3, 4)),
    "Boston": ((13, 13), (4, 4)),
    "Busan": ((16, 13), (5, 5)),
    "CapeTown": ((14, 13), (4, 5)),
    "Christchurch": ((30, 32), (11, 12)),
    "DC": ((13, 11), (5, 4)),
    "London": ((24, 30), (9, 11)),
    "Lyon": ((11, 13), (3, 4)),
    "NYC": ((26, 24), (10, 9)),
    "SanFrancisco": ((17, 19), (6, 6)),
    "Santiago": ((13, 14), (4, 5)),
    "Shanghai": ((13, 13), (5, 4)),
    "Singapore": ((20, 32), (7, 12)),
    "Sydney": ((13, 13), (5, 4)),
    "Tokyo": ((17, 17), (6, 6)),
    "XiongAn": ((25, 31), (9, 12)),
}


def test_sixteen_cities_in_thirteen_utm_zones() -> None:
    cities = load_cities()
    assert set(cities) == set(SPEC_TABLE)
    assert len({c.epsg % 100 for c in cities.values()}) == 13  # zone numbers


@pytest.mark.parametrize("city", sorted(SPEC_TABLE))
@pytest.mark.parametrize("scale", SCALES)
def test_grid_shape_matches_spec(city: str, scale: str) -> None:
    grid = city_grid(city, scale)  # type: ignore[arg-type]
    rows, cols = SPEC_TABLE[city][0 if scale == "2km" else 1]
    assert (grid.n_rows, grid.n_cols) == (rows, cols)


def test_totals_match_spec() -> None:
    totals = {s: sum(city_grid(c, s).n_tiles for c in SPEC_TABLE) for s in SCALES}
    assert totals == {"2km": 5836, "5km": 750}


@pytest.mark.parametrize("city", sorted(SPEC_TABLE))
def test_origins_on_10km_lattice_and_centre_inside(city: str) -> None:
    spec = load_cities()[city]
    cx, cy = Transformer.from_crs(4326, spec.epsg, always_xy=True).transform(
        spec.centre.lon, spec.centre.lat
    )
    for grid in city_grids(city).values():
        assert grid.x_min % PARENT_SIZE_M == 0 and grid.y_max % PARENT_SIZE_M == 0
        xmin, ymin, xmax, ymax = grid.bounds
        assert xmin < cx < xmax and ymin < cy < ymax


def test_tile_ids_rows_from_north_and_parents_nest() -> None:
    grid = city_grid("Boston", "2km")
    tile = grid.tile(7, 8)
    assert tile.tile_id == "Boston_2KM_r7_c8"
    assert grid.tile(0, 0).bounds[3] == grid.y_max  # row 0 is the north edge
    assert grid.tile(1, 0).bounds[3] < grid.tile(0, 0).bounds[3]
    for scale in SCALES:
        for t in city_grid("London", scale).tiles():
            xmin, ymin, xmax, ymax = t.bounds
            px, py = (xmin // PARENT_SIZE_M), ((ymax - 1) // PARENT_SIZE_M)
            # the whole tile lies in one 10 km parent cell
            assert (xmax - 1) // PARENT_SIZE_M == px and ymin // PARENT_SIZE_M == py
            assert t.parent_id == f"London_10KM_e{int(px)}_n{int(py)}"


def test_5km_and_2km_tiles_in_same_parent_share_its_id() -> None:
    two = {t.parent_id for t in city_grid("NYC", "2km").tiles()}
    five = {t.parent_id for t in city_grid("NYC", "5km").tiles()}
    assert two & five


@pytest.mark.parametrize("resolution", [10, 25, 100, 250])
def test_tiles_are_whole_windows_of_pixel_grid(resolution: int) -> None:
    grid = pixel_grid("Amsterdam", resolution)
    for scale in SCALES:
        for t in city_grid("Amsterdam", scale).tiles():
            row, col, h, w = grid.window(t)
            assert h == w == int(city_grid("Amsterdam", scale).tile_size / resolution)
            assert row >= 0 and row + h <= grid.height and col >= 0 and col + w <= grid.width
            x0 = grid.x_min + col * resolution
            assert x0 == t.bounds[0]


def test_chip_resolution_must_divide_1000() -> None:
    with pytest.raises(ValueError, match="divide 1000"):
        pixel_grid("Amsterdam", 30)


def test_unknown_city_error_lists_choices() -> None:
    with pytest.raises(UnknownCityError, match="Amsterdam"):
        city_grid("Atlantis", "2km")
