"""The Landsat adapter on items as real catalogues serve them, on loopback.

A world of its own (rustac's STAC API, the Range-serving file server, the SAS endpoint), so its
scenes change no other test's composites: a scene with negative and above-one surface
reflectance, a scene whose item lists no ``qa_pixel``, a scene whose band file is gone from the
server (404), and scenes in USGS's own STAC form (collections ``landsat-c2l2-sr`` and
``landsat-c2l2-st``, platform ``LANDSAT_8``, no ``raster:bands``). Every expected value is
computed here from the served files, read whole with rasterio.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import yaml
from affine import Affine
from pyproj import CRS

from citycube.errors import SourceReadError, SourceUnavailableError
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.grids import landsat_grid
from tests.processes import stop_process
from tests.stac_expected import expected_stacks, quiet
from tests.stac_fixtures import (
    CITY,
    LANDSAT_ACCOUNT,
    ROOT,
    SR_OFFSET,
    SR_SCALE,
    SceneSpec,
    StacWorld,
    _SasHandler,
    collection,
    scene_arrays,
    start_stac_api,
    wait_for,
    write_cog,
    write_scene,
)

USGS_HOST = "https://landsatlook.usgs.gov/data/"
"""Where USGS's own STAC items point their assets."""
DARK = (slice(100, 120), slice(100, 140))
"""Scene pixels where red is 0.02 and nir −0.019 (a dark-water retrieval below 0)."""
DARK_SWAPPED = (slice(150, 170), slice(100, 140))
"""Scene pixels where red is −0.019 and nir 0.02."""
BRIGHT = (slice(200, 210), slice(100, 140))
"""Scene pixels where red is 1.05 (above the valid range) and nir 0.5."""


def _counts(reflectance: float) -> int:
    return round((reflectance - SR_OFFSET) / SR_SCALE)


def _scenes() -> dict[str, SceneSpec]:
    grid = landsat_grid(CITY)
    gx, gy = grid.transform.c, grid.transform.f

    def at(col: int, row: int) -> tuple[float, float]:
        return (gx + 30 * col, gy - 30 * row)

    def scene(
        sid: str, platform: str, year: int, where: tuple[int, int], cover: float, seed: int
    ) -> SceneSpec:
        when = datetime(year, 6, 1 + seed % 20, 15, 30, tzinfo=UTC)
        return SceneSpec(sid, platform, 32619, at(*where), (256, 256), when, cover, seed, False)

    return {
        # 2016: reflectance outside 0–1 in one scene, a valid scene over the same pixels.
        "dark": scene(
            "LC08_L2SP_012031_20160605_20200906_02_T1", "landsat-8", 2016, (100, 100), 5.0, 21
        ),
        "valid": scene(
            "LC08_L2SP_011031_20160614_20200906_02_T1", "landsat-8", 2016, (120, 90), 9.0, 22
        ),
        # 2015: the least cloudy scene's item lists no qa_pixel; the other is complete.
        "no_qa": scene(
            "LC08_L2SP_012031_20150603_20200909_02_T1", "landsat-8", 2015, (100, 100), 3.0, 23
        ),
        "complete": scene(
            "LC08_L2SP_011031_20150612_20200909_02_T1", "landsat-8", 2015, (150, 120), 11.0, 24
        ),
        # 2014: the only scene lists no qa_pixel.
        "lone_no_qa": scene(
            "LC08_L2SP_012031_20140616_20200911_02_T1", "landsat-8", 2014, (100, 100), 4.0, 25
        ),
        # 2013: the red file of the only scene is gone from the server.
        "gone": scene(
            "LC08_L2SP_012031_20130613_20200912_02_T1", "landsat-8", 2013, (100, 100), 4.0, 26
        ),
        # 2021: served in USGS's own form only.
        "usgs8": scene(
            "LC08_L2SP_012031_20210609_20210615_02_T1", "landsat-8", 2021, (100, 100), 6.0, 27
        ),
        "usgs7": scene(
            "LE07_L2SP_012031_20210617_20210713_02_T1", "landsat-7", 2021, (180, 140), 7.0, 28
        ),
    }


def _rewrite_bands(storage: Path, item: dict[str, Any], scene: SceneSpec) -> None:
    """Write the scene's red and nir08 again with the out-of-range patches."""
    arrays = scene_arrays(scene)
    red, nir = arrays["red"].copy(), arrays["nir08"].copy()
    for patch, r, n in ((DARK, 0.02, -0.019), (DARK_SWAPPED, -0.019, 0.02), (BRIGHT, 1.05, 0.5)):
        red[patch], nir[patch] = _counts(r), _counts(n)
    x0, y0 = scene.top_left_xy
    for key, data in (("red", red), ("nir08", nir)):
        path = storage / LANDSAT_ACCOUNT / item["assets"][key]["href"].split("/", 3)[3]
        write_cog(path, data, CRS.from_epsg(scene.epsg), Affine(30, 0, x0, 0, -30, y0), 0)


def _usgs_items(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The scene as USGS's own STAC serves it: an SR and an ST item, platform in upper case
    with an underscore, hrefs on USGS's host, no ``raster:bands``."""
    out = []
    for suffix, keys in (
        ("SR", ("red", "green", "blue", "nir08", "qa_pixel")),
        ("ST", ("lwir", "lwir11", "qa_pixel")),
    ):
        usgs = json.loads(json.dumps(item))
        usgs["id"] = f"{item['id']}_{suffix}"
        usgs["collection"] = f"landsat-c2l2-{suffix.lower()}"
        usgs["properties"]["platform"] = item["properties"]["platform"].upper().replace("-", "_")
        usgs["assets"] = {}
        for key in keys:
            if key in item["assets"]:
                asset = dict(item["assets"][key])
                asset.pop("raster:bands")
                asset["href"] = USGS_HOST + asset["href"].split("/", 3)[3]
                usgs["assets"][key] = asset
        out.append(usgs)
    return out


@contextmanager
def _world(base: Path) -> Iterator[tuple[StacWorld, list[dict[str, Any]]]]:
    storage = base / "storage"
    scenes = _scenes()
    items = {s.scene_id: write_scene(storage, s) for s in scenes.values()}
    _rewrite_bands(storage, items[scenes["dark"].scene_id], scenes["dark"])
    served = dict(items)
    for role in ("no_qa", "lone_no_qa"):
        served[scenes[role].scene_id] = json.loads(json.dumps(items[scenes[role].scene_id]))
        del served[scenes[role].scene_id]["assets"]["qa_pixel"]
    gone = items[scenes["gone"].scene_id]["assets"]["red"]["href"]
    (storage / LANDSAT_ACCOUNT / gone.split("/", 3)[3]).unlink()
    usgs = []
    for role in ("usgs8", "usgs7"):
        usgs += _usgs_items(served.pop(scenes[role].scene_id))

    catalogue = base / "catalogue"
    catalogue.mkdir()
    collection_ids = ("landsat-c2-l2", "landsat-c2l2-sr", "landsat-c2l2-st")
    for cid in collection_ids:
        (catalogue / f"{cid}.json").write_text(json.dumps(collection(cid)), encoding="utf-8")
    features = {"type": "FeatureCollection", "features": [*served.values(), *usgs]}
    (catalogue / "items.json").write_text(json.dumps(features), encoding="utf-8")

    log = base / "requests.log"
    files = subprocess.Popen(
        [sys.executable, "-m", "tests.http_file_server", str(storage), str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    api, api_url = start_stac_api(catalogue, base / "rustac.log", collection_ids)
    sas = ThreadingHTTPServer(("127.0.0.1", 0), type("Sas", (_SasHandler,), {"served": []}))
    threading.Thread(target=sas.serve_forever, daemon=True).start()
    try:
        assert files.stdout is not None
        line = files.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the loopback file server did not start: {line!r}")
        wait_for(api_url + "/", api, "rustac serve", base / "rustac.log")
        yield (
            StacWorld(
                api_url=api_url,
                files_url=f"http://127.0.0.1:{int(line)}",
                sas_url=f"http://127.0.0.1:{sas.server_address[1]}/token",
                storage=storage,
                request_log=log,
                faults=base / "faults.json",
                scenes=scenes,
                items=items,
            ),
            usgs,
        )
    finally:
        sas.shutdown()
        sas.server_close()
        for process in (api, files):
            stop_process(process)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StacWorld, list[dict]]]:
    with _world(tmp_path_factory.mktemp("landsat-items")) as running:
        yield running


def adapters(world: StacWorld, **overrides: Any) -> dict[str, StacSource]:
    return {a.product_id: a for a in stac_adapters(world.options(**overrides))}


def _read(item: Any) -> np.ndarray:
    with rasterio.open(item.href("data")) as ds:
        data = ds.read().astype(np.float64)
        return np.where(data == ds.nodata, np.nan, data)


def _provenance(item: Any) -> dict[str, Any]:
    path = Path(item.href("data")).with_name(item.extra["stac_item_file"])
    return json.loads(path.read_text(encoding="utf-8"))


# ---- reflectance outside its valid range -----------------------------------------------------


def test_ndvi_masks_reflectance_outside_0_to_1_and_stays_within_minus_1_to_1(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    """Negative reflectance (dark water) gives ratios like −39 and 39; above-one reflectance is
    a failed retrieval too. Such observations are left out, counted, and the other scene's
    value is the composite there."""
    stac, _ = world
    item = adapters(stac)["landsat_ndvi"].fetch(CITY, 2016, tmp_path)
    got = _read(item)[0]
    finite = got[np.isfinite(got)]
    assert finite.size and finite.min() >= -1.0 and finite.max() <= 1.0

    stacks = expected_stacks(stac, ["red", "nir08"], roles=("dark", "valid"))
    red, nir = stacks["red"], stacks["nir08"]
    in_range = (red >= 0) & (red <= 1) & (nir >= 0) & (nir <= 1)
    seen = np.isfinite(red) & np.isfinite(nir)
    index = np.where(in_range, (nir - red) / np.where(seen, nir + red, 1.0), np.nan)
    want = quiet(np.nanmedian, index, axis=0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-5)

    masked = int((seen & ~in_range).sum())
    assert masked == 40 * (20 + 20 + 10)  # the three patches, all clear and on the grid
    assert item.extra["out_of_range_observations"] == str(masked)
    provenance = _provenance(item)
    assert provenance["properties"]["citycube:out_of_range_observations"] == masked
    assert provenance["properties"]["citycube:valid_range"] == [0.0, 1.0]
    per_scene = {s["id"]: s["out_of_range_pixels"] for s in provenance["citycube:sources"]}
    assert per_scene == {stac.scenes["dark"].scene_id: masked, stac.scenes["valid"].scene_id: 0}


# ---- a scene without its QA asset ------------------------------------------------------------


def test_a_scene_without_qa_pixel_is_dropped_with_its_reason_and_the_rest_composited(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    stac, _ = world
    dropped, kept = stac.scenes["no_qa"].scene_id, stac.scenes["complete"].scene_id
    item = adapters(stac)["landsat_ndvi"].fetch(CITY, 2015, tmp_path)
    assert item.extra["scene_id"] == kept and item.extra["dropped_scene_count"] == "1"
    assert dropped in item.extra["dropped_scenes"] and "qa_pixel" in item.extra["dropped_scenes"]
    provenance = _provenance(item)
    (record,) = provenance["properties"]["citycube:dropped_scenes"]
    assert record["id"] == dropped and record["reason"] == "missing_asset"
    assert "'qa_pixel'" in record["detail"]
    assert [s["id"] for s in provenance["citycube:sources"]] == [kept]

    stacks = expected_stacks(stac, ["red", "nir08"], roles=("complete",))
    red, nir = stacks["red"], stacks["nir08"]
    want = quiet(np.nanmedian, (nir - red) / (nir + red), axis=0)
    got = _read(item)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-5)


def test_a_year_whose_only_scene_lacks_qa_pixel_is_unavailable_saying_why(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    stac, _ = world
    with pytest.raises(SourceUnavailableError) as caught:
        adapters(stac)["landsat_ndvi"].fetch(CITY, 2014, tmp_path)
    error = caught.value
    assert error.reason == "no_complete_scene"
    for part in (stac.scenes["lone_no_qa"].scene_id, "'qa_pixel'", CITY, "2014"):
        assert part in str(error), part
    assert not list(tmp_path.rglob("*.TIF"))


# ---- an asset the server does not have --------------------------------------------------------


def test_a_404_for_an_asset_is_reported_as_missing_not_corrupt(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    stac, _ = world
    with pytest.raises(SourceReadError) as caught:
        adapters(stac)["landsat_ndvi"].fetch(CITY, 2013, tmp_path)
    error = caught.value
    assert error.reason == "asset_not_found"
    for part in (stac.scenes["gone"].scene_id, "'red'", "404", "not at the server"):
        assert part in str(error), part
    assert "GeoTIFF" not in str(error) and "sig=" not in str(error)
    assert not (tmp_path / "landsat_ndvi" / CITY / "2013").exists()


# ---- USGS's own STAC form ---------------------------------------------------------------------


def _usgs_spec(tmp_path: Path, *, fallback: bool) -> Path:
    """The packaged spec with NDVI and HEAT taken from USGS's collections, unsigned."""
    text = (ROOT / "schemas" / "stac_products.yaml").read_text(encoding="utf-8")
    spec = yaml.safe_load(text)
    factors = {"landsat_ndvi": [0.0000275, -0.2], "landsat_st": [0.00341802, 149.0]}
    collections = {"landsat_ndvi": "landsat-c2l2-sr", "landsat_st": "landsat-c2l2-st"}
    for product in spec["products"]:
        if product["product"] in factors:
            product["collection"] = collections[product["product"]]
            product["signing"] = "none"
            if fallback:
                product["scale_fallback"] = factors[product["product"]]
    path = tmp_path / "usgs_stac_products.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _usgs_adapters(stac: StacWorld, spec: Path) -> dict[str, StacSource]:
    mirror = {USGS_HOST: f"{stac.files_url}/{LANDSAT_ACCOUNT}/"}
    return adapters(stac, spec=str(spec), mirror=mirror, products=["landsat_ndvi", "landsat_st"])


def test_usgs_items_are_composited_with_the_documented_collection_2_factors(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    """Platforms 'LANDSAT_8' and 'LANDSAT_7' are Landsat 8 and 7 (Landsat 7's thermal band is
    still ``lwir``), and the bands without ``raster:bands`` take Collection 2's documented
    factors: the composites equal those computed from the files with those factors."""
    stac, usgs = world
    chosen = _usgs_adapters(stac, _usgs_spec(tmp_path, fallback=True))
    ndvi = chosen["landsat_ndvi"].fetch(CITY, 2021, tmp_path / "cube")
    heat = chosen["landsat_st"].fetch(CITY, 2021, tmp_path / "cube")
    roles = ("usgs8", "usgs7")
    assert ndvi.extra["scene_count"] == "2" and ndvi.extra["sensor"] == "LC08,LE07"
    assert {s["collection"] for s in _provenance(ndvi)["citycube:sources"]} == {"landsat-c2l2-sr"}
    thermal = {s["id"]: sorted(s["assets"]) for s in _provenance(heat)["citycube:sources"]}
    assert thermal == {
        stac.scenes["usgs8"].scene_id + "_ST": ["lwir11", "qa_pixel"],
        stac.scenes["usgs7"].scene_id + "_ST": ["lwir", "qa_pixel"],
    }
    assert all(USGS_HOST in json.dumps(i["assets"]) for i in usgs)

    stacks = expected_stacks(stac, ["red", "nir08", "thermal"], roles=roles)
    red, nir = stacks["red"], stacks["nir08"]
    want = quiet(np.nanmedian, (nir - red) / (nir + red), axis=0)
    got = _read(ndvi)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-5)
    mean = quiet(np.nanmean, stacks["thermal"], axis=0)
    got = _read(heat)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(mean))
    np.testing.assert_allclose(got[~np.isnan(mean)], mean[~np.isnan(mean)], atol=2e-4)
    assert 280 < np.nanmean(got) < 310  # Kelvin, not raw counts


def test_usgs_items_without_a_scale_fallback_are_refused_before_any_pixel_is_read(
    world: tuple[StacWorld, list], tmp_path: Path
) -> None:
    stac, _ = world
    chosen = _usgs_adapters(stac, _usgs_spec(tmp_path, fallback=False))
    before = len(stac.log_lines())
    with pytest.raises(SourceReadError) as caught:
        chosen["landsat_st"].fetch(CITY, 2021, tmp_path / "cube")
    error = caught.value
    assert error.reason == "missing_scale" and "scale_fallback" in str(error)
    assert stac.scenes["usgs8"].scene_id in str(error)
    assert stac.log_lines()[before:] == []  # not one byte of a window was fetched
