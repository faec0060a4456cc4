"""End to end from loopback portals: one `citycube build` of Boston, London and Sydney in 2020
takes PROP and ELEC from the ``records`` family, the CPI and PPP series from the World Bank API
v2, and everything else from the sample:

- Boston: PROP from an ArcGIS REST layer (parcels, one row a page), ELEC from a Socrata
  resource (buildings as points);
- London: PROP from a UK Price Paid yearly CSV (``bulk_csv``: no header, cut to Greater London
  by county, each sale at its ONSPD postcode centroid), ELEC from a DESNZ-style workbook
  (``bulk_xlsx``: the year's sheet, LSOA totals apportioned to tiles by area);
- Sydney: PROP from the NSW Valuer General's yearly archives (``nsw_psi_dat``: ``.DAT`` files in
  weekly zips, and a sale lodged the year after its contract read from the next archive); its
  ELEC entry declares 2019 and 2021 only.

London's and Sydney's entries are the packaged ones (``schemas/record_products.yaml``) with
every URL and lookup file served from the loopback server under its declared name and their
years cut to what is served, so the declared layouts themselves go through the build. One
city-year each keeps the build to three partition runs (and the cube's).

The observations equal hand computations from where each record was put: PROP the mean of a
tile's sales or an area-weighted mean of parcel values, converted to 2017 PPP dollars with the
served CPI and PPP, and the median of its 500 m cell medians in local currency; ELEC the kWh
apportioned to a tile over its nominal area. Tiles outside the declared coverage are NULL with
``outside_source_coverage``; Sydney's ELEC in 2020, a year its entry lacks, is NULL with
``source_year_missing`` and is never asked for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
import shapely
import yaml

from sources.records.spec import load_record_products
from tests.e2e_builds import run_build, write_source_set
from tests.glc_globfp_fixtures import zip_of
from tests.record_files import CityTiles, b_record, dat_file, workbook_bytes
from tests.record_portals import Layer, RecordPortals, esri_polygon, wb_rows

pytestmark = pytest.mark.e2e(builds=1)

BOSTON, LONDON, SYDNEY = CityTiles("Boston"), CityTiles("London"), CityTiles("Sydney")
ASSETS = "sources/city_property,sources/city_electricity,derived/prop,derived/elec,"
ASSETS += "modalities/prop,modalities/elec,cube"
CPI = {
    "USA": {2017: 245.12, 2020: 258.81},
    "GBR": {2017: 103.6, 2020: 108.7},
    "AUS": {2017: 111.4, 2020: 116.2},
}
PPP_2017 = {"USA": 1.0, "GBR": 0.70, "AUS": 1.45}
"""Local currency units per international dollar."""
ARCGIS = "/arcgis/rest/services/Assessing/Parcels/FeatureServer/0"
SODA = "/resource/bench-2020.json"
KWH = "electricity_kwh_km2"
LOCAL_MEAN, LOCAL_MEDIAN, PPP_MEAN = (
    "property_mean_local",
    "property_median_local",
    "property_mean_2017ppp",
)


def in_2017_ppp(value: float, iso3: str) -> float:
    """A 2020 local value in 2017 PPP international dollars, by hand."""
    return value * CPI[iso3][2017] / CPI[iso3][2020] / PPP_2017[iso3]


def on_loopback(
    portals: RecordPortals, product: str, city: str, years: list[int]
) -> dict[str, Any]:
    """The packaged entry of a product and city with its endpoint, join tables and coverage
    served as ``/files/<the declared file name>``, declaring ``years`` only."""
    entry = load_record_products()[(product, city)].model_dump(mode="json", exclude_none=True)

    def moved(href: str) -> str:
        return portals.url("/files/" + href.rsplit("/", 1)[-1])

    entry["endpoint"] = moved(entry["endpoint"])
    for table in ("points_table", "units_table"):
        if table in entry:
            entry[table] = {**entry[table], "href": moved(entry[table]["href"])}
    if "coverage" in entry:
        entry["coverage"] = moved(entry["coverage"])
    return {**entry, "years": years}


# ------------------------------------------------------------------ Boston: ArcGIS, Socrata


def serve_boston(portals: RecordPortals) -> None:
    """Parcels and buildings in tile r5c5; coverage = tiles r4-r6 x c4-c6."""
    x, y, _, _ = BOSTON.box(5, 5)

    def ring(*corners: tuple[float, float]) -> list[tuple[float, float]]:
        return [BOSTON.lonlat(x + east, y + north) for east, north in corners]

    parcels = [
        (ring((300, 300), (500, 300), (500, 500), (300, 500)), 400_000),
        (ring((900, 900), (1100, 900), (1100, 1000), (900, 1000)), 600_000),
    ]
    features = [
        {
            "attributes": {"OBJECTID": i + 1, "FISCAL_YEAR": 2020, "TOTAL_VALUE": value},
            "geometry": esri_polygon(corners),
        }
        for i, (corners, value) in enumerate(parcels)
    ]
    portals.layers["Assessing/Parcels"] = Layer(features, max_record_count=1)
    buildings = [(500, 500, "1000000"), (1500, 1500, "3000000")]
    portals.soda["bench-2020"] = [
        {
            ":id": f"b{i}",
            "calendar_year": "2020",
            "electricity_kwh": kwh,
            "latitude": str(BOSTON.lonlat(x + east, y + north)[1]),
            "longitude": str(BOSTON.lonlat(x + east, y + north)[0]),
        }
        for i, (east, north, kwh) in enumerate(buildings)
    ]
    portals.files["coverage.geojson"] = BOSTON.block_geojson(range(4, 7), range(4, 7))


def boston_specs(portals: RecordPortals) -> list[dict[str, Any]]:
    common = {"licence": "test licence", "attribution": "loopback", "portal": "loopback"}
    coverage = portals.url("/files/coverage.geojson")
    return [
        {
            **common,
            "city": "Boston",
            "product": "city_property",
            "protocol": "arcgis",
            "endpoint": portals.url(ARCGIS),
            "year_filter": "FISCAL_YEAR = {year}",
            "fields": {"value": "TOTAL_VALUE", "year": "FISCAL_YEAR"},
            "spatial_form": "parcel",
            "coverage": coverage,
            "unit": "USD",
            "currency": "USD",
            "years": [2019, 2020],
        },
        {
            **common,
            "city": "Boston",
            "product": "city_electricity",
            "protocol": "socrata",
            "endpoint": portals.url(SODA),
            "year_filter": "calendar_year = '{year}'",
            "fields": {
                "value": "electricity_kwh",
                "year": "calendar_year",
                "lon": "longitude",
                "lat": "latitude",
            },
            "spatial_form": "point",
            "coverage": coverage,
            "unit": "kWh/year",
            "years": [2020],
        },
    ]


# ------------------------------------------------------- London: Price Paid CSV, DESNZ xlsx


LONDON_POSTCODES = {
    "SW1A 1AA": (11, 15, 700.0, 700.0),
    "SW1A 2AA": (11, 15, 1300.0, 1300.0),  # the same tile, another 500 m cell
    "EC1A 1BB": (11, 16, 800.0, 300.0),
    "GU1 1AA": (11, 15, 700.0, 700.0),  # in Surrey: its sales are cut by the county filter
    "N1 9GU": (0, 0, 1000.0, 1000.0),  # outside the declared coverage
}
"""ONSPD centroids: postcode -> (tile row, column, metres east and north of its south-west
corner). ZZ99 9ZZ is in no table."""
LONDON_SALES = (
    ("SW1A 1AA", 500_000, "GREATER LONDON"),
    ("SW1A 1AA", 700_000, "GREATER LONDON"),
    ("SW1A 2AA", 1_100_000, "GREATER LONDON"),
    ("EC1A 1BB", 450_000, "GREATER LONDON"),
    ("GU1 1AA", 10_000_000, "SURREY"),
    ("N1 9GU", 900_000, "GREATER LONDON"),
    ("ZZ99 9ZZ", 300_000, "GREATER LONDON"),
)
"""(postcode, price, county) of the 2020 sales."""


def price_paid_csv(sales: tuple[tuple[str, int, str], ...]) -> bytes:
    """A UK Price Paid yearly file: no header, 16 quoted fields a row (transaction id, price,
    date of transfer, postcode, type, new build, tenure, PAON, SAON, street, locality, town,
    district, county, category, record status)."""
    lines = []
    for i, (postcode, price, county) in enumerate(sales):
        town = "LONDON" if county == "GREATER LONDON" else "GUILDFORD"
        fields = [f"{{{i:08X}-0000-0000-0000-000000000000}}", str(price)]
        fields += [f"2020-{i + 1:02d}-15 00:00", postcode, "F", "N", "L", str(i + 1), ""]
        fields += ["HIGH STREET", "", town, town, county, "A", "A"]
        lines.append(",".join(f'"{field}"' for field in fields))
    return ("\r\n".join(lines) + "\r\n").encode()


def serve_london(portals: RecordPortals) -> None:
    """Sales in tiles r11c15 and r11c16 of coverage r10-r12 x c14-c16; LSOAs on r11c15 and
    across r12c15 (three quarters of it) and r12c16 (a quarter)."""
    portals.files["pp-2020.csv"] = price_paid_csv(LONDON_SALES)
    onspd = "pcd,pcds,lat,long\n" + "".join(
        f"{code.replace(' ', '')},{code},{lat},{lon}\n"
        for code, (row, col, east, north) in LONDON_POSTCODES.items()
        for lon, lat in [LONDON.point_lonlat(row, col, east, north)]
    )
    portals.files["ONSPD.csv"] = onspd.encode()
    portals.files["greater_london_boundary.geojson"] = LONDON.block_geojson(
        range(10, 13), range(14, 17)
    )
    rows_2019 = [["E09000033", "E01000001", 900, 9_000_000.0, 10_000.0]]
    rows_2020 = [
        ["E09000033", "E01000001", 1000, 4_000_000.0, 4000.0],
        ["E09000033", "E01000002", 500, 2_000_000.0, 4000.0],
        ["E09000033", "E01000099", 100, 500_000.0, 5000.0],  # no boundary: unmatched
    ]
    portals.files["LSOA_domestic_elec_2010-2024.xlsx"] = workbook_bytes(
        {"2019": (5, rows_2019), "2020": (7, rows_2020)}
    )
    x0, y0, _, _ = LONDON.box(12, 15)
    units = {
        "E01000001": shapely.box(*LONDON.box(11, 15)),
        "E01000002": shapely.box(x0 + 500, y0, x0 + 2500, y0 + 2000),
    }
    portals.files["LSOA_2021_London.geojson"] = LONDON.polygons_geojson(units, "LSOA21CD")


# ------------------------------------------------------------------ Sydney: NSW PSI archives


SYDNEY_POSTCODES = {"2000": (6, 6), "2010": (6, 7)}
"""Postcode -> the tile holding its centroid (700 m east and north of the south-west corner);
coverage is r5-r7 x c5-c7."""


def serve_sydney(portals: RecordPortals) -> None:
    """2020.zip holds a weekly zip of sales lodged in 2020; 2021.zip a sale of 2020 lodged in
    2021 and a sale of 2021."""
    week = dat_file(
        "20200106",
        b_record(100, 1, "20200106", "2000", "20200102", "1000000"),
        b_record(101, 2, "20200106", "2000", "20200303", "1400000"),
        b_record(102, 3, "20200106", "2010", "20200404", "800000"),
        b_record(103, 4, "20200106", "2010", "20200505", "0"),  # $0: not a market sale
    )
    portals.files["2020.zip"] = zip_of(
        {"20200106.zip": zip_of({"001_SALES_DATA_NNME_06012020.DAT": week})}
    )
    portals.files["2021.zip"] = zip_of(
        {
            "2021/001_SALES_DATA_NNME_04012021.DAT": dat_file(
                "20210104",
                b_record(107, 1, "20210104", "2010", "20201215", "900000"),
                b_record(108, 2, "20210104", "2000", "20210301", "9000000"),
            )
        }
    )
    table = "postcode,locality,long,lat\n" + "".join(
        f"{code},SYDNEY,{lon},{lat}\n"
        for code, (row, col) in SYDNEY_POSTCODES.items()
        for lon, lat in [SYDNEY.point_lonlat(row, col, 700.0, 700.0)]
    )
    portals.files["australian_postcodes.csv"] = table.encode()
    portals.files["nsw_state_boundary.geojson"] = SYDNEY.block_geojson(range(5, 8), range(5, 8))


# ------------------------------------------------------------------------------ the build


@pytest.fixture(scope="module")
def portals() -> Iterator[RecordPortals]:
    with RecordPortals() as running:
        serve_boston(running)
        serve_london(running)
        serve_sydney(running)
        running.worldbank["FP.CPI.TOTL"] = wb_rows("FP.CPI.TOTL", CPI)
        ppp = {iso3: {2017: value} for iso3, value in PPP_2017.items()}
        running.worldbank["PA.NUS.PPP"] = wb_rows("PA.NUS.PPP", ppp)
        yield running


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, portals: RecordPortals) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e_records")
    specs = [
        *boston_specs(portals),
        on_loopback(portals, "city_property", "London", [2020]),
        on_loopback(portals, "city_electricity", "London", [2020]),
        on_loopback(portals, "city_property", "Sydney", [2020]),
        on_loopback(portals, "city_electricity", "Sydney", [2019, 2021]),
    ]
    spec_file = root / "record_products.yaml"
    spec_file.write_text(yaml.safe_dump({"records": specs}), encoding="utf-8")
    source_set = {
        "name": "records-loopback",
        "default": "sample",
        "products": {
            "city_property": "records",
            "city_electricity": "records",
            "worldbank_indicators": "records",
        },
        "options": {
            "sample": {"seed": 0},
            "records": {
                "spec_file": str(spec_file),
                "cache_dir": str(root / "downloads"),
                "worldbank_api": portals.url("/wb/v2"),
                "attempts": 2,
                "wait_initial_s": 0.01,
                "wait_max_s": 0.05,
                "timeout_s": 10.0,
            },
        },
    }
    write_source_set(root, source_set)
    done = run_build(root, "records-e2e", "Boston,London,Sydney", "2020", ASSETS)
    assert done.returncode == 0, done.stdout + done.stderr
    release = root / "data" / "releases" / "records-e2e"
    return {"release": release, "database": release / "cube.duckdb"}


def observations(
    database: Path, city: str, modality: str, year: int
) -> dict[tuple[str, str], tuple]:
    """(tile, field) -> (value, valid_fraction, available, reason, source_id, synthetic,
    temporal_basis, source_year, unit)."""
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, field, value, valid_fraction, available, reason, source_id, "
            "synthetic, temporal_basis, source_year, unit FROM observations "
            "WHERE city = ? AND modality = ? AND year = ?",
            [city, modality, year],
        ).fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}


def ingest_counts(release: Path, modality: str, city: str, product: str) -> dict[str, Any]:
    """What the derived results of 2020 say their records item gave (rows, unmatched, used)."""
    derived = release / ".draft" / "derived" / modality / city / "2020.parquet"
    metadata = pq.read_schema(derived).metadata
    return json.loads(metadata[b"citycube:records"])[product]


def available(source_year: int, unit: str) -> tuple:
    """The provenance columns of an available PROP tile."""
    return (True, None, "records:city_property", False, "city_record", source_year, unit)


# ---------------------------------------------------------------------------------- Boston


def test_property_from_arcgis_equals_the_hand_computation(build: dict[str, Any]) -> None:
    prop = observations(build["database"], "Boston", "PROP", 2020)
    assert len(prop) == 3 * (169 + 16)  # three fields on 169 2 km and 16 5 km tiles
    local = prop[(BOSTON.tile_id(5, 5), LOCAL_MEAN)]
    mean = (400_000 * 200 * 200 + 600_000 * 200 * 100) / (200 * 200 + 200 * 100)
    assert local[0] == pytest.approx(mean, rel=1e-4)
    assert local[2:] == available(2020, "USD (nominal, 2020)")
    # the two parcels' representative points lie in different 500 m cells: median of 4e5, 6e5
    median = prop[(BOSTON.tile_id(5, 5), LOCAL_MEDIAN)]
    assert median[0] == pytest.approx(500_000.0) and median[2:] == local[2:]
    ppp = prop[(BOSTON.tile_id(5, 5), PPP_MEAN)]
    assert ppp[0] == pytest.approx(in_2017_ppp(mean, "USA"), rel=1e-4)
    assert prop[(BOSTON.tile_id(4, 4), LOCAL_MEAN)][3] == "no_valid_support"
    far = prop[(BOSTON.tile_id(0, 0), LOCAL_MEAN)]
    assert far[0] is None and far[3] == "outside_source_coverage"


def test_electricity_from_socrata_is_kwh_per_nominal_km2(build: dict[str, Any]) -> None:
    elec = observations(build["database"], "Boston", "ELEC", 2020)
    tile = elec[(BOSTON.tile_id(5, 5), KWH)]
    assert tile[0] == pytest.approx(4e6 / 4.0) and tile[2] is True
    assert tile[4:6] == ("records:city_electricity", False)
    assert elec[(BOSTON.tile_id(0, 0), KWH)][3] == "outside_source_coverage"


# ---------------------------------------------------------------------------------- London


def test_london_sales_from_price_paid_are_means_at_their_postcode_centroids(
    build: dict[str, Any],
) -> None:
    prop = observations(build["database"], "London", "PROP", 2020)
    assert len(prop) == 3 * (24 * 30 + 9 * 11)
    # r11c15: SW1A 1AA's two sales and SW1A 2AA's one (Surrey's sale there is cut by county)
    local = prop[(LONDON.tile_id(11, 15), LOCAL_MEAN)]
    assert local[0] == pytest.approx((500_000 + 700_000 + 1_100_000) / 3)
    assert local[1] == pytest.approx(1.0, abs=1e-4)
    assert local[2:] == available(2020, "GBP (nominal, 2020)")
    # two 500 m cells: SW1A 1AA's (median 600,000) and SW1A 2AA's (1,100,000)
    median = prop[(LONDON.tile_id(11, 15), LOCAL_MEDIAN)]
    assert median[0] == pytest.approx((600_000 + 1_100_000) / 2) and median[2:] == local[2:]
    ppp = prop[(LONDON.tile_id(11, 15), PPP_MEAN)]
    assert ppp[0] == pytest.approx(in_2017_ppp((500_000 + 700_000 + 1_100_000) / 3, "GBR"))
    assert prop[(LONDON.tile_id(11, 16), LOCAL_MEAN)][0] == pytest.approx(450_000)
    assert prop[(LONDON.tile_id(10, 14), LOCAL_MEAN)][3] == "no_valid_support"
    far = prop[(LONDON.tile_id(0, 0), LOCAL_MEAN)]  # N1 9GU's sale lies there, outside
    assert far[0] is None and far[3] == "outside_source_coverage"
    counts = ingest_counts(build["release"], "PROP", "London", "city_property")
    assert counts["rows"] == 6  # seven sales, one in Surrey
    assert counts["unmatched"] == 1 and counts["unmatched_examples"] == ["ZZ999ZZ"]
    assert counts["used"] == 5


def test_london_electricity_is_the_xlsx_sheet_of_the_year_apportioned_by_area(
    build: dict[str, Any],
) -> None:
    elec = observations(build["database"], "London", "ELEC", 2020)
    whole = elec[(LONDON.tile_id(11, 15), KWH)]  # E01000001 is the tile (2019's sheet: 9e6)
    assert whole[0] == pytest.approx(4_000_000 / 4.0, rel=1e-4) and whole[2] is True
    assert whole[4:6] == ("records:city_electricity", False)
    most = elec[(LONDON.tile_id(12, 15), KWH)]  # three quarters of E01000002
    assert most[0] == pytest.approx(2_000_000 * 0.75 / 4.0, rel=1e-4)
    assert most[1] == pytest.approx(0.75, abs=1e-4)
    rest = elec[(LONDON.tile_id(12, 16), KWH)]  # its last quarter: below the 50 % support
    assert rest[0] is None and rest[3] == "insufficient_valid_support"
    assert rest[1] == pytest.approx(0.25, abs=1e-4)
    far = elec[(LONDON.tile_id(0, 0), KWH)]
    assert far[0] is None and far[3] == "outside_source_coverage"
    counts = ingest_counts(build["release"], "ELEC", "London", "city_electricity")
    assert counts["unmatched"] == 1 and counts["unmatched_examples"] == ["E01000099"]
    assert counts["unusable"] == 1 and counts["used"] == 2  # the footnote has no value


# ---------------------------------------------------------------------------------- Sydney


def test_sydney_sales_from_the_nsw_archives_include_those_lodged_the_next_year(
    build: dict[str, Any],
) -> None:
    prop = observations(build["database"], "Sydney", "PROP", 2020)
    assert len(prop) == 3 * (13 * 13 + 5 * 4)
    # 2000: two contracts of 2020 (the 2021 contract in the next archive is not one)
    city = prop[(SYDNEY.tile_id(6, 6), LOCAL_MEAN)]
    assert city[0] == pytest.approx((1_000_000 + 1_400_000) / 2)
    assert city[2:] == available(2020, "AUD (nominal, 2020)")
    # 2010: lodged in 2020, and in 2021 for a December contract; the $0 transfer left out
    later = prop[(SYDNEY.tile_id(6, 7), LOCAL_MEAN)]
    assert later[0] == pytest.approx((800_000 + 900_000) / 2)
    assert prop[(SYDNEY.tile_id(6, 7), LOCAL_MEDIAN)][0] == pytest.approx(850_000)
    ppp = prop[(SYDNEY.tile_id(6, 7), PPP_MEAN)]
    assert ppp[0] == pytest.approx(in_2017_ppp((800_000 + 900_000) / 2, "AUS"))
    assert prop[(SYDNEY.tile_id(5, 5), LOCAL_MEAN)][3] == "no_valid_support"
    far = prop[(SYDNEY.tile_id(0, 0), LOCAL_MEAN)]
    assert far[0] is None and far[3] == "outside_source_coverage"
    counts = ingest_counts(build["release"], "PROP", "Sydney", "city_property")
    assert counts["rows"] == 5 and counts["unusable"] == 1 and counts["used"] == 4


# -------------------------------------------------------------------------------- together


def test_a_year_the_source_lacks_is_null_and_never_asked_for(
    build: dict[str, Any], portals: RecordPortals
) -> None:
    elec = observations(build["database"], "Sydney", "ELEC", 2020)
    assert elec and {(r[0], r[3]) for r in elec.values()} == {(None, "source_year_missing")}
    asked = {s.query.get("where", s.query.get("$where")) for s in portals.seen} - {None}
    assert asked == {"FISCAL_YEAR = 2020", "calendar_year = '2020'"}
    # Every served file, and nothing else: no Ausgrid file, no archive after 2021.zip.
    files = {s.path for s in portals.seen if s.path.startswith("/files/")}
    assert files == {f"/files/{name}" for name in portals.files}


def test_release_names_the_record_portals(build: dict[str, Any]) -> None:
    meta = json.loads((build["release"] / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "records-loopback"
    assert meta["sources"]["city_property"]["source_id"] == "records:city_property"
    assert meta["sources"]["worldbank_indicators"]["synthetic"] is False
