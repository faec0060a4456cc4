"""Sample VIIRS Nighttime Lights annual composites (VNL v2 "average_masked"), 2012–2025.

Radiance in nW/cm²/sr on the VNL 15″ lattice (EPSG:4326, origin -180°, 75°: the VNL grid
spans 75° N to 65° S). Brightness follows residents and non-residential floor space (offices,
ports and industry shine more per person), large emitters add bright spots, the sensor's
footprint blurs lights over their neighbours (blooming over the shore), and the masked
background is exactly 0 — a valid "dark" value. Lights grow slightly year on year. The
product starts in 2012 (Suomi NPP); earlier years are unavailable.
"""

from __future__ import annotations

import numpy as np
from odc.geo.geobox import GeoBox
from scipy import ndimage

from sources.sample.grids import (
    geographic_grid,
    point_source_cells,
    rare_cells,
    supersampled_blocks,
)
from sources.sample.world import (
    LAST_YEAR,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    annual_item,
    block_mean,
)

CELL_DEGREES = 1 / 240
"""15 arc-second cell size."""
LATTICE_ORIGIN = (-180.0, 75.0)
"""Upper-left corner of the global VNL grid."""
FIRST_VNL_YEAR = 2012
"""First annual composite (Suomi NPP VIIRS)."""
NODATA = -9999.0
"""Nodata (rare cells)."""
BACKGROUND_MASK = 0.3
"""Radiance below which VNL's background mask sets cells to 0, nW/cm²/sr."""


def vnl_name(year: int) -> str:
    """The product's file stem: v2.1 (Suomi NPP) to 2021, v2.2 (NPP + NOAA-20) after."""
    if year <= 2021:
        config = "vcmcfg" if year <= 2013 else "vcmslcfg"
        return f"VNL_v21_npp_{year}_global_{config}_c202205302300.average_masked.dat"
    return f"VNL_v22_npp-j01_{year}_global_vcmslcfg_c{year + 1}03062300.average_masked.dat"


class ViirsVnl:
    """VIIRS VNL annual average radiance (float32 nW/cm²/sr, EPSG:4326), 2012–2025."""

    product_id = "viirs_vnl"
    supersample = 8

    def years(self) -> list[int] | None:
        """2012–2025; the instrument flew from late 2011."""
        return list(range(FIRST_VNL_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Cell-mean radiance, blurred by the sensor footprint, background masked to 0."""
        assert year is not None
        grid = geographic_grid(world, CELL_DEGREES, LATTICE_ORIGIN)
        radiance = np.empty((grid.height, grid.width), dtype=np.float32)
        outside = np.empty((grid.height, grid.width), dtype=bool)
        peak = world.peak_density
        for rows, pts, off_world in supersampled_blocks(world, grid, self.supersample, 64):
            urban = world.urban_intensity(pts, year)
            residents = world.population_density(pts, year)
            _, nonres_volume = world.built_volume(pts, year)
            glow = 18.0 * residents / peak + 4.0 * nonres_volume + 2.5 * urban
            radiance[rows] = block_mean(glow, self.supersample)
            outside[rows] = off_world
        self._add_point_sources(world, year, grid, radiance)
        rng = world.rng("vnl-noise")  # fixed fixtures: stadiums, rail yards, dark parks
        fixtures = np.exp(rng.normal(0, 0.25, radiance.shape)).astype(np.float32)
        yearly = np.exp(world.rng("vnl-year", year).normal(0, 0.06, radiance.shape))
        growth = 1.012 ** (year - FIRST_VNL_YEAR)
        radiance = ndimage.gaussian_filter(radiance * fixtures, 0.8, mode="nearest")
        radiance = (radiance * yearly * growth).astype(np.float32)
        radiance[radiance < BACKGROUND_MASK] = 0.0
        rare = rare_cells(world, "vnl-nodata", year, radiance.shape)
        radiance[outside | rare] = NODATA
        name = vnl_name(year)
        layer = RasterLayer(
            role="data",
            filename=f"{name}.tif",
            data=radiance[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("average_masked",),
            units="nW/cm2/sr",
            title="Annual average night-time radiance, background masked",
        )
        return annual_item(
            f"{name}_{world.city}",
            (layer,),
            year,
            properties={"vnl:version": "2.1" if year <= 2021 else "2.2"},
            extra={"units": "nW/cm2/sr", "nodata": str(NODATA)},
        )

    @staticmethod
    def _add_point_sources(
        world: SyntheticCity, year: int, grid: GeoBox, radiance: np.ndarray
    ) -> None:
        """Ports, plants and refineries: floodlit sites brighter than their surroundings."""
        for row, col, _ in point_source_cells(world, year, grid):
            radiance[row, col] += np.float32(60.0)
