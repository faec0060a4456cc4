"""The grid each STAC item is written on: the city's extent plus a margin, on the product's
own pixel lattice, decided before any pixel is read.

Landsat items sit on the Collection 2 lattice of the city's UTM zone (30 m pixels, corners on
odd multiples of 15 m), like the sample twin's scenes. USGS publishes southern scenes in the
northern zone code (326xx) with negative northings; the city's 327xx zone is the same
projection shifted by 10,000 km, which is not a whole number of 30 m pixels, so in 327xx the
lattice's rows sit 10 m further along. The DEM mosaic keeps the GLO-30 tiles' own geographic
lattice.
"""

from __future__ import annotations

from affine import Affine
from odc.geo.geobox import GeoBox
from pyproj import CRS, Transformer

from citycube.catalogue.cities import get_city
from citycube.grid.tiles import (
    city_extent,
    snapped_grid,
)

PRODUCT_MARGIN_M = 3_000.0
"""Every item covers the city extent plus this margin (as the sample twin's files do)."""
LANDSAT_PIXEL_M = 30.0
"""Landsat reflective and resampled thermal pixel size."""
LANDSAT_CORNER_M = 15.0
"""Landsat pixel corners lie on odd multiples of 15 m in the zone USGS publishes."""
SOUTHERN_FALSE_NORTHING_M = 10_000_000.0
"""False northing of the southern UTM zones (327xx)."""


"""The north-up grid an item's file fills (a window of the product's lattice)."""


def city_window(city: str) -> tuple[float, float, float, float]:
    """The city's extent (both tile grids) plus the product margin, in its UTM CRS."""
    xmin, ymin, xmax, ymax = city_extent(city)
    m = PRODUCT_MARGIN_M
    return (xmin - m, ymin - m, xmax + m, ymax + m)


def city_crs(city: str) -> CRS:
    """The city's UTM CRS."""
    return CRS.from_epsg(get_city(city).epsg)


def city_bbox_wgs84(city: str) -> tuple[float, float, float, float]:
    """The city window as a WGS84 bbox (edges densified), for STAC searches."""
    to_wgs84 = Transformer.from_crs(city_crs(city), "EPSG:4326", always_xy=True)
    west, south, east, north = to_wgs84.transform_bounds(*city_window(city), densify_pts=51)
    return (float(west), float(south), float(east), float(north))


def landsat_grid(city: str) -> GeoBox:
    """The city window on the Landsat 30 m lattice of its UTM zone."""
    crs = city_crs(city)
    corner_y = LANDSAT_CORNER_M
    if utm_north_twin(crs) is not None:
        corner_y = (LANDSAT_CORNER_M + SOUTHERN_FALSE_NORTHING_M) % LANDSAT_PIXEL_M
    return snapped_grid(
        crs,
        city_window(city),
        (LANDSAT_PIXEL_M, LANDSAT_PIXEL_M),
        (LANDSAT_CORNER_M, corner_y),
    )


def utm_north_twin(crs: CRS) -> int | None:
    """The 326xx code of a southern WGS84 UTM zone (327xx); None for any other CRS."""
    epsg = crs.to_epsg()
    if epsg is not None and 32701 <= epsg <= 32760:
        return epsg - 100
    return None


def y_shift_into(source: CRS, target: CRS) -> float | None:
    """Northing to add to ``source`` coordinates to get ``target`` ones, when the two differ
    only by a false northing (the same CRS: 0; a 326xx scene of a 327xx city: 10,000 km);
    None when a real reprojection is needed."""
    source_epsg, target_epsg = source.to_epsg(), target.to_epsg()
    if source == target or (source_epsg is not None and source_epsg == target_epsg):
        return 0.0
    if source_epsg is not None and utm_north_twin(target) == source_epsg:
        return SOUTHERN_FALSE_NORTHING_M
    return None


def geographic_grid(city: str, lattice: Affine) -> GeoBox:
    """The city window in EPSG:4326 on a tile's lattice (its pixel size and corners)."""
    to_wgs84 = Transformer.from_crs(city_crs(city), "EPSG:4326", always_xy=True)
    bounds = to_wgs84.transform_bounds(*city_window(city), densify_pts=51)
    return snapped_grid(
        CRS.from_epsg(4326), tuple(bounds), (lattice.a, -lattice.e), (lattice.c, lattice.f)
    )
