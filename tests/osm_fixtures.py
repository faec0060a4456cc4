"""A small OSM full-history file for Amsterdam, written with pyosmium's writer.

Coordinates are laid out in the city's UTM zone (EPSG:32631) on 10 m pixel centres, so tile
values of the road modality can be worked out by hand, then stored as longitude/latitude at
OSM's 1e-7 degree precision. Every object's history is spelled out below; tests state what the
1 January 2015 and 2020 snapshots must hold independently of the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import osmium
from osmium.osm.mutable import Node, Relation, Way
from pyproj import Transformer

TO_WGS84 = Transformer.from_crs("EPSG:32631", "EPSG:4326", always_xy=True)

H_Y = 5_806_995.0
"""Northing of the main east-west road (a 10 m pixel centre in 2 km tile row 1)."""
V_X = 615_005.0
"""Easting of the north-south road (a pixel centre in 2 km tile column 2)."""


AMSTERDAM_BOX = (4.4, 52.1, 5.3, 52.6)
"""A header bounding box (west, south, east, north) around all of Amsterdam's window."""
EDGE_X = 625_000.0
"""A partial extract's box ends at the longitude of this easting (at the city's middle)."""
EDGE_LON = round(TO_WGS84.transform(EDGE_X, 5_800_000.0)[0], 7)
WEST_HALF = (4.4, 52.1, EDGE_LON, 52.6)
"""A header box holding the western part of Amsterdam only."""


def ts(text: str) -> datetime:
    """A UTC timestamp from 'YYYY-MM-DD' or 'YYYY-MM-DDTHH:MM:SS'."""
    value = datetime.fromisoformat(text)
    return value.replace(tzinfo=UTC)


def lonlat(x: float, y: float) -> tuple[float, float]:
    """UTM 31N → (lon, lat) rounded to OSM's precision."""
    lon, lat = TO_WGS84.transform(x, y)
    return (round(lon, 7), round(lat, 7))


@dataclass
class History:
    """Object versions to write, by type; each entry is one version."""

    nodes: list[Node] = field(default_factory=list)
    ways: list[Way] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)

    def node(self, nid: int, version: int, when: str, xy: tuple[float, float] | None) -> None:
        """One node version; ``xy`` None records a deletion."""
        common = {"id": nid, "version": version, "timestamp": ts(when), "changeset": version}
        if xy is None:
            self.nodes.append(Node(**common, visible=False))
        else:
            self.nodes.append(Node(**common, visible=True, location=lonlat(*xy)))

    def way(
        self,
        wid: int,
        version: int,
        when: str,
        refs: list[int] | None,
        tags: dict[str, str] | None = None,
    ) -> None:
        """One way version; ``refs`` None records a deletion."""
        common = {"id": wid, "version": version, "timestamp": ts(when), "changeset": version}
        if refs is None:
            self.ways.append(Way(**common, visible=False, nodes=[], tags={}))
        else:
            self.ways.append(Way(**common, visible=True, nodes=refs, tags=tags or {}))

    def relation(
        self, rid: int, version: int, when: str, members: list[tuple[int, str]], tags: dict
    ) -> None:
        """One relation version with way members (id, role)."""
        self.relations.append(
            Relation(
                id=rid,
                version=version,
                timestamp=ts(when),
                changeset=version,
                visible=True,
                members=[("w", ref, role) for ref, role in members],
                tags=tags,
            )
        )

    def write(
        self,
        path: Path,
        history: bool = True,
        stamp: str | None = None,
        bbox: tuple[float, float, float, float] | None = AMSTERDAM_BOX,
    ) -> Path:
        """Write a PBF, sorted by type, id and version as OSM files are; ``history`` sets the
        header's HistoricalInformation flag, ``bbox`` its bounding box (None: no box)."""
        header = osmium.io.Header()
        header.has_multiple_object_versions = history
        if bbox is not None:
            header.add_box(osmium.osm.Box(*bbox))
        if stamp:
            header.set("osmosis_replication_timestamp", stamp)
            header.set("timestamp", stamp)
        target = osmium.io.File(str(path), "osh.pbf" if history else "osm.pbf")
        target.has_multiple_object_versions = history
        with osmium.SimpleWriter(target, header=header, overwrite=True) as writer:
            for node in sorted(self.nodes, key=lambda o: (o.id, o.version)):
                writer.add_node(node)
            for way in sorted(self.ways, key=lambda o: (o.id, o.version)):
                writer.add_way(way)
            for relation in sorted(self.relations, key=lambda o: (o.id, o.version)):
                writer.add_relation(relation)
        return path


def square(h: History, first_node: int, x: float, y: float, when: str, size: float = 20.0) -> list:
    """Four nodes of a square footprint (created at ``when``); returns the closed ref list."""
    corners = [(x, y), (x + size, y), (x + size, y + size), (x, y + size)]
    for i, xy in enumerate(corners):
        h.node(first_node + i, 1, when, xy)
    return [first_node, first_node + 1, first_node + 2, first_node + 3, first_node]


def amsterdam_history() -> History:
    """Roads and buildings with the histories the tests expect (see the comments)."""
    h = History()
    # Way 100, primary: nodes 1-2-3 across the whole city east-west. Node 2 sits 3990 m south
    # until it moves onto the line in mid-2017; the name changes in 2018 (new way version).
    h.node(1, 1, "2010-03-01", (609_000.0, H_Y))
    h.node(2, 1, "2010-03-01", (625_000.0, H_Y - 3_990.0))
    h.node(2, 2, "2017-06-01", (625_000.0, H_Y))
    h.node(3, 1, "2010-03-01", (641_000.0, H_Y))
    h.way(100, 1, "2010-03-02", [1, 2, 3], {"highway": "primary", "name": "Main Road"})
    h.way(100, 2, "2018-05-01", [1, 2, 3], {"highway": "primary", "name": "Main Avenue"})
    # Way 101, secondary, deleted in 2016.
    h.node(10, 1, "2012-01-01", (612_005.0, 5_795_005.0))
    h.node(11, 1, "2012-01-01", (613_005.0, 5_795_005.0))
    h.way(101, 1, "2012-01-02", [10, 11], {"highway": "secondary", "name": "Side Street"})
    h.way(101, 2, "2016-02-01", None)
    # Way 102: residential (not drawn) until it is upgraded to trunk in 2017; north-south.
    h.node(20, 1, "2013-04-01", (V_X, 5_789_000.0))
    h.node(21, 1, "2013-04-01", (V_X, 5_811_000.0))
    h.way(102, 1, "2013-04-01", [20, 21], {"highway": "residential"})
    h.way(102, 2, "2017-09-01", [20, 21], {"highway": "trunk"})
    # Way 103, motorway_link, one second before the 2020 snapshot (outside the tile grids).
    h.node(30, 1, "2019-12-31T23:59:00", (641_505.0, 5_800_005.0))
    h.node(31, 1, "2019-12-31T23:59:00", (642_505.0, 5_800_005.0))
    h.way(103, 1, "2019-12-31T23:59:59", [30, 31], {"highway": "motorway_link"})
    # Way 104, primary_link, created exactly at the 2015 snapshot (timestamp <= t counts).
    h.node(32, 1, "2014-12-31", (641_505.0, 5_801_005.0))
    h.node(33, 1, "2014-12-31", (642_505.0, 5_801_005.0))
    h.way(104, 1, "2015-01-01T00:00:00", [32, 33], {"highway": "primary_link"})
    # Way 105: primary, then its highway tag removed in 2014 (version 2 carries no highway).
    h.node(40, 1, "2011-01-01", (611_005.0, 5_791_000.0))
    h.node(41, 1, "2011-01-01", (611_005.0, 5_799_000.0))
    h.way(105, 1, "2011-01-02", [40, 41], {"highway": "primary"})
    h.way(105, 2, "2014-06-01", [40, 41], {"name": "Old Road"})
    # Way 106: motorway near Rotterdam, outside the Amsterdam window.
    h.nodes.append(Node(id=60, version=1, timestamp=ts("2010-01-01"), changeset=1,
                        visible=True, location=(4.47, 51.92)))  # fmt: skip
    h.nodes.append(Node(id=61, version=1, timestamp=ts("2010-01-01"), changeset=1,
                        visible=True, location=(4.48, 51.92)))  # fmt: skip
    h.way(106, 1, "2010-01-02", [60, 61], {"highway": "motorway"})
    # Way 107, secondary with three nodes; the middle node is deleted in 2016 (the way keeps
    # referring to it), so the 2020 line has two vertices and one missing node reference.
    h.node(50, 1, "2010-01-01", (641_505.0, 5_795_005.0))
    h.node(51, 1, "2010-01-01", (642_005.0, 5_795_505.0))
    h.node(51, 2, "2016-03-01", None)
    h.node(52, 1, "2010-01-01", (642_505.0, 5_795_005.0))
    h.way(107, 1, "2010-01-02", [50, 51, 52], {"highway": "secondary"})
    # Way 108, residential: never drawn.
    h.node(70, 1, "2010-01-01", (617_005.0, 5_791_005.0))
    h.node(71, 1, "2010-01-01", (617_005.0, 5_799_005.0))
    h.way(108, 1, "2010-01-01", [70, 71], {"highway": "residential"})

    # Buildings (20 m squares west of the city centre).
    bx, by = 620_000.0, 5_802_000.0
    h.way(200, 1, "2010-05-01", square(h, 1000, bx, by, "2010-05-01"), {"building": "house"})
    refs = square(h, 1010, bx + 100, by, "2010-05-01")
    h.way(201, 1, "2010-05-01", refs, {"building": "yes"})
    h.way(201, 2, "2016-09-01", refs, {"building": "yes", "amenity": "school"})
    refs = square(h, 1020, bx + 200, by, "2012-01-01")
    h.way(202, 1, "2012-01-01", refs, {"building": "retail", "shop": "supermarket"})
    h.way(202, 2, "2018-01-01", None)
    refs = square(h, 1030, bx + 300, by, "2010-05-01")
    h.way(203, 1, "2010-05-01", refs, {"building": "yes", "amenity": "hospital"})
    refs = square(h, 1040, bx + 400, by, "2010-05-01")
    h.way(204, 1, "2010-05-01", refs, {"building": "no"})
    refs = square(h, 1050, bx + 500, by, "2011-05-01")
    h.way(205, 1, "2011-05-01", refs, {"building": "industrial"})
    refs = square(h, 1060, bx + 600, by, "2010-05-01")
    h.way(206, 1, "2010-05-01", refs[:3], {"building": "yes"})  # not closed: dropped
    # Relation 300: multipolygon church, 60 m outer ring with a 20 m courtyard.
    outer = square(h, 1100, bx, by + 200, "2013-02-01", size=60.0)
    inner = square(h, 1110, bx + 20, by + 220, "2013-02-01", size=20.0)
    h.way(301, 1, "2013-02-01", outer)
    h.way(302, 1, "2013-02-01", inner)
    h.relation(
        300,
        1,
        "2013-02-02",
        [(301, "outer"), (302, "inner")],
        {"type": "multipolygon", "building": "church"},
    )
    return h
