"""Record connectors against a loopback server speaking ArcGIS REST, Socrata SODA, a paged JSON
API, bulk CSV files and the World Bank API v2: paging, year filters, outSR, ArcGIS error pages
(HTTP 200 with an error object), 429 with Retry-After, the app token kept out of everything
written, and the normalised items the core reads by spatial form."""

from __future__ import annotations

import gzip
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely
import yaml
from pyproj import Transformer

from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.processing.money import ppp_2017_factor
from citycube.processing.records import place_records, tile_values
from sources.records import records_adapters
from tests.record_portals import Fault, Layer, RecordPortals, esri_polygon, wb_rows

CITY = "Boston"
EPSG = 32619
TO_LONLAT = Transformer.from_crs(EPSG, 4326, always_xy=True)
GRID = city_grid(CITY, "2km")


def tile_origin(row: int, col: int) -> tuple[float, float]:
    """South-west corner (UTM) of a 2 km tile of Boston's grid."""
    return GRID.x_min + col * 2000.0, GRID.y_max - (row + 1) * 2000.0


def lonlat(x: float, y: float) -> tuple[float, float]:
    lon, lat = TO_LONLAT.transform(x, y)
    return float(lon), float(lat)


def square_lonlat(x: float, y: float, size: float) -> list[tuple[float, float]]:
    """A UTM square's corners in lon/lat (counter-clockwise)."""
    return [lonlat(*p) for p in ((x, y), (x + size, y), (x + size, y + size), (x, y + size))]


def coverage_geojson(rows: range, cols: range) -> bytes:
    """A coverage polygon equal to a block of 2 km tiles (densified, in lon/lat)."""
    x0, y0 = tile_origin(rows.stop - 1, cols.start)
    box = shapely.segmentize(shapely.box(x0, y0, x0 + 2000 * len(cols), y0 + 2000 * len(rows)), 50)
    frame = gpd.GeoDataFrame(geometry=[box], crs=EPSG).to_crs(4326)
    return frame.to_json().encode()


def write_specs(path: Path, *entries: dict[str, Any]) -> Path:
    base = {"licence": "test licence", "attribution": "test portal", "portal": "loopback"}
    path.write_text(yaml.safe_dump({"records": [{**base, **e} for e in entries]}), "utf-8")
    return path


def adapters(tmp_path: Path, portals: RecordPortals, spec_file: Path) -> dict[str, Any]:
    options = {
        "spec_file": str(spec_file),
        "cache_dir": str(tmp_path / "downloads"),
        "attempts": 3,
        "wait_initial_s": 0.01,
        "wait_max_s": 3.0,
        "timeout_s": 10.0,
        "worldbank_api": portals.url("/wb/v2"),
        "worldbank_per_page": 3,
    }
    return {a.product_id: a for a in records_adapters(options)}


@pytest.fixture
def portals() -> Iterator[RecordPortals]:
    with RecordPortals() as running:
        yield running


# ------------------------------------------------------------------------------- ArcGIS


def parcel_layer() -> Layer:
    """Seven 2020 parcels and two 2019 ones; the server hands out three rows a page."""
    features = []
    x, y = tile_origin(5, 5)
    for i in range(7):
        west = x + 100 + 250 * i if i < 6 else x + 1900  # the last one straddles c5 and c6
        ring = square_lonlat(west, y + 500, 200)
        attributes = {"OBJECTID": i + 1, "FISCAL_YEAR": 2020, "TOTAL_VALUE": 100_000 * (i + 1)}
        features.append({"attributes": attributes, "geometry": esri_polygon(ring)})
    for i in range(2):
        ring = square_lonlat(x + 100, y + 1500, 200)
        attributes = {"OBJECTID": 20 + i, "FISCAL_YEAR": 2019, "TOTAL_VALUE": 5}
        features.append({"attributes": attributes, "geometry": esri_polygon(ring)})
    return Layer(features, max_record_count=3)


ARCGIS_PATH = "/arcgis/rest/services/Assessing/Parcels/FeatureServer/0"


def arcgis_spec(portals: RecordPortals) -> dict[str, Any]:
    return {
        "city": CITY,
        "product": "city_property",
        "protocol": "arcgis",
        "endpoint": portals.url(ARCGIS_PATH),
        "year_filter": "FISCAL_YEAR = {year}",
        "order_by": "OBJECTID",
        "paging": {"page_size": 1000},
        "fields": {"value": "TOTAL_VALUE", "year": "FISCAL_YEAR"},
        "spatial_form": "parcel",
        "coverage": portals.url("/files/boston_coverage.geojson"),
        "unit": "USD",
        "currency": "USD",
        "years": [2019, 2020],
    }


def test_arcgis_pages_with_result_offset_and_asks_for_wgs84(
    tmp_path: Path, portals: RecordPortals
) -> None:
    portals.layers["Assessing/Parcels"] = parcel_layer()
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(4, 7), range(4, 7))
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", arcgis_spec(portals)))
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")

    pages = portals.requests(ARCGIS_PATH + "/query")
    assert [int(p.query["resultOffset"]) for p in pages] == [0, 3, 6]
    assert {p.query["outSR"] for p in pages} == {"4326"}
    assert {p.query["where"] for p in pages} == {"FISCAL_YEAR = 2020"}
    assert {p.query["orderByFields"] for p in pages} == {"OBJECTID"}
    assert item.extra["records"] == "7" and item.extra["blank_values"] == "0"
    assert item.extra["spatial_form"] == "parcel" and item.extra["currency"] == "USD"
    frame = pq.read_table(item.files["data"]).to_pandas()
    assert sorted(frame["value"]) == [100_000.0 * k for k in range(1, 8)]
    assert not item.synthetic and item.source_id == "records:city_property"

    # Parcels are 200 m squares; the seventh (x+1900…2100) lies half in c5, half in c6.
    placed = place_records(item, EPSG, 2020)
    tiles = tile_values(placed, GRID, total=False)
    c5 = 5 * GRID.n_cols + 5
    areas = [200.0 * 200] * 6 + [100.0 * 200]
    values = [100_000.0 * k for k in range(1, 8)]
    expected = sum(v * a for v, a in zip(values, areas, strict=True)) / sum(areas)
    assert tiles.value[c5] == pytest.approx(expected, rel=1e-4)
    assert tiles.value[c5 + 1] == pytest.approx(700_000.0, rel=1e-6)
    assert tiles.support[c5] == pytest.approx(1.0, abs=1e-6)
    assert np.isnan(tiles.value[0]) and tiles.covered[0] == 0.0


def test_arcgis_error_page_with_http_200_fails_and_is_not_cached(
    tmp_path: Path, portals: RecordPortals
) -> None:
    portals.layers["Assessing/Parcels"] = parcel_layer()
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(4, 7), range(4, 7))
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", arcgis_spec(portals)))
    prop = source["city_property"]
    portals.fault(
        ARCGIS_PATH + "/query", Fault(arcgis_error=(400, "Unable to complete operation."))
    )
    with pytest.raises(SourceFetchError, match="ArcGIS error 400: Unable to complete") as err:
        prop.fetch(CITY, 2020, tmp_path / "sources")
    assert not err.value.transient
    assert not (tmp_path / "sources" / "city_property" / CITY / "2020").exists()

    portals.fault(ARCGIS_PATH + "/query", Fault(arcgis_error=(504, "Gateway timeout")))
    with pytest.raises(SourceFetchError, match="ArcGIS error 504") as err:
        prop.fetch(CITY, 2020, tmp_path / "sources")
    assert err.value.transient  # the asset's retry policy tries again

    before = len(portals.requests(ARCGIS_PATH + "/query"))
    item = prop.fetch(CITY, 2020, tmp_path / "sources")  # the error pages were not cached
    assert len(portals.requests(ARCGIS_PATH + "/query")) == before + 3
    assert item.extra["records"] == "7"


def test_arcgis_layer_ignoring_out_sr_is_refused(tmp_path: Path, portals: RecordPortals) -> None:
    layer = parcel_layer()
    layer.wkid, layer.honours_out_sr = 102100, False
    portals.layers["Assessing/Parcels"] = layer
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(4, 7), range(4, 7))
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", arcgis_spec(portals)))
    with pytest.raises(SourceReadError, match="wkid 102100, not the outSR 4326"):
        source["city_property"].fetch(CITY, 2020, tmp_path / "sources")


def test_years_and_cities_outside_the_spec_are_unavailable_without_a_request(
    tmp_path: Path, portals: RecordPortals
) -> None:
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", arcgis_spec(portals)))
    prop = source["city_property"]
    assert prop.source_years(CITY) == [2019, 2020] and prop.source_years("Lyon") == []
    with pytest.raises(SourceUnavailableError) as err:
        prop.fetch(CITY, 2021, tmp_path / "sources")
    assert err.value.reason == "source_year_missing"
    with pytest.raises(SourceUnavailableError) as err:
        prop.fetch("Lyon", 2020, tmp_path / "sources")
    assert err.value.reason == "outside_source_coverage"
    assert portals.seen == []


# ------------------------------------------------------------------------------ Socrata


def rolling_sales() -> list[dict[str, Any]]:
    rows = [
        ("02108", "2020-03-01T00:00:00.000", "850000"),
        ("02108", "2020-06-11T00:00:00.000", "1,150,000"),
        ("02116", "2020-07-01T00:00:00.000", "0"),  # a $0 transfer: not a market value
        ("99999", "2020-08-01T00:00:00.000", "500000"),  # no such ZCTA: unmatched
        ("02116", "2020-09-30T00:00:00.000", "700000"),
        ("02108", "2019-05-01T00:00:00.000", "1"),
    ]
    return [
        {":id": f"row-{i:03d}", "zip_code": z, "sale_date": d, "sale_price": p}
        for i, (z, d, p) in enumerate(rows)
    ]


def zcta_table() -> bytes:
    x, y = tile_origin(6, 6)
    centres = {"02108": lonlat(x + 1000, y + 1000), "02116": lonlat(x + 3000, y + 1000)}
    lines = ["GEOID\tALAND\tINTPTLAT\tINTPTLONG                                                   "]
    lines += [f"{k}\t1000\t{lat:.7f}\t{lon:.7f}" for k, (lon, lat) in centres.items()]
    return ("\n".join(lines) + "\n").encode()


def soda_spec(portals: RecordPortals) -> dict[str, Any]:
    return {
        "city": CITY,
        "product": "city_property",
        "protocol": "socrata",
        "endpoint": portals.url("/resource/w2pb-icbu.json"),
        "year_filter": "sale_date between '{year}-01-01T00:00:00' and '{year}-12-31T23:59:59'",
        "order_by": ":id",
        "paging": {"page_size": 2},
        "token_env": "TEST_SOCRATA_TOKEN",
        "fields": {"value": "sale_price", "year": "sale_date", "postcode": "zip_code"},
        "spatial_form": "postcode",
        "points_table": {
            "href": portals.url("/files/zcta.txt"),
            "key": "GEOID",
            "lon": "INTPTLONG",
            "lat": "INTPTLAT",
        },
        "coverage": portals.url("/files/boston_coverage.geojson"),
        "min_value": 1,
        "unit": "USD",
        "currency": "USD",
        "years": [2019, 2020],
    }


def test_socrata_pages_with_order_sends_the_token_and_honours_retry_after(
    tmp_path: Path,
    portals: RecordPortals,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = "s3cret-app-token-1234"
    monkeypatch.setenv("TEST_SOCRATA_TOKEN", token)
    portals.soda["w2pb-icbu"] = rolling_sales()
    portals.files["zcta.txt"] = zcta_table()
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(5, 8), range(5, 9))
    portals.fault("/resource/w2pb-icbu.json", Fault(status=429, headers={"Retry-After": "1"}))
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", soda_spec(portals)))
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert time.monotonic() - started >= 1.0  # waited as long as Retry-After asked

    pages = portals.requests("/resource/w2pb-icbu.json")
    assert pages[0].query["$offset"] == "0" and len(pages) == 1 + 3  # the 429, then 2+2+1 rows
    assert [p.query["$offset"] for p in pages[1:]] == ["0", "2", "4"]
    assert {p.query["$order"] for p in pages} == {":id"}
    assert {p.query["$limit"] for p in pages} == {"2"}
    assert {p.app_token for p in pages} == {token}
    # The token is in no file written, no cache index and no log line.
    for path in [*tmp_path.rglob("*")]:
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
    assert token not in caplog.text

    assert item.extra["records"] == "5" and item.extra["blank_values"] == "1"  # the $0 sale
    placed = place_records(item, EPSG, 2020)
    assert placed.ingest.unmatched == 1 and placed.ingest.unmatched_examples == ("99999",)
    assert placed.ingest.used == 3
    tiles = tile_values(placed, GRID, total=False)
    r6c6, r6c7 = 6 * GRID.n_cols + 6, 6 * GRID.n_cols + 7
    assert tiles.value[r6c6] == pytest.approx((850_000 + 1_150_000) / 2)  # '1,150,000' read
    assert tiles.value[r6c7] == pytest.approx(700_000)


def test_socrata_client_error_fails_at_once_and_order_is_always_sent(
    tmp_path: Path, portals: RecordPortals
) -> None:
    spec = {**soda_spec(portals), "order_by": None}
    portals.soda["w2pb-icbu"] = rolling_sales()
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", spec))
    portals.fault("/resource/w2pb-icbu.json", Fault(status=400))
    with pytest.raises(SourceFetchError, match="HTTP 400") as err:
        source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert not err.value.transient
    assert len(portals.requests("/resource/w2pb-icbu.json")) == 1  # a 400 is not retried
    # Without an order in the spec the connector still pages in SODA's row-id order.
    portals.files["zcta.txt"] = zcta_table()
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(5, 8), range(5, 9))
    source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert portals.requests("/resource/w2pb-icbu.json")[-1].query["$order"] == ":id"


# ------------------------------------------------------------------- bulk CSV and JSON API


def test_bulk_csv_gzip_keeps_one_row_per_mutation_and_filters_rows(
    tmp_path: Path, portals: RecordPortals
) -> None:
    x, y = tile_origin(6, 6)
    (lon1, lat1), (lon2, lat2) = lonlat(x + 500, y + 500), lonlat(x + 2500, y + 500)
    text = "\n".join(
        [
            "id_mutation,date_mutation,nature_mutation,valeur_fonciere,longitude,latitude",
            f"2020-1,2020-02-03,Vente,300000,{lon1},{lat1}",
            f"2020-1,2020-02-03,Vente,300000,{lon1},{lat1}",  # the same sale's second lot
            f"2020-2,2020-05-06,Vente,500000,{lon2},{lat2}",
            f"2020-3,2020-05-06,Echange,900000,{lon2},{lat2}",  # not a sale
            f"2020-4,2020-07-08,Vente,,{lon2},{lat2}",  # no value published
        ]
    )
    portals.files["dvf/2020/69.csv.gz"] = gzip.compress(text.encode())
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(5, 8), range(5, 9))
    spec = {
        "city": CITY,
        "product": "city_property",
        "protocol": "bulk_csv",
        "endpoint": portals.url("/files/dvf/{year}/69.csv.gz"),
        "row_filter": {"nature_mutation": ["Vente"]},
        "dedupe_by": "id_mutation",
        "fields": {
            "value": "valeur_fonciere",
            "year": "date_mutation",
            "lon": "longitude",
            "lat": "latitude",
        },
        "spatial_form": "point",
        "coverage": portals.url("/files/boston_coverage.geojson"),
        "unit": "USD",
        "currency": "USD",
        "years": [2020],
    }
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", spec))
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["records"] == "3" and item.extra["blank_values"] == "1"
    tiles = tile_values(place_records(item, EPSG, 2020), GRID, total=False)
    assert tiles.value[6 * GRID.n_cols + 6] == pytest.approx(300_000)
    assert tiles.value[6 * GRID.n_cols + 7] == pytest.approx(500_000)


def test_json_api_pages_by_offset_and_apportions_admin_units(
    tmp_path: Path, portals: RecordPortals
) -> None:
    # Two units: A is tile r6c6 exactly; B is the 2 km x 1 km southern half of r6c7.
    x, y = tile_origin(6, 6)
    units = gpd.GeoDataFrame(
        {"PLN_AREA_N": ["ALPHA", "BRAVO"]},
        geometry=[
            shapely.segmentize(shapely.box(x, y, x + 2000, y + 2000), 50),
            shapely.segmentize(shapely.box(x + 2000, y, x + 4000, y + 1000), 50),
        ],
        crs=EPSG,
    )
    portals.files["units.geojson"] = units.to_crs(4326).to_json().encode()
    portals.datastore["hdb"] = [
        {"month": "2020-01", "town": "Alpha", "resale_price": "400000"},
        {"month": "2020-02", "town": "ALPHA", "resale_price": "600000"},
        {"month": "2020-03", "town": "bravo", "resale_price": "300000"},
        {"month": "2019-03", "town": "BRAVO", "resale_price": "1"},
        {"month": "2020-04", "town": "CHARLIE", "resale_price": "300000"},
    ]
    spec = {
        "city": CITY,
        "product": "city_property",
        "protocol": "json_api",
        "endpoint": portals.url("/api/action/datastore_search"),
        "params": {"resource_id": "hdb"},
        "paging": {
            "page_size": 2,
            "offset_param": "offset",
            "size_param": "limit",
            "records_path": "result.records",
        },
        "fields": {"value": "resale_price", "year": "month", "unit_id": "town"},
        "spatial_form": "admin_unit",
        "units_table": {"href": portals.url("/files/units.geojson"), "key": "PLN_AREA_N"},
        "unit": "USD",
        "currency": "USD",
        "years": [2020],
    }
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", spec))
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    offsets = [p.query["offset"] for p in portals.requests("/api/action/datastore_search")]
    assert offsets == ["0", "2", "4"]
    placed = place_records(item, EPSG, 2020)
    assert placed.ingest.unmatched == 1  # CHARLIE has no boundary
    tiles = tile_values(placed, GRID, total=False)
    r6c6, r6c7 = 6 * GRID.n_cols + 6, 6 * GRID.n_cols + 7
    assert tiles.value[r6c6] == pytest.approx(500_000, rel=1e-9)
    assert tiles.support[r6c6] == pytest.approx(1.0, abs=1e-4)
    assert tiles.value[r6c7] == pytest.approx(300_000, rel=1e-9)
    assert tiles.support[r6c7] == pytest.approx(0.5, abs=1e-4)  # BRAVO covers half the tile


# ---------------------------------------------------------------------------- World Bank


def test_world_bank_series_are_paged_merged_and_convert_by_hand(
    tmp_path: Path, portals: RecordPortals
) -> None:
    portals.worldbank["FP.CPI.TOTL"] = wb_rows(
        "FP.CPI.TOTL",
        {"GBR": {2017: 110.0, 2020: 121.0, 2025: None}, "USA": {2017: 112.0, 2020: 118.7}},
    )
    portals.worldbank["PA.NUS.PPP"] = wb_rows(
        "PA.NUS.PPP", {"GBR": {2017: 0.70, 2020: 0.69}, "USA": {2017: 1.0, 2020: 1.0}}
    )
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", arcgis_spec(portals)))
    item = source["worldbank_indicators"].fetch(CITY, None, tmp_path / "sources")
    cpi_pages = portals.requests("/wb/v2/country/all/indicator/FP.CPI.TOTL")
    assert [p.query["page"] for p in cpi_pages] == ["1", "2"]  # 5 rows at 3 a page
    assert {p.query["per_page"] for p in cpi_pages} == {"3"}
    payload = json.loads(Path(item.files["cpi"]).read_text())
    assert len(payload[1]) == 5 and payload[0]["pages"] == 2
    # GBP 2020 → 2017 PPP int. $: × CPI2017/CPI2020 ÷ PPP2017 = 110/121/0.70.
    assert ppp_2017_factor(item, "GBR", 2020) == pytest.approx(110.0 / 121.0 / 0.70)
    assert ppp_2017_factor(item, "GBR", 2025) is None  # a null CPI stays missing
    # A second city reads the cached pages: no new request.
    before = len(portals.seen)
    source["worldbank_indicators"].fetch("NYC", None, tmp_path / "sources")
    assert len(portals.seen) == before


# ----------------------------------------------------------- the declared cities and years


def test_portals_declare_the_sample_twins_cities_and_years() -> None:
    """The twin's city-years equal the portals': the availability report compares with
    Tables 10 and 11 either way (PROP 232, ELEC 111 city-years)."""
    from sources.records.spec import load_record_products
    from sources.sample.property import PROPERTY_RECORDS
    from sources.sample.records import ELECTRICITY_YEARS

    specs = load_record_products()
    prop = {c: list(s.years) for (p, c), s in specs.items() if p == "city_property"}
    elec = {c: list(s.years) for (p, c), s in specs.items() if p == "city_electricity"}
    assert prop == {c: r.years for c, r in PROPERTY_RECORDS.items()}
    assert elec == {c: list(y) for c, y in ELECTRICITY_YEARS.items()}
    assert sum(map(len, prop.values())) == 232 and sum(map(len, elec.values())) == 111
    currencies = {c: s.currency for (p, c), s in specs.items() if p == "city_property"}
    assert currencies == {c: r.currency for c, r in PROPERTY_RECORDS.items()}
    for spec in specs.values():
        assert spec.licence and spec.portal and spec.attribution, spec.key


def test_the_records_source_set_loads() -> None:
    from sources import load_source_set

    sources = load_source_set(Path(__file__).parents[1] / "schemas/source_sets/records.yaml")
    assert sources.product("city_property").info.source_id == "records:city_property"
    assert sources.product("worldbank_indicators").info.source_id == "worldbank:wdi-api-v2"
    assert sources.product("landsat_c2l2").info.synthetic


def test_a_token_sent_as_query_parameter_is_kept_out_of_cache_and_files(
    tmp_path: Path, portals: RecordPortals, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "Service%Key/with+odd=chars"
    monkeypatch.setenv("TEST_SERVICE_KEY", token)
    x, y = tile_origin(6, 6)
    lon, lat = lonlat(x + 500, y + 500)
    portals.datastore["kr"] = [{"dealYear": "2020", "amt": "82,500", "lon": lon, "lat": lat}]
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(5, 8), range(5, 9))
    spec = {
        "city": CITY,
        "product": "city_property",
        "protocol": "json_api",
        "endpoint": portals.url("/api/action/datastore_search"),
        "params": {"resource_id": "kr"},
        "paging": {"page_size": 10, "page_param": "pageNo", "size_param": "numOfRows",
                   "records_path": "result.records"},
        "token_env": "TEST_SERVICE_KEY",
        "token_param": "serviceKey",
        "fields": {"value": "amt", "year": "dealYear", "lon": "lon", "lat": "lat"},
        "spatial_form": "point",
        "coverage": portals.url("/files/boston_coverage.geojson"),
        "value_scale": 10000,
        "unit": "USD",
        "currency": "USD",
        "years": [2020],
    }  # fmt: skip
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", spec))
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    (page,) = portals.requests("/api/action/datastore_search")
    assert page.query["serviceKey"] == token and page.query["pageNo"] == "1"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"Service" not in path.read_bytes(), path
    tiles = tile_values(place_records(item, EPSG, 2020), GRID, total=False)
    assert tiles.value[6 * GRID.n_cols + 6] == pytest.approx(825_000_000.0)  # 82,500 x 10,000


def test_json_api_unpaged_with_expanded_parameters_and_a_single_row_object(
    tmp_path: Path, portals: RecordPortals
) -> None:
    x, y = tile_origin(6, 6)
    lon, lat = lonlat(x + 500, y + 500)
    one = {"response": {"body": {"items": {"item": {"p": "10", "lon": lon, "lat": lat}}}}}
    two = {"response": {"body": {"items": {"item": [{"p": "30", "lon": lon, "lat": lat}] * 2}}}}
    portals.files["kr.json"] = json.dumps(one).encode()
    portals.files["boston_coverage.geojson"] = coverage_geojson(range(5, 8), range(5, 9))
    spec = {
        "city": CITY,
        "product": "city_property",
        "protocol": "json_api",
        "endpoint": portals.url("/files/kr.json"),
        "expand": {"month": ["{year}01", "{year}02"]},
        "paging": {"records_path": "response.body.items.item"},
        "fields": {"value": "p", "lon": "lon", "lat": "lat"},
        "spatial_form": "point",
        "coverage": portals.url("/files/boston_coverage.geojson"),
        "unit": "USD",
        "currency": "USD",
        "years": [2020],
    }
    source = adapters(tmp_path, portals, write_specs(tmp_path / "s.yaml", spec))
    # The static file answers both months; swap in a two-row page after the first request.
    original = portals._answer

    def answer(path: str, query: dict[str, str]) -> tuple[int, Any]:
        if query.get("month") == "202002":
            return 200, two
        return original(path, query)

    portals._answer = answer  # type: ignore[method-assign]
    item = source["city_property"].fetch(CITY, 2020, tmp_path / "sources")
    assert [p.query["month"] for p in portals.requests("/files/kr.json")] == ["202001", "202002"]
    assert item.extra["records"] == "3"
    tiles = tile_values(place_records(item, EPSG, 2020), GRID, total=False)
    assert tiles.value[6 * GRID.n_cols + 6] == pytest.approx((10 + 30 + 30) / 3)
