"""OSM road and building snapshots on 1 January of each year, cut from PBF extracts.

Roads come from a city's full-history file, filtered to the moment of the snapshot; buildings
from the same file or from dated extracts. Items have exactly the sample twins' form: a
GeoPackage ``roads`` layer (osm_id, highway, name, snapshot_date; LineStrings) or ``buildings``
layer (osm_id, building, the function tags the classifier reads, snapshot_date; Polygons), in
EPSG:4326, so the road-network and building-function modalities read them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.items.staging import StagedFiles
from citycube.processing.classify import OSM_FUNCTION_TAG_COLUMNS
from sources.downloads import redact_url
from sources.osm.base import (
    WGS84,
    Extract,
    OsmSource,
    digest_of,
    is_url,
    item_tags,
    ref_name,
    snapshot_time,
    window_wgs84,
    write_geopackage,
    write_provenance,
)
from sources.osm.coverage import (
    BoundaryError,
    coverage_in_window,
    extract_area,
    read_boundary,
    tile_shares,
)
from sources.osm.history import (
    HISTORY_SUFFIXES,
    Counts,
    ExtractError,
    building_polygons,
    road_lines,
    several_versions,
)

COVERAGE_FILE = "coverage.geojson"
"""The area the item's extract covers, within the item's window (WGS84 polygons)."""

BUILDING_TAG_COLUMNS = OSM_FUNCTION_TAG_COLUMNS
"""Function keys written next to ``building``, in the sample twin's column order (a test
checks they are exactly the twin's and the classifier's columns)."""


def road_classes() -> frozenset[str]:
    """``highway`` values the catalogue's road modalities draw (their filter values)."""
    catalogue = load_catalogue()
    classes = {
        value
        for spec in catalogue.modalities
        if spec.product == "osm_roads" and spec.rasterize and spec.rasterize.filter_values
        for value in spec.rasterize.filter_values
    }
    if not classes:
        raise ValueError("no modality reading osm_roads filters on highway values")
    return frozenset(str(v) for v in classes)


def min_valid_fraction(product: str) -> float:
    """The least valid share a tile needs in any modality drawn from ``product`` (the
    catalogue's validity rule: 98 % for the image modalities RD and POI)."""
    fractions = [
        spec.validity.min_valid_fraction
        for spec in load_catalogue().modalities
        if spec.product == product and spec.validity.min_valid_fraction is not None
    ]
    return min(fractions) if fractions else 1.0


@dataclass(frozen=True)
class HistoryVerdict:
    """Whether an extract holds history, judged by its content, and on what evidence."""

    history: bool
    """True: read through the time filter; False: the state at the header's date."""
    basis: str
    """The evidence, for the item's metadata."""


class _Snapshots(OsmSource):
    """A product cut from extracts at 1 January of each year."""

    kind: str
    """Feature kind: the GeoPackage layer name and the file name's last part."""
    geometry_type: str
    """Geometry type of the layer."""

    def source_years(self, city: str) -> list[int] | None:
        """The configured snapshot years, for a city with an extract configured."""
        if self.reference(city, self.options.first_year) is None:
            return []
        return list(range(self.options.first_year, self.options.last_year + 1))

    def reference(self, city: str, year: int) -> str | None:
        """The extract (URL or path) that serves a city-year, if configured."""
        return self.options.history.get(city)

    def wants_history(self, city: str) -> bool:
        """True when the configuration says the city's extract is a full-history file."""
        return True

    def identity(self, city: str, year: int) -> dict[str, Any]:
        """Identity: the extract, its boundary, the rules that select features, the window."""
        ref = self.reference(city, year) or ""
        boundary = self.options.boundary.get(city)
        return {
            **self.base_identity(city, year),
            "extract": self.ref_identity(ref),
            "boundary": self.ref_identity(boundary) if boundary else None,
            "rules": digest_of(
                {"rules": self.rules(), "window": window_wgs84(city), "days": self.days()}
            ),
        }

    # -- what an extract covers and holds ---------------------------------------------------

    def coverage(self, extract: Extract, city: str, year: int) -> shapely.Geometry:
        """The area the extract covers within the window (WGS84); refused when it covers no
        tile of the city enough to be valid under the catalogue's rule."""
        label = self.label(city, year)
        boundary = None
        boundary_ref = self.options.boundary.get(city)
        if boundary_ref:
            path = self.local_file(boundary_ref, "boundary file", city, year)
            try:
                boundary = read_boundary(path, ref_name(boundary_ref))
            except (BoundaryError, OSError) as exc:
                raise SourceReadError(
                    f"{label}: {exc}; give a .poly file (a name line, then sections of "
                    "'longitude latitude' lines each closed by END, then END) under the osm "
                    "options' boundary"
                ) from None
        area = extract_area(extract.info.bbox, boundary)
        if area is None:
            raise SourceReadError(
                f"{label}: extract file {extract.name} declares no bounding box in its header, "
                "so the area it covers is unknown and empty ground could not be told from "
                "ground the file leaves out; give its boundary polygon (.poly) under the osm "
                "options' boundary, or cut the extract with osmium extract (which records the "
                "box)"
            )
        coverage = coverage_in_window(area, window_wgs84(city))
        need = min_valid_fraction(self.product_id)
        shares = tile_shares(city, coverage)
        best = max(float(v.max()) for v in shares.values())
        if best < need:
            what = f"its header box {_bounds_text(extract.info.bbox)}"
            if boundary is not None:
                what += f" and boundary {ref_name(boundary_ref or '')}"
            raise SourceUnavailableError(
                f"{label}: extract file {extract.name} covers no tile of {city} ({what}; the "
                f"best-covered tile has {best:.1%} of its area inside, a tile needs "
                f"{need:.0%}); point the osm options at an extract that covers the city",
                reason="outside_source_coverage",
            )
        return coverage

    def history_of(self, extract: Extract, ref: str, city: str, year: int) -> HistoryVerdict:
        """History or not, from the content: the header's declared ``HistoricalInformation``,
        else a way or relation with several versions (or a deleted version). A file that the
        name (``.osh.pbf``) or the configuration (``history``) calls history but whose content
        is not is refused: read as history it would publish its one state for every later year
        and lose the objects edited after each snapshot."""
        if extract.info.history:
            return HistoryVerdict(True, "header declares history (HistoricalInformation)")
        try:
            sign = several_versions(extract.path)
        except ExtractError as exc:
            raise self.damaged(ref, extract.path, city, year, exc) from None
        if sign is not None:
            return HistoryVerdict(True, f"content: {sign}")
        claims = []
        if extract.name.endswith(HISTORY_SUFFIXES):
            claims.append("its name ends in .osh.pbf")
        if self.wants_history(city):
            claims.append("the osm options' history names it")
        if claims:
            raise SourceReadError(
                f"{self.label(city, year)}: extract file {extract.name} is not a full-history "
                f"file although {' and '.join(claims)}: its header declares no history "
                "(HistoricalInformation) and no way or relation in it has several versions. "
                "Give a full-history extract (osmium extract --with-history), or list a dated "
                "extract, named .osm.pbf, under the osm options' buildings"
            )
        return HistoryVerdict(False, "content: one version per object (dated extract)")

    def days(self) -> int:
        """Tolerance of dated extracts (part of the identity)."""
        return self.options.dated_extract_days

    def rules(self) -> object:
        """What selects the features (part of the identity)."""
        return None

    def write_item(self, staging: Path, city: str, year: int) -> StagedFiles:
        """Read the extract at the snapshot, keep the features in the window, write the layer."""
        ref = self.reference(city, year)
        assert ref is not None  # check_year refused unconfigured cities
        extract = self.extract(ref, city, year)
        coverage = self.coverage(extract, city, year)
        verdict = self.history_of(extract, ref, city, year)
        at = self.time_filter(extract, verdict.history, city, year)
        try:
            frame, counts = self.frame(extract.path, at)
        except ExtractError as exc:
            raise self.damaged(ref, extract.path, city, year, exc) from None
        west, south, east, north = window_wgs84(city)
        inside = shapely.intersects(
            frame.geometry.to_numpy(), shapely.box(west, south, east, north)
        )
        frame = frame[inside].reset_index(drop=True)
        date = snapshot_time(year).date().isoformat()
        frame["snapshot_date"] = date
        frame = frame[[c for c in frame.columns if c != "geometry"] + ["geometry"]]
        name = f"{city.lower()}-{year}0101-osm-{self.kind}.gpkg"
        write_geopackage(
            frame, staging / name, self.kind, self.geometry_type, item_tags(self, city, year)
        )
        gpd.GeoDataFrame({"part": [1]}, geometry=[coverage], crs=WGS84).to_file(
            staging / COVERAGE_FILE, driver="GeoJSON"
        )
        extra = {
            "snapshot_date": date,
            "features": str(len(frame)),
            **self.more_extra(frame, counts),
            "extract": extract.source,
            "extract_timestamp": extract.info.timestamp.isoformat()
            if extract.info.timestamp
            else "unknown",
            "time_filter": "history at snapshot" if at is not None else "dated extract as is",
            "history_basis": verdict.basis,
            "extract_bbox": _bounds_text(extract.info.bbox),
            "boundary": ref_name(self.options.boundary.get(city, "")) or "none",
            "missing_node_refs": str(counts.missing_nodes),
            "dropped_features": str(counts.dropped),
            "provenance_file": "sources.json",
        }
        record = self.provenance(extract, city, year, at, counts, len(frame))
        record["extract_history"] = verdict.history
        record["history_basis"] = verdict.basis
        record["extract_bbox"] = extract.info.bbox
        boundary = self.options.boundary.get(city)
        record["boundary"] = redact_url(boundary) if boundary and is_url(boundary) else boundary
        write_provenance(staging, record)
        return StagedFiles(files={"data": name, "coverage": COVERAGE_FILE}, extra=extra)

    def provenance(
        self, extract: Extract, city: str, year: int, at: datetime | None, counts: Counts, n: int
    ) -> dict[str, Any]:
        """The item's provenance record."""
        return {
            "product": self.product_id,
            "source_id": self.info.source_id,
            "version": self.info.version,
            "city": city,
            "snapshot": snapshot_time(year).isoformat(),
            "served_files": [
                {"url": extract.source, "sha256": extract.sha256, "bytes": extract.size}
            ],
            "extract_history": extract.info.history,
            "extract_timestamp": extract.info.timestamp,
            "time_filter": None if at is None else at.isoformat(),
            "window_wgs84": window_wgs84(city),
            "features": n,
            "missing_node_refs": counts.missing_nodes,
            "dropped_features": counts.dropped,
            "licence": self.info.licence,
            "attribution": self.info.attribution,
        }

    def frame(self, path: Path, at: datetime | None) -> tuple[gpd.GeoDataFrame, Counts]:
        """The features of the snapshot (all of the extract, before the window)."""
        raise NotImplementedError

    def more_extra(self, frame: gpd.GeoDataFrame, counts: Counts) -> dict[str, str]:
        """Product-specific item metadata."""
        return {}


class OsmRoadHistory(_Snapshots):
    """Major roads (the road modality's ``highway`` classes) at 1 January of each year."""

    product = "osm_roads"
    version = "osm-history-2"
    title = "OpenStreetMap roads"
    kind = "roads"
    geometry_type = "LineString"

    def rules(self) -> object:
        """The highway classes kept."""
        return sorted(road_classes())

    def frame(self, path: Path, at: datetime | None) -> tuple[gpd.GeoDataFrame, Counts]:
        """Ways whose highway class at the snapshot is one the road modality draws."""
        lines, counts = road_lines(path, at, road_classes())
        frame = gpd.GeoDataFrame(
            {
                "osm_id": np.array([wid for wid, _, _ in lines], dtype=np.int64),
                "highway": pd.Series([t["highway"] for _, t, _ in lines], dtype="str"),
                "name": pd.Series([t.get("name") for _, t, _ in lines], dtype="str"),
            },
            geometry=gpd.GeoSeries([g for _, _, g in lines], crs=WGS84),
            crs=WGS84,
        )
        return frame, counts


class OsmBuildingSnapshots(_Snapshots):
    """Buildings with their function tags at 1 January of each year."""

    product = "osm_buildings"
    version = "osm-history-2"
    title = "OpenStreetMap buildings"
    kind = "buildings"
    geometry_type = "Polygon"

    def reference(self, city: str, year: int) -> str | None:
        """The city's building extract (a dated template filled in), else its history file."""
        template = self.options.buildings.get(city)
        if template is None:
            return self.options.history.get(city)
        return template.format(year=year, yy=f"{year % 100:02d}")

    def wants_history(self, city: str) -> bool:
        """Only the ``history`` file is declared history; ``buildings`` may be either."""
        return city not in self.options.buildings

    def frame(self, path: Path, at: datetime | None) -> tuple[gpd.GeoDataFrame, Counts]:
        """Closed ways and multipolygons with ``building=*``; multipolygons split into parts."""
        keys = frozenset({"building", *BUILDING_TAG_COLUMNS})
        found, counts = building_polygons(path, at, keys)
        ids: list[int] = []
        tags: list[dict[str, str]] = []
        parts: list[shapely.Geometry] = []
        for oid, tag, shape in found:
            for part in shapely.get_parts(shape):
                if shapely.get_type_id(part) != 3 or part.is_empty:  # polygons only
                    continue
                ids.append(oid)
                tags.append(tag)
                parts.append(part)
        columns: dict[str, object] = {
            "osm_id": np.array(ids, dtype=np.int64),
            "building": pd.Series([t["building"] for t in tags], dtype="str"),
        }
        for key in BUILDING_TAG_COLUMNS:
            columns[key] = pd.Series([t.get(key) for t in tags], dtype="str")
        frame = gpd.GeoDataFrame(columns, geometry=gpd.GeoSeries(parts, crs=WGS84), crs=WGS84)
        return frame, counts

    def more_extra(self, frame: gpd.GeoDataFrame, counts: Counts) -> dict[str, str]:
        """How many buildings carry more than ``building=yes`` (as the twin reports), and how
        many building ways a multipolygon stands for."""
        return {
            "labelled_building_values": str(int((frame["building"] != "yes").sum())),
            "building_ways_in_multipolygons": str(counts.merged),
        }


def _bounds_text(bbox: tuple[float, float, float, float] | None) -> str:
    """A header box for messages: 'W,S,E,N' in degrees, or 'none'."""
    return "none" if bbox is None else ",".join(f"{v:.5f}" for v in bbox)
