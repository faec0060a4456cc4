"""Landsat composites computed block by block equal the whole-window composite pixel for pixel
(values, nodata and QA), at block sizes that divide the window and sizes that do not, with the
caches on and off, and however many blocks are composited at once (loopback services of
tests/stac_fixtures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio

from sources.stac import stac_adapters
from sources.stac.grids import landsat_grid
from sources.stac.reading import Block, grid_blocks
from tests.stac_fixtures import CITY, StacWorld

LANDSAT = ("landsat_c2l2", "landsat_ndvi", "landsat_st")
YEARS = (2020, 2022)
"""2020: four scenes, one warped from the neighbouring zone, one Landsat 7 SLC-off; 2022: one
Landsat 9 scene covering part of the window."""
WHOLE = 100_000
"""A block larger than any city window: the whole window as one block."""


def _composites(world: StacWorld, dest: Path, block_px: int, **overrides: Any) -> dict:
    adapters = {
        a.product_id: a
        for a in stac_adapters(world.options(composite_block_px=block_px, **overrides))
    }
    out = {}
    for year in YEARS:
        for product in LANDSAT:
            item = adapters[product].fetch(CITY, year, dest)
            for role, path in item.files.items():
                with rasterio.open(path) as src:
                    out[(year, product, role)] = (src.read(), src.nodata)
    return out


@pytest.fixture(scope="module")
def whole_window(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict:
    stac_world.set_faults([])
    return _composites(stac_world, tmp_path_factory.mktemp("whole"), WHOLE, composite_workers=1)


def test_the_whole_window_composite_has_values_and_nodata(whole_window: dict) -> None:
    """The reference is not vacuous: each file has valid pixels and nodata pixels (no clear
    observation, SLC-off gaps, outside every scene), and nodata is never 0 for float files."""
    for (year, product, role), (data, nodata) in whole_window.items():
        empty = (data == np.asarray(nodata, data.dtype)).all(axis=0)
        assert empty.any() and (~empty).any(), (year, product, role)
        if data.dtype.kind == "f":
            assert nodata != 0 and not np.isnan(data).any()


@pytest.mark.parametrize(
    ("block_px", "overrides"),
    [
        (512, {}),  # the default (2 blocks at a time): does not divide 1068 × 1067
        (256, {"cache_reads": False, "share_qa": False}),  # throwaway block stores
        (300, {"read_workers": 1, "composite_workers": 1}),  # one thing at a time
        (97, {"composite_workers": 4}),  # many small blocks, neither edge divides, 4 at once
        (1067, {}),  # one full-width column of blocks and a one-row strip
    ],
)
def test_block_wise_composites_equal_the_whole_window_pixel_for_pixel(
    stac_world: StacWorld, whole_window: dict, tmp_path: Path, block_px: int, overrides: dict
) -> None:
    got = _composites(stac_world, tmp_path, block_px, **overrides)
    assert got.keys() == whole_window.keys()
    for key, (data, nodata) in got.items():
        want, want_nodata = whole_window[key]
        assert nodata == want_nodata
        assert data.dtype == want.dtype and data.shape == want.shape, key
        np.testing.assert_array_equal(data, want, err_msg=f"{key} at {block_px} px blocks")
    blocks = grid_blocks(landsat_grid(CITY), block_px)
    if overrides.get("cache_reads", True):
        kept = list((tmp_path / ".stac" / "windows" / CITY / "2020").glob("*.red.*.win"))
        assert len(kept) == 4 * len(blocks)  # the four 2020 scenes' red, block by block
    else:
        assert not list((tmp_path / ".stac").rglob("*.win"))
        assert not list((tmp_path / ".stac" / "scratch").iterdir())  # removed after the fetch


@pytest.mark.parametrize(("shape", "block_px"), [((1068, 1067), 512), ((5, 7), 3), ((4, 4), 4)])
def test_blocks_cover_the_grid_once(shape: tuple[int, int], block_px: int) -> None:
    grid = landsat_grid(CITY)
    grid = Block(0, shape[0], 0, shape[1]).grid_of(grid)
    seen = np.zeros(shape, dtype=int)
    for block in grid_blocks(grid, block_px):
        assert 0 < block.shape[0] <= block_px and 0 < block.shape[1] <= block_px
        seen[block.slices] += 1
    assert (seen == 1).all()
