"""Vector and tabular sample products: native form, timing rules, coherence, synthetic labels."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pyogrio
import pystac
import pytest
import shapely
from pyproj import Transformer

from citycube.catalogue.cities import load_cities
from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_extent, city_grid
from citycube.items.protocol import SourceItem
from citycube.processing.classify import osm_building_function
from citycube.processing.money import ppp_2017_factor
from citycube.processing.vectors import coverage_fractions, load_coverage, tile_index
from sources.sample import SYNTHETIC_NOTICE, SampleBackend, synthetic_city
from sources.sample.osm import (
    HW,
    MAJOR_HIGHWAYS,
    TAG_COLUMNS,
    building_frame,
    building_snapshot_years,
    city_fabric,
    gps_trace_years,
    road_frame,
    road_snapshot_years,
)
from sources.sample.world import PRODUCT_MARGIN_M, SyntheticCity

CITY = "Boston"
YEAR = 2016
WGS84 = "EPSG:4326"


@pytest.fixture(scope="module")
def backend() -> SampleBackend:
    return SampleBackend()


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sample-vectors")


@pytest.fixture(scope="module")
def items(backend: SampleBackend, dest: Path) -> dict[str, SourceItem]:
    """One item per product (Boston, or DC for electricity), shared by read-only tests."""
    return {
        "osm_roads": backend.fetch("osm_roads", CITY, YEAR, dest),
        "osm_buildings": backend.fetch("osm_buildings", CITY, YEAR, dest),
        "globfp_height": backend.fetch("globfp_height", CITY, None, dest),
        "osm_gps_traces": backend.fetch("osm_gps_traces", CITY, YEAR, dest),
        "city_electricity": backend.fetch("city_electricity", "DC", YEAR, dest),
        "worldbank_indicators": backend.fetch("worldbank_indicators", CITY, None, dest),
    }


def _utm(frame: gpd.GeoDataFrame, city: str) -> gpd.GeoDataFrame:
    return frame.to_crs(epsg=synthetic_city(city).epsg)


# ---- catalogue and availability -------------------------------------------------------------


def test_city_years_match_the_reported_availability(backend: SampleBackend) -> None:
    cities = list(load_cities())
    totals = {
        product: sum(len(backend.source_years(product, city) or []) for city in cities)
        for product in ("osm_roads", "osm_buildings", "osm_gps_traces", "city_electricity")
    }
    assert totals == {
        "osm_roads": 300,
        "osm_buildings": 288,
        "osm_gps_traces": 284,
        "city_electricity": 111,
    }
    assert backend.source_years("osm_roads", CITY) == road_snapshot_years(CITY)
    assert backend.source_years("osm_buildings", CITY) == building_snapshot_years(CITY)
    assert backend.source_years("osm_gps_traces", CITY) == gps_trace_years(CITY)
    assert backend.source_years("city_electricity", "DC") == list(range(2010, 2024))
    assert backend.source_years("city_electricity", "Amsterdam") == []
    assert backend.source_years("globfp_height", CITY) is None
    assert backend.source_years("worldbank_indicators", CITY) is None


@pytest.mark.parametrize(
    ("product", "city", "year", "reason"),
    [
        ("osm_roads", CITY, 2007, "source_year_missing"),  # a gap in Boston's extracts
        ("osm_roads", CITY, 2004, "source_year_missing"),  # before the first extract
        ("osm_buildings", "Shanghai", 2018, "source_year_missing"),
        ("osm_buildings", "Shanghai", 2015, "source_year_missing"),
        ("osm_gps_traces", "XiongAn", 2012, "source_year_missing"),
        ("city_electricity", "DC", 2024, "source_year_missing"),
        ("city_electricity", "Amsterdam", 2016, "outside_source_coverage"),
        ("globfp_height", "Christchurch", None, "outside_source_coverage"),
        ("globfp_height", "Shanghai", None, "outside_source_coverage"),
    ],
)
def test_unavailable_requests_raise_with_a_reason(
    backend: SampleBackend, tmp_path: Path, product: str, city: str, year: int | None, reason: str
) -> None:
    with pytest.raises(SourceUnavailableError) as err:
        backend.fetch(product, city, year, tmp_path)
    assert err.value.reason == reason
    assert not list(tmp_path.rglob("*.gpkg")) and not list(tmp_path.rglob("*.csv"))


# ---- roads ----------------------------------------------------------------------------------


def test_roads_file_has_the_declared_form(items: dict[str, SourceItem]) -> None:
    path = items["osm_roads"].files["data"]
    assert pyogrio.list_layers(path)[:, 0].tolist() == ["roads"]
    roads = gpd.read_file(path, layer="roads")
    assert roads.crs.to_epsg() == 4326
    assert list(roads.columns) == ["osm_id", "highway", "name", "snapshot_date", "geometry"]
    assert roads["osm_id"].dtype == np.int64 and roads["osm_id"].is_unique
    assert set(roads.geom_type) == {"LineString"}
    assert set(roads["snapshot_date"]) == {f"{YEAR}-01-01"}
    kinds = set(roads["highway"])
    assert {"motorway", "trunk", "primary", "secondary"} <= kinds  # major roads
    assert {"tertiary", "residential", "footway"} <= kinds  # and the minor hierarchy
    assert roads.loc[roads["highway"] == "residential", "name"].notna().mean() > 0.9
    # Everything lies within the city extent plus the product margin.
    xmin, ymin, xmax, ymax = city_extent(CITY)
    m = PRODUCT_MARGIN_M + 1
    bounds = _utm(roads, CITY).total_bounds
    assert bounds[0] >= xmin - m and bounds[1] >= ymin - m
    assert bounds[2] <= xmax + m and bounds[3] <= ymax + m


def test_roads_grow_and_early_extracts_are_sparse() -> None:
    world = synthetic_city(CITY)
    first = road_frame(world, road_snapshot_years(CITY)[0])
    late = road_frame(world, 2024)
    length_first = _utm(first, CITY).length.groupby(first["highway"]).sum()
    length_late = _utm(late, CITY).length.groupby(late["highway"]).sum()
    assert length_late.sum() > length_first.sum()
    assert length_late["residential"] > 1.3 * length_first["residential"]
    major = sorted(MAJOR_HIGHWAYS & set(length_first.index))
    assert length_first[major].sum() > 0.8 * length_late[major].sum()  # majors mapped early


def test_major_roads_avoid_the_sea_and_follow_the_city() -> None:
    world = synthetic_city(CITY)
    roads = city_fabric(world).roads
    mx, my = (roads.x0 + roads.x1) / 2, (roads.y0 + roads.y1) / 2
    assert not world.points(mx, my).sea.any()
    urban = world.urban_intensity(world.points(mx, my), 2020)
    residential = roads.highway == HW["residential"]
    assert np.median(urban[residential]) > 0.3  # local streets are where the city is


# ---- buildings ------------------------------------------------------------------------------


def test_buildings_file_has_the_declared_form(items: dict[str, SourceItem]) -> None:
    path = items["osm_buildings"].files["data"]
    buildings = gpd.read_file(path, layer="buildings")
    assert buildings.crs.to_epsg() == 4326
    expected = ["osm_id", "building", *TAG_COLUMNS, "snapshot_date", "geometry"]
    assert list(buildings.columns) == expected
    assert buildings["osm_id"].dtype == np.int64 and buildings["osm_id"].is_unique
    assert set(buildings.geom_type) == {"Polygon"}
    assert buildings.is_valid.all()
    assert 20_000 < len(buildings) < 80_000


def test_buildings_with_and_without_function_tags(items: dict[str, SourceItem]) -> None:
    buildings = gpd.read_file(items["osm_buildings"].files["data"], layer="buildings")
    tags = buildings[list(TAG_COLUMNS)]
    unlabelled = (buildings["building"] == "yes") & tags.isna().all(axis=1)
    assert 0.2 < unlabelled.mean() < 0.8
    assert buildings["amenity"].notna().sum() > 100
    assert {"school", "hospital", "restaurant", "place_of_worship"} <= set(buildings["amenity"])
    assert buildings["shop"].notna().any() and buildings["religion"].notna().any()
    classes = osm_building_function(pd.DataFrame(buildings.drop(columns="geometry")))
    counts = np.bincount(classes, minlength=13)
    assert counts[0] == 0 and counts[1] > 0 and (counts[2:] > 0).all()  # every function occurs


def test_building_snapshots_only_grow_and_get_labelled() -> None:
    world = synthetic_city(CITY)
    first = building_snapshot_years(CITY)[0]
    years = [first, first + 4, first + 8, 2024]
    frames = [building_frame(world, y) for y in years]
    sizes = [len(f) for f in frames]
    assert sizes == sorted(sizes) and sizes[0] < 0.2 * sizes[-1]  # sparse early outlines
    for earlier, later in itertools.pairwise(frames):
        assert set(earlier["osm_id"]) <= set(later["osm_id"])  # nothing disappears
    labelled = [(f["building"] != "yes").mean() for f in frames]
    assert labelled[-1] > labelled[1] + 0.2


def test_buildings_are_denser_and_taller_downtown(items: dict[str, SourceItem]) -> None:
    world = synthetic_city(CITY)
    heights = _utm(gpd.read_file(items["globfp_height"].files["data"]), CITY)
    centre = heights.centroid
    r = np.hypot(centre.x - world.centre_xy[0], centre.y - world.centre_xy[1])
    inner, outer = r < 3000, (r > 8000) & (r < 12000)
    inner_density = inner.sum() / (np.pi * 3**2)
    outer_density = outer.sum() / (np.pi * (12**2 - 8**2))
    assert inner_density > 1.5 * outer_density
    assert heights["height"][inner].median() > 2 * heights["height"][outer].median()
    # Footprints keep off the water.
    assert not world.points(centre.x.to_numpy(), centre.y.to_numpy()).water.any()


# ---- 3D-GloBFP ------------------------------------------------------------------------------


def test_globfp_heights_match_the_osm_footprints(
    items: dict[str, SourceItem], backend: SampleBackend, dest: Path
) -> None:
    path = items["globfp_height"].files["data"]
    assert pyogrio.list_layers(path)[:, 0].tolist() == ["buildings"]
    heights = gpd.read_file(path, layer="buildings")
    assert heights.crs.to_epsg() == 4326
    assert list(heights.columns) == ["id", "height", "geometry"]
    assert heights["id"].dtype == np.int64 and heights["id"].is_unique
    assert heights["height"].dtype == np.float64 and (heights["height"] > 0).all()
    assert 3 < heights["height"].median() < 15 and heights["height"].max() > 80
    latest = building_snapshot_years(CITY)[-1]
    osm = gpd.read_file(backend.fetch("osm_buildings", CITY, latest, dest).files["data"])
    shared = set(shapely.to_wkb(heights.geometry.to_numpy())) & set(
        shapely.to_wkb(osm.geometry.to_numpy())
    )
    assert len(shared) > 0.85 * min(len(heights), len(osm))


# ---- GPS traces -----------------------------------------------------------------------------


def test_gps_points_cluster_downtown_and_leave_edge_tiles_empty(
    items: dict[str, SourceItem],
) -> None:
    path = items["osm_gps_traces"].files["data"]
    points = gpd.read_parquet(path)
    assert points.crs.to_epsg() == 4326
    assert list(points.columns) == ["track_id", "time", "geometry"]
    assert points["track_id"].dtype == np.int64 and set(points.geom_type) == {"Point"}
    assert str(points["time"].dt.tz) == "UTC" and set(points["time"].dt.year) == {YEAR}
    assert points["track_id"].nunique() > 100
    utm = _utm(points, CITY)
    x, y = utm.geometry.x.to_numpy(), utm.geometry.y.to_numpy()
    xmin, ymin, xmax, ymax = city_extent(CITY)
    m = PRODUCT_MARGIN_M + 1
    assert ((x >= xmin - m) & (x <= xmax + m) & (y >= ymin - m) & (y <= ymax + m)).all()
    grid = city_grid(CITY, "2km")
    index = tile_index(grid, x, y)
    counts = np.bincount(index[index >= 0], minlength=grid.n_tiles)
    empty = counts == 0
    assert 0.1 < empty.mean() < 0.7  # many, not all, tiles have no traces
    world = synthetic_city(CITY)
    centres = np.array(
        [[(t.bounds[0] + t.bounds[2]) / 2, (t.bounds[1] + t.bounds[3]) / 2] for t in grid.tiles()]
    )
    r = np.hypot(centres[:, 0] - world.centre_xy[0], centres[:, 1] - world.centre_xy[1])
    assert r[empty].mean() > 1.3 * r[~empty].mean()  # the empty ones lie towards the edges
    assert counts[np.argmin(r)] > np.median(counts[~empty])


# ---- electricity ----------------------------------------------------------------------------


def test_electricity_records_stay_inside_the_reporting_area(items: dict[str, SourceItem]) -> None:
    item = items["city_electricity"]
    assert set(item.files) == {"data", "coverage"}
    records = pd.read_csv(item.files["data"])
    assert list(records.columns) == ["building_id", "lon", "lat", "year", "kwh", "synthetic"]
    assert set(records["year"]) == {YEAR} and records["synthetic"].all()
    assert records["building_id"].is_unique
    kwh = records["kwh"]
    assert 0 < kwh.isna().mean() < 0.1 and (kwh.dropna() > 0).all()

    coverage = gpd.read_file(item.files["coverage"])
    assert coverage.crs.to_epsg() == 4326 and set(coverage.geom_type) == {"Polygon"}
    area = shapely.union_all(coverage.geometry.to_numpy())
    assert shapely.contains_xy(area, records["lon"], records["lat"]).all()
    epsg = synthetic_city("DC").epsg
    area_utm = load_coverage(item.files["coverage"], epsg)
    x, y = Transformer.from_crs(4326, epsg, always_xy=True).transform(
        records["lon"], records["lat"]
    )
    assert shapely.contains_xy(area_utm, x, y).all()

    grid = city_grid("DC", "2km")
    fractions = coverage_fractions(grid, area_utm)
    assert 0.15 < fractions.mean() < 0.7  # only part of the grid reports
    assert (fractions == 0).sum() > 20 and (fractions > 0.99).sum() > 10
    index = tile_index(grid, np.asarray(x), np.asarray(y))
    sums = np.bincount(index[index >= 0], weights=kwh.fillna(0)[index >= 0], minlength=grid.n_tiles)
    covered = fractions > 0.99
    assert (sums[covered] > 0).mean() > 0.9  # nearly every covered tile has consumption


def test_electricity_grows_with_the_ordinance(backend: SampleBackend, dest: Path) -> None:
    first = pd.read_csv(backend.fetch("city_electricity", "DC", 2010, dest).files["data"])
    later = pd.read_csv(backend.fetch("city_electricity", "DC", 2020, dest).files["data"])
    assert len(later) > len(first) > 100
    assert set(first["building_id"]) & set(later["building_id"])  # the same buildings report


# ---- World Bank -----------------------------------------------------------------------------


def test_worldbank_json_has_the_api_layout(items: dict[str, SourceItem]) -> None:
    item = items["worldbank_indicators"]
    iso3s = {c.iso3 for c in load_cities().values()}
    for role, indicator in (("cpi", "FP.CPI.TOTL"), ("ppp", "PA.NUS.PPP")):
        meta, records = json.loads(item.files[role].read_text())
        assert {"page", "pages", "per_page", "total", "sourceid", "lastupdated"} <= set(meta)
        assert meta["total"] == len(records) == len(iso3s) * 26
        assert meta["sourcename"] == "CityCube synthetic sample" and meta["synthetic"] is True
        assert meta["notice"] == SYNTHETIC_NOTICE
        first = records[0]
        assert set(first) == {
            "indicator",
            "country",
            "countryiso3code",
            "date",
            "value",
            "unit",
            "obs_status",
            "decimal",
        }
        assert {r["indicator"]["id"] for r in records} == {indicator}
        values = {(r["countryiso3code"], int(r["date"])): r["value"] for r in records}
        assert {iso for iso, _ in values} == iso3s
        assert all(values[(iso, 2017)] is not None for iso in iso3s)
        assert any(v is None for v in values.values())  # latest years not yet published
        assert all(v is None or v > 0 for v in values.values())
        if role == "cpi":
            assert all(values[(iso, 2010)] == pytest.approx(100.0) for iso in iso3s)
            assert values[("GBR", 2022)] > values[("GBR", 2017)]
        else:
            assert all(values[("USA", y)] == 1.0 for y in range(2000, 2025))
    # The engine's money conversion reads them.
    factor = ppp_2017_factor(item, "GBR", 2020)
    assert factor is not None and 1.0 < factor < 2.0


def test_worldbank_content_is_the_same_for_every_city(
    backend: SampleBackend, dest: Path, items: dict[str, SourceItem]
) -> None:
    other = backend.fetch("worldbank_indicators", "DC", None, dest)
    for role in ("cpi", "ppp"):
        assert (
            other.files[role].read_bytes() == items["worldbank_indicators"].files[role].read_bytes()
        )


# ---- labels, STAC, determinism --------------------------------------------------------------


def test_everything_is_labelled_synthetic(items: dict[str, SourceItem]) -> None:
    for product in ("osm_roads", "osm_buildings", "globfp_height"):
        info = pyogrio.read_info(items[product].files["data"])
        assert info["dataset_metadata"]["SYNTHETIC"] == "true"
        assert info["layer_metadata"]["CITYCUBE_NOTICE"] == SYNTHETIC_NOTICE
    metadata = pq.read_schema(items["osm_gps_traces"].files["data"]).metadata
    assert metadata[b"SYNTHETIC"] == b"true" and b"geo" in metadata
    coverage = json.loads(items["city_electricity"].files["coverage"].read_text())
    assert coverage["synthetic"] is True and coverage["notice"] == SYNTHETIC_NOTICE
    assert all(f["properties"]["synthetic"] for f in coverage["features"])
    for item in items.values():
        assert item.synthetic
        stac = pystac.Item.from_file(item.extra["stac_item"])
        assert stac.properties["citycube:synthetic"] is True
        west, south, east, north = stac.bbox
        assert west < east and south < north
        for role, path in item.files.items():
            assert stac.assets[role].href.endswith(path.name)


def test_stac_footprint_contains_the_landmark(items: dict[str, SourceItem]) -> None:
    landmarks = {CITY: (-71.0589, 42.3601), "DC": (-77.0091, 38.8899)}
    for item in items.values():
        lon, lat = landmarks[item.city]
        west, south, east, north = pystac.Item.from_file(item.extra["stac_item"]).bbox
        assert west < lon < east and south < lat < north


def test_fabric_is_deterministic_and_seeded() -> None:
    cached = city_fabric(synthetic_city("Amsterdam"))
    again = city_fabric(SyntheticCity("Amsterdam"))  # a fresh world, as in another process
    assert np.array_equal(cached.buildings.corners, again.buildings.corners)
    assert np.array_equal(cached.roads.osm_id, again.roads.osm_id)
    assert (cached.roads.name == again.roads.name).all()
    other = city_fabric(SyntheticCity("Amsterdam", seed=1))
    assert len(other.buildings.corners) != len(cached.buildings.corners) or not np.allclose(
        other.buildings.corners, cached.buildings.corners
    )


def test_a_large_rural_grid_works() -> None:
    world = synthetic_city("Christchurch")
    buildings = building_frame(world, 2020)
    roads = road_frame(world, 2020)
    assert 20_000 < len(buildings) < 150_000 and len(roads) > 1_000
    assert {"motorway", "secondary", "residential"} <= set(roads["highway"])
