"""How the Landsat products read their scenes: one QA read per scene, one read per band window
(kept, checksummed, for the other products and for a retry), concurrent reads, the same
composite whatever order the reads finish in (loopback services of tests/stac_fixtures)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio

from citycube.errors import SourceFetchError, SourceReadError
from sources.stac import adapter as adapter_module
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.clearmasks import ClearMaskCache
from sources.stac.grids import landsat_grid
from sources.stac.options import StacFamilyOptions
from sources.stac.reading import AssetRead, grid_blocks
from sources.stac.windows import WindowCache
from tests.stac_fixtures import CITY, SAS_TOKEN, StacWorld

LANDSAT = ("landsat_c2l2", "landsat_ndvi", "landsat_st")


def _adapters(world: StacWorld, **overrides: Any) -> dict[str, StacSource]:
    return {a.product_id: a for a in stac_adapters(world.options(**overrides))}


def _data(item_dir: Path) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(item_dir.glob("*.TIF")):
        with rasterio.open(path) as src:
            out[path.name] = src.read()
    return out


def _fetch(world: StacWorld, dest: Path, products=LANDSAT, **overrides: Any) -> dict[str, Any]:
    """Fetch Boston 2020's Landsat products one after another; their arrays and the requests
    the server logged (all, and per product)."""
    start = len(world.log_lines())
    chosen = _adapters(world, **overrides)
    items, by_product = {}, {}
    for product in products:
        before = len(world.log_lines())
        items[product] = chosen[product].fetch(CITY, 2020, dest)
        by_product[product] = world.log_lines()[before:]
    return {
        "arrays": {p: _data(Path(item.href("data")).parent) for p, item in items.items()},
        "requests": world.log_lines()[start:],
        "by_product": by_product,
        "items": items,
        "dest": dest,
    }


def _file(world: StacWorld, role: str, asset: str) -> str:
    """File name of a scene's asset, as the request log shows it."""
    scene = world.scenes[role].scene_id
    return world.items[scene]["assets"][asset]["href"].rsplit("/", 1)[1]


def _files(requests: list[str]) -> set[str]:
    return {line.split()[1].rsplit("/", 1)[1] for line in requests}


def _bytes(requests: list[str], part: str) -> int:
    return sum(int(line.split()[4]) for line in requests if part in line.split()[1])


def _asset_files(world: StacWorld, *assets: str) -> set[str]:
    """File names of these assets over every Landsat scene (the band numbers in the names
    differ between sensors: red is SR_B3 on Landsat 5/7, SR_B4 on 8/9)."""
    return {
        item["assets"][asset]["href"].rsplit("/", 1)[1]
        for item in world.items.values()
        if item.get("collection") == "landsat-c2-l2"
        for asset in assets
        if asset in item["assets"]
    }


def _bytes_of(requests: list[str], files: set[str]) -> int:
    return sum(int(line.split()[4]) for line in requests if _files([line]) <= files)


def _assert_same(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]):
    assert a.keys() == b.keys()
    for product in a:
        assert a[product].keys() == b[product].keys() and a[product], product
        for name, array in a[product].items():
            np.testing.assert_array_equal(array, b[product][name], err_msg=f"{product} {name}")


@pytest.fixture(scope="module")
def sequential(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference: every product reads its own QA and bands, one scene after another, and
    keeps nothing."""
    stac_world.set_faults([])
    dest = tmp_path_factory.mktemp("sequential")
    return _fetch(stac_world, dest, share_qa=False, cache_reads=False, read_workers=1)


# ---- one read per QA mask and band window -----------------------------------------------------


def test_the_three_products_read_each_scenes_qa_and_red_band_once(
    stac_world, sequential, tmp_path
) -> None:
    """OPT, then NDVI, then HEAT: NDVI finds every red window OPT read and reads only nir08."""
    shared = _fetch(stac_world, tmp_path, read_workers=1)
    _assert_same(shared["arrays"], sequential["arrays"])
    qa_shared = _bytes(shared["requests"], "QA_PIXEL")
    qa_each = _bytes(sequential["requests"], "QA_PIXEL")
    assert qa_shared > 0
    assert qa_shared * 3 == qa_each, (qa_shared, qa_each)
    red = _asset_files(stac_world, "red")
    red_shared = _bytes_of(shared["requests"], red)
    assert red_shared > 0
    assert red_shared * 2 == _bytes_of(sequential["requests"], red), "red is read by OPT only"
    assert _bytes_of(shared["by_product"]["landsat_ndvi"], red) == 0
    assert _bytes_of(shared["by_product"]["landsat_ndvi"], _asset_files(stac_world, "nir08")) > 0
    # A band only one product reads is read once either way.
    for assets in (("green",), ("blue",), ("nir08",), ("lwir11", "lwir")):
        files = _asset_files(stac_world, *assets)
        assert _bytes_of(shared["requests"], files) == _bytes_of(sequential["requests"], files)
    blocks = len(grid_blocks(landsat_grid(CITY), StacFamilyOptions().composite_block_px))
    assert blocks > 1
    masks = sorted((tmp_path / ".stac" / "qa" / CITY / "2020").glob("*.npz"))
    assert len(masks) == 4 * blocks  # one per scene read and block
    windows = sorted((tmp_path / ".stac" / "windows" / CITY / "2020").glob("*.win"))
    assert len(windows) == 4 * 5 * blocks  # red, green, blue, nir08, thermal of each scene
    assert not list((sequential["dest"] / ".stac").rglob("*.win"))  # cache_reads: false


def test_a_damaged_window_is_detected_and_read_again(stac_world, sequential, tmp_path) -> None:
    """OPT keeps the red windows; one is bit-flipped and one truncated: NDVI reads those two
    red windows again (and no other red), and its composite is unchanged."""
    _fetch(stac_world, tmp_path, products=("landsat_c2l2",))
    folder = tmp_path / ".stac" / "windows" / CITY / "2020"
    red = {p.name.split(".")[0]: p for p in folder.glob("*.red.*.win")}
    assert len(red) == 4
    flipped, truncated = (red[stac_world.scenes[r].scene_id] for r in ("clear", "zone18"))
    data = bytearray(flipped.read_bytes())
    data[-100] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    again = _fetch(stac_world, tmp_path, products=("landsat_ndvi",))
    reds = _files(again["requests"]) & _asset_files(stac_world, "red")
    assert reds == {_file(stac_world, "clear", "red"), _file(stac_world, "zone18", "red")}
    _assert_same(again["arrays"], {"landsat_ndvi": sequential["arrays"]["landsat_ndvi"]})
    for path in (flipped, truncated):
        assert _whole(path), path  # written again


def _whole(path: Path) -> bool:
    """A cache file whose payload has the length and sha256 its header records."""
    _, header, payload = path.read_bytes().split(b"\n", 2)
    head = json.loads(header)
    return head["size"] == len(payload) and head["sha256"] == hashlib.sha256(payload).hexdigest()


def test_a_retry_after_a_failure_at_a_later_scene_reads_only_the_missing_windows(
    stac_world, sequential, tmp_path
) -> None:
    """NDVI fails at the third scene's nir08 (scenes read in order); the retry reads only that
    window and the fourth scene's, nothing of the first two scenes or the third's red or QA."""
    order = ["slc_off", "clear", "zone18", "second"]  # by eo:cloud_cover, the read order
    failing = _file(stac_world, order[2], "nir08")
    stac_world.set_faults([{"match": failing, "status": 500}])
    try:
        with pytest.raises(SourceFetchError) as caught:
            _fetch(
                stac_world,
                tmp_path,
                products=("landsat_ndvi",),
                read_workers=1,
                retry_attempts=1,
            )
    finally:
        stac_world.set_faults([])
    assert stac_world.scenes[order[2]].scene_id in str(caught.value)
    retry = _fetch(stac_world, tmp_path, products=("landsat_ndvi",), read_workers=1)
    assert _files(retry["requests"]) == {
        failing,
        _file(stac_world, order[3], "qa_pixel"),
        _file(stac_world, order[3], "red"),
        _file(stac_world, order[3], "nir08"),
    }
    _assert_same(retry["arrays"], {"landsat_ndvi": sequential["arrays"]["landsat_ndvi"]})


def test_the_window_cache_keeps_no_token(stac_world, tmp_path) -> None:
    _fetch(stac_world, tmp_path, products=("landsat_st",))
    secret = SAS_TOKEN.split("sig=")[1]
    files = [p for p in (tmp_path / ".stac").rglob("*") if p.is_file()]
    assert any(p.suffix == ".win" for p in files)
    for path in files:
        assert "sig=" not in str(path) and secret not in str(path), path
        content = path.read_bytes()
        assert b"sig=" not in content and secret.encode() not in content, path


def test_a_damaged_mask_is_read_again_from_the_scene(stac_world, sequential, tmp_path) -> None:
    first = _fetch(stac_world, tmp_path, products=("landsat_st",))
    masks = sorted((tmp_path / ".stac" / "qa" / CITY / "2020").glob("*.npz"))
    masks[0].write_bytes(b"not a mask")
    scene = masks[0].name.split(".")[0]
    again = _fetch(stac_world, tmp_path, products=("landsat_ndvi",))
    qa_reads = [r for r in again["requests"] if "QA_PIXEL" in r]
    assert qa_reads and all(scene in r for r in qa_reads)  # only the damaged scene's QA
    assert np.load(masks[0])["bits"].size > 0  # written again
    _assert_same(
        {**first["arrays"], **again["arrays"]},
        {p: sequential["arrays"][p] for p in ("landsat_st", "landsat_ndvi")},
    )


def test_a_qa_read_failure_is_not_kept(stac_world: StacWorld, tmp_path: Path) -> None:
    """2018's QA file is truncated: every product reports it, none finds a mask left behind."""
    chosen = _adapters(stac_world)
    for product in ("landsat_st", "landsat_ndvi"):
        with pytest.raises(SourceReadError) as caught:
            chosen[product].fetch(CITY, 2018, tmp_path)
        assert "qa_pixel" in str(caught.value) and product in str(caught.value)
    assert not list((tmp_path / ".stac" / "qa").rglob("*.npz"))


def test_the_mask_cache_computes_once_per_key(tmp_path: Path) -> None:
    cache = ClearMaskCache(tmp_path)
    calls = []
    mask = np.random.default_rng(0).random((37, 53)) > 0.5

    def compute() -> np.ndarray:
        calls.append(1)
        return mask

    key = {"scene": "S", "qa_href": "https://x/S_QA_PIXEL.TIF", "invalid_mask": 63}
    for _ in range(3):
        np.testing.assert_array_equal(cache.get("Boston", 2020, "S", key, compute), mask)
    assert len(calls) == 1 and cache.hits == 2 and cache.misses == 1
    other = {**key, "invalid_mask": 31}
    cache.get("Boston", 2020, "S", other, compute)
    assert len(calls) == 2


def test_masks_load_from_many_threads_at_once(tmp_path: Path) -> None:
    """Composites load masks block by block in parallel; every load gives the mask (numpy's
    npz header parse is not thread-safe on CPython 3.11 and once failed a composite here)."""
    cache = ClearMaskCache(tmp_path)
    masks = {i: np.random.default_rng(i).random((64, 48)) > 0.5 for i in range(8)}
    keys = {i: {"scene": f"S{i}", "block": [i]} for i in masks}
    for i, mask in masks.items():
        cache.save("Boston", 2020, f"S{i}", keys[i], mask)

    def load_all(_: int) -> bool:
        return all(
            np.array_equal(cache.load("Boston", 2020, f"S{i}", keys[i]), masks[i])
            for _ in range(40)
            for i in masks
        )

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads swap as often as they can
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            assert all(pool.map(load_all, range(8)))
    finally:
        sys.setswitchinterval(switch)


def test_the_window_cache_reads_once_per_key_and_never_trusts_a_damaged_file(tmp_path) -> None:
    cache = WindowCache(tmp_path)
    rng = np.random.default_rng(0)
    window = AssetRead(
        rng.integers(0, 65535, size=(37, 53)).astype(np.uint16), rng.random((37, 53)) > 0.3
    )
    calls = []

    def read() -> AssetRead:
        calls.append(1)
        return window

    key = {"scene": "S", "asset": "red", "href": "https://x/S_SR_B4.TIF", "fill": 0.0}
    for _ in range(3):
        got = cache.get("Boston", 2020, "S", "red", key, read)
        np.testing.assert_array_equal(got.values, window.values)
        np.testing.assert_array_equal(got.covered, window.covered)
        assert got.values.dtype == np.uint16
    assert len(calls) == 1 and cache.hits == 2 and cache.misses == 1
    path = cache.path("Boston", 2020, "S", "red", key)
    for damage in (
        lambda b: b[:-1],  # truncated
        lambda b: b[:-5] + bytes([b[-5] ^ 0x10]) + b[-4:],  # one bit of the payload
        lambda b: b.replace(b'"fill":0.0', b'"fill":1.0'),  # a header naming another window
        lambda b: b"",
    ):
        path.write_bytes(damage(path.read_bytes()))
        got = cache.get("Boston", 2020, "S", "red", key, read)
        np.testing.assert_array_equal(got.values, window.values)
    assert len(calls) == 5
    cache.get("Boston", 2020, "S", "red", {**key, "fill": 1.0}, read)
    assert len(calls) == 6  # another key is another window


def test_a_failed_window_read_keeps_nothing(tmp_path) -> None:
    cache = WindowCache(tmp_path)

    def fail() -> AssetRead:
        raise SourceReadError("truncated", reason="corrupt_asset")

    with pytest.raises(SourceReadError):
        cache.get("Boston", 2020, "S", "red", {"scene": "S"}, fail)
    assert not list(tmp_path.rglob("*.win"))


# ---- concurrent reads ------------------------------------------------------------------------


def test_composites_are_the_same_bit_for_bit_whatever_order_reads_finish(
    stac_world: StacWorld, sequential: dict[str, Any], tmp_path: Path
) -> None:
    """Scenes are read together; the least cloudy one (first in the stack) is made the slowest,
    then the cloudiest: the server sees them finish out of order, the files do not change."""
    order = ["slc_off", "clear", "zone18", "second"]  # by eo:cloud_cover, as the stack is
    runs = []
    for slow in (order[0], order[-1]):
        scene = stac_world.scenes[slow].scene_id
        stac_world.set_faults([{"match": scene, "delay_s": 0.4}])
        try:
            run = _fetch(stac_world, tmp_path / slow, read_workers=4, per_host=4)
        finally:
            stac_world.set_faults([])
        _assert_same(run["arrays"], sequential["arrays"])
        runs.append((scene, run))
    first_scene, first_run = runs[0]
    thermal = [r.split()[1] for r in first_run["requests"] if "_ST_B" in r]
    assert first_scene in thermal[-1], "the slow first scene should finish last"
    assert first_scene not in thermal[0]
    assert first_run["items"]["landsat_st"].extra["scene_id"].split(",")[0] == first_scene


def test_reads_overlap_up_to_the_per_host_limit(stac_world, monkeypatch, tmp_path) -> None:
    """Concurrent asset reads are counted in-process: never more than ``per_host`` in flight."""
    real = adapter_module.read_band_blocks
    lock = threading.Lock()
    state = {"now": 0, "most": 0}

    def counted(*args: Any, **kwargs: Any):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(0.05)
            return real(*args, **kwargs)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(adapter_module, "read_band_blocks", counted)
    stac_world.set_faults([])
    for per_host, workers in ((2, 4), (4, 4), (4, 1)):
        state.update(now=0, most=0)
        _fetch(
            stac_world,
            tmp_path / f"{per_host}-{workers}",
            products=("landsat_st",),
            per_host=per_host,
            read_workers=workers,
        )
        assert state["most"] == min(per_host, workers), (per_host, workers, state)


# ---- the DEM's tile windows -------------------------------------------------------------------


def _dem_tiles(world: StacWorld) -> list[str]:
    """File names of the DEM tiles the world serves, in the order the mosaic reads them (by id)."""
    return [
        world.items[item_id]["assets"]["data"]["href"].rsplit("/", 1)[1]
        for item_id in sorted(world.items)
        if world.items[item_id].get("collection") == "cop-dem-glo-30"
    ]


def _fetch_dem(world: StacWorld, dest: Path, **overrides: Any) -> tuple[np.ndarray, list[str]]:
    """The DEM mosaic fetched for the city, and the tile files requested while doing it."""
    start = len(world.log_lines())
    item = _adapters(world, **overrides)["cop_dem_glo30"].fetch(CITY, None, dest)
    with rasterio.open(item.href("data")) as src:
        mosaic = src.read()
    tiles = set(_dem_tiles(world))
    return mosaic, sorted(_files(world.log_lines()[start:]) & tiles)


def test_the_dem_keeps_its_tile_windows_so_a_retry_or_rerun_reads_no_tile_again(
    stac_world: StacWorld, tmp_path: Path
) -> None:
    """The second tile fails: the retry reads only that tile; with the item removed, a rerun
    reads no tile at all; the mosaic is the one a fetch keeping nothing writes."""
    reference, read_uncached = _fetch_dem(stac_world, tmp_path / "plain", cache_reads=False)
    tiles = _dem_tiles(stac_world)
    assert len(tiles) == 2 and read_uncached == sorted(tiles)
    stac_world.set_faults([{"match": tiles[1], "status": 500}])
    try:
        with pytest.raises(SourceFetchError) as caught:
            _fetch_dem(stac_world, tmp_path / "cached", retry_attempts=1)
    finally:
        stac_world.set_faults([])
    assert "cop_dem_glo30" in str(caught.value)
    mosaic, read = _fetch_dem(stac_world, tmp_path / "cached")
    assert read == [tiles[1]]
    np.testing.assert_array_equal(mosaic, reference)
    kept = sorted((tmp_path / "cached" / ".stac" / "windows" / CITY / "static").glob("*.win"))
    assert len(kept) == 2 and all(_whole(path) for path in kept)
    for item_dir in (tmp_path / "cached" / "cop_dem_glo30").iterdir():
        shutil.rmtree(item_dir)
    again, read_again = _fetch_dem(stac_world, tmp_path / "cached")
    assert read_again == []
    np.testing.assert_array_equal(again, reference)
