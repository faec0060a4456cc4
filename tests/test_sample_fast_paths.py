"""The sample generators' fast paths give the values of the straightforward computations.

Each fast path (separable zooms, separable lattice interpolation, sparse cloud evaluation,
comparison-based binning, reused grain) exists only for speed; these tests pin that it
changes no value, so a generator change that breaks the equality shows up here rather than as
a silent change of the sample data.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from sources.sample.landsat import HAZE, landsat_scene, scene_grid
from sources.sample.world import (
    LinearZoom,
    bin_index,
    grid_utm_xy,
    pixel_grain,
    row_window,
    smoothstep,
    spline_zoom,
    synthetic_city,
)

CITY = "Boston"


@pytest.mark.parametrize(
    ("shape", "factor"),
    [((300, 280), 13.0), ((250, 260), 2.5), ((200, 210), 1.7), ((90, 60), 27.8)],
)
def test_spline_zoom_is_ndimage_zoom(shape: tuple[int, int], factor: float) -> None:
    rng = np.random.default_rng(7)
    coarse = rng.standard_normal((int(shape[0] / factor) + 4, int(shape[1] / factor) + 4))
    coarse = coarse.astype(np.float32)
    expected = ndimage.zoom(coarse, factor, order=3, mode="nearest", grid_mode=False)
    assert np.array_equal(spline_zoom(coarse, factor, shape), expected[: shape[0], : shape[1]])


def test_linear_zoom_is_ndimage_zoom_on_grids_and_pixels() -> None:
    rng = np.random.default_rng(8)
    coarse = rng.standard_normal((102, 97)).astype(np.float32)
    shape = (301, 288)
    expected = ndimage.zoom(coarse, 3, order=1)[: shape[0], : shape[1]]
    zoom = LinearZoom(coarse, 3, shape)
    assert np.array_equal(zoom.grid(), expected)
    rows, cols = np.arange(5, 300, 7), np.arange(0, 288, 5)
    assert np.array_equal(zoom.grid(rows, cols), expected[np.ix_(rows, cols)])
    r, c = rng.integers(0, shape[0], 5000), rng.integers(0, shape[1], 5000)
    assert np.array_equal(zoom.at(r, c), expected[r, c])
    bound = zoom.cell_max()[zoom.row_starts[r], zoom.col_starts[c]]
    assert (expected[r, c] <= bound).all()


def test_separable_lattice_interpolation_matches_the_gathered_one() -> None:
    world = synthetic_city(CITY)
    grid = row_window(scene_grid(world), 300, 420)
    x, y = grid_utm_xy(grid, world.crs)
    separable = world.points(x, y)
    gathered = world.points(*np.broadcast_arrays(x, y))
    assert separable._separable and not gathered._separable
    for name in ("potential", "elevation", "river_offset", "land_score", "texture"):
        assert np.array_equal(separable.field(name), gathered.field(name))
    assert np.array_equal(separable.inside, gathered.inside)


def test_sparse_sky_equals_the_whole_scene_evaluation() -> None:
    world = synthetic_city(CITY)
    for year, has_cirrus in ((2012, False), (2017, True), (2020, False)):
        sky = landsat_scene(world, year).sky
        assert (sky._cirrus is not None) == has_cirrus
        h = sky.shape[0]
        block = sky.rows(0, h)
        density = sky._density.grid()
        threshold = sky._threshold
        assert np.array_equal(block.cloud, density > threshold)
        assert np.array_equal(block.dilated, (density > threshold - HAZE) & ~block.cloud)
        alpha = smoothstep((density - threshold + HAZE) / (2.5 * HAZE)).astype(np.float32)
        assert np.array_equal(block.cloud_alpha, alpha)
        halves = [sky.rows(0, h // 2), sky.rows(h // 2, h)]
        for field in ("cloud_alpha", "cloud", "shadow_alpha", "shadow", "cirrus"):
            joined = np.concatenate([getattr(half, field) for half in halves])
            assert np.array_equal(joined, getattr(block, field)), field


def test_bin_index_is_digitize() -> None:
    values = np.random.default_rng(9).normal(0.8, 0.7, 20_000).astype(np.float32)
    values[:4] = [np.float32(0.4), np.float32(1.4), np.nextafter(np.float32(1.4), 0), 1.0]
    for edges in ((0.4, 1.0), (0.8, 1.4)):
        assert np.array_equal(bin_index(values, edges), np.digitize(values, list(edges)))


def test_reused_grain_is_the_drawn_grain_and_read_only() -> None:
    world = synthetic_city(CITY)
    drawn = pixel_grain(world, "test-grain", (64, 48))
    kept = pixel_grain(world, "test-grain", (64, 48), reuse=True)
    assert np.array_equal(drawn, kept)
    assert pixel_grain(world, "test-grain", (64, 48), reuse=True) is kept
    assert not kept.flags.writeable
