"""Image chips: warp a source once per city-year onto the city's pixel grid and store it as Zarr.

Image modalities (optical RGB, elevation, land cover, ...) are warped once per city-year onto the
city's tile-aligned :class:`~citycube.grids.PixelGrid`; every 2 km and 5 km tile is then a plain
window of that grid, so tiles are sliced, never warped one by one (SPEC §9 "Chips").

Work proceeds by 10 km × 10 km blocks on the city's 10 km lattice (:func:`blocks`). Both tile
grids have their edges on that lattice, so every tile lies inside exactly one block, each block
is exactly one chunk of the chip store, and peak memory follows the block rather than the city
— neither its height nor its width (SPEC §9 "Memory").

Validity (SPEC §3) is decided on the source's native grid by :class:`MaskedSource`; the warp
carries it across as the valid fraction of each destination pixel's source support. A
destination pixel is valid when at least half of its support is valid (``MIN_VALID_FRACTION``).
The fraction is computed by warping the validity mask itself with area-weighted averaging
rather than through GDAL's ``NODATA_VALUES_PCT_THRESHOLD`` warp option: in GDAL 3.10 that
option treats exactly half-valid support as nodata and is ignored by mode resampling, so it
cannot state the rule for categorical sources (see ``tests/test_chips.py``).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import numcodecs
import numpy as np
import rasterio
import rioxarray  # noqa: F401  (registers the ``.rio`` accessor)
import xarray as xr
import zarr
from affine import Affine
from pyproj import CRS
from rasterio.warp import Resampling, reproject
from rasterio.windows import Window
from xarray.backends.zarr import FillValueCoder, encode_zarr_attr_value
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.codecs.bytes import Endian
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.group import ConsolidatedMetadata, GroupMetadata
from zarr.dtype import VariableLengthUTF8
from zarr.storage import MemoryStore

from citycube.cities import PARENT_SIZE_M
from citycube.errors import CubeWriteError
from citycube.grids import PixelGrid, Tile
from citycube.manifest import write_digests
from citycube.memory import bound_process_memory, release_freed
from citycube.rasters import MaskedSource, rio_crs, transformer
from citycube.scratch import owned_name, remove_dead_leftovers

__all__ = [
    "CHIP_SUFFIXES",
    "ICECHUNK_SUFFIX",
    "MIN_VALID_FRACTION",
    "ZARR_SUFFIX",
    "ChipStoreWriter",
    "TilePixelSummary",
    "block_memory",
    "blocks",
    "chip_writer",
    "open_chip_group",
    "open_chips",
    "read_tile_chip",
    "remove_other_formats",
    "row_bands",
    "tile_pixel_summaries",
    "tile_window",
    "warp_block",
    "warp_rows",
]

ZARR_SUFFIX = ".zarr"
"""A chip store written as a plain Zarr v3 folder, swapped in whole."""
ICECHUNK_SUFFIX = ".icechunk"
"""A chip store kept as an icechunk repository: one commit per write, a tag per release."""
CHIP_SUFFIXES = (ZARR_SUFFIX, ICECHUNK_SUFFIX)

MIN_VALID_FRACTION = 0.5
"""A destination pixel is valid when at least this share of its source support is valid."""

SOURCE_MARGIN_PX = 3
"""Source pixels added around the destination footprint so edge pixels see their full support."""

_FRACTION_TOLERANCE = 1e-6
"""Float slack so a support that is exactly half valid is not lost to rounding."""

_ZARR_COMPRESSOR = ZstdCodec(level=3)
_COORDINATE_COMPRESSOR = ZstdCodec(level=0)
"""zarr's default codec for the small coordinate arrays, which xarray leaves to zarr."""

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
    per_block = _whole(block_m / pixel_grid.resolution, "block size / resolution")
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
    rows_per_band = _whole(band_height_m / pixel_grid.resolution, "band height / resolution")
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
    first = _whole(offset_m / pixel_grid.resolution, "grid edge offset / resolution")
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
    process's allocator is set up by :func:`~citycube.memory.bound_process_memory`. The yielded
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


def _whole(value: float, what: str) -> int:
    """``value`` as an int, insisting it is whole (a grid that does not nest is a spec error)."""
    rounded = round(value)
    if not math.isclose(value, rounded, rel_tol=0, abs_tol=1e-6):
        raise ValueError(
            f"{what} = {value} is not a whole number of pixels; pick a resolution "
            "that divides the 10 km lattice"
        )
    return int(rounded)


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
    part alone; outside a source's coverage is unavailable, not absent (SPEC §3).
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


class ChipStoreWriter:
    """Writes one city-year (or static) chip store as Zarr v3, atomically.

    The store is built in a sibling temp directory and swapped in only when every pixel was
    written, so readers never see a half-written store and a failed run leaves the previous
    version in place. Use as a context manager; ``commit`` runs on a clean exit.
    """

    def __init__(
        self,
        path: Path,
        pixel_grid: PixelGrid,
        band_names: Sequence[str],
        dtype: Any,
        fill_value: Any,
        attrs: Mapping[str, Any],
    ) -> None:
        if not band_names:
            raise ValueError("a chip store needs at least one band name")
        if len(set(band_names)) != len(band_names):
            raise ValueError(f"band names must be unique, got {list(band_names)}")
        self.path = Path(path)
        self.pixel_grid = pixel_grid
        self.band_names = tuple(band_names)
        self.dtype = np.dtype(dtype)
        self.fill_value = _checked_fill(self.dtype, fill_value)
        self.attrs = dict(attrs)
        self.chunk_px = _whole(PARENT_SIZE_M / pixel_grid.resolution, "10 km / resolution")
        self._tmp_path = owned_name(self.path, "tmp")
        self._written: list[tuple[int, int, int, int]] = []
        self._zarr_group: zarr.Group | None = None
        self._arrays: dict[str, zarr.Array] = {}
        self._layout: dict[str, zarr.Array] = {}
        self._made_dirs: set[Path] = set()
        self._digests: dict[str, tuple[str, int]] = {}
        """SHA-256 and size of each key written from bytes in hand, for the manifest."""
        self._untracked: set[str] = set()
        """Arrays that zarr itself wrote to: their chunks' bytes were never in hand."""
        self.on_written: list[Callable[[int, int, np.ndarray, np.ndarray], None]] = []
        """Called with (row_start, col_start, values as stored, valid) after each write, e.g.
        to gather a quick-look without reading the store back."""
        self._started = False
        self._committed = False

    def __enter__(self) -> ChipStoreWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
        except OSError as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        try:
            self._write_template()
        except OSError as exc:
            self._discard()
            raise CubeWriteError.writing(self.path, exc) from exc
        except BaseException:
            self._discard()
            raise
        self._started = True
        return self

    def _remove_leftovers(self) -> None:
        """Delete temp/old siblings that a killed earlier write of this store left behind.

        Only leftovers of processes that no longer exist are removed, so a concurrent writer of
        the same shared store (e.g. static chips) is never disturbed.
        """
        remove_dead_leftovers(self.path)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            if not self._committed:
                self.commit()
        finally:
            self._discard()

    def write_block(
        self, row_start: int, col_start: int, values: np.ndarray, valid: np.ndarray
    ) -> None:
        """Write one block at (row_start, col_start): values[bands,h,w] and valid[h,w].

        A block from :func:`blocks` is exactly one chunk of the store, so it is written
        without reading anything back. Invalid pixels are stored as the fill value; floats
        going into an integer store are rounded (averaged uint8 RGB stays uint8), while integer
        ids that do not fit the store type are an error rather than being clipped into another
        class.
        """
        self.write_rows(row_start, values, valid, col_start=col_start)

    def write_rows(
        self, row_start: int, values: np.ndarray, valid: np.ndarray, *, col_start: int = 0
    ) -> None:
        """Write rows from ``row_start``: values[bands,h,w] and valid[h,w], from ``col_start``.

        With the default ``col_start=0`` and full-width arrays this writes whole rows; any
        narrower array is written as the block it is (see :meth:`write_block`).
        """
        if not self._started:
            raise RuntimeError("use ChipStoreWriter as a context manager before writing rows")
        n_bands = len(self.band_names)
        if values.ndim != 3 or values.shape[0] != n_bands:
            raise ValueError(f"values must have shape ({n_bands}, h, w), got {values.shape}")
        height, width = values.shape[1:]
        if valid.shape != (height, width):
            raise ValueError(f"valid must have shape ({height}, {width}), got {valid.shape}")
        row_stop, col_stop = row_start + height, col_start + width
        if not (
            0 <= row_start < row_stop <= self.pixel_grid.height
            and 0 <= col_start < col_stop <= self.pixel_grid.width
        ):
            raise ValueError(
                f"rows [{row_start}, {row_stop}) × cols [{col_start}, {col_stop}) are outside "
                f"the {self.pixel_grid.height} × {self.pixel_grid.width} pixel grid"
            )
        valid = valid.astype(bool, copy=False)
        stored = self._to_store_type(values, valid)
        rows, cols = slice(row_start, row_stop), slice(col_start, col_stop)
        try:
            chunk = self._whole_chunk(row_start, row_stop, col_start, col_stop)
            if chunk is None or not self._write_chunk("data", (0, *chunk), stored):
                self._untrack("data")
                self._array("data")[:, rows, cols] = stored
            if chunk is None or not self._write_chunk("valid", chunk, valid.view(np.uint8)):
                self._untrack("valid")
                self._array("valid")[rows, cols] = valid.astype(np.uint8)
        except Exception as exc:
            raise CubeWriteError(
                f"writing rows {row_start}:{row_stop}, cols {col_start}:{col_stop} of "
                f"{self.path} failed: {exc}"
            ) from exc
        self._written.append((row_start, row_stop, col_start, col_stop))
        for observer in self.on_written:
            observer(row_start, col_start, stored, valid)

    def _group(self) -> zarr.Group:
        """The temp store, opened once for all block writes."""
        if self._zarr_group is None:
            self._zarr_group = zarr.open_group(str(self._tmp_path), mode="r+", zarr_format=3)
        return self._zarr_group

    def _array(self, name: str) -> zarr.Array:
        """One array of the temp store, its metadata read once."""
        if name not in self._arrays:
            self._arrays[name] = self._group()[name]
        return self._arrays[name]

    def _whole_chunk(
        self, row_start: int, row_stop: int, col_start: int, col_stop: int
    ) -> tuple[int, int] | None:
        """(row, col) index of the chunk these rows and columns exactly fill, else None.

        A chunk on the grid's south or east edge is filled by the part of it inside the grid.
        """
        size, grid = self.chunk_px, self.pixel_grid
        if row_start % size or col_start % size:
            return None
        if row_stop != min(row_start + size, grid.height):
            return None
        if col_stop != min(col_start + size, grid.width):
            return None
        return row_start // size, col_start // size

    def _write_chunk(self, name: str, index: tuple[int, ...], block: np.ndarray) -> bool:
        """Encode and write one whole chunk straight to its file; False if zarr must do it.

        This is the chunk zarr itself would write (its codecs, its key, edge chunks padded
        with the fill value, a chunk of nothing but fill value left out), without zarr's
        per-write round trips through its event-loop thread, which cost several times the
        compression of a 10 km block. Only plain ``bytes`` + ``zstd`` arrays are written here.
        """
        array = self._layout[name]
        metadata = array.metadata
        codecs = getattr(metadata, "codecs", ())
        if (
            len(codecs) != 2
            or not isinstance(codecs[0], BytesCodec)
            or codecs[0].endian not in (None, Endian.little)
            or not isinstance(codecs[1], ZstdCodec)
            or block.dtype != array.dtype
        ):
            return False
        fill = metadata.fill_value
        chunk_shape = tuple(array.chunks)
        if block.shape != chunk_shape:
            padded = np.full(chunk_shape, fill, dtype=block.dtype)
            padded[tuple(slice(0, n) for n in block.shape)] = block
            block = padded
        key = f"{array.path}/{metadata.encode_chunk_key(index)}"
        if _all_fill(block, fill):
            self._drop_key(key)  # an absent chunk reads as fill
            return True
        codec = numcodecs.Zstd(level=codecs[1].level, checksum=codecs[1].checksum)
        payload = codec.encode(np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")))
        self._put_key(key, payload)
        return True

    def _put_key(self, key: str, payload: bytes) -> None:
        """Store one document or encoded chunk under its Zarr key in the store being built."""
        path = self._tmp_path / key
        if path.parent not in self._made_dirs:  # a chunk row's directory, made once
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(path.parent)
        path.write_bytes(payload)
        if key.split("/", 1)[0] not in self._untracked:
            self._digests[key] = (hashlib.sha256(payload).hexdigest(), len(payload))

    def _drop_key(self, key: str) -> None:
        """Remove one key from the store being built, if it is there."""
        (self._tmp_path / key).unlink(missing_ok=True)
        self._digests.pop(key, None)

    def _untrack(self, name: str) -> None:
        """Forget the digests of an array that zarr writes to itself (bytes not in hand)."""
        if name not in self._untracked:
            self._untracked.add(name)
            self._digests = {k: v for k, v in self._digests.items() if not k.startswith(f"{name}/")}

    def commit(self) -> None:
        """Swap the finished temp store into ``path``; the old store is removed afterwards.

        A directory cannot be renamed over a non-empty one, so the old store is first moved
        aside and restored if the swap fails; for that instant ``path`` is absent, never
        partial. A crash in between can leave a ``.<name>.old-*`` sibling behind.
        """
        if self._committed:
            return
        if not self._started:
            raise RuntimeError("nothing to commit: the writer was never entered")
        self._check_covered()
        try:  # inside the store, so swapped in with it and gone with it
            write_digests(self._tmp_path, self._digests)
        except OSError as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        old = None
        if self.path.exists():
            old = owned_name(self.path, "old")
            os.replace(self.path, old)
        try:
            os.replace(self._tmp_path, self.path)
        except OSError as exc:
            if old is not None:
                os.replace(old, self.path)
            raise CubeWriteError.writing(self.path, exc) from exc
        self._committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        remove_other_formats(self.path)

    def _check_covered(self) -> None:
        """Refuse to commit a store with pixels no block wrote (they would read as nodata)."""
        missing, first = _uncovered(self._written, self.pixel_grid.height, self.pixel_grid.width)
        if missing:
            raise CubeWriteError(
                f"{self.path}: {missing} pixels were never written (first at row {first[0]}, "
                f"col {first[1]}); write every block before committing, or the gap would read "
                "as nodata"
            )

    def _write_template(self) -> None:
        """Write metadata and coordinates; data chunks are written later, block by block.

        The layout is the one ``xarray.Dataset.to_zarr`` gives the equivalent dataset (data
        and valid with their coordinates and a rioxarray ``spatial_ref``), written with zarr
        directly: through xarray and dask the empty template cost more than a city's chunks
        of a coarse modality (``tests/test_chips.py`` compares the two). Every store of a grid,
        bands and type shares its documents but the root's attributes, so those are built once
        per process (:func:`_template`) and written as files here.
        """
        template = _template(self.pixel_grid, self.band_names, self.dtype.str, self.fill_value)
        self._layout = dict(template.arrays)
        root = GroupMetadata(
            attributes=_zarr_attrs(self._store_attrs()),
            consolidated_metadata=template.consolidated,
        )
        documents = {
            **template.documents,
            **{k: v.to_bytes() for k, v in root.to_buffer_dict(default_buffer_prototype()).items()},
        }
        self._begin_store()
        for key in sorted(documents, key=lambda k: (k.count("/"), k)):  # parents first
            self._put_key(key, documents[key])

    def _begin_store(self) -> None:
        """Create the empty store that the blocks are written into (here: the temp folder)."""
        self._tmp_path.mkdir()

    def _store_attrs(self) -> dict[str, Any]:
        """Caller attrs plus the grid facts a reader needs; the grid facts cannot be overridden."""
        grid = self.pixel_grid
        facts = {
            "city": grid.city,
            "epsg": grid.epsg,
            "resolution_m": grid.resolution,
            "chunk_size_m": PARENT_SIZE_M,
            "band_names": list(self.band_names),
            "nodata": self.fill_value,
        }
        clashes = {k for k in facts if k in self.attrs and self.attrs[k] != facts[k]}
        if clashes:
            raise ValueError(f"attrs {sorted(clashes)} contradict the pixel grid or bands")
        return {**self.attrs, **facts}

    def _to_store_type(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Cast to the store dtype with invalid pixels set to the fill value.

        Works in place on one working copy (or none, when every pixel is valid and the type
        already fits): a block is written per 10 km, and each extra full-size temporary is
        one more pass over a block's memory.
        """
        out_is_int = np.issubdtype(self.dtype, np.integer)
        all_valid = bool(valid.all())
        if out_is_int and np.issubdtype(values.dtype, np.floating):
            info = np.iinfo(self.dtype)
            inside = values.copy()
            if not all_valid:
                np.copyto(inside, 0, where=~valid)  # invalid cells may hold NaN
            np.rint(inside, out=inside)
            np.clip(inside, info.min, info.max, out=inside)
            stored = inside.astype(self.dtype)
        elif out_is_int:
            info = np.iinfo(self.dtype)
            if valid.any():
                low = values.min(where=valid, initial=np.iinfo(values.dtype).max)
                high = values.max(where=valid, initial=np.iinfo(values.dtype).min)
                if low < info.min or high > info.max:
                    raise CubeWriteError(
                        f"values {low}..{high} do not fit the store type "
                        f"{self.dtype}; choose a wider dtype for {self.path.name}"
                    )
            stored = values.astype(self.dtype, copy=not all_valid)
        else:
            stored = values.astype(self.dtype, copy=not all_valid)
        if not all_valid:
            np.copyto(stored, np.array(self.fill_value, dtype=self.dtype), where=~valid)
        return stored

    def _discard(self) -> None:
        """Remove the temp store (after a failure, or whatever is left after a commit)."""
        shutil.rmtree(self._tmp_path, ignore_errors=True)


@dataclass(frozen=True)
class _Template:
    """The documents every chip store of one grid, band list and type shares."""

    documents: Mapping[str, bytes]
    """Store key → bytes of every document but the root group's."""
    consolidated: ConsolidatedMetadata
    """The root's consolidated metadata (chunk writes never change it)."""
    arrays: Mapping[str, zarr.Array]
    """The data and valid arrays (in memory): their codecs, chunks and keys."""


@lru_cache(maxsize=64)
def _template(grid: PixelGrid, band_names: tuple[str, ...], dtype: str, fill: Any) -> _Template:
    """Build a chip store's layout with zarr in memory, once per grid, bands and type.

    zarr's local store hands every document to a thread of its event loop, which cost a few
    times more than building the layout; written as files, the documents are the same bytes.
    """
    documents: dict[str, Buffer] = {}
    group = zarr.open_group(MemoryStore(documents), mode="w-", zarr_format=3)
    arrays = _create_arrays(group, grid, band_names, np.dtype(dtype), fill)
    with warnings.catch_warnings():
        # zarr notes that consolidated metadata is not yet in the v3 spec; the per-array
        # metadata stays complete, so readers that ignore it lose nothing.
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not")
        consolidated = zarr.consolidate_metadata(group.store, zarr_format=3).metadata
    assert consolidated.consolidated_metadata is not None
    return _Template(
        {k: v.to_bytes() for k, v in documents.items() if k != "zarr.json"},
        consolidated.consolidated_metadata,
        arrays,
    )


def _create_arrays(
    group: zarr.Group, grid: PixelGrid, band_names: tuple[str, ...], dtype: np.dtype, fill: Any
) -> dict[str, zarr.Array]:
    """Coordinates, grid mapping, data and valid in ``group``; the data and valid arrays."""
    n_bands = len(band_names)
    chunk = _whole(PARENT_SIZE_M / grid.resolution, "10 km / resolution")
    coordinates = (_COORDINATE_COMPRESSOR,)
    nan_fill = {"_FillValue": FillValueCoder.encode(np.nan, np.dtype(np.float64))}
    band = group.create_array(
        "band",
        shape=(n_bands,),
        dtype=VariableLengthUTF8(),  # type: ignore[arg-type]
        chunks=(n_bands,),
        compressors=coordinates,
        fill_value="",
        dimension_names=("band",),
    )
    band[:] = np.array(band_names, dtype=object)
    for name, values in (("x", grid.x_coords()), ("y", grid.y_coords())):
        coordinate = group.create_array(
            name,
            shape=values.shape,
            dtype=values.dtype,
            chunks=values.shape,
            compressors=coordinates,
            fill_value=np.nan,
            dimension_names=(name,),
            attributes=nan_fill,
        )
        coordinate[:] = values
    group.create_array(
        "spatial_ref",
        shape=(),
        dtype=np.int64,
        compressors=coordinates,
        fill_value=0,
        attributes=_grid_mapping_attrs(grid.crs, grid.transform),
    )
    data_attrs: dict[str, Any] = {
        "nodata": fill,
        "long_name": list(band_names),
        "grid_mapping": "spatial_ref",
    }
    if np.issubdtype(dtype, np.floating):
        data_attrs.update(nan_fill)  # xarray's CF default for float variables, any fill
    data = group.create_array(
        "data",
        shape=(n_bands, grid.height, grid.width),
        chunks=(n_bands, chunk, chunk),
        dtype=dtype,
        compressors=(_ZARR_COMPRESSOR,),
        fill_value=fill,
        dimension_names=("band", "y", "x"),
        attributes=data_attrs,
    )
    valid = group.create_array(
        "valid",
        shape=(grid.height, grid.width),
        chunks=(chunk, chunk),
        dtype=np.uint8,
        compressors=(_ZARR_COMPRESSOR,),
        fill_value=0,
        dimension_names=("y", "x"),
        attributes={
            "description": ("1 where at least half of the pixel's source support is valid, else 0"),
            "grid_mapping": "spatial_ref",
        },
    )
    return {"data": data, "valid": valid}


def _zarr_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values as xarray stores them (NumPy scalars and arrays as plain JSON)."""
    return {key: encode_zarr_attr_value(value) for key, value in attrs.items()}


def _grid_mapping_attrs(crs: str, transform: Affine) -> dict[str, Any]:
    """The ``spatial_ref`` attributes rioxarray writes for a grid (CF grid mapping + WKT)."""
    return dict(_grid_mapping_items(crs, transform))


@lru_cache(maxsize=32)
def _grid_mapping_items(crs: str, transform: Affine) -> tuple[tuple[str, Any], ...]:
    """Built once per grid: rioxarray derives them from the CRS through pyproj, slowly."""
    coordinate = xr.Dataset().rio.write_crs(crs).rio.write_transform(transform)["spatial_ref"]
    return tuple(_zarr_attrs(coordinate.attrs).items())


def _all_fill(block: np.ndarray, fill: Any) -> bool:
    """Whether every element is the fill value (NaN counts as equal to a NaN fill)."""
    if np.issubdtype(block.dtype, np.floating) and np.isnan(fill):
        return bool(np.isnan(block).all())
    if np.issubdtype(block.dtype, np.floating) and fill == 0:
        return not block.view(f"u{block.dtype.itemsize}").any()  # -0.0 is not the fill 0.0
    return bool(block.min() == fill and block.max() == fill)


def _checked_fill(dtype: np.dtype, fill_value: Any) -> int | float:
    """The fill value as a plain Python number that the store dtype can hold."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not (isinstance(fill_value, int | np.integer) and info.min <= fill_value <= info.max):
            raise ValueError(f"fill value {fill_value!r} does not fit {dtype}")
        return int(fill_value)
    if np.issubdtype(dtype, np.floating):
        return float(fill_value)
    raise ValueError(f"chip stores hold integer or float data, not {dtype}")


def _uncovered(
    written: Sequence[tuple[int, int, int, int]], height: int, width: int
) -> tuple[int, tuple[int, int]]:
    """Pixels of a height × width grid that no written rectangle covers, and the first one.

    Works on the grid cut along the rectangles' own edges, so the check costs a few hundred
    cells whatever the city's size, not one flag per pixel.
    """
    row_edges = sorted({0, height, *(e for r in written for e in r[:2])})
    col_edges = sorted({0, width, *(e for r in written for e in r[2:])})
    covered = np.zeros((len(row_edges) - 1, len(col_edges) - 1), dtype=bool)
    row_index = {edge: i for i, edge in enumerate(row_edges)}
    col_index = {edge: i for i, edge in enumerate(col_edges)}
    for row_start, row_stop, col_start, col_stop in written:
        covered[
            row_index[row_start] : row_index[row_stop], col_index[col_start] : col_index[col_stop]
        ] = True
    areas = np.outer(np.diff(row_edges), np.diff(col_edges))
    missing = int(areas[~covered].sum())
    if not missing:
        return 0, (0, 0)
    gaps = np.argwhere(~covered)  # row-major order
    first_row, first_col = (int(i) for i in gaps[0])
    return missing, (row_edges[first_row], col_edges[first_col])


def open_chips(path: Path, ref: str | None = None, *, draft: bool = False) -> xr.Dataset:
    """Open a chip store lazily with its CRS and transform decoded.

    ``path`` is a plain Zarr store (``.zarr``) or an icechunk repository (``.icechunk``); of a
    repository ``ref`` names the branch or tag to read (default: what the release published,
    see :func:`citycube.icechunk_chips.icechunk_session`), and ``draft`` reads the latest
    commit instead, as the build's own quick-looks do. A plain store has one version only.

    Not dask-backed: a selection reads just the chunks it touches when its values are asked
    for. Inside a dask worker a dask-backed read would be sent back to the cluster as tasks of
    its own, competing with the partition work that asked for it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no chip store at {path}; materialise its chips asset first")
    if path.suffix == ICECHUNK_SUFFIX:
        from citycube.icechunk_chips import open_icechunk_chips

        return open_icechunk_chips(path, "main" if draft and ref is None else ref)
    if ref is not None:
        raise ValueError(f"{path} is a plain Zarr store: it has no versions to open {ref!r} at")
    return xr.open_zarr(
        path,
        chunks=None,
        zarr_format=3,
        consolidated=True,
        decode_coords="all",
        mask_and_scale=False,
    )


def open_chip_group(path: Path, ref: str | None = None) -> zarr.Group:
    """The chip store's root Zarr group, read-only (for readers that slice arrays directly)."""
    path = Path(path)
    if path.suffix == ICECHUNK_SUFFIX:
        from citycube.icechunk_chips import icechunk_session

        return zarr.open_group(icechunk_session(path, ref).store, mode="r", zarr_format=3)
    return zarr.open_group(str(path), mode="r", zarr_format=3)


def chip_writer(
    path: Path,
    pixel_grid: PixelGrid,
    band_names: Sequence[str],
    dtype: Any,
    fill_value: Any,
    attrs: Mapping[str, Any],
) -> ChipStoreWriter:
    """The writer for ``path``'s format: a plain Zarr store, or an icechunk repository."""
    if Path(path).suffix == ICECHUNK_SUFFIX:
        from citycube.icechunk_chips import IcechunkChipWriter

        return IcechunkChipWriter(path, pixel_grid, band_names, dtype, fill_value, attrs)
    return ChipStoreWriter(path, pixel_grid, band_names, dtype, fill_value, attrs)


def remove_other_formats(path: Path) -> None:
    """Remove the store of the same chips in the other format (a release that switched format).

    Called after a commit, so the chip index, which names the new store, never points at a
    store that is gone.
    """
    for suffix in CHIP_SUFFIXES:
        other = path.with_suffix(suffix)
        if other != path and other.exists():
            shutil.rmtree(other, ignore_errors=True)


def tile_window(chips: xr.Dataset, pixel_grid: PixelGrid, tile: Tile) -> xr.Dataset:
    """The tile's window of an open chip store (lazy), after checking the store's grid."""
    transform = chips.rio.transform()
    if (
        not transform.almost_equals(pixel_grid.transform)
        or (chips.sizes["y"], chips.sizes["x"]) != pixel_grid.shape
    ):
        raise ValueError(
            f"the chip store grid {transform} {dict(chips.sizes)} is not the pixel grid "
            f"{pixel_grid.transform} {pixel_grid.shape}; rebuild the store for this grid"
        )
    row_off, col_off, height, width = pixel_grid.window(tile)
    return chips.isel(y=slice(row_off, row_off + height), x=slice(col_off, col_off + width))


def read_tile_chip(path: Path, pixel_grid: PixelGrid, tile: Tile) -> xr.Dataset:
    """The tile's window (data + valid), loaded into memory."""
    with open_chips(path) as chips:
        return tile_window(chips, pixel_grid, tile).load()


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
