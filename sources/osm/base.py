"""What every OSM adapter shares: provenance, item layout, the city window, extract files
(downloaded through the shared download manager, or local), and writing items in the sample
twins' form (GeoPackage or GeoParquet in EPSG:4326, the twins' layer and column names),
installed atomically with a provenance record.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import geopandas as gpd
import pyarrow.parquet as pq
import pyogrio
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.grid.tiles import city_extent
from citycube.io.atomic import fsync_path
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.rasters import transformer
from citycube.items.staging import StagedFiles, install_item
from sources.downloads import DownloadManager, redact_url
from sources.osm.history import ExtractError, ExtractInfo, extract_info
from sources.osm.options import OsmFamilyOptions

WGS84 = CRS.from_epsg(4326)
"""Every OSM item is written in longitude/latitude, as the sample twins are."""
WINDOW_MARGIN_M = 3_000.0
"""Items cover the city extent plus this margin, as the sample twins' files do."""
PROVENANCE_FILE = "sources.json"
"""Served files (URLs without credentials, digests, sizes), extract dates and what was left out."""
LICENCE = "ODbL-1.0"
"""OpenStreetMap data are licensed under the Open Database License 1.0."""
ATTRIBUTION = "© OpenStreetMap contributors (https://www.openstreetmap.org/copyright)"
"""The attribution the OSMF asks for."""


def snapshot_time(year: int) -> datetime:
    """The moment a year's snapshot shows: 1 January, 00:00 UTC (the sample twins' rule)."""
    return datetime(year, 1, 1, tzinfo=UTC)


def window_wgs84(city: str) -> tuple[float, float, float, float]:
    """(west, south, east, north) of the city extent plus the margin, in degrees."""
    xmin, ymin, xmax, ymax = city_extent(city)
    m = WINDOW_MARGIN_M
    to_wgs84 = transformer(CRS.from_epsg(get_city(city).epsg), WGS84)
    bounds = to_wgs84.transform_bounds(xmin - m, ymin - m, xmax + m, ymax + m, densify_pts=51)
    return tuple(float(v) for v in bounds)  # type: ignore[return-value]


def is_url(ref: str) -> bool:
    """True for an http(s) URL, False for a local path."""
    return ref.startswith(("http://", "https://"))


@dataclass(frozen=True)
class Extract:
    """An extract ready to read, and where it came from."""

    path: Path
    """The local file (in the download cache, the mirror, or where it was configured)."""
    source: str
    """URL without credentials, or the configured path."""
    sha256: str | None
    """Digest of a downloaded file (None for a local file read in place)."""
    size: int
    """Bytes."""
    info: ExtractInfo = field(repr=False)
    """What its header says."""
    name: str = ""
    """The served or configured file name, for messages."""


class OsmSource(SourceProduct):
    """One OSM product of the ``osm`` family; subclasses say how a year's frame is made."""

    product: str
    """Product id served."""
    version: str
    """Adapter version string (bumped when the item form or its rules change)."""
    title: str
    """Human-readable name for messages."""

    def __init__(self, options: OsmFamilyOptions, manager: DownloadManager) -> None:
        self.options = options
        self.manager = manager
        self.info = SourceInfo(
            product_id=self.product,
            source_id=f"osm:{self.product}",
            version=self.version,
            synthetic=False,
            licence=LICENCE,
            attribution=ATTRIBUTION,
        )

    # -- protocol -------------------------------------------------------------------------

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Make (or reuse) one city-year's item in its sample twin's form."""
        get_city(city)
        year = self.check_year(city, source_year)

        def write(staging: Path) -> StagedFiles:
            return self.write_item(staging, city, year)

        installed = install_item(self.item_dir(city, year, dest), self.identity(city, year), write)
        return self.installed_source_item(installed, city, year)

    def check_year(self, city: str, source_year: int | None) -> int:
        """The year, or the reason it cannot be served (no configuration, outside the range)."""
        if source_year is None:
            raise ValueError(f"{self.product_id} is not static; pass a snapshot year")
        years = self.source_years(city)
        if not years:
            raise SourceUnavailableError(
                f"{self.info.source_id}: no OSM source configured for {city} (see the osm "
                "family's options in the source-set file)",
                reason="outside_source_coverage",
            )
        if source_year not in years:
            raise SourceUnavailableError(
                f"{self.info.source_id} offers {years[0]}-{years[-1]} for {city}, not "
                f"{source_year}",
                reason="source_year_missing",
            )
        return source_year

    @abstractmethod
    def identity(self, city: str, year: int) -> dict[str, Any]:
        """What a completion record must say for an item to be reused."""

    @abstractmethod
    def write_item(self, staging: Path, city: str, year: int) -> StagedFiles:
        """Build one item's files in ``staging``."""

    def base_identity(self, city: str, year: int) -> dict[str, Any]:
        """Identity fields every OSM item has."""
        return {
            "product": self.product_id,
            "city": city,
            "source_year": year,
            "source_id": self.info.source_id,
            "version": self.info.version,
            "synthetic": False,
        }

    # -- extracts -------------------------------------------------------------------------

    def label(self, city: str, year: int) -> str:
        """Who is asking, for error messages: source, city and snapshot date."""
        return f"{self.info.source_id}: {city} {snapshot_time(year).date().isoformat()}"

    def ref_identity(self, ref: str) -> str:
        """How an extract reference enters an item's identity (a local file's size and time
        too, so a replaced file is read again)."""
        if is_url(ref):
            return redact_url(ref)
        try:
            stat = Path(ref).stat()
        except OSError:
            return ref
        return f"{Path(ref).resolve()}:{stat.st_size}:{stat.st_mtime_ns}"

    def extract(self, ref: str, city: str, year: int) -> Extract:
        """The extract behind ``ref``: downloaded (cached) for a URL, checked for a path."""
        label = self.label(city, year)
        if is_url(ref):
            headers: dict[str, str] = {}
            env = self.options.auth_cookie_env
            if env and os.environ.get(env, "").strip():
                headers["Cookie"] = os.environ[env].strip()
            try:
                got = self.manager.fetch(ref, headers=headers)
            except SourceFetchError as exc:
                hint = ""
                if exc.status in (401, 403) or (exc.status == 302 and env):
                    hint = f" — the server refused access; is the cookie in {env} still valid?"
                raise SourceFetchError(
                    f"{label}: extract {redact_url(ref)}: {exc.message}{hint}",
                    transient=exc.transient,
                    status=exc.status,
                ) from None
            path, source, digest, size = got.path, got.url, got.sha256, got.size
        else:
            path = Path(ref)
            if not path.is_file():
                raise SourceFetchError(
                    f"{label}: extract file {path} does not exist; fix the osm options of the "
                    "source-set file",
                    transient=False,
                )
            source, digest, size = str(path), None, path.stat().st_size
        try:
            info = extract_info(path)
        except ExtractError as exc:
            raise self.damaged(ref, path, city, year, exc) from None
        return Extract(path, source, digest, size, info, ref_name(ref))

    def local_file(self, ref: str, what: str, city: str, year: int) -> Path:
        """A small side file (a boundary polygon): downloaded (cached) for a URL, checked for a
        path."""
        label = self.label(city, year)
        if is_url(ref):
            try:
                return self.manager.fetch(ref).path
            except SourceFetchError as exc:
                raise SourceFetchError(
                    f"{label}: {what} {redact_url(ref)}: {exc.message}",
                    transient=exc.transient,
                    status=exc.status,
                ) from None
        path = Path(ref)
        if not path.is_file():
            raise SourceFetchError(
                f"{label}: {what} {path} does not exist; fix the osm options of the source-set "
                "file",
                transient=False,
            )
        return path

    def damaged(
        self, ref: str, path: Path, city: str, year: int, exc: Exception
    ) -> SourceReadError:
        """The error for an extract libosmium cannot read; a downloaded copy is forgotten."""
        name = ref_name(ref)
        try:
            with open(path, "rb") as handle:
                html = handle.read(512).lstrip().lower().startswith((b"<!doctype", b"<html"))
        except OSError:
            html = False
        if html:  # a login page served in place of the file (Geofabrik's internal server)
            env = self.options.auth_cookie_env or "auth_cookie_env"
            exc = ValueError(
                f"the server sent an HTML page, not a PBF; is the login cookie in {env} valid?"
            )
        if is_url(ref):
            self.manager.discard(ref)
            what = f"downloaded from {redact_url(ref)}; it was dropped from the download cache"
        else:
            what = f"at {path}; replace the file"
        return SourceReadError(
            f"{self.label(city, year)}: extract file {name} is corrupt or truncated ({exc}), "
            f"{what}, and fetch again"
        )

    def time_filter(self, extract: Extract, history: bool, city: str, year: int) -> datetime | None:
        """The moment to filter a history file at, or None for a dated extract that serves it.

        ``history`` is what the file's content says (see ``history_of``). A history file that
        ends before the snapshot cannot show it; a dated extract serves a snapshot only when
        its own date is within ``dated_extract_days`` of it.
        """
        at = snapshot_time(year)
        stamp = extract.info.timestamp
        if history:
            if stamp is not None and stamp < at:
                raise SourceUnavailableError(
                    f"{self.label(city, year)}: history file {extract.name} ends at "
                    f"{stamp.isoformat()}, before the snapshot",
                    reason="source_year_missing",
                )
            return at
        if stamp is None:
            raise SourceReadError(
                f"{self.label(city, year)}: {extract.name} is a dated (non-history) extract "
                "without a timestamp in its header, so the date it shows is unknown; use a "
                "history file or an extract with its replication timestamp"
            )
        if abs(stamp - at) > timedelta(days=self.options.dated_extract_days):
            raise SourceUnavailableError(
                f"{self.label(city, year)}: dated extract {extract.name} shows "
                f"{stamp.isoformat()}, more than {self.options.dated_extract_days} days from the "
                "snapshot; use a history file or an extract of that date",
                reason="source_year_missing",
            )
        return None


def ref_name(ref: str) -> str:
    """The file name of an extract reference (URL or path)."""
    return PurePosixPath(urlsplit(ref).path).name if is_url(ref) else Path(ref).name


def item_tags(source: OsmSource, city: str, year: int) -> dict[str, str]:
    """Metadata written into every item file (real data: never synthetic)."""
    return {
        "SYNTHETIC": "false",
        "CITYCUBE_PRODUCT": source.product_id,
        "CITYCUBE_SOURCE": source.info.source_id,
        "CITYCUBE_SOURCE_VERSION": source.info.version,
        "CITYCUBE_CITY": city,
        "CITYCUBE_SOURCE_YEAR": str(year),
        "LICENCE": LICENCE,
        "ATTRIBUTION": ATTRIBUTION,
    }


def write_geopackage(
    frame: gpd.GeoDataFrame, path: Path, layer: str, geometry_type: str, tags: dict[str, str]
) -> None:
    """One GeoPackage layer with the tags as dataset and layer metadata, synced to disk."""
    pyogrio.write_dataframe(
        frame,
        path,
        layer=layer,
        driver="GPKG",
        geometry_type=geometry_type,
        use_arrow=True,
        dataset_metadata=tags,
        layer_metadata=tags,
    )
    fsync_path(path)


def write_geoparquet(frame: gpd.GeoDataFrame, path: Path, tags: dict[str, str]) -> None:
    """GeoParquet with the tags beside its 'geo' metadata, synced to disk."""
    frame.to_parquet(path, index=False, compression="zstd")
    table = pq.read_table(path)
    metadata = dict(table.schema.metadata or {})
    metadata.update({k.encode(): v.encode() for k, v in tags.items()})
    pq.write_table(table.replace_schema_metadata(metadata), path, compression="zstd")
    fsync_path(path)


def write_provenance(staging: Path, payload: Mapping[str, Any]) -> None:
    """The item's provenance record (no credentials)."""
    (staging / PROVENANCE_FILE).write_text(
        json.dumps(payload, indent=2, default=str), encoding="utf-8"
    )


def digest_of(value: object) -> str:
    """A short digest of settings that change an item's content."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
