"""Independent computations over the loopback STAC world's files, for the STAC tests.

Nothing here calls the adapters or the processing code: scene pixels are read whole with
rasterio and indexed with numpy (pyproj for a scene in another zone), composited per pixel, and
brought onto the cube's grids by counting 5 m sub-cells, so every expected value is reached by
another route than the code under test takes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from pyproj import Transformer
from scipy import sparse

from sources.stac.grids import landsat_grid
from tests.stac_fixtures import CITY, SR_OFFSET, SR_SCALE, ST_OFFSET, ST_SCALE, StacWorld

INVALID_BITS = 0b111111
"""QA_PIXEL fill, dilated cloud, cirrus, cloud, shadow and snow."""
USED_2020 = ("clear", "second", "slc_off", "zone18")
"""Boston 2020's scenes that pass the cloud-cover limit."""
SUB_CELL_M = 5.0
"""Side of the sub-cells that 30 m, 25 m, 2 km and 5 km edges all fall on."""


def source_index(world: StacWorld, role: str, grid: GeoBox) -> tuple[np.ndarray, ...]:
    """(rows, cols, inside) of each target pixel's nearest source pixel, via pyproj."""
    scene = world.scenes[role]
    rows, cols = np.mgrid[0 : grid.height, 0 : grid.width]
    t = grid.transform
    x = t.c + (cols + 0.5) * t.a
    y = t.f + (rows + 0.5) * t.e
    if scene.epsg != grid.crs.to_epsg():
        x, y = Transformer.from_crs(grid.crs, scene.epsg, always_xy=True).transform(x, y)
    x0, y0 = scene.top_left_xy
    src_cols = np.floor((x - x0) / 30).astype(int)
    src_rows = np.floor((y0 - y) / 30).astype(int)
    inside = (
        (src_rows >= 0)
        & (src_rows < scene.shape[0])
        & (src_cols >= 0)
        & (src_cols < scene.shape[1])
    )
    return (
        np.clip(src_rows, 0, scene.shape[0] - 1),
        np.clip(src_cols, 0, scene.shape[1] - 1),
        inside,
    )


def scene_band(
    world: StacWorld,
    role: str,
    asset: str,
    grid: GeoBox,
    index: tuple[np.ndarray, ...] | None = None,
) -> np.ndarray:
    """A scene's asset on the target grid (whole file read, indexed with numpy); ``index`` is
    the scene's ``source_index`` on that grid, when already known."""
    scene = world.scenes[role]
    href = world.items[scene.scene_id]["assets"][asset]["href"]
    with rasterio.open(world.local_path(href)) as src:
        whole = src.read(1)
    rows, cols, inside = source_index(world, role, grid) if index is None else index
    return np.where(inside, whole[rows, cols], 0 if asset != "qa_pixel" else 1)


def expected_stacks(
    world: StacWorld,
    assets: list[str],
    roles: Sequence[str] = USED_2020,
    city: str = CITY,
) -> dict[str, np.ndarray]:
    """Per asset, (scenes, rows, cols) of physical values on the city's Landsat grid, NaN where
    not clear (float64). ``thermal`` stands for the scene's own thermal asset."""
    grid = landsat_grid(city)
    out: dict[str, list[np.ndarray]] = {a: [] for a in assets}
    for role in roles:
        scene = world.scenes[role]
        index = source_index(world, role, grid)
        qa = scene_band(world, role, "qa_pixel", grid, index)
        clear = (qa & INVALID_BITS) == 0
        for asset in assets:
            key = scene.thermal_asset if asset == "thermal" else asset
            dn = scene_band(world, role, key, grid, index).astype(np.float64)
            scale, offset = (ST_SCALE, ST_OFFSET) if asset == "thermal" else (SR_SCALE, SR_OFFSET)
            values = dn * scale + offset
            out[asset].append(np.where(clear & (dn != 0), values, np.nan))
    return {a: np.stack(v) for a, v in out.items()}


def quiet(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``function(*args, **kwargs)`` without numpy's all-NaN warnings."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


# ---- onto the cube's grids, by counting sub-cells --------------------------------------------


def axis_shares(
    dst_start: float, dst_step: float, n_dst: int, src_start: float, src_step: float, n_src: int
) -> sparse.csr_array:
    """(n_dst, n_src): the share of each destination interval lying in each source interval,
    along one axis (coordinates increasing), counted in 5 m sub-cells. Every edge must fall on
    the sub-cell lattice; a destination sub-cell outside the source counts for no cell."""
    for edge in (dst_start, dst_step, src_start, src_step):
        assert math.isclose(edge / SUB_CELL_M, round(edge / SUB_CELL_M), abs_tol=1e-9), edge
    per_dst = round(dst_step / SUB_CELL_M)
    centres = dst_start + (np.arange(n_dst * per_dst) + 0.5) * SUB_CELL_M
    dst = np.arange(n_dst).repeat(per_dst)
    src = np.floor((centres - src_start) / src_step).astype(int)
    inside = (src >= 0) & (src < n_src)
    counts = np.full(int(inside.sum()), 1.0 / per_dst)
    # A sparse matrix sums the duplicate (dst, src) entries: one per sub-cell.
    return sparse.csr_array((counts, (dst[inside], src[inside])), shape=(n_dst, n_src))


def grid_shares(
    src_transform: rasterio.Affine,
    src_shape: tuple[int, int],
    dst_x0: float,
    dst_y0: float,
    dst_step: float,
    dst_shape: tuple[int, int],
) -> tuple[sparse.csr_array, sparse.csr_array]:
    """Row and column shares of a north-up destination lattice (top-left corner, square step)
    over a north-up source grid of the same CRS."""
    t = src_transform
    rows = axis_shares(-dst_y0, dst_step, dst_shape[0], -t.f, -t.e, src_shape[0])
    cols = axis_shares(dst_x0, dst_step, dst_shape[1], t.c, t.a, src_shape[1])
    return rows, cols


def area_means(
    values: np.ndarray, valid: np.ndarray, shares: tuple[sparse.csr_array, sparse.csr_array]
) -> tuple[np.ndarray, np.ndarray]:
    """(mean of the valid cells weighted by area, valid share of each destination cell)."""
    rows, cols = shares

    def spread(cells: np.ndarray) -> np.ndarray:
        return np.asarray(cols @ (rows @ cells).T).T

    weight = spread(valid.astype(np.float64))
    total = spread(np.where(valid, values, 0.0))
    return quiet(np.divide, total, weight), weight
