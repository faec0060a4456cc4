"""HILDA+ v2 land-use states: one global NetCDF holding every year, 0.01°, class ids.

The states file (variable ``LULC_states`` on time, lat, lon) is downloaded once through the
shared download manager and cached; every city and year then reads its window of the year's
band from the cached copy. GDAL's netCDF driver exposes the time steps as bands; the band of a
source year is found by its time value (plain years, or "years since" a base year), never by
position, so a file starting in another year cannot shift the series. Served class ids are
mapped to the twin's legend (tree crops and agroforestry of later releases become cropland);
99 stays nodata and ids outside the legend are kept, for processing to treat as invalid.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import rasterio
from odc.geo.geobox import GeoBox

from citycube.errors import SourceReadError
from sources.downloads import redact_url
from sources.http.base import (
    Assembled,
    HttpSource,
)

TIME_DIM_TAG = "NETCDF_DIM_time"
"""Band tag GDAL's netCDF driver sets to the band's time value."""
_PLAIN_YEARS = {"", "year", "years", "yr", "a"}
"""Units of a time coordinate whose values are calendar years."""
_SINCE = re.compile(r"^\s*years?\s+since\s+(-?\d{1,4})", re.IGNORECASE)


def band_years(ds: rasterio.DatasetReader) -> dict[int, int]:
    """Calendar year -> band number, from the bands' time values and the time units."""
    units = ds.tags().get("time#units", "")
    since = _SINCE.match(units)
    if since is None and units.strip().lower() not in _PLAIN_YEARS:
        raise ValueError(f"time units {units!r} are not years")
    base = int(since.group(1)) if since else 0
    years: dict[int, int] = {}
    for band in range(1, ds.count + 1):
        value = ds.tags(band).get(TIME_DIM_TAG)
        if value is None:
            raise ValueError(f"band {band} has no time value")
        years[base + round(float(value))] = band
    return years


class HildaStates(HttpSource):
    """HILDA+ annual land-use states from the global multi-year NetCDF."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """The year's band cut to the city window, ids mapped to the twin's legend."""
        variable = self.spec.variables[0]
        url = self.url(variable, year)
        got = self.download(url, city, year)
        name = PurePosixPath(urlsplit(url).path).name
        with self.open_served(got, url, city, year, scratch, variable) as ds:
            try:
                bands = band_years(ds)
            except ValueError as exc:
                raise self.corrupt(url, city, year, exc) from None
            if year not in bands:
                raise SourceReadError(
                    f"{self.info.source_id}: {city} {year}: {name} holds years "
                    f"{min(bands, default='-')}-{max(bands, default='-')}, not {year}, although "
                    "schemas/http_products.yaml lists it as published; fix the spec"
                )
            values = self.read_served(ds, variable, grid, url, city, year, band=bands[year])
        served = [{"url": redact_url(url), "sha256": got.sha256, "bytes": got.size}]
        return Assembled(grid, {variable.name: values}, served, {"band": str(bands[year])})
