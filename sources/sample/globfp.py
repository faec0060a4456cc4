"""Sample 3D-GloBFP: building footprints with heights, one static release.

The footprints are the city fabric's buildings standing in the product's reference year (it is
derived from imagery, so it sees every building, mapped in OSM or not); their outlines are the
same polygons the OSM building snapshots use. Heights come from the world's built-volume
field: towers in the business district, low-rise suburbs. Two cities lie outside the product's
published coverage and raise ``SourceUnavailableError`` with reason 'outside_source_coverage'.
"""

from __future__ import annotations

import geopandas as gpd
import numpy as np

from citycube.errors import SourceUnavailableError
from sources.sample.calendar import FOOTPRINT_UNCOVERED_CITIES
from sources.sample.layers import WGS84, GeoPackageLayer
from sources.sample.osm import city_fabric, stock_footprints_wgs84, window_bounds_wgs84
from sources.sample.world import GeneratedItem, SyntheticCity, year_span

REFERENCE_YEAR = 2020
"""Buildings standing in this year are in the release."""
UNCOVERED_CITIES = FOOTPRINT_UNCOVERED_CITIES
"""Cities the release does not cover (14 of the 16 cities are covered; which two, and why,
is the sample calendar's choice: ``sources.sample.calendar``)."""


class GlobfpHeight:
    """3D-GloBFP building footprints with height (m), static, GeoPackage layer ``buildings``."""

    product_id = "globfp_height"

    def years(self) -> list[int] | None:
        """Static: one release for all years."""
        return None

    def covers(self, city: str) -> bool:
        """Whether the release covers a city at all."""
        return city not in UNCOVERED_CITIES

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """Footprints with ``id`` and ``height`` of every building standing in 2020."""
        if not self.covers(world.city):
            raise SourceUnavailableError(
                f"{self.product_id} does not cover {world.city}; covered cities exclude "
                f"{', '.join(sorted(UNCOVERED_CITIES))}",
                reason="outside_source_coverage",
            )
        stock = city_fabric(world).buildings
        standing = np.flatnonzero(stock.built <= REFERENCE_YEAR)
        frame = gpd.GeoDataFrame(
            {
                "id": np.arange(1, len(standing) + 1, dtype=np.int64),
                "height": stock.height_m[standing].astype(np.float64).round(1),
            },
            geometry=stock_footprints_wgs84(world)[standing],
            crs=WGS84,
        )
        layer = GeoPackageLayer(
            role="data",
            filename=f"3D-GloBFP_{world.city}.gpkg",
            title="3D-GloBFP building footprints with height",
            frame=frame,
            layer="buildings",
            fallback_bounds=window_bounds_wgs84(world),
        )
        start, end = year_span(REFERENCE_YEAR)
        return GeneratedItem(
            item_id=f"3D-GloBFP_{world.city}",
            layers=(layer,),
            timestamp=None,
            start_datetime=start,
            end_datetime=end,
            properties={"globfp:reference_year": REFERENCE_YEAR},
            extra={"units": "m", "buildings": str(len(frame))},
        )
