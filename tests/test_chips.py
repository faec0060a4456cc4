"""Chips: warping onto the city pixel grid, the 50 % validity rule, the atomic Zarr store and
block-by-block processing of a whole city."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import dask.array
import geopandas as gpd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import rasterio
import shapely
import xarray as xr
import zarr
from affine import Affine
from pyproj import CRS, Transformer
from rasterio.warp import Resampling, reproject
from rasterio.windows import Window

import citycube.items.rasters
import citycube.processing.chips
import citycube.processing.rules.shared
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.chips import open_chips, read_tile_chip
from citycube.cube.chips_zarr import ChipStoreWriter
from citycube.cube.release import Release
from citycube.errors import CubeWriteError
from citycube.grid.tiles import PixelGrid, Tile, city_grid, city_grids, pixel_grid
from citycube.items.rasters import MaskedSource, raster_grid
from citycube.processing.chips import (
    blocks,
    row_bands,
    tile_pixel_summaries,
    warp_block,
    warp_rows,
)
from citycube.processing.compute import process_partition
from tests.conftest import LocalFilesBackend, write_tif

EPSG = 32631
X_MIN, Y_MAX = 600_000.0, 5_820_000.0  # both on the 10 km lattice


def small_grid(resolution: float = 50.0, width: int = 120, height: int = 80) -> PixelGrid:
    """A city-like pixel grid with a lattice-aligned north-west corner."""
    return PixelGrid("Testville", EPSG, X_MIN, Y_MAX, resolution, width, height)


def grid_tile(grid: PixelGrid, row: int, col: int, size_m: int = 2000) -> Tile:
    """A tile of a tile grid that shares the pixel grid's north-west corner."""
    x0, y1 = grid.x_min + col * size_m, grid.y_max - row * size_m
    return Tile(grid.city, "2km", row, col, (x0, y1 - size_m, x0 + size_m, y1))


def write_raster(
    path: Path, values: np.ndarray, crs: str, transform: Affine, nodata: float | None
) -> Path:
    """Write bands[b, h, w] as a GeoTIFF, the way a source asset would."""
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=values.shape[2],
        height=values.shape[1],
        count=values.shape[0],
        dtype=values.dtype,
        crs=crs,
        transform=transform,
        nodata=nodata,
    ) as ds:
        ds.write(values)
    return path


def masked_source(
    path: Path, nodata: float | None, windows: list[Window] | None = None
) -> MaskedSource:
    """A source whose reader applies the nodata and finite rules (and records its windows)."""
    with rasterio.open(path) as ds:
        names = tuple(f"b{i}" for i in range(1, ds.count + 1))

    def read(window: Window) -> tuple[np.ndarray, np.ndarray]:
        if windows is not None:
            windows.append(window)
        with rasterio.open(path) as ds:
            values = ds.read(window=window)
        valid = np.all(np.isfinite(values), axis=0)
        if nodata is not None:
            valid &= np.all(values != nodata, axis=0)
        return values, valid

    return MaskedSource(raster_grid(path), read, names)


def utm_transform(resolution: float, x0: float = X_MIN, y0: float = Y_MAX) -> Affine:
    return Affine(resolution, 0, x0, 0, -resolution, y0)


def overlap_matrix(dst_res: float, n_dst: int, src_res: float, n_src: int) -> np.ndarray:
    """1-D overlap fractions [dst, src] of cells starting at the same origin (exact areas)."""
    d0 = np.arange(n_dst)[:, None] * dst_res
    s0 = np.arange(n_src)[None, :] * src_res
    overlap = np.clip(np.minimum(d0 + dst_res, s0 + src_res) - np.maximum(d0, s0), 0, None)
    return overlap / dst_res


def write_store(
    path: Path,
    grid: PixelGrid,
    values: np.ndarray,
    valid: np.ndarray,
    bands: Sequence[tuple[int, int]] | None = None,
    dtype: type = np.uint8,
    fill: int = 0,
) -> None:
    with ChipStoreWriter(
        path,
        grid,
        [f"b{i}" for i in range(values.shape[0])],
        dtype,
        fill,
        {"synthetic": True, "modality": "OPT"},
    ) as writer:
        for start, stop in bands or [(0, grid.height)]:
            writer.write_rows(start, values[:, start:stop], valid[start:stop])


# --------------------------------------------------------------------------------------------
# Row bands


def test_row_bands_cover_the_grid_on_the_lattice() -> None:
    grid = small_grid(resolution=100.0, width=150, height=250)
    bands = row_bands(grid)
    assert bands == [(0, 100), (100, 200), (200, 250)]
    for start, _ in bands:
        assert (grid.y_max - start * grid.resolution) % 10_000 == 0


def test_row_bands_start_short_when_the_north_edge_is_off_the_lattice() -> None:
    grid = PixelGrid("Testville", EPSG, X_MIN, Y_MAX - 4_000, 100.0, 10, 250)
    assert row_bands(grid) == [(0, 60), (60, 160), (160, 250)]


def test_every_city_tile_lies_in_exactly_one_band() -> None:
    grid = pixel_grid("Amsterdam", 25)
    bands = row_bands(grid)
    edges = [b[0] for b in bands] + [bands[-1][1]]
    assert edges[0] == 0 and edges[-1] == grid.height
    assert all(lo < hi for lo, hi in bands) and np.all(np.diff(edges) > 0)
    for tile_grid in city_grids("Amsterdam").values():
        for tile in tile_grid.tiles():
            row_off, _, height, _ = grid.window(tile)
            holders = [b for b in bands if b[0] <= row_off and row_off + height <= b[1]]
            assert len(holders) == 1, tile.tile_id


def test_blocks_tile_the_grid_on_the_lattice_in_both_directions() -> None:
    grid = small_grid(resolution=100.0, width=150, height=250)
    assert blocks(grid) == [
        (0, 100, 0, 100),
        (0, 100, 100, 150),
        (100, 200, 0, 100),
        (100, 200, 100, 150),
        (200, 250, 0, 100),
        (200, 250, 100, 150),
    ]
    assert sorted({(r0, r1) for r0, r1, _, _ in blocks(grid)}) == row_bands(grid)


def test_blocks_start_narrow_when_the_west_or_north_edge_is_off_the_lattice() -> None:
    grid = PixelGrid("Testville", EPSG, X_MIN + 3_000, Y_MAX - 4_000, 100.0, 250, 130)
    cuts = blocks(grid)
    assert sorted({(r0, r1) for r0, r1, _, _ in cuts}) == [(0, 60), (60, 130)]
    assert sorted({(c0, c1) for _, _, c0, c1 in cuts}) == [(0, 70), (70, 170), (170, 250)]
    for r0, _, c0, _ in cuts:
        assert (grid.y_max - r0 * grid.resolution) % 10_000 == 0 or r0 == 0
        assert (grid.x_min + c0 * grid.resolution) % 10_000 == 0 or c0 == 0


@pytest.mark.parametrize("city", ["Amsterdam", "Christchurch"])
def test_every_city_tile_lies_in_exactly_one_block(city: str) -> None:
    grid = pixel_grid(city, 25)
    cuts = blocks(grid)
    pixels = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in cuts)
    assert pixels == grid.height * grid.width
    assert max(max(r1 - r0, c1 - c0) for r0, r1, c0, c1 in cuts) == 400  # 10 km at 25 m
    for tile_grid in city_grids(city).values():
        for tile in tile_grid.tiles():
            row_off, col_off, height, width = grid.window(tile)
            holders = [
                b
                for b in cuts
                if b[0] <= row_off
                and row_off + height <= b[1]
                and b[2] <= col_off
                and col_off + width <= b[3]
            ]
            assert len(holders) == 1, tile.tile_id


# --------------------------------------------------------------------------------------------
# Zarr store


def test_store_round_trip_keeps_georeferencing_values_and_mask(tmp_path: Path) -> None:
    grid = small_grid()
    rng = np.random.default_rng(1)
    values = rng.integers(0, 256, (3, grid.height, grid.width)).astype(np.uint8)
    valid = rng.random(grid.shape) > 0.2
    write_store(tmp_path / "opt.zarr", grid, values, valid)

    chips = xr.open_zarr(tmp_path / "opt.zarr", decode_coords="all")
    assert chips.rio.crs == CRS.from_epsg(EPSG)
    assert chips["data"].rio.crs == CRS.from_epsg(EPSG)
    assert chips.rio.transform().almost_equals(grid.transform)
    assert chips.rio.bounds() == (X_MIN, Y_MAX - 80 * 50, X_MIN + 120 * 50, Y_MAX)
    assert chips.attrs["synthetic"] is True and chips.attrs["modality"] == "OPT"

    opened = open_chips(tmp_path / "opt.zarr")
    # Lazy but not dask-backed: inside a dask worker a dask read would go back to the cluster.
    assert opened["data"].chunks is None and not opened["data"]._in_memory
    assert opened["data"].dtype == np.uint8
    assert list(opened["band"].values) == ["b0", "b1", "b2"]
    np.testing.assert_array_equal(opened["valid"].values, valid)
    np.testing.assert_array_equal(opened["data"].values, np.where(valid, values, 0))
    np.testing.assert_allclose(opened["x"].values, grid.x_coords())
    np.testing.assert_allclose(opened["y"].values, grid.y_coords())

    tile = grid_tile(grid, row=1, col=2)
    chip = read_tile_chip(tmp_path / "opt.zarr", grid, tile)
    np.testing.assert_array_equal(chip["data"].values, np.where(valid, values, 0)[:, 40:80, 80:120])
    np.testing.assert_array_equal(chip["valid"].values, valid[40:80, 80:120])
    assert chip.rio.transform().almost_equals(Affine(50, 0, tile.bounds[0], 0, -50, tile.bounds[3]))


def test_store_chunks_follow_the_10km_lattice(tmp_path: Path) -> None:
    grid = small_grid(resolution=100.0, width=150, height=250)
    values = np.ones((3, grid.height, grid.width), dtype=np.uint8)
    write_store(tmp_path / "c.zarr", grid, values, np.ones(grid.shape, bool))
    group = zarr.open_group(tmp_path / "c.zarr", mode="r")
    assert group.metadata.zarr_format == 3
    assert group["data"].chunks == (3, 100, 100)
    assert group["valid"].chunks == (100, 100)
    assert group["data"].compressors  # compressed


def test_failed_write_leaves_the_committed_store_and_no_temp_dirs(tmp_path: Path) -> None:
    grid = small_grid()
    first = np.full((3, grid.height, grid.width), 7, dtype=np.uint8)
    everywhere = np.ones(grid.shape, dtype=bool)
    write_store(tmp_path / "opt.zarr", grid, first, everywhere)

    rgb = ["b0", "b1", "b2"]
    with (
        pytest.raises(RuntimeError, match="source exploded"),
        ChipStoreWriter(tmp_path / "opt.zarr", grid, rgb, np.uint8, 0, {}) as writer,
    ):
        writer.write_rows(0, first[:, :40] + 1, everywhere[:40])
        raise RuntimeError("source exploded")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt.zarr"]
    np.testing.assert_array_equal(open_chips(tmp_path / "opt.zarr")["data"].values, first)

    with (
        pytest.raises(CubeWriteError, match="never written"),
        ChipStoreWriter(tmp_path / "opt.zarr", grid, rgb, np.uint8, 0, {}) as writer,
    ):
        writer.write_rows(0, first[:, :40] + 1, everywhere[:40])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt.zarr"]
    np.testing.assert_array_equal(open_chips(tmp_path / "opt.zarr")["data"].values, first)

    write_store(tmp_path / "opt.zarr", grid, first + 1, everywhere)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt.zarr"]
    np.testing.assert_array_equal(open_chips(tmp_path / "opt.zarr")["data"].values, first + 1)


def test_store_is_written_block_by_block_and_refuses_a_missing_block(tmp_path: Path) -> None:
    grid = small_grid(resolution=100.0, width=150, height=250)
    rng = np.random.default_rng(5)
    values = rng.integers(0, 256, (2, grid.height, grid.width)).astype(np.uint8)
    valid = rng.random(grid.shape) > 0.3
    cuts = blocks(grid)

    def write(path: Path, skip: tuple[int, int, int, int] | None = None) -> None:
        with ChipStoreWriter(path, grid, ["b0", "b1"], np.uint8, 0, {}) as writer:
            for r0, r1, c0, c1 in cuts:
                if (r0, r1, c0, c1) != skip:
                    writer.write_block(r0, c0, values[:, r0:r1, c0:c1], valid[r0:r1, c0:c1])

    write(tmp_path / "full.zarr")
    chips = open_chips(tmp_path / "full.zarr")
    np.testing.assert_array_equal(chips["valid"].values, valid)
    np.testing.assert_array_equal(chips["data"].values, np.where(valid, values, 0))
    # Each block is exactly one chunk of the store.
    assert zarr.open_group(tmp_path / "full.zarr", mode="r")["data"].chunks == (2, 100, 100)

    with pytest.raises(
        CubeWriteError, match=r"2500 pixels were never written \(first at row 200, col 100\)"
    ):
        write(tmp_path / "gap.zarr", skip=(200, 250, 100, 150))
    assert not (tmp_path / "gap.zarr").exists()
    with (
        pytest.raises(ValueError, match="outside"),
        ChipStoreWriter(tmp_path / "bad.zarr", grid, ["b0", "b1"], np.uint8, 0, {}) as writer,
    ):
        writer.write_block(200, 100, values[:, :100, :100], valid[:100, :100])


@pytest.mark.parametrize(("dtype", "fill"), [(np.uint8, 0), (np.float32, math.nan)])
def test_block_writes_store_the_chunk_files_zarr_itself_writes(
    tmp_path: Path, dtype: type, fill: float
) -> None:
    """Whole-chunk blocks skip zarr's write path; the files must be the ones zarr writes."""
    grid = small_grid(resolution=100.0, width=150, height=250)  # edge chunks are partial
    rng = np.random.default_rng(11)
    values = rng.integers(0, 200, (2, grid.height, grid.width)).astype(dtype)
    valid = rng.random(grid.shape) > 0.3
    valid[:100, 100:] = False  # a block of nothing but fill: no chunk file at all
    values[:, 100:200, :100] = 0  # a block whose valid values all equal the uint8 fill
    valid[100:200, :100] = True

    def files(path: Path) -> dict[str, bytes]:
        return {
            str(f.relative_to(path)): f.read_bytes()
            for f in sorted(path.rglob("*"))
            if f.is_file() and f.name != "zarr.json" and not f.name.startswith(".")
        }

    def write(path: Path, by_blocks: bool) -> dict[str, bytes]:
        with ChipStoreWriter(path, grid, ["b0", "b1"], dtype, fill, {}) as writer:
            if by_blocks:
                for r0, r1, c0, c1 in blocks(grid):
                    writer.write_block(r0, c0, values[:, r0:r1, c0:c1], valid[r0:r1, c0:c1])
            else:  # bands that cut chunks: zarr merges and encodes them itself
                for start in range(0, grid.height, 37):
                    stop = min(start + 37, grid.height)
                    writer.write_rows(start, values[:, start:stop], valid[start:stop])
        return files(path)

    by_blocks = write(tmp_path / "blocks.zarr", by_blocks=True)
    assert by_blocks == write(tmp_path / "zarr.zarr", by_blocks=False)
    assert "data/c/0/0/1" not in by_blocks and "valid/c/0/1" not in by_blocks
    assert ("data/c/0/1/0" in by_blocks) == (dtype is np.float32)
    chips = open_chips(tmp_path / "blocks.zarr")
    np.testing.assert_array_equal(chips["valid"].values, valid)
    np.testing.assert_array_equal(chips["data"].values, np.where(valid, values, fill))


def _xarray_template(writer: ChipStoreWriter, path: Path) -> None:
    """The template as xarray writes the equivalent dataset: the layout readers rely on."""
    grid, n_bands, chunk = writer.pixel_grid, len(writer.band_names), writer.chunk_px
    data = dask.array.full(
        (n_bands, grid.height, grid.width),
        writer.fill_value,
        dtype=writer.dtype,
        chunks=(n_bands, chunk, chunk),
    )
    valid = dask.array.zeros((grid.height, grid.width), dtype=np.uint8, chunks=(chunk, chunk))
    template = xr.Dataset(
        {"data": (("band", "y", "x"), data), "valid": (("y", "x"), valid)},
        coords={
            "band": ("band", np.array(writer.band_names, dtype=object)),
            "y": ("y", grid.y_coords()),
            "x": ("x", grid.x_coords()),
        },
        attrs=writer._store_attrs(),
    )
    template["data"].attrs["nodata"] = writer.fill_value
    template["data"].attrs["long_name"] = list(writer.band_names)
    template["valid"].attrs["description"] = (
        "1 where at least half of the pixel's source support is valid, else 0"
    )
    template = template.rio.write_crs(grid.crs).rio.write_transform(grid.transform)
    for name in ("data", "valid"):
        template[name].attrs["grid_mapping"] = "spatial_ref"
    compressor = zarr.codecs.ZstdCodec(level=3)
    template.to_zarr(
        path,
        mode="w-",
        compute=False,
        zarr_format=3,
        consolidated=True,
        encoding={
            "data": {
                "chunks": (n_bands, chunk, chunk),
                "compressors": (compressor,),
                "fill_value": writer.fill_value,
            },
            "valid": {"chunks": (chunk, chunk), "compressors": (compressor,), "fill_value": 0},
        },
    )


@pytest.mark.parametrize(
    ("dtype", "fill", "bands"),
    [
        (np.uint8, 255, ["dominant_class"]),
        (np.uint8, 0, ["red", "green", "blue"]),
        (np.float32, math.nan, ["height_m"]),
        (np.float64, -9999.0, ["a", "b"]),
        (np.int16, -1, ["a"]),
    ],
)
def test_the_template_is_the_one_xarray_writes(
    tmp_path: Path, dtype: type, fill: float, bands: list[str]
) -> None:
    grid = pixel_grid(CITY, 250)
    attrs = {"modality": "X", "source_year": np.int64(2020), "scale": np.float32(1.5)}
    writer = ChipStoreWriter(tmp_path / "new.zarr", grid, bands, dtype, fill, attrs)
    writer._tmp_path = tmp_path / "new"
    writer._write_template()
    _xarray_template(writer, tmp_path / "xarray")

    def files(root: Path) -> dict[str, bytes]:
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}

    assert files(tmp_path / "new") == files(tmp_path / "xarray")


def test_float_values_are_rounded_into_an_integer_store(tmp_path: Path) -> None:
    grid = small_grid()
    values = np.full((1, grid.height, grid.width), 254.6, dtype=np.float32)
    valid = np.ones(grid.shape, dtype=bool)
    valid[0, 0] = False
    with ChipStoreWriter(tmp_path / "s.zarr", grid, ["grey"], np.uint8, 0, {}) as writer:
        writer.write_rows(0, values, valid)
    data = open_chips(tmp_path / "s.zarr")["data"].values
    assert data[0, 0, 0] == 0 and data[0, 1, 1] == 255


def test_ids_that_do_not_fit_the_store_type_are_refused(tmp_path: Path) -> None:
    grid = small_grid()
    ids = np.full((1, grid.height, grid.width), 300, dtype=np.int32)
    with (
        pytest.raises(CubeWriteError, match="do not fit"),
        ChipStoreWriter(tmp_path / "lc.zarr", grid, ["class"], np.uint8, 255, {}) as writer,
    ):
        writer.write_rows(0, ids, np.ones(grid.shape, dtype=bool))
    assert not (tmp_path / "lc.zarr").exists()


# --------------------------------------------------------------------------------------------
# Warping


@pytest.mark.parametrize("source_crs", ["EPSG:4326", "EPSG:32631"])
def test_coordinate_image_lands_on_the_destination_pixel_centres(
    tmp_path: Path, source_crs: str
) -> None:
    """An image whose values are its own pixel-centre coordinates must warp onto ours."""
    grid = small_grid()
    if source_crs == "EPSG:4326":
        to_lonlat = Transformer.from_crs(f"EPSG:{EPSG}", "EPSG:4326", always_xy=True)
        lon0, lat1 = to_lonlat.transform(X_MIN - 500, Y_MAX + 500)
        step = 0.0005  # ~34 m east-west, ~55 m north-south at 52 °N
        width, height = 260, 120
        transform = Affine(step, 0, lon0, 0, -step, lat1)
        tolerance = step / 4
    else:
        to_lonlat = None
        step, width, height = 30.0, 220, 150
        transform = utm_transform(step, X_MIN - 300, Y_MAX + 300)
        tolerance = step / 4
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    xs, ys = transform.c + cols * transform.a, transform.f + rows * transform.e
    values = np.stack([xs, ys]).astype(np.float64)
    path = write_raster(tmp_path / "xy.tif", values, source_crs, transform, nodata=None)

    out, valid = warp_rows(masked_source(path, None), grid, 0, grid.height, categorical=False)

    assert out.dtype == np.float64 and valid.all()
    dst_x, dst_y = np.meshgrid(grid.x_coords(), grid.y_coords())
    if to_lonlat is not None:
        dst_x, dst_y = to_lonlat.transform(dst_x, dst_y)
    assert np.abs(out[0] - dst_x).max() < tolerance
    assert np.abs(out[1] - dst_y).max() < tolerance


def test_average_is_area_weighted_over_valid_support_with_the_50_percent_rule(
    tmp_path: Path,
) -> None:
    """10 m cells onto 25 m pixels: partial overlaps weigh by area, invalid cells drop out."""
    grid = small_grid(resolution=25.0, width=40, height=40)
    rng = np.random.default_rng(7)
    n = 100
    values = rng.uniform(-5, 40, (1, n, n)).astype(np.float32)  # negatives stay valid
    row_ok, col_ok = rng.random(n) > 0.35, rng.random(n) > 0.35
    support = row_ok[:, None] & col_ok[None, :]
    values[0, ~support] = -9999
    path = write_raster(
        tmp_path / "dem.tif", values, f"EPSG:{EPSG}", utm_transform(10.0), nodata=-9999
    )

    out, valid = warp_rows(masked_source(path, -9999), grid, 0, 40, categorical=False)

    weights_r, weights_c = overlap_matrix(25, 40, 10, n), overlap_matrix(25, 40, 10, n)
    fraction = weights_r @ support @ weights_c.T
    expected_valid = fraction >= 0.5
    assert 0 < expected_valid.sum() < expected_valid.size
    assert not np.any(np.isclose(fraction, 0.5))  # no ties here; see the exact-half test
    np.testing.assert_array_equal(valid, expected_valid)
    weighted = weights_r @ np.where(support, values[0], 0) @ weights_c.T
    mean = weighted[valid] / fraction[valid]
    np.testing.assert_allclose(out[0][valid], mean, rtol=1e-4)
    assert np.isnan(out[0][~valid]).all()


@pytest.mark.parametrize("categorical", [False, True])
def test_a_pixel_is_valid_when_at_least_half_of_its_support_is(
    tmp_path: Path, categorical: bool
) -> None:
    """2×2 source cells per pixel with 0–4 valid: 0 and 1 of 4 invalid; 2, 3, 4 of 4 valid."""
    grid = small_grid(resolution=20.0, width=5, height=1)
    cells = np.full((1, 2, 10), 4, dtype=np.uint8)
    nodata = 255
    # Pixel p holds p valid cells out of its 4 (cells are valid in row-major order).
    valid_cells = np.zeros((2, 10), dtype=bool)
    for p in range(5):
        block = np.zeros(4, dtype=bool)
        block[:p] = True
        valid_cells[:, 2 * p : 2 * p + 2] = block.reshape(2, 2)
    cells[0, ~valid_cells] = nodata
    path = write_raster(
        tmp_path / "half.tif", cells, f"EPSG:{EPSG}", utm_transform(10.0), nodata=nodata
    )

    out, valid = warp_rows(masked_source(path, nodata), grid, 0, 1, categorical=categorical)

    assert valid[0].tolist() == [False, False, True, True, True]
    assert out[0, 0, 2:].tolist() == [4, 4, 4]


@pytest.mark.parametrize(("source_crs", "dtype"), [("EPSG:4326", np.float32), (None, np.uint8)])
def test_partly_valid_blocks_warp_as_values_and_fraction_apart(
    tmp_path: Path, source_crs: str | None, dtype: type
) -> None:
    """Values and valid fraction share one warp; the result is that of two separate warps."""
    rng = np.random.default_rng(9)
    grid = small_grid(resolution=25.0, width=120, height=100)
    if source_crs is None:
        crs, transform = f"EPSG:{EPSG}", utm_transform(30.0, X_MIN - 415, Y_MAX + 415)
    else:
        lon, lat = Transformer.from_crs(EPSG, 4326, always_xy=True).transform(X_MIN, Y_MAX)
        crs, transform = source_crs, Affine(0.0003, 0, lon - 0.01, 0, -0.0002, lat + 0.01)
    values = rng.integers(1, 250, (2, 140, 160)).astype(dtype)
    values[:, rng.random((140, 160)) < 0.35] = 0  # scattered invalid cells: many 50 % pixels
    path = write_raster(tmp_path / "src.tif", values, crs, transform, nodata=0)
    source = masked_source(path, 0)

    out, valid = warp_block(source, grid, 0, 100, 0, 120, categorical=False)

    # The reference: the same source window, then the fraction and the values warped apart.
    dst_crs = rasterio.crs.CRS.from_epsg(EPSG)
    window = citycube.processing.chips._source_window(source, grid.transform, 120, 100, grid.crs)
    clipped = citycube.processing.chips._clip_window(window, 160, 140)
    raw, cell_valid = citycube.processing.chips._pad_to_window(
        *source.read(clipped), clipped, window
    )
    geometry = {
        "src_transform": transform @ Affine.translation(window.col_off, window.row_off),
        "src_crs": crs,
        "dst_transform": grid.transform,
        "dst_crs": dst_crs,
    }
    fraction = np.zeros((100, 120), np.float32)
    reproject(cell_valid.astype(np.float32), fraction, resampling=Resampling.average, **geometry)
    floats = raw.astype(np.float32)
    floats[:, ~cell_valid] = np.nan
    expected = np.full((2, 100, 120), np.nan, np.float32)
    reproject(
        floats,
        expected,
        src_nodata=np.nan,
        dst_nodata=np.nan,
        resampling=Resampling.average,
        **geometry,
    )
    expected_valid = (fraction >= 0.5 - 1e-6) & np.isfinite(expected).all(axis=0)
    expected[:, ~expected_valid] = np.nan
    assert 0.2 < valid.mean() < 0.95
    np.testing.assert_array_equal(valid, expected_valid)
    np.testing.assert_array_equal(out, expected)


def _gdal_average_with_support(
    values: np.ndarray, valid: np.ndarray, geometry: dict, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: GDAL's own warp of the values (bands judged apart) and of the fraction."""
    floats = values.astype(np.float64)
    floats[:, ~valid] = np.nan
    out = np.full((len(values), *shape), np.nan)
    reproject(
        floats,
        out,
        src_nodata=np.nan,
        dst_nodata=np.nan,
        resampling=Resampling.average,
        UNIFIED_SRC_NODATA="NO",
        **geometry,
    )
    fraction = np.zeros(shape, np.float64)
    reproject(valid.astype(np.float64), fraction, resampling=Resampling.average, **geometry)
    return out, fraction >= 0.5 - 1e-6


@pytest.mark.parametrize(
    ("src_res", "dst_res", "offset"),
    [(30.0, 25.0, 415.0), (10.0, 25.0, 3.0), (25.0, 25.0, 7.5), (250.0, 25.0, 60.0), (20, 100, 0)],
)
def test_same_crs_north_up_warps_are_gdals_area_weighted_average(
    src_res: float, dst_res: float, offset: float
) -> None:
    """The separable warp used when source and block share a CRS gives GDAL's pixels."""
    rng = np.random.default_rng(int(src_res * 7 + dst_res))
    n_src = int(60 * 25 / src_res) + 8
    values = rng.uniform(-50, 300, (3, n_src, n_src))
    valid = rng.random((n_src, n_src)) > 0.3
    valid[: n_src // 3, : n_src // 3] = False  # a whole region without support
    values[1, rng.random((n_src, n_src)) < 0.1] = np.nan  # one band's own gaps
    crs = rasterio.crs.CRS.from_epsg(EPSG)
    geometry = {
        "src_transform": utm_transform(src_res, X_MIN - offset, Y_MAX + offset),
        "src_crs": crs,
        "dst_transform": utm_transform(dst_res),
        "dst_crs": crs,
    }
    height = width = int(55 * 25 / dst_res)

    out, supported = citycube.processing.chips._average_with_support(
        values, valid, height, width, geometry
    )
    expected, expected_supported = _gdal_average_with_support(
        values, valid, geometry, (height, width)
    )

    assert (
        citycube.processing.chips._axis_aligned_weights(geometry, valid.shape, height, width)
        is not None
    )
    assert 0.1 < supported.mean() < 0.95
    np.testing.assert_array_equal(supported, expected_supported)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_allclose(out, expected, rtol=1e-7, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_same_crs_warps_of_wholly_valid_bands_are_gdals_too(dtype: type) -> None:
    """Bands without a gap are warped as they are (no zero-filled copy): same pixels as GDAL."""
    rng = np.random.default_rng(11)
    n_src = 70
    values = rng.integers(1, 255, (3, n_src, n_src)).astype(dtype)
    valid = np.ones((n_src, n_src), dtype=bool)
    crs = rasterio.crs.CRS.from_epsg(EPSG)
    geometry = {
        "src_transform": utm_transform(30.0, X_MIN - 415.0, Y_MAX + 415.0),
        "src_crs": crs,
        "dst_transform": utm_transform(25.0),
        "dst_crs": crs,
    }

    out, supported = citycube.processing.chips._average_with_support(
        values, valid, 55, 55, geometry
    )
    expected, expected_supported = _gdal_average_with_support(
        values.astype(np.float64), valid, geometry, (55, 55)
    )

    assert supported.all() and expected_supported.all()
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_mollweide_warps_through_its_proj_string_with_identical_pixels() -> None:
    """GDAL looks a WKT without an EPSG code up again on every warp; the PROJ string it is
    handed instead describes the same CRS and gives the same pixels."""
    mollweide = CRS.from_user_input("ESRI:54009")
    gdal_form = citycube.items.rasters.rio_crs(mollweide)
    assert gdal_form.to_wkt() != rasterio.crs.CRS.from_wkt(mollweide.to_wkt()).to_wkt()
    x0, y0 = Transformer.from_crs(EPSG, mollweide, always_xy=True).transform(X_MIN, Y_MAX)
    rng = np.random.default_rng(5)
    values = rng.uniform(0, 1, (1, 90, 140)).astype(np.float32)
    values[0, 10:40, 20:90] = np.nan
    outs = []
    for src_crs in (gdal_form, rasterio.crs.CRS.from_wkt(mollweide.to_wkt())):
        out = np.full((1, 60, 60), np.nan, np.float32)
        reproject(
            values,
            out,
            src_transform=Affine(100, 0, x0 - 2000, 0, -100, y0 + 2000),
            src_crs=src_crs,
            dst_transform=utm_transform(100),
            dst_crs=f"EPSG:{EPSG}",
            src_nodata=np.nan,
            dst_nodata=np.nan,
            resampling=Resampling.average,
        )
        outs.append(out)
    assert 0.2 < np.isfinite(outs[0]).mean() < 1
    np.testing.assert_array_equal(outs[0], outs[1])


def test_gdal_nodata_pct_threshold_is_not_the_50_percent_rule() -> None:
    """Why chips.py warps the validity mask instead of relying on NODATA_VALUES_PCT_THRESHOLD.

    In GDAL 3.10 the option makes ``average`` return nodata when the nodata share is at least
    the threshold (so exactly half-valid support is lost at 50), and ``mode`` ignores it. If
    this test starts failing after a GDAL upgrade, the option may now express the rule.
    """

    def warp_block(n_valid: int, resampling: Resampling) -> bool:
        block = np.full((4, 4), -1, dtype=np.float32)
        block.reshape(-1)[:n_valid] = 5
        out = np.full((1, 1), -1, dtype=np.float32)
        reproject(
            block,
            out,
            src_transform=utm_transform(10),
            src_crs=f"EPSG:{EPSG}",
            dst_transform=utm_transform(40),
            dst_crs=f"EPSG:{EPSG}",
            src_nodata=-1,
            dst_nodata=-1,
            resampling=resampling,
            NODATA_VALUES_PCT_THRESHOLD=50,
        )
        return bool(out[0, 0] != -1)

    assert [warp_block(k, Resampling.average) for k in (7, 8, 9)] == [False, False, True]
    assert warp_block(1, Resampling.mode)


def test_categorical_warp_keeps_source_ids_and_the_majority_wins(tmp_path: Path) -> None:
    grid = small_grid()  # 50 m pixels over 10 m cells: 5×5 cells per pixel
    rng = np.random.default_rng(3)
    classes = np.array([0, 3, 7, 11, 200])  # 0 is a valid class (non-green / ocean)
    h, w = grid.height, grid.width
    majority = rng.choice(classes, (h, w))
    minority = rng.choice(classes, (h, w))
    cells = np.repeat(np.repeat(majority, 5, axis=0), 5, axis=1).astype(np.uint8)
    for r in range(h):
        for c in range(w):
            flips = rng.choice(25, 10, replace=False)  # 10 minority cells vs 15 majority
            block = cells[5 * r : 5 * r + 5, 5 * c : 5 * c + 5].reshape(-1)
            block[flips] = minority[r, c]
            cells[5 * r : 5 * r + 5, 5 * c : 5 * c + 5] = block.reshape(5, 5)
    cells[:, :2] = 255  # a strip of nodata at the west edge (2 of 5 cell columns)
    path = write_raster(
        tmp_path / "lc.tif", cells[None], f"EPSG:{EPSG}", utm_transform(10.0), nodata=255
    )

    out, valid = warp_rows(masked_source(path, 255), grid, 0, h, categorical=True)

    assert np.issubdtype(out.dtype, np.integer)
    assert valid.all()
    assert set(np.unique(out[0][valid]).tolist()) <= set(classes.tolist())
    np.testing.assert_array_equal(out[0][:, 1:], majority[:, 1:])


def test_rows_beyond_the_source_are_invalid_not_zero(tmp_path: Path) -> None:
    grid = small_grid()
    values = np.zeros((1, 100, 600), dtype=np.float32)  # covers the top 1 km only, all zeros
    path = write_raster(
        tmp_path / "ntl.tif", values, f"EPSG:{EPSG}", utm_transform(10.0), nodata=-1
    )

    out, valid = warp_rows(masked_source(path, -1), grid, 0, grid.height, categorical=False)
    assert valid[:20].all() and not valid[20:].any()
    assert (out[0][:20] == 0).all()

    out, valid = warp_rows(masked_source(path, -1), grid, 40, 80, categorical=True)
    assert not valid.any()


# --------------------------------------------------------------------------------------------
# Streaming by row band


def test_band_by_band_equals_all_at_once_and_reads_follow_the_band(tmp_path: Path) -> None:
    grid = small_grid(resolution=100.0, width=150, height=250)
    rng = np.random.default_rng(11)
    cells = rng.integers(0, 256, (3, 870, 520)).astype(np.uint8)
    cells[:, rng.random((870, 520)) < 0.1] = 0
    path = write_raster(tmp_path / "opt.tif", cells, f"EPSG:{EPSG}", utm_transform(30.0), nodata=0)
    windows: list[Window] = []
    source = masked_source(path, 0, windows)

    whole_values, whole_valid = warp_rows(source, grid, 0, grid.height, categorical=False)
    write_store(tmp_path / "whole.zarr", grid, whole_values, whole_valid)

    windows.clear()
    bands = row_bands(grid)
    with ChipStoreWriter(
        tmp_path / "banded.zarr", grid, ["b0", "b1", "b2"], np.uint8, 0, {"synthetic": True}
    ) as writer:
        for start, stop in bands:
            values, valid = warp_rows(source, grid, start, stop, categorical=False)
            np.testing.assert_array_equal(valid, whole_valid[start:stop])
            np.testing.assert_allclose(values, whole_values[:, start:stop], rtol=1e-5)
            writer.write_rows(start, values, valid)

    assert len(windows) == len(bands)
    for window, (start, stop) in zip(windows, bands, strict=True):
        assert window.height <= math.ceil((stop - start) * 100 / 30) + 2 * 3 + 1
    banded, whole = open_chips(tmp_path / "banded.zarr"), open_chips(tmp_path / "whole.zarr")
    np.testing.assert_array_equal(banded["valid"].values, whole["valid"].values)
    np.testing.assert_array_equal(banded["data"].values, whole["data"].values)


@pytest.mark.parametrize("categorical", [False, True])
def test_block_by_block_equals_all_at_once_and_reads_follow_the_block(
    tmp_path: Path, categorical: bool
) -> None:
    grid = small_grid(resolution=100.0, width=250, height=150)
    rng = np.random.default_rng(12)
    shape = (520, 870)  # 30 m cells from an odd 15 m origin: they straddle pixel edges
    if categorical:
        cells = rng.choice(np.array([1, 2, 5, 9], np.uint8), (1, *shape))
    else:
        cells = rng.integers(1, 256, (3, *shape)).astype(np.uint8)
    cells[:, rng.random(shape) < 0.2] = 0
    transform = utm_transform(30.0, X_MIN - 15, Y_MAX + 15)
    path = write_raster(tmp_path / "src.tif", cells, f"EPSG:{EPSG}", transform, nodata=0)
    windows: list[Window] = []
    source = masked_source(path, 0, windows)

    whole_values, whole_valid = warp_rows(source, grid, 0, grid.height, categorical=categorical)
    windows.clear()
    cuts = blocks(grid)
    assert len(cuts) == 6
    for r0, r1, c0, c1 in cuts:
        values, valid = warp_block(source, grid, r0, r1, c0, c1, categorical=categorical)
        np.testing.assert_array_equal(valid, whole_valid[r0:r1, c0:c1])
        if categorical:
            np.testing.assert_array_equal(values[:, valid], whole_values[:, r0:r1, c0:c1][:, valid])
        else:  # the last float32 bit may round differently from another origin
            np.testing.assert_allclose(
                values[:, valid], whole_values[:, r0:r1, c0:c1][:, valid], rtol=2.5e-7
            )

    assert len(windows) == len(cuts)
    for window, (r0, r1, c0, c1) in zip(windows, cuts, strict=True):
        # The block's own footprint in source cells plus the margin, not the grid's width.
        assert window.width <= math.ceil((c1 - c0) * 100 / 30) + 2 * 3 + 1
        assert window.height <= math.ceil((r1 - r0) * 100 / 30) + 2 * 3 + 1


def test_reprojected_blocks_agree_with_the_whole_grid_within_the_warp_approximation(
    tmp_path: Path,
) -> None:
    """From lon/lat, a block lands where the whole-grid warp does, to GDAL's approximation.

    GDAL interpolates source positions along each warped row between exactly projected nodes,
    up to 1/8 source cell off; the nodes depend on the row's extent, so a block and the whole
    grid may place a footprint up to ~1/4 cell apart. Two ramps (the source column and row of
    each cell) show that offset directly: their average is the footprint's position.
    """
    grid = small_grid(resolution=100.0, width=250, height=150)
    to_lonlat = Transformer.from_crs(f"EPSG:{EPSG}", "EPSG:4326", always_xy=True)
    lon0, lat1 = to_lonlat.transform(X_MIN - 500, Y_MAX + 500)
    step, (height, width) = 0.0005, (330, 800)  # ~34 m × 55 m cells
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    path = write_raster(
        tmp_path / "ramps.tif",
        np.stack([cols, rows]),
        "EPSG:4326",
        Affine(step, 0, lon0, 0, -step, lat1),
        nodata=None,
    )
    source = masked_source(path, None)
    whole, whole_valid = warp_rows(source, grid, 0, grid.height, categorical=False)
    assert whole_valid.all()
    for r0, r1, c0, c1 in blocks(grid):
        values, valid = warp_block(source, grid, r0, r1, c0, c1, categorical=False)
        assert valid.all()
        assert np.abs(values - whole[:, r0:r1, c0:c1]).max() <= 0.25


# --------------------------------------------------------------------------------------------
# Tile summaries


def test_tile_summaries_count_valid_pixels_and_average_them() -> None:
    grid = small_grid()
    values = np.zeros((2, 40, 120), dtype=np.float32)
    values[0, :, :40] = 2.0
    values[1, :, :40] = -3.0
    valid = np.ones((40, 120), dtype=bool)
    valid[:, 40:80] = False
    values[:, :, 40:80] = np.nan
    tiles = [grid_tile(grid, 0, c) for c in range(3)] + [grid_tile(grid, 1, 0)]

    summaries = tile_pixel_summaries(values, valid, 0, 0, grid, tiles, categorical=False)

    assert [s.tile_id for s in summaries] == [
        "Testville_2KM_r0_c0",
        "Testville_2KM_r0_c1",
        "Testville_2KM_r0_c2",
    ]
    first, empty, zeros = summaries
    assert (first.valid_pixels, first.total_pixels, first.band_means) == (1600, 1600, (2.0, -3.0))
    assert empty.valid_pixels == 0 and all(math.isnan(m) for m in empty.band_means)
    assert zeros.band_means == (0.0, 0.0) and zeros.valid_fraction == 1.0


def test_tile_summaries_use_the_block_column_offset() -> None:
    grid = small_grid()
    values = np.zeros((1, 40, 40), dtype=np.float32)
    values[0, :, :] = 5.0
    valid = np.ones((40, 40), dtype=bool)
    tiles = [grid_tile(grid, 1, c) for c in range(3)]
    summaries = tile_pixel_summaries(values, valid, 40, 80, grid, tiles, categorical=False)
    assert [s.tile_id for s in summaries] == ["Testville_2KM_r1_c2"]
    assert summaries[0].band_means == (5.0,) and summaries[0].valid_pixels == 1600


def test_tile_mode_breaks_ties_to_the_smallest_id() -> None:
    grid = small_grid()
    ids = np.full((1, 40, 120), 9, dtype=np.int32)
    ids[0, :20, :40] = 4  # tile c0: 800 × 4 and 800 × 9 → tie
    valid = np.ones((40, 120), dtype=bool)
    valid[:, 40:80] = False
    tiles = [grid_tile(grid, 1, c) for c in range(3)]
    summaries = tile_pixel_summaries(ids, valid, 40, 0, grid, tiles, categorical=True)
    tie, empty, plain = summaries
    assert tie.mode_class == 4 and tie.class_counts == ((4, 800), (9, 800))
    assert empty.mode_class is None and empty.valid_pixels == 0
    assert plain.mode_class == 9 and plain.band_means == ()


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [(np.uint8, 0, 256), (np.int32, 0, 300), (np.int32, -5, 5), (np.int64, 0, 2**40)],
)
def test_tile_class_counts_are_those_of_every_valid_pixel(dtype: type, low: int, high: int) -> None:
    grid = small_grid()
    rng = np.random.default_rng(2)
    ids = rng.integers(low, high, (1, 40, 120)).astype(dtype)
    valid = rng.random((40, 120)) > 0.25
    tiles = [grid_tile(grid, 1, c) for c in range(3)]
    for tile, summary in zip(
        tiles, tile_pixel_summaries(ids, valid, 40, 0, grid, tiles, categorical=True), strict=True
    ):
        window = (slice(None), slice(40 * tile.col, 40 * tile.col + 40))
        distinct, counts = np.unique(ids[0][window][valid[window]], return_counts=True)
        assert summary.class_counts == tuple(zip(distinct.tolist(), counts.tolist(), strict=True))
        assert summary.mode_class == int(distinct[np.argmax(counts)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32, np.float64])
def test_tile_means_are_the_float64_means_of_the_valid_pixels(dtype: type) -> None:
    grid = small_grid()
    rng = np.random.default_rng(4)
    values = (rng.normal(0, 1000, (2, 40, 120)) % 250).astype(dtype)
    if np.issubdtype(dtype, np.signedinteger):
        values[1] -= 200
    valid = rng.random((40, 120)) > 0.4
    valid[:, 80:] = True
    tiles = [grid_tile(grid, 1, c) for c in range(3)]
    for tile, summary in zip(
        tiles,
        tile_pixel_summaries(values, valid, 40, 0, grid, tiles, categorical=False),
        strict=True,
    ):
        window = (slice(None), slice(40 * tile.col, 40 * tile.col + 40))
        expected = tuple(float(b[window][valid[window]].mean(dtype=np.float64)) for b in values)
        assert summary.band_means == expected  # bit for bit


@pytest.mark.parametrize("categorical", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32])
def test_a_blocks_tiles_are_summarised_as_each_tile_alone(categorical: bool, dtype: type) -> None:
    """All tiles of a block at once (a full lattice, one with a tile missing, or tiles of two
    sizes as a 10 km block holds 2 km and 5 km tiles) give each tile's own summary exactly:
    counts, class counts, modes and means bit for bit."""
    grid = small_grid()
    rng = np.random.default_rng(5)
    values = rng.integers(0, 40, (1 if categorical else 2, 80, 120)).astype(dtype)
    valid = rng.random((80, 120)) > 0.3
    valid[:40, 40:80] = False  # one tile without any valid pixel
    lattice = [grid_tile(grid, r, c) for r in range(2) for c in range(3)]
    x0, y1 = grid.x_min, grid.y_max
    larger = Tile(grid.city, "5km", 0, 0, (x0, y1 - 4000, x0 + 4000, y1))  # 80 × 80 pixels
    for tiles in (lattice, lattice[:4] + lattice[5:], [larger, *lattice]):
        together = tile_pixel_summaries(values, valid, 0, 0, grid, tiles, categorical=categorical)
        alone = [
            tile_pixel_summaries(values, valid, 0, 0, grid, [tile], categorical=categorical)[0]
            for tile in tiles
        ]
        assert sorted(s.tile_id for s in together) == sorted(t.tile_id for t in tiles)
        together.sort(key=lambda s: [t.tile_id for t in tiles].index(s.tile_id))
        for a, b in zip(together, alone, strict=True):
            assert (a.tile_id, a.valid_pixels, a.total_pixels) == (
                b.tile_id,
                b.valid_pixels,
                b.total_pixels,
            )
            assert (a.mode_class, a.class_counts) == (b.mode_class, b.class_counts)
            np.testing.assert_array_equal(a.band_means, b.band_means)  # NaN where none valid


# --------------------------------------------------------------------------------------------
# A whole city, block by block


CITY = "Amsterdam"  # EPSG:32631; 2 km grid 10×14, 5 km grid 4×6: 2×3 blocks of 10 km
CAT = load_catalogue()


def _utm_tif(path: Path, data: np.ndarray, res: float, nodata: float) -> Path:
    """A raster in the city's CRS, offset by an odd 15 m so its cells straddle chip pixels."""
    grid = pixel_grid(CITY, 100)
    transform = Affine(res, 0, grid.x_min - 1015, 0, -res, grid.y_max + 1015)
    return write_tif(path, data, crs=f"EPSG:{EPSG}", transform=transform, nodata=nodata)


def _roads(path: Path, rng: np.random.Generator) -> Path:
    """Random straight roads across the city, many of them crossing block edges."""
    grid = city_grid(CITY, "2km")
    to_lonlat = Transformer.from_crs(f"EPSG:{EPSG}", "EPSG:4326", always_xy=True)
    xs = grid.x_min + rng.uniform(0, grid.n_cols * grid.tile_size, (60, 2))
    ys = grid.y_max - rng.uniform(0, grid.n_rows * grid.tile_size, (60, 2))
    lon, lat = to_lonlat.transform(xs, ys)
    lines = [shapely.LineString(np.column_stack(ends)) for ends in zip(lon, lat, strict=True)]
    gpd.GeoDataFrame(
        {"highway": ["primary", "residential"] * 30, "osm_id": range(60)},
        geometry=lines,
        crs=4326,
    ).to_file(path, layer="roads")
    return path


def _one_block(grid: PixelGrid, block_m: float = 10_000) -> list[tuple[int, int, int, int]]:
    """The whole grid as a single block: the reference the blocks must reproduce."""
    return [(0, grid.height, 0, grid.width)]


def _process(root: Path, code: str, files: dict[str, Path]) -> tuple[xr.Dataset, pa.Table]:
    """Process one partition of ``code`` from test files; its chips and observations."""
    product = "osm_roads" if code == "RD" else f"test_{code.lower()}"
    modality = CAT.get(code).model_copy(update={"product": product, "product_by_city": {}})
    release = Release(root, "t")
    backend = LocalFilesBackend({(product, CITY, 2020): files})
    process_partition(modality, CAT, CITY, 2020, backend, release)
    chips = open_chips(release.chip_store(code, CITY, "2020")).load()
    return chips, pq.read_table(release.observations_file(CITY, 2020, code))


@pytest.mark.parametrize("code", ["BV", "LU", "RD"])
def test_a_city_in_blocks_equals_the_whole_grid_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """Chips, tile values and row order do not depend on how the city is cut into blocks.

    BV is continuous (area-weighted mean) and LU categorical (mode), both from noisy rasters in
    the city's CRS whose cells straddle chip pixels, with nodata and ids outside the legend; RD
    draws vector lines onto the 10 m grid. Each runs in 2×3 blocks and then as one block.
    """
    rng = np.random.default_rng(21)
    if code == "BV":
        data = rng.gamma(2.0, 3.0, (1, 310, 460)).astype(np.float32)
        data[:, rng.random(data.shape[1:]) < 0.02] = -9999
        data[:, 20:60, 20:75] = -9999  # a hole that makes some tiles unavailable
        files = {"data": _utm_tif(tmp_path / "bv.tif", data, 70.0, -9999)}
    elif code == "LU":
        legend = sorted(CAT.valid_ids(CAT.get("LU")) or ())[:4]
        odds = np.array([0.2, 0.3, 0.2, 0.29, 0.005, 0.005])  # a little nodata and unknown ids
        data = rng.choice(np.array([*legend, 13, 99], np.uint8), (1, 150, 220), p=odds)
        data[:, 10:30, 10:35] = 99  # a hole that makes some tiles unavailable
        files = {"data": _utm_tif(tmp_path / "lu.tif", data, 150.0, 99)}
    else:
        files = {"data": _roads(tmp_path / "roads.gpkg", rng)}
    chip = CAT.get(code).chip
    assert chip is not None
    grid = pixel_grid(CITY, chip.resolution_m)
    assert len(blocks(grid)) == 6

    blocked_chips, blocked = _process(tmp_path / "blocked", code, files)
    shared = citycube.processing.rules.shared
    monkeypatch.setattr(shared, "blocks", _one_block)
    # a plan cache of its own: the module's holds the blocked run's plan for this pixel grid
    monkeypatch.setattr(shared, "_block_plan", functools.cache(shared._block_plan.__wrapped__))
    whole_chips, whole = _process(tmp_path / "whole", code, files)

    valid = whole_chips["valid"].values.astype(bool)
    assert valid.any() and (code == "RD" or not valid.all())
    np.testing.assert_array_equal(blocked_chips["valid"].values, whole_chips["valid"].values)
    if code == "BV":
        # A float32 mean may round differently in its last bit where GDAL places the block's
        # pixels from another origin (about 1 pixel in 5000 here), which moves a 400-pixel
        # tile mean by ~1e-9; validity, counts and availability are exact.
        np.testing.assert_allclose(
            blocked_chips["data"].values, whole_chips["data"].values, rtol=2.5e-7, atol=0
        )
        for name in blocked.column_names:
            if name != "value":
                assert blocked.column(name).equals(whole.column(name)), name
        np.testing.assert_allclose(
            blocked.column("value").to_numpy(zero_copy_only=False),
            whole.column("value").to_numpy(zero_copy_only=False),
            rtol=1e-8,
        )
    else:
        np.testing.assert_array_equal(blocked_chips["data"].values, whole_chips["data"].values)
        assert blocked.equals(whole)
    available = sum(blocked.column("available").to_pylist())
    assert 0 < available < blocked.num_rows or code == "RD"

    # Rows come by 10 km row band, then 2 km tiles before 5 km ones, row-major.
    tiles = [t for g in city_grids(CITY).values() for t in g.tiles()]
    band = {t.tile_id: grid.window(t)[0] // round(10_000 / grid.resolution) for t in tiles}
    expected = sorted(band, key=lambda tile_id: band[tile_id])  # stable: keeps tile order
    assert list(dict.fromkeys(blocked.column("tile_id").to_pylist())) == expected
