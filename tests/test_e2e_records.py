"""End to end from loopback portals: `citycube build` takes PROP from an ArcGIS REST layer,
ELEC from a Socrata resource and the CPI/PPP series from the World Bank API v2 (the
``records`` family), everything else from the sample, for Boston in 2020 and 2021.

The observations equal hand computations over the served records: PROP an area-weighted
mean of parcel values converted to 2017 PPP dollars with the served CPI and PPP (and the
median of its 500 m cell medians in local currency), ELEC the
tile's kWh over its nominal area; tiles outside the declared coverage are NULL with
``outside_source_coverage``; 2021, which neither portal declares, is NULL with
``source_year_missing`` and is never asked for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from tests.e2e_builds import run_build, write_source_set
from tests.record_portals import Layer, RecordPortals, esri_polygon
from tests.test_record_sources import (
    CITY,
    GRID,
    coverage_geojson,
    lonlat,
    square_lonlat,
    tile_origin,
    wb_rows,
)

pytestmark = pytest.mark.e2e

ASSETS = "sources/city_property,sources/city_electricity,derived/prop,derived/elec,"
ASSETS += "modalities/prop,modalities/elec,cube"
CPI_2017, CPI_2020 = 245.12, 258.81
ARCGIS = "/arcgis/rest/services/Assessing/Parcels/FeatureServer/0"
SODA = "/resource/bench-2020.json"


def serve(portals: RecordPortals) -> None:
    """Parcels and buildings in tile r5c5; coverage = tiles r4-r6 x c4-c6."""
    x, y = tile_origin(5, 5)
    parcels = [
        (square_lonlat(x + 300, y + 300, 200), 400_000),
        ([lonlat(*p) for p in ((x + 900, y + 900), (x + 1100, y + 900), (x + 1100, y + 1000),
                               (x + 900, y + 1000))], 600_000),
    ]  # fmt: skip
    features = [
        {
            "attributes": {"OBJECTID": i + 1, "FISCAL_YEAR": 2020, "TOTAL_VALUE": value},
            "geometry": esri_polygon(ring),
        }
        for i, (ring, value) in enumerate(parcels)
    ]
    portals.layers["Assessing/Parcels"] = Layer(features, max_record_count=1)
    buildings = [(x + 500, y + 500, "1000000"), (x + 1500, y + 1500, "3000000")]
    portals.soda["bench-2020"] = [
        {
            ":id": f"b{i}",
            "calendar_year": "2020",
            "electricity_kwh": kwh,
            "latitude": str(lonlat(bx, by)[1]),
            "longitude": str(lonlat(bx, by)[0]),
        }
        for i, (bx, by, kwh) in enumerate(buildings)
    ]
    portals.files["coverage.geojson"] = coverage_geojson(range(4, 7), range(4, 7))
    portals.worldbank["FP.CPI.TOTL"] = wb_rows(
        "FP.CPI.TOTL", {"USA": {2017: CPI_2017, 2020: CPI_2020, 2021: 271.0}}
    )
    portals.worldbank["PA.NUS.PPP"] = wb_rows("PA.NUS.PPP", {"USA": {2017: 1.0, 2020: 1.0}})


def specs(portals: RecordPortals) -> list[dict[str, Any]]:
    common = {"licence": "test licence", "attribution": "loopback", "portal": "loopback"}
    coverage = portals.url("/files/coverage.geojson")
    return [
        {
            **common,
            "city": CITY,
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
            "city": CITY,
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


@pytest.fixture(scope="module")
def portals() -> Iterator[RecordPortals]:
    with RecordPortals() as running:
        serve(running)
        yield running


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, portals: RecordPortals) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e_records")
    spec_file = root / "record_products.yaml"
    spec_file.write_text(yaml.safe_dump({"records": specs(portals)}), encoding="utf-8")
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
    done = run_build(root, "records-e2e", CITY, "2020,2021", ASSETS)
    assert done.returncode == 0, done.stdout + done.stderr
    release = root / "data" / "releases" / "records-e2e"
    return {"release": release, "database": release / "cube.duckdb"}


def observations(database: Path, modality: str, year: int) -> dict[tuple[str, str], tuple]:
    with duckdb.connect(str(database), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, field, value, valid_fraction, available, reason, source_id, "
            "synthetic, temporal_basis, source_year, unit FROM observations "
            "WHERE city = ? AND modality = ? AND year = ?",
            [CITY, modality, year],
        ).fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}


def tile_id(row: int, col: int) -> str:
    return next(t.tile_id for t in GRID.tiles() if (t.row, t.col) == (row, col))


def test_property_from_arcgis_equals_the_hand_computation(build: dict[str, Any]) -> None:
    prop = observations(build["database"], "PROP", 2020)
    assert len(prop) == 3 * (169 + 16)  # three fields on 169 2 km and 16 5 km tiles
    local = prop[(tile_id(5, 5), "property_mean_local")]
    mean = (400_000 * 200 * 200 + 600_000 * 200 * 100) / (200 * 200 + 200 * 100)
    assert local[0] == pytest.approx(mean, rel=1e-4)
    assert local[2:] == (
        True,
        None,
        "records:city_property",
        False,
        "city_record",
        2020,
        "USD (nominal, 2020)",
    )
    # the two parcels' representative points lie in different 500 m cells: median of 4e5, 6e5
    median = prop[(tile_id(5, 5), "property_median_local")]
    assert median[0] == pytest.approx(500_000.0) and median[2:] == local[2:]
    ppp = prop[(tile_id(5, 5), "property_mean_2017ppp")]
    assert ppp[0] == pytest.approx(mean * CPI_2017 / CPI_2020 / 1.0, rel=1e-4)
    assert prop[(tile_id(4, 4), "property_mean_local")][3] == "no_valid_support"
    far = prop[(tile_id(0, 0), "property_mean_local")]
    assert far[0] is None and far[3] == "outside_source_coverage"


def test_electricity_from_socrata_is_kwh_per_nominal_km2(build: dict[str, Any]) -> None:
    elec = observations(build["database"], "ELEC", 2020)
    tile = elec[(tile_id(5, 5), "electricity_kwh_km2")]
    assert tile[0] == pytest.approx(4e6 / 4.0) and tile[2] is True
    assert tile[4:6] == ("records:city_electricity", False)
    assert elec[(tile_id(0, 0), "electricity_kwh_km2")][3] == "outside_source_coverage"


def test_an_undeclared_year_is_null_and_never_asked_for(
    build: dict[str, Any], portals: RecordPortals
) -> None:
    for modality in ("PROP", "ELEC"):
        rows = observations(build["database"], modality, 2021)
        assert rows and {(r[0], r[3]) for r in rows.values()} == {(None, "source_year_missing")}
    asked = [s.query.get("where", s.query.get("$where", "")) for s in portals.seen]
    assert not any("2021" in w for w in asked)


def test_release_names_the_record_portals(build: dict[str, Any]) -> None:
    meta = json.loads((build["release"] / "release.json").read_text(encoding="utf-8"))
    assert meta["source_set"] == "records-loopback"
    assert meta["sources"]["city_property"]["source_id"] == "records:city_property"
    assert meta["sources"]["worldbank_indicators"]["synthetic"] is False
