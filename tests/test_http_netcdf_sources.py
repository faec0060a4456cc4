"""ACAG air quality and HILDA+ land use from the http family, on a loopback server.

Served files are written here in their published forms: CF NetCDF on ascending latitudes for
SatPM2.5 (variable GWRPM25) and HILDA+ (LULC_states on time, lat, lon), a GeoTIFF per year for
surface NO2, on their real lattices and under their real names. Items are compared with an
independent numpy computation over the same arrays (flipped north-up, invalid cells as NaN, class
ids mapped to the twin's legend), and read back through the processing readers. Faults: 404, a
corrupt file, a year the product does not publish, a year missing from a multi-year file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from rasterio.windows import Window
from scipy.io import netcdf_file

from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.readers import open_masked_source
from sources.http import http_adapters
from sources.http.base import HttpSource, city_window
from sources.http.spec import load_http_products
from tests.faulty_http_server import FaultyServer
from tests.http_products_fixtures import Patch, patch_around, patch_shape, tif_bytes

SPECS = load_http_products()
CITY = "Amsterdam"


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def adapter(product: str, server: FaultyServer, tmp_path: Path) -> HttpSource:
    """One adapter pointed at the loopback server, patient only briefly."""
    (found,) = http_adapters(
        {
            "cache_dir": tmp_path / "cache",
            "products": [product],
            "base_urls": {product: server.url("")},
            "attempts": 2,
            "wait_initial_s": 0.01,
            "wait_max_s": 0.02,
            "timeout_s": 5.0,
        }
    )
    return found


def netcdf_bytes(
    tmp_path: Path,
    name: str,
    patch: Patch,
    variable: str,
    dtype: str,
    attributes: dict[str, Any],
    times: list[int] | None = None,
    time_units: str = "year",
) -> bytes:
    """A CF NetCDF of ``patch`` (north-up rows; stacked by time when ``times``) on ascending
    latitude and longitude coordinates, as ACAG and HILDA+ publish theirs."""
    values = patch.values if times else patch.values[None]
    _, rows, cols = values.shape
    t = patch.transform
    lat = t.f + (np.arange(rows)[::-1] + 0.5) * t.e  # ascending: the south row first
    lon = t.c + (np.arange(cols) + 0.5) * t.a
    path = tmp_path / name
    with netcdf_file(path, "w") as nc:
        nc.createDimension("lat", rows)
        nc.createDimension("lon", cols)
        la = nc.createVariable("lat", "f8", ("lat",))
        la[:] = lat
        la.units, la.standard_name = "degrees_north", "latitude"
        lo = nc.createVariable("lon", "f8", ("lon",))
        lo[:] = lon
        lo.units, lo.standard_name = "degrees_east", "longitude"
        dims: tuple[str, ...] = ("lat", "lon")
        if times:
            nc.createDimension("time", len(times))
            tv = nc.createVariable("time", "i4", ("time",))
            tv[:] = times
            tv.units = time_units
            dims = ("time", "lat", "lon")
        var = nc.createVariable(variable, dtype, dims)
        var[:] = values[:, ::-1, :] if times else values[0, ::-1, :]
        for key, value in attributes.items():
            setattr(var, key, value)
    return path.read_bytes()


def read_item(path: Path) -> tuple[np.ndarray, Any, float | None, str, str]:
    """(values, NaN where nodata; transform; nodata; dtype; NetCDF variable) of an item file."""
    with rasterio.open(path) as ds:
        raw = ds.read(1).astype(np.float64)
        values = np.where(raw == ds.nodata, np.nan, raw)
        return values, ds.transform, ds.nodata, ds.dtypes[0], ds.tags(1).get("NETCDF_VARNAME", "")


def window(patch: Patch, product: str) -> np.ndarray:
    return patch.window_of(city_window(CITY, SPECS[product])).astype(np.float64)


# ------------------------------------------------------------------------------- SatPM2.5


def serve_pm25(server: FaultyServer, tmp_path: Path, year: int) -> Patch:
    """A V5GL04 annual file around the city: µg/m³, NaN sea cells and a few declared fills."""
    spec = SPECS["acag_pm25"]
    rng = np.random.default_rng(year)
    shape = patch_shape(CITY, spec)
    values = rng.gamma(4.0, 3.0, shape).astype(np.float32)
    values[0, :] = values[5, 6] = np.nan  # sea
    values[rng.random(shape) < 0.05] = values[4, 5] = -999.0  # the declared fill
    patch = Patch(patch_around(CITY, spec), values)
    name = f"V5GL04.HybridPM25c_0p10.Global.{year}01-{year}12.nc"
    body = netcdf_bytes(
        tmp_path, name, patch, "GWRPM25", "f4", {"_FillValue": np.float32(-999.0), "units": "ug/m3"}
    )
    server.add(name, body)
    return patch


def test_pm25_netcdf_is_cut_to_the_city_in_the_twins_form(
    tmp_path: Path, server: FaultyServer
) -> None:
    patch = serve_pm25(server, tmp_path, 2018)
    item = adapter("acag_pm25", server, tmp_path).fetch(CITY, 2018, tmp_path / "s")

    path = Path(item.href("data"))
    assert path.name == "V5GL04.HybridPM25c_0p10.Global.201801-201812.nc"
    values, transform, nodata, dtype, variable = read_item(path)
    assert (nodata, dtype, variable) == (-9999.0, "float32", "pm25")
    assert transform.almost_equals(city_window(CITY, SPECS["acag_pm25"]).transform)
    expected = window(patch, "acag_pm25")
    expected[(expected == -999.0) | ~np.isfinite(expected)] = np.nan
    assert np.isnan(expected).sum() >= 2 and np.isfinite(expected).sum() > 15
    np.testing.assert_allclose(values, expected, rtol=1e-6, equal_nan=True)
    assert item.source_id == "http:acag_pm25" and item.version == "V5.GL.04"
    assert not item.synthetic

    aq = load_catalogue().get("AQ")
    with open_masked_source(item, aq, [1]) as masked:
        read, valid = masked.read(Window(0, 0, masked.grid.width, masked.grid.height))
    assert valid.sum() == np.isfinite(expected).sum()
    assert read[0][valid].sum() == pytest.approx(np.nansum(expected), rel=1e-6)


def test_a_corrupt_netcdf_names_source_city_year_and_file(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_pm25(server, tmp_path, 2011)
    name = "V5GL04.HybridPM25c_0p10.Global.201101-201112.nc"
    server.files["/" + name] = server.files["/" + name][:300]  # truncated in its header
    source = adapter("acag_pm25", server, tmp_path)
    with pytest.raises(SourceReadError) as raised:
        source.fetch(CITY, 2011, tmp_path / "s")
    for part in ("http:acag_pm25", CITY, "2011", name):
        assert part in str(raised.value)
    assert source.manager.cached_path(server.url(name)) is None
    assert not (tmp_path / "s" / "acag_pm25" / CITY / "2011").exists()


def test_pm25_404_and_unpublished_years(tmp_path: Path, server: FaultyServer) -> None:
    source = adapter("acag_pm25", server, tmp_path)
    with pytest.raises(SourceFetchError, match="HTTP 404") as missing:
        source.fetch(CITY, 2004, tmp_path / "s")
    assert not missing.value.transient
    with pytest.raises(SourceUnavailableError) as unpublished:
        source.fetch(CITY, 2023, tmp_path / "s")
    assert unpublished.value.reason == "source_year_missing"
    assert len(server.requests) == 1  # only the published year was asked for


# ----------------------------------------------------------------------------------- NO2


def test_no2_geotiff_becomes_the_twins_netcdf(tmp_path: Path, server: FaultyServer) -> None:
    spec = SPECS["acag_no2"]
    rng = np.random.default_rng(7)
    shape = patch_shape(CITY, spec)
    values = rng.gamma(3.0, 5.0, shape).astype(np.float32)
    values[rng.random(shape) < 0.03] = -999.0
    values[6:8, 6:9] = 0.0  # zero ppb is valid
    patch = Patch(patch_around(CITY, spec), values)
    server.add("2012_final_1km.tif", tif_bytes(values, patch.transform, "EPSG:4326", -999.0))

    source = adapter("acag_no2", server, tmp_path)
    item = source.fetch(CITY, 2012, tmp_path / "s")
    path = Path(item.href("data"))
    got, _, nodata, dtype, variable = read_item(path)
    assert (path.name, nodata, dtype, variable) == (
        "2012_final_1km_NO2.nc",
        -9999.0,
        "float32",
        "no2",
    )
    expected = window(patch, "acag_no2")
    expected[expected == -999.0] = np.nan
    np.testing.assert_allclose(got, expected, rtol=1e-6, equal_nan=True)
    assert (got == 0).any()
    with pytest.raises(SourceUnavailableError):
        source.fetch(CITY, 2004, tmp_path / "s")


# ---------------------------------------------------------------------------------- HILDA+

HILDA_IDS = np.array([0, 11, 22, 23, 24, 33, 41, 44, 55, 66, 77, 99, 13], dtype=np.int8)
HILDA_FILE = "hildaplus_GLOB-2-0-f_states.nc"


def serve_hilda(
    server: FaultyServer, tmp_path: Path, times: list[int], time_units: str = "year"
) -> Patch:
    """The multi-year states file around the city (int8 ids, 99 nodata, a few unknown ids)."""
    spec = SPECS["hilda_plus"]
    rng = np.random.default_rng(len(times))
    rows, cols = patch_shape(CITY, spec)
    weights = np.array([3, 8, 6, 1, 1, 5, 2, 2, 2, 1, 2, 0.5, 0.1])
    ids = rng.choice(HILDA_IDS, size=(len(times), rows, cols), p=weights / weights.sum())
    patch = Patch(patch_around(CITY, spec), ids)
    body = netcdf_bytes(
        tmp_path,
        HILDA_FILE,
        patch,
        "LULC_states",
        "i1",
        {"_FillValue": np.int8(99)},
        times,
        time_units,
    )
    server.add(HILDA_FILE, body)
    return patch


def test_hilda_band_is_found_by_its_year_and_ids_mapped_to_the_legend(
    tmp_path: Path, server: FaultyServer
) -> None:
    times = [2012, 2010, 2011]  # not in order: the band is chosen by value, never by position
    patch = serve_hilda(server, tmp_path, times)
    source = adapter("hilda_plus", server, tmp_path)
    item = source.fetch(CITY, 2010, tmp_path / "s")

    path = Path(item.href("data"))
    assert path.name == "hilda_plus_2010_states_GLOB-v2-0_wgs84-nn.tif"
    got, transform, nodata, dtype, _ = read_item(path)
    assert (nodata, dtype) == (99, "uint8") and transform == city_window(
        CITY, SPECS["hilda_plus"]
    ).transform
    expected = (
        Patch(patch.transform, patch.values[1])
        .window_of(city_window(CITY, SPECS["hilda_plus"]))
        .astype(np.float64)
    )
    expected[np.isin(expected, [23, 24])] = 22  # tree crops, agroforestry -> cropland
    expected[expected == 99] = np.nan
    np.testing.assert_array_equal(got, expected)
    assert (got == 0).any() and (got == 13).any() and not np.isin(got, [23, 24]).any()
    with rasterio.open(path) as ds:
        assert ds.tags()["SYNTHETIC"] == "false" and ds.tags()["CITYCUBE_SOURCE_YEAR"] == "2010"

    # The processing reader takes it as it takes the twin's: legend ids valid, 13 and 99 not.
    lu = load_catalogue().get("LU")
    legend = frozenset(int(k) for k in load_catalogue().legends["hilda_plus"])
    with open_masked_source(item, lu, [1], valid_ids=legend) as masked:
        _, valid = masked.read(Window(0, 0, masked.grid.width, masked.grid.height))
    assert valid.sum() == np.isin(expected, sorted(legend)).sum()

    # The multi-year file was downloaded once; another year reads the cached copy.
    source.fetch(CITY, 2012, tmp_path / "s")
    assert len(server.requests_for(HILDA_FILE)) == 1


def test_hilda_years_since_a_base_year_and_a_year_the_file_lacks(
    tmp_path: Path, server: FaultyServer
) -> None:
    patch = serve_hilda(server, tmp_path, [15, 16], time_units="years since 2000-01-01")
    source = adapter("hilda_plus", server, tmp_path)
    got, _, _, _, _ = read_item(Path(source.fetch(CITY, 2016, tmp_path / "s").href("data")))
    expected = (
        Patch(patch.transform, patch.values[1])
        .window_of(city_window(CITY, SPECS["hilda_plus"]))
        .astype(np.float64)
    )
    expected[np.isin(expected, [23, 24])] = 22
    expected[expected == 99] = np.nan
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(SourceReadError, match="holds years 2015-2016, not 2019"):
        source.fetch(CITY, 2019, tmp_path / "s")
    with pytest.raises(SourceUnavailableError):
        source.fetch(CITY, 2020, tmp_path / "s")
