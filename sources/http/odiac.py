"""ODIAC fossil-fuel CO₂ (1 km): twelve gzipped monthly GeoTIFFs per year, summed.

Monthly files hold tonne C per cell per month on the global 30″ grid; their sum is the sample
twin's tonne C per cell per year. Each file is downloaded once into the shared cache (they are
global, so every city reuses it) and read through GDAL's ``/vsigzip/`` without unpacking.
Years ODIAC does not publish are unavailable, never zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rasterio

from sources.downloads import redact_url
from sources.http.monthly import MonthlyToAnnual


class OdiacMonthly(MonthlyToAnnual):
    """ODIAC annual totals from the monthly 1 km files."""

    @contextlib.contextmanager
    def open_month(
        self, url: str, city: str, year: int, scratch: Path, served: list[dict[str, Any]]
    ) -> Iterator[rasterio.DatasetReader]:
        """Download the month's .tif.gz through the manager and open it unpacked on the fly."""
        got = self.download(url, city, year)
        served.append({"url": redact_url(url), "sha256": got.sha256, "bytes": got.size})
        with self.open_served(got, url, city, year, scratch) as ds:
            yield ds
