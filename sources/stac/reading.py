"""Windowed reads of remote COGs onto a target grid, through GDAL's ``/vsicurl/``.

Only the part of an asset that covers the target grid is read: the internal tiles under the
window (plus the header). An asset in the target's CRS — or in the 326xx twin of a southern
327xx zone — is read as a plain pixel window, its values untouched. An asset in another CRS
(a scene from the neighbouring UTM zone) is warped onto the target grid with nearest
neighbour and a near-exact transformer (1/1000 pixel), so a QA bit field and the bands stay
consistent and no value is invented by interpolation; GDAL still fetches only the source tiles
the window needs. A window may be read block by block through one open (``read_band_blocks``),
each block's pixels the same as in the whole window.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.crs import CRS as RioCRS
from rasterio.enums import Resampling
from rasterio.errors import RasterioError
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from sources.stac.grids import y_shift_into
from sources.stac.options import StacFamilyOptions
from sources.stac.redaction import redact_library_logs
from sources.stac.retrying import TransientError, is_transient_gdal_message


def gdal_env(options: StacFamilyOptions) -> dict[str, str | int | bool]:
    """GDAL settings for reading COGs over HTTP.

    No directory listing on open, only ``.tif`` names probed, consecutive ranges merged,
    timeouts on every request, and no retries inside GDAL: the family's retry policy owns them.
    Nothing is cached across opens (``CPL_VSIL_CURL_NON_CACHED``): an asset is opened once per
    fetch, and GDAL would otherwise remember a failed answer and replay it to every retry.
    """
    return {
        "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
        "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif,.TIF,.tiff,.TIFF",
        "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
        "GDAL_HTTP_TIMEOUT": int(np.ceil(options.timeout_s)),
        "GDAL_HTTP_CONNECTTIMEOUT": int(np.ceil(options.connect_timeout_s)),
        "GDAL_HTTP_MAX_RETRY": 0,
        "VSI_CACHE": False,
        "CPL_VSIL_CURL_NON_CACHED": "/vsicurl/",
        "GDAL_CACHEMAX": 256,
    }


class CorruptAssetError(Exception):
    """An asset that answered but cannot be decoded (truncated, not a GeoTIFF, …)."""


class AssetNotFoundError(Exception):
    """An asset that is not there: the server answered 404 or 410 (or a local file is gone)."""


_NOT_FOUND = re.compile(r"HTTP response code: (404|410)\b|No such file or directory")
"""How GDAL words an asset that is not there."""


@dataclass(frozen=True)
class AssetRead:
    """Pixels of one asset band on the target grid."""

    values: np.ndarray
    """(rows, cols) in the asset's own type; ``fill`` where the asset has no pixel."""
    covered: np.ndarray
    """True where the asset has a pixel (inside its footprint)."""


@dataclass(frozen=True, order=True)
class Block:
    """A rectangle of a target grid's pixels: rows ``row0:row1``, columns ``col0:col1``."""

    row0: int
    row1: int
    col0: int
    col1: int

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols)."""
        return (self.row1 - self.row0, self.col1 - self.col0)

    @property
    def slices(self) -> tuple[slice, slice]:
        """Where the block sits in an array of the whole grid."""
        return (slice(self.row0, self.row1), slice(self.col0, self.col1))

    def window(self) -> Window:
        """The block as a rasterio window of the whole grid."""
        return Window(self.col0, self.row0, self.col1 - self.col0, self.row1 - self.row0)

    def grid_of(self, grid: GeoBox) -> GeoBox:
        """The block as a grid of its own (same lattice, shifted corner)."""
        return grid[self.row0 : self.row1, self.col0 : self.col1]

    def as_list(self) -> list[int]:
        """[row0, row1, col0, col1], for cache keys."""
        return [self.row0, self.row1, self.col0, self.col1]


def grid_blocks(grid: GeoBox, block_px: int) -> list[Block]:
    """The grid cut into square blocks of ``block_px`` (the last row and column of blocks
    smaller when the edge does not divide), in row-major order."""
    if block_px < 1:
        raise ValueError(f"block_px must be positive, got {block_px}")
    return [
        Block(r, min(r + block_px, grid.height), c, min(c + block_px, grid.width))
        for r in range(0, grid.height, block_px)
        for c in range(0, grid.width, block_px)
    ]


def vsicurl(href: str) -> str:
    """The GDAL path of an href (local paths are opened as they are).

    A remote path may carry a SAS token that GDAL's and rasterio's messages would quote, so
    rasterio's loggers are given the query-redacting filter first.
    """
    if href.startswith(("http://", "https://")):
        redact_library_logs()
        return f"/vsicurl/{href}"
    return href


@contextmanager
def _open(path: str) -> Iterator[rasterio.io.DatasetReader]:
    try:
        with rasterio.open(path) as src:
            yield src
    except RasterioError as exc:
        raise _classified(exc) from None


def _classified(exc: BaseException) -> Exception:
    message = str(exc)
    if is_transient_gdal_message(message):
        return TransientError(message)
    if _NOT_FOUND.search(message):
        return AssetNotFoundError(message)
    return CorruptAssetError(message)


def read_band(
    href: str, grid: GeoBox, *, band: int = 1, fill: float = 0, nodata: float | None = None
) -> AssetRead:
    """Read one band of ``href`` onto ``grid``; raises TransientError,
    AssetNotFoundError or CorruptAssetError.

    ``fill`` is what pixels outside the asset get; ``nodata`` overrides the file's own nodata
    for warping (which pixels are not data).
    """
    whole = Block(0, grid.height, 0, grid.width)
    kept: list[AssetRead] = []
    read_band_blocks(
        href, grid, [whole], lambda _, read: kept.append(read), band=band, fill=fill, nodata=nodata
    )
    return kept[0]


def read_band_blocks(
    href: str,
    grid: GeoBox,
    blocks: Sequence[Block],
    keep: Callable[[Block, AssetRead], None],
    *,
    band: int = 1,
    fill: float = 0,
    nodata: float | None = None,
) -> None:
    """Read blocks of one band of ``href`` on ``grid`` through one open of the asset (its
    header fetched once), handing each to ``keep`` as it is read.

    A block's pixels are exactly those a whole-grid read gives there: plain windows are cut
    from the same lattice, warped blocks are windows of one warped dataset defined on the whole
    grid. Internal tiles that a block boundary cuts through are fetched for each block they
    touch, so reading a window in many blocks costs more bytes than reading it whole. Raises
    TransientError, AssetNotFoundError or CorruptAssetError.
    """
    with _open(vsicurl(href)) as src:
        try:
            shift = y_shift_into(CRS.from_user_input(src.crs), grid.crs)
            if shift is not None and _same_lattice(src.transform, grid, shift):
                for block in blocks:
                    keep(block, _window_read(src, block.grid_of(grid), band, fill, shift))
                return
            _warped_reads(src, grid, blocks, keep, band, fill, nodata)
        except RasterioError as exc:
            raise _classified(exc) from None


def _same_lattice(transform: rasterio.Affine, grid: GeoBox, shift: float) -> bool:
    """True when the asset's pixels coincide with the grid's (whole-pixel offsets)."""
    t, g = transform, grid.transform
    if not (np.isclose(t.a, g.a) and np.isclose(t.e, g.e) and t.b == 0 and t.d == 0):
        return False
    col = (g.c - t.c) / t.a
    row = (g.f - (t.f + shift)) / t.e
    return bool(np.isclose(col, round(col), atol=1e-6) and np.isclose(row, round(row), atol=1e-6))


def _window_read(
    src: rasterio.io.DatasetReader, grid: GeoBox, band: int, fill: float, shift: float
) -> AssetRead:
    """Read the intersection of the grid with the asset as a plain window; the rest is fill."""
    t, g = src.transform, grid.transform
    col0 = round((g.c - t.c) / t.a)
    row0 = round((g.f - (t.f + shift)) / t.e)
    values = np.full(grid.shape, fill, dtype=src.dtypes[band - 1])
    covered = np.zeros(grid.shape, dtype=bool)
    r0, r1 = max(row0, 0), min(row0 + grid.height, src.height)
    c0, c1 = max(col0, 0), min(col0 + grid.width, src.width)
    if r0 >= r1 or c0 >= c1:
        return AssetRead(values, covered)
    window = Window(c0, r0, c1 - c0, r1 - r0)
    block = src.read(band, window=window)
    rows = slice(r0 - row0, r1 - row0)
    cols = slice(c0 - col0, c1 - col0)
    values[rows, cols] = block
    covered[rows, cols] = True
    return AssetRead(values, covered)


def _warped_reads(
    src: rasterio.io.DatasetReader,
    grid: GeoBox,
    blocks: Sequence[Block],
    keep: Callable[[Block, AssetRead], None],
    band: int,
    fill: float,
    nodata: float | None,
) -> None:
    """Warp the asset onto the grid (nearest, transformer within 1/1000 pixel), block by block
    as windows of one warped dataset; GDAL reads only the source tiles each block needs.

    GDAL warps a small window by the warped dataset's own blocks (512 × 128), but a large one
    straight into the buffer in other chunks, where the approximate transformer picks another
    nearest pixel for about one pixel in 10^4. Every block is therefore read as windows that
    each lie within one of the warped dataset's blocks, so every pixel's value is the same
    whatever the blocks (a whole-grid read included).
    """
    src_nodata = nodata if nodata is not None else src.nodata
    with WarpedVRT(
        src,
        crs=RioCRS.from_wkt(grid.crs.to_wkt()),
        transform=grid.transform,
        width=grid.width,
        height=grid.height,
        resampling=Resampling.nearest,
        src_nodata=src_nodata,
        nodata=fill if src_nodata is None else src_nodata,
        tolerance=0.001,
        add_alpha=src_nodata is None,
    ) as vrt:
        block_rows, block_cols = vrt.block_shapes[0]
        for block in blocks:
            values = np.empty(block.shape, dtype=vrt.dtypes[band - 1])
            covered = np.empty(block.shape, dtype=bool)
            for part in _within_blocks(block, block_rows, block_cols):
                window = part.window()
                at = (
                    slice(part.row0 - block.row0, part.row1 - block.row0),
                    slice(part.col0 - block.col0, part.col1 - block.col0),
                )
                values[at] = vrt.read(band, window=window)
                if src_nodata is None:
                    covered[at] = vrt.read(vrt.count, window=window) > 0
                else:
                    covered[at] = vrt.dataset_mask(window=window) > 0
            values[~covered] = np.asarray(fill, dtype=values.dtype)
            keep(block, AssetRead(values, covered))


def _within_blocks(block: Block, block_rows: int, block_cols: int) -> Iterator[Block]:
    """The parts of ``block`` that each lie within one block of a (block_rows × block_cols)
    tiling of the grid."""
    for row in range(block.row0 - block.row0 % block_rows, block.row1, block_rows):
        for col in range(block.col0 - block.col0 % block_cols, block.col1, block_cols):
            yield Block(
                max(row, block.row0),
                min(row + block_rows, block.row1),
                max(col, block.col0),
                min(col + block_cols, block.col1),
            )
