"""Exact, area-weighted aggregation of a source raster onto a city tile grid.

Every numeric modality (population density, radiance, emissions, weather, air quality...) is
reduced to tiles here, so the rules of §3 of the spec live in one place: only valid cells
count, each cell contributes by the exact share of its area inside the tile, and a tile's
valid support is reported so the caller can decide availability.

Two paths give the same definitions at very different costs:

* **Same CRS as the tiles** (north-up): tiles are axis-aligned boxes on the source's pixel
  grid, so coverage weights separate into one interval-overlap vector per tile row (along
  source rows) and one per tile column (along source columns). Tile sums are then
  ``Wr.T @ A @ Wc`` with sparse ``Wr`` and ``Wc``: exact, even when 2 km is not a whole
  number of pixels, and close to one pass over memory.
* **Any other CRS**: the tiles are densified, reprojected into the source CRS and passed to
  exactextract once per (source grid, tile grid) pair; the resulting coverage weights are
  kept as a sparse matrix (cached on disk) so every later year or band is a sparse mat-vec.

Both paths stream blocks of about 10 km × 10 km of tiles (tile rows × tile columns; on the
city's 10 km lattice with the default sizes) and read only the source window a block needs, so
peak memory follows the block, not the city's height or width.

A field with its own rule (``median_of_cell_medians``, ``citycube.grid.cells``) is reduced by
``cell_median_tiles`` over the same blocks: each valid cell goes, by its centre, to one cell of
the tile lattice, and the tile takes the median of its cells' medians.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from exactextract import exact_extract
from exactextract.feature import JSONFeature, JSONFeatureSource
from exactextract.raster import NumPyRasterSource
from odc.geo.geobox import GeoBox
from pyproj import CRS, Geod, Transformer
from rasterio.windows import Window
from scipy import sparse

from citycube.errors import SourceReadError
from citycube.grid.cells import CellLattice, median_of_cell_medians
from citycube.grid.tiles import TileGrid
from citycube.io.atomic import atomic_path
from citycube.io.scratch import remove_dead_leftovers
from citycube.items.rasters import (
    MaskedSource,
    crs_text,
    grid_key,
    is_epsg,
    pyproj_crs,
    transformer,
)

__all__ = [
    "BLOCK_HEIGHT_M",
    "BLOCK_SIZE_M",
    "DENSIFY_STEP_M",
    "TileStats",
    "aggregate_tiles",
    "cell_median_tiles",
    "default_tile_cols_per_block",
    "default_tile_rows_per_block",
]

BLOCK_SIZE_M = 10_000
"""Default height and width of a block of tiles: bounds the source window held in memory."""

BLOCK_HEIGHT_M = BLOCK_SIZE_M
"""Former name of ``BLOCK_SIZE_M``, from when blocks spanned the grid's whole width."""

DENSIFY_STEP_M = 50.0
"""Vertex spacing of tile outlines before reprojection, so curved edges stay exact enough."""

GEOGRAPHIC_FRACTION_TOL = 1e-7
"""Bound on the error of one cell's weight (relative to its area) in a geographic source.

exactextract measures coverage in the plane of degrees, but a cell's area is denser towards
the equator; rows are split into sub-rows until this tolerance is met (see
``_geographic_subrows``).
"""

_MAX_SUBROWS = 64
_CACHE_FORMAT = 3
"""Version of the coverage cache files; 3: one file per grid pair, two arrays per block."""


@dataclass(frozen=True)
class TileStats:
    """Per-tile aggregates of one source over one TileGrid.

    Arrays follow the grid's row-major tile order (``TileGrid.tile_ids``).
    """

    valid_fraction: np.ndarray
    """(n_tiles,) share of the tile's area with valid source support, 0..1."""
    covered_fraction: np.ndarray
    """(n_tiles,) share of the tile's area inside the source raster extent (valid or not), 0..1."""
    mean: np.ndarray
    """(n_bands, n_tiles) area-weighted mean over valid support; NaN where there is none."""
    total: np.ndarray
    """(n_bands, n_tiles) Σ over valid cells of value × (share of the cell's area in the tile).

    For "cell total" products (tonnes per cell, persons per cell) this apportions totals
    exactly. NaN where the tile has no valid support, so a missing tile never reads as zero.
    """


@dataclass
class _Sums:
    """Running per-tile area sums, filled block by block."""

    tile_area: np.ndarray
    covered_area: np.ndarray
    valid_area: np.ndarray
    weighted_sum: np.ndarray
    total: np.ndarray

    @classmethod
    def zeros(cls, n_bands: int, n_tiles: int) -> _Sums:
        return cls(
            tile_area=np.zeros(n_tiles),
            covered_area=np.zeros(n_tiles),
            valid_area=np.zeros(n_tiles),
            weighted_sum=np.zeros((n_bands, n_tiles)),
            total=np.zeros((n_bands, n_tiles)),
        )

    def finish(self) -> TileStats:
        has_support = self.valid_area > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(has_support, self.weighted_sum / self.valid_area, np.nan)
            valid_fraction = self.valid_area / self.tile_area
            covered_fraction = self.covered_area / self.tile_area
        return TileStats(
            # Rounding can push a fully covered tile a few ulps above 1.
            valid_fraction=np.clip(valid_fraction, 0.0, 1.0),
            covered_fraction=np.clip(covered_fraction, 0.0, 1.0),
            mean=mean,
            total=np.where(has_support, self.total, np.nan),
        )


def default_tile_rows_per_block(grid: TileGrid) -> int:
    """Tile rows per block so that a block is about ``BLOCK_SIZE_M`` tall."""
    return max(1, round(BLOCK_SIZE_M / grid.tile_size))


def default_tile_cols_per_block(grid: TileGrid) -> int:
    """Tile columns per block so that a block is about ``BLOCK_SIZE_M`` wide."""
    return max(1, round(BLOCK_SIZE_M / grid.tile_size))


def aggregate_tiles(
    source: MaskedSource,
    grid: TileGrid,
    *,
    cache_dir: Path | None = None,
    tile_rows_per_block: int | None = None,
    tile_cols_per_block: int | None = None,
) -> TileStats:
    """Aggregate every band of ``source`` onto the tiles of ``grid``, exactly and by area.

    Args:
        source: The source on its native grid; its reader decides cell validity.
        grid: The city tile grid.
        cache_dir: Where coverage weights of a reprojected source are kept, so later years
            and bands of the same source grid skip exactextract. Unused for same-CRS sources,
            whose weights are cheaper to rebuild than to load.
        tile_rows_per_block: Tile rows processed together; defaults to ~10 km of rows.
        tile_cols_per_block: Tile columns processed together; defaults to ~10 km of columns.
    """
    _check_north_up(source.grid)
    block_rows, block_cols = _block_shape(grid, tile_rows_per_block, tile_cols_per_block)
    blocks = list(_tile_blocks(grid, block_rows, block_cols))
    sums = _Sums.zeros(len(source.band_names), grid.n_tiles)
    if is_epsg(source.grid.crs, grid.epsg):
        _aggregate_separable(source, grid, blocks, sums)
    else:
        _aggregate_reprojected(source, grid, blocks, cache_dir, sums)
    return sums.finish()


def _block_shape(
    grid: TileGrid, tile_rows_per_block: int | None, tile_cols_per_block: int | None
) -> tuple[int, int]:
    """Tile rows and columns per block: the defaults (~10 km) unless given, each at least 1."""
    block_rows = (
        default_tile_rows_per_block(grid) if tile_rows_per_block is None else tile_rows_per_block
    )
    block_cols = (
        default_tile_cols_per_block(grid) if tile_cols_per_block is None else tile_cols_per_block
    )
    if block_rows < 1 or block_cols < 1:
        raise ValueError(
            f"tile_rows_per_block and tile_cols_per_block must be ≥ 1, got {block_rows} and "
            f"{block_cols}"
        )
    return block_rows, block_cols


def cell_median_tiles(
    source: MaskedSource,
    grid: TileGrid,
    cell_m: int,
    *,
    tile_rows_per_block: int | None = None,
    tile_cols_per_block: int | None = None,
) -> np.ndarray:
    """The median of cell medians of every band of ``source`` on the tiles of ``grid``.

    Each valid source cell (pixel) is placed by its centre, taken into the city's CRS, in one
    ``cell_m`` cell of the tile lattice; a cell's median is that of the valid values placed in
    it, and a tile's value the median of its cells' medians (``citycube.grid.cells``). Blocks of
    tiles are read one at a time, as in ``aggregate_tiles``, each from the source window its
    tiles cover (one cell wider, so no centre inside the block is missed), and a pixel counts
    only in the block that holds its centre.

    Returns:
        (n_bands, n_tiles) values in the grid's tile order; NaN where no cell of the tile holds
        a valid value. Availability (valid support) comes from ``aggregate_tiles``.
    """
    _check_north_up(source.grid)
    lattice = CellLattice(grid, cell_m)
    block_rows, block_cols = _block_shape(grid, tile_rows_per_block, tile_cols_per_block)
    out = np.full((len(source.band_names), grid.n_tiles), np.nan)
    same_crs = is_epsg(source.grid.crs, grid.epsg)
    to_source = None if same_crs else transformer(grid.crs, source.grid.crs)
    to_city = None if same_crs else transformer(source.grid.crs, grid.crs)
    t = source.grid.transform
    for block in _tile_blocks(grid, block_rows, block_cols):
        if to_source is None:
            rings = _tile_rings(grid, block.tiles(grid))
        else:
            rings = _projected_rings(source.grid, grid, block, to_source)
        window = _cell_window(source.grid, rings, margin=1)
        if window is None:
            continue
        row_off, row_end, col_off, col_end = window
        values, valid = _read_masked(
            source, Window(col_off, row_off, col_end - col_off, row_end - row_off)
        )
        rows, cols = np.nonzero(valid)
        if rows.size == 0:
            continue
        x = t.c + (col_off + cols + 0.5) * t.a
        y = t.f + (row_off + rows + 0.5) * t.e
        if to_city is not None:
            x, y = (np.asarray(v) for v in to_city.transform(x, y))
        cells = lattice.cell_index(x, y)
        tile_row, tile_col = np.divmod(lattice.tile_of(np.maximum(cells, 0)), grid.n_cols)
        in_block = (
            (cells >= 0)
            & (tile_row >= block.row0)
            & (tile_row < block.row1)
            & (tile_col >= block.col0)
            & (tile_col < block.col1)
        )
        for band, band_values in enumerate(values):
            tiles, medians = median_of_cell_medians(
                lattice, cells[in_block], band_values[rows, cols][in_block]
            )
            out[band, tiles] = medians
    return out


@dataclass(frozen=True)
class _Block:
    """A rectangle of tiles: rows [row0, row1) × columns [col0, col1) of the tile grid."""

    row0: int
    row1: int
    col0: int
    col1: int

    def tiles(self, grid: TileGrid) -> np.ndarray:
        """Row-major indices (into the grid's tile order) of the block's tiles."""
        rows = np.arange(self.row0, self.row1)
        cols = np.arange(self.col0, self.col1)
        return (rows[:, None] * grid.n_cols + cols[None, :]).ravel()


def _tile_blocks(grid: TileGrid, block_rows: int, block_cols: int) -> Iterator[_Block]:
    """Blocks of tiles, row-major, covering the grid."""
    for row0 in range(0, grid.n_rows, block_rows):
        for col0 in range(0, grid.n_cols, block_cols):
            yield _Block(
                row0, min(row0 + block_rows, grid.n_rows), col0, min(col0 + block_cols, grid.n_cols)
            )


def _check_north_up(raster: GeoBox) -> None:
    t = raster.transform
    if t.b != 0 or t.d != 0 or t.a <= 0 or t.e >= 0:
        raise SourceReadError(
            f"source grid {grid_key(raster)} is rotated or not north-up; warp it to a north-up "
            "grid in its native CRS before aggregation"
        )


def _read_masked(source: MaskedSource, window: Window) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 with invalid cells set to 0 (so NaN cannot leak), and the mask.

    A cell with a non-finite value in any band is invalid whatever the reader said (§3).
    """
    values, valid = source.read(window)
    values = np.asarray(values, dtype=np.float64)
    expected = (len(source.band_names), int(window.height), int(window.width))
    if values.shape != expected or valid.shape != expected[1:]:
        raise SourceReadError(
            f"reader of {grid_key(source.grid)} returned values {values.shape} and mask "
            f"{valid.shape} for a window of {expected}; it must return (bands, rows, cols)"
        )
    valid = np.asarray(valid, dtype=bool) & np.isfinite(values).all(axis=0)
    return np.where(valid, values, 0.0), valid


# --- same CRS: separable interval overlaps --------------------------------------------------


def _interval_overlaps(
    offset: float,
    tile_size: float,
    n_tiles: int,
    cell_size: float,
    n_cells: int,
    first_tile: int = 0,
) -> tuple[int, int, sparse.csc_array]:
    """Share of each source cell's length inside each tile, along one axis.

    Positions are measured from the source's first cell edge; tile ``k`` spans
    ``offset + k*tile_size`` to ``offset + (k+1)*tile_size``, and the matrix covers tiles
    ``first_tile`` to ``first_tile + n_tiles - 1`` (positions are computed from the whole
    grid's offset, so a block's weights are the very floats the whole grid would get).
    Returns the first and one-past-last source cells any tile touches (clipped to the raster)
    and a sparse (cells in that range × tiles) matrix of fractions of the cell length.
    """
    cells: list[np.ndarray] = []
    tiles: list[np.ndarray] = []
    shares: list[np.ndarray] = []
    for k in range(n_tiles):
        lo = offset + (first_tile + k) * tile_size
        hi = lo + tile_size
        # One cell of slack on each side; rounding cannot then drop a cell, and empty
        # overlaps are filtered below.
        start = max(math.floor(lo / cell_size) - 1, 0)
        stop = min(math.ceil(hi / cell_size) + 1, n_cells)
        index = np.arange(start, stop)
        length = np.minimum((index + 1) * cell_size, hi) - np.maximum(index * cell_size, lo)
        keep = length > 0
        cells.append(index[keep])
        tiles.append(np.full(int(keep.sum()), k))
        shares.append(length[keep] / cell_size)
    cell_index = np.concatenate(cells)
    if cell_index.size == 0:
        return 0, 0, sparse.csc_array((0, n_tiles))
    first, last = int(cell_index.min()), int(cell_index.max()) + 1
    matrix = sparse.csc_array(
        (np.concatenate(shares), (cell_index - first, np.concatenate(tiles))),
        shape=(last - first, n_tiles),
    )
    return first, last, matrix


def _aggregate_separable(
    source: MaskedSource, grid: TileGrid, blocks: list[_Block], sums: _Sums
) -> None:
    """Same-CRS path: tile sums are ``Wr.T @ A @ Wc`` on each block's source window."""
    t = source.grid.transform
    cell_w, cell_h = t.a, -t.e
    cell_area = cell_w * cell_h
    sums.tile_area[:] = float(grid.tile_size) ** 2
    by_cols: dict[tuple[int, int], tuple[int, int, sparse.csr_array, np.ndarray]] = {}
    for block in blocks:
        if (block.col0, block.col1) not in by_cols:
            col_first, col_last, w_cols = _interval_overlaps(
                grid.x_min - t.c,
                grid.tile_size,
                block.col1 - block.col0,
                cell_w,
                source.grid.width,
                first_tile=block.col0,
            )
            col_cover = np.asarray(w_cols.sum(axis=0)) * cell_w
            by_cols[block.col0, block.col1] = (col_first, col_last, w_cols.T.tocsr(), col_cover)
        col_first, col_last, w_cols_t, col_cover = by_cols[block.col0, block.col1]
        tiles = block.tiles(grid)
        # Source rows are counted downwards from the top edge, like tile rows.
        row_first, row_last, w_rows = _interval_overlaps(
            t.f - grid.y_max + block.row0 * grid.tile_size,
            grid.tile_size,
            block.row1 - block.row0,
            cell_h,
            source.grid.height,
        )
        row_cover = np.asarray(w_rows.sum(axis=0)) * cell_h
        sums.covered_area[tiles] = np.outer(row_cover, col_cover).ravel()
        if row_last == row_first or col_last == col_first:
            continue
        window = Window(col_first, row_first, col_last - col_first, row_last - row_first)
        values, valid = _read_masked(source, window)
        w_rows_t = w_rows.T.tocsr()

        def tile_sums(
            cells: np.ndarray,
            w_rows_t: sparse.csr_array = w_rows_t,
            w_cols_t: sparse.csr_array = w_cols_t,
        ) -> np.ndarray:
            # (tile rows × source rows) @ (source rows × source cols), then on to tile cols.
            by_tile_row = w_rows_t @ cells
            return (w_cols_t @ by_tile_row.T).T.ravel()

        sums.valid_area[tiles] = cell_area * tile_sums(valid.astype(np.float64))
        for band, band_values in enumerate(values):
            band_total = tile_sums(band_values)
            sums.total[band, tiles] = band_total
            sums.weighted_sum[band, tiles] = cell_area * band_total


# --- other CRS: exactextract coverage, cached as a sparse matrix ----------------------------


@dataclass(frozen=True)
class _Coverage:
    """Coverage weights of one block of tiles over its source window."""

    window: tuple[int, int, int, int]
    """(row_off, col_off, height, width) of the window in the source grid."""
    weights: sparse.csr_array
    """(block tiles × window cells, row-major) area of each cell inside each tile."""
    tile_area: np.ndarray
    """(block tiles,) area of each tile, measured like the cells."""
    row_cell_area: np.ndarray
    """(window rows,) area of one cell in each window row."""

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Two arrays (all integers, all floats) rather than one per field: each array read
        costs a header parse."""
        w = self.weights
        header = [_CACHE_FORMAT, *self.window, *w.shape, w.nnz]
        ints = np.concatenate([np.array(header), w.indices, w.indptr]).astype(np.int64)
        return ints, np.concatenate([w.data, self.tile_area, self.row_cell_area])

    @classmethod
    def from_arrays(cls, ints: np.ndarray, floats: np.ndarray) -> _Coverage | None:
        """The weights :meth:`to_arrays` gave, or None when the arrays are not such a pair."""
        if ints.ndim != 1 or ints.size < 8 or int(ints[0]) != _CACHE_FORMAT:
            return None
        row_off, col_off, height, width, n_tiles, n_cells, nnz = (int(n) for n in ints[1:8])
        if ints.size != 8 + nnz + n_tiles + 1 or floats.size != nnz + n_tiles + height:
            return None
        indices, indptr = ints[8 : 8 + nnz], ints[8 + nnz :]
        weights = sparse.csr_array((floats[:nnz], indices, indptr), shape=(n_tiles, n_cells))
        tile_area, row_cell_area = floats[nnz : nnz + n_tiles], floats[nnz + n_tiles :]
        return cls((row_off, col_off, height, width), weights, tile_area, row_cell_area)


_ARRAY_NAMES = ("ints", "floats")


class _CoverageFile:
    """The cached coverage weights of every block of one source grid on one tile grid.

    One file per grid pair, each block two members of an uncompressed ``.npz`` read on its own
    (memory follows the block). A file per block cost a file create per block on the first year
    of every city and product, and creates are the dearest small write on many file systems.

    Blocks are read from the existing file while it holds them all. Once one has to be computed
    (no file yet, a stale or damaged member), a new file is written beside it, the blocks read so
    far copied over as they are, and it replaces the old one when the call ends well: a
    concurrent or interrupted run never sees half a file. Without a path nothing is cached.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._old: zipfile.ZipFile | None = None
        self._new: zipfile.ZipFile | None = None
        self._writing = contextlib.ExitStack()
        """The new file's :func:`citycube.io.atomic.atomic_path` and archive, while written."""
        self._read: list[str] = []
        """Blocks taken from the old file, to copy over if a new one is started."""
        if path is not None and path.is_file():
            try:
                self._old = zipfile.ZipFile(path)
            except (OSError, zipfile.BadZipFile):
                self._old = None

    def __enter__(self) -> _CoverageFile:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._old is not None:
            self._old.close()
        # The new file, if one was started: closed, then in place if all went well, else deleted.
        self._writing.__exit__(*exc_info)

    def load(self, block: str) -> _Coverage | None:
        """The block's weights, or None when the file lacks them or they are unreadable."""
        if self._old is None:
            return None
        try:
            ints, floats = (self._read_array(f"{block}/{name}.npy") for name in _ARRAY_NAMES)
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
            return None
        coverage = _Coverage.from_arrays(ints, floats)
        if coverage is not None:
            self._read.append(block)
            if self._new is not None:
                self._copy(block)
        return coverage

    def store(self, block: str, coverage: _Coverage) -> None:
        """Keep weights that had to be computed (written out when the call ends well)."""
        if self.path is None:
            return
        if self._new is None:
            self._start()
        assert self._new is not None
        for name, array in zip(_ARRAY_NAMES, coverage.to_arrays(), strict=True):
            with self._new.open(f"{block}/{name}.npy", "w") as out:
                np.lib.format.write_array(out, array, allow_pickle=False)

    def _read_array(self, member: str) -> np.ndarray:
        assert self._old is not None
        with self._old.open(member) as stream:
            return np.lib.format.read_array(stream, allow_pickle=False)

    def _start(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(self.path)  # what a killed write of this file left
        tmp = self._writing.enter_context(atomic_path(self.path))
        self._new = self._writing.enter_context(zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED))
        for block in self._read:
            self._copy(block)

    def _copy(self, block: str) -> None:
        assert self._old is not None and self._new is not None
        for name in _ARRAY_NAMES:
            member = f"{block}/{name}.npy"
            self._new.writestr(member, self._old.read(member))


def _cache_file(cache_dir: Path, raster: GeoBox, grid: TileGrid) -> Path:
    """The file of one (source grid, tile grid) pair's coverage weights, every block in it."""
    identity = "|".join(
        [
            f"v{_CACHE_FORMAT}",
            grid_key(raster),
            f"EPSG:{grid.epsg}",
            f"{grid.x_min!r},{grid.y_max!r},{grid.tile_size},{grid.n_rows}x{grid.n_cols}",
            f"densify={DENSIFY_STEP_M!r}",
            f"tol={GEOGRAPHIC_FRACTION_TOL!r}",
        ]
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return Path(cache_dir) / f"coverage-{digest}.npz"


def _cache_name(block: _Block) -> str:
    return f"rows{block.row0:04d}-{block.row1:04d}_cols{block.col0:04d}-{block.col1:04d}"


def _aggregate_reprojected(
    source: MaskedSource,
    grid: TileGrid,
    blocks: list[_Block],
    cache_dir: Path | None,
    sums: _Sums,
) -> None:
    """Other-CRS path: sparse coverage weights (cached per block) applied to its window."""
    bands: dict[tuple[int, int], _BandGrid | None] = {}
    path = None if cache_dir is None else _cache_file(cache_dir, source.grid, grid)
    with _CoverageFile(path) as cached:
        for block in blocks:
            coverage = cached.load(_cache_name(block))
            if coverage is None:
                to_source = transformer(grid.crs, source.grid.crs)
                if (block.row0, block.row1) not in bands:
                    bands[block.row0, block.row1] = _band_grid(source.grid, grid, block, to_source)
                band = bands[block.row0, block.row1]
                coverage = _block_coverage(source.grid, grid, block, to_source, band)
                cached.store(_cache_name(block), coverage)
            _apply_coverage(source, coverage, block.tiles(grid), sums)


def _apply_coverage(
    source: MaskedSource, coverage: _Coverage, tiles: np.ndarray, sums: _Sums
) -> None:
    weights = coverage.weights
    sums.tile_area[tiles] = coverage.tile_area
    sums.covered_area[tiles] = np.asarray(weights.sum(axis=1)).ravel()
    row_off, col_off, height, width = coverage.window
    if weights.nnz == 0:
        return
    values, valid = _read_masked(source, Window(col_off, row_off, width, height))
    per_cell = values.reshape(len(values), -1).T
    # Total uses the share of each cell in the tile, i.e. area weight ÷ cell area.
    per_cell_share = (values / coverage.row_cell_area[None, :, None]).reshape(len(values), -1).T
    sums.valid_area[tiles] = weights @ valid.ravel().astype(np.float64)
    sums.weighted_sum[:, tiles] = (weights @ per_cell).T
    sums.total[:, tiles] = (weights @ per_cell_share).T


def _tile_rings(grid: TileGrid, tiles: np.ndarray) -> np.ndarray:
    """(tiles, vertices, 2) closed, densified outlines of the given tiles (row-major indices)."""
    per_edge = max(1, math.ceil(grid.tile_size / DENSIFY_STEP_M))
    steps = np.arange(per_edge) / per_edge * grid.tile_size
    size = float(grid.tile_size)
    # Counter-clockwise from the south-west corner, relative to it.
    dx = np.concatenate([steps, np.full(per_edge, size), size - steps, np.zeros(per_edge), [0]])
    dy = np.concatenate([np.zeros(per_edge), steps, np.full(per_edge, size), size - steps, [0]])
    rows, cols = np.divmod(tiles, grid.n_cols)
    x0 = grid.x_min + cols * size
    y0 = grid.y_max - (rows + 1) * size
    return np.stack([x0[:, None] + dx[None, :], y0[:, None] + dy[None, :]], axis=-1)


def _shoelace(rings: np.ndarray) -> np.ndarray:
    x, y = rings[..., 0], rings[..., 1]
    return 0.5 * np.abs(np.sum(x[:, :-1] * y[:, 1:] - x[:, 1:] * y[:, :-1], axis=1))


def _authalic_q(lat_deg: np.ndarray, e2: float) -> np.ndarray:
    """q(φ) of the authalic latitude: the area of a band is a²/2 · Δλ · Δq."""
    s = np.sin(np.radians(lat_deg))
    if e2 == 0:
        return 2 * s
    e = math.sqrt(e2)
    return (1 - e2) * (s / (1 - e2 * s * s) - np.log((1 - e * s) / (1 + e * s)) / (2 * e))


def _band_cell_areas(lat_edges: np.ndarray, dlon_deg: float, crs: CRS) -> np.ndarray:
    """Exact ellipsoidal area of a lon/lat cell between consecutive latitude edges."""
    a = crs.ellipsoid.semi_major_metre
    b = crs.ellipsoid.semi_minor_metre
    q = _authalic_q(lat_edges, 1 - (b / a) ** 2)
    return 0.5 * a * a * math.radians(dlon_deg) * np.abs(np.diff(q))


def _geographic_subrows(lat_top: float, lat_bottom: float, cell_h_deg: float, e2: float) -> int:
    """Sub-rows per source row so the in-cell area gradient stays within tolerance.

    Area density along latitude changes by g = Δφ·|d ln ρ/dφ| across a row; a cut at share f
    of it is then off by g·f(1-f)/2 ≤ g/8 of the row's area. Splitting into k sub-rows bounds
    the error of a cell by g/(8k²).
    """
    lat = np.radians(np.clip([lat_top, lat_bottom], -89.9, 89.9))
    s, c = np.sin(lat), np.cos(lat)
    slope = np.max(np.abs(-s / c + 4 * e2 * s * c / (1 - e2 * s * s)))
    gradient = math.radians(cell_h_deg) * float(slope)
    k = math.ceil(math.sqrt(gradient / (8 * GEOGRAPHIC_FRACTION_TOL)))
    return int(min(max(k, 1), _MAX_SUBROWS))


def _projected_rings(
    raster: GeoBox, grid: TileGrid, block: _Block, to_source: Transformer
) -> np.ndarray:
    """The block's densified tile outlines in the source CRS."""
    rings_utm = _tile_rings(grid, block.tiles(grid))
    xs, ys = to_source.transform(rings_utm[..., 0], rings_utm[..., 1])
    rings = np.stack([np.asarray(xs), np.asarray(ys)], axis=-1)
    if not np.isfinite(rings).all():
        raise SourceReadError(
            f"tiles of {grid.city} rows {block.row0}-{block.row1}, columns "
            f"{block.col0}-{block.col1} cannot be projected into {crs_text(raster.crs)}; "
            "the source does not cover this city"
        )
    return rings


def _cell_window(
    raster: GeoBox, rings: np.ndarray, margin: int = 0
) -> tuple[int, int, int, int] | None:
    """(row_off, row_end, col_off, col_end) of the source cells under ``rings``, or None.

    ``margin`` widens the window by that many cells on each side (still clipped to the raster).
    """
    t = raster.transform
    cell_w, cell_h = t.a, -t.e
    col_off = max(math.floor((rings[..., 0].min() - t.c) / cell_w) - margin, 0)
    col_end = min(math.ceil((rings[..., 0].max() - t.c) / cell_w) + margin, raster.width)
    row_off = max(math.floor((t.f - rings[..., 1].max()) / cell_h) - margin, 0)
    row_end = min(math.ceil((t.f - rings[..., 1].min()) / cell_h) + margin, raster.height)
    if col_end <= col_off or row_end <= row_off:
        return None
    return row_off, row_end, col_off, col_end


class _WKBFeature(JSONFeature):
    """A feature without properties whose geometry exactextract reads as WKB."""

    def __init__(self, wkb: bytes) -> None:
        super().__init__({"type": "Feature", "properties": {}})
        self._wkb = wkb

    def geometry(self) -> bytes:
        return self._wkb


class _WKBPolygons(JSONFeatureSource):
    """Tile outlines for exactextract as WKB (exact doubles, like the GeoJSON they replace).

    Given GeoJSON-like dicts, exactextract serialises each to JSON text and parses it again;
    for ~160-vertex outlines that was half of a first-year coverage computation.
    """

    def __init__(self, rings: np.ndarray) -> None:
        super().__init__([])
        self._wkb: list[bytes] = shapely.to_wkb(shapely.polygons(rings)).tolist()

    def count(self) -> int:
        return len(self._wkb)

    def __iter__(self) -> Iterator[_WKBFeature]:
        for wkb in self._wkb:
            yield _WKBFeature(wkb)


@dataclass(frozen=True)
class _BandGrid:
    """The source cells under one whole row of tiles, as exactextract is shown them.

    Every block of that row measures its tiles on this same grid (same origin, same
    geographic sub-rows), so a cell's weight is the same float however the columns are cut
    into blocks. Sub-row areas in particular are differences of two nearly equal numbers:
    sub-row edges computed from another origin would move weights by ~1e-11.
    """

    row_off: int
    col_off: int
    height: int
    width: int
    subrows: int
    """Sub-rows per source row (1 unless the source is geographic)."""
    subrow_area: np.ndarray
    """(height × subrows,) area of one cell of each sub-row."""
    row_cell_area: np.ndarray
    """(height,) area of one cell in each row."""


def _band_grid(
    raster: GeoBox, grid: TileGrid, block: _Block, to_source: Transformer
) -> _BandGrid | None:
    """The grid of source cells under the block's whole row of tiles (all columns)."""
    band = _Block(block.row0, block.row1, 0, grid.n_cols)
    window = _cell_window(raster, _projected_rings(raster, grid, band, to_source))
    if window is None:
        return None
    row_off, row_end, col_off, col_end = window
    height = row_end - row_off
    t = raster.transform
    cell_w, cell_h = t.a, -t.e
    top = t.f - row_off * cell_h
    crs = pyproj_crs(raster.crs)
    if crs.is_geographic:
        ellipsoid = crs.ellipsoid
        e2 = 1 - (ellipsoid.semi_minor_metre / ellipsoid.semi_major_metre) ** 2
        subrows = _geographic_subrows(top, top - height * cell_h, cell_h, e2)
        edges = top - np.arange(height * subrows + 1) * (cell_h / subrows)
        subrow_area = _band_cell_areas(edges, cell_w, crs)
        row_cell_area = subrow_area.reshape(height, subrows).sum(axis=1)
    else:
        subrows = 1
        subrow_area = np.full(height, cell_w * cell_h)
        row_cell_area = subrow_area
    return _BandGrid(
        row_off, col_off, height, col_end - col_off, subrows, subrow_area, row_cell_area
    )


_OUTLINES_KEPT = 64
"""Blocks whose projected tile outlines are kept (a few MiB at most, whatever the city)."""

_outlines: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}


def _block_outlines(
    raster: GeoBox, grid: TileGrid, block: _Block, to_source: Transformer
) -> tuple[np.ndarray, np.ndarray]:
    """The block's tile outlines in the source CRS and each tile's area measured there.

    Depends on the source's CRS only, not its grid, so sources that share a CRS (the lon/lat
    products) share them: projecting the outlines and measuring each on the ellipsoid was a
    third of a source's first-year coverage cost. Kept for the last ``_OUTLINES_KEPT`` blocks.
    """
    crs = pyproj_crs(raster.crs)
    key = (grid, block, crs.srs, crs.to_wkt())
    if key in _outlines:
        return _outlines[key]
    rings = _projected_rings(raster, grid, block, to_source)
    if crs.is_geographic:
        ellipsoid = crs.ellipsoid
        geod = Geod(a=ellipsoid.semi_major_metre, b=ellipsoid.semi_minor_metre)
        tile_area = np.array(
            [abs(geod.polygon_area_perimeter(r[:-1, 0], r[:-1, 1])[0]) for r in rings]
        )
    else:
        tile_area = _shoelace(rings)
    rings.flags.writeable = tile_area.flags.writeable = False
    if len(_outlines) >= _OUTLINES_KEPT:
        _outlines.pop(next(iter(_outlines)))  # the oldest
    _outlines[key] = rings, tile_area
    return rings, tile_area


def _block_coverage(
    raster: GeoBox,
    grid: TileGrid,
    block: _Block,
    to_source: Transformer,
    band: _BandGrid | None,
) -> _Coverage:
    """Exact coverage of each tile of the block over the source cells, via exactextract.

    exactextract measures the tiles on the grid of their whole row of tiles (``band``); the
    weights are then re-indexed onto the block's own window, the only cells they touch.
    """
    rings, tile_area = _block_outlines(raster, grid, block, to_source)
    n_tiles = len(rings)
    window = _cell_window(raster, rings)
    if window is None or band is None:
        empty = sparse.csr_array((n_tiles, 0))
        return _Coverage((0, 0, 0, 0), empty, tile_area, np.zeros(0))
    row_off, row_end, col_off, col_end = window
    height, width = row_end - row_off, col_end - col_off

    t = raster.transform
    cell_w, cell_h = t.a, -t.e
    top = t.f - band.row_off * cell_h
    left = t.c + band.col_off * cell_w
    # exactextract only needs the grid: a zero-stride array stands in for the values.
    grid_source = NumPyRasterSource(
        np.broadcast_to(np.float32(0), (band.height * band.subrows, band.width)),
        left,
        top - band.height * cell_h,
        left + band.width * cell_w,
        top,
    )
    results = exact_extract(grid_source, _WKBPolygons(rings), ["cell_id", "coverage"])
    tile_index, cell_index, area = [], [], []
    for k, feature in enumerate(results):
        ids = np.asarray(feature["properties"]["cell_id"], dtype=np.int64)
        share = np.asarray(feature["properties"]["coverage"], dtype=np.float64)
        subrow, band_col = np.divmod(ids, band.width)
        rows = subrow // band.subrows + band.row_off - row_off
        cols = band_col + band.col_off - col_off
        tile_index.append(np.full(ids.size, k))
        cell_index.append(rows * width + cols)
        area.append(share * band.subrow_area[subrow])
    weights = sparse.coo_array(
        (np.concatenate(area), (np.concatenate(tile_index), np.concatenate(cell_index))),
        shape=(n_tiles, height * width),
    ).tocsr()
    weights.sum_duplicates()
    row_cell_area = band.row_cell_area[row_off - band.row_off : row_end - band.row_off]
    return _Coverage((row_off, col_off, height, width), weights, tile_area, row_cell_area)
