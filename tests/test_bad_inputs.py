"""A catalogue of malformed inputs: each is refused with a coded error that names what it
concerns (source, city, year, file) and the action that fixes it, and nothing else is lost.

Source files are small real files made from the sample family's items in tmp dirs and then
broken (cut, garbled, mislabelled, emptied); each is processed through the public partition
API (``process_partition``) on a copy of a data root that already holds good partitions, which
must come through unchanged. Command-line arguments go through ``citycube`` itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rasterio
from affine import Affine

from citycube.catalogue.modalities import ModalitySpec, load_catalogue
from citycube.cube.release import Release
from citycube.errors import (
    CityCubeError,
    CubeWriteError,
    SourceReadError,
    UnknownCityError,
    UnknownYearError,
)
from citycube.grid.tiles import pixel_grid
from citycube.items.protocol import SourceItem, SourceSet
from citycube.items.rasters import write_netcdf_variable
from citycube.processing.compute import process_partition
from pipelines.cli import main
from sources import load_source_set
from tests.conftest import LocalFilesProduct

pytestmark = pytest.mark.bad_input("clear")
"""Every case is refused with a coded error naming its cause, unless marked 'handled'."""

CAT = load_catalogue()
AMS, BOS, YEAR = "Amsterdam", "Boston", 2020
FIX = "re-run its source asset"
"""The action a broken source file's error names (after the item directory to delete)."""

SAMPLE_ITEMS = {
    "odiac": (AMS, YEAR),
    "landsat_c2l2": (AMS, YEAR),
    "acag_pm25": (AMS, YEAR),
    "city_electricity": (BOS, YEAR),
    "osm_roads": (AMS, YEAR),
    "osm_gps_traces": (AMS, YEAR),
    "city_property": (BOS, YEAR),
    "worldbank_indicators": (BOS, None),
    "ghs_pop": (AMS, YEAR),
    "chelsa": (AMS, YEAR),
}
"""Sample items the broken files are made from: one per format the engine reads."""


def _modality(code: str) -> ModalitySpec:
    """The catalogue's modality; DEM reads a hand-made DEM on its chip grid (no warp: fast)."""
    if code == "DEM":
        return CAT.get("DEM").model_copy(update={"product": "test_dem"})
    return CAT.get(code)


class ServedItems(LocalFilesProduct):
    """Serves given items of one product as they are (extra metadata included)."""

    def __init__(self, product: str, items: list[SourceItem]) -> None:
        super().__init__(product, {(i.city, i.source_year): i.files for i in items})
        self.served = {(i.city, i.source_year): i for i in items}

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        super().fetch(city, source_year, dest)  # refuses what it does not serve
        return self.served[(city, source_year)]


def _source_set(items: list[SourceItem]) -> SourceSet:
    """Every product the modalities below read, serving ``items`` (others publish nothing)."""
    products = {"acag_no2", "test_dem"} | set(SAMPLE_ITEMS)
    served = {p: [i for i in items if i.product == p] for p in products}
    return SourceSet([ServedItems(p, served[p]) for p in sorted(products)], name="bad-inputs")


def _dem_item(folder: Path, value: float, *, nodata: float = -32767) -> SourceItem:
    grid = pixel_grid(AMS, 25)
    data = np.full((1, grid.height, grid.width), value, np.float32)
    path = folder / f"dem-{value}.tif"
    folder.mkdir(parents=True, exist_ok=True)
    profile = {"driver": "GTiff", "width": grid.width, "height": grid.height, "count": 1}
    profile |= {"dtype": "float32", "crs": "EPSG:32631", "transform": grid.transform}
    with rasterio.open(path, "w", nodata=nodata, **profile) as ds:
        ds.write(data)
    return _test_item("test_dem", AMS, None, {"data": path})


def _test_item(
    product: str,
    city: str,
    year: int | None,
    files: dict[str, Path],
    extra: dict[str, str] | None = None,
) -> SourceItem:
    return SourceItem(
        product=product,
        city=city,
        source_year=year,
        files=files,
        source_id=f"test:{product}",
        version="t1",
        synthetic=True,
        extra=extra or {},
    )


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SourceItem]:
    """One item per format, fetched from the sample family once for the module."""
    sources = load_source_set(None)
    dest = tmp_path_factory.mktemp("sample-items")
    return {p: sources.fetch(p, city, year, dest) for p, (city, year) in SAMPLE_ITEMS.items()}


@pytest.fixture(scope="module")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, sample: dict[str, SourceItem]
) -> tuple[Path, list[SourceItem]]:
    """A data root holding good partitions (CO2 and DEM of Amsterdam 2020, ELEC of Boston
    2020) that every case below must leave exactly as they are; and the good items."""
    root = tmp_path_factory.mktemp("baseline")
    items = [sample["odiac"], sample["city_electricity"], _dem_item(root / "good", 5.0)]
    release = Release(root / "data", "t")
    sources = _source_set(items)
    for code, city in (("CO2", AMS), ("ELEC", BOS), ("DEM", AMS)):
        process_partition(_modality(code), CAT, city, YEAR, sources, release)
    return root / "data", items


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------------------------
# Ways to break a file


def _cut(keep: float) -> Callable[[Path], None]:
    def cut(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * keep)])

    return cut


def _content(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _zero_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:16] = bytes(16)
    path.write_bytes(bytes(data))


def _raster(
    values: Callable[[np.ndarray], np.ndarray] = lambda a: a, **profile: object
) -> Callable[[Path], None]:
    """Rewrite a GeoTIFF with changed values and/or profile (CRS, transform, dtype, …)."""

    def rewrite(path: Path) -> None:
        with rasterio.open(path) as ds:
            data = values(ds.read())
            base = {"crs": ds.crs, "transform": ds.transform, "nodata": ds.nodata}
        base |= {"driver": "GTiff", "width": data.shape[2], "height": data.shape[1]}
        base |= {"count": data.shape[0], "dtype": data.dtype}
        with rasterio.open(path, "w", **(base | profile)) as out:
            out.write(data)

    return rewrite


def _netcdf_without_cf(path: Path) -> None:
    """The same values as a bare NetCDF variable: no grid mapping, no coordinates."""
    with rasterio.open(path) as ds:
        values = ds.read(1)
    path.unlink()
    profile = {"width": values.shape[1], "height": values.shape[0], "count": 1}
    write_netcdf_variable(
        path,
        profile | {"dtype": values.dtype},
        values,
        variable="pm25",
        units="",
        long_name="",
        attributes={},
    )


def _csv(edit: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines()
        path.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")

    return rewrite


def _cut_last_record(path: Path) -> None:
    """The file ends inside its last record (a download cut short)."""
    text = path.read_bytes().rstrip(b"\n")
    path.write_bytes(text[: text.rindex(b",", 0, text.rindex(b",") - 1)])


def _garble_values(path: Path) -> None:
    frame = pd.read_csv(path, dtype=str)
    frame.loc[::5, "kwh"] = "n/a"
    frame.to_csv(path, index=False)


def _frame(edit: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        edit(pd.read_csv(path)).to_csv(path, index=False)

    return rewrite


def _swap_lon_lat(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.rename(columns={"lon": "lat", "lat": "lon"})


def _drop_column(column: str) -> Callable[[Path], None]:
    def drop(path: Path) -> None:
        pd.read_csv(path).drop(columns=[column]).to_csv(path, index=False)

    return drop


def _worldbank_values(edit: Callable[[object], object]) -> Callable[[Path], None]:
    """Rewrite every value of a World Bank API v2 JSON response."""

    def rewrite(path: Path) -> None:
        meta, records = json.loads(path.read_text(encoding="utf-8"))
        for record in records:
            record["value"] = edit(record["value"])
        path.write_text(json.dumps([meta, records]), encoding="utf-8")

    return rewrite


def _geojson(*geometries: dict) -> Callable[[Path], None]:
    features = [{"type": "Feature", "properties": {}, "geometry": g} for g in geometries]
    return _content(json.dumps({"type": "FeatureCollection", "features": features}).encode())


BOWTIE = {
    "type": "Polygon",
    "coordinates": [[[-71.2, 42.2], [-70.9, 42.5], [-70.9, 42.2], [-71.2, 42.5], [-71.2, 42.2]]],
}


def _layer(edit: Callable[[gpd.GeoDataFrame], gpd.GeoDataFrame]) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        frame = edit(gpd.read_file(path, layer="roads"))
        path.unlink()
        frame.to_file(path, layer="roads", driver="GPKG")

    return rewrite


def _parquet_without_geo(path: Path) -> None:
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({}), path)


def _points_as_polygons(path: Path) -> None:
    frame = gpd.read_parquet(path)
    frame["geometry"] = frame.geometry.to_crs(3857).buffer(10.0).to_crs(frame.crs)  # ~10 m
    frame.to_parquet(path)


# --------------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class BadFile:
    """One source file broken one way, and what its refusal must say."""

    modality: str
    city: str
    product: str
    """The sample item whose file is broken ('test_dem': the hand-made DEM)."""
    role: str
    """Which of its files."""
    damage: Callable[[Path], None]
    error: type[CityCubeError]
    says: tuple[str, ...]
    """Fragments the message holds besides the code, the partition and the source."""
    extra: dict[str, str] = field(default_factory=dict)
    """Item metadata replacing the sample's (e.g. declared record counts)."""
    drop_extra: tuple[str, ...] = ()
    """Item metadata removed from the sample's (e.g. the declared record count)."""


ODIAC, LANDSAT, ELEC, ROADS, GPS = (
    "odiac",
    "landsat_c2l2",
    "city_electricity",
    "osm_roads",
    "osm_gps_traces",
)
CORRUPT = ("the file is corrupt or truncated", FIX)
NO_VALID = ("has no valid pixel over", FIX)
OTHER_PLACE = Affine(1 / 120, 0, -70.0, 0, -1 / 120, -30.0)  # Chile, not Amsterdam

BAD_FILES: dict[str, BadFile] = {
    # GeoTIFF / COG (CO2 from ODIAC)
    "tif_header_zeroed": BadFile("CO2", AMS, ODIAC, "data", _zero_header, SourceReadError, CORRUPT),
    "cog_truncated": BadFile("CO2", AMS, ODIAC, "data", _cut(0.6), SourceReadError, CORRUPT),
    "tif_zero_bytes": BadFile("CO2", AMS, ODIAC, "data", _content(b""), SourceReadError, CORRUPT),
    "tif_is_an_html_login_page": BadFile(
        "CO2", AMS, ODIAC, "data", _content(b"<html>log in</html>"), SourceReadError, CORRUPT
    ),
    "tif_without_crs": BadFile(
        "CO2", AMS, ODIAC, "data", _raster(crs=None), SourceReadError, ("has no CRS", FIX)
    ),
    "tif_in_web_mercator": BadFile(
        "CO2",
        AMS,
        ODIAC,
        "data",
        _raster(crs="EPSG:3857"),
        SourceReadError,
        ("is in EPSG:3857 but odiac is published in EPSG:4326", "fetch it again"),
    ),
    "tif_all_nan": BadFile(
        "CO2", AMS, ODIAC, "data", _raster(lambda a: a * np.nan), SourceReadError, NO_VALID
    ),
    "tif_all_nodata": BadFile(
        "CO2",
        AMS,
        ODIAC,
        "data",
        _raster(lambda a: np.full_like(a, -9999.0)),
        SourceReadError,
        NO_VALID,
    ),
    "tif_of_another_place": BadFile(
        "CO2", AMS, ODIAC, "data", _raster(transform=OTHER_PLACE), SourceReadError, NO_VALID
    ),
    "tif_complex_band": BadFile(
        "CO2",
        AMS,
        ODIAC,
        "data",
        _raster(lambda a: a.astype(np.complex64)),
        SourceReadError,
        ("holds complex64 values, not real numbers", FIX),
    ),
    "tif_rewritten_as_uint8": BadFile(
        "CO2",
        AMS,
        ODIAC,
        "data",
        _raster(lambda a: np.clip(a, 0, 255).astype(np.uint8), nodata=None),
        SourceReadError,
        ("band 1 holds uint8 pixels but odiac is published as float32 or float64", FIX),
    ),
    "tif_with_another_nodata": BadFile(
        "POP",
        AMS,
        "ghs_pop",
        "data",
        _raster(lambda a: np.where(a == -200, -1, a), nodata=-1),
        SourceReadError,
        ("declares nodata -1 but ghs_pop is published with nodata -200", FIX),
    ),
    "scaled_integers_without_their_scale": BadFile(
        "WTH",
        AMS,
        "chelsa",
        "tas",
        _raster(),
        SourceReadError,
        ("holds uint16 pixels without the scale and offset chelsa stores", FIX),
    ),
    "tif_missing": BadFile(
        "CO2", AMS, ODIAC, "data", lambda p: p.unlink(), SourceReadError, ("does not exist", FIX)
    ),
    # Multi-band image with QA (OPT from Landsat)
    "rgb_with_one_band": BadFile(
        "OPT",
        AMS,
        LANDSAT,
        "data",
        _raster(lambda a: a[:1]),
        SourceReadError,
        ("has 1 band(s); OPT reads band(s) [1, 2, 3]", FIX),
    ),
    "qa_on_another_grid": BadFile(
        "OPT",
        AMS,
        LANDSAT,
        "qa",
        _raster(lambda a: a[:, :, :-3]),
        SourceReadError,
        ("is not on the same grid as", FIX),
    ),
    # An image whose chips already exist: the last good chips must stay
    "dem_all_nodata": BadFile(
        "DEM",
        AMS,
        "test_dem",
        "data",
        _raster(lambda a: np.full_like(a, -32767.0)),
        SourceReadError,
        NO_VALID,
    ),
    # NetCDF (AQ from ACAG SatPM2.5)
    "netcdf_without_cf_attributes": BadFile(
        "AQ",
        AMS,
        "acag_pm25",
        "data",
        _netcdf_without_cf,
        SourceReadError,
        ("has no CRS or geotransform", FIX),
    ),
    "netcdf_truncated": BadFile(
        "AQ", AMS, "acag_pm25", "data", _cut(0.5), SourceReadError, CORRUPT
    ),
    # Record CSVs (ELEC) and their reporting-area GeoJSON
    "csv_last_record_cut": BadFile(
        "ELEC", BOS, ELEC, "data", _cut_last_record, SourceReadError, ("fields where", FIX)
    ),
    "csv_separator_lost": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _csv(lambda lines: [line.replace(",", ";", 1) for line in lines]),
        SourceReadError,
        ("lacks columns", FIX),
    ),
    "csv_separator_lost_in_some_rows": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _csv(lambda lines: lines[:2] + [x.replace(",", ";", 1) for x in lines[2:]]),
        SourceReadError,
        ("line 3 has 5 fields where the header has 6", FIX),
    ),
    "csv_values_garbled": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _garble_values,
        SourceReadError,
        ("records without a usable value or position", "declares 367 blank", FIX),
    ),
    "csv_missing_column": BadFile(
        "ELEC", BOS, ELEC, "data", _drop_column("lat"), SourceReadError, ("lacks columns", FIX)
    ),
    "csv_zero_bytes": BadFile(
        "ELEC", BOS, ELEC, "data", _content(b""), SourceReadError, ("as CSV records", FIX)
    ),
    "csv_header_only": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _csv(lambda lines: lines[:1]),
        SourceReadError,
        ("holds 0 records, its source declares", FIX),
    ),
    "csv_is_binary": BadFile(
        "ELEC", BOS, ELEC, "data", _content(bytes(range(256)) * 8), SourceReadError, (FIX,)
    ),
    # Records that would reach no tile, or the wrong ones: refused, never summed into zeros
    "csv_rows_of_another_year": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _frame(lambda f: f.assign(year=2019)),
        SourceReadError,
        ("line 2 carries year 2019, not 2020: 15052 of 15052 records", FIX),
    ),
    "csv_lon_lat_swapped": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _frame(_swap_lon_lat),
        SourceReadError,
        ("records outside Boston's reporting area", "first: line 2 at lon 42.", "swapped", FIX),
    ),
    "csv_every_row_twice": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _frame(lambda f: pd.concat([f, f])),
        SourceReadError,
        ("line 15054 repeats building_id 'BOSTON-", "of line 2: 15052 records are dup", FIX),
        extra={"records": "30104", "blank_values": "734"},
    ),
    "csv_in_wh_not_kwh": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _frame(lambda f: f.assign(kwh=f["kwh"] * 1000)),
        SourceReadError,
        ("kWh/year, outside the plausible 0–1e+09 kWh/year of a point record", FIX),
    ),
    "csv_in_wh_of_small_buildings": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _frame(lambda f: f.assign(kwh=f["kwh"].clip(upper=9e5) * 1000)),
        SourceReadError,
        ("has a median record of 9.", "outside the plausible 1000–1e+07 kWh/year", FIX),
    ),
    "csv_cut_with_its_declared_count_removed": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "data",
        _csv(lambda lines: lines[: len(lines) * 2 // 3]),
        SourceReadError,
        ("declares no record count ('records')", FIX),
        drop_extra=("records", "blank_values"),
    ),
    "geojson_self_intersecting": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "coverage",
        _geojson(BOWTIE),
        SourceReadError,
        ("invalid polygon (Self-intersection", FIX),
    ),
    "geojson_without_features": BadFile(
        "ELEC", BOS, ELEC, "coverage", _geojson(), SourceReadError, ("holds no polygon", FIX)
    ),
    "geojson_of_points": BadFile(
        "ELEC",
        BOS,
        ELEC,
        "coverage",
        _geojson({"type": "Point", "coordinates": [-71.06, 42.36]}),
        SourceReadError,
        ("geometries other than polygons", FIX),
    ),
    "geojson_truncated": BadFile(
        "ELEC", BOS, ELEC, "coverage", _cut(0.5), SourceReadError, CORRUPT
    ),
    # GeoPackage lines (RD from OSM roads)
    "gpkg_truncated": BadFile("RD", AMS, ROADS, "data", _cut(0.5), SourceReadError, CORRUPT),
    "gpkg_zero_bytes": BadFile("RD", AMS, ROADS, "data", _content(b""), SourceReadError, CORRUPT),
    "gpkg_in_utm": BadFile(
        "RD",
        AMS,
        ROADS,
        "data",
        _layer(lambda f: f.to_crs(32631)),
        SourceReadError,
        ("is in EPSG:32631 but the product is published in EPSG:4326", FIX),
    ),
    "gpkg_without_highway_column": BadFile(
        "RD",
        AMS,
        ROADS,
        "data",
        _layer(lambda f: f.drop(columns=["highway"])),
        SourceReadError,
        ("has no column 'highway'", FIX),
    ),
    # GeoParquet points (GPS)
    "geoparquet_truncated": BadFile("GPS", AMS, GPS, "data", _cut(0.5), SourceReadError, CORRUPT),
    "parquet_without_geo_metadata": BadFile(
        "GPS",
        AMS,
        GPS,
        "data",
        _parquet_without_geo,
        SourceReadError,
        ("without GeoParquet metadata", FIX),
    ),
    "geoparquet_of_polygons": BadFile(
        "GPS",
        AMS,
        GPS,
        "data",
        _points_as_polygons,
        SourceReadError,
        ("geometries other than points", FIX),
    ),
    # JSON (PROP's CPI and PPP series)
    "json_zero_bytes": BadFile(
        "PROP",
        BOS,
        "worldbank_indicators",
        "cpi",
        _content(b""),
        SourceReadError,
        ("is not a World Bank API v2 JSON response", FIX),
    ),
    "json_values_as_text": BadFile(
        "PROP",
        BOS,
        "worldbank_indicators",
        "cpi",
        _worldbank_values(lambda v: None if v is None else f"{v * 1000:,.1f}"),
        SourceReadError,
        ("record 2 (AUS 2024) has value '155,577.0', not a number", FIX),
    ),
}


def _broken_item(case: BadFile, good: SourceItem, folder: Path) -> SourceItem:
    """A copy of ``good`` in ``folder`` with the case's file damaged."""
    folder.mkdir(parents=True)
    files = {}
    for role, path in good.files.items():
        files[role] = folder / Path(path).name
        shutil.copy(path, files[role])
    case.damage(files[case.role])
    extra = {k: v for k, v in {**good.extra, **case.extra}.items() if k not in case.drop_extra}
    return replace(good, files=files, extra=extra, fingerprint="")


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_broken_source_file_is_refused_and_nothing_else_is_lost(
    name: str,
    tmp_path: Path,
    sample: dict[str, SourceItem],
    baseline: tuple[Path, list[SourceItem]],
) -> None:
    case = BAD_FILES[name]
    good_root, good_items = baseline
    data = tmp_path / "data"
    shutil.copytree(good_root, data)
    before = _hashes(data)
    outside = sorted(os.listdir(tmp_path))
    good = {i.product: i for i in [*sample.values(), *good_items]}
    broken = _broken_item(case, good[case.product], tmp_path / "incoming")
    items = [broken] + [i for i in good.values() if i.product != case.product]
    release = Release(data, "t")

    with pytest.raises(case.error) as raised:
        process_partition(
            _modality(case.modality), CAT, case.city, YEAR, _source_set(items), release
        )

    message = str(raised.value)
    assert message.startswith(f"[{case.error.code}] {case.modality} {case.city} ")
    assert f"source {case.product} ({broken.source_id} {broken.version}" in message
    assert str(broken.files[case.role]) in message  # the file
    for fragment in case.says:
        assert fragment in message
    # Nothing else lost: every earlier file intact (the same partition's last good version
    # included), nothing new but caches, nothing written outside the data root.
    after = _hashes(data)
    assert {k: after.get(k) for k in before} == before
    assert [k for k in after.keys() - before.keys() if not k.startswith("cache/")] == []
    assert sorted(os.listdir(tmp_path)) == [*outside, "incoming"]


@pytest.mark.bad_input("handled")
@pytest.mark.parametrize("name", ["/etc/passwd", "../../../../../../etc/passwd"])
def test_an_item_record_naming_a_file_outside_its_item_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """A completion record is data on disk: one pointing at any other file is not trusted
    (the file would be read as the item's, and a refusal would advise deleting it)."""
    sources = load_source_set(None)
    dest = tmp_path / "data" / "sources"
    item = sources.fetch("odiac", AMS, YEAR, dest)
    folder = Path(item.files["data"]).parent
    record = json.loads((folder / "_complete.json").read_text())
    record["files"]["data"] = name
    record["checksums"][name] = record["checksums"].pop(Path(item.files["data"]).name)
    (folder / "_complete.json").write_text(json.dumps(record))

    again = sources.fetch("odiac", AMS, YEAR, dest)
    assert Path(again.files["data"]).resolve().is_relative_to(dest.resolve())
    assert again.files["data"] == item.files["data"]
    assert f"naming files outside its directory ({name})" in caplog.text
    assert "the record is refused and the item made again" in caplog.text


# --------------------------------------------------------------------------------------------
# A full disk: said as such, whatever library met it


def test_a_full_disk_while_installing_a_source_says_no_space_left(tmp_path: Path) -> None:
    """The kernel's own ENOSPC (writes to /dev/full), met by Arrow inside an item's writer."""
    from citycube.errors import DiskFullError
    from citycube.items.staging import StagedFiles, install_item

    final = tmp_path / "data" / "sources" / "odiac" / AMS / "2020"

    def writer(staging: Path) -> StagedFiles:
        (staging / "values.parquet").symlink_to("/dev/full")
        pd.DataFrame({"value": np.arange(100_000.0)}).to_parquet(staging / "values.parquet")
        return StagedFiles({"data": "values.parquet"})

    with pytest.raises(DiskFullError) as raised:
        install_item(final, {"version": "1"}, writer)
    message = str(raised.value)
    assert message.startswith(f"[CC309] no space left on / (writing {final}); nothing of the")
    assert "Free space there" in message and "run the same command again" in message
    assert list(final.parent.iterdir()) == []  # no item, no staging folder left


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (mounting needs root: skipped otherwise)."""
    import subprocess

    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("this machine does not let tests mount a tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_file_system_says_no_space_left_whatever_library_met_it(
    full_disk: Path,
) -> None:
    """A real full file system: the sample family installing an item, and GDAL writing a
    GeoTIFF (which words it 'TIFFAppendToStrip:Write error', without an errno)."""
    from citycube.errors import CubeWriteError, DiskFullError

    sources = load_source_set(None)
    with open(full_disk / "filler", "wb") as filler:  # leave one page
        filler.write(b"x" * (512 * 1024 - 4 * 1024))
    with pytest.raises(DiskFullError) as raised:
        sources.fetch("odiac", AMS, YEAR, full_disk / "sources")
    message = str(raised.value)
    assert f"no space left on {full_disk} (writing {full_disk / 'sources'}" in message

    tif = full_disk / "quicklook.tif"
    profile = {"driver": "GTiff", "width": 256, "height": 256, "count": 1, "dtype": "float32"}
    profile |= {"crs": "EPSG:32631", "transform": Affine(25, 0, 600_000, 0, -25, 5_800_000)}
    with (
        pytest.raises(rasterio.errors.RasterioIOError) as gdal,
        rasterio.open(tif, "w", **profile) as ds,
    ):
        ds.write(np.random.default_rng(0).random((1, 256, 256), np.float32))
    assert "Write error" in str(gdal.value.__context__ or gdal.value)  # GDAL's own words
    error = CubeWriteError.writing(tif, gdal.value)
    assert isinstance(error, DiskFullError) and str(error).startswith(
        f"[CC309] no space left on {full_disk} (writing {tif}); the previous version"
    )


# --------------------------------------------------------------------------------------------
# Names and places: refused before any file is touched


@pytest.mark.parametrize(
    ("city", "year", "error", "says"),
    [
        ("../x", YEAR, UnknownCityError, "unknown city '../x'; choose one of: Amsterdam"),
        ("Boston;DROP TABLE observations", YEAR, UnknownCityError, "unknown city 'Boston;DROP"),
        ("Bоston", YEAR, UnknownCityError, "unknown city 'Bоston'"),  # Cyrillic о
        ("Boston\x00", YEAR, UnknownCityError, "unknown city 'Boston\\x00'"),
        (AMS, 1999, UnknownYearError, "year 1999 is outside the calendar 2000–"),
        (AMS, 2999, UnknownYearError, "2999 from 15 January 3000"),
    ],
    ids=["path-traversal", "sql", "homoglyph", "nul", "year-1999", "year-2999"],
)
def test_hostile_names_reach_no_file(
    tmp_path: Path,
    sample: dict[str, SourceItem],
    city: str,
    year: int,
    error: type[CityCubeError],
    says: str,
) -> None:
    release = Release(tmp_path / "data", "t")
    sources = _source_set([sample["odiac"]])
    with pytest.raises(error, match=f"\\[{error.code}\\]") as raised:
        process_partition(CAT.get("CO2"), CAT, city, year, sources, release)
    assert says in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("code", "in_the_way"),
    [("CO2", ".draft/observations"), ("CO2", ".draft/derived/CO2"), ("DEM", "chips/DEM")],
)
def test_a_file_in_place_of_a_release_folder_is_a_write_error_that_keeps_the_rest(
    tmp_path: Path,
    baseline: tuple[Path, list[SourceItem]],
    sample: dict[str, SourceItem],
    code: str,
    in_the_way: str,
) -> None:
    good_root, good_items = baseline
    data = tmp_path / "data"
    shutil.copytree(good_root, data)
    release = Release(data, "t")
    blocker = release.root / in_the_way
    shutil.rmtree(blocker)
    blocker.write_text("not a folder")
    before = _hashes(data)
    sources = _source_set([*good_items, sample["odiac"]])
    with pytest.raises(CubeWriteError) as raised:
        process_partition(_modality(code), CAT, AMS, YEAR, sources, release)
    message = str(raised.value)
    assert message.startswith(f"[CC300] {code} {AMS} ")
    assert "writable directory" in message and "run the same command again" in message
    after = _hashes(data)
    assert {k: after.get(k) for k in before} == before
    assert not [p for p in data.rglob("*") if ".tmp-" in p.name]


# --------------------------------------------------------------------------------------------
# The command line: wrong arguments and places are refused before anything is written


@pytest.fixture
def not_writable(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot create files in (root ignores modes: use /proc)."""
    if os.geteuid() == 0:
        yield Path("/proc/citycube-not-writable")
        return
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    yield folder / "data"
    folder.chmod(0o700)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cities", "../etc"], "[CC101] unknown city '../etc'; choose one of"),
        (["--years", "2021-2019"], "[CC102] year range '2021-2019' is reversed; write it as"),
        (["--years", "2020,1999"], "[CC102] year 1999 is outside the calendar"),
        (["--assets", "derived/opx"], "[CC107] --assets derived/opx matches no asset; give"),
    ],
    ids=["city-traversal", "reversed-years", "year-1999-in-a-list", "asset-typo"],
)
def test_bad_build_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    command = ["--data", str(tmp_path / "data"), "build", "--cities", AMS, "--years", "2020"]
    assert main([*command, *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_unknown_evaluation_targets_are_named_with_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["--data", str(tmp_path / "data"), "evaluate", "--targets", "BOGUS,XYZ"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "[CC103] unknown target(s) BOGUS, XYZ; choose target codes from " in err
    assert "POP" in err and "LC" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_the_first_seconds_of_a_build_says_so_without_a_traceback(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the build command is still loading its libraries (before the build's own
    stop handler is installed) ends it with a message and exit 130, not a traceback."""
    import signal
    import subprocess
    import sys
    import time

    data = tmp_path / "data"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "CITYCUBE_DATA": str(data)}
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(data), "build"]
    process = subprocess.Popen(
        [*command, "--cities", AMS, "--years", "2020"],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        maps = Path(f"/proc/{process.pid}/maps")
        deadline = time.monotonic() + 60
        # the command's own imports (pyarrow, duckdb) are under way: main() is running
        while "pyarrow" not in maps.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "stopped by Ctrl-C; files are written whole or not at all" in err
    assert not data.exists()


def _damage_database(how: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        size = path.stat().st_size
        if how == "cut":
            with open(path, "r+b") as handle:
                handle.truncate(size // 3)
            return
        with open(path, "r+b") as handle:
            handle.seek({"header": 0, "block": 4096}[how])
            handle.write(bytes(range(256)) * 16)

    return damage


@pytest.mark.parametrize("how", ["header", "block", "cut"])
def test_a_damaged_release_database_is_called_damaged_not_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    import duckdb

    database = Release(tmp_path / "data", "t").duckdb_file
    database.parent.mkdir(parents=True)
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE tiles AS SELECT '2km' AS scale, range AS i FROM range(100000)")
    _damage_database(how)(database)
    assert main(["--data", str(tmp_path / "data"), "--release", "t", "summary"]) == 2
    err = capsys.readouterr().err
    assert f"[CC308] cannot read {database} (" in err and "Traceback" not in err
    assert "damaged, cut short or not a DuckDB database. Rebuild the release" in err
    assert "another process" not in err


def test_a_release_database_another_process_holds_is_called_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys

    import duckdb

    database = Release(tmp_path / "data", "t").duckdb_file
    database.parent.mkdir(parents=True)
    duckdb.connect(str(database)).close()
    hold = f"import duckdb, sys; c = duckdb.connect({str(database)!r}); print(1, flush=True); "
    holder = subprocess.Popen(
        [sys.executable, "-c", hold + "sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        assert main(["--data", str(tmp_path / "data"), "--release", "t", "summary"]) == 2
    finally:
        holder.communicate("", timeout=30)
    err = capsys.readouterr().err
    assert f"[CC304] cannot open {database} (" in err and "another process holds it" in err


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        (b"\x00garbage", "cannot serialize ref json"),
        (b'{"snapshot":"ZZZZZZZZZZZZZZZZZZZG"}', "not found"),
    ],
    ids=["garbled-ref", "ref-to-a-missing-snapshot"],
)
def test_a_chip_store_with_a_damaged_ref_is_called_damaged_by_readers_and_gc(
    tmp_path: Path, ref: bytes, says: str
) -> None:
    """What `render` and `gc` meet: a damaged ref is neither a traceback nor a write error."""
    from datetime import UTC, datetime

    from citycube.cube.chips import open_chips
    from citycube.cube.chips_icechunk import collect_store_garbage
    from citycube.errors import CorruptReleaseError
    from tests.test_icechunk_chips import _write

    store = tmp_path / "chips" / "LC" / AMS / "2020.icechunk"
    _write(store, 1)
    (store / "refs" / "branch.main" / "ref.json").write_bytes(ref)
    with pytest.raises(CorruptReleaseError) as read, open_chips(store) as chips:
        chips["data"].values  # noqa: B018  (reading is what fails)
    with pytest.raises(CorruptReleaseError) as collected:
        collect_store_garbage(store, datetime.now(UTC))
    for raised in (read, collected):
        message = str(raised.value)
        assert message.startswith(f"[CC308] the chip store {store} is damaged: ")
        assert says in message and "Rebuild its partition" in message
        assert "read-only or full disk" not in message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("case_id,prediction\nA_1,2.5\nA_2,about 3\n", "line 3, column 'prediction': 'about 3'"),
        ('case_key,value\nk1,1\nk2,"1,234.5"\n', "line 3, column 'value': '1,234.5'"),
        ("case_id,prediction\nA_1,2.5,9\n", "cannot read {path} as CSV (CSV parse error"),
    ],
    ids=["words", "thousands-separator", "ragged"],
)
def test_a_forecast_predictions_file_with_text_names_the_file_and_column(
    tmp_path: Path, text: str, says: str
) -> None:
    from citycube.errors import InputFileError
    from pipelines.cli import read_predictions

    path = tmp_path / "mine.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputFileError) as raised:
        read_predictions(path)
    message = str(raised.value)
    assert message.startswith(f"[CC108] {path} ") or message.startswith("[CC108] cannot read")
    assert says.format(path=path) in message


def test_a_data_root_that_cannot_be_written_is_refused(
    tmp_path: Path, not_writable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["--data", str(not_writable), "build", "--cities", AMS, "--years", "2020"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"the data root (CITYCUBE_DATA) {not_writable} is not a writable directory" in err
    assert "point the data root (CITYCUBE_DATA) at a directory you can write to" in err


def test_a_dagster_home_that_is_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.write_text("a file")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    command = ["--data", str(tmp_path / "data"), "build", "--cities", AMS, "--years", "2020"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"DAGSTER_HOME {home} is a file, not a directory; point DAGSTER_HOME at a" in err
    assert home.read_text() == "a file"


def test_a_failed_fetch_names_the_source_city_and_year(tmp_path: Path) -> None:
    """Adapters name the file or URL; the fetch task adds what the item was for."""
    from citycube.errors import SourceFetchError
    from pipelines.partition_work import fetch_source

    class Refusing(ServedItems):
        def source_years(self, city: str) -> list[int] | None:
            return [YEAR]

        def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
            raise SourceFetchError("https://example.org/odiac.tif answered 503; retry later")

    sources = SourceSet([Refusing("odiac", [])], name="refusing")
    with pytest.raises(SourceFetchError) as raised:
        fetch_source(
            sources, "odiac", CAT.get("CO2").temporal, AMS, YEAR, True, Release(tmp_path, "t")
        )
    assert str(raised.value) == (
        "[CC202] source odiac (test:odiac) for Amsterdam, source year 2020: "
        "https://example.org/odiac.tif answered 503; retry later"
    )
    assert raised.value.transient  # still retried by the source assets' policy


# --------------------------------------------------------------------------------------------
# Normalised records (the form every records connector writes): checked at the door as well


def _normalised_item(folder: Path, rows: list[dict], drop: tuple[str, ...] = ()) -> SourceItem:
    """A point records item of Boston 2020 whose declared coverage is the 4 km box of
    ``tests.test_record_forms``; ``drop`` removes declared metadata."""
    from tests.test_record_forms import SMALL_BOX, utm_to_wgs84, write_item

    coverage = gpd.GeoDataFrame(geometry=[utm_to_wgs84(SMALL_BOX)], crs=4326)
    item = write_item(folder, "point", rows, tables={"coverage": coverage})
    return replace(item, extra={k: v for k, v in item.extra.items() if k not in drop})


def _in_box(dx: float, dy: float) -> object:
    import shapely

    from tests.test_record_forms import X0, Y1

    return shapely.Point(X0 + dx, Y1 - dy)


@pytest.mark.parametrize(
    ("rows", "drop", "says"),
    [
        (
            [{"geometry": _in_box(500, 500), "value": 5e4, "year": 2019}],
            (),
            "row 1 carries year 2019, not 2020: 1 of 1 records",
        ),
        (
            [
                {"geometry": _in_box(500, 500), "value": 5e4},
                {"geometry": _in_box(30_000, 30_000), "value": 5e4},
            ],
            (),
            "has 1 of 2 usable records outside Boston's declared coverage (coverage.geojson)",
        ),
        (
            [{"geometry": _in_box(500, 500), "value": 5e4 * 1e6}],
            (),
            "row 1 holds 5e+10 kWh/year, outside the plausible 0–1e+09 kWh/year",
        ),
        (
            [{"geometry": _in_box(500, 500), "value": 5e4}],
            ("records",),
            "declares no record count ('records')",
        ),
    ],
    ids=["another-year", "outside-coverage", "in-mwh", "count-removed"],
)
def test_normalised_records_outside_their_year_area_or_unit_are_refused(
    tmp_path: Path, rows: list[dict], drop: tuple[str, ...], says: str
) -> None:
    from citycube.processing.records import place_records

    item = _normalised_item(tmp_path / "item", rows, drop)
    with pytest.raises(SourceReadError) as raised:
        place_records(item, 32619, 2020)
    message = str(raised.value)
    assert message.startswith(f"[CC201] {item.files['data']} ") and says in message
    assert FIX in message
