"""Sample Copernicus DEM GLO-30: static elevation on the product's geographic lattice.

Like the real tiles, pixel centres sit on whole arc-seconds (corners half a pixel off) and the
longitude spacing widens towards the poles (1″ below 50°, 1.5″ to 60°, ...). The sea is 0 m
and valid; a few small voids are nodata; polder cities keep their below-sea-level land.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from odc.geo.geobox import GeoBox
from pyproj import CRS

from sources.sample.grids import lattice_grid
from sources.sample.world import (
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    pixel_grain,
    row_blocks,
    row_window,
)

ARC_SECOND = 1 / 3600
"""Latitude spacing of GLO-30, degrees."""
NODATA = -32767.0
"""Nodata value of GLO-30 voids."""
_LONGITUDE_SPACING = ((50, 1.0), (60, 1.5), (70, 2.0), (80, 3.0), (85, 5.0), (90, 10.0))
"""(upper |latitude| bound, longitude spacing in arc-seconds) of the product's zones."""


def longitude_spacing(latitude: float) -> float:
    """Longitude pixel size (degrees) of GLO-30 at a latitude."""
    for bound, arc_seconds in _LONGITUDE_SPACING:
        if abs(latitude) < bound:
            return arc_seconds * ARC_SECOND
    return 10 * ARC_SECOND


def dem_grid(world: SyntheticCity) -> GeoBox:
    """The city window on the GLO-30 lattice (pixel centres on whole arc-seconds)."""
    res_x = longitude_spacing(world.latitude)
    origin = (-180 - res_x / 2, 90 + ARC_SECOND / 2)
    return lattice_grid(world, CRS.from_epsg(4326), (res_x, ARC_SECOND), origin)


class CopernicusDemGlo30:
    """Static 30 m digital surface model (float32 m, EPSG:4326)."""

    product_id = "cop_dem_glo30"

    def years(self) -> list[int] | None:
        """Static: one surface for every year."""
        return None

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Elevation with fine relief texture, sea at 0 m and a few voids."""
        grid = dem_grid(world)
        roughness = np.float32(0.15 + 0.004 * world.traits.relief_m)
        grain = pixel_grain(world, "dem-texture", (grid.height, grid.width), 3 * roughness)
        elevation = np.empty((grid.height, grid.width), dtype=np.float32)
        sea = np.empty((grid.height, grid.width), dtype=bool)
        for start, stop in row_blocks(grid.height):
            pts = world.grid_points(row_window(grid, start, stop))
            sea[start:stop] = pts.sea
            smooth = pts.elevation
            # Texture never pushes dry land far below its smooth level (polders stay polders).
            rough = np.maximum(smooth + grain[start:stop], np.minimum(smooth, 0) - 0.5)
            rough = np.where(pts.sea, np.float32(0), rough)
            elevation[start:stop] = np.where(pts.inside, rough, np.float32(NODATA))
        del grain
        _punch_voids(world, elevation, sea)
        # TanDEM-X acquisitions behind GLO-30 span 2011–2015.
        period_start = datetime(2011, 1, 1, tzinfo=UTC)
        period_end = datetime(2015, 12, 31, 23, 59, 59, tzinfo=UTC)
        item_id = f"Copernicus_DSM_COG_10_{world.city}_DEM"
        layer = RasterLayer(
            role="data",
            filename=f"{item_id}.tif",
            data=elevation[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("elevation",),
            units="m",
            title="Surface elevation above EGM2008 geoid",
        )
        return GeneratedItem(
            item_id=item_id,
            layers=(layer,),
            timestamp=None,
            start_datetime=period_start,
            end_datetime=period_end,
            properties={"gsd": 30},
            extra={"units": "m", "nodata": str(NODATA)},
        )


def _punch_voids(world: SyntheticCity, elevation: np.ndarray, sea: np.ndarray) -> None:
    """Set a few small inland blobs to nodata, as radar shadow and layover voids do."""
    rng = world.rng("dem-voids")
    h, w = elevation.shape
    rows = rng.integers(0, h, 400)
    cols = rng.integers(0, w, 400)
    on_land = ~sea[rows, cols]
    count = int(rng.integers(3, 7))
    for row, col in list(zip(rows[on_land], cols[on_land], strict=True))[:count]:
        radius = float(rng.uniform(2, 6))
        r0, r1 = max(row - 7, 0), min(row + 8, h)
        c0, c1 = max(col - 7, 0), min(col + 8, w)
        yy, xx = np.ogrid[r0:r1, c0:c1]
        blob = (yy - row) ** 2 + (xx - col) ** 2 <= radius**2
        window = elevation[r0:r1, c0:c1]
        window[blob & ~sea[r0:r1, c0:c1]] = NODATA
