"""The median-of-cell-medians core (``citycube.grid.cells``): lattice placement and grouped
medians.
"""

from __future__ import annotations

import numpy as np
import pytest
from affine import Affine
from hypothesis import given, settings
from hypothesis import strategies as st
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.windows import Window

from citycube.grid.cells import CellLattice, grouped_medians, median_of_cell_medians
from citycube.grid.tiles import TileGrid
from citycube.items.rasters import MaskedSource
from citycube.processing.aggregate import cell_median_tiles

GRID = TileGrid("Boston", "2km", 32619, 300_000.0, 4_700_000.0, 2000, 2, 3)
"""2 rows × 3 columns of 2 km tiles from (300 km, 4700 km)."""


def test_a_2km_tile_holds_16_cells_and_a_5km_tile_100() -> None:
    lattice = CellLattice(GRID, 500)
    assert (lattice.n_rows, lattice.n_cols) == (8, 12)
    assert np.bincount(lattice.tile_of(np.arange(8 * 12))).tolist() == [16] * 6
    five = CellLattice(TileGrid("Boston", "5km", 32619, 300_000.0, 4_700_000.0, 5000, 1, 1), 500)
    assert five.per_tile**2 == 100
    with pytest.raises(ValueError, match="do not divide"):
        CellLattice(GRID, 300)


def test_points_on_edges_go_east_and_south_and_outside_is_minus_one() -> None:
    lattice = CellLattice(GRID, 500)
    x = np.array([300_000.0, 300_499.9, 300_500.0, 305_999.0, 306_000.0, 299_999.0])
    y = np.array([4_700_000.0, 4_699_999.0, 4_699_500.0, 4_696_001.0, 4_699_000.0, 4_699_000.0])
    # (row 0, col 0), (0, 0), (1, 1), (7, 11), outside east, outside west
    assert lattice.cell_index(x, y).tolist() == [0, 0, 13, 95, -1, -1]
    # the tile of cell 95 (row 7, col 11) is the last tile, r1c2
    assert lattice.tile_of(np.array([0, 13, 95])).tolist() == [0, 0, 5]
    cx, cy = lattice.centres()
    assert lattice.cell_index(cx, cy).tolist() == list(range(96))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.floats(-1e6, 1e6, allow_nan=False, width=32)),
        min_size=1,
        max_size=40,
    )
)
def test_grouped_medians_equal_numpy_median_per_group(pairs: list[tuple[int, float]]) -> None:
    keys = np.array([k for k, _ in pairs])
    values = np.array([v for _, v in pairs])
    got_keys, got = grouped_medians(keys, values)
    assert got_keys.tolist() == sorted(set(keys.tolist()))
    expected = [np.median(values[keys == k]) for k in got_keys]
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_median_of_cell_medians_by_hand() -> None:
    """Tile r0c0: cell 0 holds 1, 2, 30 (→ 2), cell 1 holds 4 and 8 (→ 6), cell 13 holds 100,
    so the tile's value is 6; the mean of the values is 24.17 and their median 6 too, so tile
    r0c1 shows the difference: cells 4 → [5], 5 → [7, 9, 9, 9] (→ 9): median (5 + 9) / 2 = 7,
    where the median of its values is 9."""
    lattice = CellLattice(GRID, 500)
    cells = np.array([0, 0, 0, 1, 1, 13, 4, 5, 5, 5, 5, -1])
    values = np.array([1, 2, 30, 4, 8, 100, 5, 7, 9, 9, 9, 1e9], dtype=float)
    tiles, medians = median_of_cell_medians(lattice, cells, values)
    assert tiles.tolist() == [0, 1]
    assert medians.tolist() == [6.0, 7.0]
    assert np.median(values[6:11]) == 9.0


def _masked_source(values: np.ndarray, valid: np.ndarray, transform: Affine) -> MaskedSource:
    def read(window: Window) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(window.row_off, window.row_off + window.height)
        cols = slice(window.col_off, window.col_off + window.width)
        return values[None, rows, cols], valid[rows, cols]

    height, width = values.shape
    grid = GeoBox((height, width), transform, CRS.from_epsg(32619))
    return MaskedSource(grid=grid, read=read, band_names=("v",))


def test_raster_cells_by_pixel_centre_equal_a_brute_force_whatever_the_blocks() -> None:
    """300 m pixels (not nesting in the 500 m cells) from 700 m west and north of the grid:
    each tile's value equals a loop over its cells, and the blocks do not change it."""
    rng = np.random.default_rng(7)
    transform = Affine(300, 0, GRID.x_min - 700, 0, -300, GRID.y_max + 700)
    values = rng.integers(0, 50, (20, 26)).astype(float)
    valid = rng.random((20, 26)) > 0.3
    source = _masked_source(values, valid, transform)
    rows, cols = np.nonzero(valid)
    x = transform.c + (cols + 0.5) * 300
    y = transform.f - (rows + 0.5) * 300
    v = values[rows, cols]
    expected = np.full(GRID.n_tiles, np.nan)
    for t, tile in enumerate(GRID.tiles()):
        x0, _, _, y1 = tile.bounds
        cell_medians = []
        for i in range(4):
            for j in range(4):
                inside = (
                    (x >= x0 + 500 * j)
                    & (x < x0 + 500 * (j + 1))
                    & (y <= y1 - 500 * i)
                    & (y > y1 - 500 * (i + 1))
                )
                if inside.any():
                    cell_medians.append(np.median(v[inside]))
        if cell_medians:
            expected[t] = np.median(cell_medians)
    default = cell_median_tiles(source, GRID, 500)[0]
    one_by_one = cell_median_tiles(source, GRID, 500, tile_rows_per_block=1, tile_cols_per_block=1)
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(default, expected)
    np.testing.assert_array_equal(one_by_one[0], expected)
