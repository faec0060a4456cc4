"""Sample ODIAC fossil-fuel CO₂ emissions: annual totals on the global 30″ lattice.

Values are tonne carbon per cell per year (cell area shrinks with latitude, so the same
density gives smaller cells smaller totals). The diffuse field follows residents and
non-residential floor space; a few large emitters add to single cells. The product ends in
2024: asking for 2025 raises ``SourceUnavailableError`` in the backend.
"""

from __future__ import annotations

import math

import numpy as np
from odc.geo.geobox import GeoBox

from sources.sample.grids import cell_raster, geographic_grid, point_source_cells, rare_cells
from sources.sample.world import (
    FIRST_YEAR,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    annual_item,
    block_mean,
)

CELL_DEGREES = 1 / 120
"""30 arc-second cell size."""
LAST_ODIAC_YEAR = 2024
"""Last year the product covers."""
NODATA = -9999.0
"""Nodata value (rare cells)."""
EARTH_RADIUS_KM = 6371.0088
"""Mean Earth radius for cell areas."""


def cell_area_km2(grid: GeoBox) -> np.ndarray:
    """Area of each row's cells on the sphere, km² (column vector)."""
    top = grid.transform.f - np.arange(grid.height) * CELL_DEGREES
    bottom = top - CELL_DEGREES
    band = np.abs(np.sin(np.radians(top)) - np.sin(np.radians(bottom)))
    return (EARTH_RADIUS_KM**2 * math.radians(CELL_DEGREES) * band)[:, None].astype(np.float32)


class Odiac:
    """ODIAC annual emissions (tonne C per cell per year), 2000–2024."""

    product_id = "odiac"
    supersample = 10

    def years(self) -> list[int] | None:
        """2000–2024; the product has no 2025 release."""
        return list(range(FIRST_YEAR, LAST_ODIAC_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Diffuse emissions integrated over each cell, plus point sources, rare nodata cells."""
        assert year is not None
        grid = geographic_grid(world, CELL_DEGREES)
        density = cell_raster(
            world,
            grid,
            self.supersample,
            block_rows=32,
            cells=lambda pts: block_mean(world.emission_density(pts, year), self.supersample),
            fill=np.nan,
            dtype=np.float32,
        )
        tonnes = (density * cell_area_km2(grid)).astype(np.float32)
        for row, col, amount in point_source_cells(world, year, grid):
            tonnes[row, col] += np.float32(amount)
        rare = rare_cells(world, "odiac-nodata", year, tonnes.shape, share=0.002)
        tonnes[rare | np.isnan(tonnes)] = NODATA
        name = f"odiac2024_1km_excl_intl_{year}"
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=tonnes[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("co2_emissions",),
            units="tonne C per cell per year",
            title="Fossil-fuel CO2 emissions (excluding international bunkers)",
        )
        return annual_item(
            f"{name}_{world.city}",
            (layer,),
            year,
            properties={"odiac:version": "ODIAC2024"},
            extra={"units": "tonne C/cell/year", "nodata": str(NODATA)},
        )
