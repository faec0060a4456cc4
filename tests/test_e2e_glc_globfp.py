"""End to end from a loopback server: `citycube build` with land cover (LC) from the GLC_FCS30D
adapter and building heights (H&F) from the 3D-GloBFP adapter (the ``http`` family), every other
product from the sample, for Amsterdam in 2020.

The server holds the provider's files (``tests/glc_globfp_fixtures.py``): Amsterdam straddles
5° E, so both GLC tiles E0N55 and E5N55 are read from the one zip of their 10° band, each on its
own lattice; GloBFP lists one shapefile tile (4-5° E). Each 2 km tile of the city grid is
painted in one class (its 10 km parent's, or a patch class on every third tile, so 5 km tiles
have a clear majority), with two squares of the provider's fill values (250 and 0) inside two
tiles and a speck of fill inside a third. The cube's observations are compared with an
independent computation over the served arrays: every tile is sampled at points of its UTM
grid, each point looked up in the served pixel (LC) or tested against the served footprints
(H&F). A fill-heavy tile is unavailable with its reason, never class 0; tiles reaching past
the listed GloBFP tile are not filled with height 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import shapely
from affine import Affine
from pyproj import Transformer

from citycube.catalogue.cities import get_city
from citycube.grid.tiles import city_grid
from tests.e2e_builds import run_build, write_source_set
from tests.faulty_http_server import FaultyServer
from tests.glc_globfp_fixtures import (
    BUILDINGS,
    FILL_VALUES,
    GLC,
    GLOBFP,
    GLOBFP_TILE,
    class_at,
    serve_glc,
    serve_globfp,
    square,
)

pytestmark = pytest.mark.e2e(builds=1)

CITY = "Amsterdam"
YEAR = 2020
ASSETS = (
    "sources/glc_fcs30d,sources/globfp_height,derived/lc,derived/hf,modalities/lc,"
    "modalities/hf,cube"
)
EPSG = get_city(CITY).epsg
GRID_2KM = city_grid(CITY, "2km")
PARENT_CLASSES = np.array([10, 62, 130, 190, 210, 182])
"""Legend classes of the 10 km parent cells in turn (none of them a fill value)."""
PATCH_CLASS = 120
"""The class of every third 2 km tile (row + col divisible by 3), whatever its parent's."""
FILLS = {  # 2 km tile (row, col) -> (fill value, square side in m at the tile's centre)
    (2, 3): (250, 1200.0),  # 36 % of the tile
    (6, 9): (0, 1000.0),  # 25 %
    (4, 5): (250, 100.0),  # 0.25 %: the tile stays available
}
LC_POINTS = 200
"""Points per side of a tile's LC sample (10 m apart in a 2 km tile)."""


def tile_class(row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """The class painted on 2 km tile (row, col): its 10 km parent's, or the patch class. Both
    grids nest in the parents, so a 5 km tile is mostly its parent's class."""
    parent = PARENT_CLASSES[(2 * (row // 5) + col // 5) % len(PARENT_CLASSES)]
    return np.where((row + col) % 3 == 0, PATCH_CLASS, parent)


def tile_of(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of the 2 km tile holding each UTM point (extended past the grid)."""
    size = GRID_2KM.tile_size
    return (
        np.floor((GRID_2KM.y_max - y) / size).astype(int),
        np.floor((x - GRID_2KM.x_min) / size).astype(int),
    )


def paint_by_tile(transform: Affine, rows: int, cols: int, index: int) -> np.ndarray:
    """A tile crop's classes: each pixel takes the class of the 2 km tile its centre lies in,
    and the fill squares take the provider's fill values."""
    del index
    lon = transform.c + (np.arange(cols) + 0.5) * transform.a
    lat = transform.f + (np.arange(rows) + 0.5) * transform.e
    glon, glat = np.meshgrid(lon, lat)
    x, y = Transformer.from_crs(4326, EPSG, always_xy=True).transform(glon, glat)
    r, c = tile_of(np.asarray(x), np.asarray(y))
    values = tile_class(r, c).astype(np.uint8)
    size = GRID_2KM.tile_size
    for (row, col), (fill, side) in FILLS.items():
        cx = GRID_2KM.x_min + (col + 0.5) * size
        cy = GRID_2KM.y_max - (row + 0.5) * size
        inside = (np.abs(x - cx) < side / 2) & (np.abs(y - cy) < side / 2)
        values[inside] = fill
    return values


# ------------------------------------------------------------------- the server and the build


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


@pytest.fixture(scope="module")
def served(server: FaultyServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    glc = serve_glc(server, CITY, paint_by_tile, YEAR)
    serve_globfp(server, tmp_path_factory.mktemp("globfp_files"))
    return {"glc": glc}


@pytest.fixture(scope="module")
def build(
    tmp_path_factory: pytest.TempPathFactory, server: FaultyServer, served: dict[str, Any]
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e_glc_globfp")
    source_set = {
        "name": "glc-globfp-loopback",
        "default": "sample",
        "products": {"glc_fcs30d": "http", "globfp_height": "http"},
        "options": {
            "sample": {"seed": 0},
            "http": {
                "products": ["glc_fcs30d", "globfp_height"],
                "base_urls": {"glc_fcs30d": server.url(""), "globfp_height": server.url("")},
                "cache_dir": str(root / "downloads"),
                "attempts": 2,
                "wait_initial_s": 0.01,
                "wait_max_s": 0.05,
                "timeout_s": 10.0,
            },
        },
    }
    write_source_set(root, source_set)
    done = run_build(root, "glc-e2e", CITY, str(YEAR), ASSETS)
    assert done.returncode == 0, done.stdout + done.stderr
    release = root / "data" / "releases" / "glc-e2e"
    return {"root": root, "release": release, "database": release / "cube.duckdb"}


def observations(database: Path, modality: str) -> dict[str, tuple[Any, ...]]:
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, value, valid_fraction, available, reason, source_id, "
            "source_version, synthetic, temporal_basis, source_year FROM observations "
            "WHERE city = ? AND modality = ? AND year = ?",
            [CITY, modality, YEAR],
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def tiles(database: Path) -> list[tuple[str, float, float, float, float]]:
    with duckdb.connect(str(database), read_only=True) as con:
        return con.execute(
            "SELECT tile_id, utm_xmin, utm_ymin, utm_xmax, utm_ymax FROM tiles WHERE city = ? "
            "ORDER BY tile_id",
            [CITY],
        ).fetchall()


def grid_points(bounds: tuple[float, ...], step: float) -> tuple[np.ndarray, np.ndarray]:
    """Centres of the squares of side ``step`` tiling ``bounds`` (UTM)."""
    xmin, ymin, xmax, ymax = bounds
    xs = xmin + (np.arange(round((xmax - xmin) / step)) + 0.5) * step
    ys = ymax - (np.arange(round((ymax - ymin) / step)) + 0.5) * step
    gx, gy = np.meshgrid(xs, ys)
    return gx.ravel(), gy.ravel()


def to_lonlat(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lon, lat = Transformer.from_crs(EPSG, 4326, always_xy=True).transform(x, y)
    return np.asarray(lon), np.asarray(lat)


# --------------------------------------------------------------------------------- land cover


def expected_lc(database: Path, served: dict[str, Any]) -> dict[str, tuple[int, float, float]]:
    """tile -> (most frequent valid class, its lead over the runner-up as a share of the valid
    points, valid share), from the served pixels under LC_POINTS² points of the tile."""
    out: dict[str, tuple[int, float, float]] = {}
    for tile, *bounds in tiles(database):
        step = (bounds[2] - bounds[0]) / LC_POINTS
        lon, lat = to_lonlat(*grid_points(tuple(bounds), step))
        classes = class_at(served["glc"], lon, lat)
        assert np.isfinite(classes).all(), tile  # the crops cover the whole grid
        valid = ~np.isin(classes, FILL_VALUES)
        ids, counts = np.unique(classes[valid].astype(int), return_counts=True)
        order = np.argsort(counts)[::-1]
        lead = (counts[order[0]] - (counts[order[1]] if len(order) > 1 else 0)) / valid.sum()
        out[tile] = (int(ids[order[0]]), float(lead), float(valid.mean()))
    return out


def test_land_cover_equals_the_served_classes_by_tile(
    build: dict[str, Any], served: dict[str, Any]
) -> None:
    got = observations(build["database"], "LC")
    want = expected_lc(build["database"], served)
    assert set(got) == set(want) and len(got) == 152  # 140 tiles of 2 km, 12 of 5 km
    checked_5km = 0
    for tile, (mode, lead, share) in want.items():
        value, fraction, available, reason = got[tile][:4]
        assert fraction == pytest.approx(share, abs=0.01), tile
        if share < 0.97:  # well below the 98 % an image modality needs
            assert (value, available, reason) == (None, False, "insufficient_valid_pixels"), tile
            continue
        assert share > 0.99, tile  # no tile sits near the threshold
        assert available and reason is None, tile
        if "_2KM_" in tile:
            assert lead > 0.95, tile  # one class per 2 km tile (edge pixels, a speck of fill)
        if lead > 0.05:
            assert value == mode, tile
            checked_5km += "_5KM_" in tile
    assert checked_5km >= 6
    values = {v[0] for v in got.values() if v[0] is not None}
    assert values <= {*PARENT_CLASSES.tolist(), PATCH_CLASS} and values.isdisjoint(FILL_VALUES)


def test_fill_heavy_tiles_are_unavailable_with_a_reason_never_class_0(
    build: dict[str, Any],
) -> None:
    got = observations(build["database"], "LC")
    for (row, col), (_, side) in FILLS.items():
        tile = f"{CITY}_2KM_r{row}_c{col}"
        value, fraction, available, reason = got[tile][:4]
        share = 1 - (side / GRID_2KM.tile_size) ** 2
        assert fraction == pytest.approx(share, abs=0.01), tile
        if share < 0.98:
            assert (value, available, reason) == (None, False, "insufficient_valid_pixels")
        else:
            assert available and value == tile_class(np.array(row), np.array(col))
    assert not any(v[0] == 0 for v in got.values())
    unavailable = {t for t, v in got.items() if not v[2]}
    # The two fill squares, and the 5 km tiles holding enough of them (36 % of 4 km² is 5.8 %
    # of a 5 km tile; 25 % of 4 km² is 4 %).
    assert {f"{CITY}_2KM_r2_c3", f"{CITY}_2KM_r6_c9"} <= unavailable
    assert len(unavailable) >= 3 and all(
        got[t][3] == "insufficient_valid_pixels" for t in unavailable
    )


# ---------------------------------------------------------------------------- building heights


def expected_hf(database: Path) -> dict[str, tuple[float | None, float, bool]]:
    """tile -> (mean height of the valid 10 m pixels or None, valid share, whether the tile lies
    wholly in the listed GloBFP tile), by point-in-polygon at the chip pixel centres."""
    footprints = [(square(lon, lat, side), h) for lon, lat, side, h in BUILDINGS]
    out: dict[str, tuple[float | None, float, bool]] = {}
    for tile, *bounds in tiles(database):
        lon, lat = to_lonlat(*grid_points(tuple(bounds), 10.0))
        valid = (lon >= 4.0) & (lon < 5.0) & (lat >= 52.0) & (lat < 53.0)
        heights = np.zeros(lon.shape)
        for polygon, height in footprints:
            inside = shapely.contains_xy(polygon, lon, lat)
            if height is None or height < 0:
                valid &= ~inside
            else:
                heights[inside] = height
        share = float(valid.mean())
        value = float(heights[valid].mean()) if share >= 0.98 else None
        out[tile] = (value, share, bool(lon.max() < 5.0 - 1e-4))
    return out


def test_building_heights_equal_the_served_footprints_by_tile(build: dict[str, Any]) -> None:
    got = observations(build["database"], "HF")
    want = expected_hf(build["database"])
    assert set(got) == set(want) and len(got) == 152
    with_buildings = 0
    for tile, (value, share, inside_listed) in want.items():
        got_value, fraction, available, reason = got[tile][:4]
        if inside_listed:
            assert fraction == pytest.approx(share, abs=1e-9), tile
            assert available and reason is None, tile
            assert got_value == pytest.approx(value, abs=1e-9), tile
            with_buildings += value > 0
        elif share < 0.97:  # reaching past 5° E, where no listed tile reports
            assert not available and got_value is None, tile
            assert reason == "outside_source_coverage", tile
    assert with_buildings >= 2
    # Height 0 where a tile reports no building, never where nothing is listed.
    assert sum(1 for v in want.values() if not v[2] and v[1] < 0.97) >= 8


def test_sources_and_release_name_the_products(build: dict[str, Any], server: FaultyServer) -> None:
    database = build["database"]
    lc = observations(database, "LC")
    assert {r[4:9] for r in lc.values()} == {
        ("http:glc_fcs30d", GLC.version, False, "annual", YEAR)
    }
    hf = observations(database, "HF")
    assert {r[4:9] for r in hf.values()} == {
        ("http:globfp_height", GLOBFP.version, False, "static", None)
    }
    meta = json.loads((build["release"] / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "glc-globfp-loopback"
    for product in ("glc_fcs30d", "globfp_height"):
        assert meta["sources"][product]["source_id"] == f"http:{product}"
        assert meta["sources"][product]["synthetic"] is False
    assert meta["sources"]["landsat_c2l2"]["source_id"].startswith("sample:")
    # One zip holds both GLC tiles: downloaded once for the two; the GloBFP tile once too.
    assert len(server.requests_for("GLC_FCS30D_19852022maps_E0-E5.zip")) == 1
    assert len(server.requests_for(f"files/{GLOBFP_TILE}")) == 1
    sources = build["root"] / "data" / "sources"
    glc = json.loads(next((sources / "glc_fcs30d" / CITY).rglob("sources.json")).read_text())
    assert {Path(f["member"]).name for f in glc["served_files"]} == {
        "GLC_FCS30D_20002022_E0N55_Annual_V1.1.tif",
        "GLC_FCS30D_20002022_E5N55_Annual_V1.1.tif",
    }
    assert {f["band"] for f in glc["served_files"]} == {YEAR - 1999}
    hf_files = json.loads(
        next((sources / "globfp_height" / CITY).rglob("sources.json")).read_text()
    )
    assert any(GLOBFP_TILE in json.dumps(f) for f in hf_files["served_files"])
