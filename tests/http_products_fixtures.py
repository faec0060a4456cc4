"""Small format-faithful files of HTTP-served products, built from arrays in the tests.

Each file sits on its product's real global lattice (origin and cell size), in its real CRS,
with its real name and packing (GHSL zip tiles on the Mollweide tile grid, gzipped ODIAC months
and VNL composites, CHELSA COGs); only the extent is cut to a patch around the test city.
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.crs import CRS as RioCRS
from rasterio.io import MemoryFile

from sources.http.base import city_window
from sources.http.spec import HttpProductSpec


@dataclass(frozen=True)
class Patch:
    """A lattice-aligned block of a product's global grid and its values."""

    transform: Affine
    """Transform of the patch's cells."""
    values: np.ndarray
    """(rows, cols) raw values as the file stores them."""

    def window_of(self, grid: GeoBox) -> np.ndarray:
        """The patch's values on a target window of the same lattice (must lie inside)."""
        col = round((grid.transform.c - self.transform.c) / self.transform.a)
        row = round((grid.transform.f - self.transform.f) / self.transform.e)
        assert col >= 0 and row >= 0
        block = self.values[row : row + grid.height, col : col + grid.width]
        assert block.shape == grid.shape
        return block


def patch_around(city: str, spec: HttpProductSpec, margin_cells: int = 4) -> Affine:
    """A lattice-aligned transform of a patch holding the city window plus a margin."""
    grid = city_window(city, spec)
    res = spec.resolution
    return Affine(
        res,
        0,
        grid.transform.c - margin_cells * res,
        0,
        -res,
        grid.transform.f + margin_cells * res,
    )


def patch_shape(city: str, spec: HttpProductSpec, margin_cells: int = 4) -> tuple[int, int]:
    """(rows, cols) of the patch of ``patch_around``."""
    grid = city_window(city, spec)
    return grid.height + 2 * margin_cells, grid.width + 2 * margin_cells


def tif_bytes(
    values: np.ndarray,
    transform: Affine,
    crs: str,
    nodata: float | None,
    *,
    driver: str = "GTiff",
    scale: float = 1.0,
    offset: float = 0.0,
) -> bytes:
    """A single-band GeoTIFF (or COG) of ``values`` in memory."""
    profile = {
        "driver": driver,
        "width": values.shape[1],
        "height": values.shape[0],
        "count": 1,
        "dtype": values.dtype.name,
        "crs": RioCRS.from_wkt(CRS.from_user_input(crs).to_wkt()),
        "transform": transform,
        "nodata": nodata,
        "compress": "DEFLATE",
    }
    if driver == "COG":
        profile["blocksize"] = 256
    else:
        profile.update(tiled=True, blockxsize=256, blockysize=256)
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values, 1)
            if scale != 1 or offset != 0:
                dst.scales = (scale,)
                dst.offsets = (offset,)
        return bytes(memory.read())


def gz(data: bytes) -> bytes:
    """Gzip-compressed bytes."""
    return gzip.compress(data, compresslevel=1)


def zipped(member: str, data: bytes) -> bytes:
    """A zip archive holding one member."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, data)
    return buffer.getvalue()


def ghsl_tiles(
    spec: HttpProductSpec, patch: Patch, nodata: float
) -> dict[tuple[int, int], tuple[Affine, np.ndarray]]:
    """The patch split along the GHSL tile grid: (row, col) -> (transform, values)."""
    assert spec.tile_grid is not None
    ox, oy = spec.tile_grid.origin_xy
    size = spec.tile_grid.tile_size
    res = spec.resolution
    t = patch.transform
    rows, cols = patch.values.shape
    out: dict[tuple[int, int], tuple[Affine, np.ndarray]] = {}
    col_edges = [0]
    x = t.c
    for c in range(cols):
        cx = t.c + c * res
        if math.floor((cx - ox) / size) != math.floor((x - ox) / size):
            col_edges.append(c)
            x = cx
    col_edges.append(cols)
    row_edges = [0]
    y = t.f
    for r in range(rows):
        cy = t.f - r * res
        if math.floor((oy - cy) / size) != math.floor((oy - y) / size):
            row_edges.append(r)
            y = cy
    row_edges.append(rows)
    for r0, r1 in itertools.pairwise(row_edges):
        for c0, c1 in itertools.pairwise(col_edges):
            left, top = t.c + c0 * res, t.f - r0 * res
            tile = (math.floor((oy - top) / size) + 1, math.floor((left - ox) / size) + 1)
            block = patch.values[r0:r1, c0:c1]
            out[tile] = (Affine(res, 0, left, 0, -res, top), block)
    del nodata
    return out


def read_item(path: Path) -> tuple[np.ndarray, rasterio.Affine, float | None, tuple[float, ...]]:
    """(values with file scale/offset applied, transform, nodata, scales) of an item file."""
    with rasterio.open(path) as ds:
        raw = ds.read().astype(np.float64)
        scaled = raw * np.array(ds.scales)[:, None, None] + np.array(ds.offsets)[:, None, None]
        invalid = raw == ds.nodata
        scaled[invalid] = np.nan
        return scaled, ds.transform, ds.nodata, ds.scales
