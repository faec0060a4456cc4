"""Sample Landsat C2 L2 derived annual layers: NDVI and surface temperature (Kelvin).

Both sit on exactly the pixel grid of the same year's ``landsat_c2l2`` scene and inherit its
gaps: swath edges, Landsat 7 SLC-off stripes, opaque and dilated cloud and cloud shadow (the
QA_PIXEL bits 0, 1, 3 and 4 the optical modality rejects) are nodata -9999. The gaps come from
``sources.sample.landsat`` itself, so the three products can never drift apart.

NDVI follows the world's vegetation (high over woodland and fields, low over roofs, negative
over water); a handful of finite values lie just outside [-1, 1] as in real composites, where
they are valid and only clipped when rendered. Surface temperature follows the city's climate
(shared with the weather products), a surface urban heat island, cool water and vegetation,
and elevation. Its record has holes: each city misses as many years as its sample calendar
says (none to four; Shanghai ten), but every city except Shanghai keeps every year of
2010–2024, as AgenticCity-Bench's 15-city LST forecasting cohort needs.
"""

from __future__ import annotations

import numpy as np

from citycube.errors import SourceUnavailableError
from sources.sample.calendar import city_calendar
from sources.sample.landsat import (
    PIXEL_SIZE_M,
    Scene,
    fill_mask,
    grain_field,
    ground_cover,
    landsat_scene,
    woodedness,
)
from sources.sample.weather import LAPSE_RATE_C_PER_M, city_climate, year_anomaly
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    WorldPoints,
    row_blocks,
    row_window,
    stable_hash,
)

NODATA = -9999.0
"""Nodata of both products."""
KELVIN = 273.15
"""0 °C in Kelvin."""
ST_CORE_YEARS = range(2010, 2025)
"""Years the forecasting cases need without a hole."""
ST_CORE_INCOMPLETE = frozenset({"Shanghai"})
"""Cities whose record may miss core years: AgenticCity-Bench's LST forecasting cohort spans the
other
15 cities, each with tiles valid in every year of 2010-2024."""
ST_INCOMPLETE_MISSING = 4
"""Years of 2010–2024 a city of ``ST_CORE_INCOMPLETE`` misses at least."""

_VEG_NDVI = {
    "temperate": 0.62,
    "subtropical": 0.64,
    "tropical": 0.70,
    "mediterranean": 0.52,
    "semiarid": 0.42,
}
"""NDVI of open vegetation per climate; woodland adds to it."""


def scene_gaps(
    world: SyntheticCity, year: int, scene: Scene, pts: WorldPoints, start: int, stop: int
) -> np.ndarray:
    """Pixels of rows [start, stop) the optical modality would reject: fill, cloud, shadow."""
    sky = scene.sky.rows(start, stop)
    fill = fill_mask(world, year, scene.sensor, pts) | ~pts.inside
    return fill | sky.cloud | sky.dilated | sky.shadow


def _require_year(product: str, world: SyntheticCity, year: int, years: list[int]) -> None:
    if year not in years:
        raise SourceUnavailableError(
            f"{product} has no source year {year} for {world.city}; "
            f"it covers {', '.join(str(y) for y in years)}",
            reason="source_year_missing",
        )


class LandsatNdvi:
    """Annual Landsat NDVI (float32, nodata -9999) on the year's scene grid, 2000–2025."""

    product_id = "landsat_ndvi"

    def years(self) -> list[int] | None:
        """Every calendar year, like the scenes."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """NDVI from the world's cover, with the scene's gaps and a few out-of-range values."""
        assert year is not None
        scene = landsat_scene(world, year)
        grid = scene.grid
        grain = grain_field(world, (grid.height, grid.width))
        veg_base = _VEG_NDVI[world.traits.climate]
        anomaly = year_anomaly(world, year)
        shift = np.float32(
            0.08 * (anomaly.prcp_factor - 1) + world.rng("ndvi-year", year).normal(0, 0.015)
        )
        ndvi = np.empty((grid.height, grid.width), dtype=np.float32)
        for start, stop in row_blocks(grid.height):
            pts = world.grid_points(row_window(grid, start, stop))
            g = grain[start:stop]
            urban, green, bare = ground_cover(world, pts, year)
            total = np.maximum(urban + green + bare, 1e-6)
            wooded = woodedness(pts)
            vegetation = (
                veg_base
                + 0.18 * wooded
                + 0.04 * np.tanh(3 * pts.field("crop"))
                + 0.03 * pts.field("texture")
            )
            land = (urban * 0.06 + green * vegetation + bare * 0.14) / total
            land = np.clip(land + shift + 0.035 * g, -0.2, 0.95)
            sea = np.clip(-0.30 + 0.04 * g, -0.6, 0.1)
            river = np.clip(-0.12 + 0.04 * g, -0.6, 0.1)
            values = np.where(pts.sea, sea, np.where(pts.water, river, land))
            gaps = scene_gaps(world, year, scene, pts, start, stop)
            ndvi[start:stop] = np.where(gaps, np.float32(NODATA), values)
        del grain
        _out_of_range_values(world, year, ndvi)
        layer = RasterLayer(
            role="data",
            filename=f"{scene.scene_id}_NDVI.TIF",
            data=ndvi[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("ndvi",),
            units="1",
            title="Annual NDVI (Landsat C2 L2 surface reflectance)",
        )
        return _item(scene, layer, "NDVI", {"units": "NDVI (unitless)"})


def _out_of_range_values(world: SyntheticCity, year: int, ndvi: np.ndarray) -> None:
    """A few valid pixels just above 1 (dense canopy) and just below -1 (water)."""
    rng = world.rng("ndvi-out-of-range", year)
    flat = ndvi.reshape(-1)
    valid = flat != NODATA
    for candidates, low, high in (
        (np.flatnonzero(valid & (flat > 0.8)), 1.001, 1.05),
        (np.flatnonzero(valid & (flat < -0.2)), -1.05, -1.001),
    ):
        if candidates.size == 0:
            continue
        count = min(int(rng.integers(8, 40)), candidates.size)
        chosen = rng.choice(candidates, count, replace=False)
        flat[chosen] = rng.uniform(low, high, count).astype(np.float32)


def st_years(city: str, seed: int = 0) -> list[int]:
    """Years of a city's surface-temperature record (deterministic per city and seed).

    How many years a city holds is its sample calendar's (``sources.sample.calendar``: 358
    city-years, AgenticCity-Bench Table 10's HEAT count); which years are missing is drawn from the
    seed. Cities of the forecasting cohort lose years only outside 2010–2024. A city outside
    it loses ``ST_INCOMPLETE_MISSING`` years inside 2010–2024 first, then any others.
    """
    every = list(range(FIRST_YEAR, LAST_YEAR + 1))
    missing_count = len(every) - city_calendar(city).surface_temperature
    core = [y for y in every if y in ST_CORE_YEARS]
    outside = [y for y in every if y not in ST_CORE_YEARS]
    rng = np.random.default_rng([stable_hash("landsat-st-years", city, seed)])
    if city in ST_CORE_INCOMPLETE:
        if missing_count < ST_INCOMPLETE_MISSING:
            raise ValueError(f"{city} must miss at least {ST_INCOMPLETE_MISSING} years of LST")
        missing = rng.choice(core, ST_INCOMPLETE_MISSING, replace=False).tolist()
        rest = [y for y in every if y not in missing]
        missing += rng.choice(rest, missing_count - len(missing), replace=False).tolist()
    else:
        if missing_count > len(outside):
            raise ValueError(f"{city} cannot miss {missing_count} years outside 2010–2024")
        missing = rng.choice(outside, missing_count, replace=False).tolist()
    return [y for y in every if y not in set(missing)]


class LandsatSurfaceTemperature:
    """Annual Landsat land-surface temperature, mean and median (float32 K), with missing years."""

    product_id = "landsat_st"

    def years(self) -> list[int] | None:
        """The calendar; each city misses some of these years (see ``city_years``)."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """Years the record covers for a city."""
        return st_years(city, seed)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Band 1 annual mean, band 2 annual median LST in Kelvin, with the scene's gaps."""
        assert year is not None
        _require_year(self.product_id, world, year, st_years(world.city, world.seed))
        scene = landsat_scene(world, year)
        grid = scene.grid
        grain = grain_field(world, (grid.height, grid.width))
        clim = city_climate(world)
        air = clim.tmean_c + year_anomaly(world, year).temperature_c
        # Clear-sky daytime overpasses, mostly in the warm season, run hotter than the air.
        daytime = air + 8.0 + 0.5 * (clim.diurnal_range_c - 8.0)
        base = world.traits.base_elevation_m
        bands = np.empty((2, grid.height, grid.width), dtype=np.float32)
        for start, stop in row_blocks(grid.height):
            pts = world.grid_points(row_window(grid, start, stop))
            g = grain[start:stop]
            urban, green, bare = ground_cover(world, pts, year)
            wooded = woodedness(pts)
            rise = pts.elevation - base
            land = (
                daytime
                + 9.0 * urban**1.2
                - green * (2.0 + 5.0 * wooded)
                + 2.0 * bare
                - LAPSE_RATE_C_PER_M * rise
                + 0.5 * pts.field("texture")
                + 0.6 * g
            )
            water = np.where(pts.sea, air + 3.0, air + 4.0) + 0.2 * g
            mean_c = np.where(pts.water, water, land)
            # Hot days skew the distribution: the median sits below the mean, more so in town.
            median_c = mean_c - 0.3 - 0.9 * urban + 0.15 * pts.field("texture")
            gaps = scene_gaps(world, year, scene, pts, start, stop)
            for band, values in enumerate((mean_c, median_c)):
                kelvin = (values + KELVIN).astype(np.float32)
                bands[band, start:stop] = np.where(gaps, np.float32(NODATA), kelvin)
        del grain
        layer = RasterLayer(
            role="data",
            filename=f"{scene.scene_id}_ST_ANNUAL.TIF",
            data=bands,
            grid=grid,
            nodata=NODATA,
            band_descriptions=("st_annual_mean", "st_annual_median"),
            units="K",
            title="Annual land-surface temperature (mean, median), Kelvin",
        )
        return _item(scene, layer, "ST", {"units": "K"})


def _item(scene: Scene, layer: RasterLayer, suffix: str, extra: dict[str, str]) -> GeneratedItem:
    """The item of a derived layer, tied to the scene it was derived from."""
    return GeneratedItem(
        item_id=f"{scene.scene_id}_{suffix}",
        layers=(layer,),
        timestamp=scene.acquired,
        start_datetime=None,
        end_datetime=None,
        properties={
            "platform": scene.sensor.platform,
            "instruments": list(scene.sensor.instruments),
            "landsat:scene_id": scene.scene_id,
            "gsd": PIXEL_SIZE_M,
        },
        extra={
            **extra,
            "scene_id": scene.scene_id,
            "sensor": scene.sensor.code,
            "nodata": str(NODATA),
        },
    )
