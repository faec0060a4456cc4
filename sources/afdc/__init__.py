"""The ``afdc`` adapter family: EV charging stations of the Alternative Fuels Data Center.

Two forms of the same station data make one static item per city:

- **Archived snapshots**: CSV downloads of the station database kept with the date they were
  taken (``snapshots`` option: per city, a date and a URL). Each is installed as it was
  served, role ``snapshot_<date>``.
- **The API**: ``GET {api_url}?fuel_type=ELEC&state=XX&status=all&access=public&limit=N&offset=K``
  (NREL developer API, alt-fuel-stations v1 JSON), paged by ``offset`` until
  ``total_results`` stations have arrived. The key goes in the ``X-Api-Key`` header, read from
  the environment variable the options name (default ``NREL_API_KEY``): it never appears in a
  URL, a cache index, a log line, an error or the item. The pages are merged into one response
  in the API's own layout, role ``snapshot_<date>`` for the date the pages were downloaded
  (or the ``api_date`` option, so a mirror can be replayed).

Every page and file goes through the shared download manager (retries on 429/5xx, offline
mirror); API pages are dropped from its cache once installed, so the next install asks the API
again rather than replaying an old answer under a new date. Every file is read back with the
core's station reader before the item is installed: a file without the columns the EV task
reads fails the fetch by name (CC410) and installs nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from citycube.errors import ApiKeyMissingError, SourceFetchError, SourceUnavailableError
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.staging import StagedFiles, install_item
from citycube.tasks.ev_charging import PRODUCT, read_station_file
from sources.downloads import DownloadManager, DownloadOptions, redact_url

API_URL = "https://developer.nrel.gov/api/alt-fuel-stations/v1.json"
"""The alt-fuel-stations v1 endpoint."""
API_KEY_ENV = "NREL_API_KEY"
"""Environment variable holding the API key by default."""
STATES = {"Boston": "MA", "NYC": "NY", "SanFrancisco": "CA", "DC": "DC"}
"""The state each US city's stations are asked by (the grid cuts the city out of it)."""


class ArchivedSnapshot(BaseModel):
    """One archived CSV download of the station database."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    date: dt.date = Field(description="When the snapshot was taken.")
    url: str = Field(description="Where the CSV is served (a mirror or archive URL).")
    sha256: str | None = Field(default=None, description="Checksum, when the archive gives one.")


class AfdcOptions(DownloadOptions):
    """Options of the ``afdc`` family, as a source-set file gives them."""

    api: bool = Field(default=True, description="Ask the API for a current snapshot.")
    api_url: str = Field(default=API_URL, description="The alt-fuel-stations v1 JSON endpoint.")
    api_key_env: str = Field(
        default=API_KEY_ENV, description="Environment variable that holds the API key."
    )
    api_date: dt.date | None = Field(
        default=None, description="Date of the API snapshot; default: the day it is fetched."
    )
    page_size: int = Field(default=200, ge=1, le=200, description="Stations per API page.")
    max_pages: int = Field(default=1000, ge=1, description="Pages asked at most per city.")
    states: dict[str, str] = Field(
        default_factory=lambda: dict(STATES), description="City key → state code asked."
    )
    snapshots: dict[str, list[ArchivedSnapshot]] = Field(
        default_factory=dict, description="Archived CSV snapshots by city key."
    )


class AfdcStations(SourceProduct):
    """The AFDC station snapshots of a city, as one static item."""

    def __init__(self, options: AfdcOptions) -> None:
        self.options = options
        self.manager = DownloadManager(options.download_settings())
        self.info = SourceInfo(
            product_id=PRODUCT,
            source_id="afdc:alt-fuel-stations-v1",
            version="alt-fuel-stations v1",
            synthetic=False,
            licence="Public domain (U.S. Government work)",
            attribution="U.S. Department of Energy, Alternative Fuels Data Center station data",
        )

    def source_years(self, city: str) -> list[int] | None:
        """Static: the snapshots are roles of one item."""
        return None

    def covers(self, city: str) -> bool:
        """The data cover US cities with a state code."""
        return city in self.options.states

    def _api_date(self) -> dt.date:
        return self.options.api_date or dt.datetime.now(dt.UTC).date()

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Download the city's snapshots, check each with the station reader, install them."""
        if source_year is not None:
            raise ValueError(f"{PRODUCT} is static; fetch it with source_year=None")
        options = self.options
        archived = options.snapshots.get(city, [])
        if city not in options.states:
            raise SourceUnavailableError(
                f"{PRODUCT}: the Alternative Fuels Data Center covers the United States; "
                f"{city} has no state code in the afdc options",
                reason="outside_source_coverage",
            )
        if not archived and not options.api:
            raise SourceUnavailableError(
                f"{PRODUCT}: no archived snapshot is configured for {city} and the API is off",
                reason="outside_source_coverage",
            )
        api_date = self._api_date() if options.api else None
        dates = [s.date for s in archived] + ([api_date] if api_date else [])
        if len(set(dates)) != len(dates):
            raise SourceFetchError(
                f"{PRODUCT}: two snapshots of {city} share a date ({sorted(map(str, dates))}); "
                "give each archived snapshot its own date or set api_date",
                transient=False,
            )
        identity = {
            "product": PRODUCT,
            "city": city,
            "source_id": self.info.source_id,
            "snapshots": [[s.date.isoformat(), redact_url(s.url)] for s in archived],
            "api": [redact_url(options.api_url), options.states[city], str(api_date)]
            if api_date
            else None,
        }

        def write(staging: Path) -> StagedFiles:
            files: dict[str, str] = {}
            for snapshot in archived:
                got = self.manager.fetch(snapshot.url, sha256=snapshot.sha256)
                name = f"alt_fuel_stations_{snapshot.date.isoformat()}.csv"
                shutil.copyfile(got.path, staging / name)
                read_station_file(staging / name)
                files[f"snapshot_{snapshot.date.isoformat()}"] = name
            extra: dict[str, Any] = {"state": options.states[city]}
            if api_date is not None:
                name = f"alt_fuel_stations_{api_date.isoformat()}.json"
                response, pages = self._api_snapshot(city)
                (staging / name).write_text(json.dumps(response), encoding="utf-8")
                read_station_file(staging / name)
                files[f"snapshot_{api_date.isoformat()}"] = name
                extra["api_pages"] = pages
                extra["api_stations"] = len(response["fuel_stations"])
            extra["snapshots"] = ",".join(sorted(r[len("snapshot_") :] for r in files))
            return StagedFiles(files, extra)

        installed = install_item(self.item_dir(city, None, dest), identity, write)
        return self.installed_source_item(installed, city, None)

    def _api_snapshot(self, city: str) -> tuple[dict[str, Any], int]:
        """Every page of the city's state: one merged alt-fuel-stations v1 response."""
        options = self.options
        key = os.environ.get(options.api_key_env, "").strip()
        if not key:
            raise ApiKeyMissingError(
                f"{PRODUCT}: the API needs a key in ${options.api_key_env}; set it (an NREL "
                "developer key) or set api: false and give archived snapshots",
                transient=False,
                reason="api_key_missing",
            )
        stations: list[dict[str, Any]] = []
        first: dict[str, Any] = {}
        total = None
        urls: list[str] = []
        for page in range(options.max_pages):
            params = {
                "fuel_type": "ELEC",
                "state": options.states[city],
                "status": "all",
                "access": "public",
                "limit": options.page_size,
                "offset": page * options.page_size,
            }
            url = f"{options.api_url}?{urlencode(params)}"
            urls.append(url)
            got = self.manager.fetch(url, headers={"X-Api-Key": key})
            try:
                body = json.loads(got.path.read_bytes())
            except ValueError as exc:
                self.manager.discard(url)
                raise SourceFetchError(
                    f"{got.url} did not answer JSON ({exc})", transient=False
                ) from None
            found = body.get("fuel_stations") if isinstance(body, dict) else None
            if not isinstance(found, list) or "total_results" not in body:
                self.manager.discard(url)
                error = body.get("error") if isinstance(body, dict) else None
                raise SourceFetchError(
                    f"{got.url} is not an alt-fuel-stations v1 page"
                    + (f": {error}" if error else f": {str(body)[:200]}"),
                    transient=False,
                )
            if not first:
                first = {k: v for k, v in body.items() if k != "fuel_stations"}
            total = int(body["total_results"])
            stations += found
            if len(stations) >= total or len(found) < options.page_size:
                break
        else:
            raise SourceFetchError(
                f"{PRODUCT}: {city} needs more than {options.max_pages} pages of "
                f"{options.page_size}; raise max_pages",
                transient=False,
            )
        if total is not None and len(stations) != total:
            raise SourceFetchError(
                f"{PRODUCT}: {city}: the API announced {total} stations but paging gave "
                f"{len(stations)}; the database changed while paging: fetch again",
            )
        for url in urls:
            self.manager.discard(url)
        return {**first, "total_results": len(stations), "fuel_stations": stations}, len(urls)


def afdc_adapters(options: Mapping[str, Any]) -> list[SourceProduct]:
    """The family's adapter for a source-set's ``options: {afdc: …}``."""
    try:
        parsed = AfdcOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid afdc options: {exc}") from exc
    return [AfdcStations(parsed)]


__all__ = ["AfdcOptions", "AfdcStations", "afdc_adapters"]
