"""VIIRS VNL annual composites (``average_masked``), which need an EOG account token.

One global gzipped GeoTIFF per year (file names carry build stamps, so the spec lists each
year's). The token is read from the environment variable the spec names and sent as a Bearer
header through the download manager, which never records headers; the cache index, item files,
completion records and errors hold the URL only.
"""

from __future__ import annotations

from pathlib import Path

from odc.geo.geobox import GeoBox

from sources.downloads import redact_url
from sources.http.base import (
    Assembled,
    HttpSource,
)


class VnlAnnual(HttpSource):
    """VIIRS VNL annual average radiance (nW/cm²/sr), background masked to 0."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """The year's composite cut to the city window."""
        variable = self.spec.variables[0]
        url = self.url(variable, year)
        got = self.download(url, city, year)
        with self.open_served(got, url, city, year, scratch) as ds:
            values = self.read_served(ds, variable, grid, url, city, year)
        served = [{"url": redact_url(url), "sha256": got.sha256, "bytes": got.size}]
        notes = {"partial_year": "April-December 2012"} if year == 2012 else {}
        return Assembled(grid, {variable.name: values}, served, notes)
