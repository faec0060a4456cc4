"""GLC_FCS30D tiles and 3D-GloBFP footprints over a real HTTP server on loopback.

GLC: London straddles 0°, so it needs tile W5N55 (zip W5-W10) and tile E0N55 (zip E0-E5). Each
served tile is a crop of a real tile on its own lattice (origin on the named corner, 30 m
pixels), 23 bands (2000-2022); 5° is no whole number of pixels, so the two lattices differ and
the expected item values are computed here by hand (nearest pixel by floor arithmetic).
GloBFP: figshare-style file listings name zipped shapefile tiles; the footprints reaching the
city grid are checked against point-in-polygon tests at pixel centres.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pytest
import rasterio
import shapely
from affine import Affine
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.catalogue.modalities import load_catalogue
from citycube.catalogue.products import load_products
from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.grid.tiles import pixel_grid
from citycube.items.rasters import transformer
from citycube.items.staging import COMPLETE_MARKER
from citycube.processing.vectors import open_vector_layer, rasterize_block
from sources.http import http_adapters
from sources.http.glc import tile_name, zone_name
from tests.faulty_http_server import FaultyServer
from tests.glc_globfp_fixtures import (
    BUILDINGS,
    FILL_VALUES,
    GLC,
    RES,
    class_at,
    serve_globfp,
    serve_london_glc,
    square,
)


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def adapter(product: str, server: FaultyServer, tmp_path: Path, **options: Any) -> Any:
    settings: dict[str, Any] = {
        "cache_dir": tmp_path / "cache",
        "products": [product],
        "base_urls": {product: server.url("")},
        "attempts": 2,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.05,
        "timeout_s": 5.0,
        **options,
    }
    (found,) = http_adapters(settings)
    return found


# ------------------------------------------------------------------------------ GLC_FCS30D


def test_tile_and_zip_names_follow_the_providers_corners() -> None:
    grid = GLC.tile_grid
    assert grid is not None
    assert tile_name(8, 58, grid) == "E105N55"  # row 8: 55-50° N; col 58: 105-110° E
    assert tile_name(18, 37, grid) == "E0N5"
    assert tile_name(19, 36, grid) == "W5N0"  # 5° W-0°, 0-5° S: N0 exists, S0 does not
    assert tile_name(20, 1, grid) == "W180S5"
    assert [zone_name(w) for w in (0, 5, 100, 105, 175)] == [
        "E0-E5",
        "E0-E5",
        "E100-E105",
        "E100-E105",
        "E170-E175",
    ]
    assert [zone_name(w) for w in (-5, -10, -15, -20, -180)] == [
        "W5-W10",
        "W5-W10",
        "W15-W20",
        "W15-W20",
        "W175-W180",
    ]


def expected_item(
    item_transform: Affine, shape: tuple[int, int], served: dict[str, tuple[Affine, np.ndarray]]
) -> np.ndarray:
    """By hand: each item cell centre takes the pixel it falls in, the first tile (W5N55)
    winning where crops overlap; fill values and uncovered cells are NaN."""
    rows, cols = shape
    xs = item_transform.c + (np.arange(cols) + 0.5) * item_transform.a
    ys = item_transform.f + (np.arange(rows) + 0.5) * item_transform.e
    lon, lat = np.meshgrid(xs, ys)
    out = class_at(served, lon, lat)
    out[np.isin(out, FILL_VALUES)] = np.nan
    return out


def test_glc_reads_two_tiles_on_their_own_lattices_and_fill_becomes_nodata(
    tmp_path: Path, server: FaultyServer
) -> None:
    served = serve_london_glc(server)
    source = adapter("glc_fcs30d", server, tmp_path)
    item = source.fetch("London", 2020, tmp_path / "s")
    paths = {r.path.split("?")[0] for r in server.requests}
    assert paths == {
        "/GLC_FCS30D_19852022maps_W5-W10.zip",
        "/GLC_FCS30D_19852022maps_E0-E5.zip",
    }
    assert item.extra["tiles"] == "W5N55 E0N55"
    assert item.extra["tiles_placed_by_nearest_neighbour"] == "E0N55"  # 5° is 18553.2 pixels
    with rasterio.open(item.href("data")) as ds:
        assert ds.crs.to_epsg() == 4326 and ds.nodata == 255 and ds.dtypes[0] == "uint8"
        w5 = served["W5N55"][0]
        assert (ds.transform.c - w5.c) / RES == pytest.approx(
            round((ds.transform.c - w5.c) / RES), abs=1e-6
        )  # the item is on W5N55's own lattice
        written = ds.read(1).astype(float)
        written[written == 255] = np.nan
        expected = expected_item(ds.transform, ds.shape, served)
    np.testing.assert_array_equal(written, expected)
    assert np.isnan(expected).sum() > 0 and np.isfinite(expected).sum() > 0
    assert "fill values" in item.extra["fill_cells"]
    assert "written as nodata 255, not as a class" in item.extra["fill_cells"]
    provenance = json.loads(Path(item.href("data")).with_name("sources.json").read_text())
    assert {f["band"] for f in provenance["served_files"]} == {21}
    assert provenance["licence"] == "CC BY 4.0"


def test_glc_fill_cells_are_invalid_for_the_land_cover_modality(
    tmp_path: Path, server: FaultyServer
) -> None:
    """0 and 250 never count as valid classes when the cube reads the item."""
    from citycube.items.readers import open_masked_source

    serve_london_glc(server)
    item = adapter("glc_fcs30d", server, tmp_path).fetch("London", 2020, tmp_path / "s")
    modality = load_catalogue().get("LC")
    with rasterio.open(item.href("data")) as ds:
        raw = ds.read(1)
        window = rasterio.windows.Window(0, 0, ds.width, ds.height)
    with open_masked_source(item, modality, [1]) as masked:
        _, valid = masked.read(window)
    assert not np.isin(raw, [0, 250]).any()  # fill never reaches the cube as a class
    assert (raw == 255).any()
    assert not valid[raw == 255].any()
    assert valid[raw != 255].all()


def test_glc_years_past_2022_are_unavailable_without_a_request(
    tmp_path: Path, server: FaultyServer
) -> None:
    source = adapter("glc_fcs30d", server, tmp_path)
    with pytest.raises(SourceUnavailableError) as raised:
        source.fetch("London", 2023, tmp_path / "s")
    assert raised.value.reason == "source_year_missing"
    assert server.requests == []


def test_a_truncated_glc_zip_names_source_city_year_and_file_and_installs_nothing(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_london_glc(server)
    path = "/GLC_FCS30D_19852022maps_E0-E5.zip"
    server.files[path] = server.files[path][: len(server.files[path]) // 2]
    source = adapter("glc_fcs30d", server, tmp_path)
    with pytest.raises(SourceReadError) as raised:
        source.fetch("London", 2020, tmp_path / "s")
    message = str(raised.value)
    for part in ("http:glc_fcs30d", "London", "2020", "GLC_FCS30D_19852022maps_E0-E5.zip"):
        assert part in message
    item_dir = tmp_path / "s" / "glc_fcs30d" / "London" / "2020"
    assert not item_dir.exists() or not (item_dir / COMPLETE_MARKER).exists()
    assert list((tmp_path / "s" / "glc_fcs30d" / "London").glob("*")) == []
    assert source.manager.cached_path(server.url(path)) is None


# ------------------------------------------------------------------------------- 3D-GloBFP


def test_globfp_writes_the_twins_layer_and_its_coverage(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_globfp(server, tmp_path)
    item = adapter("globfp_height", server, tmp_path).fetch("Amsterdam", None, tmp_path / "s")
    layer = gpd.read_file(item.href("data"), layer="buildings")
    assert layer.crs.to_epsg() == 4326
    assert list(layer.columns) == ["id", "height", "geometry"]
    assert sorted(layer["height"]) == [0.0, 12.5, 48.0]
    assert item.extra["buildings_without_usable_height"] == "2"
    assert item.extra["duplicate_tiles_left_out"] == "1"
    assert not any(r.path.startswith("/dup.zip") for r in server.requests)
    coverage = shapely.union_all(gpd.read_file(item.href("coverage")).geometry.to_numpy())
    assert coverage.bounds[2] == pytest.approx(5.0)  # 5-6° E is listed nowhere
    assert not coverage.contains(square(4.88, 52.31, 80.0).centroid)
    assert coverage.contains(shapely.Point(4.7, 52.4))


def test_globfp_heights_reach_the_grid_as_computed_by_hand(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_globfp(server, tmp_path)
    item = adapter("globfp_height", server, tmp_path).fetch("Amsterdam", None, tmp_path / "s")
    modality = load_catalogue().get("HF")
    assert modality.rasterize is not None
    epsg = get_city("Amsterdam").epsg
    layer = open_vector_layer(
        Path(item.href("data")),
        modality.rasterize,
        epsg,
        load_products()["globfp_height"].expected_crs("Amsterdam"),
        Path(item.href("coverage")),
    )
    grid = pixel_grid("Amsterdam", 10.0)
    to_utm = transformer(CRS.from_epsg(4326), CRS.from_epsg(epsg))
    x0, y0 = to_utm.transform(4.80, 52.30)
    col0 = int((x0 - grid.x_min) // grid.resolution) - 20
    row0 = int((grid.y_max - y0) // grid.resolution) - 500
    rows, cols = 700, 900
    values, valid = rasterize_block(
        layer, grid, row0, row0 + rows, col0, col0 + cols, background=0.0, dtype=np.float32
    )
    xs = grid.x_min + (col0 + np.arange(cols) + 0.5) * grid.resolution
    ys = grid.y_max - (row0 + np.arange(rows) + 0.5) * grid.resolution
    gx, gy = np.meshgrid(xs, ys)
    lon, lat = transformer(CRS.from_epsg(epsg), CRS.from_epsg(4326)).transform(gx, gy)
    expected = np.zeros((rows, cols))
    expected_valid = np.ones((rows, cols), dtype=bool)
    for b_lon, b_lat, side, height in BUILDINGS:
        inside = shapely.contains_xy(square(b_lon, b_lat, side), lon, lat)
        if height is None or height < 0:
            expected_valid &= ~inside
        else:
            expected[inside] = height
    expected_valid &= lon < 5.0
    strict = ~_near_edges(lon, lat)
    np.testing.assert_array_equal(valid[strict], expected_valid[strict])
    both = strict & expected_valid
    np.testing.assert_allclose(values[0][both], expected[both])
    assert (values[0][both] == 48.0).sum() > 50


def _near_edges(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Pixel centres within 5 m of a footprint edge or the 5° E line (left out of the check)."""
    near = np.abs(lon - 5.0) < 1e-4
    for b_lon, b_lat, side, _ in BUILDINGS:
        ring = square(b_lon, b_lat, side).exterior
        near |= shapely.distance(ring, shapely.points(lon, lat)) < 7e-5
    return near


def test_a_city_no_listed_tile_meets_is_outside_coverage(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_globfp(server, tmp_path)
    source = adapter("globfp_height", server, tmp_path)
    with pytest.raises(SourceUnavailableError) as raised:
        source.fetch("Tokyo", None, tmp_path / "s")
    assert raised.value.reason == "outside_source_coverage"


def test_a_corrupt_globfp_tile_names_source_city_and_file_and_installs_nothing(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_globfp(server, tmp_path)
    path = "/files/1234_4_52_5_53_Europe.zip"
    server.files[path] = server.files[path][:200]
    source = adapter("globfp_height", server, tmp_path)
    with pytest.raises(SourceReadError) as raised:
        source.fetch("Amsterdam", None, tmp_path / "s")
    message = str(raised.value)
    for part in ("http:globfp_height", "Amsterdam", "static", "1234_4_52_5_53_Europe.zip"):
        assert part in message
    assert list((tmp_path / "s" / "globfp_height" / "Amsterdam").glob("*")) == []
    assert source.manager.cached_path(server.url(path)) is None
