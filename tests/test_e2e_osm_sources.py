"""End to end from a loopback server: `citycube build` with roads (RD) and buildings (POI)
cut from an OpenStreetMap full-history file by the ``osm`` family, every other product from the
sample.

The server holds one history PBF written with pyosmium (``tests/osm_fixtures.py``) and the
same history under a header box holding only the city's western part; the source-set file
points Amsterdam's roads at the first, its buildings at the second, and names no file for
Boston. The cube's RD values are the road fractions worked out by hand from the history's
geometry, POI's change where the history changes a building's tags and are unavailable east of
the buildings file's box (never zero), both carry the osm family's provenance, Boston is
unavailable (never zero), and each file is downloaded once for every snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from pyproj import Transformer

from citycube.cube.chips import open_chips
from citycube.grid.tiles import city_grid
from tests.e2e_builds import run_build, write_source_set
from tests.faulty_http_server import FaultyServer
from tests.osm_fixtures import EDGE_LON, H_Y, V_X, WEST_HALF, amsterdam_history

pytestmark = pytest.mark.e2e(builds=1)

CITY = "Amsterdam"
UNCONFIGURED = "Boston"
YEARS = (2015, 2020)
ASSETS = (
    "sources/osm_roads,sources/osm_buildings,derived/rd,derived/poi,modalities/rd,"
    "modalities/poi,cube"
)
HISTORY = "extracts/amsterdam.osh.pbf"
WEST = "extracts/amsterdam-west.osh.pbf"
"""The same history, its header box ending at ``EDGE_LON``: the buildings file."""
BUILDINGS_X, BUILDINGS_Y = 620_000.0, 5_802_000.0
"""South-west corner of the history's first building (``amsterdam_history``), UTM 31N."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyServer]:
    path = tmp_path_factory.mktemp("osh") / "amsterdam.osh.pbf"
    amsterdam_history().write(path, stamp="2024-06-01T00:00:00Z")
    west = amsterdam_history().write(
        path.with_name("west.osh.pbf"), stamp="2024-06-01T00:00:00Z", bbox=WEST_HALF
    )
    with FaultyServer() as running:
        running.add(HISTORY, path.read_bytes())
        running.add(WEST, west.read_bytes())
        yield running


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, server: FaultyServer) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e_osm")
    source_set = {
        "name": "osm-loopback",
        "default": "sample",
        "products": {"osm_roads": "osm", "osm_buildings": "osm"},
        "options": {
            "sample": {"seed": 0},
            "osm": {
                "history": {CITY: server.url(HISTORY)},
                "buildings": {CITY: server.url(WEST)},
                "cache_dir": str(root / "downloads"),
                "attempts": 2,
                "wait_initial_s": 0.01,
                "wait_max_s": 0.05,
                "timeout_s": 10.0,
            },
        },
    }
    write_source_set(root, source_set)
    years = ",".join(map(str, YEARS))
    done = run_build(root, "osm-e2e", f"{CITY},{UNCONFIGURED}", years, ASSETS)
    assert done.returncode == 0, done.stdout + done.stderr
    release = root / "data" / "releases" / "osm-e2e"
    return {"release": release, "database": release / "cube.duckdb"}


def _rows(database: Path, city: str, modality: str, year: int) -> dict[str, tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, value, available, reason, source_id, synthetic, temporal_basis, "
            "source_year FROM observations WHERE city = ? AND modality = ? AND year = ?",
            [city, modality, year],
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def test_road_fractions_are_the_hand_computed_ones_from_the_history(
    build: dict[str, Any],
) -> None:
    rows = _rows(build["database"], CITY, "RD", 2020)
    assert len(rows) == 152  # 140 tiles of 2 km, 12 of 5 km
    # In 2020 the east-west road lies on the pixel row centred at H_Y and the north-south trunk
    # on the pixel column centred at V_X, each across every grid: a tile of n×n 10 m pixels
    # holds n road pixels per road crossing it, 2n - 1 where both do.
    for scale in ("2km", "5km"):
        grid = city_grid(CITY, scale)
        n = int(grid.tile_size / 10)
        for tile_id, (value, available, reason, *_) in rows.items():
            if f"_{scale.upper()}_" not in tile_id:
                continue
            r, c = (int(p[1:]) for p in tile_id.split("_")[2:4])
            left = grid.x_min + c * grid.tile_size
            top = grid.y_max - r * grid.tile_size
            h = top - grid.tile_size <= H_Y < top
            v = left <= V_X < left + grid.tile_size
            assert available and reason is None, tile_id
            assert value == pytest.approx((n * h + n * v - (h and v)) / (n * n), abs=1e-12)


def test_snapshots_follow_the_history_and_carry_the_osm_provenance(
    build: dict[str, Any],
) -> None:
    database = build["database"]
    for year in YEARS:
        for modality, product in (("RD", "osm_roads"), ("POI", "osm_buildings")):
            rows = _rows(database, CITY, modality, year)
            assert {r[3:] for r in rows.values()} == {(f"osm:{product}", False, "snapshot", year)}
    rd = {year: _rows(database, CITY, "RD", year) for year in YEARS}
    # The trunk (way 102) is residential until 2017: tiles it crosses gain road pixels.
    gained = [t for t in rd[2020] if rd[2020][t][0] > rd[2015][t][0]]
    assert gained and all(rd[2015][t][0] is not None for t in gained)
    # Building classes in the 10 m chips, at the centre of each 20 m footprint (by hand from
    # the history): way 200 a house (2) throughout; way 201 a plain building (1) that becomes a
    # school (education 4) in 2016; the supermarket way 202 (commercial 3) deleted in 2018.
    x0, y0 = BUILDINGS_X + 10.0, BUILDINGS_Y + 10.0
    expected = {2015: (2, 1, 3), 2020: (2, 4, 0)}
    for year, classes in expected.items():
        chips = open_chips(build["release"] / "chips" / "POI" / CITY / f"{year}.icechunk")
        got = [
            int(chips["data"].sel(band="dominant_class", x=x0 + dx, y=y0, method="nearest"))
            for dx in (0.0, 100.0, 200.0)
        ]
        assert tuple(got) == classes, year


def test_poi_tiles_east_of_the_buildings_file_are_unavailable_never_zero(
    build: dict[str, Any],
) -> None:
    """Share of each tile's 10 m pixel centres west of the buildings file's east edge, by
    pyproj: a tile wholly inside is available, one under 98 % is outside the coverage."""
    to_lonlat = Transformer.from_crs("EPSG:32631", "EPSG:4326", always_xy=True)
    for year in YEARS:
        rows = _rows(build["database"], CITY, "POI", year)
        assert len(rows) == 152
        counts = {"inside": 0, "outside": 0}
        for scale in ("2km", "5km"):
            grid = city_grid(CITY, scale)
            offsets = np.arange(5.0, grid.tile_size, 10.0)
            for tile in grid.tiles():
                xs, ys = np.meshgrid(tile.bounds[0] + offsets, tile.bounds[1] + offsets)
                share = float((to_lonlat.transform(xs, ys)[0] <= EDGE_LON).mean())
                value, available, reason, *_ = rows[tile.tile_id]
                if share == 1.0:
                    counts["inside"] += 1
                    assert available and reason is None and value is not None, tile.tile_id
                elif share < 0.978:
                    counts["outside"] += 1
                    assert (value, available, reason) == (None, False, "outside_source_coverage")
        assert counts["inside"] >= 40 and counts["outside"] >= 40, counts


def test_a_city_without_a_history_file_is_unavailable_never_zero(build: dict[str, Any]) -> None:
    for modality in ("RD", "POI"):
        for year in YEARS:
            rows = _rows(build["database"], UNCONFIGURED, modality, year)
            assert rows, (modality, year)
            assert {(r[0], r[1], r[2]) for r in rows.values()} == {
                (None, False, "outside_source_coverage")
            }


def test_the_history_is_downloaded_once_and_the_release_names_the_osm_family(
    build: dict[str, Any], server: FaultyServer
) -> None:
    assert len(server.requests_for(HISTORY)) == 1
    assert len(server.requests_for(WEST)) == 1
    meta = json.loads((build["release"] / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "osm-loopback"
    assert meta["sources"]["osm_roads"]["source_id"] == "osm:osm_roads"
    assert meta["sources"]["osm_buildings"]["synthetic"] is False
    assert meta["sources"]["landsat_c2l2"]["source_id"].startswith("sample:")
