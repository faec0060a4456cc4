"""Vector and point readers: block-by-block reads give what a whole read gives; bad files fail."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pyarrow as pa
import pyogrio
import pytest
import shapely
import shapely.affinity
from pyproj import CRS, Transformer
from rasterio.features import rasterize
from shapely.geometry import (
    GeometryCollection,
    LineString,
    MultiLineString,
    MultiPoint,
    MultiPolygon,
    Point,
    Polygon,
    box,
)

import citycube.processing.vectors as vectors
from citycube.catalogue.modalities import RasterizeSpec
from citycube.errors import SourceReadError
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.processing.chips import blocks
from citycube.processing.vectors import (
    check_declared_counts,
    iter_points,
    load_records,
    open_vector_layer,
    plain_points_from_wkb,
    point_counts,
    rasterize_block,
)

CITY, EPSG = "Amsterdam", 32631  # 10 km lattice blocks; the grid starts on a lattice line
WGS84 = CRS.from_epsg(4326)
TO_WGS84 = Transformer.from_crs(EPSG, 4326, always_xy=True)
SPEC = RasterizeSpec(layer="features", burn_column="value")


def _wgs84(geometry: shapely.Geometry) -> shapely.Geometry:
    return shapely.transform(geometry, lambda xy: np.column_stack(TO_WGS84.transform(*xy.T)))


def _features(path: Path) -> list[shapely.Geometry]:
    """Features that cross block edges and corners, plus one outside the grid."""
    x0, y0, x1, y1 = city_grid(CITY, "2km").bounds
    corner_x, corner_y = x0 + 10_000, y1 - 10_000  # a block corner
    utm = [
        box(corner_x - 700, corner_y - 900, corner_x + 800, corner_y + 600),  # four blocks
        LineString([(x0 + 150, corner_y + 37), (x1 - 150, corner_y + 37)]),  # every column
        LineString([(corner_x + 13, y0 + 100), (corner_x + 13, y1 - 100)]),  # along an edge
        box(x0 + 4_000, y0 + 3_000, x0 + 4_400, y0 + 3_500),  # inside one block
        box(x1 + 5_000, y1 + 5_000, x1 + 6_000, y1 + 6_000),  # outside the grid
    ]
    frame = gpd.GeoDataFrame(
        {"value": [3.0, 7.0, 9.0, 5.0, 11.0]}, geometry=[_wgs84(g) for g in utm], crs=4326
    )
    frame.to_file(path, layer="features")
    return utm


def test_block_reads_draw_what_a_whole_read_draws(tmp_path: Path) -> None:
    path = tmp_path / "features.gpkg"
    _features(path)
    grid = pixel_grid(CITY, 50)
    layer = open_vector_layer(path, SPEC, EPSG, WGS84, None)
    mosaic = np.zeros((grid.height, grid.width), np.float32)
    for r0, r1, c0, c1 in blocks(grid):
        values, valid = rasterize_block(
            layer, grid, r0, r1, c0, c1, background=0.0, dtype=np.dtype("float32")
        )
        assert valid.all()
        mosaic[r0:r1, c0:c1] = values[0]
    assert len(blocks(grid)) > 4
    whole = gpd.read_file(path, layer="features").to_crs(epsg=EPSG)
    expected = rasterize(
        zip(whole.geometry, whole["value"], strict=True),
        out_shape=(grid.height, grid.width),
        transform=grid.transform,
        dtype="float32",
    )
    np.testing.assert_array_equal(mosaic, expected)
    assert {3.0, 7.0, 9.0, 5.0} <= set(np.unique(mosaic).tolist())


def test_reading_a_layer_leaves_its_folder_untouched(tmp_path: Path) -> None:
    """Sources are read, never written: no GDAL sidecar appears next to a GeoPackage, block
    after block (the source families write their provenance into the file's metadata)."""
    folder = tmp_path / "item"
    folder.mkdir()
    path = folder / "features.gpkg"
    frame = gpd.GeoDataFrame(
        {"value": [3.0]}, geometry=[_wgs84(box(*city_grid(CITY, "2km").bounds))], crs=4326
    )
    tags = {"SYNTHETIC": "true"}
    pyogrio.write_dataframe(
        frame, path, layer="features", dataset_metadata=tags, layer_metadata=tags
    )
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    grid = pixel_grid(CITY, 100)
    layer = open_vector_layer(path, SPEC, EPSG, WGS84, None)
    for r0, r1, c0, c1 in blocks(grid)[:3]:
        rasterize_block(layer, grid, r0, r1, c0, c1, background=0.0, dtype=np.dtype("float32"))
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_footprint_layers_burn_as_rasterio_burns_them(tmp_path: Path) -> None:
    """Polygons without holes (the usual building layer) take their own short path."""
    x0, _, _, y1 = city_grid(CITY, "2km").bounds
    cx, cy = x0 + 10_000, y1 - 10_000  # a block corner
    rng = np.random.default_rng(7)
    utm = [
        shapely.affinity.rotate(
            box(cx + dx, cy + dy, cx + dx + w, cy + dy + h), angle, use_radians=False
        )
        for dx, dy, w, h, angle in zip(
            rng.uniform(-3_000, 3_000, 60),
            rng.uniform(-3_000, 3_000, 60),
            rng.uniform(20, 900, 60),
            rng.uniform(20, 900, 60),
            rng.uniform(0, 90, 60),
            strict=True,
        )
    ]
    path = tmp_path / "footprints.gpkg"
    frame = gpd.GeoDataFrame(
        {"value": np.arange(1.0, len(utm) + 1)}, geometry=[_wgs84(g) for g in utm], crs=4326
    )
    frame.to_file(path, layer="features")
    geometry = shapely.from_wkb(frame.geometry.to_wkb().to_numpy())
    assert vectors._plain_polygons(geometry, shapely.get_type_id(geometry))
    mosaic = _burn_block_by_block(path)
    np.testing.assert_array_equal(mosaic, _burn_whole_file(path))
    assert len(np.unique(mosaic)) > 40  # most footprints show, overlaps in burn order


def _burn_block_by_block(path: Path) -> np.ndarray:
    """The layer drawn onto Amsterdam's 50 m grid one 10 km block at a time."""
    grid = pixel_grid(CITY, 50)
    layer = open_vector_layer(path, SPEC, EPSG, WGS84, None)
    mosaic = np.zeros((grid.height, grid.width), np.float32)
    for r0, r1, c0, c1 in blocks(grid):
        values, _ = rasterize_block(
            layer, grid, r0, r1, c0, c1, background=0.0, dtype=np.dtype("float32")
        )
        mosaic[r0:r1, c0:c1] = values[0]
    return mosaic


def _burn_whole_file(path: Path) -> np.ndarray:
    """The reference: the whole file read by geopandas and burnt by rasterio in one go."""
    grid = pixel_grid(CITY, 50)
    whole = gpd.read_file(path, layer="features").to_crs(epsg=EPSG)
    return rasterize(
        zip(whole.geometry, whole["value"], strict=True),
        out_shape=(grid.height, grid.width),
        transform=grid.transform,
        dtype="float32",
    )


def _every_geometry_type(path: Path) -> None:
    """One feature of each type, overlapping so that burn order shows, some across blocks."""
    x0, _, _, y1 = city_grid(CITY, "2km").bounds
    cx, cy = x0 + 10_000, y1 - 10_000  # a block corner
    ring = [(cx - 900, cy - 900), (cx + 900, cy - 900), (cx + 900, cy + 900), (cx - 900, cy + 900)]
    hole = [(cx - 300, cy - 300), (cx + 300, cy - 300), (cx + 300, cy + 300), (cx - 300, cy + 300)]
    utm = [
        Polygon(ring, [hole]),
        MultiPolygon(
            [box(cx - 2_000, cy - 200, cx - 1_500, cy + 200), box(cx + 50, cy, cx + 600, cy + 250)]
        ),
        Point(cx + 1_234, cy - 777),
        MultiPoint([(cx - 1_111, cy + 1_333), (cx + 2_222, cy + 444)]),
        LineString([(cx - 3_000, cy - 3_000), (cx + 3_000, cy + 2_000)]),
        MultiLineString(
            [
                [(cx - 2_500, cy + 1_500), (cx + 2_500, cy + 1_700)],
                [(cx, cy - 2_900), (cx + 100, cy + 2_900)],
            ]
        ),
        GeometryCollection(
            [box(cx + 1_000, cy + 1_000, cx + 1_600, cy + 1_400), Point(cx - 2_600, cy - 2_600)]
        ),
        shapely.force_3d(box(cx - 1_800, cy - 1_800, cx - 1_000, cy - 1_200), z=42.0),
    ]
    frame = gpd.GeoDataFrame(
        {"value": np.arange(1.0, len(utm) + 1)}, geometry=[_wgs84(g) for g in utm], crs=4326
    )
    frame.to_file(path, layer="features")


def test_every_geometry_type_burns_as_rasterio_burns_it(tmp_path: Path) -> None:
    path = tmp_path / "mixed.gpkg"
    _every_geometry_type(path)
    mosaic = _burn_block_by_block(path)
    np.testing.assert_array_equal(mosaic, _burn_whole_file(path))
    assert set(np.unique(mosaic).tolist()) == set(range(9))  # every feature shows


def test_opening_checks_crs_columns_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "features.gpkg"
    _features(path)
    with pytest.raises(SourceReadError, match="mislabelled"):
        open_vector_layer(path, SPEC, EPSG, CRS.from_epsg(3857), None)
    with pytest.raises(SourceReadError, match="no column 'height'"):
        open_vector_layer(
            path, RasterizeSpec(layer="features", burn_column="height"), EPSG, WGS84, None
        )
    truncated = tmp_path / "truncated.gpkg"
    truncated.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(SourceReadError, match="corrupt or truncated"):
        open_vector_layer(truncated, SPEC, EPSG, WGS84, None)
    with pytest.raises(SourceReadError, match="does not exist"):
        open_vector_layer(tmp_path / "missing.gpkg", SPEC, EPSG, WGS84, None)


def _points(path: Path, n: int, crs: int = 4326) -> None:
    rng = np.random.default_rng(7)
    x0, y0, x1, y1 = city_grid(CITY, "2km").bounds
    xs, ys = rng.uniform(x0 - 500, x1 + 500, n), rng.uniform(y0 - 500, y1 + 500, n)
    lon, lat = TO_WGS84.transform(xs, ys)
    frame = gpd.GeoDataFrame(geometry=[Point(p) for p in zip(lon, lat, strict=True)], crs=4326)
    frame.to_crs(epsg=crs).to_parquet(path)


def test_point_batches_count_what_one_batch_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "points.parquet"
    _points(path, 5_000)
    grid = city_grid(CITY, "2km")

    def counts() -> tuple[np.ndarray, int]:
        total = np.zeros(grid.n_tiles, np.int64)
        batches = 0
        for x, y in iter_points(path, EPSG, WGS84):
            total += point_counts(grid, x, y)
            batches += 1
        return total, batches

    whole, one = counts()
    monkeypatch.setattr(vectors, "POINT_BATCH_ROWS", 333)
    batched, many = counts()
    assert one == 1 and many == 16
    np.testing.assert_array_equal(batched, whole)
    assert 0 < whole.sum() < 5_000  # the margin's points fall outside the grid


def test_points_are_projected_as_geopandas_projects_them(tmp_path: Path) -> None:
    path = tmp_path / "points.parquet"
    _points(path, 2_000)
    frame = gpd.read_parquet(path)
    frame.loc[[3, 17], "geometry"] = None  # missing: left out
    frame.loc[[5], "geometry"] = Point()  # empty: kept, at NaN
    frame.to_parquet(path)
    (x, y), *more = list(iter_points(path, EPSG, WGS84))
    assert not more
    expected = frame[~shapely.is_missing(frame.geometry.to_numpy())].to_crs(epsg=EPSG)
    np.testing.assert_array_equal(x, expected.geometry.x.to_numpy())
    np.testing.assert_array_equal(y, expected.geometry.y.to_numpy())
    assert len(x) == 1_998 and np.isnan(x[4]) and np.isfinite(np.delete(x, 4)).all()

    frame.loc[[9], "geometry"] = LineString([(4.9, 52.3), (4.91, 52.31)])
    frame.to_parquet(path)
    with pytest.raises(SourceReadError, match="holds geometries other than points"):
        list(iter_points(path, EPSG, WGS84))


def test_plain_points_are_decoded_without_geometry_objects_as_shapely_decodes_them(
    tmp_path: Path,
) -> None:
    points = [Point(4.9, 52.3), Point(), Point(-0.12, 51.5), Point(1e-9, -1e9)]
    wkb = pa.array(shapely.to_wkb(np.array(points, dtype=object)).tolist(), pa.binary())
    decoded = plain_points_from_wkb(wkb)
    assert decoded is not None
    np.testing.assert_array_equal(
        decoded, [[4.9, 52.3], [np.nan, np.nan], [-0.12, 51.5], [1e-9, -1e9]]
    )
    others = [
        shapely.to_wkb(Point(1, 2), byte_order=0),  # big-endian
        shapely.to_wkb(Point(1, 2, 3)),  # 3-D
        shapely.to_wkb(MultiPoint([(1, 2)])),
        None,  # missing
    ]
    for other in others:
        assert plain_points_from_wkb(pa.array([wkb[0].as_py(), other], pa.binary())) is None

    # A file of plain points (one empty) takes that path and projects as geopandas does.
    path = tmp_path / "points.parquet"
    _points(path, 500)
    frame = gpd.read_parquet(path)
    frame.loc[[5], "geometry"] = Point()
    frame.to_parquet(path)
    (x, y), *more = list(iter_points(path, EPSG, WGS84))
    expected = frame.to_crs(epsg=EPSG)
    np.testing.assert_array_equal(x, expected.geometry.x.to_numpy())
    np.testing.assert_array_equal(y, expected.geometry.y.to_numpy())
    assert not more and np.isnan(x[5]) and np.isfinite(np.delete(x, 5)).all()


def test_point_files_with_the_wrong_crs_or_damage_fail_clearly(tmp_path: Path) -> None:
    wrong = tmp_path / "mercator.parquet"
    _points(wrong, 50, crs=3857)
    with pytest.raises(SourceReadError, match="mislabelled"):
        list(iter_points(wrong, EPSG, WGS84))
    good = tmp_path / "points.parquet"
    _points(good, 500)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:-200])
    with pytest.raises(SourceReadError, match="corrupt or truncated"):
        list(iter_points(truncated, EPSG, WGS84))


def test_records_that_are_cut_or_garbled_are_refused_not_summed(tmp_path: Path) -> None:
    rows = [f"{4.9 + i * 1e-4},{52.37},{1000 + i}" for i in range(200)]
    rows[17] = "4.91,52.37,"  # the source's one declared blank value
    whole = tmp_path / "electricity.csv"
    whole.write_text("lon,lat,kwh\n" + "\n".join(rows) + "\n")
    declared = {"records": "200", "blank_values": "1"}
    records = load_records(whole, "kwh", None)
    assert (records.rows, records.unusable, len(records.values)) == (200, 1, 199)
    check_declared_counts(records, declared, whole)  # as declared: accepted

    cut = tmp_path / "cut.csv"
    cut.write_text("lon,lat,kwh\n" + "\n".join(rows[:100]) + "\n")  # cut at a line: parses
    with pytest.raises(SourceReadError, match="holds 100 records, its source declares 200"):
        check_declared_counts(load_records(cut, "kwh", None), declared, cut)

    garbled_rows = [r.replace(",10", ",1O") if i % 3 == 0 else r for i, r in enumerate(rows)]
    garbled = tmp_path / "garbled.csv"
    garbled.write_text("lon,lat,kwh\n" + "\n".join(garbled_rows) + "\n")
    with pytest.raises(SourceReadError, match="declares 1 blank: the file is garbled"):
        check_declared_counts(load_records(garbled, "kwh", None), declared, garbled)

    check_declared_counts(load_records(cut, "kwh", None), {}, cut)  # nothing declared: unchecked


def test_footprint_wkb_is_decoded_without_geometry_objects_only_when_it_is_plain() -> None:
    """Polygons without holes come straight out of their WKB, point for point as shapely
    reads them; anything else (holes, empty, 3-D, multi, big-endian, missing) is left to
    shapely."""
    import pyarrow as pa

    rng = np.random.default_rng(7)
    plain = [
        shapely.Polygon(np.c_[rng.random(n) * 100, rng.random(n) * 100].tolist())
        for n in rng.integers(3, 12, 200)
    ]
    column = pa.array(shapely.to_wkb(plain, flavor="iso"), pa.binary())
    decoded = vectors.plain_polygons_from_wkb(column.slice(5))  # an offset into the buffer
    coords, owner = shapely.get_coordinates(plain[5:], return_index=True)
    assert decoded is not None and np.array_equal(decoded.coords, coords)
    assert np.array_equal(decoded.counts, np.bincount(owner))
    kept = decoded.take(np.arange(len(decoded)) % 2 == 0)
    assert np.array_equal(kept.coords, shapely.get_coordinates(plain[5::2]))

    holed = Polygon([(0, 0), (9, 0), (9, 9), (0, 9)], [[(1, 1), (2, 1), (2, 2), (1, 1)]])
    not_plain = {
        "a hole": [*plain[:3], holed],
        "an empty polygon": [*plain[:3], Polygon()],
        "3-D": [Polygon([(0, 0, 1), (1, 0, 1), (1, 1, 1)])],
        "a multi-polygon": [MultiPolygon([plain[0]])],
    }
    for case, geometries in not_plain.items():
        wkb = pa.array(shapely.to_wkb(geometries, flavor="iso"), pa.binary())
        assert vectors.plain_polygons_from_wkb(wkb) is None, case
    big_endian = pa.array(shapely.to_wkb(plain[:3], byte_order=0), pa.binary())
    missing = pa.array([shapely.to_wkb(plain[0]), None], pa.binary())
    assert vectors.plain_polygons_from_wkb(big_endian) is None
    assert vectors.plain_polygons_from_wkb(missing) is None
