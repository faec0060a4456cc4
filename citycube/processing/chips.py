"""Image chips: warp a source once per city-year onto the city's pixel grid and store it as Zarr.

Image modalities (optical RGB, elevation, land cover, ...) are warped once per city-year onto the
city's tile-aligned :class:`~citycube.grid.tiles.PixelGrid`; every 2 km and 5 km tile is then a
plain window of that grid, so tiles are sliced, never warped one by one.

Work proceeds by 10 km × 10 km blocks on the city's 10 km lattice (:func:`blocks`). Both tile
grids have their edges on that lattice, so every tile lies inside exactly one block, each block
is exactly one chunk of the chip store, and peak memory follows the block rather than the city
— neither its height nor its width.

Validity (AgenticCity-Bench App. B.4) is decided on the source's native grid by
:class:`MaskedSource`; the warp carries it across as the valid fraction of each destination
pixel's source support. A destination pixel is valid when at least half of its support is valid
(``MIN_VALID_FRACTION``). The fraction is computed by warping the validity mask itself with
area-weighted averaging rather than through GDAL's ``NODATA_VALUES_PCT_THRESHOLD`` warp
option: in GDAL 3.10 that
option treats exactly half-valid support as nodata and is ignored by mode resampling, so it
cannot state the rule for categorical sources (see ``tests/test_chips.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import rasterio
import rioxarray  # noqa: F401  (registers the ``.rio`` accessor)
from affine import Affine
from pyproj import CRS
from rasterio.warp import Resampling, reproject
from rasterio.windows import Window

from citycube.catalogue.cities import PARENT_SIZE_M
from citycube.grid.tiles import PixelGrid, Tile, whole_pixels
from citycube.items.rasters import MaskedSource, rio_crs, transformer
from citycube.processing.memory import bound_process_memory, release_freed

__all__ = [
    "MIN_VALID_FRACTION",
    "TilePixelSummary",
    "block_memory",
    "blocks",
    "row_bands",
    "tile_pixel_summaries",
    "warp_block",
    "warp_rows",
]


MIN_VALID_FRACTION = 0.5
"""A destination pixel is valid when at least this share of its source support is valid."""

SOURCE_MARGIN_PX = 3
"""Source pixels added around the destination footprint so edge pixels see their full support."""

_FRACTION_TOLERANCE = 1e-6
"""Float slack so a support that is exactly half valid is not lost to rounding."""


SOURCE_CACHE_BYTES = 8 * 1024 * 1024
"""GDAL block cache while a city is warped block by block: about the source tiles under one
block and its neighbour. GDAL's default (5 % of RAM) would keep every decoded tile of the
source as the blocks sweep across it, so memory would follow the source, not the block."""


# --------------------------------------------------------------------------------------------
# Blocks and row bands


def blocks(
    pixel_grid: PixelGrid, block_m: float = PARENT_SIZE_M
) -> list[tuple[int, int, int, int]]:
    """(row_start, row_stop, col_start, col_stop) pixel blocks, lattice-aligned, row-major.

    Block edges sit on multiples of ``block_m`` in easting and northing, so with the default
    10 km every tile of both grids falls inside exactly one block and each block is exactly one
    chunk of the chip store. A grid whose west or north edge is off the lattice gets narrower
    first blocks.
    """
    per_block = whole_pixels(block_m / pixel_grid.resolution, "block size / resolution")
    row_edges = _lattice_edges(pixel_grid.y_max % block_m, per_block, pixel_grid)
    col_edges = _lattice_edges(-pixel_grid.x_min % block_m, per_block, pixel_grid, columns=True)
    return [
        (row_start, row_stop, col_start, col_stop)
        for row_start, row_stop in itertools.pairwise(row_edges)
        for col_start, col_stop in itertools.pairwise(col_edges)
    ]


def row_bands(pixel_grid: PixelGrid, band_height_m: float = PARENT_SIZE_M) -> list[tuple[int, int]]:
    """(row_start, row_stop) pixel-row ranges, lattice-aligned, covering the grid.

    The rows of :func:`blocks`; a band spans the grid's whole width, so work done band by band
    grows with the city's width (prefer blocks).
    """
    rows_per_band = whole_pixels(band_height_m / pixel_grid.resolution, "band height / resolution")
    return list(
        itertools.pairwise(
            _lattice_edges(pixel_grid.y_max % band_height_m, rows_per_band, pixel_grid)
        )
    )


def _lattice_edges(
    offset_m: float, per_block: int, pixel_grid: PixelGrid, *, columns: bool = False
) -> list[int]:
    """Pixel edges on the lattice along one axis, from 0 to the grid's size.

    ``offset_m`` is the distance from the grid's first edge to the first lattice line inside
    it (zero when the edge is on the lattice).
    """
    size = pixel_grid.width if columns else pixel_grid.height
    first = whole_pixels(offset_m / pixel_grid.resolution, "grid edge offset / resolution")
    first %= per_block
    edges = [0]
    next_edge = first or per_block
    while next_edge < size:
        edges.append(next_edge)
        next_edge += per_block
    edges.append(size)
    return edges


@contextmanager
def block_memory() -> Iterator[Callable[[], None]]:
    """Keep a block-by-block sweep's memory to one block; yields a call for after each block.

    Inside, GDAL's block cache is capped at ``SOURCE_CACHE_BYTES`` (restored on exit) and the
    process's allocator is set up by :func:`~citycube.processing.memory.bound_process_memory`. The
    yielded
    call hands memory freed by finished blocks back to the operating system once it amounts to
    more than a margin, so native buffers (warp, codec) of earlier blocks cannot pile up as a
    fragmented heap; at the end of the sweep whatever it freed is handed back. (Applying the
    margin there too saves the next sweep some 40,000 page faults per city-year, ~0.1 s, but
    the kept heap raised a partition's peak by ~15 MiB: what follows the sweep, Arrow's
    writes among it, does not allocate from glibc's heap.)
    """
    bound_process_memory()
    try:
        with rasterio.Env(GDAL_CACHEMAX=SOURCE_CACHE_BYTES):
            yield release_freed
    finally:
        release_freed(force=True)


# --------------------------------------------------------------------------------------------
# Warping


def warp_block(
    source: MaskedSource,
    pixel_grid: PixelGrid,
    row_start: int,
    row_stop: int,
    col_start: int,
    col_stop: int,
    *,
    categorical: bool,
    num_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Warp the source onto one block of the grid: (values[bands,h,w], valid[h,w]).

    Only the source window under the block (plus a margin) is read. Continuous data is averaged
    with area weights over valid source pixels only (float32, or float64 for wide source
    types); categorical data takes the most frequent valid id (mode), so ids are never averaged
    or invented. Values where ``valid`` is False are NaN (continuous) or an arbitrary sentinel
    (categorical) and must not be used.
    """
    if not (
        0 <= row_start < row_stop <= pixel_grid.height
        and 0 <= col_start < col_stop <= pixel_grid.width
    ):
        raise ValueError(
            f"block rows [{row_start}, {row_stop}) × cols [{col_start}, {col_stop}) is outside "
            f"the {pixel_grid.height} × {pixel_grid.width} pixel grid"
        )
    height, width = row_stop - row_start, col_stop - col_start
    dst_transform = pixel_grid.transform @ Affine.translation(col_start, row_start)
    dst_crs = rio_crs(pixel_grid.crs)
    n_bands = len(source.band_names)

    window = _source_window(source, dst_transform, width, height, pixel_grid.crs)
    clipped = _clip_window(window, source.grid.width, source.grid.height)
    if clipped is None:
        return _empty_output(n_bands, height, width, categorical)

    raw_values, raw_valid = source.read(clipped)
    if raw_values.shape[0] != n_bands:
        raise ValueError(
            f"the source read returned {raw_values.shape[0]} bands but declares {n_bands}"
        )
    values, valid = _pad_to_window(raw_values, raw_valid, clipped, window)
    del raw_values, raw_valid
    src_transform = source.grid.transform @ Affine.translation(window.col_off, window.row_off)
    geometry: dict[str, Any] = {
        "src_transform": src_transform,
        "src_crs": rio_crs(source.grid.crs),
        "dst_transform": dst_transform,
        "dst_crs": dst_crs,
        "num_threads": num_threads,
    }

    if categorical:
        supported = _supported(valid, height, width, geometry)
        ids, sentinel = _with_sentinel(values, valid)
        del values, valid
        out = np.full((n_bands, height, width), sentinel, dtype=ids.dtype)
        reproject(
            ids,
            out,
            src_nodata=sentinel,
            dst_nodata=sentinel,
            resampling=Resampling.mode,
            **geometry,
        )
        out_valid = supported & np.all(out != sentinel, axis=0)
    else:
        out, supported = _average_with_support(values, valid, height, width, geometry)
        del values, valid
        out_valid = supported & np.all(np.isfinite(out), axis=0)
        out[:, ~out_valid] = np.nan
    return out, out_valid


def _average_with_support(
    values: np.ndarray, valid: np.ndarray, height: int, width: int, geometry: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Area-weighted average of the valid cells, and which pixels :func:`_supported` keeps.

    When some cells are invalid and the values are float32 (as the fraction is), the valid
    fraction is warped as one more band of the values' own warp, with each band's nodata
    judged on its own (``UNIFIED_SRC_NODATA=NO``): one warp instead of two, same figures.
    """
    float_type = _float_type(values.dtype)
    n_bands = len(values)
    axes = _axis_aligned_weights(geometry, valid.shape, height, width)
    if axes is not None:
        return _separable_average(values, valid, axes, float_type)
    together = float_type is np.float32 and not valid.all()
    stacked = np.empty((n_bands + (1 if together else 0), *valid.shape), dtype=float_type)
    stacked[:n_bands] = values
    stacked[:n_bands, ~valid] = np.nan
    if together:
        stacked[n_bands] = valid
    out = np.full((len(stacked), height, width), np.nan, dtype=float_type)
    reproject(
        stacked,
        out,
        src_nodata=np.nan,
        dst_nodata=np.nan,
        resampling=Resampling.average,
        **({"UNIFIED_SRC_NODATA": "NO"} if together else {}),
        **geometry,
    )
    if not together:
        return out, _supported(valid, height, width, geometry)
    supported = out[n_bands] >= MIN_VALID_FRACTION - _FRACTION_TOLERANCE  # NaN: no support
    return out[:n_bands], supported


@dataclass(frozen=True)
class _AxisWeights:
    """Area weights of one axis: destination cell ``i`` takes ``weight[i, k]`` of source cell
    ``index[i, k]``, for the few ``k`` of the cells its interval overlaps, in source order.

    Slots beyond a destination's overlap (or outside the source) weigh 0 and point at a
    valid cell, so every destination has the same number of slots and one gather per slot
    serves all of them.
    """

    index: np.ndarray
    weight: np.ndarray

    @property
    def covered(self) -> np.ndarray:
        """Share of each destination interval that source cells cover."""
        return self.weight.sum(axis=1)


def _axis_aligned_weights(
    geometry: dict[str, Any], shape: tuple[int, int], height: int, width: int
) -> tuple[_AxisWeights, _AxisWeights] | None:
    """Row and column area weights when source and block share a CRS and both are north-up.

    Then each destination pixel's support is a rectangle of source cells, and the area
    weight of a cell is the product of its row overlap and its column overlap: the warp is
    a weighted sum over a few rows, then over a few columns, a fraction of GDAL's generic
    warp (which transforms coordinates pixel by pixel) for the same area-weighted average
    (``tests/test_chips.py``).
    """
    src, dst = geometry["src_transform"], geometry["dst_transform"]
    if not (src.b == src.d == dst.b == dst.d == 0 and src.a > 0 > src.e and dst.a > 0 > dst.e):
        return None
    src_crs, dst_crs = geometry["src_crs"], geometry["dst_crs"]
    if src_crs is not dst_crs and src_crs != dst_crs:
        return None
    rows = _overlap_weights(-src.f, -src.e, shape[0], -dst.f, -dst.e, height)
    cols = _overlap_weights(src.c, src.a, shape[1], dst.c, dst.a, width)
    return rows, cols


def _overlap_weights(
    src_start: float, src_step: float, n_src: int, dst_start: float, dst_step: float, n_dst: int
) -> _AxisWeights:
    """Share of each destination interval covered by each source interval it overlaps."""
    dst_low = dst_start + dst_step * np.arange(n_dst)
    first = np.floor((dst_low - src_start) / src_step).astype(np.int64)
    span = math.ceil(dst_step / src_step) + 1
    src_index = first[:, None] + np.arange(span)
    src_low = src_start + src_step * src_index
    overlap = np.minimum(dst_low[:, None] + dst_step, src_low + src_step) - np.maximum(
        dst_low[:, None], src_low
    )
    keep = (overlap > dst_step * 1e-9) & (src_index >= 0) & (src_index < n_src)
    return _AxisWeights(
        index=np.where(keep, src_index, 0).astype(np.intp),
        weight=np.where(keep, overlap / dst_step, 0.0),
    )


def _separable_average(
    values: np.ndarray,
    valid: np.ndarray,
    axes: tuple[_AxisWeights, _AxisWeights],
    float_type: type[np.floating],
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_average_with_support` for axis-aligned weights; a band's non-finite cells drop
    out of that band alone, as they do in GDAL with ``UNIFIED_SRC_NODATA=NO``."""
    rows, cols = axes

    def warp(cells: np.ndarray) -> np.ndarray:
        """Weighted sums over the overlapping rows, then columns, in float64 and source order
        (as a sparse row-then-column product sums them); any real or bool ``cells``."""
        by_rows = rows.weight[:, 0, None] * cells[rows.index[:, 0]]
        for k in range(1, rows.index.shape[1]):
            by_rows += rows.weight[:, k, None] * cells[rows.index[:, k]]
        # "clip": the indices are in range, and the default mode buffers the gather.
        out = cols.weight[:, 0] * by_rows.take(cols.index[:, 0], axis=1, mode="clip")
        for k in range(1, cols.index.shape[1]):
            out += cols.weight[:, k] * by_rows.take(cols.index[:, k], axis=1, mode="clip")
        return out

    covered = np.outer(rows.covered, cols.covered)  # the support's area share
    all_valid = bool(valid.all())
    shared = warp(valid)
    out = np.empty((len(values), *covered.shape), dtype=float_type)
    with np.errstate(invalid="ignore", divide="ignore"):
        supported = shared / covered >= MIN_VALID_FRACTION - _FRACTION_TOLERANCE
        for band, cells in enumerate(values):
            finite = np.issubdtype(cells.dtype, np.integer) or bool(np.isfinite(cells).all())
            usable = valid if finite else valid & np.isfinite(cells)
            weight = shared if finite else warp(usable)
            total = warp(cells if finite and all_valid else np.where(usable, cells, 0))
            out[band] = np.where(weight > 0, total / weight, np.nan)
    return out, supported


def _supported(valid: np.ndarray, height: int, width: int, geometry: dict[str, Any]) -> np.ndarray:
    """Destination pixels at least ``MIN_VALID_FRACTION`` of whose source support is valid.

    When every cell of the window is valid the answer is every pixel, without a warp: the
    window covers each pixel's whole support (it has a margin, and a window cut by the
    raster's edge is padded with invalid cells), so each average of ones is one.
    """
    if valid.all():
        return np.ones((height, width), dtype=bool)
    fraction = np.zeros((height, width), dtype=np.float32)
    reproject(valid.astype(np.float32), fraction, resampling=Resampling.average, **geometry)
    return fraction >= MIN_VALID_FRACTION - _FRACTION_TOLERANCE


def warp_rows(
    source: MaskedSource,
    pixel_grid: PixelGrid,
    row_start: int,
    row_stop: int,
    *,
    categorical: bool,
    num_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Warp the source onto full-width rows [row_start, row_stop): (values[bands,h,W], valid).

    The whole-width case of :func:`warp_block`, for callers that want a band or the whole grid.
    """
    if not 0 <= row_start < row_stop <= pixel_grid.height:
        raise ValueError(
            f"rows [{row_start}, {row_stop}) are outside the {pixel_grid.height}-row pixel grid"
        )
    return warp_block(
        source,
        pixel_grid,
        row_start,
        row_stop,
        0,
        pixel_grid.width,
        categorical=categorical,
        num_threads=num_threads,
    )


def _source_window(
    source: MaskedSource, dst_transform: Affine, width: int, height: int, dst_crs: CRS | str
) -> Window:
    """The (unclipped) whole-pixel source window covering the destination block plus a margin."""
    left, top = dst_transform @ (0, 0)
    right, bottom = dst_transform @ (width, height)
    if rio_crs(source.grid.crs) != rio_crs(dst_crs):
        # pyproj's cached transformer: rasterio's transform_bounds builds one per call
        left, bottom, right, top = transformer(dst_crs, source.grid.crs).transform_bounds(
            left, bottom, right, top, densify_pts=21
        )
    inverse = ~source.grid.transform
    cols, rows = zip(*(inverse @ xy for xy in ((left, top), (right, bottom))), strict=True)
    col0 = math.floor(min(cols)) - SOURCE_MARGIN_PX
    row0 = math.floor(min(rows)) - SOURCE_MARGIN_PX
    col1 = math.ceil(max(cols)) + SOURCE_MARGIN_PX
    row1 = math.ceil(max(rows)) + SOURCE_MARGIN_PX
    return Window(col0, row0, col1 - col0, row1 - row0)


def _clip_window(window: Window, width: int, height: int) -> Window | None:
    """The part of ``window`` inside the raster, or None when they do not meet."""
    col0, row0 = max(int(window.col_off), 0), max(int(window.row_off), 0)
    col1 = min(int(window.col_off + window.width), width)
    row1 = min(int(window.row_off + window.height), height)
    if col1 <= col0 or row1 <= row0:
        return None
    return Window(col0, row0, col1 - col0, row1 - row0)


def _pad_to_window(
    values: np.ndarray, valid: np.ndarray, clipped: Window, window: Window
) -> tuple[np.ndarray, np.ndarray]:
    """Place a clipped read inside the full window, marking cells beyond the raster invalid.

    Without this, a destination pixel half outside the source would be judged on its inside
    part alone; outside a source's coverage is unavailable, not absent (AgenticCity-Bench App. B.4).
    """
    if (clipped.col_off, clipped.row_off, clipped.width, clipped.height) == (
        window.col_off,
        window.row_off,
        window.width,
        window.height,
    ):
        return values, valid.astype(bool, copy=False)
    r0, c0 = int(clipped.row_off - window.row_off), int(clipped.col_off - window.col_off)
    h, w = int(clipped.height), int(clipped.width)
    padded_values = np.zeros((values.shape[0], int(window.height), int(window.width)), values.dtype)
    padded_valid = np.zeros((int(window.height), int(window.width)), dtype=bool)
    padded_values[:, r0 : r0 + h, c0 : c0 + w] = values
    padded_valid[r0 : r0 + h, c0 : c0 + w] = valid
    return padded_values, padded_valid


def _float_type(dtype: np.dtype) -> type[np.floating]:
    """float32 for types it holds exactly enough (uint8/int16/uint16/float32), else float64."""
    narrow = (np.uint8, np.int8, np.uint16, np.int16, np.float16, np.float32)
    return np.float32 if any(np.dtype(dtype) == np.dtype(t) for t in narrow) else np.float64


def _with_sentinel(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer ids with invalid cells set to a nodata sentinel that no valid cell uses."""
    if not np.issubdtype(values.dtype, np.integer):
        as_int = np.rint(values[:, valid])
        if not np.array_equal(as_int, values[:, valid]):
            raise ValueError("categorical source holds non-integer values; ids must be integers")
    fits32 = values.dtype.itemsize < 4 or values.dtype == np.int32
    if not fits32 and valid.any():
        present = values[:, valid]
        fits32 = present.min() >= np.iinfo(np.int32).min and present.max() < np.iinfo(np.int32).max
    work = np.int32 if fits32 else np.int64
    ids = np.where(valid, values, 0).astype(work)  # invalid cells may hold NaN or junk
    sentinel = int(np.iinfo(work).min)
    lowest = ids.min(where=valid, initial=np.iinfo(work).max) if valid.any() else None
    if lowest is not None and int(lowest) == sentinel:  # the type's minimum is an id: look on
        present_ids = set(np.unique(ids[:, valid]).tolist())
        while sentinel in present_ids:
            sentinel += 1
    ids[:, ~valid] = sentinel
    return ids, sentinel


def _empty_output(
    n_bands: int, height: int, width: int, categorical: bool
) -> tuple[np.ndarray, np.ndarray]:
    """All-invalid output for rows that the source does not reach."""
    if categorical:
        values = np.full((n_bands, height, width), np.iinfo(np.int32).min, dtype=np.int32)
    else:
        values = np.full((n_bands, height, width), np.nan, dtype=np.float32)
    return values, np.zeros((height, width), dtype=bool)


# --------------------------------------------------------------------------------------------
# Zarr store


# --------------------------------------------------------------------------------------------
# Per-tile pixel summaries


@dataclass(frozen=True)
class TilePixelSummary:
    """Valid-pixel counts and a value summary of one tile's chip window."""

    tile_id: str
    """Tile text id."""
    valid_pixels: int
    """Pixels valid after the warp."""
    total_pixels: int
    """Pixels in the tile window."""
    band_means: tuple[float, ...]
    """Mean of valid pixels per band (continuous); NaN when none is valid; empty if categorical."""
    mode_class: int | None
    """Most frequent valid id, ties to the smallest (categorical); None otherwise or if none."""
    class_counts: tuple[tuple[int, int], ...] | None = None
    """(id, count) of valid pixels in ascending id order (categorical); None otherwise."""

    @property
    def valid_fraction(self) -> float:
        """Share of valid pixels, the quantity the 98 % image rule is checked against."""
        return self.valid_pixels / self.total_pixels if self.total_pixels else 0.0


def tile_pixel_summaries(
    values: np.ndarray,
    valid: np.ndarray,
    row_start: int,
    col_start: int,
    pixel_grid: PixelGrid,
    tiles: Sequence[Tile],
    *,
    categorical: bool,
) -> list[TilePixelSummary]:
    """Summaries of the tiles whose window lies inside the block at (row_start, col_start).

    Called per block with the warped arrays, so tile availability is known without reading
    the store back. Tiles not wholly inside the block are skipped (they belong to another).
    A block holds tiles of two sizes (2 km and 5 km); the tiles of each size usually form a
    lattice of equal windows, whose counts, sums and class counts are then taken for all of
    them at once, else tile by tile.
    """
    n_bands, height, width = values.shape
    if categorical and n_bands != 1:
        raise ValueError(f"categorical chips have one band of ids, got {n_bands}")
    inside: list[tuple[Tile, tuple[int, int, int, int]]] = []
    for tile in tiles:
        row_off, col_off, h, w = pixel_grid.window(tile)
        if (
            row_start <= row_off
            and row_off + h <= row_start + height
            and col_start <= col_off
            and col_off + w <= col_start + width
        ):
            inside.append((tile, (row_off - row_start, col_off - col_start, h, w)))
    by_size: dict[tuple[int, int], list[int]] = {}
    for index, (_, window) in enumerate(inside):
        by_size.setdefault((window[2], window[3]), []).append(index)
    summaries: dict[int, TilePixelSummary] = {}
    for members in by_size.values():
        group = [inside[index] for index in members]
        lattice = _lattice(group)
        if lattice is not None:
            found = _lattice_summaries(values, valid, group, lattice, categorical)
        else:
            found = [_tile_summary(values, valid, t, window, categorical) for t, window in group]
        summaries.update(zip(members, found, strict=True))
    return [summaries[index] for index in range(len(inside))]


@dataclass(frozen=True)
class _Lattice:
    """Tiles on rows × cols equal windows of h × w pixels from (row0, col0) of a block (a
    window with no tile, as at a city's edge, is summarised too and not handed out)."""

    row0: int
    col0: int
    rows: int
    cols: int
    h: int
    w: int


def _lattice(inside: Sequence[tuple[Tile, tuple[int, int, int, int]]]) -> _Lattice | None:
    """The lattice the tiles' equal windows lie on (each cell at most once), or None."""
    if len(inside) < 2:
        return None
    windows = np.array([window for _, window in inside])
    h, w = int(windows[0, 2]), int(windows[0, 3])
    if not ((windows[:, 2] == h).all() and (windows[:, 3] == w).all()):
        return None
    row0, col0 = int(windows[:, 0].min()), int(windows[:, 1].min())
    r, rr = np.divmod(windows[:, 0] - row0, h)
    c, cr = np.divmod(windows[:, 1] - col0, w)
    rows, cols = int(r.max()) + 1, int(c.max()) + 1
    if rr.any() or cr.any():
        return None
    if len(np.unique(r * cols + c)) != len(inside):
        return None
    return _Lattice(row0, col0, rows, cols, h, w)


def _lattice_summaries(
    values: np.ndarray,
    valid: np.ndarray,
    inside: Sequence[tuple[Tile, tuple[int, int, int, int]]],
    lattice: _Lattice,
    categorical: bool,
) -> list[TilePixelSummary]:
    """Every lattice tile's summary from one pass over the block (the per-tile figures)."""
    lt = lattice
    rows = slice(lt.row0, lt.row0 + lt.rows * lt.h)
    cols = slice(lt.col0, lt.col0 + lt.cols * lt.w)
    cell_valid = valid[rows, cols].astype(bool, copy=False).reshape(lt.rows, lt.h, lt.cols, lt.w)
    counts = cell_valid.sum(axis=(1, 3)).ravel().tolist()
    cells = [
        (window[0] - lt.row0) // lt.h * lt.cols + (window[1] - lt.col0) // lt.w
        for _, window in inside
    ]
    total = lt.h * lt.w
    if categorical:
        class_counts = _lattice_class_counts(values[0, rows, cols], cell_valid, lt)
        if class_counts is None:  # ids that are not small non-negative integers
            return [_tile_summary(values, valid, t, window, True) for t, window in inside]
        out = []
        for (tile, _), cell in zip(inside, cells, strict=True):
            ids = np.flatnonzero(class_counts[cell])
            ids_counts = class_counts[cell][ids]
            out.append(
                TilePixelSummary(
                    tile_id=tile.tile_id,
                    valid_pixels=counts[cell],
                    total_pixels=total,
                    band_means=(),
                    mode_class=int(ids[np.argmax(ids_counts)]) if ids.size else None,
                    class_counts=tuple(zip(ids.tolist(), ids_counts.tolist(), strict=True)),
                )
            )
        return out
    means = [_lattice_means(band[rows, cols], cell_valid, counts, lt) for band in values]
    return [
        TilePixelSummary(
            tile_id=tile.tile_id,
            valid_pixels=counts[cell],
            total_pixels=total,
            band_means=tuple(band_means[cell] for band_means in means),
            mode_class=None,
        )
        for (tile, _), cell in zip(inside, cells, strict=True)
    ]


def _lattice_means(
    band: np.ndarray, cell_valid: np.ndarray, counts: list[int], lattice: _Lattice
) -> list[float]:
    """Mean of the valid pixels of each lattice cell (NaN when none), as ``_valid_mean`` gives.

    Small integers: exact int64 sums of all cells at once, divided by the counts. Floats: per
    cell over the same pixels in the same order as a tile-by-tile mean, so bit for bit equal.
    """
    cells = band.reshape(lattice.rows, lattice.h, lattice.cols, lattice.w)
    if np.issubdtype(band.dtype, np.integer) and band.dtype.itemsize <= 4:
        sums = cells.sum(axis=(1, 3), where=cell_valid, dtype=np.int64).ravel().tolist()
        return [total / n if n else math.nan for total, n in zip(sums, counts, strict=True)]
    return [
        _valid_mean(cells[r, :, c, :], cell_valid[r, :, c, :], counts[r * lattice.cols + c])
        for r in range(lattice.rows)
        for c in range(lattice.cols)
    ]


def _lattice_class_counts(
    ids: np.ndarray, cell_valid: np.ndarray, lattice: _Lattice
) -> list[np.ndarray] | None:
    """Counts of valid ids per lattice cell (indexed by id), or None for ids a bincount cannot
    index (negative, large or not integers).

    Counted cell by cell on views of the block: one bincount of each cell's valid ids, with
    no block-sized index arrays (writing one costs more than the counting).
    """
    if not np.issubdtype(ids.dtype, np.integer):
        return None
    byte_ids = ids.dtype == np.uint8  # every value is a countable id
    cells = ids.reshape(cell_valid.shape)
    counts: list[np.ndarray] = []
    for row in range(lattice.rows):
        for col in range(lattice.cols):
            picked = cells[row, :, col, :][cell_valid[row, :, col, :]]
            if (
                not byte_ids
                and picked.size
                and (int(picked.min()) < 0 or int(picked.max()) >= _COUNTED_IDS)
            ):
                return None
            counts.append(np.bincount(picked.astype(np.intp, copy=False), minlength=1))
    return counts


def _tile_summary(
    values: np.ndarray,
    valid: np.ndarray,
    tile: Tile,
    window: tuple[int, int, int, int],
    categorical: bool,
) -> TilePixelSummary:
    """One tile's summary from its window (row, col, h, w) within the block."""
    row, col, h, w = window
    tile_valid = valid[row : row + h, col : col + w].astype(bool, copy=False)
    tile_values = values[:, row : row + h, col : col + w]
    n_valid = int(tile_valid.sum())
    if categorical:
        ids, counts = _class_counts(tile_values[0][tile_valid])
        return TilePixelSummary(
            tile_id=tile.tile_id,
            valid_pixels=n_valid,
            total_pixels=h * w,
            band_means=(),
            mode_class=int(ids[np.argmax(counts)]) if ids.size else None,
            class_counts=tuple(zip(ids.tolist(), counts.tolist(), strict=True)),
        )
    return TilePixelSummary(
        tile_id=tile.tile_id,
        valid_pixels=n_valid,
        total_pixels=h * w,
        band_means=tuple(_valid_mean(band, tile_valid, n_valid) for band in tile_values),
        mode_class=None,
    )


def _valid_mean(band: np.ndarray, valid: np.ndarray, n_valid: int) -> float:
    """Mean of a band's valid pixels in float64; NaN when none is valid.

    Small integers are summed exactly in int64, without copying the valid pixels out: the
    float64 mean of integers is that exact sum divided by the count, whatever the order.
    """
    if not n_valid:
        return math.nan
    if np.issubdtype(band.dtype, np.integer) and band.dtype.itemsize <= 4:
        return float(band.sum(where=valid, dtype=np.int64)) / n_valid
    return float(band[valid].mean(dtype=np.float64))


_COUNTED_IDS = 1 << 16
"""Ids below this are counted by direct indexing (a bincount); others are sorted (np.unique)."""


def _class_counts(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids in ascending order and how often each occurs, as ``np.unique`` gives them.

    Class ids are small non-negative integers, so a bincount is used: one pass instead of a
    sort of every pixel of the tile.
    """
    if ids.size and np.issubdtype(ids.dtype, np.integer):
        low, high = int(ids.min()), int(ids.max())
        if low >= 0 and high < _COUNTED_IDS:
            counts = np.bincount(ids.ravel().astype(np.intp, copy=False), minlength=high + 1)
            present = np.flatnonzero(counts)
            return present.astype(ids.dtype), counts[present]
    return np.unique(ids, return_counts=True)
