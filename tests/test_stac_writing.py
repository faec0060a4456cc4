"""COGs written block by block hold what a COG written whole holds, and a failed write leaves
nothing behind."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from odc.geo.geobox import GeoBox
from pyproj import CRS

from sources.stac.reading import Block, grid_blocks
from sources.stac.writing import CogBlocks, Layer, LayerFile, write_cog

GRID = GeoBox(
    (700, 1100),
    Affine(30, 0, 320_000, 0, -30, 4_700_010),
    CRS.from_epsg(32619),
)
FILE = LayerFile("data", "x.TIF", -9999.0, ("a", "b"), "degC", "A test field")
TAGS = {"CITYCUBE_CITY": "Boston", "SYNTHETIC": "false"}


def _values() -> np.ndarray:
    rng = np.random.default_rng(7)
    values = rng.normal(20, 5, size=(2, GRID.height, GRID.width)).astype(np.float32)
    values[:, 100:300, 50:400] = -9999.0  # a gap
    return values


def _read(path: Path) -> tuple[np.ndarray, dict, dict, tuple, list, bool]:
    with rasterio.open(path) as src:
        return (
            src.read(),
            src.profile,
            src.tags(),
            src.descriptions,
            [src.tags(b) for b in src.indexes],
            bool(src.overviews(1)),
        )


@pytest.mark.parametrize("block_px", [256, 512, 2048])
def test_a_cog_written_in_blocks_equals_the_cog_written_whole(tmp_path: Path, block_px) -> None:
    values = _values()
    write_cog(tmp_path / "whole.TIF", Layer(**vars(FILE), data=values), GRID, TAGS)
    with CogBlocks(tmp_path / "blocks.TIF", FILE, GRID, TAGS) as out:
        for block in grid_blocks(GRID, block_px):
            out.write(block.window(), values[(slice(None), *block.slices)])
    whole, blocks = _read(tmp_path / "whole.TIF"), _read(tmp_path / "blocks.TIF")
    np.testing.assert_array_equal(blocks[0], whole[0])
    for key in ("driver", "dtype", "nodata", "crs", "transform", "count", "compress"):
        assert blocks[1].get(key) == whole[1].get(key), key
    assert blocks[1]["blockxsize"] == whole[1]["blockxsize"] == 512
    assert blocks[2:] == whole[2:]  # tags, band descriptions, band units, overviews
    assert blocks[3] == ("a", "b") and blocks[2]["CITYCUBE_UNITS"] == "degC" and blocks[5]
    with rasterio.open(tmp_path / "blocks.TIF") as src:
        assert src.driver == "GTiff" and src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks.TIF", "whole.TIF"]


def test_a_block_write_that_fails_leaves_no_file(tmp_path: Path) -> None:
    values = _values()
    with (
        pytest.raises(RuntimeError, match="read failed"),
        CogBlocks(tmp_path / "x.TIF", FILE, GRID, TAGS) as out,
    ):
        out.write(Block(0, 512, 0, 512).window(), values[:, :512, :512])
        raise RuntimeError("the next block's read failed")
    assert list(tmp_path.iterdir()) == []


def test_a_write_of_no_block_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="no block was written"),
        CogBlocks(tmp_path / "x.TIF", FILE, GRID, TAGS),
    ):
        pass
    assert list(tmp_path.iterdir()) == []


def test_blocks_written_from_several_threads_in_any_order_give_the_same_cog(tmp_path: Path):
    values = _values()
    write_cog(tmp_path / "whole.TIF", Layer(**vars(FILE), data=values), GRID, TAGS)
    blocks = list(grid_blocks(GRID, 128))
    np.random.default_rng(3).shuffle(blocks)
    with (
        CogBlocks(tmp_path / "threads.TIF", FILE, GRID, TAGS) as out,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        list(pool.map(lambda b: out.write(b.window(), values[(slice(None), *b.slices)]), blocks))
    got, want = _read(tmp_path / "threads.TIF")[0], _read(tmp_path / "whole.TIF")[0]
    np.testing.assert_array_equal(got, want)


def test_a_block_that_arrives_after_the_close_is_refused_not_written(tmp_path: Path) -> None:
    values = _values()
    with CogBlocks(tmp_path / "x.TIF", FILE, GRID, TAGS) as out:
        out.write(Block(0, GRID.height, 0, GRID.width).window(), values)
    with pytest.raises(RuntimeError, match="after it was closed"):
        out.write(Block(0, 512, 0, 512).window(), values[:, :512, :512])
    np.testing.assert_array_equal(_read(tmp_path / "x.TIF")[0], values)
