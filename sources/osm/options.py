"""Settings of the ``osm`` adapter family, as a source-set file gives them under ``options``.

Where each city's OSM extract comes from is configuration, not code: Geofabrik's full-history
files need an OSM login, a planet-derived cut is a local file, and tests serve their own files
on loopback. An extract is named by a URL (downloaded through the shared download manager) or
by a local path (read in place).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sources.downloads import DownloadOptions


def _project_version() -> str:
    try:
        return version("citycube")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0"


OSM_API = "https://api.openstreetmap.org"
"""The OSM editing API, which also serves public GPS trace points (``/api/0.6/trackpoints``)."""


class GpsOptions(BaseModel):
    """How public GPS trace points are paged out of the OSM API, politely."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    api_url: str = Field(default=OSM_API, description="API root (a test server on loopback).")
    per_page: int = Field(
        default=5000,
        ge=1,
        description="Points the API returns per full page (the API's tracepoints_per_page, "
        "5000 in openstreetmap-website's settings); a shorter page is the last one.",
    )
    tile_deg: float = Field(
        default=0.25,
        gt=0,
        le=0.5,
        description="Edge of the bbox tiles the city window is cut into, degrees (the API "
        "refuses boxes over 0.25 square degrees).",
    )
    requests_per_second: float = Field(
        default=1.0,
        gt=0,
        description="Upper bound on API requests per second from one process (cache hits are "
        "free); with per_host 1 the family never runs two API requests at once.",
    )
    max_pages: int = Field(
        default=2000,
        ge=1,
        description="Pages asked per tile at most; a tile that still returns full pages then "
        "fails the fetch rather than silently truncating the points.",
    )
    first_year: int = Field(default=2005, ge=2000, le=2025, description="First year offered.")
    last_year: int = Field(default=2025, ge=2000, le=2025, description="Last year offered.")
    user_agent: str = Field(
        default=f"CityCube/{_project_version()} (urban data cube builder)",
        description="User-Agent sent to the API; its usage policy asks for one that names the "
        "application and its version.",
    )


class OsmFamilyOptions(DownloadOptions):
    """Where the OSM extracts are, where downloads go, and how patient the family is (the
    download settings of ``DownloadOptions``, with OSM's politer defaults)."""

    history: dict[str, str] = Field(
        default_factory=dict,
        description="City -> full-history PBF (.osh.pbf) as a URL or a local path. Roads (and "
        "buildings, unless `buildings` names another file) are cut from it at each snapshot.",
    )
    buildings: dict[str, str] = Field(
        default_factory=dict,
        description="City -> building extract, URL or path: a history file, or a template of "
        "dated extracts with {year}, {yy} (two digits) — '…/city-{yy}0101.osm.pbf'. Default: "
        "the city's `history` file.",
    )
    boundary: dict[str, str] = Field(
        default_factory=dict,
        description="City -> boundary polygon of its extracts (a .poly file in the Osmosis "
        "polygon filter format, as extract providers publish beside each extract), URL or "
        "path. What an extract covers is its header's bounding box, narrowed to this polygon; "
        "tiles outside it are unavailable, never zero.",
    )
    first_year: int = Field(
        default=2006,
        ge=2000,
        le=2025,
        description="First snapshot year offered for roads and buildings (earlier snapshots "
        "would be nearly empty, and an unmapped city is no evidence of no roads).",
    )
    last_year: int = Field(default=2025, ge=2000, le=2025, description="Last snapshot year.")
    dated_extract_days: int = Field(
        default=7,
        ge=0,
        description="A dated (non-history) extract serves a snapshot only when its own date is "
        "within this many days of 1 January of the year.",
    )
    auth_cookie_env: str | None = Field(
        default=None,
        description="Name of an environment variable whose value is sent as the Cookie header "
        "with extract downloads (Geofabrik's internal server, after its OSM login); the value "
        "is never logged or stored.",
    )
    gps: GpsOptions = Field(default_factory=GpsOptions, description="GPS trace point paging.")
    mirror_dir: Path | None = Field(
        default=None, description="Offline mirror of extracts laid out as <mirror>/<host>/<path>."
    )
    per_host: int = Field(default=1, ge=1, le=2, description="Concurrent downloads per host.")
    total_s: float = Field(default=3600.0, gt=0, description="Bound on all tries of one file.")
    wait_max_s: float = Field(default=120.0, gt=0, description="Longest back-off wait.")
    timeout_s: float = Field(default=120.0, gt=0, description="Timeout of one request.")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.first_year > self.last_year or self.gps.first_year > self.gps.last_year:
            raise ValueError("first_year must not be after last_year")
        return self
