"""ACAG air quality (SatPM2.5 and surface NO2): one global annual file per year, cut to the city.

SatPM2.5 is served as CF NetCDF (variable ``GWRPM25`` on lat/lon coordinates, latitudes
ascending); surface NO2 as one GeoTIFF per year. Both are read through GDAL (its netCDF driver
turns the ascending latitudes into a north-up grid), cut to the city window and written in the
sample twin's form: one float32 CF NetCDF variable (``pm25`` or ``no2``), ``_FillValue`` -9999.
Each file is downloaded once into the shared cache and reused by every city of that year.
"""

from __future__ import annotations

from pathlib import Path

from odc.geo.geobox import GeoBox

from sources.downloads import redact_url
from sources.http.base import (
    Assembled,
    HttpSource,
)


class AcagAnnual(HttpSource):
    """An ACAG annual mean field (µg/m³ or ppb) on its global lattice."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """The year's file cut to the city window."""
        variable = self.spec.variables[0]
        url = self.url(variable, year)
        got = self.download(url, city, year)
        with self.open_served(got, url, city, year, scratch, variable) as ds:
            values = self.read_served(ds, variable, grid, url, city, year)
        served = [{"url": redact_url(url), "sha256": got.sha256, "bytes": got.size}]
        return Assembled(grid, {variable.name: values}, served)
