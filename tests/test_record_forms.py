"""The core's rules per spatial form of city records, against hand-computed tiles.

Records items are written by hand in the normalised form every connector writes, then
processed through ``process_partition`` (ELEC sums, PROP means with the 2017 PPP conversion)
or straight through ``citycube.processing.records`` on a 2 × 2 grid of Boston 2 km tiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely
from pyproj import Transformer

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceReadError
from citycube.grid.tiles import TileGrid, city_grid
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct, SourceSet
from citycube.processing.compute import derive, process_partition
from citycube.processing.records import place_records, tile_cell_medians, tile_values
from sources.records.base import RECORDS_SCHEMA

CITY, EPSG = "Boston", 32619
CAT = load_catalogue()
TO_WGS84 = Transformer.from_crs(EPSG, 4326, always_xy=True)
BOSTON = city_grid(CITY, "2km")
X0, Y1 = BOSTON.x_min, BOSTON.y_max
SMALL = TileGrid(CITY, "2km", EPSG, X0, Y1, 2000, 2, 2)  # rows 0-1, cols 0-1 of Boston's grid
"""A 2 × 2 grid at Boston's north-west corner: tile r1c0 spans (X0, Y1-4000)-(X0+2000, Y1-2000)."""


def utm_to_wgs84(geometry: shapely.Geometry) -> shapely.Geometry:
    dense = shapely.segmentize(geometry, 20.0)
    return shapely.transform(dense, lambda xy: np.column_stack(TO_WGS84.transform(*xy.T)))


def write_item(
    folder: Path,
    form: str,
    rows: list[dict[str, Any]],
    year: int = 2020,
    product: str = "city_electricity",
    tables: dict[str, gpd.GeoDataFrame | pd.DataFrame] | None = None,
    extra: dict[str, str] | None = None,
) -> SourceItem:
    """A records item as the connectors write it; ``rows`` hold value and one location."""
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        {
            "year": [r.get("year", year) for r in rows],
            "value": [r.get("value") for r in rows],
            "geometry": [
                shapely.to_wkb(utm_to_wgs84(r["geometry"])) if "geometry" in r else None
                for r in rows
            ],
            "postcode": [r.get("postcode") for r in rows],
            "unit_id": [r.get("unit_id") for r in rows],
        }
    )
    import pyarrow as pa

    pq.write_table(pa.Table.from_pandas(frame, schema=RECORDS_SCHEMA), folder / "records.parquet")
    files: dict[str, Path] = {"data": folder / "records.parquet"}
    for role, table in (tables or {}).items():
        if isinstance(table, gpd.GeoDataFrame):
            path = folder / f"{role}.geojson"
            table.to_file(path)
        else:
            path = folder / f"{role}.parquet"
            table.to_parquet(path)
        files[role] = path
    values = frame["value"].to_numpy(float)
    blank = int((~np.isfinite(values)).sum())
    return SourceItem(
        product=product,
        city=CITY,
        source_year=year,
        files=files,
        source_id=f"test:{product}",
        version="t1",
        synthetic=False,
        extra={
            "spatial_form": form,
            "records": str(len(frame)),
            "blank_values": str(blank),
            **(extra or {}),
        },
    )


def units_frame(units: dict[str, shapely.Geometry]) -> gpd.GeoDataFrame:
    return gpd.GeoDataFrame(
        {"key": list(units)}, geometry=[utm_to_wgs84(g) for g in units.values()], crs=4326
    )


# Units on the small grid (UTM): U1 = 3 km x 2 km over r1c0 and half of r1c1; U2 = 1 km² inside
# r1c1; U3 = the whole top row, without any record.
U1 = shapely.box(X0, Y1 - 4000, X0 + 3000, Y1 - 2000)
U2 = shapely.box(X0 + 3000, Y1 - 4000, X0 + 4000, Y1 - 3000)
U3 = shapely.box(X0, Y1 - 2000, X0 + 4000, Y1)
UNITS = units_frame({"U1": U1, "U2": U2, "U3": U3})


def test_admin_units_are_apportioned_by_area_share_sums(tmp_path: Path) -> None:
    rows = [
        {"unit_id": "u1", "value": 3000.0},
        {"unit_id": "U 1", "value": 3000.0},  # keys compared without case or blanks
        {"unit_id": "U2", "value": 800.0},
        {"unit_id": "U9", "value": 5.0},  # no such unit: unmatched, counted
    ]
    item = write_item(tmp_path, "admin_unit", rows, tables={"units": UNITS})
    placed = place_records(item, EPSG, 2020)
    assert placed.ingest.unmatched == 1 and placed.ingest.used == 3
    tiles = tile_values(placed, SMALL, total=True)
    r0c0, r0c1, r1c0, r1c1 = range(4)
    # U1 (6000 kWh over 6 km²): 4/6 to r1c0, 2/6 to r1c1; U2's 800 kWh all in r1c1.
    assert tiles.value[r1c0] == pytest.approx(6000 * 4 / 6 / 4.0, rel=1e-5)
    assert tiles.value[r1c1] == pytest.approx((6000 * 2 / 6 + 800) / 4.0, rel=1e-5)
    assert tiles.support[r1c0] == pytest.approx(1.0, abs=1e-5)
    assert tiles.support[r1c1] == pytest.approx(0.75, abs=1e-5)
    # U3 reports nothing: covered, but without support (unavailable, never zero).
    assert tiles.covered[r0c0] == pytest.approx(1.0, abs=1e-5)
    assert tiles.support[r0c0] == 0.0 and np.isnan(tiles.value[r0c0])
    assert np.isnan(tiles.value[r0c1])


def test_admin_units_means_are_weighted_by_apportioned_area(tmp_path: Path) -> None:
    rows = [
        {"unit_id": "U1", "value": 100.0},
        {"unit_id": "U1", "value": 300.0},
        {"unit_id": "U2", "value": 500.0},
    ]
    item = write_item(tmp_path, "admin_unit", rows, tables={"units": UNITS})
    tiles = tile_values(place_records(item, EPSG, 2020), SMALL, total=False)
    assert tiles.value[2] == pytest.approx(200.0, rel=1e-6)
    assert tiles.value[3] == pytest.approx((200.0 * 2 + 500.0 * 1) / 3, rel=1e-5)


def test_admin_units_give_their_median_to_the_cells_whose_centre_they_cover(
    tmp_path: Path,
) -> None:
    """U1's records 100, 300, 900 → 300; U2's 500; U3 has none. Tile r1c1's 500 m cells: 8
    centres in U1, 4 in U2 and 4 in no unit with records → median of 300 × 8, 500 × 4 = 300
    (the area-weighted mean of unit means is (433.3 · 2 + 500) / 3)."""
    rows = [
        {"unit_id": "U1", "value": 100.0},
        {"unit_id": "U1", "value": 300.0},
        {"unit_id": "U1", "value": 900.0},
        {"unit_id": "U2", "value": 500.0},
    ]
    item = write_item(tmp_path, "admin_unit", rows, tables={"units": UNITS})
    placed = place_records(item, EPSG, 2020)
    medians = tile_cell_medians(placed, SMALL, 500)
    r0c0, r0c1, r1c0, r1c1 = range(4)
    assert medians[r1c0] == pytest.approx(300.0)
    assert medians[r1c1] == pytest.approx(300.0)
    assert np.isnan(medians[r0c0]) and np.isnan(medians[r0c1])
    # 1 km cells: r1c1 holds 2 × 2 cells, centres at +500 m: U1 gives 300 to the west column,
    # U2 500 to the south-east cell, the north-east one has none → median(300, 300, 500).
    assert tile_cell_medians(placed, SMALL, 1000)[r1c1] == pytest.approx(300.0)
    means = tile_values(placed, SMALL, total=False)
    assert means.value[r1c1] == pytest.approx((1300 / 3 * 2 + 500) / 3, rel=1e-5)
    # cells must nest in the tiles: 4 km cells are refused on a 2 km grid
    with pytest.raises(ValueError, match="do not divide"):
        tile_cell_medians(placed, SMALL, 4000)


def test_parcels_go_to_the_cell_of_their_representative_point(tmp_path: Path) -> None:
    """Two parcels share tile r1c0's north-west 500 m cell (100 and 300 → 200), an L-shaped one
    (whose centroid lies outside it) sits in the south-east cell (1000): median(200, 1000) =
    600, where the area-weighted mean is another number."""
    x0, y1 = X0, Y1 - 2000  # tile r1c0's north-west corner
    first = shapely.box(x0 + 50, y1 - 200, x0 + 200, y1 - 50)
    second = shapely.box(x0 + 250, y1 - 450, x0 + 450, y1 - 250)
    ell = shapely.Polygon(
        [
            (x0 + 1510, y1 - 1990),
            (x0 + 1990, y1 - 1990),
            (x0 + 1990, y1 - 1510),
            (x0 + 1950, y1 - 1510),
            (x0 + 1950, y1 - 1950),
            (x0 + 1510, y1 - 1950),
        ]
    )
    assert not ell.contains(ell.centroid)
    rows = [
        {"geometry": first, "value": 100.0},
        {"geometry": second, "value": 300.0},
        {"geometry": ell, "value": 1000.0},
    ]
    item = write_item(tmp_path, "parcel", rows, product="city_property")
    placed = place_records(item, EPSG, 2020)
    medians = tile_cell_medians(placed, SMALL, 500)
    assert medians[2] == pytest.approx(600.0)
    assert np.isnan(medians[[0, 1, 3]]).all()
    assert tile_values(placed, SMALL, total=False).value[2] != pytest.approx(600.0, rel=1e-3)


def test_postcodes_join_their_centroids_and_unmatched_are_counted(tmp_path: Path) -> None:
    centroids = {"SW1A 1AA": (X0 + 500, Y1 - 500), "E1 6AN": (X0 + 2500, Y1 - 3500)}
    points = pd.DataFrame(
        {
            "key": list(centroids),
            "lon": [TO_WGS84.transform(*xy)[0] for xy in centroids.values()],
            "lat": [TO_WGS84.transform(*xy)[1] for xy in centroids.values()],
        }
    )
    rows = [
        {"postcode": "sw1a1aa", "value": 100.0},
        {"postcode": "SW1A 1AA", "value": 300.0},
        {"postcode": "E1 6AN", "value": 1000.0},
        {"postcode": "ZZ9 9ZZ", "value": 50.0},  # unmatched
        {"postcode": "N1 9GU", "value": 70.0},  # unmatched
        {"postcode": None, "value": 70.0},  # no key: unusable
        {"postcode": "E1 6AN", "value": None},  # no value: unusable
    ]
    coverage = gpd.GeoDataFrame(geometry=[utm_to_wgs84(SMALL_BOX)], crs=4326)
    item = write_item(
        tmp_path,
        "postcode",
        rows,
        tables={"points": points, "coverage": coverage},
        extra={"blank_values": "2"},
    )
    placed = place_records(item, EPSG, 2020)
    ingest = placed.ingest.as_dict()
    assert ingest["unusable"] == 2 and ingest["unmatched"] == 2 and ingest["used"] == 3
    assert ingest["unmatched_examples"] == ["N19GU", "ZZ99ZZ"]
    sums = tile_values(placed, SMALL, total=True)
    assert sums.value[0] == pytest.approx(400.0 / 4.0) and sums.value[3] == pytest.approx(250.0)
    means = tile_values(placed, SMALL, total=False)
    assert means.value[0] == pytest.approx(200.0) and np.isnan(means.value[1])


SMALL_BOX = shapely.box(X0, Y1 - 4000, X0 + 4000, Y1)


def test_declared_counts_refuse_a_cut_file(tmp_path: Path) -> None:
    rows = [{"postcode": "A", "value": 1.0}, {"postcode": None, "value": 2.0}]
    points = pd.DataFrame({"key": ["A"], "lon": [-71.0], "lat": [42.3]})
    item = write_item(tmp_path, "postcode", rows, tables={"points": points})
    bad = SourceItem(**{**item.__dict__, "extra": {**item.extra, "records": "5"}})
    with pytest.raises(SourceReadError, match="holds 2 records, its source declares 5"):
        place_records(bad, EPSG, 2020)
    garbled = SourceItem(**{**item.__dict__, "extra": {**item.extra, "blank_values": "0"}})
    with pytest.raises(SourceReadError, match="1 records without a usable value"):
        place_records(garbled, EPSG, 2020)


# ------------------------------------------------------------------ through process_partition


class RecordItems(SourceProduct):
    """Serves hand-written records items of one product."""

    def __init__(self, product: str, items: dict[int, SourceItem]) -> None:
        self.items = items
        self.info = SourceInfo(product, f"test:{product}", "t1", False, "test", "tests")

    def source_years(self, city: str) -> list[int] | None:
        return sorted(self.items) if city == CITY else []

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        return self.items[int(source_year)]  # type: ignore[arg-type]


def _rows(release: Release, year: int, code: str) -> dict[tuple[str, str], dict[str, Any]]:
    table = pq.read_table(release.observations_file(CITY, year, code)).to_pylist()
    return {(r["tile_id"], r["field"]): r for r in table}


def test_parcel_electricity_through_process_partition(tmp_path: Path) -> None:
    """Parcels split by area; support = coverage share; outside it NULL with its reason."""
    t = BOSTON.tile(3, 3).bounds  # (xmin, ymin, xmax, ymax)
    straddling = shapely.box(t[2] - 500, t[1] + 100, t[2] + 1500, t[1] + 600)  # 1/4 in r3c3
    inside = shapely.box(t[0] + 100, t[1] + 100, t[0] + 600, t[1] + 600)
    coverage_utm = shapely.box(t[0], t[1] - 1000, t[2] + 2000, t[3])  # r3c3, r3c4 and half of r4
    rows = [
        {"geometry": straddling, "value": 8e6},
        {"geometry": inside, "value": 1e6},
    ]
    coverage = gpd.GeoDataFrame(geometry=[utm_to_wgs84(coverage_utm)], crs=4326)
    item = write_item(tmp_path / "item", "parcel", rows, tables={"coverage": coverage})
    sources = SourceSet([RecordItems("city_electricity", {2020: item})])
    release = Release(tmp_path / "data", "records")
    summary = derive(CAT.get("ELEC"), CAT, CITY, 2020, sources, release)
    assert summary.records["city_electricity"]["used"] == 2
    process_partition(CAT.get("ELEC"), CAT, CITY, 2020, sources, release)
    rows_out = _rows(release, 2020, "ELEC")
    r3c3 = rows_out[(BOSTON.tile(3, 3).tile_id, "electricity_kwh_km2")]
    r3c4 = rows_out[(BOSTON.tile(3, 4).tile_id, "electricity_kwh_km2")]
    r4c3 = rows_out[(BOSTON.tile(4, 3).tile_id, "electricity_kwh_km2")]
    far = rows_out[(BOSTON.tile(8, 8).tile_id, "electricity_kwh_km2")]
    assert r3c3["value"] == pytest.approx((8e6 / 4 + 1e6) / 4.0, rel=1e-4)
    assert r3c4["value"] == pytest.approx(8e6 * 3 / 4 / 4.0, rel=1e-4)
    assert r3c3["valid_fraction"] == pytest.approx(1.0, abs=1e-4)
    assert r4c3["valid_fraction"] == pytest.approx(0.5, abs=1e-3)
    # Support met but no building reports there: a genuine zero stays an available value
    # (positivity is a pairing rule of the translation benchmark, not a validity rule).
    assert r4c3["value"] == 0.0 and r4c3["reason"] is None and r4c3["available"]
    assert far["value"] is None and far["reason"] == "outside_source_coverage"
    assert r3c3["temporal_basis"] == "city_record" and r3c3["source_id"] == "test:city_electricity"


def _indicators(tmp_path: Path) -> SourceItem:
    def payload(indicator: str, values: dict[int, float | None]) -> list[Any]:
        rows = [
            {"indicator": {"id": indicator}, "countryiso3code": "USA", "date": str(y), "value": v}
            for y, v in values.items()
        ]
        return [{"page": 1, "pages": 1}, rows]

    cpi, ppp = tmp_path / "cpi.json", tmp_path / "ppp.json"
    cpi.write_text(json.dumps(payload("FP.CPI.TOTL", {2017: 245.1, 2020: 258.8})))
    ppp.write_text(json.dumps(payload("PA.NUS.PPP", {2017: 1.0, 2020: 1.0})))
    return SourceItem(
        "worldbank_indicators", CITY, None, {"cpi": cpi, "ppp": ppp}, "test:wb", "t1", False
    )


@pytest.mark.parametrize("currency", ["USD", "EUR"])
def test_point_property_means_in_2017_ppp_dollars_by_hand(tmp_path: Path, currency: str) -> None:
    t = BOSTON.tile(2, 2).bounds
    rows = [
        {"geometry": shapely.Point(t[0] + 100, t[1] + 100), "value": 500_000.0},
        {"geometry": shapely.Point(t[0] + 1900, t[1] + 1900), "value": 700_000.0},
    ]
    coverage = gpd.GeoDataFrame(geometry=[utm_to_wgs84(shapely.box(*t))], crs=4326)
    item = write_item(
        tmp_path / "item",
        "point",
        rows,
        product="city_property",
        tables={"coverage": coverage},
        extra={"currency": currency},
    )

    class Indicators(RecordItems):
        def source_years(self, city: str) -> list[int] | None:
            return None

        def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
            return _indicators(tmp_path)

    sources = SourceSet(
        [
            RecordItems("city_property", {2020: item}),
            Indicators("worldbank_indicators", {}),
        ]
    )
    release = Release(tmp_path / "data", "records")
    if currency == "EUR":  # Boston's PPP factor converts USD only
        with pytest.raises(SourceReadError, match="values are in EUR") as err:
            process_partition(CAT.get("PROP"), CAT, CITY, 2020, sources, release)
        assert err.value.reason == "currency_mismatch"
        return
    process_partition(CAT.get("PROP"), CAT, CITY, 2020, sources, release)
    rows_out = _rows(release, 2020, "PROP")
    tile = BOSTON.tile(2, 2).tile_id
    assert rows_out[(tile, "property_mean_local")]["value"] == pytest.approx(600_000.0)
    assert rows_out[(tile, "property_mean_local")]["unit"] == "USD (nominal, 2020)"
    assert rows_out[(tile, "property_mean_2017ppp")]["unit"] == "2017 PPP international dollars"
    ppp = rows_out[(tile, "property_mean_2017ppp")]["value"]
    assert ppp == pytest.approx(600_000.0 * 245.1 / 258.8 / 1.0)  # = 568,238.02…
    assert ppp == pytest.approx(568_238.02, abs=0.01)
    empty = rows_out[(BOSTON.tile(2, 3).tile_id, "property_mean_local")]
    assert empty["value"] is None and empty["reason"] == "outside_source_coverage"


def test_point_property_median_of_cell_medians_through_process_partition(tmp_path: Path) -> None:
    """Tile r2c2's 500 m cells: (0, 0) holds 100, 200, 900 → 200; (0, 1) 400; (3, 3) 10 and 20
    → 15. Median of cell medians 200; the mean of the records is 271.67 and their plain median
    150. The local currency names the unit, as for the mean."""
    t = BOSTON.tile(2, 2).bounds
    x0, y1 = t[0], t[3]
    rows = [
        {"geometry": shapely.Point(x0 + 100, y1 - 100), "value": 100.0},
        {"geometry": shapely.Point(x0 + 300, y1 - 300), "value": 200.0},
        {"geometry": shapely.Point(x0 + 400, y1 - 50), "value": 900.0},
        {"geometry": shapely.Point(x0 + 700, y1 - 250), "value": 400.0},
        {"geometry": shapely.Point(x0 + 1800, y1 - 1800), "value": 10.0},
        {"geometry": shapely.Point(x0 + 1600, y1 - 1900), "value": 20.0},
    ]
    coverage = gpd.GeoDataFrame(geometry=[utm_to_wgs84(shapely.box(*t))], crs=4326)
    item = write_item(
        tmp_path / "item",
        "point",
        rows,
        product="city_property",
        tables={"coverage": coverage},
        extra={"currency": "USD"},
    )
    sources = SourceSet([RecordItems("city_property", {2020: item})])
    release = Release(tmp_path / "data", "records")
    process_partition(CAT.get("PROP"), CAT, CITY, 2020, sources, release)
    rows_out = _rows(release, 2020, "PROP")
    tile = BOSTON.tile(2, 2).tile_id
    median = rows_out[(tile, "property_median_local")]
    assert median["value"] == pytest.approx(200.0)
    assert median["unit"] == "USD (nominal, 2020)" and median["available"]
    assert rows_out[(tile, "property_mean_local")]["value"] == pytest.approx(1630.0 / 6)
    # no World Bank series served: the PPP field alone lacks its conversion
    assert rows_out[(tile, "property_mean_2017ppp")]["reason"] == "conversion_factor_missing"
    empty = rows_out[(BOSTON.tile(2, 3).tile_id, "property_median_local")]
    assert empty["value"] is None and empty["reason"] == "outside_source_coverage"
