"""The osm adapter family on loopback: history PBFs written with pyosmium, a trackpoints API.

Expectations are written by hand from the histories in ``tests/osm_fixtures.py`` (which
objects exist at each snapshot, with which tags and vertices) and from the pixel layout of the
roads; nothing is computed with the code under test.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import geopandas as gpd
import numpy as np
import pyarrow.parquet as pq
import pyogrio
import pytest

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.items.protocol import SourceSet, SourceSetSpec, load_source_set_spec
from citycube.processing.classify import CLASSIFIER_COLUMNS, osm_building_function
from citycube.processing.compute import process_partition
from sources import build_source_set
from sources.osm import osm_adapters
from sources.osm.base import OsmSource, window_wgs84
from sources.osm.snapshots import BUILDING_TAG_COLUMNS
from tests.faulty_http_server import FaultyServer, LoopbackServer
from tests.osm_fixtures import H_Y, V_X, amsterdam_history, lonlat

CITY = "Amsterdam"
CAT = load_catalogue()


@pytest.fixture(scope="module")
def history_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("osh") / "amsterdam.osh.pbf"
    amsterdam_history().write(path, stamp="2024-06-01T00:00:00Z")
    return path.read_bytes()


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def family(tmp_path: Path, **options: Any) -> dict[str, OsmSource]:
    """The family's adapters by product, impatient, caching under ``tmp_path``."""
    settings: dict[str, Any] = {
        "cache_dir": tmp_path / "cache",
        "attempts": 3,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.05,
        "timeout_s": 5.0,
        "chunk_bytes": 1024,
        **options,
    }
    return {a.product_id: a for a in osm_adapters(settings)}


def read_layer(path: Path, layer: str) -> gpd.GeoDataFrame:
    return gpd.read_file(path, layer=layer)


def rounded(coords: Any) -> list[tuple[float, float]]:
    return [(round(x, 7), round(y, 7)) for x, y in coords]


# ------------------------------------------------------------------------------------ roads


def test_roads_at_two_snapshots_follow_the_history(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/amsterdam.osh.pbf", history_bytes)
    roads = family(tmp_path, history={CITY: url})["osm_roads"]
    got: dict[int, dict[int, tuple[str, str | None, list]]] = {}
    for year in (2015, 2020):
        item = roads.fetch(CITY, year, tmp_path / "sources")
        frame = read_layer(Path(item.files["data"]), "roads")
        assert frame.crs.to_epsg() == 4326
        assert set(frame["snapshot_date"]) == {f"{year}-01-01"}
        got[year] = {
            int(r.osm_id): (r.highway, r.name if isinstance(r.name, str) else None,
                            rounded(r.geometry.coords))
            for r in frame.itertuples()
        }  # fmt: skip
        assert item.extra["features"] == str(len(frame)) and item.synthetic is False
    west = lonlat(609_000.0, H_Y)
    east = lonlat(641_000.0, H_Y)
    # By hand from the history: 101 exists until its deletion in 2016; 102 is residential until
    # 2017; 103 appears one second before 2020; 104 exactly at 2015-01-01T00:00Z; 105 lost its
    # highway tag in 2014; 106 is outside the window; 108 is residential; node 2 moved in 2017;
    # node 51 of way 107 was deleted in 2016.
    assert got[2015] == {
        100: ("primary", "Main Road", [west, lonlat(625_000.0, H_Y - 3_990.0), east]),
        101: ("secondary", "Side Street",
              [lonlat(612_005.0, 5_795_005.0), lonlat(613_005.0, 5_795_005.0)]),
        104: ("primary_link", None,
              [lonlat(641_505.0, 5_801_005.0), lonlat(642_505.0, 5_801_005.0)]),
        107: ("secondary", None, [lonlat(641_505.0, 5_795_005.0), lonlat(642_005.0, 5_795_505.0),
                                  lonlat(642_505.0, 5_795_005.0)]),
    }  # fmt: skip
    assert got[2020] == {
        100: ("primary", "Main Avenue", [west, lonlat(625_000.0, H_Y), east]),
        102: ("trunk", None, [lonlat(V_X, 5_789_000.0), lonlat(V_X, 5_811_000.0)]),
        103: ("motorway_link", None,
              [lonlat(641_505.0, 5_800_005.0), lonlat(642_505.0, 5_800_005.0)]),
        104: ("primary_link", None,
              [lonlat(641_505.0, 5_801_005.0), lonlat(642_505.0, 5_801_005.0)]),
        107: ("secondary", None, [lonlat(641_505.0, 5_795_005.0), lonlat(642_505.0, 5_795_005.0)]),
    }  # fmt: skip
    item = roads.fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["missing_node_refs"] == "1"
    assert item.extra["time_filter"] == "history at snapshot"
    assert len(server.requests_for("extracts/amsterdam.osh.pbf")) == 1  # cached, then reused


def test_processing_the_road_item_gives_the_hand_computed_road_fractions(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/amsterdam.osh.pbf", history_bytes)
    roads = family(tmp_path, history={CITY: url})["osm_roads"]
    release = Release(tmp_path / "data", "t")
    rd = CAT.get("RD")
    process_partition(rd, CAT, CITY, 2020, SourceSet([roads]), release)
    rows = pq.read_table(release.observations_file(CITY, 2020, "RD")).to_pylist()
    assert rows
    # In 2020 the east-west road lies on the pixel row centred at H_Y and spans every grid; the
    # north-south trunk on the pixel column centred at V_X spans every grid. A 10 m chip pixel
    # row of a tile of n×n pixels holds n road pixels; a tile crossed by both holds 2n - 1.
    for scale in ("2km", "5km"):
        grid = city_grid(CITY, scale)
        n = int(grid.tile_size / 10)
        for row in (r for r in rows if r["scale"] == scale):
            r, c = (int(p[1:]) for p in row["tile_id"].split("_")[2:4])
            left = grid.x_min + c * grid.tile_size
            top = grid.y_max - r * grid.tile_size
            h = top - grid.tile_size <= H_Y < top
            v = left <= V_X < left + grid.tile_size
            expected = (n * h + n * v - (h and v)) / (n * n)
            assert row["available"] is True
            assert row["value"] == pytest.approx(expected, abs=1e-12), row["tile_id"]
    values = {r["tile_id"]: r["value"] for r in rows}
    assert values["Amsterdam_2KM_r1_c2"] == pytest.approx(399 / 40_000)
    assert values["Amsterdam_2KM_r0_c0"] == 0.0  # no mapped road is a valid zero


# ------------------------------------------------------------------------------- buildings


def test_buildings_and_their_classes_at_two_snapshots(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/amsterdam.osh.pbf", history_bytes)
    buildings = family(tmp_path, history={CITY: url})["osm_buildings"]
    classes: dict[int, dict[int, int]] = {}
    areas: dict[int, float] = {}
    for year in (2015, 2020):
        item = buildings.fetch(CITY, year, tmp_path / "sources")
        frame = read_layer(Path(item.files["data"]), "buildings")
        assert list(frame.columns) == [
            "osm_id", "building", *BUILDING_TAG_COLUMNS, "snapshot_date", "geometry"
        ]  # fmt: skip
        ids = frame["osm_id"].to_numpy()
        classes[year] = dict(zip(ids.tolist(), osm_building_function(frame).tolist(), strict=True))
        utm = frame.to_crs(32631)
        areas.update(zip(ids.tolist(), utm.area.tolist(), strict=True))
        assert item.extra["dropped_features"] == "1"  # way 206 is not closed
    # By hand: 200 house (residential 2); 201 plain building (1) until amenity=school in 2016
    # (education 4); 202 supermarket (commercial 3) deleted in 2018; 203 hospital (5); 204 is
    # building=no; 205 industrial (10); relation 300 a church (religious 11), id negated.
    assert classes[2015] == {200: 2, 201: 1, 202: 3, 203: 5, 205: 10, -300: 11}
    assert classes[2020] == {200: 2, 201: 4, 203: 5, 205: 10, -300: 11}
    assert areas[200] == pytest.approx(400.0, rel=1e-3)
    assert areas[-300] == pytest.approx(3600.0 - 400.0, rel=1e-3)  # courtyard cut out


def test_a_dated_extract_serves_its_own_date_and_nothing_far_from_it(
    tmp_path: Path, server: FaultyServer
) -> None:
    """A non-history extract is the state at its header's date: read without a time filter."""
    history = amsterdam_history()
    latest = {}
    for way in history.ways:  # the 2020 state of the buildings, written by hand as one file
        if way.timestamp <= datetime(2020, 1, 1, tzinfo=UTC):
            latest[way.id] = way
    history.ways = [w for w in latest.values() if w.visible]
    history.nodes = [n for n in history.nodes if n.visible]
    path = history.write(tmp_path / "amsterdam-200101.osm.pbf", history=False,
                         stamp="2020-01-01T00:00:00Z")  # fmt: skip
    server.add("dated/amsterdam-200101.osm.pbf", path.read_bytes())
    template = server.url("dated/amsterdam-{yy}0101.osm.pbf")
    buildings = family(tmp_path, buildings={CITY: template}, history={CITY: "unused"})[
        "osm_buildings"
    ]
    item = buildings.fetch(CITY, 2020, tmp_path / "sources")
    frame = read_layer(Path(item.files["data"]), "buildings")
    assert dict(zip(frame["osm_id"], osm_building_function(frame), strict=True)) == {
        200: 2, 201: 4, 203: 5, 205: 10, -300: 11
    }  # fmt: skip
    assert item.extra["time_filter"] == "dated extract as is"
    with pytest.raises(SourceFetchError, match="404"):
        buildings.fetch(CITY, 2019, tmp_path / "sources")  # no 190101 file is served


# ---------------------------------------------------------------------------------- faults


def test_a_truncated_extract_fails_naming_source_city_date_and_file(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/cut.osh.pbf", history_bytes[: len(history_bytes) // 2])
    roads = family(tmp_path, history={CITY: url})["osm_roads"]
    with pytest.raises(SourceReadError) as caught:
        roads.fetch(CITY, 2020, tmp_path / "sources")
    message = str(caught.value)
    for part in ("osm:osm_roads", CITY, "2020-01-01", "cut.osh.pbf", "corrupt or truncated"):
        assert part in message
    assert roads.manager.cached_path(url) is None  # dropped, so the next fetch downloads again
    assert not (tmp_path / "sources" / "osm_roads" / CITY / "2020").exists()


def test_a_missing_extract_is_a_clear_fetch_error(tmp_path: Path, server: FaultyServer) -> None:
    url = server.url("extracts/none.osh.pbf")
    roads = family(tmp_path, history={CITY: url})["osm_roads"]
    with pytest.raises(SourceFetchError) as caught:
        roads.fetch(CITY, 2020, tmp_path / "sources")
    assert (
        caught.value.status == 404
        and "2020-01-01" in str(caught.value)
        and CITY in str(caught.value)
    )


def test_unconfigured_cities_and_years_after_the_file_are_unavailable(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/amsterdam.osh.pbf", history_bytes)
    roads = family(tmp_path, history={CITY: url}, last_year=2025)["osm_roads"]
    with pytest.raises(SourceUnavailableError) as caught:
        roads.fetch("Boston", 2020, tmp_path / "sources")
    assert caught.value.reason == "outside_source_coverage"
    with pytest.raises(SourceUnavailableError) as caught:
        roads.fetch(CITY, 2025, tmp_path / "sources")  # the file ends on 2024-06-01
    assert caught.value.reason == "source_year_missing"


def test_items_have_exactly_the_sample_twins_form(
    tmp_path: Path, server: FaultyServer, history_bytes: bytes
) -> None:
    url = server.add("extracts/amsterdam.osh.pbf", history_bytes)
    real = family(tmp_path, history={CITY: url})
    sample = build_source_set(SourceSetSpec(name="s", default="sample"))
    for product, layer in (("osm_roads", "roads"), ("osm_buildings", "buildings")):
        ours_file = real[product].fetch(CITY, 2020, tmp_path / "r").files["data"]
        twin_file = sample.fetch(product, CITY, 2020, tmp_path / "s").files["data"]
        assert pyogrio.list_layers(ours_file).tolist() == pyogrio.list_layers(twin_file).tolist()
        assert pyogrio.list_layers(ours_file)[0][0] == layer
        ours, twin = pyogrio.read_info(ours_file), pyogrio.read_info(twin_file)
        for key in ("fields", "dtypes"):
            assert list(ours[key]) == list(twin[key])
        assert (ours["geometry_type"], ours["crs"]) == (twin["geometry_type"], twin["crs"])
    assert set(BUILDING_TAG_COLUMNS) | {"building"} == set(
        CLASSIFIER_COLUMNS["osm_building_function"]
    )


# -------------------------------------------------------------------------------------- GPS


class TrackpointsApi(LoopbackServer):
    """A loopback trackpoints API: GPX pages of ``per_page`` points for a bbox, in a fixed
    order (timed tracks first, then an anonymous undated track), with scripted 429s."""

    def __init__(self, points: list[tuple[float, float, str | None, int | None]], per_page: int):
        self.points = points
        self.per_page = per_page
        self.throttle: dict[str, int] = {}
        self.requests: list[tuple[float, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api.requests.append((time.monotonic(), self.path))
                parts = urlsplit(self.path)
                if parts.path != "/api/0.6/trackpoints":
                    self.send_error(404)
                    return
                query = parse_qs(parts.query)
                if api.throttle.get(self.path, 0) > 0:
                    api.throttle[self.path] -= 1
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = api.page(query["bbox"][0], int(query.get("page", ["0"])[0]))
                self.send_response(200)
                self.send_header("Content-Type", "application/gpx+xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._listen(Handler)

    @property
    def root(self) -> str:
        """The API root, without a trailing slash."""
        return self.url("").rstrip("/")

    def page(self, bbox: str, number: int) -> bytes:
        w, s, e, n = (float(v) for v in bbox.split(","))
        inside = [p for p in self.points if w <= p[0] <= e and s <= p[1] <= n]
        chunk = inside[number * self.per_page : (number + 1) * self.per_page]
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<gpx version="1.0" creator="test" xmlns="http://www.topografix.com/GPX/1/0">',
        ]
        for lon, lat, when, trace in chunk:
            out.append("<trk>")
            if trace:
                out.append(
                    f"<name>t</name><desc>d</desc><url>https://x/user/u/traces/{trace}</url>"
                )
            out.append(f'<trkseg><trkpt lat="{lat}" lon="{lon}">')
            if when:
                out.append(f"<time>{when}</time>")
            out.append("</trkpt></trkseg></trk>")
        out.append("</gpx>")
        return "".join(out).encode()


def gps_points() -> list[tuple[float, float, str | None, int | None]]:
    """Points in 2 km tile r2_c3 (2020), r5_c7 (2019 and 2020), undated ones, one on a bbox
    tile edge (counted once), and one outside the window."""
    grid = city_grid(CITY, "2km")
    out: list[tuple[float, float, str | None, int | None]] = []

    def centre(r: int, c: int) -> tuple[float, float]:
        return (grid.x_min + (c + 0.5) * 2000, grid.y_max - (r + 0.5) * 2000)

    x, y = centre(2, 3)
    for i in range(7):
        out.append((*lonlat(x + 10 * i, y), f"2020-03-0{1 + i % 5}T10:00:00Z", 4242))
    x, y = centre(5, 7)
    for i in range(4):
        out.append((*lonlat(x, y + 10 * i), "2020-12-31T23:59:59Z", None))
    for i in range(3):
        out.append((*lonlat(x, y - 10 * i), "2019-06-01T00:00:00Z", None))
    for _ in range(5):
        out.append((*lonlat(x + 30, y), None, None))  # undated (legacy public trace)
    return out


def test_gps_pages_tiles_with_a_429_and_processes_to_log_densities(tmp_path: Path) -> None:
    points = gps_points()
    west, south, east, north = window_wgs84(CITY)
    edge_lon = round(west + 0.25, 7)  # the first bbox tile's east edge
    points.append((edge_lon, 52.33, "2020-05-05T05:05:05Z", 77))  # inside both tiles' bboxes
    points.append((east + 0.5, 52.3, "2020-05-05T05:05:05Z", 78))  # outside the window
    with TrackpointsApi(points, per_page=3) as api:
        gps = {"api_url": api.root, "per_page": 3, "tile_deg": 0.25, "requests_per_second": 50}
        adapter = family(tmp_path, gps=gps)["osm_gps_traces"]
        # The window is under 0.25° high, so the first tile spans it from south to north.
        first = adapter.page_url((west, south, round(west + 0.25, 7), north), 0)
        api.throttle[first.split(api.root, 1)[1]] = 1
        item = adapter.fetch(CITY, 2020, tmp_path / "sources")
        frame = gpd.read_parquet(item.files["data"])
        assert frame.crs.to_epsg() == 4326 and list(frame.columns) == ["track_id", "time",
                                                                      "geometry"]  # fmt: skip
        # 7 + 4 points of 2020 in the grid and the edge point once; 3 of 2019 and 5 undated out.
        assert len(frame) == 12
        assert item.extra["undated_points"] == "5" and item.extra["points_of_other_years"] == "3"
        assert sorted(set(frame["track_id"][frame["track_id"] > 0])) == [77, 4242]
        assert (frame["time"].dt.year == 2020).all()
        sample = build_source_set(SourceSetSpec(name="s", default="sample"))
        twin = pq.read_schema(
            sample.fetch("osm_gps_traces", CITY, 2020, tmp_path / "s").files["data"]
        )
        ours = pq.read_schema(item.files["data"])
        assert [(f.name, f.type) for f in ours] == [(f.name, f.type) for f in twin]
        throttled = [t for t, p in api.requests if p == first.split(api.root, 1)[1]]
        assert len(throttled) == 2 and throttled[1] - throttled[0] >= 0.9  # Retry-After: 1
        requests_before = len(api.requests)
        release = Release(tmp_path / "data", "t")
        process_partition(CAT.get("GPS"), CAT, CITY, 2020, SourceSet([adapter]), release)
        assert len(api.requests) == requests_before  # processing re-reads the installed item
        item_2019 = adapter.fetch(CITY, 2019, tmp_path / "sources")
        assert item_2019.extra["points"] == "3"
        assert len(api.requests) == requests_before  # every page came from the cache
    rows = pq.read_table(release.observations_file(CITY, 2020, "GPS")).to_pylist()
    values = {r["tile_id"]: r for r in rows}
    assert values["Amsterdam_2KM_r2_c3"]["value"] == pytest.approx(math.log1p(7 / 4.0))
    assert values["Amsterdam_2KM_r5_c7"]["value"] == pytest.approx(math.log1p(4 / 4.0))
    empty = values["Amsterdam_2KM_r0_c0"]
    assert empty["available"] is False and empty["reason"] == "no_trace_data"


def test_gps_year_without_dated_points_is_unavailable(tmp_path: Path) -> None:
    with TrackpointsApi(gps_points(), per_page=5000) as api:
        gps = {"api_url": api.root, "requests_per_second": 50}
        adapter = family(tmp_path, gps=gps)["osm_gps_traces"]
        with pytest.raises(SourceUnavailableError) as caught:
            adapter.fetch(CITY, 2012, tmp_path / "sources")
    assert caught.value.reason == "source_year_missing" and "5 undated" in str(caught.value)


def test_gps_requests_are_paced(tmp_path: Path) -> None:
    with TrackpointsApi(gps_points(), per_page=5000) as api:
        gps = {"api_url": api.root, "requests_per_second": 5}
        adapter = family(tmp_path, gps=gps)["osm_gps_traces"]
        adapter.fetch(CITY, 2020, tmp_path / "sources")
        times = np.array([t for t, _ in api.requests])
    assert len(times) == 3  # the window is cut into three 0.25° tiles of one page each
    assert np.diff(times).min() >= 0.15  # 5 requests per second at most (0.2 s apart)


def test_the_osm_source_set_takes_the_three_osm_products_from_the_osm_family() -> None:
    spec_file = Path(__file__).resolve().parents[1] / "schemas" / "source_sets" / "osm.yaml"
    sources = build_source_set(load_source_set_spec(spec_file))
    provenance = sources.provenance()
    for product in ("osm_roads", "osm_buildings", "osm_gps_traces"):
        assert provenance[product]["source_id"] == f"osm:{product}"
        assert provenance[product]["synthetic"] is False
        assert provenance[product]["licence"] == "ODbL-1.0"
    assert provenance["odiac"]["source_id"] == "sample:odiac"
    assert sources.source_years("osm_roads", CITY) == list(range(2008, 2026))
    assert sources.source_years("osm_roads", "Boston") == []  # no extract configured


def test_a_login_page_instead_of_the_extract_says_so(tmp_path: Path, server: FaultyServer) -> None:
    url = server.add("internal/x.osh.pbf", b"<!DOCTYPE html><html><body>Log in</body></html>")
    roads = family(tmp_path, history={CITY: url}, auth_cookie_env="TEST_OSM_COOKIE")["osm_roads"]
    with pytest.raises(SourceReadError, match=r"HTML page.*TEST_OSM_COOKIE"):
        roads.fetch(CITY, 2020, tmp_path / "sources")
