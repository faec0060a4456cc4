"""OSM PBF extracts read as they stood at one moment: the time filter over history files.

A full-history file holds every version of every object, sorted by type, id and version; a
version with ``visible=false`` records a deletion. The state of the map at a time ``t`` is, per
object, the latest version whose timestamp is at or before ``t``, kept only when that version is
visible. Ways and relations do not get new versions when their nodes move, so a way's geometry
at ``t`` takes each node's own location at ``t`` (a way can therefore change shape between two
snapshots without a new way version). A normal (dated) extract holds one version per object and
already is the state at its own date, so it is read without a time filter.

Files are read in a few passes, each restricted in libosmium (C++) to the object types and ids
it needs, so Python only sees the candidates: ids whose versions ever carried the key (a tag
filter alone would drop deletions and tag removals, which must win over older versions), then
the nodes those objects reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import osmium
import osmium.filter
import shapely
from shapely.ops import linemerge

T = TypeVar("T")

HISTORY_SUFFIXES = (".osh.pbf", ".osh")
"""File names conventionally used for history files. A name never decides: a file so named
whose content is not history is refused (see ``OsmSource.history_of``)."""

Bounds = tuple[float, float, float, float]
"""(west, south, east, north) in degrees."""


@dataclass(frozen=True)
class ExtractInfo:
    """What an extract's header says about it."""

    path: Path
    """The local file."""
    history: bool
    """True when the header declares history (the PBF ``HistoricalInformation`` feature:
    several versions per object, deletions kept)."""
    timestamp: datetime | None
    """The moment the data were taken (replication timestamp), if the header gives one."""
    bbox: Bounds | None = None
    """The bounding box the header declares (the area the extract was cut to), if any."""


class ExtractError(Exception):
    """libosmium could not read an extract (truncated, not a PBF, damaged blocks)."""


def _parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def pbf(path: Path) -> osmium.io.File:
    """The file as PBF, whatever its name (cached downloads are named by their digest)."""
    return osmium.io.File(str(path), "pbf")


def extract_info(path: Path) -> ExtractInfo:
    """Read an extract's header: declared history, data timestamp and bounding box.

    The file name is not consulted: cached downloads are named by their digest, and a name is
    only a claim (the planet's full history is published as ``history-….osm.pbf``).
    """
    try:
        reader = osmium.io.Reader(pbf(path), osmium.osm.NOTHING)
        try:
            header = reader.header()
            multiple = bool(header.has_multiple_object_versions)
            stamp = header.get("osmosis_replication_timestamp") or header.get("timestamp")
            box = header.box()
            bbox = None
            if box.valid():
                bbox = (
                    float(box.bottom_left.lon),
                    float(box.bottom_left.lat),
                    float(box.top_right.lon),
                    float(box.top_right.lat),
                )
        finally:
            reader.close()
    except RuntimeError as exc:
        raise ExtractError(str(exc)) from None
    return ExtractInfo(Path(path), multiple, _parse_time(stamp), bbox)


_KIND = {"n": "node", "w": "way", "r": "relation"}


def several_versions(path: Path) -> str | None:
    """The first sign that a file holds history, or None: a way or relation met twice (several
    versions of one object) or a deleted version (``visible=false``, which only history files
    keep). Nodes are not scanned: they are most of a file, and a history of any mapped area
    has several versions of its ways.

    The scan stops at the first sign, so only a file without history is read to its end.
    """
    seen: set[tuple[str, int]] = set()
    try:
        for obj in _processor(path, osmium.osm.WAY | osmium.osm.RELATION):
            key = (obj.type_str(), obj.id)
            if not obj.visible:
                return f"{_KIND[key[0]]} {obj.id} has a deleted version"
            if key in seen:
                return f"{_KIND[key[0]]} {obj.id} has several versions"
            seen.add(key)
    except RuntimeError as exc:
        raise ExtractError(str(exc)) from None
    return None


def _processor(
    path: Path, entities: osmium.osm.osm_entity_bits, filters: Iterable[Any] = ()
) -> osmium.FileProcessor:
    processor = osmium.FileProcessor(pbf(path), entities)
    for item in filters:
        processor = processor.with_filter(item)
    return processor


def ids_with_key(path: Path, entities: osmium.osm.osm_entity_bits, key: str) -> dict[str, set[int]]:
    """Ids (by type letter 'n', 'w', 'r') of objects any of whose versions carries ``key``."""
    found: dict[str, set[int]] = {"n": set(), "w": set(), "r": set()}
    try:
        for obj in _processor(path, entities, [osmium.filter.KeyFilter(key)]):
            found[obj.type_str()].add(obj.id)
    except RuntimeError as exc:
        raise ExtractError(str(exc)) from None
    return found


def states_at(
    path: Path,
    entities: osmium.osm.osm_entity_bits,
    ids: set[int],
    at: datetime | None,
    payload: Callable[[Any], T],
) -> dict[int, T]:
    """Each object's state at ``at``: its latest version with timestamp ≤ ``at``, if visible.

    ``payload`` copies what is needed out of a visible version (libosmium objects are only
    valid inside the loop). ``at=None`` reads every visible object as it is (a dated extract).
    Ordering by (timestamp, version) makes the result independent of the file's order.
    """
    if not ids:
        return {}
    latest: dict[int, tuple[datetime, int, T | None]] = {}
    try:
        for obj in _processor(path, entities, [osmium.filter.IdFilter(ids)]):
            stamp = obj.timestamp
            if at is not None and stamp > at:
                continue
            key = (stamp, obj.version)
            current = latest.get(obj.id)
            if current is None or key >= current[:2]:
                latest[obj.id] = (stamp, obj.version, payload(obj) if obj.visible else None)
    except RuntimeError as exc:
        raise ExtractError(str(exc)) from None
    return {oid: state[2] for oid, state in latest.items() if state[2] is not None}


@dataclass(frozen=True)
class WayState:
    """A way at the snapshot: the tags asked for and its node ids."""

    tags: dict[str, str]
    """Tags among the wanted keys."""
    refs: tuple[int, ...]
    """Node ids in order."""


@dataclass(frozen=True)
class Counts:
    """What the assembly had to leave out, reported in the item (never silently dropped)."""

    missing_nodes: int = 0
    """Node references without a visible node at the snapshot."""
    dropped: int = 0
    """Features whose geometry could not be built from the nodes present."""
    merged: int = 0
    """``building=*`` ways left out because a building multipolygon they are an outer member
    of stands for them (each building is counted once)."""


def _way_payload(keys: frozenset[str]) -> Callable[[Any], WayState]:
    def copy(way: Any) -> WayState:
        tags = {tag.k: tag.v for tag in way.tags if tag.k in keys}
        return WayState(tags, tuple(node.ref for node in way.nodes))

    return copy


def _location(node: Any) -> tuple[float, float] | None:
    location = node.location
    return (location.lon, location.lat) if location.valid() else None


def node_locations_at(
    path: Path, refs: set[int], at: datetime | None
) -> dict[int, tuple[float, float]]:
    """(lon, lat) of each referenced node at the snapshot (deleted or unborn nodes absent)."""
    found = states_at(path, osmium.osm.NODE, refs, at, _location)
    return {ref: xy for ref, xy in found.items() if xy is not None}


def road_lines(
    path: Path, at: datetime | None, classes: frozenset[str]
) -> tuple[list[tuple[int, dict[str, str], shapely.LineString]], Counts]:
    """Ways whose ``highway`` at the snapshot is one of ``classes``, as WGS84 lines."""
    candidates = ids_with_key(path, osmium.osm.WAY, "highway")["w"]
    ways = states_at(
        path, osmium.osm.WAY, candidates, at, _way_payload(frozenset({"highway", "name"}))
    )
    ways = {wid: w for wid, w in ways.items() if w.tags.get("highway") in classes}
    nodes = node_locations_at(path, {ref for w in ways.values() for ref in w.refs}, at)
    out: list[tuple[int, dict[str, str], shapely.LineString]] = []
    missing = dropped = 0
    for wid in sorted(ways):
        way = ways[wid]
        coords = [nodes[ref] for ref in way.refs if ref in nodes]
        missing += len(way.refs) - len(coords)
        if len(coords) < 2:
            dropped += 1
            continue
        out.append((wid, way.tags, shapely.LineString(coords)))
    return out, Counts(missing, dropped)


@dataclass(frozen=True)
class RelationState:
    """A relation at the snapshot: wanted tags, its type and its way members."""

    tags: dict[str, str]
    """Tags among the wanted keys."""
    kind: str
    """Its ``type`` tag."""
    ways: tuple[tuple[int, str], ...]
    """(way id, role) of its way members, in order."""


def _relation_payload(keys: frozenset[str]) -> Callable[[Any], RelationState]:
    def copy(relation: Any) -> RelationState:
        tags = {tag.k: tag.v for tag in relation.tags if tag.k in keys}
        members = tuple((m.ref, m.role) for m in relation.members if m.type == "w")
        return RelationState(tags, relation.tags.get("type", ""), members)

    return copy


def is_building(tags: dict[str, str]) -> bool:
    """``building=*`` marks a building, except ``building=no``."""
    value = tags.get("building")
    return value is not None and value != "no"


def building_polygons(
    path: Path, at: datetime | None, keys: frozenset[str]
) -> tuple[list[tuple[int, dict[str, str], shapely.Geometry]], Counts]:
    """Buildings at the snapshot: closed ways and multipolygon relations with ``building=*``.

    Each building is counted once: a ``building=*`` way that is an outer member (role
    ``outer`` or empty) of a building multipolygon is left out when that relation's polygon
    can be built, since the relation (with its inner rings and its own tags) is the building;
    when it cannot be built, the way stands alone. An inner member is a building of its own.
    Relations get negative ids (the osm2pgsql convention), so ids of ways and relations never
    collide in one column. Geometries are WGS84 polygons (a relation may give a MultiPolygon).
    """
    candidates = ids_with_key(path, osmium.osm.WAY | osmium.osm.RELATION, "building")
    relations = states_at(path, osmium.osm.RELATION, candidates["r"], at, _relation_payload(keys))
    relations = {
        rid: r for rid, r in relations.items() if r.kind == "multipolygon" and is_building(r.tags)
    }
    members = {wid for r in relations.values() for wid, _ in r.ways}
    ways = states_at(path, osmium.osm.WAY, candidates["w"] | members, at, _way_payload(keys))
    nodes = node_locations_at(path, {ref for w in ways.values() for ref in w.refs}, at)
    out: list[tuple[int, dict[str, str], shapely.Geometry]] = []
    missing = dropped = 0
    shapes: list[tuple[int, dict[str, str], shapely.Geometry]] = []
    outer_members: set[int] = set()
    for rid in sorted(relations):
        relation = relations[rid]
        shape, lost = _multipolygon(relation, ways, nodes)
        missing += lost
        if shape is None:
            dropped += 1
            continue
        shapes.append((-rid, relation.tags, shape))
        outer_members |= {wid for wid, role in relation.ways if role != "inner"}
    merged = 0
    for wid in sorted(candidates["w"]):
        way = ways.get(wid)
        if way is None or not is_building(way.tags):
            continue
        if wid in outer_members:
            merged += 1
            continue
        coords = [nodes[ref] for ref in way.refs if ref in nodes]
        missing += len(way.refs) - len(coords)
        closed = len(way.refs) >= 4 and way.refs[0] == way.refs[-1]
        if not closed or len(coords) != len(way.refs):
            dropped += 1
            continue
        polygon = shapely.Polygon(coords)
        if not polygon.is_valid:
            polygon = shapely.make_valid(polygon)
        if polygon.is_empty or polygon.area == 0:
            dropped += 1
            continue
        out.append((wid, way.tags, polygon))
    out.extend(shapes)
    return out, Counts(missing, dropped, merged)


def _multipolygon(
    relation: RelationState,
    ways: dict[int, WayState],
    nodes: dict[int, tuple[float, float]],
) -> tuple[shapely.Geometry | None, int]:
    """Outer rings minus inner rings, each ring merged from its member ways' lines."""
    lines: dict[str, list[shapely.LineString]] = {"outer": [], "inner": []}
    lost = 0
    for wid, role in relation.ways:
        way = ways.get(wid)
        if way is None:
            return None, lost  # a member missing at the snapshot: the ring cannot close
        coords = [nodes[ref] for ref in way.refs if ref in nodes]
        lost += len(way.refs) - len(coords)
        if len(coords) != len(way.refs) or len(coords) < 2:
            return None, lost
        lines["inner" if role == "inner" else "outer"].append(shapely.LineString(coords))
    if not lines["outer"]:
        return None, lost
    outer = _rings(lines["outer"])
    if outer.is_empty:
        return None, lost
    if lines["inner"]:
        outer = outer.difference(_rings(lines["inner"]))
    return (None if outer.is_empty else outer), lost


def _rings(lines: list[shapely.LineString]) -> shapely.Geometry:
    """The polygons that member ways' lines close into (ways of one ring may be split)."""
    merged = shapely.get_parts(linemerge(lines))
    return shapely.union_all(shapely.get_parts(shapely.polygonize(merged)))
