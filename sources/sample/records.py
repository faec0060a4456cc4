"""Sample official records: city electricity consumption and World Bank CPI and PPP series.

Electricity: a few cities publish building-level annual consumption (benchmarking ordinances,
utility disclosures) for their own territory only. The sample keeps that shape: records exist
only inside a reporting area (the city limit) that covers part of the tile grid, for the
city's own years, and more buildings report as the ordinance phases in. Consumption follows
the fabric's buildings: floor area (footprint × storeys) times an intensity by function, with a
slow efficiency trend, weather years and a few blank values.

World Bank: the consumer price index (FP.CPI.TOTL, 2010 = 100) and the PPP conversion factor
(PA.NUS.PPP, local currency per international dollar) for the countries of all cities, in the
API v2 JSON layout, with null values for the latest years as the real API has.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from citycube.catalogue.cities import get_city, load_cities
from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_grid
from sources.sample.layers import WGS84, CsvLayer, GeoJsonLayer, JsonLayer
from sources.sample.osm import FUNCTIONS, city_fabric, window_bounds_wgs84
from sources.sample.world import (
    FIRST_YEAR,
    LAST_YEAR,
    GeneratedItem,
    SyntheticCity,
    stable_hash,
    transformer,
    year_span,
)

# --------------------------------------------------------------------------------------------
# City electricity records.
# --------------------------------------------------------------------------------------------

ELECTRICITY_YEARS: dict[str, tuple[int, ...]] = {
    "DC": tuple(range(2010, 2024)),
    "Boston": tuple(range(2013, 2024)),
    "NYC": tuple(range(2010, 2024)),
    "London": tuple(range(2015, 2024)),
    "Sydney": tuple(range(2012, 2024)),
    "Tokyo": tuple(range(2005, 2024)),
    "Singapore": tuple(range(2005, 2024)),
    "SanFrancisco": tuple(range(2011, 2024)),
}
"""Years with official records per city (111 city-years); other cities publish none."""

REPORTING_AREA: dict[str, tuple[str, float]] = {
    "DC": ("diamond", 0.30),
    "Boston": ("lobed", 0.30),
    "NYC": ("lobed", 0.32),
    "London": ("lobed", 0.55),
    "Sydney": ("lobed", 0.20),
    "Tokyo": ("lobed", 0.50),
    "Singapore": ("lobed", 0.50),
    "SanFrancisco": ("lobed", 0.15),
}
"""Shape of the city limit and its area as a share of the city's 2 km grid."""

KWH_PER_M2: dict[str, float] = {
    "residential": 45.0,
    "commercial": 210.0,
    "education": 95.0,
    "healthcare": 330.0,
    "food": 480.0,
    "civic": 120.0,
    "transport": 60.0,
    "leisure": 190.0,
    "industrial": 170.0,
    "religious": 40.0,
    "other": 25.0,
}
"""Typical annual electricity use per m² of floor area by building function."""
BLANK_SHARE = 0.025
"""Share of records published without a consumption value."""


def reporting_area(world: SyntheticCity) -> shapely.Polygon:
    """The city limit in the city's UTM CRS: part of the 2 km grid, never all of it."""
    shape, share = REPORTING_AREA[world.city]
    grid = city_grid(world.city, "2km")
    xmin, ymin, xmax, ymax = grid.bounds
    target = share * (xmax - xmin) * (ymax - ymin)
    rng = world.rng("electricity-area")
    cx = world.centre_xy[0] + rng.uniform(-1000, 1000)
    cy = world.centre_xy[1] + rng.uniform(-1000, 1000)
    if shape == "diamond":
        half_diagonal = math.sqrt(target / 2)
        return shapely.Polygon(
            [
                (cx, cy + half_diagonal),
                (cx + half_diagonal, cy),
                (cx, cy - half_diagonal),
                (cx - half_diagonal, cy),
            ]
        )
    theta = np.linspace(0, 2 * math.pi, 361)[:-1]
    radius = np.ones_like(theta)
    for k in range(2, 6):
        radius += (0.14 / k) * np.sin(k * theta + rng.uniform(0, 2 * math.pi))
    area = 0.5 * np.sum(radius**2) * (2 * math.pi / len(theta))
    radius *= math.sqrt(target / area)
    return shapely.Polygon(np.stack([cx + radius * np.cos(theta), cy + radius * np.sin(theta)], 1))


def electricity_records(world: SyntheticCity, year: int) -> tuple[pd.DataFrame, shapely.Polygon]:
    """(records, reporting area in WGS84) for one city and year."""
    area_utm = reporting_area(world)
    to_wgs84 = transformer(world.crs, "EPSG:4326")
    area_wgs84 = shapely.transform(
        shapely.segmentize(area_utm, 100.0), lambda xy: np.stack(to_wgs84.transform(*xy.T), 1)
    )
    stock = city_fabric(world).buildings
    first = ELECTRICITY_YEARS[world.city][0]
    phase = year - first
    cx, cy = stock.centre
    lon, lat = to_wgs84.transform(cx, cy)
    lon, lat = np.round(lon, 6), np.round(lat, 6)
    inside = shapely.contains_xy(shapely.buffer(area_utm, -10.0), cx, cy) & shapely.contains_xy(
        area_wgs84, lon, lat
    )
    floor_area = stock.footprint_m2 * stock.storeys
    # Ordinances start with the largest buildings; a utility sample adds small ones.
    threshold = 4000.0 if phase < 2 else 2500.0 if phase < 4 else 1200.0
    rng = world.rng("electricity-buildings")
    sampled = rng.random(len(cx)) < 0.08 + 0.01 * min(phase, 10)
    building_factor = rng.lognormal(0.0, 0.35, len(cx))
    reports = np.flatnonzero(inside & (stock.built <= year) & ((floor_area >= threshold) | sampled))
    intensity = np.array([KWH_PER_M2[f] for f in FUNCTIONS])[stock.function[reports]]
    year_rng = world.rng("electricity-year", year)
    weather = 1.0 + year_rng.normal(0.0, 0.03)
    trend = (1 - 0.012) ** (year - FIRST_YEAR)
    kwh = (
        floor_area[reports]
        * intensity
        * building_factor[reports]
        * trend
        * weather
        * year_rng.lognormal(0.0, 0.06, len(reports))
    )
    kwh = np.round(kwh, 0)
    kwh[year_rng.random(len(reports)) < BLANK_SHARE] = np.nan
    frame = pd.DataFrame(
        {
            "building_id": [f"{world.city.upper()}-{i + 1:07d}" for i in reports],
            "lon": lon[reports],
            "lat": lat[reports],
            "year": np.full(len(reports), year, dtype=np.int64),
            "kwh": kwh,
        }
    )
    return frame, area_wgs84


class CityElectricity:
    """Official building-level electricity records (CSV) plus their reporting area (GeoJSON)."""

    product_id = "city_electricity"

    def years(self) -> list[int] | None:
        """Union of the publishing cities' years; ``city_years`` gives one city's."""
        return sorted({y for years in ELECTRICITY_YEARS.values() for y in years})

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """Record years of one city (empty when it publishes none)."""
        return list(ELECTRICITY_YEARS.get(city, ()))

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """The year's records inside the city limit, and the city limit itself."""
        if year is None:
            raise ValueError(f"{self.product_id} is not static; pass one of its source years")
        if world.city not in ELECTRICITY_YEARS:
            raise SourceUnavailableError(
                f"{self.product_id}: {world.city} publishes no electricity records; cities with "
                f"records are {', '.join(sorted(ELECTRICITY_YEARS))}",
                reason="outside_source_coverage",
            )
        if year not in ELECTRICITY_YEARS[world.city]:
            years = ELECTRICITY_YEARS[world.city]
            raise SourceUnavailableError(
                f"{self.product_id} has no {year} records for {world.city}; it has "
                f"{years[0]}–{years[-1]}",
                reason="source_year_missing",
            )
        frame, area = electricity_records(world, year)
        west, south, east, north = (float(v) for v in area.bounds)
        name = get_city(world.city).name
        coverage = gpd.GeoDataFrame(
            {"name": [f"{name} reporting area"], "kind": ["city limit"]},
            geometry=[area],
            crs=WGS84,
        )
        stem = f"{world.city.lower()}_building_electricity"
        layers = (
            CsvLayer(
                role="data",
                filename=f"{stem}_{year}.csv",
                title=f"{name} building electricity consumption {year} (kWh)",
                frame=frame,
                fallback_bounds=(west, south, east, north),
            ),
            GeoJsonLayer(
                role="coverage",
                filename=f"{stem}_reporting_area.geojson",
                title=f"{name} reporting area (city limit)",
                frame=coverage,
            ),
        )
        start, end = year_span(year)
        return GeneratedItem(
            item_id=f"{stem}_{year}",
            layers=layers,
            timestamp=None,
            start_datetime=start,
            end_datetime=end,
            properties={},
            extra={
                "units": "kWh/year",
                "records": str(len(frame)),
                "blank_values": str(int(frame["kwh"].isna().sum())),
            },
        )


# --------------------------------------------------------------------------------------------
# World Bank CPI and PPP.
# --------------------------------------------------------------------------------------------

CPI_ID, CPI_NAME = "FP.CPI.TOTL", "Consumer price index (2010 = 100)"
PPP_ID, PPP_NAME = "PA.NUS.PPP", "PPP conversion factor, GDP (LCU per international $)"
SOURCE_NAME = "CityCube synthetic sample"
"""Stands where the API names its source (World Development Indicators)."""
LAST_UPDATED = "2025-07-01"
"""Nominal update date in the page metadata."""

# iso3: (iso2, API country name, mean inflation % per year, PPP factor in 2017).
COUNTRIES: dict[str, tuple[str, str, float, float]] = {
    "AUS": ("AU", "Australia", 2.7, 1.47),
    "CHL": ("CL", "Chile", 3.4, 400.0),
    "CHN": ("CN", "China", 2.1, 4.18),
    "FRA": ("FR", "France", 1.5, 0.78),
    "GBR": ("GB", "United Kingdom", 2.2, 0.70),
    "JPN": ("JP", "Japan", 0.2, 102.0),
    "KOR": ("KR", "Korea, Rep.", 2.5, 870.0),
    "NLD": ("NL", "Netherlands", 1.9, 0.80),
    "NZL": ("NZ", "New Zealand", 2.3, 1.45),
    "SGP": ("SG", "Singapore", 1.6, 0.86),
    "USA": ("US", "United States", 2.4, 1.0),
    "ZAF": ("ZA", "South Africa", 5.5, 6.6),
}
"""Country facts the synthetic series are shaped by."""
INFLATION_SHOCKS = {2008: 1.6, 2009: -1.8, 2015: -0.8, 2020: -0.6, 2021: 1.5, 2022: 4.2, 2023: 1.8}
"""Percentage points added to every country's inflation in these years."""
MISSING: dict[str, dict[int, frozenset[str]]] = {
    CPI_ID: {LAST_YEAR: frozenset(COUNTRIES), LAST_YEAR - 1: frozenset({"NZL", "SGP"})},
    PPP_ID: {LAST_YEAR: frozenset(COUNTRIES), LAST_YEAR - 1: frozenset({"CHL", "ZAF"})},
}
"""Indicator → year → countries whose value is null (not yet published)."""


def _country_facts(iso3: str) -> tuple[str, str, float, float]:
    return COUNTRIES.get(iso3, (iso3[:2], iso3, 2.5, 1.0))


def indicator_series(seed: int = 0) -> dict[str, dict[str, dict[int, float | None]]]:
    """Indicator → iso3 → year → value for the countries of all cities (None = null)."""
    countries = sorted({c.iso3 for c in load_cities().values()})
    years = np.arange(FIRST_YEAR, LAST_YEAR + 1)
    rng = np.random.default_rng([stable_hash("worldbank-indicators"), seed])
    shocks = np.array([INFLATION_SHOCKS.get(int(y), 0.0) for y in years])
    cpi: dict[str, np.ndarray] = {}
    for iso3 in countries:
        rate = _country_facts(iso3)[2] + shocks + rng.normal(0.0, 0.5, len(years))
        index = np.cumprod(1 + np.r_[0.0, rate[1:]] / 100.0)
        cpi[iso3] = 100.0 * index / index[years == 2010][0]
    us = cpi.get("USA", cpi[countries[0]])
    series: dict[str, dict[str, dict[int, float | None]]] = {CPI_ID: {}, PPP_ID: {}}
    base = int(np.flatnonzero(years == 2017)[0])
    for iso3 in countries:
        ppp_2017 = _country_facts(iso3)[3]
        if iso3 == "USA":
            ppp = np.ones(len(years))
        else:
            relative = (cpi[iso3] / cpi[iso3][base]) / (us / us[base])
            drift = np.exp(np.cumsum(rng.normal(0.0, 0.01, len(years))))
            ppp = ppp_2017 * relative * drift / drift[base]
        for indicator, values, digits in ((CPI_ID, cpi[iso3], 3), (PPP_ID, ppp, 4)):
            missing = MISSING[indicator]
            series[indicator][iso3] = {
                int(y): None if iso3 in missing.get(int(y), ()) else round(float(v), digits)
                for y, v in zip(years, values, strict=True)
            }
    return series


def api_response(
    series: dict[str, dict[str, dict[int, float | None]]], indicators: tuple[str, ...]
) -> list[object]:
    """A World Bank API v2 JSON response: [page metadata, records] (countries A–Z, years down)."""
    names = {CPI_ID: CPI_NAME, PPP_ID: PPP_NAME}
    decimals = {CPI_ID: 1, PPP_ID: 2}
    records = []
    for indicator in indicators:
        by_country = series[indicator]
        for iso3 in sorted(by_country, key=lambda c: _country_facts(c)[1]):
            iso2, country, _, _ = _country_facts(iso3)
            for year in sorted(by_country[iso3], reverse=True):
                records.append(
                    {
                        "indicator": {"id": indicator, "value": names[indicator]},
                        "country": {"id": iso2, "value": country},
                        "countryiso3code": iso3,
                        "date": str(year),
                        "value": by_country[iso3][year],
                        "unit": "",
                        "obs_status": "",
                        "decimal": decimals[indicator],
                    }
                )
    meta = {
        "page": 1,
        "pages": 1,
        "per_page": len(records),
        "total": len(records),
        "sourceid": "2",
        "sourcename": SOURCE_NAME,
        "lastupdated": LAST_UPDATED,
    }
    return [meta, records]


class WorldBankIndicators:
    """World Bank CPI and PPP conversion factor (API v2 JSON), static and the same everywhere."""

    product_id = "worldbank_indicators"

    def years(self) -> list[int] | None:
        """Static: the series cover 2000–2025 inside one download."""
        return None

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Both indicators together ('data') and one response per indicator ('cpi', 'ppp')."""
        series = indicator_series(world.seed)
        footprint = window_bounds_wgs84(world)
        layers = (
            JsonLayer(
                role="data",
                filename="worldbank_indicators.json",
                title="World Bank CPI and PPP conversion factor",
                payload=api_response(series, (CPI_ID, PPP_ID)),
                tag_path=(0,),
                crs=WGS84,
                bounds=footprint,
            ),
            *(
                JsonLayer(
                    role=role,
                    filename=f"worldbank_{indicator}.json",
                    title=name,
                    payload=api_response(series, (indicator,)),
                    tag_path=(0,),
                    extra_fields={"worldbank:indicator": indicator},
                )
                for role, indicator, name in (("cpi", CPI_ID, CPI_NAME), ("ppp", PPP_ID, PPP_NAME))
            ),
        )
        return GeneratedItem(
            item_id="worldbank_indicators",
            layers=layers,
            timestamp=None,
            start_datetime=datetime(FIRST_YEAR, 1, 1, tzinfo=UTC),
            end_datetime=datetime(LAST_YEAR, 12, 31, 23, 59, 59, tzinfo=UTC),
            properties={"worldbank:indicators": [CPI_ID, PPP_ID]},
            extra={"countries": ",".join(sorted(series[CPI_ID])), "base_year_cpi": "2010"},
        )
