"""What every record connector shares: paged requests through the download manager, the
field mapping of a spec, and items written in the one normalised records form.

A connector (one module per protocol) only says how a city-year's rows come out of its portal
(``rows``): a table of the source's own columns plus, where the protocol carries geometry
itself (ArcGIS features, GeoJSON), a geometry column. :func:`normalise` applies the spec's
field mapping to it, and :class:`RecordSource` installs the item: ``records.parquet``
(``sources.records.spec.RECORD_COLUMNS``) and the tables the spatial form needs (postcode
centroids, unit boundaries, a coverage polygon), with the declared counts ``records`` and
``blank_values`` the core checks at ingest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.rasters import transformer
from citycube.items.staging import StagedFiles, install_item
from citycube.processing.records import SPATIAL_FORM_KEY, normalise_key
from sources.downloads import Downloaded, DownloadManager, redact_url
from sources.records.spec import JoinTable, Protocol, RecordProductSpec, SpatialForm

GEOMETRY = "__geometry__"
"""Column a connector fills with shapely geometries (EPSG:4326) when its protocol carries them."""
PROVENANCE_FILE = "sources.json"
"""Pages and files served for an item (URLs without credentials, digests, sizes)."""
WGS84 = "EPSG:4326"


def is_url(href: str) -> bool:
    """True for http(s) hrefs; anything else is a local path."""
    return urlsplit(str(href)).scheme in ("http", "https")


def with_params(url: str, params: Mapping[str, object]) -> str:
    """``url`` with query parameters appended (in a stable order, so the cache finds pages)."""
    if not params:
        return url
    joiner = "&" if urlsplit(url).query else "?"
    return f"{url}{joiner}{urlencode({k: str(v) for k, v in params.items()}, safe=':,$*')}"


class Pager:
    """Fetches one spec's pages through the shared manager and remembers what was served."""

    def __init__(
        self, spec: RecordProductSpec, manager: DownloadManager, city: str, year: int
    ) -> None:
        self.spec = spec
        self.manager = manager
        self.city = city
        self.year = year
        self.served: list[dict[str, Any]] = []
        self.notes: dict[str, str] = {}
        """What a connector counted on the way (malformed lines, archives missing): written to
        the item's extras, so nothing it leaves out goes unreported."""

    def _token(self) -> tuple[dict[str, str], dict[str, str]]:
        """(headers, query params) carrying the optional app token, read from the environment."""
        spec = self.spec
        token = os.environ.get(spec.token_env, "").strip() if spec.token_env else ""
        if not token:
            return {}, {}
        if spec.token_param:
            return {}, {spec.token_param: token}
        return {spec.token_header: token}, {}

    def get_file(self, url: str, params: Mapping[str, object] | None = None) -> Downloaded:
        """One served file in the cache (429 and 5xx retried with the server's Retry-After);
        large archives are read from there, never held whole in memory."""
        headers, token_params = self._token()
        full = with_params(url, {**(params or {}), **token_params})
        got = self.manager.fetch(full, headers=headers)
        self.served.append({"url": got.url, "sha256": got.sha256, "bytes": got.size})
        return got

    def get_bytes(self, url: str, params: Mapping[str, object] | None = None) -> bytes:
        """One served file or page, as bytes."""
        return self.get_file(url, params).path.read_bytes()

    def get_json(self, url: str, params: Mapping[str, object] | None = None) -> Any:
        """A JSON page; one that is not JSON is dropped from the cache and named in the error."""
        body = self.get_bytes(url, params)
        try:
            return json.loads(body)
        except ValueError as exc:
            self.discard(url, params)
            raise SourceReadError(
                f"{self.source_name}: {self.city} {self.year}: {redact_url(url)} answered "
                f"something that is not JSON ({exc}): {body[:120]!r}"
            ) from None

    def discard(self, url: str, params: Mapping[str, object] | None = None) -> None:
        """Forget a cached page (an error page must never be served from the cache again)."""
        _, token_params = self._token()
        self.manager.discard(with_params(url, {**(params or {}), **token_params}))

    @property
    def source_name(self) -> str:
        """'<protocol>:<product>' for messages."""
        return f"records:{self.spec.product}"

    def too_many_pages(self, url: str) -> SourceFetchError:
        """The error when paging would go past ``max_pages`` (never a silent truncation)."""
        return SourceFetchError(
            f"{self.source_name}: {self.city} {self.year}: {redact_url(url)} still returns full "
            f"pages after {self.spec.paging.max_pages} pages; raise paging.max_pages in the "
            "record spec rather than truncate the records",
            transient=False,
        )


class Connector(ABC):
    """One protocol: how a city-year's rows come out of a portal."""

    @abstractmethod
    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """The source's rows of one year (its own column names; ``GEOMETRY`` when it has any)."""


# ---------------------------------------------------------------------------- normalising


def _year_of(values: pd.Series) -> pd.Series:
    """A record's year from a year, a date text or epoch milliseconds (ArcGIS date fields)."""
    numeric = pd.to_numeric(values, errors="coerce")
    years = pd.Series(np.nan, index=values.index)
    small = numeric.notna() & (numeric.abs() < 10_000)
    years[small] = numeric[small]
    epoch = numeric.notna() & ~small
    years[epoch] = pd.to_datetime(numeric[epoch], unit="ms", utc=True).dt.year
    text = values[numeric.isna() & values.notna()].astype(str).str.extract(r"(\d{4})")[0]
    years[text.index] = pd.to_numeric(text, errors="coerce")
    return years


_GROUPED = r"^-?\d{1,3}(,\d{3})+(\.\d+)?$"


def number_column(values: pd.Series) -> pd.Series:
    """Numbers from a source column; '82,500' (thousands grouped by commas) reads as 82500."""
    if values.dtype.kind in "iuf":
        return values.astype(float)
    text = values.astype("string").str.strip()
    grouped = text.str.match(_GROUPED).fillna(False).astype(bool)
    text = text.where(~grouped, text.str.replace(",", "", regex=False))
    return pd.to_numeric(text, errors="coerce").astype(float)


def geometry_from_value(value: object) -> shapely.Geometry | None:
    """A GeoJSON geometry (dict or text) or a Socrata location ({latitude, longitude})."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            try:
                return shapely.from_wkt(value)
            except shapely.errors.GEOSException:
                return None
    if isinstance(value, dict):
        if "type" in value and "coordinates" in value:
            return shapely.geometry.shape(value)
        if "latitude" in value and "longitude" in value:
            try:
                return shapely.Point(float(value["longitude"]), float(value["latitude"]))
            except (TypeError, ValueError):
                return None
    return None


def normalise(
    frame: pd.DataFrame, spec: RecordProductSpec, year: int, server_filtered: bool
) -> pd.DataFrame:
    """The spec's field mapping applied: RECORD_COLUMNS, one row per source row of the year.

    Values are scaled to the modality's unit; a value that is not a number stays NaN (counted
    as blank, never zero). Rows of other years are dropped; when the server filtered by year,
    a row without a year field belongs to the requested one.
    """
    fields = spec.fields
    for column, allowed in spec.row_filter.items():
        if column not in frame:
            raise SourceReadError(f"{spec.city} {spec.product}: no column {column!r} to filter on")
        frame = frame[frame[column].astype(str).isin(allowed)]
    value_parts = [part.strip() for part in fields.value.split("+")]
    missing = [
        name
        for name in (*value_parts, fields.year, fields.lon, fields.lat, fields.postcode)
        if name and name not in frame
    ]
    if missing and len(frame):
        raise SourceReadError(
            f"{spec.city} {spec.product}: the served rows have no field(s) {missing}; they have "
            f"{sorted(c for c in frame.columns if c != GEOMETRY)[:30]}: fix fields in the spec"
        )
    if fields.year and len(frame):
        years = _year_of(frame[fields.year])
        if server_filtered:
            years = years.fillna(year)
        frame = frame[years == year]
    if spec.dedupe_by and len(frame):
        frame = frame.drop_duplicates(spec.dedupe_by)
    n = len(frame)
    values = pd.Series(np.zeros(n), index=frame.index)
    for part in value_parts:
        values = values + (number_column(frame[part]) if n else 0.0)
    if spec.min_value is not None:
        values = values.where(values >= spec.min_value)
    out = pd.DataFrame(
        {
            "year": np.full(n, year, dtype=np.int64),
            "value": values.to_numpy(float) * spec.value_scale,
        }
    )
    geometry = np.full(n, None, dtype=object)
    if spec.spatial_form in (SpatialForm.point, SpatialForm.parcel) and n:
        if fields.lon and fields.lat:
            lon = pd.to_numeric(frame[fields.lon], errors="coerce").to_numpy(float)
            lat = pd.to_numeric(frame[fields.lat], errors="coerce").to_numpy(float)
            source_crs = CRS.from_user_input(spec.source_crs)
            if not source_crs.equals(CRS.from_epsg(4326)):
                lon, lat = transformer(source_crs, CRS.from_epsg(4326)).transform(lon, lat)
            ok = np.isfinite(lon) & np.isfinite(lat)
            geometry[ok] = shapely.points(np.asarray(lon)[ok], np.asarray(lat)[ok])
        elif fields.geometry and fields.geometry in frame:
            geometry = np.array([geometry_from_value(v) for v in frame[fields.geometry]], object)
        elif GEOMETRY in frame:
            geometry = frame[GEOMETRY].to_numpy(dtype=object)
    present = np.array([g is not None and not g.is_empty for g in geometry], dtype=bool)
    wkb = np.full(n, None, dtype=object)
    if present.any():
        wkb[present] = shapely.to_wkb(geometry[present])
    out["geometry"] = wkb
    key_field = fields.postcode if spec.spatial_form == SpatialForm.postcode else fields.unit_id
    none = pd.Series([None] * n, dtype="string")
    out["postcode"] = (
        frame[key_field].astype("string").reset_index(drop=True)
        if spec.spatial_form == SpatialForm.postcode and key_field
        else none
    )
    out["unit_id"] = (
        frame[key_field].astype("string").reset_index(drop=True)
        if spec.spatial_form == SpatialForm.admin_unit and key_field
        else none
    )
    return out


def blank_count(frame: pd.DataFrame, form: SpatialForm) -> int:
    """Rows without a finite value or a location, as the core counts them."""
    finite = np.isfinite(frame["value"].to_numpy(float))
    if form in (SpatialForm.point, SpatialForm.parcel):
        located = frame["geometry"].notna().to_numpy()
    else:
        column = "postcode" if form == SpatialForm.postcode else "unit_id"
        located = normalise_key(frame[column]).notna().to_numpy()
    return int((~(finite & located)).sum())


RECORDS_SCHEMA = pa.schema(
    [
        ("year", pa.int64()),
        ("value", pa.float64()),
        ("geometry", pa.binary()),
        ("postcode", pa.string()),
        ("unit_id", pa.string()),
    ]
)


def write_records(frame: pd.DataFrame, path: Path) -> None:
    """The normalised records as Parquet with page checksums."""
    table = pa.Table.from_pandas(frame, schema=RECORDS_SCHEMA, preserve_index=False)
    pq.write_table(table, path, write_page_checksum=True)


# ----------------------------------------------------------------------------- join tables


def read_table_bytes(body: bytes, href: str) -> pd.DataFrame:
    """A CSV (optionally gzipped), GeoJSON or Parquet table from its bytes (by the href's name)."""
    name = urlsplit(href).path.lower()
    if name.endswith(".gz"):
        body, name = gzip.decompress(body), name.removesuffix(".gz")
    if name.endswith(".parquet"):
        try:
            return gpd.read_parquet(io.BytesIO(body))
        except ValueError:  # plain Parquet without GeoParquet metadata
            return pd.read_parquet(io.BytesIO(body))
    if name.endswith((".geojson", ".json")):
        return gpd.read_file(io.BytesIO(body))
    separator = "\t" if name.endswith((".txt", ".tsv")) else ","  # Census gazetteer files: tabs
    frame = pd.read_csv(
        io.BytesIO(body), sep=separator, dtype=str, keep_default_na=False, na_values=[""]
    )
    return frame.rename(columns=str.strip)


class RecordSource(SourceProduct):
    """One record product (property or electricity) for every city its specs declare."""

    def __init__(
        self,
        product: str,
        specs: Mapping[str, RecordProductSpec],
        connectors: Mapping[str, Connector],
        manager: DownloadManager,
        endpoints: Mapping[str, str],
        user_files: Mapping[str, Path] | None = None,
    ) -> None:
        self.specs = dict(specs)
        """City → spec."""
        self.connectors = connectors
        self.manager = manager
        self.endpoints = dict(endpoints)
        self.user_files = dict(user_files or {})
        """City → schema file of its user-supplied records (protocol user_file)."""
        licences = sorted({s.licence for s in self.specs.values()})
        self.info = SourceInfo(
            product_id=product,
            source_id=f"records:{product}",
            version="portals-2026",
            synthetic=False,
            licence="; ".join(licences) or "per city",
            attribution="; ".join(sorted({s.attribution for s in self.specs.values()})),
        )

    def source_years(self, city: str) -> list[int] | None:
        """Years the city's portal publishes (none for a city without records)."""
        get_city(city)
        spec = self.specs.get(city)
        return list(spec.years) if spec else []

    def endpoint(self, spec: RecordProductSpec) -> str:
        """The spec's endpoint, the source set's override for this product and city, or the
        schema file of user-supplied records."""
        if spec.city in self.user_files:
            return str(self.user_files[spec.city])
        return self.endpoints.get(f"{spec.product}/{spec.city}", spec.endpoint)

    def identity(self, spec: RecordProductSpec, year: int) -> dict[str, Any]:
        """What a completion record must say for an item to be reused."""
        text = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        identity: dict[str, Any] = {
            "product": spec.product,
            "city": spec.city,
            "source_year": year,
            "source_id": self.info.source_id,
            "endpoint": redact_url(self.endpoint(spec)),
            "spec_digest": hashlib.sha256(text.encode()).hexdigest()[:16],
            "synthetic": False,
        }
        if spec.city in self.user_files:
            from sources.records.user_schema import load_user_schema

            schema_path = self.user_files[spec.city]
            _, data, _ = load_user_schema(schema_path)
            for label, path in (("user_schema", schema_path), ("user_file", data)):
                stat = path.stat() if path.exists() else None
                identity[label] = f"{path}:{stat.st_size}:{stat.st_mtime_ns}" if stat else str(path)
        return identity

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Page (or download) one city-year's records and install them in normalised form."""
        get_city(city)
        spec = self.specs.get(city)
        if spec is None:
            raise SourceUnavailableError(
                f"{self.info.source_id}: {city} has no declared {self.product_id} records; "
                f"cities with records: {', '.join(sorted(self.specs)) or 'none'}",
                reason="outside_source_coverage",
            )
        if source_year is None or source_year not in spec.years:
            raise SourceUnavailableError(
                f"{self.info.source_id}: {city} publishes no {source_year} records; it has "
                f"{', '.join(map(str, spec.years))}",
                reason="source_year_missing",
            )

        if spec.protocol == Protocol.user_file and city not in self.user_files:
            raise SourceUnavailableError(
                f"{self.info.source_id}: {city}'s {self.product_id} records come as a "
                f"user-supplied file ({spec.portal}); add its schema file under the source "
                "set's options: records: user_files",
                reason="records_not_supplied",
            )

        def write(staging: Path) -> StagedFiles:
            return self._write_item(staging, spec, source_year)

        installed = install_item(
            self.item_dir(city, source_year, dest), self.identity(spec, source_year), write
        )
        return self.installed_source_item(installed, city, source_year)

    def _write_item(self, staging: Path, spec: RecordProductSpec, year: int) -> StagedFiles:
        pager = Pager(spec, self.manager, spec.city, year)
        connector = self.connectors[spec.protocol.value]
        raw = connector.rows(spec, year, pager, self.endpoint(spec))
        frame = normalise(raw, spec, year, server_filtered=spec.year_filter is not None)
        write_records(frame, staging / "records.parquet")
        files = {"data": "records.parquet"}
        unmatched: list[str] = []
        if spec.spatial_form == SpatialForm.postcode:
            assert spec.points_table is not None
            keys = set(normalise_key(frame["postcode"]).dropna())
            unmatched = self._write_points(
                spec.points_table, keys, staging / "points.parquet", pager
            )
            files["points"] = "points.parquet"
        if spec.spatial_form == SpatialForm.admin_unit:
            assert spec.units_table is not None
            self._write_units(spec.units_table, staging / "units.geojson", pager)
            files["units"] = "units.geojson"
        if spec.coverage:
            self._write_coverage(spec.coverage, staging / "coverage.geojson", pager)
            files["coverage"] = "coverage.geojson"
        served = {"pages": pager.served, "portal": spec.portal, "protocol": spec.protocol.value}
        (staging / PROVENANCE_FILE).write_text(json.dumps(served, indent=1), encoding="utf-8")
        files["provenance"] = PROVENANCE_FILE
        extra: dict[str, Any] = {
            SPATIAL_FORM_KEY: spec.spatial_form.value,
            "records": str(len(frame)),
            "blank_values": str(blank_count(frame, spec.spatial_form)),
            "units": spec.unit,
            "protocol": spec.protocol.value,
            "pages": str(len(pager.served)),
        }
        if spec.spatial_form == SpatialForm.postcode:
            keys = normalise_key(frame["postcode"])
            extra["unmatched_keys"] = str(len(unmatched))
            extra["unmatched_records"] = str(int(keys.isin(unmatched).sum()))
            extra["unmatched_examples"] = " ".join(unmatched[:10])
        if spec.currency:
            extra["currency"] = spec.currency
        extra.update(pager.notes)
        return StagedFiles(files, extra)

    def _table(self, href: str, pager: Pager) -> pd.DataFrame:
        if is_url(href):
            body = pager.get_bytes(href)
        else:
            path = Path(href)
            if not path.is_file():
                raise SourceReadError(f"declared table {path} does not exist")
            body = path.read_bytes()
        try:
            return read_table_bytes(body, href)
        except Exception as exc:  # pandas/pyogrio raise many types for damaged tables
            raise SourceReadError(f"cannot read the declared table {href}: {exc}") from exc

    def _write_points(
        self, table: JoinTable, keys: set[str], path: Path, pager: Pager
    ) -> list[str]:
        """The centroid table cut to the keys the records use (a national file stays small);
        returns the record keys the table lacks, sorted (the core leaves those records out and
        counts them too)."""
        frame = self._table(table.href, pager)
        assert table.lon and table.lat
        for column in (table.key, table.lon, table.lat):
            if column not in frame:
                raise SourceReadError(f"points table {table.href} has no column {column!r}")
        out = pd.DataFrame(
            {
                "key": normalise_key(frame[table.key]),
                "lon": pd.to_numeric(frame[table.lon], errors="coerce"),
                "lat": pd.to_numeric(frame[table.lat], errors="coerce"),
            }
        ).dropna()
        out = out[out["key"].isin(keys)].drop_duplicates("key")
        pq.write_table(pa.Table.from_pandas(out, preserve_index=False), path)
        return sorted(keys - set(out["key"]))

    def _write_units(self, table: JoinTable, path: Path, pager: Pager) -> None:
        frame = self._table(table.href, pager)
        if not isinstance(frame, gpd.GeoDataFrame) or table.key not in frame:
            raise SourceReadError(
                f"unit boundaries {table.href} must be polygons with a {table.key!r} column"
            )
        units = gpd.GeoDataFrame(
            {"key": frame[table.key].astype(str)}, geometry=frame.geometry, crs=frame.crs
        ).to_crs(WGS84)
        units.to_file(path, driver="GeoJSON")

    def _write_coverage(self, href: str, path: Path, pager: Pager) -> None:
        frame = self._table(href, pager)
        if not isinstance(frame, gpd.GeoDataFrame):
            raise SourceReadError(f"coverage {href} must be a polygon layer")
        gpd.GeoDataFrame(geometry=frame.to_crs(WGS84).geometry, crs=WGS84).to_file(
            path, driver="GeoJSON"
        )
