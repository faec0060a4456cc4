"""Public GPS trace points from the OSM API (``GET /api/0.6/trackpoints``), one year per item.

The API answers a bounding box (at most 0.25 square degrees) with GPX pages of up to
``tracepoints_per_page`` points (5000 in openstreetmap-website's settings), ``page=0, 1, …``;
a page shorter than that is the last. The city window is cut into bbox tiles and each tile is
paged until a short or empty page. Each page goes through the shared download manager (cached
by URL, retried on 429/5xx with the server's ``Retry-After``), at most ``requests_per_second``
requests leave one process, and a User-Agent names the application, as the API usage policy
asks. A point on an edge shared by two tiles is kept once (tiles are half-open).

**What a year means here.** The API returns every public point ever uploaded in the box, not a
snapshot: only points of *trackable* and *identifiable* traces carry their recorded time;
points of traces uploaded as *public* (legacy) come without a time, in an anonymous track. The
item of year Y therefore holds the timed points recorded during Y (1 January to 31 December,
UTC), as the sample twin's item does; undated points cannot be placed in any year and are
left out, counted in the item's ``undated_points``. Counts are a lower bound on the traces of
that year, from the archive as downloaded (the cache keeps one download for every year).

Items have the sample twin's form: GeoParquet points in EPSG:4326 with ``track_id`` (the trace
id of an identifiable trace, else a negative id per anonymous track segment in download order)
and ``time`` (UTC, ms), so the point-density aggregation applies unchanged.
"""

from __future__ import annotations

import math
import re
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.staging import StagedFiles
from sources.downloads import redact_url
from sources.osm.base import (
    WGS84,
    OsmSource,
    digest_of,
    item_tags,
    window_wgs84,
    write_geoparquet,
    write_provenance,
)

TRACE_ID = re.compile(r"/traces/(\d+)")
"""The trace id inside an identifiable track's ``<url>``."""

_pace_lock = threading.Lock()
_next_slot: dict[str, float] = {}


def pace(host: str, requests_per_second: float) -> None:
    """Wait until this process may send its next request to ``host``."""
    interval = 1.0 / requests_per_second
    with _pace_lock:
        now = time.monotonic()
        start = max(now, _next_slot.get(host, 0.0))
        _next_slot[host] = start + interval
    if start > now:
        time.sleep(start - now)


def bbox_tiles(
    bounds: tuple[float, float, float, float], size: float
) -> list[tuple[float, float, float, float]]:
    """The window cut into tiles of ``size`` degrees (the last row and column narrower)."""
    west, south, east, north = bounds
    cols = max(1, math.ceil((east - west) / size - 1e-9))
    rows = max(1, math.ceil((north - south) / size - 1e-9))
    xs = [round(min(west + i * size, east), 7) for i in range(cols)] + [round(east, 7)]
    ys = [round(min(south + j * size, north), 7) for j in range(rows)] + [round(north, 7)]
    return [(xs[i], ys[j], xs[i + 1], ys[j + 1]) for j in range(rows) for i in range(cols)]


@dataclass(frozen=True)
class GpxPage:
    """The points of one GPX page, in document order."""

    lon: np.ndarray
    """Longitudes."""
    lat: np.ndarray
    """Latitudes."""
    time: np.ndarray
    """Recorded times as datetime64[ms] (NaT where the point has none)."""
    track: np.ndarray
    """Track key per point: a trace id (> 0) or -(segment number on the page + 1)."""


def parse_gpx(data: bytes) -> GpxPage:
    """Points of a trackpoints GPX page, with the trace id of identifiable tracks."""
    root = ET.fromstring(data)
    if _local(root.tag) != "gpx":
        raise ValueError(f"root element is <{_local(root.tag)}>, not <gpx>")
    lon: list[float] = []
    lat: list[float] = []
    times: list[str | None] = []
    tracks: list[int] = []
    anonymous = 0
    for trk in root:
        if _local(trk.tag) != "trk":
            continue
        trace = None
        for child in trk:
            if _local(child.tag) == "url" and child.text and (m := TRACE_ID.search(child.text)):
                trace = int(m.group(1))
        for segment in trk:
            if _local(segment.tag) != "trkseg":
                continue
            if trace is None:
                anonymous += 1
            key = trace if trace is not None else -anonymous
            for point in segment:
                if _local(point.tag) != "trkpt":
                    continue
                lat.append(float(point.attrib["lat"]))
                lon.append(float(point.attrib["lon"]))
                stamp = next((c.text for c in point if _local(c.tag) == "time"), None)
                times.append(stamp)
                tracks.append(key)
    parsed = pd.to_datetime(pd.Series(times, dtype=object), utc=True, format="ISO8601")
    return GpxPage(
        np.asarray(lon, dtype=np.float64),
        np.asarray(lat, dtype=np.float64),
        parsed.dt.tz_localize(None).to_numpy().astype("datetime64[ms]"),
        np.asarray(tracks, dtype=np.int64),
    )


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


class OsmGpsTrackpoints(OsmSource):
    """Public GPS trace points recorded in one year inside the city window."""

    product = "osm_gps_traces"
    version = "api-0.6-trackpoints-1"
    title = "OpenStreetMap public GPS trace points"

    def source_years(self, city: str) -> list[int] | None:
        """Every configured year (the API serves the whole world)."""
        gps = self.options.gps
        return list(range(gps.first_year, gps.last_year + 1))

    def identity(self, city: str, year: int) -> dict[str, Any]:
        """Identity: the API, its paging and the window."""
        gps = self.options.gps
        return {
            **self.base_identity(city, year),
            "api": redact_url(gps.api_url),
            "paging": digest_of(
                {"per_page": gps.per_page, "tile": gps.tile_deg, "window": window_wgs84(city)}
            ),
        }

    def page_url(self, tile: tuple[float, float, float, float], page: int) -> str:
        """The trackpoints request of one tile and page."""
        bbox = ",".join(f"{v:.7f}" for v in tile)
        return f"{self.options.gps.api_url.rstrip('/')}/api/0.6/trackpoints?bbox={bbox}&page={page}"

    def get_page(self, url: str, city: str, year: int) -> tuple[GpxPage, dict[str, Any]]:
        """One page through the download manager, paced; unreadable pages are dropped."""
        gps = self.options.gps
        if not self.options.offline and self.manager.cached_path(url) is None:
            pace(urlsplit(url).netloc, gps.requests_per_second)
        try:
            got = self.manager.fetch(url, headers={"User-Agent": gps.user_agent})
        except SourceFetchError as exc:
            raise SourceFetchError(
                f"{self.info.source_id}: {city} {year}: {exc.message}",
                transient=exc.transient,
                status=exc.status,
            ) from None
        try:
            page = parse_gpx(got.path.read_bytes())
        except (ET.ParseError, ValueError, KeyError) as exc:
            self.manager.discard(url)
            raise SourceReadError(
                f"{self.info.source_id}: {city} {year}: GPX page {redact_url(url)} cannot be "
                f"read ({exc}); it was dropped from the download cache, fetch again"
            ) from None
        return page, {"url": got.url, "sha256": got.sha256, "bytes": got.size}

    def write_item(self, staging: Path, city: str, year: int) -> StagedFiles:
        """Page every tile, keep the year's dated points, write the GeoParquet."""
        gps = self.options.gps
        start = np.datetime64(datetime(year, 1, 1), "ms")
        end = np.datetime64(datetime(year + 1, 1, 1), "ms")
        tiles = bbox_tiles(window_wgs84(city), gps.tile_deg)
        kept: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        served: list[dict[str, Any]] = []
        undated = other_years = 0
        anonymous_base = 0
        for index, tile in enumerate(tiles):
            last_col = tile[2] == tiles[-1][2]
            last_row = tile[3] == tiles[-1][3]
            for number in range(gps.max_pages + 1):
                if number == gps.max_pages:
                    raise SourceFetchError(
                        f"{self.info.source_id}: {city} {year}: tile {index} still returned full "
                        f"pages after {gps.max_pages} pages; raise gps.max_pages or use smaller "
                        "tiles (gps.tile_deg) rather than truncate the points",
                        transient=False,
                    )
                page, record = self.get_page(self.page_url(tile, number), city, year)
                served.append(record)
                n = len(page.lon)
                inside = _in_tile(page.lon, page.lat, tile, last_col, last_row)
                dated = ~np.isnat(page.time)
                undated += int((inside & ~dated).sum())
                in_year = inside & dated & (page.time >= start) & (page.time < end)
                other_years += int((inside & dated & ~in_year).sum())
                track = page.track.copy()
                anonymous = track < 0
                track[anonymous] = track[anonymous] - anonymous_base
                if anonymous.any():
                    anonymous_base = int(-track[anonymous].min())
                kept.append(
                    (page.lon[in_year], page.lat[in_year], page.time[in_year], track[in_year])
                )
                if n < gps.per_page:
                    break
        lon = np.concatenate([k[0] for k in kept])
        if len(lon) == 0:
            raise SourceUnavailableError(
                f"{self.info.source_id}: the API served no dated public trace point recorded "
                f"in {year} inside the {city} window ({undated} undated points, {other_years} "
                "of other years)",
                reason="source_year_missing",
            )
        lat = np.concatenate([k[1] for k in kept])
        stamps = np.concatenate([k[2] for k in kept])
        tracks = np.concatenate([k[3] for k in kept])
        frame = gpd.GeoDataFrame(
            {
                "track_id": tracks.astype(np.int64),
                "time": pd.to_datetime(stamps.astype(np.int64), unit="ms", utc=True),
            },
            geometry=shapely.points(lon, lat),
            crs=WGS84,
        )
        name = f"{city.lower()}-{year}-gps-trackpoints.parquet"
        write_geoparquet(frame, staging / name, item_tags(self, city, year))
        retrieved = datetime.now(UTC).isoformat(timespec="seconds")
        write_provenance(
            staging,
            {
                "product": self.product_id,
                "source_id": self.info.source_id,
                "version": self.info.version,
                "city": city,
                "year": year,
                "api": redact_url(gps.api_url),
                "tiles": tiles,
                "served_files": served,
                "points": len(frame),
                "undated_points": undated,
                "points_of_other_years": other_years,
                "installed": retrieved,
                "licence": self.info.licence,
                "attribution": self.info.attribution,
            },
        )
        extra = {
            "points": str(len(frame)),
            "tracks": str(frame["track_id"].nunique()),
            "undated_points": str(undated),
            "points_of_other_years": str(other_years),
            "pages": str(len(served)),
            "tiles": str(len(tiles)),
            "api": redact_url(gps.api_url),
            "provenance_file": "sources.json",
        }
        return StagedFiles(files={"data": name}, extra=extra)


def _in_tile(
    lon: np.ndarray,
    lat: np.ndarray,
    tile: tuple[float, float, float, float],
    last_col: bool,
    last_row: bool,
) -> np.ndarray:
    """Points of a tile, half-open so a point on a shared edge belongs to one tile only."""
    west, south, east, north = tile
    in_x = (lon >= west) & ((lon <= east) if last_col else (lon < east))
    in_y = (lat >= south) & ((lat <= north) if last_row else (lat < north))
    return in_x & in_y
