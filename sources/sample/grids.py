"""How gridded sample products place their cells and fill them from the synthetic world.

Every gridded product cuts the city window out of its global lattice, evaluates the world on a
supersampled grid block by block, and writes nodata where a cell is not wholly on the world.
Doing that in one place keeps the products' windows, cell edges and masks consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import rasterio
from numpy.typing import DTypeLike
from odc.geo.geobox import GeoBox
from pyproj import CRS

from citycube.grid.tiles import snapped_grid
from citycube.items.cog import cog_profile
from sources.sample.world import (
    RasterLayer,
    SyntheticCity,
    WorldPoints,
    block_mean,
    product_window,
    row_blocks,
    row_window,
    transformer,
)

GLOBAL_ORIGIN = (-180.0, 90.0)
"""Upper-left corner of most global geographic lattices."""


def lattice_grid(
    world: SyntheticCity,
    crs: CRS,
    res_xy: tuple[float, float],
    origin_xy: tuple[float, float],
) -> GeoBox:
    """The city window (extent plus product margin) on a product's global lattice."""
    return snapped_grid(crs, product_window(world, crs), res_xy, origin_xy)


def geographic_grid(
    world: SyntheticCity, cell_degrees: float, origin_xy: tuple[float, float] = GLOBAL_ORIGIN
) -> GeoBox:
    """The city window on a square-cell EPSG:4326 lattice."""
    return lattice_grid(world, CRS.from_epsg(4326), (cell_degrees, cell_degrees), origin_xy)


def supersampled_blocks(
    world: SyntheticCity, grid: GeoBox, supersample: int, block_rows: int
) -> Iterator[tuple[slice, WorldPoints, np.ndarray]]:
    """(rows, the world at their sub-pixels, cells off the world) for each block of a grid.

    A cell counts as off the world unless every sub-pixel is on it, so products write nodata
    there rather than a mean over part of the cell.
    """
    for start, stop in row_blocks(grid.height, block_rows):
        pts = world.grid_points(row_window(grid, start, stop), supersample)
        yield slice(start, stop), pts, block_mean(pts.inside, supersample) < 1


def cell_raster(
    world: SyntheticCity,
    grid: GeoBox,
    supersample: int,
    block_rows: int,
    cells: Callable[[WorldPoints], np.ndarray],
    fill: float,
    dtype: DTypeLike,
) -> np.ndarray:
    """One value per cell from ``cells`` (given a block's sub-pixels), ``fill`` off the world."""
    out = np.empty((grid.height, grid.width), dtype=dtype)
    for rows, pts, outside in supersampled_blocks(world, grid, supersample, block_rows):
        out[rows] = np.where(outside, out.dtype.type(fill), cells(pts))
    return out


def point_source_cells(
    world: SyntheticCity, year: int, grid: GeoBox
) -> Iterator[tuple[int, int, float]]:
    """(row, col, tonne C per year) of the large emitters whose cell lies on the grid."""
    to_grid = transformer(world.crs, grid.crs)
    t = grid.transform
    for x, y, amount in world.point_source_emissions(year):
        gx, gy = to_grid.transform(x, y)
        row, col = int((gy - t.f) / t.e), int((gx - t.c) / t.a)
        if 0 <= row < grid.height and 0 <= col < grid.width:
            yield row, col, amount


def rare_cells(
    world: SyntheticCity, label: str, year: int, shape: tuple[int, ...], share: float = 0.001
) -> np.ndarray:
    """A seeded sprinkle of cells (about ``share``) that failed processing in the real product."""
    return world.rng(label, year).random(shape) < share


# --------------------------------------------------------------------------------------------
# Files on a grid that write themselves (NetCDF, scaled-integer COGs).
# --------------------------------------------------------------------------------------------


class OnGrid:
    """Mixin for file layers on a ``grid``: the STAC footprint is the grid's CRS and bounds."""

    grid: GeoBox

    @property
    def crs(self) -> CRS:
        """CRS of the grid."""
        return self.grid.crs

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """Bounds of the grid in its CRS."""
        return self.grid.boundingbox.bbox


def projection_fields(grid: GeoBox) -> dict[str, object]:
    """STAC ``proj:shape`` and ``proj:transform`` of an asset on a grid."""
    t = grid.transform
    return {
        "proj:shape": [grid.height, grid.width],
        "proj:transform": [t.a, t.b, t.c, t.d, t.e, t.f],
    }


def write_cog(path: Path, layer: RasterLayer, tags: dict[str, str]) -> None:
    """Write a layer as a DEFLATE-compressed Cloud Optimized GeoTIFF with synthetic tags."""
    data = layer.data
    profile = cog_profile(
        layer.grid, data.shape[0], data.dtype, layer.nodata, categorical=layer.categorical
    )
    profile["num_threads"] = "ALL_CPUS"
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        dst.update_tags(**tags, CITYCUBE_UNITS=layer.units)
        for band, description in enumerate(layer.band_descriptions, start=1):
            dst.set_band_description(band, description)
            dst.update_tags(band, units=layer.units)
