"""User-supplied records: a CSV, GeoJSON or Parquet file with a schema file adds any city;
rows are validated against the declared columns with errors naming file, row and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import geopandas as gpd
import pandas as pd
import pytest
import shapely
import yaml
from pyproj import Transformer

from citycube.errors import SourceUnavailableError, SpecError
from citycube.grid.tiles import city_grid
from citycube.processing.records import place_records, tile_values
from sources.records import records_adapters
from sources.records.user_schema import UserFileError

CITY, EPSG = "Shanghai", 32651
GRID = city_grid(CITY, "2km")
TO_WGS84 = Transformer.from_crs(EPSG, 4326, always_xy=True)


def lonlat(x: float, y: float) -> tuple[float, float]:
    lon, lat = TO_WGS84.transform(x, y)
    return round(float(lon), 7), round(float(lat), 7)


def schema(data_file: str, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "city": CITY,
        "product": "city_property",
        "file": data_file,
        "columns": {
            "price_cny": {"type": "number", "min": 0},
            "listed": {"type": "date"},
            "lon": {"type": "number", "min": -180, "max": 180},
            "lat": {"type": "number", "min": -90, "max": 90},
            "district": {"type": "string", "required": False, "pattern": "[A-Z][a-z]+"},
        },
        "fields": {"value": "price_cny", "year": "listed", "lon": "lon", "lat": "lat"},
        "spatial_form": "point",
        "unit": "CNY (listing price)",
        "currency": "CNY",
        "years": [2019, 2020],
        "coverage": "outline.geojson",
        "portal": "collected listings",
    }
    base.update(changes)
    return base


def write_case(folder: Path, rows: list[dict[str, Any]], **changes: Any) -> Path:
    """A listings CSV, its coverage outline (tiles r5-r6, c5-c6) and its schema file."""
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "listings.csv", index=False)
    x0, y1 = GRID.x_min + 5 * 2000, GRID.y_max - 5 * 2000
    outline = shapely.segmentize(shapely.box(x0, y1 - 4000, x0 + 4000, y1), 50)
    gpd.GeoDataFrame(geometry=[outline], crs=EPSG).to_crs(4326).to_file(folder / "outline.geojson")
    path = folder / "shanghai.schema.yaml"
    path.write_text(yaml.safe_dump(schema("listings.csv", **changes)), encoding="utf-8")
    return path


def listing(x: float, y: float, price: object, listed: str = "2020-05-01") -> dict[str, Any]:
    lon, lat = lonlat(x, y)
    return {"price_cny": price, "listed": listed, "lon": lon, "lat": lat, "district": "Xuhui"}


def prop_adapter(tmp_path: Path, *schemas: Path) -> Any:
    options = {"cache_dir": str(tmp_path / "downloads"), "user_files": [str(s) for s in schemas]}
    return {a.product_id: a for a in records_adapters(options)}["city_property"]


def test_a_valid_csv_builds_the_city_like_any_portal(tmp_path: Path) -> None:
    x, y = GRID.x_min + 5 * 2000, GRID.y_max - 6 * 2000  # south-west corner of tile r5c5
    rows = [
        listing(x + 300, y + 300, "3000000"),
        listing(x + 1700, y + 1700, "5000000"),
        listing(x + 2500, y + 500, "4000000"),
        listing(x + 2500, y + 500, "9", listed="2019-03-02"),  # another year
    ]
    source = prop_adapter(tmp_path, write_case(tmp_path / "case", rows))
    assert source.source_years(CITY) == [2019, 2020]
    item = source.fetch(CITY, 2020, tmp_path / "sources")
    assert item.extra["records"] == "3" and item.extra["currency"] == "CNY"
    tiles = tile_values(place_records(item, EPSG, 2020), GRID, total=False)
    r5c5, r5c6 = 5 * GRID.n_cols + 5, 5 * GRID.n_cols + 6
    assert tiles.value[r5c5] == pytest.approx(4_000_000.0)
    assert tiles.value[r5c6] == pytest.approx(4_000_000.0)
    assert tiles.covered[r5c5] == pytest.approx(1.0, abs=1e-4)
    assert tiles.covered[0] == 0.0


def test_errors_name_the_file_the_line_and_the_column(tmp_path: Path) -> None:
    x, y = GRID.x_min + 10_000, GRID.y_max - 12_000
    rows = [
        listing(x, y, "3000000"),
        listing(x, y, "about 2m"),  # line 3: not a number
        {**listing(x, y, "1000"), "lat": "95"},  # line 4: above the maximum
        listing(x, y, "1000", listed=""),  # line 5: blank but required
        {**listing(x, y, "1000"), "district": "xuhui district"},  # line 6: pattern
        listing(x, y, "-5", listed="not a date"),  # line 7: two rules broken
    ]
    case = write_case(tmp_path / "case", rows)
    source = prop_adapter(tmp_path, case)
    with pytest.raises(UserFileError) as err:
        source.fetch(CITY, 2020, tmp_path / "sources")
    message = str(err.value)
    data = (tmp_path / "case" / "listings.csv").resolve()
    assert f"{data}, line 3, column 'price_cny': 'about 2m' is not a number" in message
    assert f"{data}, line 4, column 'lat': '95' is above the maximum 90" in message
    assert f"{data}, line 5, column 'listed': nan is blank but required" in message
    assert f"{data}, line 6, column 'district'" in message and "does not match" in message
    assert f"{data}, line 7, column 'price_cny': '-5' is below the minimum 0" in message
    assert f"{data}, line 7, column 'listed': 'not a date' is not a date" in message
    assert "6 cell(s) fail" in message
    assert not (tmp_path / "sources" / "city_property" / CITY / "2020").exists()


def test_missing_columns_and_bad_schemas_are_refused(tmp_path: Path) -> None:
    x, y = GRID.x_min + 10_000, GRID.y_max - 12_000
    rows = [{k: v for k, v in listing(x, y, "1").items() if k != "lon"}]
    source = prop_adapter(tmp_path, write_case(tmp_path / "case", rows))
    with pytest.raises(UserFileError, match=r"column\(s\) \['lon'\] declared in the schema"):
        source.fetch(CITY, 2020, tmp_path / "sources")
    bad = write_case(tmp_path / "bad", rows, fields={"value": "price", "lon": "lon", "lat": "lat"})
    with pytest.raises(SpecError, match="fields map columns \\['price'\\]"):
        prop_adapter(tmp_path, bad)
    no_currency = write_case(tmp_path / "nocur", rows, currency=None)
    with pytest.raises(SpecError, match="a currency code is required"):
        prop_adapter(tmp_path, no_currency)
    no_outline = write_case(tmp_path / "nocov", rows, coverage=None)
    with pytest.raises(SpecError, match="point records need `coverage`"):
        prop_adapter(tmp_path, no_outline)


def test_geojson_parcels_and_parquet_files(tmp_path: Path) -> None:
    x, y = GRID.x_min + 5 * 2000, GRID.y_max - 6 * 2000
    parcels = gpd.GeoDataFrame(
        {"value_eur": [100.0, 300.0], "year": ["2020", "2020"]},
        geometry=[
            shapely.box(x, y, x + 1000, y + 1000),
            shapely.box(x + 1500, y, x + 2500, y + 500),
        ],
        crs=EPSG,
    )
    folder = tmp_path / "geo"
    folder.mkdir()
    parcels.to_file(folder / "parcels.geojson")  # written in the city's UTM: reprojected on read
    columns = {"value_eur": {"type": "number"}, "year": {"type": "year"}}
    spec = {
        **schema("parcels.geojson"),
        "columns": columns,
        "fields": {"value": "value_eur", "year": "year"},
        "spatial_form": "parcel",
        "coverage": None,
    }
    (folder / "p.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    item = prop_adapter(tmp_path, folder / "p.yaml").fetch(CITY, 2020, tmp_path / "s1")
    tiles = tile_values(place_records(item, EPSG, 2020), GRID, total=False)
    r5c5 = 5 * GRID.n_cols + 5
    # 1 km² at 100 and 0.25 km² at 300 in r5c5; the second parcel's other half is in r5c6.
    assert tiles.value[r5c5] == pytest.approx((100 * 1.0 + 300 * 0.25) / 1.25, rel=1e-4)
    # Without a declared coverage, parcels cover what they cover: 1.25 km² of 4.
    assert tiles.support[r5c5] == pytest.approx(1.25 / 4, rel=1e-4)

    frame = pd.DataFrame({"value_eur": [7.0], "year": [2020], "lon": [121.47], "lat": [31.23]})
    frame.to_parquet(folder / "points.parquet")
    spec = {
        **schema("points.parquet"),
        "columns": {**columns, "lon": {"type": "number"}, "lat": {"type": "number"}},
        "fields": {"value": "value_eur", "year": "year", "lon": "lon", "lat": "lat"},
        "coverage": "outline.geojson",
    }
    outline = gpd.GeoDataFrame(geometry=[shapely.box(x, y, x + 4000, y + 4000)], crs=EPSG)
    outline.to_file(folder / "outline.geojson")
    (folder / "q.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    item = prop_adapter(tmp_path, folder / "q.yaml").fetch(CITY, 2020, tmp_path / "s2")
    assert item.extra["records"] == "1" and item.extra["blank_values"] == "0"


def test_a_declared_user_file_city_without_a_file_is_unavailable(tmp_path: Path) -> None:
    source = prop_adapter(tmp_path)  # the packaged spec names Shanghai as a user file
    with pytest.raises(SourceUnavailableError, match="user_files") as err:
        source.fetch(CITY, 2020, tmp_path / "sources")
    assert err.value.reason == "records_not_supplied"
