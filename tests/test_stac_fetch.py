"""The STAC family end to end on loopback: rustac's STAC API, signed hrefs, Range reads.

Every expected value is computed here independently, from the served COGs read whole with
rasterio and numpy, and compared with what the adapters wrote.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio
from scipy import ndimage

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.protocol import SourceItem, SourceSet
from citycube.processing.compute import process_partition
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.grids import landsat_grid
from tests.stac_expected import INVALID_BITS, expected_stacks, scene_band, source_index
from tests.stac_fixtures import (
    CITY,
    SAS_TOKEN,
    SOUTH_CITY,
    ST_OFFSET,
    ST_SCALE,
    TOKEN_SECRET,
    StacWorld,
    byte_accounting,
    throttled_api,
)


def adapters(world: StacWorld, **overrides: Any) -> dict[str, StacSource]:
    return {a.product_id: a for a in stac_adapters(world.options(**overrides))}


@pytest.fixture(scope="module")
def fetched_2020(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Boston 2020 fetched once for OPT, NDVI and HEAT, plus the DEM, and the requests made."""
    dest = tmp_path_factory.mktemp("fetched")
    stac_world.set_faults([])
    before = len(stac_world.log_lines())
    chosen = adapters(stac_world)
    started = time.perf_counter()
    items = {p: chosen[p].fetch(CITY, 2020, dest) for p in ("landsat_c2l2", "landsat_ndvi")}
    items["landsat_st"] = chosen["landsat_st"].fetch(CITY, 2020, dest)
    items["cop_dem_glo30"] = chosen["cop_dem_glo30"].fetch(CITY, None, dest)
    seconds = time.perf_counter() - started
    return {
        "dest": dest,
        "items": items,
        "requests": stac_world.log_lines()[before:],
        "seconds": seconds,
        "adapters": chosen,
    }


# ---- the independent computation -------------------------------------------------------------


def assert_composite_matches(got: np.ndarray, want: np.ndarray, atol: float, world) -> None:
    """Same invalid pixels everywhere; same values wherever only same-zone scenes contribute,
    and on ≥ 99.5 % of the pixels the neighbouring-zone scene reaches (GDAL's nearest pixel
    and an exact pyproj floor can differ where a pixel centre falls on a source pixel edge)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    warped = source_index(world, "zone18", landsat_grid(CITY))[2]
    warped = ndimage.binary_dilation(warped, iterations=2)  # its edge pixels too
    valid = ~np.isnan(want)
    np.testing.assert_allclose(got[valid & ~warped], want[valid & ~warped], atol=atol)
    agree = np.isclose(got[valid & warped], want[valid & warped], atol=atol)
    assert agree.mean() >= 0.995, f"{(~agree).sum()} of {agree.size} warped pixels differ"


def _read(item: SourceItem, role: str = "data") -> tuple[np.ndarray, Any]:
    with rasterio.open(item.href(role)) as ds:
        return ds.read(), ds.profile


# ---- composites ------------------------------------------------------------------------------


def test_st_composite_equals_an_independent_numpy_computation(fetched_2020: dict, stac_world):
    data, profile = _read(fetched_2020["items"]["landsat_st"])
    assert profile["dtype"] == "float32" and profile["nodata"] == -9999
    assert profile["crs"].to_epsg() == 32619
    stack = expected_stacks(stac_world, ["thermal"])["thermal"]
    with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        mean, median = np.nanmean(stack, axis=0), np.nanmedian(stack, axis=0)
    for band, want in ((0, mean), (1, median)):
        got = np.where(data[band] == -9999, np.nan, data[band])
        assert_composite_matches(got, want, 2e-4, stac_world)
    assert 250 < np.nanmean(np.where(data[0] == -9999, np.nan, data[0])) < 320  # Kelvin


def test_ndvi_and_rgb_composites_equal_an_independent_numpy_computation(
    fetched_2020: dict, stac_world: StacWorld
) -> None:
    stacks = expected_stacks(stac_world, ["red", "green", "blue", "nir08"])
    with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        index = (stacks["nir08"] - stacks["red"]) / (stacks["nir08"] + stacks["red"])
        want_ndvi = np.nanmedian(index, axis=0)
        medians = [np.nanmedian(stacks[b], axis=0) for b in ("red", "green", "blue")]
    ndvi, _ = _read(fetched_2020["items"]["landsat_ndvi"])
    got = np.where(ndvi[0] == -9999, np.nan, ndvi[0])
    assert_composite_matches(got, want_ndvi, 1e-5, stac_world)

    rgb, profile = _read(fetched_2020["items"]["landsat_c2l2"])
    assert profile["dtype"] == "uint8" and profile["nodata"] == 0 and rgb.shape[0] == 3
    valid = np.logical_and.reduce([np.isfinite(m) for m in medians])
    for band, median in enumerate(medians):
        want = np.where(valid, np.clip(np.rint(1 + 254 * median / 0.3), 1, 255), 0)
        np.testing.assert_array_equal(rgb[band] == 0, want == 0)
        # float32 against float64 rounding may move a value sitting on .5 by one step.
        assert_composite_matches(rgb[band].astype(float), want, 1.0, stac_world)
    qa, _ = _read(fetched_2020["items"]["landsat_c2l2"], "qa")
    np.testing.assert_array_equal(qa[0], np.where(valid, 64, 1))


def test_cloudy_scene_is_never_read_and_every_read_is_signed(fetched_2020: dict, stac_world):
    cloudy = stac_world.scenes["cloudy"].scene_id
    requests = fetched_2020["requests"]
    assert requests and not [r for r in requests if cloudy in r]
    assert all(r.split()[5] == "signed" for r in requests)
    assert stac_world.sas_requests  # tokens came from the local SAS endpoint
    extra = fetched_2020["items"]["landsat_st"].extra
    assert extra["scene_count"] == "4" and cloudy not in extra["scene_id"]
    assert set(extra["sensor"].split(",")) == {"LC08", "LE07"}


def test_neighbouring_zone_scene_is_reprojected_onto_the_city_zone(fetched_2020, stac_world):
    grid = landsat_grid(CITY)
    inside = source_index(stac_world, "zone18", grid)[2]
    only_zone18 = inside.copy()
    for role in ("clear", "second", "slc_off"):
        only_zone18 &= ~source_index(stac_world, role, grid)[2]
    assert only_zone18.sum() > 10_000, "the fixture should give zone 18 pixels of its own"
    qa = scene_band(stac_world, "zone18", "qa_pixel", grid)
    dn = scene_band(stac_world, "zone18", "lwir11", grid)
    want = np.where(((qa & INVALID_BITS) == 0) & (dn != 0), dn * ST_SCALE + ST_OFFSET, -9999)
    data, profile = _read(fetched_2020["items"]["landsat_st"])
    assert profile["crs"].to_epsg() == 32619
    got = data[1][only_zone18]
    agree = np.isclose(got, want[only_zone18], atol=2e-4)
    assert agree.mean() > 0.999, f"{(~agree).sum()} reprojected pixels differ"


def test_slc_off_gaps_are_invalid_never_zero(fetched_2020: dict, stac_world: StacWorld) -> None:
    grid = landsat_grid(CITY)
    own = source_index(stac_world, "slc_off", grid)[2]
    for role in ("clear", "second", "zone18"):
        own &= ~source_index(stac_world, role, grid)[2]
    qa = scene_band(stac_world, "slc_off", "qa_pixel", grid)
    gaps = own & (qa == 1)
    assert gaps.sum() > 1000
    ndvi, _ = _read(fetched_2020["items"]["landsat_ndvi"])
    st, _ = _read(fetched_2020["items"]["landsat_st"])
    rgb, _ = _read(fetched_2020["items"]["landsat_c2l2"])
    assert (ndvi[0][gaps] == -9999).all() and (st[:, gaps] == -9999).all()
    assert (rgb[:, gaps] == 0).all()
    clear = own & ((qa & INVALID_BITS) == 0)
    assert (ndvi[0][clear] != -9999).all() and (ndvi[0][clear] != 0).all()


def test_dem_mosaic_copies_the_tiles_on_their_lattice(fetched_2020: dict, stac_world) -> None:
    item = fetched_2020["items"]["cop_dem_glo30"]
    data, profile = _read(item)
    assert profile["crs"].to_epsg() == 4326 and profile["nodata"] == -32767
    transform = profile["transform"]
    expected = np.full(data.shape[1:], -32767, dtype=np.float32)
    for tile_id in item.extra["tile_ids"].split(","):
        href = stac_world.items[tile_id]["assets"]["data"]["href"]
        with rasterio.open(stac_world.local_path(href)) as src:
            whole = src.read(1)
            col0 = round((transform.c - src.transform.c) / src.transform.a)
            row0 = round((transform.f - src.transform.f) / src.transform.e)
        rows, cols = np.mgrid[0 : data.shape[1], 0 : data.shape[2]]
        rows, cols = rows + row0, cols + col0
        inside = (rows >= 0) & (rows < whole.shape[0]) & (cols >= 0) & (cols < whole.shape[1])
        values = whole[np.clip(rows, 0, whole.shape[0] - 1), np.clip(cols, 0, whole.shape[1] - 1)]
        expected = np.where(inside & (expected == -32767), values, expected)
    np.testing.assert_array_equal(data[0], expected)
    assert (data[0] == -32767).sum() > 0  # the tiles' voids stay nodata
    assert len(item.extra["tile_ids"].split(",")) == 2


def test_a_southern_scene_in_the_northern_zone_code_lands_on_the_city_zone(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """USGS's 32634 scene (negative northings) of Cape Town, read into 32734 without warping."""
    item = adapters(stac_world)["landsat_st"].fetch(SOUTH_CITY, 2020, tmp_path)
    data, profile = _read(item)
    assert profile["crs"].to_epsg() == 32734
    grid = landsat_grid(SOUTH_CITY)
    assert profile["transform"] == grid.transform
    qa = scene_band(stac_world, "south", "qa_pixel", grid)
    dn = scene_band(stac_world, "south", "lwir11", grid)
    clear = ((qa & INVALID_BITS) == 0) & (dn != 0)
    want = np.where(clear, dn * ST_SCALE + ST_OFFSET, -9999)
    assert clear.sum() > 100_000
    np.testing.assert_allclose(data[1], want, atol=2e-4)
    np.testing.assert_allclose(data[0], want, atol=2e-4)  # one observation: mean = median


# ---- platforms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "year", "thermal", "sensor"),
    [("tm", 2009, "lwir", "LT05"), ("oli2", 2022, "lwir11", "LC09")],
)
def test_landsat_5_and_9_bands_are_read_under_their_own_asset_names(
    stac_world: StacWorld, tmp_path: Path, role: str, year: int, thermal: str, sensor: str
) -> None:
    """TM calls its thermal band ``lwir`` (ST_B6), TIRS ``lwir11`` (ST_B10); the reflective
    bands keep their common names whatever the sensor numbers them."""
    scene = stac_world.scenes[role]
    assets = stac_world.items[scene.scene_id]["assets"]
    (other,) = {"lwir", "lwir11"} - {thermal}
    assert thermal in assets and other not in assets
    chosen = adapters(stac_world)
    before = len(stac_world.log_lines())
    st = chosen["landsat_st"].fetch(CITY, year, tmp_path)
    ndvi = chosen["landsat_ndvi"].fetch(CITY, year, tmp_path)
    rgb = chosen["landsat_c2l2"].fetch(CITY, year, tmp_path)
    requested = {line.split()[1].rsplit("/", 1)[1] for line in stac_world.log_lines()[before:]}
    wanted = {"red", "green", "blue", "nir08", thermal, "qa_pixel"}
    assert requested == {assets[key]["href"].rsplit("/", 1)[1] for key in wanted}

    stacks = expected_stacks(stac_world, ["thermal", "red", "nir08", "green"], roles=[role])
    kelvin = stacks["thermal"][0]
    assert np.isfinite(kelvin).sum() > 100_000
    data, _ = _read(st)
    for band in data:  # one observation: mean = median
        np.testing.assert_allclose(band, np.where(np.isfinite(kelvin), kelvin, -9999), atol=2e-4)
    red, nir = stacks["red"][0], stacks["nir08"][0]
    want = np.where(np.isfinite(red), (nir - red) / (nir + red), -9999)
    np.testing.assert_allclose(_read(ndvi)[0][0], want, atol=1e-6)
    green = _read(rgb)[0][1]
    want_green = np.where(
        np.isfinite(red), np.clip(np.rint(1 + 254 * stacks["green"][0] / 0.3), 1, 255), 0
    )
    assert np.abs(green.astype(int) - want_green).max() <= 1  # float32 rounding at .5
    for item in (st, ndvi, rgb):
        assert item.extra["sensor"] == sensor and item.extra["scene_id"] == scene.scene_id
    provenance = Path(st.href("data")).with_name(st.extra["stac_item_file"])
    (source,) = json.loads(provenance.read_text(encoding="utf-8"))["citycube:sources"]
    assert source["platform"] == scene.platform and set(source["assets"]) == {thermal, "qa_pixel"}


def test_an_asset_without_scale_and_offset_is_a_read_error_not_raw_counts(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """The spec takes each scene's scale and offset from ``raster:bands``: a thermal asset that
    gives none cannot be turned into Kelvin, and raw counts must not pass for Kelvin."""
    scene = stac_world.scenes["unscaled"]
    chosen = adapters(stac_world)
    before = len(stac_world.log_lines())
    with pytest.raises(SourceReadError) as caught:
        chosen["landsat_st"].fetch(CITY, 2017, tmp_path)
    error = caught.value
    assert error.reason == "missing_scale"
    for part in ("landsat_st", "pc:landsat-c2-l2", CITY, "2017", scene.scene_id, "'lwir11'"):
        assert part in str(error), part
    # Found from the item before any pixel is read: not one window was fetched for nothing.
    assert not [line for line in stac_world.log_lines()[before:] if scene.scene_id in line]
    assert not (tmp_path / "landsat_st" / CITY / "2017").exists()
    assert not list((tmp_path / "landsat_st" / CITY).glob(".2017.*"))
    # Its reflectance assets declare theirs: the same scene's NDVI is made.
    ndvi = chosen["landsat_ndvi"].fetch(CITY, 2017, tmp_path)
    assert ndvi.extra["scene_id"] == scene.scene_id


# ---- processing reads the items unchanged -----------------------------------------------------


def test_processing_reads_the_stac_items_like_the_sample_ones(fetched_2020: dict, tmp_path):
    catalogue = load_catalogue()
    chosen = fetched_2020["adapters"]
    sources = SourceSet(chosen.values(), name="loopback")
    release = Release(tmp_path / "release", "t")
    for code in ("HEAT", "NDVI", "OPT", "DEM"):
        modality = catalogue.get(code)
        process_partition(modality, catalogue, CITY, 2020, sources, release)
        rows = pq.read_table(release.observations_file(CITY, 2020, code)).to_pylist()
        assert rows and any(r["available"] for r in rows), code
        assert not any(r["synthetic"] for r in rows), code


# ---- tokens ----------------------------------------------------------------------------------


def test_the_sas_token_is_in_no_written_file_or_record(fetched_2020: dict) -> None:
    secret = SAS_TOKEN.split("sig=")[1]
    for path in Path(fetched_2020["dest"]).rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert secret.encode() not in content, path
            assert b"sig=" not in content, path
    for item in fetched_2020["items"].values():
        assert secret not in json.dumps(dict(item.extra)) + json.dumps(
            {k: str(v) for k, v in item.files.items()}
        )


# ---- bytes -----------------------------------------------------------------------------------


def test_bytes_fetched_stay_close_to_the_windows_needed(fetched_2020: dict, stac_world) -> None:
    """Bytes served against the compressed tiles the city-year's windows need, each window
    counted once however many products use it (OPT and NDVI both use red); the DEM's 1° tiles
    are mostly outside the city, so there the whole files would be far more."""
    totals = byte_accounting(stac_world, fetched_2020["requests"], CITY)
    assert totals["landsat"]["needed"] and totals["dem"]["needed"]
    report = []
    for kind, t in totals.items():
        if not t["fetched"]:
            continue
        ratio = t["fetched"] / t["needed"]
        report.append(
            f"{kind}: fetched {t['fetched']:,} B for windows needing {t['needed']:,} B "
            f"(ratio {ratio:.3f}; whole files {t['whole']:,} B)"
        )
        assert ratio <= 1.5, report[-1]
    print(
        "\n" + "\n".join(report) + f"\nfetch of 3 products + DEM: {fetched_2020['seconds']:.2f} s"
    )
    assert totals["dem"]["fetched"] < 0.5 * totals["dem"]["whole"]


# ---- faults ----------------------------------------------------------------------------------


def _thermal_file(world: StacWorld, role: str) -> str:
    scene = world.scenes[role]
    return world.items[scene.scene_id]["assets"][scene.thermal_asset]["href"].rsplit("/", 1)[1]


def test_server_errors_are_retried_then_the_read_succeeds(stac_world: StacWorld, tmp_path) -> None:
    name = _thermal_file(stac_world, "faulty")
    stac_world.set_faults([{"match": name, "status": 500, "times": 2}])
    before = len(stac_world.log_lines())
    try:
        item = adapters(stac_world)["landsat_st"].fetch(CITY, 2019, tmp_path)
    finally:
        stac_world.set_faults([])
    lines = [line for line in stac_world.log_lines()[before:] if name in line]
    assert sum(" 500 " in line for line in lines) == 2
    assert any(" 206 " in line for line in lines)
    assert Path(item.href("data")).exists()


def test_a_retried_read_logs_its_failures_without_the_token(
    stac_world: StacWorld, tmp_path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture
) -> None:
    """GDAL's error messages and the retry warnings name the failing URL; never its SAS query."""
    caplog.set_level(logging.DEBUG)
    name = _thermal_file(stac_world, "faulty")
    stac_world.set_faults([{"match": name, "status": 500, "times": 2}])
    try:
        adapters(stac_world)["landsat_st"].fetch(CITY, 2019, tmp_path)
    finally:
        stac_world.set_faults([])
    out, err = capfd.readouterr()
    shown = "\n".join([caplog.text, out, err])
    assert name in shown and "500" in shown  # the failures were reported
    assert TOKEN_SECRET not in shown and "sig=" not in shown


def test_persistent_server_errors_end_in_a_clear_transient_error(
    stac_world, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    name = _thermal_file(stac_world, "faulty")
    stac_world.set_faults([{"match": name, "status": 503}])
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(SourceFetchError) as caught:
            adapters(stac_world)["landsat_st"].fetch(CITY, 2019, tmp_path)
    finally:
        stac_world.set_faults([])
    # GDAL's own messages name the URL it read, signed: rasterio relays them to logging.
    assert "503" in caplog.text and name in caplog.text
    assert SAS_TOKEN.split("sig=")[1] not in caplog.text and "sig=" not in caplog.text
    error = caught.value
    assert error.transient and error.reason == "server_error"
    scene = stac_world.scenes["faulty"].scene_id
    for word in ("landsat_st", "Boston", "2019", scene, "lwir11", "503"):
        assert word in str(error)
    assert SAS_TOKEN.split("sig=")[1] not in str(error)
    assert not (tmp_path / "landsat_st" / CITY / "2019" / "_complete.json").exists()


def test_a_timeout_is_retried_within_its_bound_then_reported(stac_world, tmp_path) -> None:
    name = _thermal_file(stac_world, "faulty")
    stac_world.set_faults([{"match": name, "delay_s": 2.5}])
    started = time.monotonic()
    try:
        with pytest.raises(SourceFetchError) as caught:
            adapters(stac_world, timeout_s=1, retry_attempts=2)["landsat_st"].fetch(
                CITY, 2019, tmp_path
            )
    finally:
        stac_world.set_faults([])
    assert caught.value.transient and "2019" in str(caught.value)
    assert time.monotonic() - started < 15


def test_a_429_from_the_stac_api_waits_as_long_as_retry_after_asks(stac_world, tmp_path) -> None:
    with throttled_api(stac_world.api_url, "/search", [(429, {"Retry-After": "1"})]) as api:
        started = time.monotonic()
        with pytest.raises(SourceUnavailableError) as caught:
            adapters(stac_world, api_url=api.url)["landsat_ndvi"].fetch(CITY, 2005, tmp_path)
        elapsed = time.monotonic() - started
    assert caught.value.reason == "no_scenes"  # the search was answered in the end
    searches = [(at, status) for at, _, path, status in api.seen if path.startswith("/search")]
    assert [status for _, status in searches] == [429, 200]
    # The back-off alone waits at most retry_wait_max_s = 0.2 s (plus 0.05 s of jitter).
    assert searches[1][0] - searches[0][0] >= 0.95
    assert elapsed < 10


def test_a_retry_after_beyond_the_retry_bound_fails_at_once_saying_so(stac_world, tmp_path):
    answers = [(429, {"Retry-After": "120"})] * 3
    with throttled_api(stac_world.api_url, "/search", answers) as api:
        started = time.monotonic()
        with pytest.raises(SourceFetchError) as caught:
            adapters(stac_world, api_url=api.url, retry_total_s=5)["landsat_ndvi"].fetch(
                CITY, 2005, tmp_path
            )
        elapsed = time.monotonic() - started
    assert elapsed < 4  # neither 120 s nor the 5 s bound
    error = caught.value
    assert error.transient and error.reason == "search_failed"
    for part in ("landsat_ndvi", CITY, "2005", "429", "retry after 120 s", "5 s retry bound"):
        assert part in str(error), part
    assert sum(path.startswith("/search") for _, _, path, _ in api.seen) == 1


def test_a_429_from_the_token_endpoint_waits_as_long_as_retry_after_asks(stac_world) -> None:
    root = stac_world.sas_url.removesuffix("/token")
    with throttled_api(root, "/token/", [(429, {"Retry-After": "1"})]) as sas:
        signer = adapters(stac_world, sas_url=f"{sas.url}/token")["landsat_st"].signer
        href = stac_world.items[stac_world.scenes["clear"].scene_id]["assets"]["red"]["href"]
        signed = signer.sign(href)
    assert SAS_TOKEN in signed
    (refused, _), (answered, status) = [(at, status) for at, _, _, status in sas.seen]
    assert status == 200 and answered - refused >= 0.95


def test_a_truncated_cog_is_a_read_error_naming_the_item(stac_world, tmp_path) -> None:
    with pytest.raises(SourceReadError) as caught:
        adapters(stac_world)["landsat_st"].fetch(CITY, 2018, tmp_path)
    assert caught.value.reason == "corrupt_asset"
    assert stac_world.scenes["truncated"].scene_id in str(caught.value)
    assert "qa_pixel" in str(caught.value) and "2018" in str(caught.value)


def test_an_empty_search_is_unavailable_with_a_reason_not_zeros(stac_world, tmp_path) -> None:
    with pytest.raises(SourceUnavailableError) as caught:
        adapters(stac_world)["landsat_ndvi"].fetch(CITY, 2005, tmp_path)
    assert caught.value.reason == "no_scenes"
    assert "Boston" in str(caught.value) and "2005" in str(caught.value)
    assert not list(tmp_path.rglob("*.TIF"))


def test_an_unreachable_api_is_a_transient_search_error(stac_world, tmp_path) -> None:
    from pipelines.ports import free_loopback_port

    nobody = f"http://127.0.0.1:{free_loopback_port()}"
    chosen = adapters(stac_world, api_url=nobody, retry_attempts=2)
    with pytest.raises(SourceFetchError) as caught:
        chosen["landsat_st"].fetch(CITY, 2020, tmp_path)
    assert caught.value.transient and caught.value.reason == "search_failed"


# ---- through Dagster -------------------------------------------------------------------------


@pytest.mark.e2e
def test_dagster_builds_heat_and_dem_from_the_loopback_stac_api(stac_world, tmp_path) -> None:
    """A source set that picks the STAC family, materialised through the Dagster assets."""
    import dagster as dg
    import yaml

    from pipelines.definitions import build_definitions
    from pipelines.resources import ComputeResource, CubeResource
    from tests.conftest import materialize_keys

    stac_world.set_faults([])
    source_set = tmp_path / "source_set.yaml"
    spec = {
        "name": "loopback-stac",
        "default": "sample",
        "products": {"landsat_st": "planetary-computer", "cop_dem_glo30": "planetary-computer"},
        "options": {"sample": {"seed": 0}, "planetary-computer": stac_world.options()},
    }
    source_set.write_text(yaml.safe_dump(spec), encoding="utf-8")
    cube = CubeResource(
        data_root=str(tmp_path / "data"), release_version="t", source_set=str(source_set)
    )
    resources = {"cube": cube, "compute": ComputeResource(workers=1)}
    definitions = build_definitions()
    instance = dg.DagsterInstance.ephemeral()
    for keys, partition in (
        (["sources/landsat_st", "derived/heat"], f"{CITY}|2020"),
        (["sources/cop_dem_glo30", "derived/dem"], CITY),
    ):
        result = materialize_keys(
            definitions, keys, partition, resources=resources, instance=instance
        )
        assert result.success  # type: ignore[attr-defined]
    derived = cube.release().draft_dir / "derived"
    heat = pq.read_table(derived / "HEAT" / CITY / "2020.parquet")
    assert set(heat.column("source_id").to_pylist()) == {"pc:landsat-c2-l2"}
    assert not any(heat.column("synthetic").to_pylist())
    dem_files = list((derived / "DEM" / CITY).glob("*.parquet"))
    assert dem_files
    assert set(pq.read_table(dem_files[0]).column("source_id").to_pylist()) == {"pc:cop-dem-glo-30"}
