"""Sample ODIAC fossil-fuel CO₂ emissions: annual totals on the global 30″ lattice.

Values are tonne carbon per cell per year (cell area shrinks with latitude, so the same
density gives smaller cells smaller totals). The diffuse field follows residents and
non-residential floor space; a few large emitters add to single cells. The product ends in
2024: asking for 2025 raises ``SourceUnavailableError`` in the backend.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
from pyproj import CRS, Transformer

from sources.sample.world import (
    FIRST_YEAR,
    GeneratedItem,
    NativeGrid,
    RasterLayer,
    SyntheticCity,
    block_mean,
    product_window,
    row_blocks,
    snapped_grid,
)

CELL_DEGREES = 1 / 120
"""30 arc-second cell size."""
LAST_ODIAC_YEAR = 2024
"""Last year the product covers."""
NODATA = -9999.0
"""Nodata value (rare cells)."""
EARTH_RADIUS_KM = 6371.0088
"""Mean Earth radius for cell areas."""


def odiac_grid(world: SyntheticCity) -> NativeGrid:
    """The city window on the global 30″ lattice (origin -180°, 90°)."""
    crs = CRS.from_epsg(4326)
    return snapped_grid(
        crs, product_window(world, crs), (CELL_DEGREES, CELL_DEGREES), (-180.0, 90.0)
    )


def cell_area_km2(grid: NativeGrid) -> np.ndarray:
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
        grid = odiac_grid(world)
        density = np.empty((grid.height, grid.width), dtype=np.float32)
        for start, stop in row_blocks(grid.height, 32):
            pts = world.grid_points(grid.row_window(start, stop), self.supersample)
            cell = block_mean(world.emission_density(pts, year), self.supersample)
            outside = block_mean(pts.inside, self.supersample) < 1
            density[start:stop] = np.where(outside, np.float32(np.nan), cell)
        tonnes = (density * cell_area_km2(grid)).astype(np.float32)
        to_geo = Transformer.from_crs(world.crs, "EPSG:4326", always_xy=True)
        for x, y, amount in world.point_source_emissions(year):
            lon, lat = to_geo.transform(x, y)
            col = (lon - grid.transform.c) / grid.transform.a
            row = (lat - grid.transform.f) / grid.transform.e
            if 0 <= int(row) < grid.height and 0 <= int(col) < grid.width:
                tonnes[int(row), int(col)] += np.float32(amount)
        rng = world.rng("odiac-nodata", year)
        tonnes[(rng.random(tonnes.shape) < 0.002) | np.isnan(tonnes)] = NODATA
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
        return GeneratedItem(
            item_id=f"{name}_{world.city}",
            layers=(layer,),
            timestamp=datetime(year, 1, 1, tzinfo=UTC),
            start_datetime=datetime(year, 1, 1, tzinfo=UTC),
            end_datetime=datetime(year, 12, 31, 23, 59, 59, tzinfo=UTC),
            properties={"odiac:version": "ODIAC2024"},
            extra={"units": "tonne C/cell/year", "nodata": str(NODATA)},
        )
