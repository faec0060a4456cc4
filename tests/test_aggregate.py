"""Tests of the exact, area-weighted tile aggregation.

Same-CRS results are checked against exactextract on the same file; reprojected results
against an independent computation (shapely intersections of each source cell, reprojected
into the tile CRS, with the tile box), so the two paths are not checked against themselves.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio
import shapely
from affine import Affine
from exactextract import exact_extract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from odc.geo.geobox import GeoBox
from pyproj import CRS, Transformer
from rasterio.windows import Window

import citycube.processing.aggregate as aggregate
from citycube.errors import SourceReadError
from citycube.grid.tiles import TileGrid
from citycube.items.rasters import MaskedSource
from citycube.processing.aggregate import (
    TileStats,
    aggregate_tiles,
    default_tile_cols_per_block,
    default_tile_rows_per_block,
)

NODATA = -9999.0
UTM = 32631


def small_grid(n_rows: int = 3, n_cols: int = 4, tile_size: int = 2000) -> TileGrid:
    """A grid next to the UTM central meridian (x = 500 km), where the scale is ~constant."""
    return TileGrid(
        city="Test",
        scale="2km",
        epsg=UTM,
        x_min=490_000.0,
        y_max=5_410_000.0,
        tile_size=tile_size,
        n_rows=n_rows,
        n_cols=n_cols,
    )


def write_raster(path: Path, values: np.ndarray, crs: str, transform: Affine) -> Path:
    """Write (bands, rows, cols) float64 values with NODATA declared."""
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=values.shape[2],
        height=values.shape[1],
        count=values.shape[0],
        dtype="float64",
        crs=crs,
        transform=transform,
        nodata=NODATA,
    ) as ds:
        ds.write(values)
    return path


def file_source(path: Path, reads: list[Window] | None = None) -> MaskedSource:
    """A masked reader over a file: valid where finite and not NODATA (in every band)."""
    ds = rasterio.open(path)

    def read(window: Window) -> tuple[np.ndarray, np.ndarray]:
        if reads is not None:
            reads.append(window)
        values = ds.read(window=window)
        return values, valid_cells(values)

    grid = GeoBox((ds.height, ds.width), ds.transform, CRS.from_user_input(ds.crs))
    return MaskedSource(grid, read, tuple(f"b{i}" for i in range(ds.count)))


def array_source(
    values: np.ndarray, valid: np.ndarray, crs: CRS | str, transform: Affine
) -> MaskedSource:
    """An in-memory masked source, for property tests that run many times."""

    def read(window: Window) -> tuple[np.ndarray, np.ndarray]:
        rows, cols = window.toslices()
        return values[:, rows, cols], valid[rows, cols]

    grid = GeoBox((values.shape[1], values.shape[2]), transform, CRS.from_user_input(crs))
    return MaskedSource(grid, read, tuple(f"b{i}" for i in range(len(values))))


def tile_features(grid: TileGrid) -> list[dict]:
    return [
        {"type": "Feature", "properties": {}, "geometry": shapely.box(*t.bounds).__geo_interface__}
        for t in grid.tiles()
    ]


def noisy_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Smooth-ish positive values with nodata and NaN cells sprinkled in."""
    values = rng.gamma(2.0, 50.0, size=shape)
    values[:, rng.random(shape[1:]) < 0.1] = NODATA
    values[:, rng.random(shape[1:]) < 0.05] = np.nan
    return values


def valid_cells(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values).all(axis=0) & (values != NODATA).all(axis=0)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    both = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), both)
    return float(np.max(np.abs(actual[both] - expected[both]) / np.abs(expected[both])))


# --- same CRS ------------------------------------------------------------------------------


def test_same_crs_matches_exactextract(tmp_path: Path) -> None:
    """30 m pixels on an odd-15 m origin: 2 km is not a whole number of pixels."""
    rng = np.random.default_rng(1)
    transform = Affine(30, 0, 489_985, 0, -30, 5_409_385)  # top edge inside the grid
    values = noisy_values(rng, (2, 230, 250))  # east and south edges cut through tiles
    path = write_raster(tmp_path / "same.tif", values, f"EPSG:{UTM}", transform)
    grid = small_grid()
    stats = aggregate_tiles(file_source(path), grid)

    for band in range(2):
        single = write_raster(
            tmp_path / f"band{band}.tif", values[band : band + 1], f"EPSG:{UTM}", transform
        )
        ref = exact_extract(str(single), tile_features(grid), ["mean", "sum", "count"])
        count = np.array([f["properties"]["count"] for f in ref])
        ref_sum = np.array([f["properties"]["sum"] for f in ref])
        ref_mean = np.array([f["properties"]["mean"] for f in ref])
        ref_sum[count == 0] = np.nan  # no valid support: a total is missing, not zero
        # exactextract stores coverage fractions in single precision (~3e-8 per cell), which
        # bounds the agreement; the float64 check below is the exact one.
        assert relative_error(stats.mean[band], ref_mean) < 1e-8
        assert relative_error(stats.total[band], ref_sum) < 1e-8
        # The mask is shared by both bands (a cell is invalid when any band is).
        assert np.allclose(stats.valid_fraction, count * 900 / 2000**2, rtol=0, atol=1e-8)

    exact = reference_stats(values, valid_cells(values), f"EPSG:{UTM}", transform, grid)
    assert relative_error(stats.mean, exact["mean"]) < 1e-12
    assert relative_error(stats.total, exact["total"]) < 1e-12
    np.testing.assert_allclose(stats.valid_fraction, exact["valid_fraction"], rtol=0, atol=1e-14)

    raster_box = shapely.box(489_985, 5_409_385 - 230 * 30, 489_985 + 250 * 30, 5_409_385)
    expected_cover = [
        shapely.box(*t.bounds).intersection(raster_box).area / 4e6 for t in grid.tiles()
    ]
    assert np.allclose(stats.covered_fraction, expected_cover, rtol=0, atol=1e-12)
    assert stats.mean.shape == stats.total.shape == (2, grid.n_tiles)


def test_constant_raster_and_half_covered_tile(tmp_path: Path) -> None:
    """A constant gives itself as mean and value × tiles per cell as total, exactly."""
    transform = Affine(25, 0, 489_975, 0, -25, 5_410_025)
    width = round((497_000 - 489_975) / 25)  # east edge halves the last tile column
    values = np.full((1, 250, width), 7.0)
    path = write_raster(tmp_path / "const.tif", values, f"EPSG:{UTM}", transform)
    grid = small_grid()
    stats = aggregate_tiles(file_source(path), grid)

    last_col = np.arange(grid.n_tiles) % grid.n_cols == grid.n_cols - 1
    assert np.all(stats.covered_fraction[last_col] == 0.5)
    assert np.all(stats.covered_fraction[~last_col] == 1.0)
    assert np.array_equal(stats.valid_fraction, stats.covered_fraction)
    np.testing.assert_allclose(stats.mean[0], 7.0, rtol=1e-14)
    full_total = 7.0 * 2000**2 / 25**2
    np.testing.assert_allclose(stats.total[0], np.where(last_col, full_total / 2, full_total))


def test_tiles_outside_the_raster_are_missing_not_zero(tmp_path: Path) -> None:
    transform = Affine(30, 0, 489_985, 0, -30, 5_410_015)
    values = np.zeros((1, 60, 60))  # only the north-west tile is touched; zeros are valid
    path = write_raster(tmp_path / "corner.tif", values, f"EPSG:{UTM}", transform)
    stats = aggregate_tiles(file_source(path), small_grid())
    assert stats.mean[0, 0] == 0.0 and stats.total[0, 0] == 0.0
    assert np.all(np.isnan(stats.mean[0, 1:])) and np.all(np.isnan(stats.total[0, 1:]))
    assert np.all(stats.valid_fraction[1:] == 0) and np.all(stats.covered_fraction[1:] == 0)


def test_non_finite_values_never_leak(tmp_path: Path) -> None:
    """A reader that wrongly marks NaN/inf cells valid still cannot poison a tile."""
    values = np.ones((1, 200, 300))
    values[0, :10, :10] = np.nan
    values[0, 50, 50] = np.inf
    source = array_source(
        values,
        np.ones((200, 300), dtype=bool),
        f"EPSG:{UTM}",
        Affine(30, 0, 490_000, 0, -30, 5_410_000),
    )
    stats = aggregate_tiles(source, small_grid())
    assert np.all(np.isfinite(stats.mean)) and np.all(np.isfinite(stats.total))
    np.testing.assert_allclose(stats.mean, 1.0)
    assert stats.valid_fraction[0] < stats.covered_fraction[0]


def test_block_size_does_not_change_results_and_reads_stay_small(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    transform = Affine(30, 0, 489_985, 0, -30, 5_410_015)
    values = noisy_values(rng, (1, 201, 268))
    path = write_raster(tmp_path / "blocks.tif", values, f"EPSG:{UTM}", transform)
    grid = small_grid()
    whole = aggregate_tiles(file_source(path), grid, tile_rows_per_block=grid.n_rows)
    reads: list[Window] = []
    streamed = aggregate_tiles(file_source(path, reads), grid, tile_rows_per_block=1)
    assert_same_stats(streamed, whole, rtol=1e-13)
    assert len(reads) == grid.n_rows
    assert max(int(w.height) for w in reads) < 201 / 2  # each read is about one tile row
    assert default_tile_rows_per_block(grid) == 5


def test_column_blocks_do_not_change_results_and_reads_stay_narrow(tmp_path: Path) -> None:
    """Blocks of tile rows × tile columns: each read covers its own columns, not the width."""
    rng = np.random.default_rng(8)
    transform = Affine(30, 0, 489_985, 0, -30, 5_410_015)
    values = noisy_values(rng, (2, 205, 540))  # the east edge cuts the last tile column
    path = write_raster(tmp_path / "wide.tif", values, f"EPSG:{UTM}", transform)
    grid = small_grid(n_rows=3, n_cols=8)
    whole = aggregate_tiles(
        file_source(path), grid, tile_rows_per_block=grid.n_rows, tile_cols_per_block=grid.n_cols
    )
    reads: list[Window] = []
    streamed = aggregate_tiles(
        file_source(path, reads), grid, tile_rows_per_block=2, tile_cols_per_block=3
    )
    assert_same_stats(streamed, whole, rtol=1e-12)
    assert len(reads) == 2 * 3
    assert max(int(w.width) for w in reads) <= 3 * 2000 / 30 + 3
    assert sum(int(w.width) for w in reads) < 2 * (540 + 3 * 3)  # columns read once per row block
    assert default_tile_cols_per_block(grid) == 5
    assert default_tile_cols_per_block(small_grid(tile_size=5000)) == 2


def assert_same_stats(a: TileStats, b: TileStats, rtol: float) -> None:
    for name in ("valid_fraction", "covered_fraction", "mean", "total"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    cell=st.sampled_from([7.0, 30.0, 45.5, 100.0, 333.0, 1000.0]),
    x_shift=st.floats(0, 1999),
    y_shift=st.floats(0, 1999),
    width_m=st.floats(500, 7000),
    height_m=st.floats(500, 5000),
    seed=st.integers(0, 2**16),
)
def test_totals_preserved_and_no_cell_counted_twice(
    cell: float, x_shift: float, y_shift: float, width_m: float, height_m: float, seed: int
) -> None:
    """Over a grid that covers the raster, tile totals add up to the raster's valid sum."""
    rng = np.random.default_rng(seed)
    width, height = max(1, int(width_m // cell)), max(1, int(height_m // cell))
    values = rng.normal(10, 5, size=(1, height, width))
    valid = rng.random((height, width)) < 0.8
    values[0, ~valid] = np.nan
    transform = Affine(cell, 0, 490_000 + x_shift, 0, -cell, 5_410_000 - y_shift)
    grid = small_grid(n_rows=4, n_cols=5)  # 10 km × 8 km: covers every raster drawn
    stats = aggregate_tiles(array_source(values, valid, f"EPSG:{UTM}", transform), grid)

    tile_area = float(grid.tile_size) ** 2
    assert np.nansum(stats.total) == pytest.approx(values[0, valid].sum(), rel=1e-9, abs=1e-9)
    assert stats.valid_fraction.sum() * tile_area == pytest.approx(valid.sum() * cell**2)
    assert stats.covered_fraction.sum() * tile_area == pytest.approx(width * height * cell**2)

    # One valid cell of value 1: its shares over all tiles add up to exactly one.
    one_hot = np.zeros((1, height, width))
    row, col = rng.integers(height), rng.integers(width)
    one_hot[0, row, col] = 1.0
    mask = np.zeros((height, width), dtype=bool)
    mask[row, col] = True
    single = aggregate_tiles(array_source(one_hot, mask, f"EPSG:{UTM}", transform), grid)
    assert np.nansum(single.total) == pytest.approx(1.0, abs=1e-12)
    assert np.nansum(single.valid_fraction) * tile_area == pytest.approx(cell**2)


def test_rotated_source_is_refused() -> None:
    source = array_source(
        np.ones((1, 5, 5)),
        np.ones((5, 5), dtype=bool),
        f"EPSG:{UTM}",
        Affine(30, 1, 490_000, 0, -30, 5_410_000),
    )
    with pytest.raises(SourceReadError, match="north-up"):
        aggregate_tiles(source, small_grid())


# --- other CRS -----------------------------------------------------------------------------


def reference_stats(
    values: np.ndarray, valid: np.ndarray, crs: str, transform: Affine, grid: TileGrid
) -> dict[str, np.ndarray]:
    """Independent aggregation: intersect each reprojected source cell with each tile box."""
    to_utm = Transformer.from_crs(crs, grid.crs, always_xy=True)
    height, width = valid.shape
    cell_polys = []
    for row in range(height):
        for col in range(width):
            x0, y1 = transform @ (col, row)
            x1, y0 = transform @ (col + 1, row + 1)
            outline = shapely.segmentize(shapely.box(x0, y0, x1, y1), (x1 - x0) / 40)
            cell_polys.append(shapely.transform(outline, to_utm.transform, interleaved=False))
    cell_polys_arr = np.array(cell_polys)
    cell_areas = shapely.area(cell_polys_arr)
    flat_valid = valid.ravel()
    flat_values = np.where(valid, values, 0.0).reshape(len(values), -1)
    out = {k: [] for k in ("valid_fraction", "covered_fraction", "mean", "total")}
    for tile in grid.tiles():
        box = shapely.box(*tile.bounds)
        inside = shapely.area(shapely.intersection(cell_polys_arr, box))
        valid_area = (inside * flat_valid).sum()
        out["valid_fraction"].append(valid_area / box.area)
        out["covered_fraction"].append(inside.sum() / box.area)
        has = valid_area > 0
        out["mean"].append(
            (flat_values * inside).sum(axis=1) / valid_area if has else np.full(len(values), np.nan)
        )
        out["total"].append(
            (flat_values * inside / cell_areas).sum(axis=1) if has else np.full(len(values), np.nan)
        )
    return {
        "valid_fraction": np.array(out["valid_fraction"]),
        "covered_fraction": np.array(out["covered_fraction"]),
        "mean": np.array(out["mean"]).T,
        "total": np.array(out["total"]).T,
    }


SourceCase = tuple[tuple[np.ndarray, np.ndarray], str, Affine]
"""((values, valid), CRS, transform) of a reprojected test source."""


def lonlat_source_case(rng: np.random.Generator) -> SourceCase:
    """A 1/120° grid over the test tiles, stopping short of the eastern tile column."""
    step = 1 / 120
    to_ll = Transformer.from_crs(f"EPSG:{UTM}", "EPSG:4326", always_xy=True)
    lon_min, lat_min, lon_max, lat_max = to_ll.transform_bounds(
        490_000, 5_404_000, 498_000, 5_410_000
    )
    left = np.floor(lon_min / step) * step - step
    top = np.ceil(lat_max / step) * step + step
    width = int(np.ceil((lon_max - left) / step)) - 2  # east edge cuts the last column
    height = int(np.ceil((top - lat_min) / step)) + 1
    return source_values(rng, height, width), "EPSG:4326", Affine(step, 0, left, 0, -step, top)


def mollweide_source_case(rng: np.random.Generator) -> SourceCase:
    """A 1 km Mollweide grid over the test tiles, stopping short of the southern tile row."""
    crs = "ESRI:54009"
    to_moll = Transformer.from_crs(f"EPSG:{UTM}", crs, always_xy=True)
    x_min, y_min, x_max, y_max = to_moll.transform_bounds(490_000, 5_404_000, 498_000, 5_410_000)
    left, top = np.floor(x_min / 1000) * 1000 - 1000, np.ceil(y_max / 1000) * 1000 + 1000
    width = int(np.ceil((x_max - left) / 1000)) + 1
    height = int(np.ceil((top - y_min) / 1000)) - 1  # south edge cuts the last row
    return source_values(rng, height, width), crs, Affine(1000, 0, left, 0, -1000, top)


def source_values(
    rng: np.random.Generator, height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    values = rng.gamma(2.0, 50.0, size=(2, height, width))
    valid = rng.random((height, width)) > 0.15
    values[:, ~valid] = np.nan  # invalid values are garbage; they must not leak
    return values, valid


@pytest.mark.parametrize("case", [lonlat_source_case, mollweide_source_case])
def test_reprojected_matches_independent_intersections(
    case: Callable[[np.random.Generator], SourceCase], tmp_path: Path
) -> None:
    (values, valid), crs, transform = case(np.random.default_rng(3))
    grid = small_grid()
    stats = aggregate_tiles(array_source(values, valid, crs, transform), grid, cache_dir=tmp_path)
    ref = reference_stats(values, valid, crs, transform, grid)

    assert relative_error(stats.mean, ref["mean"]) < 1e-6
    assert relative_error(stats.total, ref["total"]) < 1e-6
    np.testing.assert_allclose(stats.valid_fraction, ref["valid_fraction"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(stats.covered_fraction, ref["covered_fraction"], rtol=0, atol=1e-6)
    partial = ref["covered_fraction"] < 0.999
    assert partial.any() and (ref["covered_fraction"][~partial] > 1 - 1e-9).all()


def _count_exactextract_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each exactextract call (one per block computed)."""
    calls: list[int] = []
    real = aggregate.exact_extract

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aggregate, "exact_extract", spy)
    return calls


def test_coverage_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_exactextract_calls(monkeypatch)
    (values, valid), crs, transform = mollweide_source_case(np.random.default_rng(4))
    grid = small_grid()
    first = aggregate_tiles(array_source(values, valid, crs, transform), grid, cache_dir=tmp_path)
    n_blocks = len(calls)
    assert n_blocks >= 1 and list(tmp_path.rglob("*.npz"))

    # Another "year" on the same source grid: weights come from the cache.
    later = array_source(values * 2, valid, crs, transform)
    second = aggregate_tiles(later, grid, cache_dir=tmp_path)
    assert len(calls) == n_blocks
    np.testing.assert_allclose(second.mean, 2 * first.mean, rtol=1e-14)
    np.testing.assert_array_equal(second.valid_fraction, first.valid_fraction)

    # No cache directory: weights are recomputed.
    aggregate_tiles(later, grid)
    assert len(calls) == 2 * n_blocks


def test_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    (values, valid), crs, transform = mollweide_source_case(np.random.default_rng(6))
    source = array_source(values, valid, crs, transform)
    first = aggregate_tiles(source, small_grid(), cache_dir=tmp_path)
    for path in tmp_path.rglob("*.npz"):
        path.write_bytes(b"truncated")
    again = aggregate_tiles(source, small_grid(), cache_dir=tmp_path)
    assert_same_stats(again, first, rtol=0)
    assert all(path.stat().st_size > 100 for path in tmp_path.rglob("*.npz"))
    assert len(list(tmp_path.iterdir())) == 1  # the rewritten file, no temporary left


def test_a_damaged_block_is_recomputed_and_the_others_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file holds every block: a block that cannot be read is computed again and written
    with the ones that could, into a whole new file."""
    (values, valid), crs, transform = mollweide_source_case(np.random.default_rng(7))
    source = array_source(values, valid, crs, transform)
    grid = small_grid()
    shape = {"tile_rows_per_block": 2, "tile_cols_per_block": 3}
    first = aggregate_tiles(source, grid, cache_dir=tmp_path, **shape)
    (path,) = tmp_path.glob("*.npz")
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    damaged = sorted(name for name in members if name.endswith("floats.npy"))[1]
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data[:40] if name == damaged else data)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    killed_write = path.with_name(f".{path.name}.tmp-{dead}-{'0' * 32}")
    killed_write.write_bytes(b"half a file")  # a write of this cache killed midway
    calls = _count_exactextract_calls(monkeypatch)
    again = aggregate_tiles(source, grid, cache_dir=tmp_path, **shape)
    assert_same_stats(again, first, rtol=0)
    assert len(calls) == 1
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == sorted(members)
    aggregate_tiles(source, grid, cache_dir=tmp_path, **shape)
    assert len(calls) == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_reprojected_block_size_does_not_change_results(tmp_path: Path) -> None:
    (values, valid), crs, transform = lonlat_source_case(np.random.default_rng(5))
    source = array_source(values, valid, crs, transform)
    grid = small_grid()
    whole = aggregate_tiles(source, grid, tile_rows_per_block=grid.n_rows)
    streamed = aggregate_tiles(source, grid, tile_rows_per_block=1, cache_dir=tmp_path)
    assert_same_stats(streamed, whole, rtol=1e-10)
    (cached,) = tmp_path.rglob("*.npz")  # one file, two arrays per block
    with zipfile.ZipFile(cached) as archive:
        assert len(archive.namelist()) == 2 * grid.n_rows


def test_reprojected_column_blocks_do_not_change_results(tmp_path: Path) -> None:
    (values, valid), crs, transform = mollweide_source_case(np.random.default_rng(9))
    source = array_source(values, valid, crs, transform)
    grid = small_grid()
    whole = aggregate_tiles(
        source, grid, tile_rows_per_block=grid.n_rows, tile_cols_per_block=grid.n_cols
    )
    streamed = aggregate_tiles(
        source, grid, tile_rows_per_block=2, tile_cols_per_block=3, cache_dir=tmp_path
    )
    assert_same_stats(streamed, whole, rtol=1e-12)
    (cached_file,) = tmp_path.rglob("*.npz")
    with zipfile.ZipFile(cached_file) as archive:
        assert len(archive.namelist()) == 2 * 2 * 2  # two arrays for each of the 2 × 2 blocks
    cached = aggregate_tiles(
        source, grid, tile_rows_per_block=2, tile_cols_per_block=3, cache_dir=tmp_path
    )
    assert_same_stats(cached, streamed, rtol=0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shift_x=st.floats(0, 999), shift_y=st.floats(0, 999), seed=st.integers(0, 2**16))
def test_reprojected_totals_preserved(shift_x: float, shift_y: float, seed: int) -> None:
    """A Mollweide raster well inside the grid: every cell's area is shared out exactly once."""
    to_moll = Transformer.from_crs(f"EPSG:{UTM}", "ESRI:54009", always_xy=True)
    cx, cy = to_moll.transform(494_000, 5_407_000)
    transform = Affine(1000, 0, cx - 2000 + shift_x, 0, -1000, cy + 1500 - shift_y)
    rng = np.random.default_rng(seed)
    values = rng.normal(10, 3, size=(1, 3, 4))
    valid = rng.random((3, 4)) < 0.7
    stats = aggregate_tiles(array_source(values, valid, "ESRI:54009", transform), small_grid())
    # exactextract's single-precision coverage fractions bound this at ~1e-8.
    assert np.nansum(stats.total) == pytest.approx(values[0, valid].sum(), rel=1e-7)
