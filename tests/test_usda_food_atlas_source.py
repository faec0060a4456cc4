"""The Food Access Research Atlas adapter against a loopback HTTP server serving a real xlsx
workbook (or a zipped CSV) and a real zipped TIGER/Line tract shapefile."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import geopandas as gpd
import pandas as pd
import pytest
from openpyxl import Workbook
from shapely.geometry import box

from citycube.errors import FoodAtlasSourceError
from sources.usda_food_atlas import (
    ATLAS_COLUMNS,
    FoodAtlasOptions,
    FoodAtlasSource,
    read_atlas,
    read_item,
    read_tracts,
)
from tests.faulty_http_server import FaultyServer

# Four tracts near Boston City Hall (-71.0589, 42.3601), in NAD83 lon/lat.
TRACTS = {
    "25025030300": box(-71.08, 42.36, -71.06, 42.38),
    "25025030400": box(-71.06, 42.36, -71.04, 42.38),
    "25025070200": box(-71.08, 42.34, -71.06, 42.36),
    "25025070300": box(-71.06, 42.34, -71.04, 42.36),
    "25025990000": box(-71.04, 42.34, -71.02, 42.38),  # not in the Atlas: no label
}
# CensusTract, Urban, LowIncomeTracts, LA1and10, LILATracts_1And10
ROWS = [
    (25025030300, 1, 1, 1, 1),
    (25025030400, 1, 0, 1, 0),
    (25025070200, 1, 0, 0, 0),
    (25025070300, 1, 1, "NULL", "NULL"),
    (6075010100, 1, 0, 0, 0),  # a California tract: leading zero dropped, as Excel does
]


def atlas_xlsx() -> bytes:
    """A workbook laid out as ERS serves it: three sheets, data on the third, NULL for gaps."""
    book = Workbook()
    book.active.title = "Read Me"
    book.active.append(["Food Access Research Atlas 2019 (test copy)"])
    book.create_sheet("Variable Lookup").append(["Field", "LongName"])
    data = book.create_sheet("Food Access Research Atlas")
    data.append(["CensusTract", "State", "County", *ATLAS_COLUMNS[1:], "PovertyRate"])
    for tract, urban, low_income, la, lila in ROWS:
        data.append([tract, "Massachusetts", "Suffolk County", urban, low_income, la, lila, 12.5])
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def atlas_csv_zip() -> bytes:
    frame = pd.DataFrame(ROWS, columns=list(ATLAS_COLUMNS))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("Food Access Research Atlas Data 2019.csv", frame.to_csv(index=False))
    return buffer.getvalue()


def tract_zip(tmp_path: Path, field: str = "GEOID") -> bytes:
    """A zipped shapefile as TIGER/Line serves it (shp, shx, dbf, prj; EPSG:4269)."""
    folder = tmp_path / "shp"
    folder.mkdir(exist_ok=True)
    frame = gpd.GeoDataFrame(
        {"STATEFP": ["25"] * len(TRACTS), field: list(TRACTS), "ALAND": [1] * len(TRACTS)},
        geometry=list(TRACTS.values()),
        crs="EPSG:4269",
    )
    frame.to_file(folder / "tl_2019_25_tract.shp", engine="pyogrio")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for part in sorted(folder.iterdir()):
            archive.write(part, part.name)
    return buffer.getvalue()


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def source(tmp_path: Path, server: FaultyServer, atlas: str) -> FoodAtlasSource:
    return FoodAtlasSource(
        FoodAtlasOptions(
            cache_dir=tmp_path / "cache",
            atlas_url=server.url(atlas),
            tiger_url=server.url("geo/tl_2019_{state}_tract.zip"),
            attempts=2,
            total_s=10.0,
            wait_initial_s=0.01,
            timeout_s=5.0,
        )
    )


def test_the_workbook_and_tract_zip_served_over_http_install_labelled_tracts(
    tmp_path: Path, server: FaultyServer
) -> None:
    server.add("data/FoodAccessResearchAtlasData2019.xlsx", atlas_xlsx())
    server.add("geo/tl_2019_25_tract.zip", tract_zip(tmp_path))
    adapter = source(tmp_path, server, "data/FoodAccessResearchAtlasData2019.xlsx")
    adapter.install("Boston", tmp_path / "item")
    tracts = read_item(tmp_path / "item").set_index("geoid")
    assert tracts.crs.to_epsg() == 4269
    assert tracts.loc["25025030300", "label"] == "lila_land10"
    assert tracts.loc["25025030400", "label"] == "low_access_land10"
    assert tracts.loc["25025070200", "label"] == "not_low_access_land10"
    assert pd.isna(tracts.loc["25025070300", "label"])
    assert "missing" in tracts.loc["25025070300", "reason"]
    assert tracts.loc["25025990000", "reason"] == "tract not listed in the Atlas"
    # A second install finds both files in the cache: nothing is asked of the server again.
    adapter.install("Boston", tmp_path / "again")
    assert len(server.requests_for("geo/tl_2019_25_tract.zip")) == 1


def test_a_zipped_csv_of_the_atlas_reads_like_the_workbook(tmp_path: Path) -> None:
    (tmp_path / "a.xlsx").write_bytes(atlas_xlsx())
    (tmp_path / "a.zip").write_bytes(atlas_csv_zip())
    from_xlsx, from_csv = read_atlas(tmp_path / "a.xlsx"), read_atlas(tmp_path / "a.zip")
    pd.testing.assert_frame_equal(from_xlsx, from_csv)
    assert "06075010100" in set(from_xlsx["geoid"])


def test_a_2010_vintage_tract_file_with_geoid10_is_read(tmp_path: Path) -> None:
    (tmp_path / "t.zip").write_bytes(tract_zip(tmp_path, field="GEOID10"))
    assert sorted(read_tracts(tmp_path / "t.zip")["geoid"]) == sorted(TRACTS)


def test_an_atlas_without_the_access_flags_is_refused_by_name(tmp_path: Path) -> None:
    frame = pd.DataFrame({"CensusTract": ["25025030300"], "Urban": [1]})
    (tmp_path / "bad.csv").write_text(frame.to_csv(index=False))
    with pytest.raises(FoodAtlasSourceError, match=r"CC420.*LA1and10"):
        read_atlas(tmp_path / "bad.csv")


def test_a_city_outside_the_united_states_is_refused(tmp_path: Path, server: FaultyServer) -> None:
    adapter = source(tmp_path, server, "data/atlas.xlsx")
    with pytest.raises(FoodAtlasSourceError, match="US census tracts only"):
        adapter.install("Amsterdam", tmp_path / "item")
    assert server.requests == []
