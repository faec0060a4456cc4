"""The http adapter family against a real HTTP server on loopback, with real file naming.

Item values are checked against an independent numpy computation over the same served arrays;
faults (404, 429 with Retry-After, a dropped connection, a checksum mismatch, a corrupt file,
a missing or refused token) and an offline run from a mirror are scripted per test.
"""

from __future__ import annotations

import calendar
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from rasterio.windows import Window

from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.readers import open_masked_source
from citycube.items.staging import COMPLETE_MARKER
from sources.http import http_adapters
from sources.http.base import HttpSource, city_window
from sources.http.spec import load_http_products
from tests.faulty_http_server import Fault, FaultyServer
from tests.http_products_fixtures import (
    Patch,
    ghsl_tiles,
    gz,
    patch_around,
    patch_shape,
    read_item,
    tif_bytes,
    zipped,
)

SPECS = load_http_products()


@pytest.fixture
def server() -> Iterator[FaultyServer]:
    with FaultyServer() as running:
        yield running


def adapter(product: str, base_url: str, tmp_path: Path, **options: Any) -> HttpSource:
    """One adapter of the family, pointed at a loopback server, patient only briefly."""
    settings: dict[str, Any] = {
        "cache_dir": tmp_path / "cache",
        "products": [product],
        "base_urls": {product: base_url},
        "attempts": 4,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.05,
        "timeout_s": 5.0,
        "chunk_bytes": 1024,
        **options,
    }
    (found,) = http_adapters(settings)
    return found


def served_path(server: FaultyServer, suffix: str) -> str:
    """The one served path ending with ``suffix``."""
    (path,) = [p for p in server.files if p.endswith(suffix)]
    return path


def rel(product: str, url: str) -> str:
    """A served URL's path under the base URL (as the loopback server serves it)."""
    return url.split("/", 3)[3]


# ------------------------------------------------------------------------------------ GHSL


def serve_ghsl(
    server: FaultyServer,
    product: str,
    year: int,
    seed: int,
    skip: set[tuple[int, int]] = frozenset(),
) -> dict[str, Patch]:
    """London tiles of a GHSL product (float32, nodata -200/-9999 cells), one patch per variable."""
    spec = SPECS[product]
    rng = np.random.default_rng(seed)
    transform = patch_around("London", spec)
    shape = patch_shape("London", spec)
    file_nodata = -200.0 if product == "ghs_pop" else -9999.0
    patches: dict[str, Patch] = {}
    probe = adapter(product, server.url(""), Path("/nonexistent"))
    for variable in spec.variables:
        values = rng.gamma(1.5, 400.0, shape).astype(np.float32)
        values[rng.random(shape) < 0.02] = file_nodata
        values[:3, :5] = 0.0  # zero is valid
        patch = Patch(transform, values)
        patches[variable.name] = patch
        for (row, col), (tile_t, block) in ghsl_tiles(spec, patch, file_nodata).items():
            if (row, col) in skip:
                continue
            url = probe.url(variable, year, row=row, col=col)
            stem = url.rsplit("/", 1)[1].removesuffix(".zip")
            body = zipped(f"{stem}.tif", tif_bytes(block, tile_t, spec.native_crs, file_nodata))
            server.add(rel(product, url), body)
    return patches


def expected_ghsl(patch: Patch, grid: Any, file_nodata: float, factor: float) -> np.ndarray:
    block = patch.window_of(grid).astype(np.float64)
    return np.where(block == file_nodata, np.nan, block * factor)


def test_ghs_pop_mosaics_two_tiles_onto_the_city_window(
    tmp_path: Path, server: FaultyServer
) -> None:
    patches = serve_ghsl(server, "ghs_pop", 2020, seed=1)
    source = adapter("ghs_pop", server.url(""), tmp_path)
    item = source.fetch("London", 2020, tmp_path / "sources")

    grid = city_window("London", SPECS["ghs_pop"])
    values, transform, nodata, _ = read_item(Path(item.href("data")))
    assert transform == grid.transform and nodata == -200.0
    expected = expected_ghsl(patches["population"], grid, -200.0, 1.0)
    np.testing.assert_allclose(values[0], expected, rtol=1e-6, equal_nan=True)
    assert item.extra["tiles"] == "R3_C18 R3_C19" and item.extra["epoch"] == "2020"
    assert item.source_id == "http:ghs_pop" and not item.synthetic
    # Both tiles were read, across the x = -41 000 m edge of the tile grid.
    served = {r.path.rsplit("_", 2)[-2] + "_" + r.path.rsplit("_", 1)[-1] for r in server.requests}
    assert served == {"R3_C18.zip", "R3_C19.zip"}

    # The processing reader takes the item as it takes the sample twin's.
    pop = load_catalogue().get("POP")
    with open_masked_source(item, pop, [1]) as masked:
        read_values, valid = masked.read(Window(0, 0, masked.grid.width, masked.grid.height))
    assert valid.sum() == np.isfinite(expected).sum()
    assert read_values[0][valid].sum() == pytest.approx(np.nansum(expected), rel=1e-6)


def test_ghs_built_v_stacks_total_and_non_residential_in_m3_per_m2(
    tmp_path: Path, server: FaultyServer
) -> None:
    patches = serve_ghsl(server, "ghs_built_v", 2015, seed=2)
    item = adapter("ghs_built_v", server.url(""), tmp_path).fetch("London", 2015, tmp_path / "s")
    grid = city_window("London", SPECS["ghs_built_v"])
    values, _, nodata, _ = read_item(Path(item.href("data")))
    assert nodata == -9999.0 and values.shape == (2, *grid.shape)
    for band, name in enumerate(["built_volume_total", "built_volume_non_residential"]):
        expected = expected_ghsl(patches[name], grid, -9999.0, 1e-4)  # m³ per 100 m cell -> m³/m²
        np.testing.assert_allclose(values[band], expected, rtol=1e-6, equal_nan=True)


def test_a_tile_the_server_lacks_leaves_its_cells_nodata(
    tmp_path: Path, server: FaultyServer
) -> None:
    patches = serve_ghsl(server, "ghs_pop", 2010, seed=3, skip=frozenset({(3, 19)}))
    item = adapter("ghs_pop", server.url(""), tmp_path).fetch("London", 2010, tmp_path / "s")
    grid = city_window("London", SPECS["ghs_pop"])
    values, _, _, _ = read_item(Path(item.href("data")))
    expected = expected_ghsl(patches["population"], grid, -200.0, 1.0)
    east = (grid.transform.c + (np.arange(grid.width) + 0.5) * grid.transform.a) > -41_000
    assert np.isnan(values[0][:, east]).all()  # not zero: unknown
    np.testing.assert_allclose(values[0][:, ~east], expected[:, ~east], equal_nan=True)
    assert "R3_C19" in item.extra["missing_tiles"]


def test_no_tile_at_all_is_a_broken_url_not_an_empty_city(
    tmp_path: Path, server: FaultyServer
) -> None:
    with pytest.raises(SourceFetchError, match="none of the 2 GHSL tiles") as raised:
        adapter("ghs_pop", server.url("wrong/"), tmp_path).fetch("London", 2000, tmp_path / "s")
    assert not raised.value.transient and raised.value.status == 404


def test_years_outside_the_epochs_are_unavailable_without_a_request(
    tmp_path: Path, server: FaultyServer
) -> None:
    source = adapter("ghs_pop", server.url(""), tmp_path)
    assert source.source_years("London") == [2000, 2005, 2010, 2015, 2020, 2025]
    with pytest.raises(SourceUnavailableError) as raised:
        source.fetch("London", 2012, tmp_path / "s")
    assert raised.value.reason == "source_year_missing" and server.requests == []


# ------------------------------------------------------------------------------------ ODIAC


def serve_odiac(
    server: FaultyServer, year: int, seed: int, faults: dict[int, list[Fault]] | None = None
) -> list[np.ndarray]:
    """Twelve gzipped monthly GeoTIFFs around Amsterdam (float32, some nodata and negatives)."""
    spec = SPECS["odiac"]
    rng = np.random.default_rng(seed)
    transform = patch_around("Amsterdam", spec, margin_cells=6)
    shape = patch_shape("Amsterdam", spec, margin_cells=6)
    probe = adapter("odiac", server.url(""), Path("/nonexistent"))
    months = []
    for month in range(1, 13):
        values = rng.gamma(0.8, 30.0, shape).astype(np.float32)
        values[rng.random(shape) < 0.01] = -9999.0
        months.append(values)
        url = probe.url(spec.variables[0], year, mm=month)
        body = gz(tif_bytes(values, transform, "EPSG:4326", -9999.0))
        server.add(rel("odiac", url), body, *(faults or {}).get(month, []))
    return [Patch(transform, m).values for m in months]


def expected_odiac(months: list[np.ndarray], city: str = "Amsterdam") -> np.ndarray:
    spec = SPECS["odiac"]
    grid = city_window(city, spec)
    transform = patch_around(city, spec, margin_cells=6)
    stack = np.stack([Patch(transform, m).window_of(grid).astype(np.float64) for m in months])
    stack[stack == -9999.0] = np.nan
    total = np.zeros(grid.shape)
    for month in stack:  # a loop, not the adapter's reduction: any invalid month -> nodata
        total = total + month
    return total


def test_odiac_months_sum_to_the_year_in_tonnes_per_cell(
    tmp_path: Path, server: FaultyServer
) -> None:
    months = serve_odiac(server, 2019, seed=4)
    item = adapter("odiac", server.url(""), tmp_path).fetch("Amsterdam", 2019, tmp_path / "s")
    values, transform, nodata, _ = read_item(Path(item.href("data")))
    assert nodata == -9999.0 and transform == city_window("Amsterdam", SPECS["odiac"]).transform
    np.testing.assert_allclose(values[0], expected_odiac(months), rtol=1e-5, equal_nan=True)
    assert item.extra["units"] == "tonne C per cell per year"
    paths = sorted(r.path for r in server.requests)
    assert paths[0].endswith("odiac2024/1km_tiff/2019/odiac2024_1km_excl_intl_1901.tif.gz")
    assert len(paths) == 12
    provenance = json.loads((Path(item.href("data")).parent / "sources.json").read_text())
    assert len(provenance["served_files"]) == 12


def test_a_year_odiac_does_not_publish_is_unavailable_never_zero(
    tmp_path: Path, server: FaultyServer
) -> None:
    with pytest.raises(SourceUnavailableError, match="publishes no source year 2024") as raised:
        adapter("odiac", server.url(""), tmp_path).fetch("Amsterdam", 2024, tmp_path / "s")
    assert raised.value.reason == "source_year_missing" and server.requests == []


def test_a_published_month_the_server_lacks_fails_the_fetch(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_odiac(server, 2005, seed=5)
    del server.files[served_path(server, "_0507.tif.gz")]
    with pytest.raises(SourceFetchError, match="HTTP 404") as raised:
        adapter("odiac", server.url(""), tmp_path).fetch("Amsterdam", 2005, tmp_path / "s")
    assert not raised.value.transient
    assert not (tmp_path / "s" / "odiac" / "Amsterdam" / "2005").exists()


def test_429_retry_after_and_a_dropped_connection_are_weathered(
    tmp_path: Path, server: FaultyServer
) -> None:
    faults = {
        2: [Fault(status=429, headers={"Retry-After": "1"})],
        5: [Fault(drop_after=3000)],
    }
    months = serve_odiac(server, 2010, seed=6, faults=faults)
    item = adapter("odiac", server.url(""), tmp_path).fetch("Amsterdam", 2010, tmp_path / "s")
    values, _, _, _ = read_item(Path(item.href("data")))
    np.testing.assert_allclose(values[0], expected_odiac(months), rtol=1e-5, equal_nan=True)
    first, second = server.requests_for(served_path(server, "_1002.tif.gz"))
    assert second.at - first.at >= 0.9  # back-off alone waits at most 0.05 s
    dropped, resumed = server.requests_for(served_path(server, "_1005.tif.gz"))
    assert dropped.range is None and resumed.range is not None  # resumed, not restarted
    assert int(resumed.range.removeprefix("bytes=").rstrip("-")) > 0


def test_a_checksum_mismatch_fails_and_installs_nothing(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_odiac(server, 2001, seed=7)
    catalogue = yaml.safe_load(Path("schemas/http_products.yaml").read_text())
    for product in catalogue["products"]:
        if product["product"] == "odiac":
            product["sha256"] = {"odiac2024_1km_excl_intl_0103.tif.gz": "0" * 64}
    spec_file = tmp_path / "http_products.yaml"
    spec_file.write_text(yaml.safe_dump(catalogue))
    source = adapter("odiac", server.url(""), tmp_path, products_file=spec_file)
    with pytest.raises(SourceFetchError, match="sha256") as raised:
        source.fetch("Amsterdam", 2001, tmp_path / "s")
    assert not raised.value.transient
    assert not (tmp_path / "s" / "odiac" / "Amsterdam" / "2001").exists()


def test_a_corrupt_file_names_source_city_year_and_file(
    tmp_path: Path, server: FaultyServer
) -> None:
    serve_odiac(server, 2003, seed=8)
    bad = served_path(server, "_0309.tif.gz")
    server.files[bad] = gz(b"II*\x00" + b"\x00" * 64)  # a TIFF header and nothing after it
    source = adapter("odiac", server.url(""), tmp_path)
    with pytest.raises(SourceReadError) as raised:
        source.fetch("Amsterdam", 2003, tmp_path / "s")
    message = str(raised.value)
    for part in ("http:odiac", "Amsterdam", "2003", "odiac2024_1km_excl_intl_0309.tif.gz"):
        assert part in message
    assert source.manager.cached_path(server.url(bad)) is None  # not reused next time


def test_an_offline_run_reads_the_mirror_and_never_the_network(
    tmp_path: Path, server: FaultyServer
) -> None:
    months = serve_odiac(server, 2015, seed=9)
    mirror = tmp_path / "mirror"
    host = server.url("").split("/")[2]
    for path, body in server.files.items():
        copy = mirror / host / path.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(body)
    source = adapter("odiac", server.url(""), tmp_path, offline=True, mirror_dir=mirror)
    item = source.fetch("Amsterdam", 2015, tmp_path / "s")
    values, _, _, _ = read_item(Path(item.href("data")))
    np.testing.assert_allclose(values[0], expected_odiac(months), rtol=1e-5, equal_nan=True)
    assert server.requests == []
    with pytest.raises(SourceUnavailableError) as missing:
        source.fetch("Amsterdam", 2016, tmp_path / "s")
    assert missing.value.reason == "source_offline"


# ------------------------------------------------------------------------------------ VIIRS

TOKEN = "eog-TOKEN-5f3a9c-do-not-leak"


def serve_vnl(server: FaultyServer, year: int, *faults: Fault) -> Patch:
    spec = SPECS["viirs_vnl"]
    rng = np.random.default_rng(year)
    transform = patch_around("Amsterdam", spec)
    shape = patch_shape("Amsterdam", spec)
    values = rng.gamma(0.7, 12.0, shape).astype(np.float32)
    values[values < 0.3] = 0.0  # the masked background: a valid zero
    values[rng.random(shape) < 0.005] = -9999.0
    url = adapter("viirs_vnl", server.url(""), Path("/x")).url(spec.variables[0], year)
    server.add(
        rel("viirs_vnl", url), gz(tif_bytes(values, transform, "EPSG:4326", -9999.0)), *faults
    )
    return Patch(transform, values)


def test_vnl_sends_the_token_and_it_never_leaks(
    tmp_path: Path,
    server: FaultyServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("EOG_ACCESS_TOKEN", TOKEN)
    patch = serve_vnl(server, 2022, Fault(status=503))
    source = adapter("viirs_vnl", server.url(""), tmp_path)
    item = source.fetch("Amsterdam", 2022, tmp_path / "s")

    grid = city_window("Amsterdam", SPECS["viirs_vnl"])
    values, _, nodata, _ = read_item(Path(item.href("data")))
    expected = patch.window_of(grid).astype(np.float64)
    expected[expected == -9999.0] = np.nan
    np.testing.assert_allclose(values[0], expected, rtol=1e-6, equal_nan=True)
    assert nodata == -9999.0 and (values[0] == 0).any()
    assert Path(item.href("data")).name.startswith("VNL_v22_npp-j01_2022_global_vcmslcfg")
    assert {r.authorization for r in server.requests} == {f"Bearer {TOKEN}"}

    # A refused token: the error says what to do, without the token.
    serve_vnl(server, 2023, Fault(status=401))
    with pytest.raises(SourceFetchError, match="EOG_ACCESS_TOKEN") as refused:
        source.fetch("Amsterdam", 2023, tmp_path / "s")
    assert TOKEN not in str(refused.value) and TOKEN not in repr(refused.value.__reduce__())

    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert leaks == []  # item files, completion records, provenance, cache index
    assert (Path(item.href("data")).parent / COMPLETE_MARKER).is_file()
    assert TOKEN not in caplog.text and "download" in caplog.text


def test_vnl_without_a_token_says_which_variable_to_set(
    tmp_path: Path, server: FaultyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EOG_ACCESS_TOKEN", raising=False)
    serve_vnl(server, 2016)
    with pytest.raises(SourceFetchError, match="set the environment variable EOG_ACCESS_TOKEN"):
        adapter("viirs_vnl", server.url(""), tmp_path).fetch("Amsterdam", 2016, tmp_path / "s")
    assert server.requests == []
    with pytest.raises(SourceUnavailableError):
        adapter("viirs_vnl", server.url(""), tmp_path).fetch("Amsterdam", 2011, tmp_path / "s")


# ------------------------------------------------------------------------------------ CHELSA

CHELSA_RAW = {  # variable: (raw scale, raw offset, mean physical value, spread)
    "tasmin": (0.1, 0.0, 280.0, 6.0),
    "tasmax": (0.1, 0.0, 290.0, 6.0),
    "tas": (0.1, 0.0, 285.0, 6.0),
    "pr": (0.01, 0.0, 70.0, 30.0),
    "rsds": (0.001, 0.0, 12.0, 5.0),
    "hurs": (0.01, 0.0, 75.0, 8.0),
}


def write_chelsa(root: Path, year: int) -> dict[str, list[np.ndarray]]:
    """72 monthly CHELSA COGs (uint16, nodata 65535) as served files under ``root``."""
    spec = SPECS["chelsa"]
    transform = patch_around("Amsterdam", spec)
    shape = patch_shape("Amsterdam", spec)
    rng = np.random.default_rng(year)
    probe = adapter("chelsa", "http://host", Path("/x"))
    raw_months: dict[str, list[np.ndarray]] = {}
    for variable in spec.variables:
        scale, _, mean, spread = CHELSA_RAW[variable.name]
        months = []
        for month in range(1, 13):
            physical = mean + spread * np.sin(month / 2) + rng.normal(0, 1, shape)
            raw = np.clip(np.rint(physical / scale), 0, 65534).astype(np.uint16)
            raw[:2, :3] = 65535  # sea cells
            if month == 7:
                raw[5, 5] = 65535  # one month missing: the cell has no annual value
            months.append(raw)
            path = root / rel("chelsa", probe.url(variable, year, mm=month))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tif_bytes(raw, transform, "EPSG:4326", 65535, driver="COG"))
        raw_months[variable.name] = months
    return raw_months


def expected_chelsa(raw_months: dict[str, list[np.ndarray]], year: int) -> dict[str, np.ndarray]:
    spec = SPECS["chelsa"]
    grid = city_window("Amsterdam", spec)
    transform = patch_around("Amsterdam", spec)
    days = [calendar.monthrange(year, m)[1] for m in range(1, 13)]
    out = {}
    for name, months in raw_months.items():
        scale = CHELSA_RAW[name][0]
        blocks = [Patch(transform, m).window_of(grid).astype(np.float64) for m in months]
        valid = np.all([b != 65535 for b in blocks], axis=0)
        served = [b * scale for b in blocks]
        if name == "pr":
            annual = sum(served)
        else:
            annual = sum(d * s for d, s in zip(days, served, strict=True)) / sum(days)
        if name.startswith("tas"):
            annual = annual - 273.15
        if name == "rsds":
            annual = annual * 1e6 / 86400  # MJ m-2 d-1 -> W m-2
        out[name] = np.where(valid, annual, np.nan)
    return out


def test_chelsa_annual_fields_from_windowed_reads(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    base, root, log = file_server
    raw_months = write_chelsa(root / "chelsa", 2016)  # a leap year: February weighs 29 days
    source = adapter("chelsa", f"{base}/chelsa", tmp_path)
    item = source.fetch("Amsterdam", 2016, tmp_path / "s")
    expected = expected_chelsa(raw_months, 2016)
    quantum = {"tasmin": 0.1, "tasmax": 0.1, "tas": 0.1, "pr": 0.1, "rsds": 0.1, "hurs": 0.01}
    for name, want in expected.items():
        values, _, nodata, scales = read_item(Path(item.href(name)))
        assert nodata == 65535 and scales == (quantum[name],)
        np.testing.assert_allclose(values[0], want, atol=quantum[name] / 2 + 1e-9, equal_nan=True)
        assert np.isnan(want).sum() == 1  # the cell missing July has no annual value
    assert Path(item.href("rsds")).name == "CHELSA_rsds_2016_V.2.1.tif"
    requested = log.read_text().splitlines()
    assert any("rsds/CHELSA_rsds_2016_07_V.2.1.tif" in line for line in requested)
    gets = [line for line in requested if line.startswith("GET")]
    # "GET <path> <Range> <status> <bytes> <signed>": byte ranges only, never a whole file
    assert gets and all(line.split()[2].startswith("bytes=") for line in gets)

    wth = load_catalogue().get("WTH")
    with open_masked_source(item, wth, [1], role="tas") as masked:
        values, valid = masked.read(Window(0, 0, masked.grid.width, masked.grid.height))
    assert np.nanmean(values[0][valid]) == pytest.approx(np.nanmean(expected["tas"]), abs=0.05)


def test_chelsa_offline_reads_the_mirror_and_unpublished_years_are_unavailable(
    tmp_path: Path,
) -> None:
    host = "os.zhdk.cloud.switch.ch"
    mirror = tmp_path / "mirror"
    raw_months = write_chelsa(mirror / host / "chelsav2/GLOBAL/monthly", 2003)
    source = adapter(
        "chelsa",
        f"https://{host}/chelsav2/GLOBAL/monthly",
        tmp_path,
        offline=True,
        mirror_dir=mirror,
    )
    item = source.fetch("Amsterdam", 2003, tmp_path / "s")
    values, _, _, _ = read_item(Path(item.href("pr")))
    want = expected_chelsa(raw_months, 2003)["pr"]
    np.testing.assert_allclose(values[0], want, atol=0.05 + 1e-9, equal_nan=True)
    with pytest.raises(SourceUnavailableError) as raised:
        source.fetch("Amsterdam", 2021, tmp_path / "s")
    assert raised.value.reason == "source_year_missing"
