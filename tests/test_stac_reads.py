"""How the Landsat products read their scenes: one QA read per scene, concurrent reads, the
same composite whatever order the reads finish in (loopback services of tests/stac_fixtures)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio

from citycube.errors import SourceReadError
from sources.stac import adapter as adapter_module
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.clearmasks import ClearMaskCache
from tests.stac_fixtures import CITY, StacWorld

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
    """Fetch Boston 2020's Landsat products; their arrays and the requests the server logged."""
    before = len(world.log_lines())
    chosen = _adapters(world, **overrides)
    items = {p: chosen[p].fetch(CITY, 2020, dest) for p in products}
    return {
        "arrays": {p: _data(Path(item.href("data")).parent) for p, item in items.items()},
        "requests": world.log_lines()[before:],
        "items": items,
    }


def _bytes(requests: list[str], part: str) -> int:
    return sum(int(line.split()[4]) for line in requests if part in line.split()[1])


def _assert_same(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]):
    assert a.keys() == b.keys()
    for product in a:
        assert a[product].keys() == b[product].keys() and a[product], product
        for name, array in a[product].items():
            np.testing.assert_array_equal(array, b[product][name], err_msg=f"{product} {name}")


@pytest.fixture(scope="module")
def sequential(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference: every product reads its own QA, one scene after another."""
    stac_world.set_faults([])
    dest = tmp_path_factory.mktemp("sequential")
    return _fetch(stac_world, dest, share_qa=False, read_workers=1)


# ---- one QA read ------------------------------------------------------------------------------


def test_the_three_products_read_each_scenes_qa_once(stac_world, sequential, tmp_path) -> None:
    shared = _fetch(stac_world, tmp_path, read_workers=1)
    _assert_same(shared["arrays"], sequential["arrays"])
    qa_shared = _bytes(shared["requests"], "QA_PIXEL")
    qa_each = _bytes(sequential["requests"], "QA_PIXEL")
    assert qa_shared > 0
    assert qa_shared * 3 == qa_each, (qa_shared, qa_each)
    # The bands are still read by every product that needs them.
    for band in ("SR_B4", "SR_B5", "ST_B10"):
        assert _bytes(shared["requests"], band) == _bytes(sequential["requests"], band)
    masks = sorted((tmp_path / ".stac" / "qa" / CITY / "2020").glob("*.npz"))
    assert len(masks) == 4  # one per scene read


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
    real = adapter_module.read_band
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

    monkeypatch.setattr(adapter_module, "read_band", counted)
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
