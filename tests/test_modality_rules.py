"""Every modality rule of AgenticCity-Bench App. B.4, exercised through ``process_partition``
on hand-made files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rasterio
from affine import Affine
from pyproj import Transformer
from shapely.geometry import LineString, Point, Polygon, box

from citycube.catalogue.modalities import ModalitySpec, load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceReadError
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.items.protocol import SourceItem, SourceSet
from citycube.processing.compute import process_partition
from tests.conftest import LocalFilesBackend, LocalFilesProduct, write_tif

CITY = "Amsterdam"  # EPSG:32631; 2 km grid 10×14 from (610000, 5810000)
EPSG = 32631
CAT = load_catalogue()
TO_WGS84 = Transformer.from_crs(EPSG, 4326, always_xy=True)


def _test_product(code: str, **extra: object) -> ModalitySpec:
    """The catalogue's modality, read from test products (the native-CRS check is skipped)."""
    m = CAT.get(code)
    update: dict[str, object] = {"product": f"test_{code.lower()}", "product_by_city": {}}
    update.update(extra)
    return m.model_copy(update=update)


def _rows(release: Release, year: int, code: str) -> dict[tuple[str, str], dict]:
    table = pq.read_table(release.observations_file(CITY, year, code)).to_pylist()
    return {(r["tile_id"], r["field"]): r for r in table}


def _grid_tif(path: Path, data: np.ndarray, res: float, nodata: float | None = None) -> Path:
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    return write_tif(
        path, data, crs=f"EPSG:{EPSG}", transform=Affine(res, 0, xmin, 0, -res, ymax), nodata=nodata
    )


@pytest.fixture
def release(tmp_path: Path) -> Release:
    return Release(tmp_path / "data", "rules")


# --------------------------------------------------------------------------- numeric rasters


def test_aq_products_are_independent(tmp_path: Path, release: Release) -> None:
    """NO2 missing in a year stays missing; PM2.5 is still released and never fills in."""
    no2 = np.full((200, 280), 20.0, np.float32)
    no2[:20, :20] = -9999.0  # tile r0c0 has no valid NO2 at all
    pm = np.full((200, 280), 9.0, np.float32)
    aq = CAT.get("AQ")
    fields = [
        aq.fields[0].model_copy(update={"product": "test_no2"}),
        aq.fields[1].model_copy(update={"product": "test_pm25"}),
    ]
    modality = aq.model_copy(update={"fields": tuple(fields)})
    backend = LocalFilesBackend(
        {
            ("test_no2", CITY, 2019): {"data": _grid_tif(tmp_path / "no2.tif", no2, 100, -9999)},
            ("test_pm25", CITY, 2019): {"data": _grid_tif(tmp_path / "pm.tif", pm, 100, -9999)},
            ("test_pm25", CITY, 2021): {"data": _grid_tif(tmp_path / "pm21.tif", pm, 100, -9999)},
        }
    )
    process_partition(modality, CAT, CITY, 2019, backend, release)
    rows = _rows(release, 2019, "AQ")
    assert rows[("Amsterdam_2KM_r0_c0", "annual_mean_no2")]["value"] is None
    assert rows[("Amsterdam_2KM_r0_c0", "annual_mean_pm25")]["value"] == pytest.approx(9.0)
    process_partition(modality, CAT, CITY, 2021, backend, release)
    rows = _rows(release, 2021, "AQ")
    no2_row = rows[("Amsterdam_2KM_r1_c1", "annual_mean_no2")]
    assert no2_row["value"] is None and no2_row["reason"] == "source_year_missing"
    assert rows[("Amsterdam_2KM_r1_c1", "annual_mean_pm25")]["value"] == pytest.approx(9.0)
    assert rows[("Amsterdam_2KM_r1_c1", "annual_mean_pm25")]["source_year"] == 2021


def _scaled_tif(path: Path, celsius: float, scale: float, offset: float) -> Path:
    raw = np.full((200, 280), round((celsius - offset) / scale), np.uint16)
    raw[0, 0] = 65535
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=280,
        height=200,
        count=1,
        dtype="uint16",
        crs=f"EPSG:{EPSG}",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
        nodata=65535,
    ) as ds:
        ds.write(raw, 1)
        ds.scales = (scale,)
        ds.offsets = (offset,)
    return path


def test_weather_fields_are_area_means_with_file_scale_offset(
    tmp_path: Path, release: Release
) -> None:
    """Six independent files; °C from K×10 storage; precipitation is a mean, not a sum."""
    wth = _test_product("WTH")
    values = {"tasmin": 2.0, "tasmax": 14.0, "tas": 8.0, "pr": 800.0, "rsds": 120.0, "hurs": 80.0}
    files = {}
    for role, v in values.items():
        scale, offset = (0.1, -273.15) if role.startswith("tas") else (0.1, 0.0)
        files[role] = _scaled_tif(tmp_path / f"{role}.tif", v, scale, offset)
    backend = LocalFilesBackend({("test_wth", CITY, 2020): files})
    process_partition(wth, CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "WTH")
    tile = "Amsterdam_2KM_r3_c3"
    assert rows[(tile, "tmean_c")]["value"] == pytest.approx(8.0, abs=0.06)
    assert rows[(tile, "tmin_c")]["value"] == pytest.approx(2.0, abs=0.06)
    assert rows[(tile, "prcp_mm")]["value"] == pytest.approx(800.0, abs=0.06)  # not ×400 cells
    assert rows[(tile, "rh_fraction")]["unit"] == "%"


class _ItemWithoutRoles(LocalFilesProduct):
    """Hand-made files whose items declare roles they do not publish."""

    def __init__(self, product_id: str, items: dict, missing: dict[str, str]) -> None:
        super().__init__(product_id, items)
        self.missing = missing

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        item = super().fetch(city, source_year, dest)
        return replace(item, missing_roles=self.missing, fingerprint="")


def _weather_files(tmp_path: Path, roles: list[str]) -> dict[str, Path]:
    values = {"tasmin": 2.0, "tasmax": 14.0, "tas": 8.0, "pr": 800.0, "rsds": 120.0, "hurs": 80.0}
    files = {}
    for role in roles:
        scale, offset = (0.1, -273.15) if role.startswith("tas") else (0.1, 0.0)
        files[role] = _scaled_tif(tmp_path / f"{role}.tif", values[role], scale, offset)
    return files


def test_a_role_the_item_does_not_publish_is_unavailable_with_its_reason(
    tmp_path: Path, release: Release
) -> None:
    """Fields of an unpublished role are NULL with the item's reason; the others keep values."""
    wth = _test_product("WTH")
    files = _weather_files(tmp_path, ["tasmin", "tasmax", "tas", "pr"])
    missing = {"rsds": "variable_not_published", "hurs": "variable_not_published"}
    adapter = _ItemWithoutRoles("test_wth", {(CITY, 2020): files}, missing)
    process_partition(wth, CAT, CITY, 2020, SourceSet([adapter]), release)
    rows = _rows(release, 2020, "WTH")
    tiles = {tile for tile, _ in rows}
    for tile in tiles:
        for name in ("srad_w_m2", "rh_fraction"):
            assert rows[(tile, name)]["value"] is None
            assert rows[(tile, name)]["reason"] == "variable_not_published"
            assert rows[(tile, name)]["available"] is False
    tile = "Amsterdam_2KM_r3_c3"
    assert rows[(tile, "tmin_c")]["value"] == pytest.approx(2.0, abs=0.06)
    assert rows[(tile, "prcp_mm")]["value"] == pytest.approx(800.0, abs=0.06)
    assert rows[(tile, "tmean_c")]["available"] is True


def test_a_role_missing_without_a_declared_reason_is_an_error(
    tmp_path: Path, release: Release
) -> None:
    """An adapter that drops a role silently must not produce a quiet gap in the cube."""
    wth = _test_product("WTH")
    files = _weather_files(tmp_path, ["tasmin", "tasmax", "tas", "pr", "rsds"])
    adapter = _ItemWithoutRoles("test_wth", {(CITY, 2020): files}, {})
    with pytest.raises(SourceReadError, match="hurs"):
        process_partition(wth, CAT, CITY, 2020, SourceSet([adapter]), release)


def test_a_product_that_cannot_serve_a_period_hands_it_to_its_fallback(
    tmp_path: Path, release: Release
) -> None:
    """Fallback order: the first product that serves the city-year is read for every field;
    when none serves, the first choice's reason stays."""
    wth = _test_product("WTH", fallback_products={"test_wth": ("test_chelsa",)})
    files = _weather_files(tmp_path, ["tasmin", "tasmax", "tas", "pr", "rsds", "hurs"])
    first = LocalFilesProduct("test_wth", {(CITY, 2019): files})
    second = LocalFilesProduct("test_chelsa", {(CITY, 2020): files}, source_id="test:second")
    sources = SourceSet([first, second])
    process_partition(wth, CAT, CITY, 2020, sources, release)  # first has no 2020
    rows = _rows(release, 2020, "WTH")
    tile = "Amsterdam_2KM_r3_c3"
    assert rows[(tile, "tmin_c")]["value"] == pytest.approx(2.0, abs=0.06)
    assert {r["source_id"] for r in rows.values()} == {"test:second"}
    process_partition(wth, CAT, CITY, 2019, sources, release)  # first serves 2019
    assert {r["source_id"] for r in _rows(release, 2019, "WTH").values()} == {"test:test_wth"}
    process_partition(wth, CAT, CITY, 2021, sources, release)  # neither serves 2021
    rows = _rows(release, 2021, "WTH")
    assert {r["source_id"] for r in rows.values()} == {"test:test_wth"}
    assert {r["reason"] for r in rows.values()} == {"source_year_missing"}


def test_fallbacks_must_name_a_product_the_modality_reads() -> None:
    wth = CAT.get("WTH").model_dump()
    wth["fallback_products"] = {"odiac": ["chelsa"]}
    with pytest.raises(ValueError, match="does not read"):
        ModalitySpec.model_validate(wth)
    wth["fallback_products"] = {"daymet": ["daymet"]}
    with pytest.raises(ValueError, match="distinct other products"):
        ModalitySpec.model_validate(wth)
    assert CAT.get("WTH").fallbacks("daymet") == ("chelsa",)


def test_weather_uses_daymet_roles_in_north_america() -> None:
    wth = CAT.get("WTH")
    product, fields = wth.field_groups("Boston")[0]
    assert product == "daymet"
    assert [f.role_for(product) for f in fields] == ["tmin", "tmax", "tmean", "prcp", "srad", "rh"]
    assert wth.field_groups("London")[0][0] == "chelsa"


def test_heat_converts_kelvin_and_keeps_zero_celsius(tmp_path: Path, release: Release) -> None:
    data = np.stack(
        [np.full((200, 280), 273.15, np.float32), np.full((200, 280), 300.0, np.float32)]
    )
    backend = LocalFilesBackend(
        {("test_heat", CITY, 2020): {"data": _grid_tif(tmp_path / "st.tif", data, 100, -9999)}}
    )
    process_partition(_test_product("HEAT"), CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "HEAT")
    assert rows[("Amsterdam_2KM_r2_c2", "mean_c")]["value"] == pytest.approx(0.0, abs=1e-4)
    assert rows[("Amsterdam_2KM_r2_c2", "median_c")]["value"] == pytest.approx(26.85, abs=1e-4)


def test_night_lights_zero_radiance_is_valid(tmp_path: Path, release: Release) -> None:
    backend = LocalFilesBackend(
        {
            ("test_ntl", CITY, 2020): {
                "data": _grid_tif(
                    tmp_path / "ntl.tif", np.zeros((200, 280), np.float32), 100, -9999
                )
            }
        }
    )
    process_partition(_test_product("NTL"), CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "NTL")[("Amsterdam_2KM_r2_c2", "radiance")]
    assert row["available"] and row["value"] == 0.0


def _indicators(tmp_path: Path, cpi_year: float | None) -> dict[str, Path]:
    def payload(indicator: str, values: dict[int, float | None]) -> list:
        records = [
            {
                "indicator": {"id": indicator},
                "country": {"id": "NL"},
                "countryiso3code": "NLD",
                "date": str(y),
                "value": v,
            }
            for y, v in values.items()
        ]
        return [{"page": 1, "pages": 1, "total": len(records)}, records]

    cpi = tmp_path / "cpi.json"
    ppp = tmp_path / "ppp.json"
    cpi.write_text(json.dumps(payload("FP.CPI.TOTL", {2017: 110.0, 2020: cpi_year})))
    ppp.write_text(json.dumps(payload("PA.NUS.PPP", {2017: 0.8, 2020: 0.79})))
    return {"cpi": cpi, "ppp": ppp}


@pytest.mark.parametrize("cpi_2020", [121.0, None])
def test_property_in_2017_ppp_keeps_local_value(
    tmp_path: Path, release: Release, cpi_2020: float | None
) -> None:
    values = np.full((200, 280), 400_000.0, np.float32)
    # the conversion reads the World Bank item registered as 'worldbank_indicators'
    prop = _test_product("PROP", auxiliary_products=("worldbank_indicators",))
    backend = LocalFilesBackend(
        {
            ("test_prop", CITY, 2020): {"data": _grid_tif(tmp_path / "p.tif", values, 100, -9999)},
            ("worldbank_indicators", CITY, None): _indicators(tmp_path, cpi_2020),
        }
    )
    process_partition(prop, CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "PROP")
    local = rows[("Amsterdam_2KM_r2_c2", "property_mean_local")]
    ppp = rows[("Amsterdam_2KM_r2_c2", "property_mean_2017ppp")]
    assert local["value"] == pytest.approx(400_000.0)
    if cpi_2020 is None:
        assert ppp["value"] is None and ppp["reason"] == "conversion_factor_missing"
    else:
        assert ppp["value"] == pytest.approx(400_000.0 * 110.0 / 121.0 / 0.8)


def test_zero_property_value_stays_available(tmp_path: Path, release: Release) -> None:
    """Positivity is a pairing rule (citycube.tasks.pairs): the release keeps a genuine zero."""
    values = np.zeros((200, 280), np.float32)
    backend = LocalFilesBackend(
        {("test_prop", CITY, 2020): {"data": _grid_tif(tmp_path / "p.tif", values, 100, -9999)}}
    )
    prop = _test_product("PROP", auxiliary_products=())
    process_partition(prop, CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "PROP")[("Amsterdam_2KM_r2_c2", "property_mean_local")]
    assert row["value"] == 0.0 and row["available"] and row["reason"] is None


def test_negative_property_value_is_invalid(tmp_path: Path, release: Release) -> None:
    values = np.full((200, 280), -5.0, np.float32)
    backend = LocalFilesBackend(
        {("test_prop", CITY, 2020): {"data": _grid_tif(tmp_path / "p.tif", values, 100, -9999)}}
    )
    prop = _test_product("PROP", auxiliary_products=())
    process_partition(prop, CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "PROP")[("Amsterdam_2KM_r2_c2", "property_mean_local")]
    assert row["value"] is None and row["reason"] == "negative_value"


SHIFTED_UTM = (
    "+proj=tmerc +lat_0=0 +lon_0=3 +k=0.9996 +x_0=600000 +y_0=0 +datum=WGS84 +units=m +no_defs"
)
"""Amsterdam's UTM zone with a false easting 100 km larger: another CRS whose cells map onto the
city's exactly (x + 100 km), so the reprojected path has hand-computable answers."""


def _median_raster() -> np.ndarray:
    """250 m cells of Amsterdam's 2 km grid: hand-made 2 km r0c0, r0c1 and 5 km r0c0.

    2 km r0c0 (pixels 0-7 × 0-7, 500 m cells of 2 × 2 pixels, row-major):
    cells 0-5 one valid pixel 100; cell 6 [200, 200]; cell 7 [260] × 4; cells 8-13
    [300, 300, 300, 5000]; cells 14-15 nodata. Valid 36 of 64 pixels. Cell medians
    100 × 6, 200, 260, 300 × 6 → tile 230; pixel mean 37,440 / 36 = 1040; pixel median 300.
    2 km r0c1: one row of 8 valid pixels (8 of 64: insufficient support).
    5 km r0c0 (pixels 0-19 × 40-59): cell columns 0-4 [10, 10], 5-9 [90, 90, 90]:
    cell medians 10 × 50, 90 × 50 → 50; valid 250 of 400; mean 14,500 / 250 = 58.
    """
    nd = -9999.0
    data = np.full((80, 112), 50.0, np.float32)
    tile = np.full((8, 8), nd, np.float32)
    for cell in range(16):
        r, c = divmod(cell, 4)
        block = tile[2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(-1)
        if cell < 6:
            block[0] = 100.0
        elif cell == 6:
            block[:2] = 200.0
        elif cell == 7:
            block[:] = 260.0
        elif cell < 14:
            block[:] = [300.0, 300.0, 300.0, 5000.0]
        tile[2 * r : 2 * r + 2, 2 * c : 2 * c + 2] = block.reshape(2, 2)
    data[:8, :8] = tile
    data[:8, 8:16] = nd
    data[0, 8:16] = 70.0
    five = np.full((20, 20), nd, np.float32)
    for r in range(10):
        for c in range(10):
            block = five[2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(-1)
            if c < 5:
                block[:2] = 10.0
            else:
                block[:3] = 90.0
            five[2 * r : 2 * r + 2, 2 * c : 2 * c + 2] = block.reshape(2, 2)
    data[:20, 40:60] = five
    return data


@pytest.mark.parametrize("crs", ["city", "shifted"])
def test_property_median_of_500m_cell_medians_by_hand(
    tmp_path: Path, release: Release, crs: str
) -> None:
    """The median of cell medians differs from the mean and from the median of pixels; it is
    available under the mean's support rule, with its reason."""
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    shifted = crs == "shifted"
    path = write_tif(
        tmp_path / "p.tif",
        _median_raster(),
        crs=SHIFTED_UTM if shifted else f"EPSG:{EPSG}",
        transform=Affine(250, 0, xmin + (100_000 if shifted else 0), 0, -250, ymax),
        nodata=-9999,
    )
    backend = LocalFilesBackend({("test_prop", CITY, 2020): {"data": path}})
    prop = _test_product("PROP", auxiliary_products=())
    process_partition(prop, CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "PROP")
    median = rows[("Amsterdam_2KM_r0_c0", "property_median_local")]
    mean = rows[("Amsterdam_2KM_r0_c0", "property_mean_local")]
    assert median["value"] == pytest.approx(230.0)
    assert mean["value"] == pytest.approx(1040.0)
    assert median["valid_fraction"] == pytest.approx(36 / 64) == mean["valid_fraction"]
    assert median["available"] and median["unit"] == "local currency (nominal, reported year)"
    five = rows[("Amsterdam_5KM_r0_c0", "property_median_local")]
    assert five["value"] == pytest.approx(50.0)
    assert rows[("Amsterdam_5KM_r0_c0", "property_mean_local")]["value"] == pytest.approx(58.0)
    assert rows[("Amsterdam_2KM_r5_c5", "property_median_local")]["value"] == pytest.approx(50.0)
    sparse = rows[("Amsterdam_2KM_r0_c1", "property_median_local")]
    assert sparse["value"] is None and sparse["reason"] == "insufficient_valid_support"
    assert rows[("Amsterdam_2KM_r0_c1", "property_mean_local")]["reason"] == sparse["reason"]


# --------------------------------------------------------------------------- points and records


def _wgs84(x: float, y: float) -> tuple[float, float]:
    return TO_WGS84.transform(x, y)


def test_gps_density_is_log1p_points_per_km2(tmp_path: Path, release: Release) -> None:
    tile = city_grid(CITY, "2km").tile(2, 3)
    xmin, ymin, _, _ = tile.bounds
    pts = [Point(*_wgs84(xmin + 100 + i, ymin + 100 + i)) for i in range(40)]
    path = tmp_path / "gps.parquet"
    gpd.GeoDataFrame({"track_id": range(40)}, geometry=pts, crs=4326).to_parquet(path)
    backend = LocalFilesBackend({("osm_gps_traces", CITY, 2015): {"data": path}})
    process_partition(CAT.get("GPS"), CAT, CITY, 2015, backend, release)
    rows = _rows(release, 2015, "GPS")
    assert rows[(tile.tile_id, "gps_trace_density_log1p")]["value"] == pytest.approx(np.log1p(10.0))
    empty = rows[("Amsterdam_2KM_r0_c0", "gps_trace_density_log1p")]
    assert empty["value"] is None and empty["reason"] == "no_trace_data"


def test_electricity_outside_coverage_is_unavailable_not_zero(
    tmp_path: Path, release: Release
) -> None:
    grid = city_grid(CITY, "2km")
    # coverage: the west 60 % of tile r0c1 and everything west of it in row 0
    x0, y0, _, y1 = grid.tile(0, 0).bounds
    cover_utm = box(x0, y0, grid.tile(0, 1).bounds[0] + 1200, y1)
    ring = [_wgs84(x, y) for x, y in cover_utm.exterior.coords]
    coverage = tmp_path / "coverage.geojson"
    gpd.GeoDataFrame(geometry=[box(0, 0, 1, 1).__class__(ring)], crs=4326).to_file(coverage)
    records = []
    for tx, ty, kwh in [
        (x0 + 500, y1 - 500, 4e6),
        (grid.tile(0, 1).bounds[0] + 300, y1 - 300, 1e6),
    ]:
        lon, lat = _wgs84(tx, ty)
        records.append(
            {"building_id": len(records), "lon": lon, "lat": lat, "year": 2016, "kwh": kwh}
        )
    records.append(
        {
            "building_id": 9,
            "lon": records[0]["lon"],
            "lat": records[0]["lat"],
            "year": 2016,
            "kwh": None,
        }
    )
    csv = tmp_path / "elec.csv"
    pd.DataFrame(records).to_csv(csv, index=False)
    backend = LocalFilesBackend(
        {("city_electricity", CITY, 2016): {"data": csv, "coverage": coverage}},
        extra={"city_electricity": {"records": "3", "blank_values": "1"}},
    )
    process_partition(CAT.get("ELEC"), CAT, CITY, 2016, backend, release)
    rows = _rows(release, 2016, "ELEC")
    full = rows[("Amsterdam_2KM_r0_c0", "electricity_kwh_km2")]
    part = rows[("Amsterdam_2KM_r0_c1", "electricity_kwh_km2")]
    out = rows[("Amsterdam_2KM_r5_c5", "electricity_kwh_km2")]
    assert full["value"] == pytest.approx(4e6 / 4) and full["temporal_basis"] == "city_record"
    assert part["value"] == pytest.approx(1e6 / 4)  # not scaled up for the missing 40 %
    assert part["valid_fraction"] == pytest.approx(0.6)
    assert out["value"] is None and out["reason"] == "outside_source_coverage"


# --------------------------------------------------------------------------- vector images


def test_roads_are_drawn_without_buffering_and_empty_tiles_are_valid(
    tmp_path: Path, release: Release
) -> None:
    tile = city_grid(CITY, "2km").tile(1, 1)
    xmin, ymin, xmax, _ = tile.bounds
    y = ymin + 1005.0  # mid-pixel row
    major = LineString([_wgs84(xmin + 5, y), _wgs84(xmax - 5, y)])
    minor = LineString([_wgs84(xmin + 5, y - 500), _wgs84(xmax - 5, y - 500)])
    path = tmp_path / "roads.gpkg"
    gpd.GeoDataFrame(
        {"highway": ["primary", "residential"], "osm_id": [1, 2]}, geometry=[major, minor], crs=4326
    ).to_file(path, layer="roads")
    backend = LocalFilesBackend({("osm_roads", CITY, 2016): {"data": path}})
    process_partition(CAT.get("RD"), CAT, CITY, 2016, backend, release)
    rows = _rows(release, 2016, "RD")
    road = rows[(tile.tile_id, "road_fraction")]
    # a 2 km line one pixel wide at 10 m: about 200 of 40,000 pixels, never a buffered band
    assert 190 / 40000 <= road["value"] <= 212 / 40000
    empty = rows[("Amsterdam_2KM_r5_c5", "road_fraction")]
    assert empty["available"] and empty["value"] == 0.0


def test_poi_classes_zero_and_one_are_valid(tmp_path: Path, release: Release) -> None:
    tile = city_grid(CITY, "2km").tile(2, 2)
    xmin, ymin, _, _ = tile.bounds

    def poly(x: float, y: float, size: float):
        return box(*_wgs84(x, y), *_wgs84(x + size, y + size))

    frame = gpd.GeoDataFrame(
        {"building": ["yes", "house", "yes"], "amenity": [None, None, "school"]},
        geometry=[
            poly(xmin, ymin, 1500),
            poly(xmin + 1600, ymin, 300),
            poly(xmin, ymin + 1600, 300),
        ],
        crs=4326,
    )
    path = tmp_path / "b.gpkg"
    frame.to_file(path, layer="buildings")
    backend = LocalFilesBackend({("osm_buildings", CITY, 2016): {"data": path}})
    process_partition(CAT.get("POI"), CAT, CITY, 2016, backend, release)
    rows = _rows(release, 2016, "POI")
    assert rows[(tile.tile_id, "dominant_class")]["value"] == 1.0  # unlabelled building dominates
    assert rows[("Amsterdam_2KM_r5_c5", "dominant_class")]["value"] == 0.0  # no building: valid


def test_building_height_zero_is_valid_and_static(tmp_path: Path, release: Release) -> None:
    tile = city_grid(CITY, "2km").tile(2, 2)
    xmin, ymin, _, _ = tile.bounds
    frame = gpd.GeoDataFrame(
        {"height": [30.0]},
        geometry=[box(*_wgs84(xmin, ymin), *_wgs84(xmin + 1000, ymin + 1000))],
        crs=4326,
    )
    path = tmp_path / "h.gpkg"
    frame.to_file(path, layer="buildings")
    backend = LocalFilesBackend({("globfp_height", CITY, None): {"data": path}})
    summary = process_partition(CAT.get("HF"), CAT, CITY, 2011, backend, release)
    assert summary.basis == "static"
    rows = _rows(release, 2011, "HF")
    assert rows[(tile.tile_id, "height_m")]["value"] == pytest.approx(30.0 / 4, rel=0.02)
    assert rows[("Amsterdam_2KM_r5_c5", "height_m")]["value"] == 0.0


# --------------------------------------------------------------------------- raster images


def _chip_grid_tif(path: Path, data: np.ndarray, res: float, nodata: float) -> Path:
    grid = pixel_grid(CITY, res)
    return write_tif(path, data, crs=f"EPSG:{EPSG}", transform=grid.transform, nodata=nodata)


def test_land_use_ocean_valid_nodata_and_unknown_ids_invalid(
    tmp_path: Path, release: Release
) -> None:
    grid = pixel_grid(CITY, 250)
    data = np.zeros((grid.height, grid.width), np.uint8)  # ocean everywhere: valid
    w0 = grid.window(city_grid(CITY, "2km").tile(1, 1))
    w1 = grid.window(city_grid(CITY, "2km").tile(1, 2))
    data[w0[0], w0[1]] = 99  # 1 of 64 pixels nodata → 98.4 % valid: still available
    data[w1[0] : w1[0] + 2, w1[1]] = 13  # 2 of 64 pixels outside the legend → 96.9 %: not
    path = _chip_grid_tif(tmp_path / "lu.tif", data, 250, 99)
    backend = LocalFilesBackend({("test_lu", CITY, 2020): {"data": path}})
    process_partition(_test_product("LU"), CAT, CITY, 2020, backend, release)
    rows = _rows(release, 2020, "LU")
    assert rows[("Amsterdam_2KM_r0_c0", "dominant_class")]["value"] == 0.0
    assert rows[("Amsterdam_2KM_r1_c1", "dominant_class")]["available"] is True
    r = rows[("Amsterdam_2KM_r1_c2", "dominant_class")]
    assert r["available"] is False and r["reason"] == "insufficient_valid_pixels"


def test_built_volume_minus_9999_invalid_zero_valid(tmp_path: Path, release: Release) -> None:
    grid = pixel_grid(CITY, 100)
    data = np.zeros((grid.height, grid.width), np.float32)
    w = grid.window(city_grid(CITY, "2km").tile(0, 0))
    data[w[0] : w[0] + 2, w[1] : w[1] + 20] = -9999  # 40 of 400 invalid
    path = _chip_grid_tif(tmp_path / "bv.tif", data, 100, -9999)
    backend = LocalFilesBackend({("test_bv", CITY, 2020): {"data": path}})
    s = process_partition(_test_product("BV"), CAT, CITY, 2023, backend, release)
    assert (s.basis, s.source_year) == ("epoch", 2020)
    rows = _rows(release, 2023, "BV")
    assert (
        rows[("Amsterdam_2KM_r0_c0", "built_volume_m3_m2")]["reason"] == "insufficient_valid_pixels"
    )
    assert rows[("Amsterdam_2KM_r0_c1", "built_volume_m3_m2")]["value"] == 0.0


def test_ndvi_is_not_clipped_in_the_data(tmp_path: Path, release: Release) -> None:
    grid = pixel_grid(CITY, 25)
    data = np.full((grid.height, grid.width), 1.02, np.float32)
    data[:, ::2] = -0.2
    path = _chip_grid_tif(tmp_path / "ndvi.tif", data, 25, -9999)
    backend = LocalFilesBackend({("test_ndvi", CITY, 2020): {"data": path}})
    process_partition(_test_product("NDVI"), CAT, CITY, 2020, backend, release)
    row = _rows(release, 2020, "NDVI")[("Amsterdam_2KM_r3_c3", "ndvi")]
    assert row["value"] == pytest.approx((1.02 - 0.2) / 2, abs=1e-5)


def test_zero_electricity_stays_available(tmp_path: Path, release: Release) -> None:
    """Records that sum to zero inside the coverage are a genuine zero: released as available
    (positivity applies when pairing, in citycube.tasks.pairs)."""
    grid = city_grid(CITY, "2km")
    cover_utm = box(*grid.bounds)
    coverage = tmp_path / "coverage.geojson"
    ring = [_wgs84(x, y) for x, y in cover_utm.exterior.coords]
    gpd.GeoDataFrame(geometry=[Polygon(ring)], crs=4326).to_file(coverage)
    x0, _, _, y1 = grid.tile(0, 0).bounds
    lon, lat = _wgs84(x0 + 500, y1 - 500)
    # two ordinary buildings elsewhere keep the city's median record plausible
    bx, by, _, _ = grid.tile(2, 2).bounds
    far_lon, far_lat = _wgs84(bx + 1000, by + 1000)
    records = [(lon, lat, 0.0), (far_lon, far_lat, 5e4), (far_lon, far_lat, 6e4)]
    frame = pd.DataFrame([{"lon": x, "lat": y, "year": 2016, "kwh": kwh} for x, y, kwh in records])
    csv = tmp_path / "elec.csv"
    frame.to_csv(csv, index=False)
    backend = LocalFilesBackend(
        {("city_electricity", CITY, 2016): {"data": csv, "coverage": coverage}},
        extra={"city_electricity": {"records": "3", "blank_values": "0"}},
    )
    process_partition(CAT.get("ELEC"), CAT, CITY, 2016, backend, release)
    rows = _rows(release, 2016, "ELEC")
    for tile in ("Amsterdam_2KM_r0_c0", "Amsterdam_2KM_r4_c4"):
        row = rows[(tile, "electricity_kwh_km2")]
        assert row["value"] == 0.0 and row["available"] and row["reason"] is None
