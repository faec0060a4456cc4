"""Sample raster products beyond the core set: native forms, coverage years, coherence.

Covers landsat_ndvi, landsat_st, viirs_vnl, hilda_plus, chelsa, daymet, acag_no2, acag_pm25
and city_property, for Amsterdam and Boston and one or two years each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio
from pyproj import CRS, Transformer

from citycube.catalogue.cities import get_city, load_cities
from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_extent
from sources.sample import SYNTHETIC_NOTICE, SampleBackend, synthetic_city
from sources.sample.calendar import CITY_CALENDARS
from sources.sample.hilda import CORRUPT_IDS, LEGEND
from sources.sample.hilda import NODATA as HILDA_NODATA
from sources.sample.landsat import QA_CLOUD, QA_CLOUD_SHADOW, QA_DILATED_CLOUD, QA_FILL
from sources.sample.landsat_derived import ST_CORE_YEARS, st_years
from sources.sample.property import PROPERTY_RECORDS
from sources.sample.weather import CHELSA_ORIGIN, DAYMET_ORIGIN, DAYMET_PROJ, Daymet
from sources.sample.world import PRODUCT_MARGIN_M

AMS, BOS = "Amsterdam", "Boston"
LANDSAT_YEAR = 2012  # Landsat 7 SLC-off: stripes as well as clouds in the gaps
YEAR = 2015

CHELSA_ROLES = {"tasmin", "tasmax", "tas", "pr", "rsds", "hurs"}
DAYMET_ROLES = {"tmin", "tmax", "tmean", "prcp", "srad", "rh"}
PER_VARIABLE = {"chelsa", "daymet"}
"""Products whose items have one role per variable and no 'data' role."""

# product -> (city, year, CRS, pixel size (x, y), dtype, nodata, band count, roles)
NATIVE_FORM: dict[str, tuple[str, int, str, tuple[float, float], str, float, int, set[str]]] = {
    "landsat_ndvi": (AMS, LANDSAT_YEAR, "EPSG:32631", (30, 30), "float32", -9999, 1, {"data"}),
    "landsat_st": (AMS, LANDSAT_YEAR, "EPSG:32631", (30, 30), "float32", -9999, 2, {"data"}),
    "viirs_vnl": (AMS, YEAR, "EPSG:4326", (1 / 240, 1 / 240), "float32", -9999, 1, {"data"}),
    "hilda_plus": (AMS, YEAR, "EPSG:4326", (0.01, 0.01), "uint8", 99, 1, {"data"}),
    "chelsa": (AMS, YEAR, "EPSG:4326", (1 / 120, 1 / 120), "uint16", 65535, 1, CHELSA_ROLES),
    "daymet": (BOS, YEAR, DAYMET_PROJ, (1000, 1000), "float32", -9999, 1, DAYMET_ROLES),
    "acag_no2": (AMS, YEAR, "EPSG:4326", (0.01, 0.01), "float32", -9999, 1, {"data"}),
    "acag_pm25": (AMS, YEAR, "EPSG:4326", (0.1, 0.1), "float32", -9999, 1, {"data"}),
    "city_property": (BOS, YEAR, "EPSG:32619", (250, 250), "float32", -9999, 1, {"data"}),
}


def _read(path: Path, band: int | None = None) -> np.ndarray:
    with rasterio.open(path) as ds:
        return ds.read() if band is None else ds.read(band)


def item_files(
    backend: SampleBackend, product: str, city: str, year: int, dest: Path
) -> dict[str, Path]:
    """Files of an item by role (per-variable products have no 'data' role)."""
    return dict(backend.fetch(product, city, year, dest).files)


@pytest.fixture(scope="module")
def backend() -> SampleBackend:
    return SampleBackend()


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sample-rasters")


@pytest.fixture(scope="module")
def files(backend: SampleBackend, dest: Path) -> dict[str, dict[str, Path]]:
    """One item per product (shared by the read-only tests)."""
    return {
        product: item_files(backend, product, city, year, dest)
        for product, (city, year, *_) in NATIVE_FORM.items()
    }


# ---- native form ---------------------------------------------------------------------------


@pytest.mark.parametrize("product", sorted(NATIVE_FORM))
def test_native_form(product: str, files: dict[str, dict[str, Path]]) -> None:
    city, _, crs, res, dtype, nodata, count, roles = NATIVE_FORM[product]
    assert set(files[product]) == roles
    utm = CRS.from_epsg(get_city(city).epsg)
    for path in files[product].values():
        with rasterio.open(path) as ds:
            assert CRS.from_user_input(ds.crs) == CRS.from_user_input(crs)
            assert ds.res == pytest.approx(res, rel=1e-9)
            assert ds.count == count
            assert set(ds.dtypes) == {dtype}
            assert ds.nodatavals == (nodata,) * count
            tags = ds.tags()
            if ds.driver == "netCDF":
                tags = {k.removeprefix("NC_GLOBAL#"): v for k, v in tags.items()}
            assert tags["SYNTHETIC"] == "true"
            assert tags["CITYCUBE_PRODUCT"] == product
            assert tags["CITYCUBE_NOTICE"] == SYNTHETIC_NOTICE
            xmin, ymin, xmax, ymax = city_extent(city)
            m = PRODUCT_MARGIN_M - 1
            to_native = Transformer.from_crs(utm, ds.crs, always_xy=True)
            box = to_native.transform_bounds(xmin - m, ymin - m, xmax + m, ymax + m)
            left, bottom, right, top = ds.bounds
            assert left <= box[0] and bottom <= box[1] and right >= box[2] and top >= box[3]
            values = ds.read(1)
            sparse = product == "city_property"  # sales only where people trade homes
            assert (values != nodata).mean() > (0.15 if sparse else 0.3)


@pytest.mark.parametrize("product", sorted(NATIVE_FORM))
def test_stac_items_parse(product: str, files: dict[str, dict[str, Path]]) -> None:
    folder = next(iter(files[product].values())).parent
    stac = pystac.Item.from_file(str(folder / "item.json"))
    assert stac.properties["citycube:synthetic"] is True
    assert set(stac.assets) == set(files[product])


def test_lattices(files: dict[str, dict[str, Path]]) -> None:
    """Each product sits on its real lattice, not on an ad-hoc window."""
    with rasterio.open(files["landsat_ndvi"]["data"]) as ds:
        assert ds.transform.c % 30 == 15 and ds.transform.f % 30 == 15
    with rasterio.open(files["viirs_vnl"]["data"]) as ds:  # VNL origin -180°, 75°
        t = ds.transform
        assert ((t.c + 180) * 240) == pytest.approx(round((t.c + 180) * 240), abs=1e-6)
        assert ((75 - t.f) * 240) == pytest.approx(round((75 - t.f) * 240), abs=1e-6)
    with rasterio.open(files["chelsa"]["tas"]) as ds:  # half an arc-second off whole degrees
        t = ds.transform
        cols = (t.c - CHELSA_ORIGIN[0]) * 120
        assert cols == pytest.approx(round(cols), abs=1e-6)
        assert (t.c * 120) % 1 == pytest.approx(1 - 0.000138889 * 120, abs=1e-5)
    with rasterio.open(files["daymet"]["tmin"]) as ds:
        t = ds.transform
        assert (t.c - DAYMET_ORIGIN[0]) % 1000 == 0 and (DAYMET_ORIGIN[1] - t.f) % 1000 == 0
    with rasterio.open(files["city_property"]["data"]) as ds:
        assert ds.transform.c % 250 == 0 and ds.transform.f % 250 == 0


# ---- years and coverage ----------------------------------------------------------------------


def test_viirs_starts_in_2012(backend: SampleBackend, tmp_path: Path) -> None:
    assert backend.source_years("viirs_vnl", AMS) == list(range(2012, 2026))
    with pytest.raises(SourceUnavailableError) as err:
        backend.fetch("viirs_vnl", AMS, 2011, tmp_path)
    assert err.value.reason == "source_year_missing"


def test_daymet_is_north_america_only(backend: SampleBackend, tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailableError) as err:
        backend.fetch("daymet", AMS, YEAR, tmp_path)
    assert err.value.reason == "outside_source_coverage"
    assert not list(tmp_path.rglob("*.tif"))
    covered = {c for c in load_cities() if Daymet().city_years(c)}
    assert covered == {"Boston", "DC", "NYC", "SanFrancisco"}


def test_acag_years_are_independent(backend: SampleBackend, tmp_path: Path) -> None:
    assert backend.source_years("acag_no2", AMS) == list(range(2005, 2020))
    assert backend.source_years("acag_pm25", AMS) == list(range(2000, 2023))
    for product, year in (("acag_no2", 2020), ("acag_no2", 2004), ("acag_pm25", 2023)):
        with pytest.raises(SourceUnavailableError) as err:
            backend.fetch(product, AMS, year, tmp_path)
        assert err.value.reason == "source_year_missing"
    pm25 = backend.fetch("acag_pm25", AMS, 2020, tmp_path)  # no NO2 that year, PM2.5 stands
    assert _read(pm25.files["data"], 1).max() > 0


def test_surface_temperature_record_has_holes(backend: SampleBackend, tmp_path: Path) -> None:
    cities = list(load_cities())
    records = {c: st_years(c) for c in cities}
    assert records == {c: st_years(c) for c in cities}  # deterministic
    for city, years in records.items():
        assert len(years) == CITY_CALENDARS[city].surface_temperature
        assert len(st_years(city, seed=1)) == len(years)  # the seed moves years, not counts
    complete = [c for c, ys in records.items() if set(ST_CORE_YEARS) <= set(ys)]
    # AgenticCity-Bench's 15-city cohort
    assert sorted(complete) == sorted(set(cities) - {"Shanghai"})
    assert len(set(ST_CORE_YEARS) - set(records["Shanghai"])) >= 4
    assert sum(len(years) for years in records.values()) == 358  # AgenticCity-Bench Table 10, HEAT
    assert any(records[c] != st_years(c, seed=1) for c in cities)
    missing = min(set(range(2000, 2026)) - set(records[BOS]))
    with pytest.raises(SourceUnavailableError) as err:
        backend.fetch("landsat_st", BOS, missing, tmp_path)
    assert err.value.reason == "source_year_missing"


def test_property_city_years(backend: SampleBackend, tmp_path: Path) -> None:
    # AgenticCity-Bench Table 8's property cities plus Shanghai; 232 city-years as in Table 10.
    table_8 = {"Boston", "Busan", "CapeTown", "DC", "London", "Lyon", "NYC", "SanFrancisco"}
    table_8 |= {"Singapore", "Sydney", "Tokyo"}
    assert set(PROPERTY_RECORDS) == table_8 | {"Shanghai"}
    assert sum(len(r.years) for r in PROPERTY_RECORDS.values()) == 232
    assert PROPERTY_RECORDS["London"].years == list(range(2000, 2026))
    assert PROPERTY_RECORDS["Boston"].years == list(range(2005, 2025))
    assert PROPERTY_RECORDS["Shanghai"].years == list(range(2012, 2024))
    cases = (("Amsterdam", YEAR, "outside_source_coverage"), (BOS, 2004, "source_year_missing"))
    for city, year, reason in cases:
        with pytest.raises(SourceUnavailableError) as err:
            backend.fetch("city_property", city, year, tmp_path)
        assert err.value.reason == reason


def test_per_variable_fetch(backend: SampleBackend, tmp_path: Path) -> None:
    item = backend.fetch("chelsa", AMS, YEAR, tmp_path)
    assert set(item.files) == CHELSA_ROLES
    again = backend.fetch("chelsa", AMS, YEAR, tmp_path)  # reused, not regenerated
    assert again.files == item.files


# ---- values ----------------------------------------------------------------------------------


def test_chelsa_scale_offset_give_physical_units(files: dict[str, dict[str, Path]]) -> None:
    physical: dict[str, np.ndarray] = {}
    for role, path in files["chelsa"].items():
        with rasterio.open(path) as ds:
            raw = ds.read(1)
            scale, offset = ds.scales[0], ds.offsets[0]
            assert ds.nodata == 65535 and (raw == 65535).any()  # the sea is nodata
            physical[role] = np.where(raw == 65535, np.nan, raw * scale + offset)
    assert files["chelsa"]["tas"].name == f"CHELSA_tas_{YEAR}_V.2.1.tif"
    for role in ("tasmin", "tas", "tasmax"):
        with rasterio.open(files["chelsa"][role]) as ds:
            assert ds.scales == (0.1,) and ds.offsets == (-273.15,)
    tas = np.nanmean(physical["tas"])
    assert 5 < tas < 16  # Amsterdam, °C
    assert np.nanmean(physical["tasmin"]) < tas < np.nanmean(physical["tasmax"])
    assert 500 < np.nanmean(physical["pr"]) < 1300  # mm per year
    assert 80 < np.nanmean(physical["rsds"]) < 180  # W/m²
    assert 60 < np.nanmean(physical["hurs"]) < 100  # %


def test_daymet_values(files: dict[str, dict[str, Path]]) -> None:
    tmin, tmax, tmean = (_read(files["daymet"][role], 1) for role in ("tmin", "tmax", "tmean"))
    valid = tmean != -9999
    assert (~valid).any() and valid.mean() > 0.5
    assert np.all(tmin[valid] < tmean[valid]) and np.all(tmean[valid] < tmax[valid])
    assert 7 < tmean[valid].mean() < 16  # Boston, °C
    assert 700 < _read(files["daymet"]["prcp"], 1)[valid].mean() < 1600


def test_ndvi_shares_the_scene_gaps(
    backend: SampleBackend, files: dict[str, dict[str, Path]], dest: Path
) -> None:
    scene = backend.fetch("landsat_c2l2", AMS, LANDSAT_YEAR, dest)
    qa = _read(scene.files["qa"], 1)
    rejected = (qa & (QA_FILL | QA_DILATED_CLOUD | QA_CLOUD | QA_CLOUD_SHADOW)) > 0
    with (
        rasterio.open(files["landsat_ndvi"]["data"]) as ndvi_ds,
        rasterio.open(scene.files["data"]) as scene_ds,
    ):
        assert ndvi_ds.transform == scene_ds.transform and ndvi_ds.shape == scene_ds.shape
        ndvi = ndvi_ds.read(1)
    assert np.array_equal(ndvi == -9999, rejected)
    assert 0.01 < rejected.mean() < 0.9
    st = _read(files["landsat_st"]["data"])
    assert np.array_equal((st == -9999).all(axis=0), rejected)
    assert np.array_equal((st == -9999).any(axis=0), rejected)


def test_ndvi_values(files: dict[str, dict[str, Path]]) -> None:
    ndvi = _read(files["landsat_ndvi"]["data"], 1)
    valid = ndvi[ndvi != -9999]
    assert np.isfinite(valid).all()
    outside = np.abs(valid) > 1
    assert outside.any() and (valid > 1).any() and (valid < -1).any()
    assert outside.mean() < 1e-3 and np.abs(valid).max() < 1.1
    assert (valid < 0).mean() > 0.02  # water
    assert np.median(valid) > 0.2


def test_surface_temperature_kelvin_and_heat_island(files: dict[str, dict[str, Path]]) -> None:
    st = _read(files["landsat_st"]["data"])
    ndvi = _read(files["landsat_ndvi"]["data"], 1)
    valid = (st[0] != -9999) & (ndvi > 0.05)  # land
    mean_k, median_k = st[0][valid], st[1][valid]
    assert mean_k.min() > 260 and mean_k.max() < 330
    assert 285 < mean_k.mean() < 305  # Kelvin, not °C
    assert np.mean(median_k <= mean_k) > 0.9
    assert np.corrcoef(mean_k, ndvi[valid])[0, 1] < -0.3  # roofs hot, vegetation cool


def test_hilda_ids_and_sea(files: dict[str, dict[str, Path]]) -> None:
    with rasterio.open(files["hilda_plus"]["data"]) as ds:
        ids = ds.read(1)
        t = ds.transform
    present = set(np.unique(ids).tolist())
    assert present <= set(LEGEND) | {HILDA_NODATA} | set(CORRUPT_IDS)
    corrupt = np.isin(ids, CORRUPT_IDS)
    assert 0 < corrupt.sum() <= 10
    assert 0 < (ids == HILDA_NODATA).mean() < 0.05
    assert {0, 11, 22}.issubset(present)
    # Sea where the world is sea: sample 5 × 5 points per cell.
    world = synthetic_city(AMS)
    h, w = ids.shape
    sub = (np.arange(5) + 0.5) / 5
    lon = t.c + t.a * (np.arange(w)[:, None] + sub).ravel()
    lat = t.f + t.e * (np.arange(h)[:, None] + sub).ravel()
    lon2, lat2 = np.meshgrid(lon, lat)
    x, y = Transformer.from_crs("EPSG:4326", world.crs, always_xy=True).transform(lon2, lat2)
    sea = world.points(x, y).sea.reshape(h, 5, w, 5).mean(axis=(1, 3))
    damaged = corrupt | (ids == HILDA_NODATA)
    assert (sea == 1).sum() > 10
    assert np.all(ids[(sea == 1) & ~damaged] == 0)
    assert not np.any(ids[(sea == 0) & ~damaged] == 0)


def test_viirs_dark_and_bright(backend: SampleBackend, files: dict[str, dict[str, Path]]) -> None:
    radiance = _read(files["viirs_vnl"]["data"], 1)
    valid = radiance != -9999
    assert (radiance[valid] == 0).mean() > 0.01  # masked background: dark, valid
    assert radiance[valid].max() > 30
    assert (~valid).mean() < 0.01
    later = backend.fetch("viirs_vnl", AMS, 2024, files["viirs_vnl"]["data"].parents[3])
    grown = _read(later.files["data"], 1)
    both = valid & (grown != -9999)
    assert grown[both].sum() > radiance[both].sum()  # slight growth over the years


def test_property_values_and_tags(
    backend: SampleBackend, files: dict[str, dict[str, Path]]
) -> None:
    path = files["city_property"]["data"]
    with rasterio.open(path) as ds:
        values = ds.read(1)
        assert ds.tags()["CURRENCY"] == "USD"
        assert ds.tags()["PRICE_YEAR"] == str(YEAR)
    item = backend.fetch("city_property", BOS, YEAR, path.parents[3])
    assert item.extra["currency"] == "USD"
    sold = values != -9999
    assert (values[sold] > 0).all()
    assert 0.1 < sold.mean() < 0.9
    # No sales over water (the world's sea and river at cell centres).
    world = synthetic_city(BOS)
    with rasterio.open(path) as ds:
        t, (h, w) = ds.transform, ds.shape
    x = t.c + 250 * (np.arange(w) + 0.5)[None, :]
    y = t.f - 250 * (np.arange(h) + 0.5)[:, None]
    water = world.points(x, y).water
    assert water.sum() > 100 and sold[water].mean() < 0.05
    earlier = _read(backend.fetch("city_property", BOS, 2006, path.parents[3]).files["data"], 1)
    assert np.median(values[sold]) > 1.2 * np.median(earlier[earlier != -9999])


def test_netcdf_opens_directly(files: dict[str, dict[str, Path]]) -> None:
    for product, variable, cell in (("acag_no2", "no2", 0.01), ("acag_pm25", "pm25", 0.1)):
        path = files[product]["data"]
        assert path.suffix == ".nc"
        with rasterio.open(path) as ds:
            assert ds.driver == "netCDF" and not ds.subdatasets
            assert ds.crs.to_epsg() == 4326
            assert ds.nodata == -9999 and ds.dtypes == ("float32",)
            t = ds.transform
            assert t.a == pytest.approx(cell) and t.e == pytest.approx(-cell) and t.b == t.d == 0
            assert t.c / cell == pytest.approx(round(t.c / cell), abs=1e-6)
            assert t.f / cell == pytest.approx(round(t.f / cell), abs=1e-6)
            assert ds.tags(1)["NETCDF_VARNAME"] == variable
            assert ds.tags()["NC_GLOBAL#Conventions"].startswith("CF-")
            values = ds.read(1)
        valid = values[values != -9999]
        assert valid.size and (valid > 0).all()
    no2 = _read(files["acag_no2"]["data"], 1)
    assert 3 < no2[no2 != -9999].max() < 60  # ppb
    pm25 = _read(files["acag_pm25"]["data"], 1)
    assert 3 < pm25[pm25 != -9999].mean() < 40  # µg/m³


# ---- determinism -----------------------------------------------------------------------------


def test_deterministic_and_seeded(files: dict[str, dict[str, Path]], tmp_path: Path) -> None:
    again = SampleBackend()
    other = SampleBackend(seed=1)
    for product in ("acag_no2", "hilda_plus", "city_property", "chelsa"):
        city, year, *_ = NATIVE_FORM[product]
        first = files[product]
        second = item_files(again, product, city, year, tmp_path / "again")
        reseeded = item_files(other, product, city, year, tmp_path / "other")
        for role, path in first.items():
            assert np.array_equal(_read(second[role]), _read(path)), (product, role)
        role = next(iter(first))
        assert not np.array_equal(_read(reseeded[role]), _read(first[role])), product
    # NetCDF bytes carry no timestamp, so a regenerated file is identical.
    digest = [
        hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (
            files["acag_no2"]["data"],
            tmp_path / "again" / "acag_no2" / AMS / str(YEAR) / files["acag_no2"]["data"].name,
        )
    ]
    assert digest[0] == digest[1]
    marker = json.loads((files["acag_no2"]["data"].parent / "_complete.json").read_text())
    assert marker["files"] == {"data": files["acag_no2"]["data"].name}
