"""The ``osm`` adapter family: OpenStreetMap roads, buildings and public GPS trace points.

Roads and buildings are cut from PBF extracts at 1 January of each year with pyosmium (a
full-history file through a time filter, or a dated extract); GPS points are paged out of the
OSM API's trackpoints call. Items have exactly their sample twins' form, so processing is
unchanged. Every download goes through the shared ``sources.downloads`` manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sources.downloads import DownloadManager
from sources.osm.base import OsmSource
from sources.osm.gps import OsmGpsTrackpoints
from sources.osm.options import OsmFamilyOptions
from sources.osm.snapshots import OsmBuildingSnapshots, OsmRoadHistory

ADAPTERS: tuple[type[OsmSource], ...] = (OsmRoadHistory, OsmBuildingSnapshots, OsmGpsTrackpoints)
"""The family's adapter classes, one per product."""


def osm_adapters(options: Mapping[str, Any]) -> list[OsmSource]:
    """The family's adapters for a source-set's ``options: {osm: …}``."""
    try:
        parsed = OsmFamilyOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid osm options: {exc}") from exc
    manager = DownloadManager(parsed.download_settings())
    return [adapter(parsed, manager) for adapter in ADAPTERS]


__all__ = ["ADAPTERS", "OsmFamilyOptions", "osm_adapters"]
