"""CHELSA V2.1 monthly climate, aggregated to the annual fields the WTH modality reads.

Monthly files are global GeoTIFFs of 128-800 MB each; a city-year needs 72 of them (six
variables x twelve months) but only a window of about 60 x 60 cells of each. The adapter
therefore reads those windows over GDAL ``/vsicurl/`` (HTTP range requests: a few hundred kB
per file) instead of downloading ~20 GB through the download manager. GDAL's own retry settings
(429 and 5xx, bounded, with back-off) cover transient failures; a 404 for a month the spec
declares published fails the fetch. In offline mode the windows are read from the mirror
(``<mirror>/<host>/<path>``), the layout the download manager uses.

Temperatures are day-weighted annual means in °C, precipitation the annual sum in mm, surface
shortwave the day-weighted mean in W/m², humidity the day-weighted mean in %. The item holds
one scaled uint16 COG per variable, as the sample twin does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import rasterio
from rasterio.errors import RasterioError

from citycube.errors import SourceFetchError, SourceUnavailableError
from sources.downloads import redact_url
from sources.http.monthly import MonthlyToAnnual


class ChelsaMonthly(MonthlyToAnnual):
    """CHELSA V2.1 annual fields from windowed reads of the monthly COGs."""

    def gdal_env(self) -> dict[str, Any]:
        """GDAL settings of remote windowed reads: bounded retries, timeouts, no stale cache."""
        o = self.options
        return {
            "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
            "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif",
            "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
            "GDAL_HTTP_MULTIRANGE": "SINGLE_GET",
            "GDAL_HTTP_TIMEOUT": math.ceil(o.timeout_s),
            "GDAL_HTTP_MAX_RETRY": max(o.attempts - 1, 0),
            "GDAL_HTTP_RETRY_DELAY": o.wait_initial_s,
            "CPL_VSIL_CURL_NON_CACHED": "/vsicurl/",
        }

    def href(self, url: str) -> str:
        """What GDAL opens: the remote COG, or its mirror copy when offline."""
        if not self.options.offline:
            return f"/vsicurl/{url}"
        parts = urlsplit(url)
        mirror = self.options.mirror_dir
        copy = None if mirror is None else Path(mirror) / parts.netloc / parts.path.lstrip("/")
        if copy is None or not copy.is_file():
            raise SourceUnavailableError(
                f"offline: {redact_url(url)} is not in the mirror "
                f"({copy if copy else 'no mirror configured'})",
                reason="source_offline",
            )
        return str(copy)

    @contextlib.contextmanager
    def open_month(
        self, url: str, city: str, year: int, scratch: Path, served: list[dict[str, Any]]
    ) -> Iterator[rasterio.DatasetReader]:
        """Open one monthly COG for windowed reads (remote, or the mirror copy offline)."""
        href = self.href(url)
        with rasterio.Env(**self.gdal_env()):
            try:
                dataset = rasterio.open(href)
            except RasterioError as exc:
                raise self._open_error(url, city, year, exc) from None
            with dataset:
                self.check_lattice(dataset, url, city, year)
                served.append({"url": redact_url(url), "read": "window"})
                yield dataset

    def _open_error(
        self, url: str, city: str, year: int, exc: Exception
    ) -> SourceFetchError | Exception:
        text = str(exc)
        name = urlsplit(url).path.rsplit("/", 1)[-1]
        if "404" in text:
            return SourceFetchError(
                f"{self.info.source_id}: {city} {year}: {redact_url(url)} is not on the server "
                "although schemas/http_products.yaml lists the year as published; fix the spec",
                transient=False,
                status=404,
            )
        if self.options.offline or "not recognized" in text or "TIFF" in text:
            return self.corrupt(url, city, year, exc, cached=False)
        return SourceFetchError(
            f"{self.info.source_id}: {city} {year}: could not read {name} "
            f"({redact_url(url)}): {text}",
            transient=True,
        )
