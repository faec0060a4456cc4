"""What an OSM extract covers, whether it holds history, and how buildings are counted.

Every file here is a small PBF written with pyosmium by the test (``tests/osm_fixtures.py``):
the same Amsterdam history under different header boxes, boundary polygons and header flags,
and a few buildings whose ways are also multipolygon members. Expected tile states are worked
out from the geometry with pyproj, independently of the code under test.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely
from pyproj import Transformer

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.items.protocol import SourceSet
from citycube.processing.compute import process_partition
from sources.osm import osm_adapters
from sources.osm.base import OsmSource, window_wgs84
from tests.osm_fixtures import (
    EDGE_LON,
    H_Y,
    V_X,
    WEST_HALF,
    History,
    amsterdam_history,
    square,
)

CITY = "Amsterdam"
CAT = load_catalogue()
TO_LONLAT = Transformer.from_crs("EPSG:32631", "EPSG:4326", always_xy=True)


def family(tmp_path: Path, **options: Any) -> dict[str, OsmSource]:
    """The family's adapters by product, caching under ``tmp_path``."""
    settings: dict[str, Any] = {"cache_dir": tmp_path / "cache", "attempts": 1, **options}
    return {a.product_id: a for a in osm_adapters(settings)}


def written(tmp_path: Path, name: str, **write: Any) -> str:
    """The Amsterdam history written to ``name`` with the given header settings."""
    write.setdefault("stamp", "2024-06-01T00:00:00Z")
    return str(amsterdam_history().write(tmp_path / name, **write))


def plain_2020(tmp_path: Path, name: str, **write: Any) -> str:
    """The 2020 state of the history as a plain (one version per object) extract."""
    history = amsterdam_history()
    at = datetime(2020, 1, 1, tzinfo=UTC)
    for kind in ("nodes", "ways", "relations"):
        latest: dict[int, Any] = {}
        for obj in sorted(getattr(history, kind), key=lambda o: o.version):
            if obj.timestamp <= at:
                latest[obj.id] = obj
        setattr(history, kind, [o for o in latest.values() if o.visible])
    write.setdefault("stamp", "2020-01-01T00:00:00Z")
    return str(history.write(tmp_path / name, history=False, **write))


def rows_of(release: Release, modality: str, year: int) -> dict[str, dict[str, Any]]:
    table = pq.read_table(release.observations_file(CITY, year, modality)).to_pylist()
    return {r["tile_id"]: r for r in table}


def tile_lons(scale: str) -> dict[str, np.ndarray]:
    """Longitudes of every 10 m pixel centre of each tile of a grid."""
    grid = city_grid(CITY, scale)
    offsets = np.arange(5.0, grid.tile_size, 10.0)
    out = {}
    for tile in grid.tiles():
        x0, y0, _, _ = tile.bounds
        xs, ys = np.meshgrid(x0 + offsets, y0 + offsets)
        out[tile.tile_id] = TO_LONLAT.transform(xs.ravel(), ys.ravel())[0]
    return out


def road_fraction(tile_id: str, scale: str) -> float:
    """The 2020 road fraction of a tile, by hand (see tests/test_osm_sources.py)."""
    grid = city_grid(CITY, scale)
    n = int(grid.tile_size / 10)
    r, c = (int(p[1:]) for p in tile_id.split("_")[2:4])
    left = grid.x_min + c * grid.tile_size
    top = grid.y_max - r * grid.tile_size
    h = top - grid.tile_size <= H_Y < top
    v = left <= V_X < left + grid.tile_size
    return (n * h + n * v - (h and v)) / (n * n)


# ------------------------------------------------------------------------------- coverage


def test_tiles_outside_a_partial_extract_are_unavailable_never_zero(tmp_path: Path) -> None:
    """The header box holds the city's western part: tiles east of it are not 0 but
    ``outside_source_coverage``; tiles inside keep their road fractions and zeros."""
    path = written(tmp_path, "amsterdam-west.osh.pbf", bbox=WEST_HALF)
    adapters = family(tmp_path, history={CITY: path})
    release = Release(tmp_path / "data", "t")
    sources = SourceSet([adapters["osm_roads"], adapters["osm_buildings"]])
    for code in ("RD", "POI"):
        process_partition(CAT.get(code), CAT, CITY, 2020, sources, release)
    rd, poi = rows_of(release, "RD", 2020), rows_of(release, "POI", 2020)
    inside = outside = straddling = 0
    for scale in ("2km", "5km"):
        for tile_id, lons in tile_lons(scale).items():
            share = float((lons <= EDGE_LON).mean())
            got = rd[tile_id]
            if share == 1.0:
                inside += 1
                assert got["available"] and got["reason"] is None, tile_id
                assert got["value"] == pytest.approx(road_fraction(tile_id, scale), abs=1e-12)
                assert poi[tile_id]["available"], tile_id
            elif abs(share - 0.98) > 0.002:
                outside += share == 0.0
                straddling += share > 0.0
                ok = share > 0.98
                assert got["available"] is ok, (tile_id, share)
                if not ok:
                    for row in (got, poi[tile_id]):
                        assert row["value"] is None, tile_id
                        assert row["reason"] == "outside_source_coverage", tile_id
    assert inside >= 40 and outside >= 40 and straddling >= 5
    # Zeros stay where the file covers ground without roads.
    assert rd["Amsterdam_2KM_r0_c0"]["value"] == 0.0 and rd["Amsterdam_2KM_r0_c0"]["available"]


def test_an_extract_far_from_the_city_is_refused_naming_the_file(tmp_path: Path) -> None:
    rotterdam = written(tmp_path, "rotterdam.osh.pbf", bbox=(4.3, 51.85, 4.6, 52.0))
    roads = family(tmp_path, history={CITY: rotterdam})["osm_roads"]
    with pytest.raises(SourceUnavailableError) as caught:
        roads.fetch(CITY, 2020, tmp_path / "sources")
    assert caught.value.reason == "outside_source_coverage"
    for part in ("rotterdam.osh.pbf", CITY, "covers no tile", "2020-01-01"):
        assert part in str(caught.value)
    assert not (tmp_path / "sources" / "osm_roads" / CITY / "2020").exists()
    # A box that meets the window's margin but no tile enough is refused the same way.
    west, south, _, north = window_wgs84(CITY)
    strip = written(tmp_path, "strip.osh.pbf", bbox=(west, south, west + 0.02, north))
    roads = family(tmp_path, history={CITY: strip})["osm_roads"]
    with pytest.raises(SourceUnavailableError, match=r"strip\.osh\.pbf covers no tile"):
        roads.fetch(CITY, 2020, tmp_path / "sources")
    # Processing marks every tile unavailable with that reason, never 0.
    release = Release(tmp_path / "data", "t")
    process_partition(CAT.get("RD"), CAT, CITY, 2020, SourceSet([roads]), release)
    rows = rows_of(release, "RD", 2020)
    assert rows and {(r["value"], r["available"], r["reason"]) for r in rows.values()} == {
        (None, False, "outside_source_coverage")
    }


def poly_text(rings: list[tuple[str, list[tuple[float, float]]]]) -> str:
    """A .poly file (Osmosis polygon filter format) from (section name, points)."""
    out = ["amsterdam"]
    for name, points in rings:
        out.append(name)
        out.extend(f"   {lon:.7f}   {lat:.7f}" for lon, lat in points)
        out.append("END")
    out.append("END")
    return "\n".join(out) + "\n"


def test_a_boundary_polygon_narrows_the_coverage_to_its_rings(tmp_path: Path) -> None:
    """A .poly with a hole: tiles in the hole are outside the coverage though the header box
    holds them; the item's coverage is the box ∩ polygon ∩ window."""
    hole_utm = [(610_000.0, 5_790_000.0), (620_000.0, 5_790_000.0),
                (620_000.0, 5_796_000.0), (610_000.0, 5_796_000.0)]  # fmt: skip
    hole = [TO_LONLAT.transform(x, y) for x, y in hole_utm]
    outer = [(4.3, 52.0), (5.4, 52.0), (5.4, 52.7), (4.3, 52.7)]
    poly = tmp_path / "amsterdam.poly"
    poly.write_text(poly_text([("1", outer), ("!2", hole)]), encoding="utf-8")
    path = written(tmp_path, "amsterdam.osh.pbf")
    adapters = family(tmp_path, history={CITY: path}, boundary={CITY: str(poly)})
    item = adapters["osm_roads"].fetch(CITY, 2020, tmp_path / "sources")
    coverage = shapely.union_all(gpd.read_file(item.files["coverage"]).geometry.values)
    west, south, east, north = window_wgs84(CITY)
    want = shapely.box(max(4.4, west), max(52.1, south), min(5.3, east), min(52.6, north))
    want = want.difference(shapely.Polygon(hole))
    assert coverage.symmetric_difference(want).area < 1e-6 * want.area
    release = Release(tmp_path / "data", "t")
    process_partition(CAT.get("RD"), CAT, CITY, 2020, SourceSet([adapters["osm_roads"]]), release)
    rows = rows_of(release, "RD", 2020)
    grid = city_grid(CITY, "2km")
    for tile in grid.tiles():
        x0, y0, x1, y1 = tile.bounds
        in_hole = x1 <= 620_000.0 and y1 <= 5_796_000.0
        row = rows[tile.tile_id]
        if in_hole:  # rows 7-9, columns 0-4
            assert (row["value"], row["reason"]) == (None, "outside_source_coverage"), row
        elif x0 >= 620_000.0 + 2_000.0 or y0 >= 5_796_000.0 + 2_000.0:
            assert row["available"] and row["value"] == pytest.approx(
                road_fraction(tile.tile_id, "2km"), abs=1e-12
            )
    assert sum(r["reason"] == "outside_source_coverage" for r in rows.values()) >= 15


def test_a_file_without_a_header_box_needs_a_boundary(tmp_path: Path) -> None:
    path = written(tmp_path, "nobox.osh.pbf", bbox=None)
    roads = family(tmp_path, history={CITY: path})["osm_roads"]
    with pytest.raises(SourceReadError, match=r"nobox\.osh\.pbf declares no bounding box"):
        roads.fetch(CITY, 2020, tmp_path / "sources")
    poly = tmp_path / "city.poly"
    poly.write_text(poly_text([("1", [(4.4, 52.1), (5.3, 52.1), (5.3, 52.6), (4.4, 52.6)])]))
    roads = family(tmp_path, history={CITY: path}, boundary={CITY: str(poly)})["osm_roads"]
    assert roads.fetch(CITY, 2020, tmp_path / "sources").extra["boundary"] == "city.poly"
    poly.write_text("amsterdam\n1\n   4.4 52.1\n   5.3 x\nEND\nEND\n")
    roads = family(tmp_path, history={CITY: path}, boundary={CITY: str(poly)})["osm_roads"]
    with pytest.raises(SourceReadError, match=r"boundary file city\.poly.*'5\.3 x'"):
        roads.fetch(CITY, 2021, tmp_path / "sources")


# -------------------------------------------------------------------------------- history


def test_a_plain_extract_named_as_history_is_refused(tmp_path: Path) -> None:
    """One version per object and no history flag: not history, whatever its name says."""
    renamed = plain_2020(tmp_path, "amsterdam.osh.pbf")
    for options in ({"history": {CITY: renamed}},
                    {"history": {CITY: "unused"}, "buildings": {CITY: renamed}}):  # fmt: skip
        adapters = family(tmp_path, **options)
        product = "osm_roads" if "buildings" not in options else "osm_buildings"
        with pytest.raises(SourceReadError) as caught:
            adapters[product].fetch(CITY, 2021, tmp_path / "sources")
        message = str(caught.value)
        assert "amsterdam.osh.pbf is not a full-history file" in message
        assert "its name ends in .osh.pbf" in message
    # Named as a plain extract but configured as the history file: refused for the same reason.
    plain = plain_2020(tmp_path, "amsterdam-200101.osm.pbf")
    roads = family(tmp_path, history={CITY: plain})["osm_roads"]
    with pytest.raises(SourceReadError, match="the osm options' history names it"):
        roads.fetch(CITY, 2020, tmp_path / "sources")
    assert not (tmp_path / "sources" / "osm_roads" / CITY / "2020").exists()


def test_history_is_read_from_the_content_not_the_name(tmp_path: Path) -> None:
    """The full history without the header flag, named like a plain extract (as the planet's
    history-….osm.pbf is): its several versions make it history."""
    path = written(tmp_path, "amsterdam-full.osm.pbf", history=False)
    roads = family(tmp_path, history={CITY: path})["osm_roads"]
    item = roads.fetch(CITY, 2015, tmp_path / "sources")
    assert item.extra["time_filter"] == "history at snapshot"
    assert item.extra["history_basis"] == "content: way 100 has several versions"
    frame = gpd.read_file(item.files["data"], layer="roads")
    assert sorted(frame["osm_id"]) == [100, 101, 104, 107]  # the 2015 state, by hand
    # A dated plain extract under `buildings` is still read as the state at its date.
    plain = plain_2020(tmp_path, "amsterdam-200101.osm.pbf")
    buildings = family(tmp_path, history={CITY: "unused"}, buildings={CITY: plain})
    item = buildings["osm_buildings"].fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["time_filter"] == "dated extract as is"
    assert item.extra["history_basis"] == "content: one version per object (dated extract)"


# ------------------------------------------------------------------------------ buildings


def buildings_once() -> History:
    """A church drawn both ways (its outer ring a ``building=yes`` way and a building
    multipolygon), a kiosk way inside the courtyard (an inner member and a building of its
    own), and a shed whose relation cannot be built (a member way is missing)."""
    h = History()
    bx, by = 620_000.0, 5_802_000.0
    outer = square(h, 1, bx, by, "2012-01-01", size=60.0)
    inner = square(h, 11, bx + 20, by + 20, "2012-01-01", size=20.0)
    h.way(10, 1, "2012-01-01", outer, {"building": "yes", "amenity": "place_of_worship"})
    h.way(20, 1, "2012-01-01", inner, {"building": "kiosk"})
    h.relation(
        1, 1, "2012-01-02", [(10, "outer"), (20, "inner")],
        {"type": "multipolygon", "building": "church"},
    )  # fmt: skip
    shed = square(h, 21, bx + 200, by, "2012-01-01")
    h.way(30, 1, "2012-01-01", shed, {"building": "shed"})
    h.relation(
        2, 1, "2012-01-02", [(30, "outer"), (99, "outer")],
        {"type": "multipolygon", "building": "shed"},
    )  # fmt: skip
    return h


def test_a_building_way_that_is_a_multipolygon_outer_ring_counts_once(tmp_path: Path) -> None:
    path = buildings_once().write(tmp_path / "buildings.osh.pbf", stamp="2024-01-01T00:00:00Z")
    buildings = family(tmp_path, history={CITY: str(path)})["osm_buildings"]
    item = buildings.fetch(CITY, 2020, tmp_path / "sources")
    frame = gpd.read_file(item.files["data"], layer="buildings")
    areas = dict(zip(frame["osm_id"], frame.to_crs(32631).area, strict=True))
    # By hand: the church once, as relation 1 (60 m square minus the 20 m courtyard), with the
    # relation's tags; the kiosk (inner member) as its own way; the shed's relation lacks way
    # 99, so way 30 stands alone.
    assert sorted(areas) == [-1, 20, 30]
    assert areas[-1] == pytest.approx(3600.0 - 400.0, rel=1e-3)
    assert areas[20] == pytest.approx(400.0, rel=1e-3) and areas[30] == pytest.approx(
        400.0, rel=1e-3
    )
    church = frame[frame["osm_id"] == -1].iloc[0]
    assert church["building"] == "church"
    assert item.extra["building_ways_in_multipolygons"] == "1"
    assert item.extra["dropped_features"] == "1"  # relation 2
