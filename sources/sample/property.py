"""Sample city property records: mean sale value per 250 m cell, in local currency.

Only some cities publish records, each for its own span of years (e.g. London 2000–2025,
Boston 2005–2024, Shanghai 2012–2023); every other city-year is unavailable. A city's file is
a float32 grid in its UTM zone (cells on a 250 m lattice from the CRS origin) with the nominal
mean value of the year's sales; cells without sales — water, open land, and more of them
towards the edge of the records' area — are nodata -9999. Values follow the built-up core,
parks and the waterfront, and rise over the years with inflation and real growth (with the
2008–2012 downturn where it happened). The currency and price year travel as GeoTIFF tags
``CURRENCY`` and ``PRICE_YEAR`` and in ``SourceItem.extra``, because conversion to 2017 PPP
dollars happens downstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from odc.geo.geobox import GeoBox
from pyproj import CRS

from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import snapped_grid
from citycube.items.cog import COG_MEDIA_TYPE
from sources.sample.grids import projection_fields, supersampled_blocks, write_cog
from sources.sample.world import (
    GeneratedItem,
    RasterLayer,
    SyntheticCity,
    block_mean,
    smoothstep,
    utm_window,
    year_span,
)

CELL_M = 250.0
"""Cell size of the gridded records."""
NODATA = -9999.0
"""Cells without sales."""


@dataclass(frozen=True)
class PropertyRecords:
    """What one city publishes and how its market moved."""

    first_year: int
    """First year of the records."""
    last_year: int
    """Last year of the records."""
    currency: str
    """ISO 4217 code of the values."""
    mean_value_2000: float
    """Mean sale value across the built-up city in 2000, local currency."""
    inflation: float
    """Consumer price inflation per year."""
    real_growth: float
    """Real price growth per year."""
    downturn: float
    """Depth of the 2008–2012 price dip (share of the price)."""

    @property
    def years(self) -> list[int]:
        """Years the records cover."""
        return list(range(self.first_year, self.last_year + 1))

    def index(self, year: int) -> float:
        """Nominal price level relative to 2000."""
        t = year - 2000
        dip = self.downturn * math.exp(-(((year - 2010.0) / 1.6) ** 2))
        return (1 + self.inflation) ** t * (1 + self.real_growth) ** t * (1 - dip)


PROPERTY_RECORDS: dict[str, PropertyRecords] = {
    "Boston": PropertyRecords(2005, 2024, "USD", 300_000, 0.024, 0.020, 0.15),
    "Busan": PropertyRecords(2006, 2025, "KRW", 150_000_000, 0.025, 0.030, 0.05),
    "CapeTown": PropertyRecords(2013, 2024, "ZAR", 900_000, 0.055, 0.020, 0.08),
    "DC": PropertyRecords(2003, 2025, "USD", 250_000, 0.024, 0.035, 0.15),
    "London": PropertyRecords(2000, 2025, "GBP", 190_000, 0.027, 0.035, 0.15),
    "Lyon": PropertyRecords(2014, 2024, "EUR", 160_000, 0.015, 0.035, 0.05),
    "NYC": PropertyRecords(2003, 2024, "USD", 380_000, 0.025, 0.025, 0.12),
    "SanFrancisco": PropertyRecords(2008, 2024, "USD", 450_000, 0.026, 0.040, 0.18),
    "Singapore": PropertyRecords(2000, 2025, "SGD", 500_000, 0.018, 0.020, 0.10),
    "Sydney": PropertyRecords(2001, 2024, "AUD", 300_000, 0.027, 0.040, 0.05),
    "Tokyo": PropertyRecords(2006, 2024, "JPY", 40_000_000, 0.003, 0.005, 0.05),
    "Shanghai": PropertyRecords(2012, 2023, "CNY", 600_000, 0.022, 0.080, 0.02),
}
"""Cities with property records, as AgenticCity-Bench Table 8 lists them plus Shanghai's collected
listings (232 city-years, Table 10's PROP count); their years equal the record portals' in
``schemas/record_products.yaml``. The other cities publish none."""


@dataclass(frozen=True)
class TaggedCogLayer:
    """A RasterLayer whose COG header carries extra dataset tags (currency, price year)."""

    raster: RasterLayer
    """Pixels and header of the file."""
    extra_tags: tuple[tuple[str, str], ...]
    """Dataset tags added to the synthetic ones."""
    media_type: str = COG_MEDIA_TYPE
    """IANA media type for the STAC asset."""

    @property
    def role(self) -> str:
        """Role in the item."""
        return self.raster.role

    @property
    def filename(self) -> str:
        """File name inside the item directory."""
        return self.raster.filename

    @property
    def title(self) -> str:
        """Human-readable title of the asset."""
        return self.raster.title

    @property
    def crs(self) -> CRS:
        """CRS of the grid."""
        return self.raster.grid.crs

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """Bounds of the grid in its CRS."""
        return self.raster.grid.boundingbox.bbox

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write with the backend's own COG writer, so the file matches every other COG."""

        write_cog(path, self.raster, {**tags, **dict(self.extra_tags)})

    def stac_fields(self) -> dict[str, object]:
        """Raster and projection fields of the asset."""
        return {"raster:bands": self.raster.stac_bands(), **projection_fields(self.raster.grid)}


def property_grid(world: SyntheticCity) -> GeoBox:
    """The city extent plus margin on the 250 m lattice of the city's UTM zone."""
    return snapped_grid(world.crs, utm_window(world), (CELL_M, CELL_M), (0.0, 0.0))


def property_years(city: str) -> list[int]:
    """Years a city's records cover (empty when it publishes none)."""
    records = PROPERTY_RECORDS.get(city)
    return records.years if records else []


class CityProperty:
    """City property records: mean sale value per 250 m cell (float32, local currency)."""

    product_id = "city_property"
    supersample = 5

    def years(self) -> list[int] | None:
        """Union of the cities' spans; a city covers only its own (see ``city_years``)."""
        first = min(r.first_year for r in PROPERTY_RECORDS.values())
        last = max(r.last_year for r in PROPERTY_RECORDS.values())
        return list(range(first, last + 1))

    def city_years(self, city: str, seed: int = 0) -> list[int]:
        """Years the city's records cover."""
        return property_years(city)

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """The year's mean sale values where sales happened."""
        assert year is not None
        records = PROPERTY_RECORDS.get(world.city)
        if records is None or year not in records.years:
            span = f"{records.first_year}–{records.last_year}" if records else "no years"
            raise SourceUnavailableError(
                f"{self.product_id} has no source year {year} for {world.city}; "
                f"its records cover {span}",
                reason="source_year_missing",
            )
        grid = property_grid(world)
        values = np.empty((grid.height, grid.width), dtype=np.float32)
        premium = np.exp(0.18 * world.rng("property-premium").standard_normal(values.shape))
        yearly = np.exp(0.06 * world.rng("property-year", year).standard_normal(values.shape))
        draws = world.rng("property-sales", year).random(values.shape)
        level = records.mean_value_2000 * records.index(year)
        xmin, ymin, xmax, ymax = world.extent
        cx, cy = world.centre_xy
        t = grid.transform
        x = (t.c + CELL_M * (np.arange(grid.width) + 0.5))[None, :]
        y = (t.f - CELL_M * (np.arange(grid.height) + 0.5))[:, None]
        distance = np.hypot(x - cx, y - cy)
        # The records' area thins out towards the edge of the city extent.
        edge = np.maximum(
            np.abs(x - (xmin + xmax) / 2) / ((xmax - xmin) / 2),
            np.abs(y - (ymin + ymax) / 2) / ((ymax - ymin) / 2),
        )
        reach_all = 1 - 0.9 * smoothstep((edge - 0.65) / 0.5)
        core_radius = 6000.0 * world.spatial_scale
        s = self.supersample
        for rows, pts, outside in supersampled_blocks(world, grid, s, 64):
            urban = block_mean(world.urban_intensity(pts, year), s)
            water = block_mean(pts.water, s)
            park = block_mean(pts.field("park"), s)
            shore = block_mean(np.exp(-pts.field("coast_distance") / 1500.0), s)
            chance = np.clip(0.12 + 1.3 * urban**0.6, 0, 0.97) * reach_all[rows]
            sold = (draws[rows] < chance) & (water < 0.5) & ~outside
            value = (
                level
                * (0.55 + 0.9 * urban)
                * (1 + 0.8 * np.exp(-distance[rows] / core_radius))
                * (1 + 0.2 * park + 0.15 * shore)
                * premium[rows]
                * yearly[rows]
            )
            values[rows] = np.where(sold, value.astype(np.float32), np.float32(NODATA))
        raster = RasterLayer(
            role="data",
            filename=f"property_values_{world.city}_{year}_250m.tif",
            data=values[None],
            grid=grid,
            nodata=NODATA,
            band_descriptions=("mean_sale_value",),
            units=f"{records.currency} (nominal, {year})",
            title=f"Mean property sale value per 250 m cell ({records.currency}, {year} prices)",
        )
        layer = TaggedCogLayer(raster, (("CURRENCY", records.currency), ("PRICE_YEAR", str(year))))
        start, end = year_span(year)
        return GeneratedItem(
            item_id=f"property_{world.city}_{year}",
            layers=(layer,),
            timestamp=datetime(year, 7, 1, tzinfo=UTC),
            start_datetime=start,
            end_datetime=end,
            properties={"property:currency": records.currency, "property:price_year": year},
            extra={
                "currency": records.currency,
                "price_year": str(year),
                "units": f"{records.currency} per sale (nominal)",
                "nodata": str(NODATA),
            },
        )
