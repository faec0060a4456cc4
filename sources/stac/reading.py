"""Windowed reads of remote COGs onto a target grid, through GDAL's ``/vsicurl/``.

Only the part of an asset that covers the target grid is read: the internal tiles under the
window (plus the header). An asset in the target's CRS — or in the 326xx twin of a southern
327xx zone — is read as a plain pixel window, its values untouched. An asset in another CRS
(a scene from the neighbouring UTM zone) is warped onto the target grid with nearest
neighbour and a near-exact transformer (1/1000 pixel), so a QA bit field and the bands stay
consistent and no value is invented by interpolation; GDAL still fetches only the source tiles
the window needs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import rasterio
from pyproj import CRS
from rasterio.crs import CRS as RioCRS
from rasterio.enums import Resampling
from rasterio.errors import RasterioError
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from sources.stac.grids import TargetGrid, y_shift_into
from sources.stac.options import StacFamilyOptions
from sources.stac.retrying import TransientError, is_transient_gdal_message
from sources.stac.signing import redact_queries


class _RedactQueries(logging.Filter):
    """Replaces URL query strings in a log record's message (never drops the record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "?" in message:
            record.msg, record.args = redact_queries(message), None
        return True


_REDACT = _RedactQueries()
_redacted_loggers: set[str] = set()


def redact_rasterio_logs() -> None:
    """Keep signed hrefs out of the logs: rasterio relays GDAL's messages to Python logging
    (a 503 is logged as "HTTP response code on <the signed URL>: 503", and opened datasets are
    named in debug records), so every rasterio logger gets a filter that strips URL queries.

    A filter acts only on its own logger's records, so each rasterio logger gets one; loggers
    of modules rasterio imports later are caught by the next call (every read calls this).
    """
    for name in list(logging.root.manager.loggerDict):
        if (name == "rasterio" or name.startswith("rasterio.")) and name not in _redacted_loggers:
            logging.getLogger(name).addFilter(_REDACT)
            _redacted_loggers.add(name)


def gdal_env(options: StacFamilyOptions) -> dict[str, str | int | bool]:
    """GDAL settings for reading COGs over HTTP (and its log records made safe to keep).

    No directory listing on open, only ``.tif`` names probed, consecutive ranges merged,
    timeouts on every request, and no retries inside GDAL: the family's retry policy owns them.
    Nothing is cached across opens (``CPL_VSIL_CURL_NON_CACHED``): an asset is opened once per
    fetch, and GDAL would otherwise remember a failed answer and replay it to every retry.
    """
    redact_rasterio_logs()
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


@dataclass(frozen=True)
class AssetRead:
    """Pixels of one asset band on the target grid."""

    values: np.ndarray
    """(rows, cols) in the asset's own type; ``fill`` where the asset has no pixel."""
    covered: np.ndarray
    """True where the asset has a pixel (inside its footprint)."""


def vsicurl(href: str) -> str:
    """The GDAL path of an href (local paths are opened as they are)."""
    if href.startswith(("http://", "https://")):
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
    return CorruptAssetError(message)


def read_band(
    href: str, grid: TargetGrid, *, band: int = 1, fill: float = 0, nodata: float | None = None
) -> AssetRead:
    """Read one band of ``href`` onto ``grid``; raises TransientError or CorruptAssetError.

    ``fill`` is what pixels outside the asset get; ``nodata`` overrides the file's own nodata
    for warping (which pixels are not data).
    """
    with _open(vsicurl(href)) as src:
        try:
            shift = y_shift_into(CRS.from_user_input(src.crs), grid.crs)
            if shift is not None and _same_lattice(src.transform, grid, shift):
                return _window_read(src, grid, band, fill, shift)
            return _warped_read(src, grid, band, fill, nodata)
        except RasterioError as exc:
            raise _classified(exc) from None


def _same_lattice(transform: rasterio.Affine, grid: TargetGrid, shift: float) -> bool:
    """True when the asset's pixels coincide with the grid's (whole-pixel offsets)."""
    t, g = transform, grid.transform
    if not (np.isclose(t.a, g.a) and np.isclose(t.e, g.e) and t.b == 0 and t.d == 0):
        return False
    col = (g.c - t.c) / t.a
    row = (g.f - (t.f + shift)) / t.e
    return bool(np.isclose(col, round(col), atol=1e-6) and np.isclose(row, round(row), atol=1e-6))


def _window_read(
    src: rasterio.io.DatasetReader, grid: TargetGrid, band: int, fill: float, shift: float
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


def _warped_read(
    src: rasterio.io.DatasetReader,
    grid: TargetGrid,
    band: int,
    fill: float,
    nodata: float | None,
) -> AssetRead:
    """Warp the asset onto the grid (nearest, exact transformer); GDAL reads only what it needs."""
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
        values = vrt.read(band)
        covered = vrt.read(vrt.count) > 0 if src_nodata is None else vrt.dataset_mask() > 0
    values = np.where(covered, values, np.asarray(fill, dtype=values.dtype))
    return AssetRead(values, covered)
