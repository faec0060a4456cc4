"""Sample annual weather: CHELSA v2.1 (global, 30″) and Daymet v4 (North America, 1 km LCC).

Both products sample one climate per city: a plausible annual climatology for the place, a
shared year anomaly (so CHELSA, Daymet and Landsat surface temperature agree on warm and wet
years), a warming trend, and local effects from the synthetic world — lapse rate with
elevation, a nocturnal urban heat island, coastal moderation, orographic rain. Like the real
products they cover land only: cells that are mostly sea are nodata.

CHELSA ships one GeoTIFF per variable as scaled integers (``value * scale + offset``), on the
CHELSA lattice whose corners sit half an arc-second off whole degrees (origin
-180.00013888885°, 83.99986111115°), so its cell edges never meet other products' edges.
Daymet ships physical float32 values per variable on its own Lambert conformal conic 1 km
lattice and exists only for North America; other cities get
``SourceUnavailableError(reason='outside_source_coverage')``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from pyproj import CRS
from scipy import ndimage

from citycube.catalogue.cities import get_city
from citycube.errors import SourceUnavailableError
from citycube.items.cog import COG_MEDIA_TYPE, cog_profile
from sources.sample.grids import (
    OnGrid,
    geographic_grid,
    lattice_grid,
    projection_fields,
    rare_cells,
    supersampled_blocks,
)
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    annual_item,
    block_mean,
)

LAPSE_RATE_C_PER_M = 0.0065
"""Standard-atmosphere temperature decrease with height."""

# --------------------------------------------------------------------------------------------
# The climate every weather-like product samples.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CityClimate:
    """Annual climatology of a city's plain (circa 2000)."""

    tmean_c: float
    """Annual mean of the daily mean air temperature, °C."""
    diurnal_range_c: float
    """Annual mean of daily maximum minus daily minimum, °C."""
    prcp_mm: float
    """Annual precipitation total, mm."""
    srad_w_m2: float
    """Annual mean downward shortwave radiation at the surface, W/m²."""
    rh_pct: float
    """Annual mean near-surface relative humidity, %."""


CITY_CLIMATE: dict[str, CityClimate] = {
    "Amsterdam": CityClimate(10.5, 7.5, 850, 115, 82),
    "Boston": CityClimate(10.9, 9.0, 1100, 160, 68),
    "Busan": CityClimate(15.0, 7.5, 1520, 165, 66),
    "CapeTown": CityClimate(17.0, 9.5, 520, 215, 72),
    "Christchurch": CityClimate(12.2, 10.0, 620, 160, 76),
    "DC": CityClimate(14.5, 10.0, 1050, 170, 65),
    "London": CityClimate(11.5, 8.0, 620, 120, 77),
    "Lyon": CityClimate(12.5, 10.0, 830, 150, 73),
    "NYC": CityClimate(13.0, 8.5, 1200, 165, 64),
    "SanFrancisco": CityClimate(14.5, 8.0, 600, 200, 73),
    "Santiago": CityClimate(14.5, 14.0, 330, 220, 62),
    "Shanghai": CityClimate(17.0, 7.5, 1200, 145, 75),
    "Singapore": CityClimate(27.5, 7.0, 2400, 190, 83),
    "Sydney": CityClimate(18.0, 8.0, 1200, 195, 68),
    "Tokyo": CityClimate(16.0, 8.0, 1530, 155, 67),
    "XiongAn": CityClimate(13.0, 12.0, 520, 165, 58),
}
"""Per-city climatology; cities not listed get one from their latitude."""


def city_climate(world: SyntheticCity) -> CityClimate:
    """The city's climatology, from the table or (for other cities) from latitude."""
    if world.city in CITY_CLIMATE:
        return CITY_CLIMATE[world.city]
    lat = abs(world.latitude)
    return CityClimate(
        tmean_c=28.0 - 0.0075 * lat**2,
        diurnal_range_c=12.0 if world.traits.climate == "semiarid" else 8.5,
        prcp_mm=450.0 if world.traits.climate == "semiarid" else 900.0,
        srad_w_m2=250.0 * math.cos(math.radians(lat)) ** 0.8,
        rh_pct=58.0 if world.traits.climate == "semiarid" else 72.0,
    )


@dataclass(frozen=True)
class YearAnomaly:
    """How one year departs from the climatology (shared by every weather-like product)."""

    temperature_c: float
    """Warming trend since 2000 plus interannual noise, °C."""
    prcp_factor: float
    """Multiplier of annual precipitation."""
    srad_factor: float
    """Multiplier of shortwave radiation (wet years are duller)."""
    rh_pct: float
    """Added relative humidity, percentage points."""


def year_anomaly(world: SyntheticCity, year: int) -> YearAnomaly:
    """The city's weather anomaly for a year: +0.025 °C/year trend, wet years duller and humid."""
    rng = world.rng("weather-anomaly", year)
    wet = float(np.exp(rng.normal(0.0, 0.15)))
    return YearAnomaly(
        temperature_c=0.025 * (year - FIRST_YEAR) + float(rng.normal(0.0, 0.45)),
        prcp_factor=wet,
        srad_factor=float(1.0 + rng.normal(0.0, 0.025) - 0.08 * (wet - 1.0)),
        rh_pct=float(rng.normal(0.0, 1.2) + 6.0 * (wet - 1.0)),
    )


@dataclass(frozen=True)
class ClimateFields:
    """Annual weather fields on a product grid, in physical units."""

    tmin_c: np.ndarray
    """Annual mean of the daily minimum temperature, °C."""
    tmax_c: np.ndarray
    """Annual mean of the daily maximum temperature, °C."""
    tmean_c: np.ndarray
    """Annual mean temperature, (tmin + tmax) / 2, °C."""
    prcp_mm: np.ndarray
    """Annual precipitation total, mm."""
    srad_w_m2: np.ndarray
    """Annual mean shortwave radiation, W/m²."""
    rh_pct: np.ndarray
    """Annual mean relative humidity, %."""
    no_land: np.ndarray
    """Cells that are mostly sea or off the world: nodata, as in the land-only products."""


def climate_fields(
    world: SyntheticCity, grid: GeoBox, year: int, supersample: int = 4
) -> ClimateFields:
    """Evaluate the city's weather on a ~1 km grid (cell means of the world's surface)."""
    shape = (grid.height, grid.width)
    elevation = np.empty(shape, dtype=np.float32)
    urban = np.empty(shape, dtype=np.float32)
    sea = np.empty(shape, dtype=np.float32)
    coast = np.empty(shape, dtype=np.float32)
    outside = np.empty(shape, dtype=bool)
    for rows, pts, off_world in supersampled_blocks(world, grid, supersample, 64):
        elevation[rows] = block_mean(pts.elevation, supersample)
        urban[rows] = block_mean(world.urban_intensity(pts, year), supersample)
        sea[rows] = block_mean(pts.sea, supersample)
        coast[rows] = block_mean(pts.field("coast_distance"), supersample)
        outside[rows] = off_world
    # Air mixes: the heat island is a smoothed footprint of the built-up area.
    heat_island = ndimage.gaussian_filter(urban, 1.2, mode="nearest")
    clim = city_climate(world)
    anomaly = year_anomaly(world, year)
    rise = np.maximum(elevation - world.traits.base_elevation_m, 0)
    coastal = np.exp(-coast / 6000.0)
    middle = clim.tmean_c + anomaly.temperature_c - LAPSE_RATE_C_PER_M * rise
    half_range = 0.5 * clim.diurnal_range_c * (1 - 0.25 * coastal) - 0.2 * heat_island
    tmin = middle - half_range + 1.1 * heat_island + 0.3 * coastal
    tmax = middle + half_range + 0.5 * heat_island - 0.3 * coastal
    prcp = clim.prcp_mm * anomaly.prcp_factor * (1 + 0.0008 * rise) * (1 + 0.04 * heat_island)
    srad = clim.srad_w_m2 * anomaly.srad_factor * (1 - 0.03 * heat_island) * (1 - 0.00008 * rise)
    rh = clim.rh_pct + anomaly.rh_pct + 6 * coastal - 4 * heat_island - 0.002 * rise
    return ClimateFields(
        tmin_c=tmin.astype(np.float32),
        tmax_c=tmax.astype(np.float32),
        tmean_c=((tmin + tmax) / 2).astype(np.float32),
        prcp_mm=np.maximum(prcp, 0).astype(np.float32),
        srad_w_m2=np.maximum(srad, 0).astype(np.float32),
        rh_pct=np.clip(rh, 5, 100).astype(np.float32),
        no_land=(sea >= 0.5) | outside,
    )


# --------------------------------------------------------------------------------------------
# CHELSA: scaled-integer GeoTIFFs, which RasterLayer cannot express, so a layer of its own.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaledCogLayer(OnGrid):
    """A single-band integer COG whose physical value is ``raw * scale + offset``."""

    role: str
    """Role in the item (the variable name)."""
    filename: str
    """File name inside the item directory."""
    raw: np.ndarray
    """Stored integers (rows, cols)."""
    grid: GeoBox
    """Where the pixels are."""
    nodata: int
    """Raw nodata value."""
    scale: float
    """GDAL scale of the band."""
    offset: float
    """GDAL offset of the band."""
    units: str
    """Unit of ``raw * scale + offset``."""
    description: str
    """Band description."""
    title: str
    """Human-readable title of the asset."""
    media_type: str = COG_MEDIA_TYPE
    """IANA media type for the STAC asset."""

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write a DEFLATE COG with scale, offset, unit and the synthetic tags; check them."""
        profile = cog_profile(self.grid, 1, self.raw.dtype, self.nodata, categorical=False)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(self.raw, 1)
            dst.scales = (self.scale,)
            dst.offsets = (self.offset,)
            dst.units = (self.units,)
            dst.set_band_description(1, self.description)
            dst.update_tags(**tags, CITYCUBE_UNITS=self.units)
            dst.update_tags(1, units=self.units)
        with rasterio.open(path) as check:
            if check.scales != (self.scale,) or check.offsets != (self.offset,):
                raise RuntimeError(
                    f"{path} lost its scale/offset on write ({check.scales}, {check.offsets}); "
                    "the GDAL COG driver must keep band scale and offset"
                )

    def stac_fields(self) -> dict[str, object]:
        """Raster and projection fields of the asset (scale and offset included)."""
        return {
            "raster:bands": [
                {
                    "name": self.description,
                    "nodata": self.nodata,
                    "data_type": self.raw.dtype.name,
                    "unit": self.units,
                    "scale": self.scale,
                    "offset": self.offset,
                }
            ],
            **projection_fields(self.grid),
        }


CHELSA_CELL_DEGREES = 1 / 120
"""30 arc-second cell size."""
CHELSA_ORIGIN = (-180.00013888885, 83.99986111115)
"""Upper-left corner of the global CHELSA v2.1 grid (half an arc-second off whole degrees)."""
CHELSA_NODATA = 65535
"""Raw nodata of every CHELSA variable."""


@dataclass(frozen=True)
class ChelsaVariable:
    """How one CHELSA variable is stored."""

    name: str
    """Variable (and role) name."""
    scale: float
    """value = raw * scale + offset."""
    offset: float
    """value = raw * scale + offset."""
    units: str
    """Unit of the scaled value."""
    title: str
    """Asset title."""


CHELSA_VARIABLES: tuple[ChelsaVariable, ...] = (
    ChelsaVariable("tasmin", 0.1, -273.15, "degC", "Annual mean daily minimum air temperature"),
    ChelsaVariable("tasmax", 0.1, -273.15, "degC", "Annual mean daily maximum air temperature"),
    ChelsaVariable("tas", 0.1, -273.15, "degC", "Annual mean daily mean air temperature"),
    ChelsaVariable("pr", 0.1, 0.0, "mm", "Annual precipitation total"),
    ChelsaVariable("rsds", 0.1, 0.0, "W m-2", "Annual mean surface downwelling shortwave"),
    ChelsaVariable("hurs", 0.01, 0.0, "%", "Annual mean near-surface relative humidity"),
)
"""Roles, storage and units of the CHELSA files (uint16, nodata 65535)."""


def encode(values: np.ndarray, variable: ChelsaVariable, invalid: np.ndarray) -> np.ndarray:
    """Physical values as CHELSA's uint16 raw integers, with nodata where invalid."""
    raw = np.rint((values.astype(np.float64) - variable.offset) / variable.scale)
    raw = np.clip(raw, 0, CHELSA_NODATA - 1).astype(np.uint16)
    raw[invalid] = CHELSA_NODATA
    return raw


class Chelsa:
    """CHELSA v2.1 annual climate (one scaled uint16 GeoTIFF per variable), 2000–2025."""

    product_id = "chelsa"
    supersample = 4

    def years(self) -> list[int] | None:
        """Every calendar year (global product, every city)."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Six variables; sea cells and a few failed cells are nodata 65535."""
        assert year is not None
        grid = geographic_grid(world, CHELSA_CELL_DEGREES, CHELSA_ORIGIN)
        fields = climate_fields(world, grid, year, self.supersample)
        invalid = fields.no_land | rare_cells(world, "chelsa-nodata", year, fields.no_land.shape)
        values = {
            "tasmin": fields.tmin_c,
            "tasmax": fields.tmax_c,
            "tas": fields.tmean_c,
            "pr": fields.prcp_mm,
            "rsds": fields.srad_w_m2,
            "hurs": fields.rh_pct,
        }
        layers = tuple(
            ScaledCogLayer(
                role=v.name,
                filename=f"CHELSA_{v.name}_{year}_V.2.1.tif",
                raw=encode(values[v.name], v, invalid),
                grid=grid,
                nodata=CHELSA_NODATA,
                scale=v.scale,
                offset=v.offset,
                units=v.units,
                description=v.name,
                title=v.title,
            )
            for v in CHELSA_VARIABLES
        )
        return annual_item(
            f"CHELSA_V.2.1_annual_{year}_{world.city}",
            layers,
            year,
            properties={"chelsa:version": "2.1"},
            extra={
                "units": "tasmin/tasmax/tas degC, pr mm/year, rsds W/m2, hurs % (scaled uint16)",
                "nodata": str(CHELSA_NODATA),
            },
        )


# --------------------------------------------------------------------------------------------
# Daymet: physical float32 GeoTIFFs in Daymet's Lambert conformal conic CRS.
# --------------------------------------------------------------------------------------------

DAYMET_PROJ = (
    "+proj=lcc +lat_1=25 +lat_2=60 +lat_0=42.5 +lon_0=-100 +x_0=0 +y_0=0 "
    "+ellps=WGS84 +units=m +no_defs"
)
"""Daymet v4 CRS."""
DAYMET_CELL_M = 1000.0
"""Daymet cell size."""
DAYMET_ORIGIN = (-4_560_750.0, 4_984_500.0)
"""Upper-left corner of the Daymet v4 North America grid (cell corners on …250 m / …500 m)."""
DAYMET_NODATA = -9999.0
"""Nodata of every Daymet variable."""
DAYMET_DOMAIN = (-179.0, 14.0, -52.0, 83.0)
"""(west, south, east, north) of the Daymet North America domain, degrees."""

DAYMET_VARIABLES: tuple[tuple[str, str, str, str], ...] = (
    ("tmin", "annavg", "degC", "Annual mean daily minimum temperature"),
    ("tmax", "annavg", "degC", "Annual mean daily maximum temperature"),
    ("tmean", "annavg", "degC", "Annual mean daily mean temperature"),
    ("prcp", "annttl", "mm", "Annual precipitation total"),
    ("srad", "annavg", "W/m2", "Annual mean daylight shortwave radiation"),
    ("rh", "annavg", "%", "Annual mean relative humidity"),
)
"""(role, aggregate, unit, title) of the Daymet files."""


def daymet_covers(city: str) -> bool:
    """Whether a city lies in the Daymet North America domain."""
    centre = get_city(city).centre
    west, south, east, north = DAYMET_DOMAIN
    return west <= centre.lon <= east and south <= centre.lat <= north


class Daymet:
    """Daymet v4 annual summaries (float32 per variable, LCC 1 km), North America, 2000–2025."""

    product_id = "daymet"
    supersample = 4

    def years(self) -> list[int] | None:
        """Every calendar year (only for cities inside the domain; see ``city_years``)."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1))

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """Years covered for a city: all of them inside North America, none elsewhere."""
        return list(range(FIRST_YEAR, LAST_YEAR + 1)) if daymet_covers(city) else []

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Six physical variables; sea cells and a few failed cells are nodata -9999."""
        assert year is not None
        if not daymet_covers(world.city):
            raise SourceUnavailableError(
                f"daymet covers North America only; {world.city} is outside its domain "
                "(use chelsa there)",
                reason="outside_source_coverage",
            )
        grid = lattice_grid(
            world, CRS.from_proj4(DAYMET_PROJ), (DAYMET_CELL_M, DAYMET_CELL_M), DAYMET_ORIGIN
        )
        fields = climate_fields(world, grid, year, self.supersample)
        invalid = fields.no_land | rare_cells(world, "daymet-nodata", year, fields.no_land.shape)
        # Daymet interpolates station data, so its minima run a little cooler than CHELSA's.
        values = {
            "tmin": fields.tmin_c - np.float32(0.3),
            "tmax": fields.tmax_c + np.float32(0.1),
            "tmean": fields.tmean_c - np.float32(0.1),
            "prcp": fields.prcp_mm,
            "srad": fields.srad_w_m2,
            "rh": fields.rh_pct,
        }
        layers = tuple(
            RasterLayer(
                role=role,
                filename=f"daymet_v4_{role}_{aggregate}_na_{year}.tif",
                data=np.where(invalid, np.float32(DAYMET_NODATA), values[role])[None].astype(
                    np.float32
                ),
                grid=grid,
                nodata=DAYMET_NODATA,
                band_descriptions=(role,),
                units=units,
                title=title,
            )
            for role, aggregate, units, title in DAYMET_VARIABLES
        )
        return annual_item(
            f"daymet_v4_annual_na_{year}_{world.city}",
            layers,
            year,
            properties={"daymet:version": "4", "gsd": DAYMET_CELL_M},
            extra={
                "units": "tmin/tmax/tmean degC, prcp mm/year, srad W/m2, rh %",
                "nodata": str(DAYMET_NODATA),
            },
        )
