"""Daymet annual (``daymet-annual-na``) from a loopback Zarr store, end to end.

The store is served by the Range file server behind the SAS check, the collection by
``rustac serve``. Expected values are read here from the store's files with zarr directly and
placed by the lattice arithmetic of the written files' own transforms, independently of the
adapter's window code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio
import zarr
from pyproj import CRS, Transformer

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.items.protocol import SourceSet
from citycube.processing.compute import process_partition
from sources.sample.backend import sample_adapters
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.grids import city_crs, city_window
from sources.stac.zarrcache import ChunkCache
from tests.stac_fixtures import (
    CITY,
    DAYMET_CHUNK,
    DAYMET_CORRUPT_YEAR,
    DAYMET_LCC,
    DAYMET_TIME_CHUNK,
    DAYMET_X0,
    DAYMET_Y0,
    DAYMET_YEARS,
    SAS_TOKEN,
    TOKEN_SECRET,
    StacWorld,
)

ROLES = ("tmin", "tmax", "tmean", "prcp")


def daymet_adapter(world: StacWorld) -> StacSource:
    chosen = {a.product_id: a for a in stac_adapters(world.options(products=["daymet"]))}
    return chosen["daymet"]


@pytest.fixture(scope="module")
def fetched(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Boston 2020 fetched once, with the requests it made and how long it took."""
    dest = tmp_path_factory.mktemp("daymet")
    stac_world.set_faults([])
    before = len(stac_world.log_lines())
    adapter = daymet_adapter(stac_world)
    started = time.perf_counter()
    item = adapter.fetch(CITY, 2020, dest)
    return {
        "dest": dest,
        "item": item,
        "adapter": adapter,
        "requests": stac_world.log_lines()[before:],
        "seconds": time.perf_counter() - started,
    }


def _store_array(world: StacWorld, name: str, year: int) -> np.ndarray:
    """One year of a variable of the served store, read from its files with zarr (float64,
    NaN where it holds its fill value)."""
    assert world.daymet is not None
    array = zarr.open_array(str(world.daymet.path / name), mode="r")
    values = array[DAYMET_YEARS.index(year)].astype(np.float64)
    values[values == -9999] = np.nan
    return values


def _expected_on(world: StacWorld, path: Path, name: str, year: int) -> np.ndarray:
    """The store's values of a year at every pixel centre of a written file."""
    assert world.daymet is not None
    with rasterio.open(path) as src:
        t, rows, cols = src.transform, src.height, src.width
    x = t.c + (np.arange(cols) + 0.5) * t.a
    y = t.f + (np.arange(rows) + 0.5) * t.e
    lattice_col = (x - DAYMET_X0) / 1000
    lattice_row = (DAYMET_Y0 - y) / 1000
    assert np.allclose(lattice_col, np.round(lattice_col), atol=1e-9)  # on the Daymet lattice
    assert np.allclose(lattice_row, np.round(lattice_row), atol=1e-9)
    c = np.round(lattice_col).astype(int) - world.daymet.col0
    r = np.round(lattice_row).astype(int) - world.daymet.row0
    whole = _store_array(world, name, year)
    return whole[np.ix_(r, c)]


def test_values_equal_the_store_read_independently(fetched: dict, stac_world: StacWorld) -> None:
    item = fetched["item"]
    expected = {
        name: _expected_on(stac_world, Path(item.files[name]), name, 2020)
        for name in ("tmin", "tmax", "prcp")
    }
    expected["tmean"] = (expected["tmin"] + expected["tmax"]) / 2
    for role in ROLES:
        with rasterio.open(item.files[role]) as src:
            written = src.read(1).astype(np.float64)
            assert src.nodata == -9999
        want = expected[role]
        assert np.isnan(want).any() and np.isfinite(want).any()  # the sea patch is in the window
        np.testing.assert_array_equal(written == -9999, np.isnan(want), err_msg=role)
        valid = np.isfinite(want)
        np.testing.assert_allclose(written[valid], want[valid], rtol=0, atol=1e-4, err_msg=role)


def test_the_item_covers_the_city_window(fetched: dict) -> None:
    to_lcc = Transformer.from_crs(city_crs(CITY), CRS.from_proj4(DAYMET_LCC), always_xy=True)
    xmin, ymin, xmax, ymax = to_lcc.transform_bounds(*city_window(CITY), densify_pts=51)
    with rasterio.open(fetched["item"].files["prcp"]) as src:
        left, bottom, right, top = src.bounds
    assert left <= xmin and right >= xmax and bottom <= ymin and top >= ymax
    assert right - xmax < 1000 and xmin - left < 1000  # no more than one cell beyond


def test_the_item_has_the_sample_twins_form(fetched: dict, tmp_path: Path) -> None:
    """Roles, file names, dtype, nodata, band names, units and CRS as the sample writes them;
    the roles Daymet's annual store does not publish are declared, not written."""
    (twin_adapter,) = [a for a in sample_adapters({"seed": 0}) if a.product_id == "daymet"]
    twin = twin_adapter.fetch(CITY, 2020, tmp_path)
    item = fetched["item"]
    assert set(item.files) == set(twin.files) - {"srad", "rh"}
    assert dict(item.missing_roles) == {
        "srad": "variable_not_published",
        "rh": "variable_not_published",
    }
    for role, path in item.files.items():
        assert Path(path).name == Path(twin.files[role]).name
        with rasterio.open(path) as ours, rasterio.open(twin.files[role]) as theirs:
            assert ours.dtypes == theirs.dtypes == ("float32",)
            assert ours.nodata == theirs.nodata
            assert ours.descriptions == theirs.descriptions
            assert ours.tags(1)["units"] == theirs.tags(1)["units"]
            assert CRS.from_user_input(ours.crs) == CRS.from_user_input(theirs.crs)
            assert ours.res == theirs.res == (1000.0, 1000.0)
            assert (ours.transform.c - theirs.transform.c) % 1000 == 0  # the same lattice
            assert (ours.transform.f - theirs.transform.f) % 1000 == 0
            assert ours.tags()["SYNTHETIC"] == "false"


def test_only_the_chunks_under_the_window_are_read_and_every_request_is_signed(
    fetched: dict, stac_world: StacWorld
) -> None:
    assert stac_world.daymet is not None
    with rasterio.open(fetched["item"].files["prcp"]) as src:
        t, rows, cols = src.transform, src.height, src.width
    c0 = round((t.c + 500 - DAYMET_X0) / 1000) - stac_world.daymet.col0
    r0 = round((DAYMET_Y0 - (t.f - 500)) / 1000) - stac_world.daymet.row0
    t_index = DAYMET_YEARS.index(2020) // DAYMET_TIME_CHUNK
    needed = {
        f"{t_index}.{i}.{j}"
        for i in range(r0 // DAYMET_CHUNK, (r0 + rows - 1) // DAYMET_CHUNK + 1)
        for j in range(c0 // DAYMET_CHUNK, (c0 + cols - 1) // DAYMET_CHUNK + 1)
    }
    store_rows, store_cols = stac_world.daymet.shape
    all_chunks = math.ceil(store_rows / DAYMET_CHUNK) * math.ceil(store_cols / DAYMET_CHUNK)
    assert len(needed) < all_chunks
    lines = [line.split() for line in fetched["requests"] if "/daymeteuwest/" in line]
    assert lines and all(parts[5] == "signed" for parts in lines)
    for variable in ("tmin", "tmax", "prcp"):
        got = {p[1].rsplit("/", 1)[1] for p in lines if f"/na.zarr/{variable}/" in p[1]}
        assert got == needed, variable
    assert not [p for p in lines if "/vp/" in p[1] or "/swe/" in p[1] or "/lat/" in p[1]]


def test_the_sas_token_is_in_no_written_file_and_reaches_the_server_intact(
    fetched: dict, stac_world: StacWorld, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = SAS_TOKEN.split("sig=")[1]
    chunks = list((Path(fetched["dest"]) / ".stac" / "zarr").rglob("*.chunk"))
    assert chunks  # the chunk cache is checked too
    for path in Path(fetched["dest"]).rglob("*"):
        assert "sig=" not in str(path) and secret not in str(path), path
        if path.is_file():
            content = path.read_bytes()
            assert secret.encode() not in content, path
            assert b"sig=" not in content, path
    record = json.dumps(dict(fetched["item"].extra)) + json.dumps(fetched["item"].missing_roles)
    assert secret not in record
    # The signature travels as query parameters: the server must see it byte for byte.
    stac_world.set_faults([{"match": "/daymeteuwest/", "require_query": "sig=" + secret}])
    try:
        with caplog.at_level(logging.DEBUG):
            item = daymet_adapter(stac_world).fetch(CITY, 2019, tmp_path)
    finally:
        stac_world.set_faults([])
    assert set(item.files) == set(ROLES)
    assert caplog.records and secret not in caplog.text  # nor in any log record


def test_a_year_after_the_store_is_unavailable_without_a_request(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    before = len(stac_world.log_lines())
    with pytest.raises(SourceUnavailableError) as caught:
        daymet_adapter(stac_world).fetch(CITY, 2021, tmp_path)
    assert caught.value.reason == "source_year_missing"
    assert len(stac_world.log_lines()) == before
    assert not (tmp_path / "daymet").exists()


def test_a_year_the_store_lacks_is_unavailable_not_zero(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """2014 is inside the product's calendar but not in the loopback store."""
    with pytest.raises(SourceUnavailableError, match="2015–2020") as caught:
        daymet_adapter(stac_world).fetch(CITY, 2014, tmp_path)
    assert caught.value.reason == "source_year_missing"
    assert not list(tmp_path.rglob("*.tif"))


def test_a_city_outside_the_domain_has_no_years(stac_world: StacWorld, tmp_path: Path) -> None:
    adapter = daymet_adapter(stac_world)
    assert adapter.source_years("London") == []
    assert adapter.source_years(CITY) == list(range(1980, 2021))
    with pytest.raises(SourceUnavailableError) as caught:
        adapter.fetch("London", 2020, tmp_path)
    assert caught.value.reason == "outside_source_coverage"


def test_a_corrupt_chunk_is_a_read_error_naming_source_city_and_year(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    stac_world.set_faults([])
    with pytest.raises(SourceReadError) as caught:
        daymet_adapter(stac_world).fetch(CITY, DAYMET_CORRUPT_YEAR, tmp_path)
    message = str(caught.value)
    assert caught.value.reason == "corrupt_asset"
    for part in ("daymet", "pc:daymet-annual-na", CITY, str(DAYMET_CORRUPT_YEAR), "tmax"):
        assert part in message, part
    assert "sig=" not in message and SAS_TOKEN not in message
    assert not list(tmp_path.rglob("*.tif"))
    # The garbage the server sent is not kept, so a store repaired upstream is read afresh.
    assert not list(tmp_path.rglob("*.chunk"))


def test_server_errors_are_retried_then_the_read_succeeds(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    stac_world.set_faults([{"match": "/na.zarr/prcp/", "status": 503, "times": 2}])
    try:
        item = daymet_adapter(stac_world).fetch(CITY, 2018, tmp_path)
    finally:
        stac_world.set_faults([])
    assert set(item.files) == set(ROLES)


def test_a_retried_chunk_logs_its_failures_without_the_token(
    stac_world: StacWorld,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    stac_world.set_faults([{"match": "/na.zarr/prcp/", "status": 503, "times": 2}])
    try:
        daymet_adapter(stac_world).fetch(CITY, 2018, tmp_path)
    finally:
        stac_world.set_faults([])
    out, err = capfd.readouterr()
    shown = "\n".join([caplog.text, out, err])
    assert "503" in shown  # the retries were reported
    assert TOKEN_SECRET not in shown and "sig=" not in shown


# ---- the chunk cache -------------------------------------------------------------------------


def _daymet_requests(world: StacWorld, before: int) -> list[str]:
    """Paths of the store objects requested since ``before`` (relative to the store root)."""
    marker = "/na.zarr/"
    return [
        line.split()[1].split(marker, 1)[1]
        for line in world.log_lines()[before:]
        if marker in line.split()[1]
    ]


def _is_metadata(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in (".zmetadata", ".zarray", ".zattrs", ".zgroup", "zarr.json")


def _check_values(world: StacWorld, item: Any, year: int) -> None:
    for name in ("tmin", "tmax", "prcp"):
        want = _expected_on(world, Path(item.files[name]), name, year)
        with rasterio.open(item.files[name]) as src:
            written = src.read(1).astype(np.float64)
        valid = np.isfinite(want)
        assert valid.any()
        np.testing.assert_array_equal(written == -9999, ~valid, err_msg=f"{name} {year}")
        np.testing.assert_allclose(written[valid], want[valid], atol=1e-4, err_msg=name)


def test_years_sharing_a_time_chunk_and_a_second_city_request_no_chunk_twice(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """Boston 2020, then Boston 2019 (the same time chunk), then NYC 2020: every chunk object is
    requested once over the three fetches; only the metadata is asked for on every open."""
    stac_world.set_faults([])
    adapter = daymet_adapter(stac_world)
    requested: dict[str, list[str]] = {}
    for city, year in ((CITY, 2020), (CITY, 2019), ("NYC", 2020)):
        before = len(stac_world.log_lines())
        item = adapter.fetch(city, year, tmp_path)
        requested[f"{city} {year}"] = _daymet_requests(stac_world, before)
        _check_values(stac_world, item, year)
    chunks = [k for keys in requested.values() for k in keys if not _is_metadata(k)]
    repeated = {k: n for k, n in Counter(chunks).items() if n > 1}
    assert not repeated, repeated
    assert [k for k in requested["Boston 2019"] if not _is_metadata(k)] == []
    nyc = [k for k in requested["NYC 2020"] if not _is_metadata(k)]
    assert nyc and all(k.split("/")[0] in ("tmin", "tmax", "prcp") for k in nyc)  # no coords
    for keys in requested.values():  # metadata is fetched again by every open (revalidated)
        assert ".zmetadata" in keys


def test_a_damaged_cached_chunk_is_detected_and_fetched_again(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    stac_world.set_faults([])
    adapter = daymet_adapter(stac_world)
    adapter.fetch(CITY, 2020, tmp_path)
    cached = sorted((tmp_path / ".stac" / "zarr").rglob("tmin/*.chunk"))
    assert len(cached) >= 2
    flipped, truncated = cached[0], cached[-1]
    data = bytearray(flipped.read_bytes())
    data[-7] ^= 0x04
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-3])
    before = len(stac_world.log_lines())
    item = adapter.fetch(CITY, 2019, tmp_path)  # the same chunks, one time step over
    chunks = [k for k in _daymet_requests(stac_world, before) if not _is_metadata(k)]
    assert sorted(chunks) == sorted(
        f"tmin/{path.name.removesuffix('.chunk')}" for path in (flipped, truncated)
    )
    _check_values(stac_world, item, 2019)
    for path in (flipped, truncated):  # fetched again and kept whole
        _, header, payload = path.read_bytes().split(b"\n", 2)
        assert json.loads(header)["sha256"] == hashlib.sha256(payload).hexdigest()


def test_a_store_whose_metadata_changes_is_read_into_fresh_entries(tmp_path: Path) -> None:
    """Chunks are keyed by the store's metadata as read at each open: a changed store is never
    answered from the entries of the old one. Keys and files hold no credential."""
    store = zarr.storage.MemoryStore()
    array = zarr.create_array(
        store, name="v", shape=(4, 4), chunks=(2, 2), dtype="f4", zarr_format=2, fill_value=-1
    )
    array[:] = 1.0
    zarr.consolidate_metadata(store, zarr_format=2)
    cache = ChunkCache(tmp_path)
    url = f"https://acct.blob.core.windows.net/c/s.zarr?{SAS_TOKEN}"

    def read() -> np.ndarray:
        group = zarr.open_group(cache.wrap(store, url), mode="r", zarr_format=2)
        return np.asarray(group["v"][:])

    assert (read() == 1).all() and cache.misses == 4
    assert (read() == 1).all() and cache.hits == 4 and cache.misses == 4
    array[:] = 2.0
    array.attrs["revision"] = 2
    zarr.consolidate_metadata(store, zarr_format=2)
    assert (read() == 2).all() and cache.misses == 8
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len([p for p in files if p.suffix == ".chunk"]) == 8
    for path in files:
        assert "sig=" not in str(path) and b"sig=" not in path.read_bytes(), path
    assert all("acct.blob.core.windows.net/c/s.zarr" in str(p) for p in files)


def test_a_429_on_a_chunk_waits_as_long_as_retry_after_asks(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    rule = {"match": "/na.zarr/prcp/", "status": 429, "times": 1, "headers": {"Retry-After": "1"}}
    stac_world.set_faults([rule])
    before = len(stac_world.log_lines())
    try:
        item = daymet_adapter(stac_world).fetch(CITY, 2018, tmp_path)
    finally:
        stac_world.set_faults([])
    assert set(item.files) == set(ROLES)
    prcp = [line.split() for line in stac_world.log_lines()[before:] if "/na.zarr/prcp/" in line]
    (refused,) = [parts for parts in prcp if parts[3] == "429"]
    retried = [p for p in prcp[prcp.index(refused) + 1 :] if p[1] == refused[1]]
    # The back-off alone waits at most retry_wait_max_s = 0.2 s (plus 0.05 s of jitter).
    assert retried and float(retried[0][6]) - float(refused[6]) >= 0.95


def test_a_chunk_refused_while_its_siblings_are_in_flight_is_read_again_to_the_end(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """Every precipitation chunk answers slowly and the first one refused: the failed read
    leaves its sibling requests running on zarr's event loop while the retry reads the same
    chunks again; the retry must neither wait on its abandoned first attempt nor keep a
    half-written chunk."""
    rules = [
        {"match": "/na.zarr/prcp/", "delay_s": 0.5},
        {"match": "/na.zarr/prcp/", "status": 503, "times": 1},
    ]
    stac_world.set_faults(rules)
    before = len(stac_world.log_lines())
    try:
        item = daymet_adapter(stac_world).fetch(CITY, 2018, tmp_path)
    finally:
        stac_world.set_faults([])
    assert set(item.files) == set(ROLES)
    statuses = [line.split()[3] for line in stac_world.log_lines()[before:] if "/prcp/" in line]
    assert "503" in statuses and statuses.count("200") >= 1


# ---- processing: unpublished roles and the fallback ------------------------------------------


def _loopback_sources(fetched: dict) -> SourceSet:
    """Daymet from the loopback store, every other product from the sample."""
    sample = [a for a in sample_adapters({"seed": 0}) if a.product_id != "daymet"]
    return SourceSet([fetched["adapter"], *sample], name="loopback-daymet")


def test_processing_marks_unpublished_roles_unavailable(fetched: dict, tmp_path: Path) -> None:
    catalogue = load_catalogue()
    release = Release(tmp_path / "release", "t")
    process_partition(
        catalogue.get("WTH"), catalogue, CITY, 2020, _loopback_sources(fetched), release
    )
    rows = pq.read_table(release.observations_file(CITY, 2020, "WTH")).to_pylist()
    by_field: dict[str, list[dict]] = {}
    for row in rows:
        by_field.setdefault(row["field"], []).append(row)
    for name in ("srad_w_m2", "rh_fraction"):
        assert all(r["value"] is None and not r["available"] for r in by_field[name])
        assert {r["reason"] for r in by_field[name]} == {"variable_not_published"}
    for name in ("tmin_c", "tmax_c", "tmean_c", "prcp_mm"):
        assert any(r["available"] for r in by_field[name]), name
    assert {r["source_id"] for r in rows} == {"pc:daymet-annual-na"}
    assert not any(r["synthetic"] for r in rows)
    tmin = [r["value"] for r in by_field["tmin_c"] if r["available"]]
    tmax = [r["value"] for r in by_field["tmax_c"] if r["available"]]
    tmean = [r["value"] for r in by_field["tmean_c"] if r["available"]]
    assert np.allclose(np.add(tmin, tmax) / 2, tmean, atol=1e-4)  # linear in the cells


def test_a_year_daymet_does_not_publish_falls_back_to_chelsa(fetched: dict, tmp_path: Path) -> None:
    catalogue = load_catalogue()
    release = Release(tmp_path / "release", "t")
    process_partition(
        catalogue.get("WTH"), catalogue, CITY, 2021, _loopback_sources(fetched), release
    )
    rows = pq.read_table(release.observations_file(CITY, 2021, "WTH")).to_pylist()
    assert {r["source_id"] for r in rows} == {"sample:chelsa"}
    assert {r["source_year"] for r in rows} == {2021}
    assert any(r["available"] for r in rows if r["field"] == "srad_w_m2")


# ---- through Dagster -------------------------------------------------------------------------


@pytest.mark.e2e
def test_dagster_builds_weather_from_the_loopback_daymet_store(stac_world, tmp_path) -> None:
    """A source set that takes Daymet from the family: WTH for Boston 2020 through the assets."""
    import dagster as dg
    import yaml

    from pipelines.definitions import build_definitions
    from pipelines.resources import ComputeResource, CubeResource
    from tests.conftest import materialize_keys

    stac_world.set_faults([])
    source_set = tmp_path / "source_set.yaml"
    spec = {
        "name": "loopback-daymet",
        "default": "sample",
        "products": {"daymet": "planetary-computer"},
        "options": {
            "sample": {"seed": 0},
            "planetary-computer": stac_world.options(products=["daymet"]),
        },
    }
    source_set.write_text(yaml.safe_dump(spec), encoding="utf-8")
    cube = CubeResource(
        data_root=str(tmp_path / "data"), release_version="t", source_set=str(source_set)
    )
    resources = {"cube": cube, "compute": ComputeResource(workers=1)}
    result = materialize_keys(
        build_definitions(),
        ["sources/daymet", "derived/wth"],
        f"{CITY}|2020",
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success  # type: ignore[attr-defined]
    derived = pq.read_table(cube.release().derived_file("WTH", CITY, "2020"))
    assert set(derived.column("source_id").to_pylist()) == {"pc:daymet-annual-na"}
    reasons = {
        (f, r)
        for f, r in zip(
            derived.column("field").to_pylist(), derived.column("reason").to_pylist(), strict=True
        )
        if f in ("srad_w_m2", "rh_fraction")
    }
    assert {r for _, r in reasons} == {"variable_not_published"}
