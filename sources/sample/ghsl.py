"""Sample GHSL R2023A epochs: GHS-POP (1 km) and GHS-BUILT-V (100 m) in World Mollweide.

Cells sit on the GHSL lattice (x origin -18 041 000 m, y origin 9 000 000 m). Values are cell
means of the synthetic world sampled on a finer sub-grid, so coastal and fringe cells get
partial values the way real area-weighted products do. Some cities lose a strip of
population cells along one edge, so tiles there have only partial support.
"""

from __future__ import annotations

import numpy as np
from odc.geo.geobox import GeoBox
from pyproj import CRS

from sources.sample.grids import cell_raster, lattice_grid, supersampled_blocks
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    annual_item,
    block_mean,
    grid_utm_xy,
)

MOLLWEIDE = "ESRI:54009"
"""GHSL's global equal-area CRS."""
LATTICE_ORIGIN = (-18_041_000.0, 9_000_000.0)
"""GHSL grid origin (x, y) in Mollweide metres."""
EPOCHS = list(range(FIRST_YEAR, LAST_YEAR + 1, 5))
"""The 5-year epochs the sample GHSL products cover."""
POP_NODATA = -200.0
"""GHS-POP nodata value."""
BUILT_V_NODATA = -9999.0
"""GHS-BUILT-V nodata value."""


def ghsl_grid(world: SyntheticCity, resolution: float) -> GeoBox:
    """The city window on the GHSL Mollweide lattice at a resolution."""
    crs = CRS.from_user_input(MOLLWEIDE)
    return lattice_grid(world, crs, (resolution, resolution), LATTICE_ORIGIN)


class GhsPop:
    """GHS-POP R2023A: residents per 1 km cell (= persons/km²), 5-year epochs."""

    product_id = "ghs_pop"
    resolution = 1000.0
    supersample = 10

    def years(self) -> list[int] | None:
        """The epochs 2000, 2005, …, 2025."""
        return list(EPOCHS)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Cell means of the world's population density, with a coverage strip for some cities."""
        assert year is not None
        grid = ghsl_grid(world, self.resolution)
        persons = cell_raster(
            world,
            grid,
            self.supersample,
            block_rows=32,
            cells=lambda pts: block_mean(world.population_density(pts, year), self.supersample),
            fill=POP_NODATA,
            dtype=np.float32,
        )
        persons[_missing_strip(world, grid)] = POP_NODATA
        name = f"GHS_POP_E{year}_GLOBE_R2023A_54009_1000_V1_0"
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=persons[None],
            grid=grid,
            nodata=POP_NODATA,
            band_descriptions=("population",),
            units="persons per cell (1 km², so persons/km²)",
            title="Residential population per 1 km cell",
        )
        return annual_item(
            f"{name}_{world.city}",
            (layer,),
            year,
            properties={"gsd": self.resolution, "ghsl:epoch": year},
            extra={"units": "persons/km2", "nodata": str(POP_NODATA), "epoch": str(year)},
        )


def _missing_strip(world: SyntheticCity, grid: GeoBox) -> np.ndarray:
    """Cells without coverage: for some cities a strip along one edge of the extent."""
    rng = world.rng("ghs-pop-strip")
    missing = np.zeros((grid.height, grid.width), dtype=bool)
    if rng.random() >= 0.4:
        return missing
    x, y = grid_utm_xy(grid, world.crs, step=4)
    x, y = np.broadcast_arrays(x, y)
    xmin, ymin, xmax, ymax = world.extent
    width = float(rng.uniform(2000, 6000))
    edge = int(rng.integers(4))
    if edge == 0:
        missing |= x < xmin + width
    elif edge == 1:
        missing |= x > xmax - width
    elif edge == 2:
        missing |= y > ymax - width
    else:
        missing |= y < ymin + width
    return missing


class GhsBuiltV:
    """GHS-BUILT-V R2023A: built-volume density, total and non-residential, 5-year epochs."""

    product_id = "ghs_built_v"
    resolution = 100.0
    supersample = 2

    def years(self) -> list[int] | None:
        """The epochs 2000, 2005, …, 2025."""
        return list(EPOCHS)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Band 1 total, band 2 non-residential built volume (m³/m²); 0 is a valid value."""
        assert year is not None
        grid = ghsl_grid(world, self.resolution)
        bands = np.empty((2, grid.height, grid.width), dtype=np.float32)
        for rows, pts, outside in supersampled_blocks(world, grid, self.supersample, 128):
            total, nonres = world.built_volume(pts, year)
            for band, values in enumerate((total, nonres)):
                cell = block_mean(values, self.supersample)
                bands[band, rows] = np.where(outside, np.float32(BUILT_V_NODATA), cell)
        name = f"GHS_BUILT_V_E{year}_GLOBE_R2023A_54009_100_V1_0"
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=bands,
            grid=grid,
            nodata=BUILT_V_NODATA,
            band_descriptions=("built_volume_total", "built_volume_non_residential"),
            units="m3/m2",
            title="Built-volume density (total, non-residential)",
        )
        return annual_item(
            f"{name}_{world.city}",
            (layer,),
            year,
            properties={"gsd": self.resolution, "ghsl:epoch": year},
            extra={"units": "m3/m2", "nodata": str(BUILT_V_NODATA), "epoch": str(year)},
        )
