"""Source raster access shared by aggregation and chips: a grid description and a masked reader.

Validity is decided on the source's native grid (nodata, finite, coverage, QA bits, legend),
before any reprojection, so a failed read can never look like nodata.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import rasterio
from odc.geo.crs import CRS as GeoCRS
from odc.geo.geobox import GeoBox
from pyproj import CRS, Transformer
from rasterio.crs import CRS as RioCRS
from rasterio.windows import Window

from citycube.errors import SourceFetchError, SourceReadError
from citycube.items.protocol import is_remote
from citycube.items.staging import repair_hint

_T = TypeVar("_T")

# --------------------------------------------------------------------------------------------
# CRS identification, memoised
#
# pyproj answers "which EPSG code is this?" by searching its database: ~0.2 s for a CRS without
# an EPSG code (Mollweide), ~30 ms to name a Lambert conformal conic, ~20 ms to build a
# Transformer. Every year, band and block of a source asks again, so the answers are kept per
# CRS definition for the life of the process. The key is the CRS's input text plus its WKT:
# ``CRS.to_string()`` falls back to the input text when no authority matches, so two CRSs with
# the same WKT but different input text may name themselves differently.

_CACHE_LIMIT = 256
_lock = threading.Lock()
_epsg_cache: dict[tuple[str, str], int | None] = {}
_text_cache: dict[tuple[str, str], str] = {}
_same_as_epsg_cache: dict[tuple[str, str, int], bool] = {}
_transformer_cache: dict[tuple[tuple[str, str], tuple[str, str]], Transformer] = {}
_rio_cache: dict[tuple[str, str], RioCRS] = {}


def _crs_key(crs: CRS | GeoCRS) -> tuple[str, str]:
    """The definition a CRS was made from: one input string always makes the same CRS, and
    rendering the WKT for a key cost more than most of what the caches save."""
    crs = pyproj_crs(crs)
    return ("srs", crs.srs) if crs.srs else ("wkt", crs.to_wkt())


def _memo(cache: dict, key: tuple, compute: Callable[[], _T]) -> _T:
    """``cache[key]``, computing it once; a racing thread at worst computes it twice."""
    try:
        return cache[key]
    except KeyError:
        pass
    value = compute()
    with _lock:
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[key] = value
    return value


def crs_epsg(crs: CRS | GeoCRS) -> int | None:
    """``crs.to_epsg()``, memoised per CRS definition."""
    return _memo(_epsg_cache, _crs_key(crs), crs.to_epsg)


def crs_text(crs: CRS | GeoCRS) -> str:
    """``crs.to_string()``, memoised per CRS definition."""
    return _memo(_text_cache, _crs_key(crs), pyproj_crs(crs).to_string)


def is_epsg(crs: CRS | GeoCRS, epsg: int) -> bool:
    """Whether ``crs`` is EPSG:``epsg`` (by code, or equal without one), memoised."""
    return _memo(
        _same_as_epsg_cache,
        (*_crs_key(crs), epsg),
        lambda: crs_epsg(crs) == epsg or crs == CRS.from_epsg(epsg),
    )


def transformer(src: CRS | GeoCRS | str, dst: CRS | GeoCRS | str) -> Transformer:
    """An ``always_xy`` Transformer from ``src`` to ``dst``, built once per pair of CRSs.

    pyproj Transformers are thread-safe (since pyproj 3.1), so one instance can be shared.
    """
    return _memo(
        _transformer_cache,
        (_user_key(src), _user_key(dst)),
        lambda: Transformer.from_crs(src, dst, always_xy=True),
    )


def rio_crs(crs: CRS | GeoCRS | str) -> RioCRS:
    """The rasterio (GDAL) form of a CRS, built once per CRS definition.

    A CRS without an EPSG code whose PROJ string describes the very same CRS (pyproj compares
    them as equal, e.g. Mollweide, ESRI:54009) is handed to GDAL as that PROJ string: given
    the WKT, GDAL spends ~20 ms per warp looking the CRS up again, given the string ~1 ms, and
    the warped pixels are identical (``tests/test_chips.py``).
    """
    if isinstance(crs, str):
        return _memo(_rio_cache, ("text", crs), lambda: RioCRS.from_user_input(crs))
    return _memo(_rio_cache, _crs_key(crs), lambda: _gdal_form(pyproj_crs(crs)))


def _gdal_form(crs: CRS) -> RioCRS:
    if crs_epsg(crs) is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "may lose information": checked below
            proj_string = crs.to_proj4()
        if proj_string and CRS.from_proj4(proj_string) == crs:
            return RioCRS.from_proj4(proj_string)
    return RioCRS.from_user_input(crs.to_wkt())


def _user_key(crs: CRS | GeoCRS | str) -> tuple[str, str]:
    return ("text", crs) if isinstance(crs, str) else _crs_key(crs)


def pyproj_crs(crs: CRS | GeoCRS) -> CRS:
    """The pyproj CRS behind a GeoBox's CRS (the object it was made from, so caches keyed by
    its definition keep hitting)."""
    return crs.proj if isinstance(crs, GeoCRS) else crs


def grid_key(grid: GeoBox) -> str:
    """A stable text key of a raster's cells, for caching per-grid results (coverage weights)."""
    t = grid.transform
    return (
        f"{crs_text(grid.crs)}|{t.a:.12g},{t.b:.12g},{t.c:.12g},"
        f"{t.d:.12g},{t.e:.12g},{t.f:.12g}|{grid.width}x{grid.height}"
    )


def raster_grid(path: str | Path) -> GeoBox:
    """Where a raster file's cells are."""
    with open_raster(path) as ds:
        return GeoBox((ds.height, ds.width), ds.transform, CRS.from_user_input(ds.crs))


ReadWindow = Callable[[Window], tuple[np.ndarray, np.ndarray]]
"""Reads a window of the source grid: (values[bands, h, w], valid[h, w] bool)."""


@dataclass(frozen=True)
class MaskedSource:
    """A source raster on its native grid plus a reader that applies the validity rules."""

    grid: GeoBox
    """The native grid (north-up, no rotation)."""
    read: ReadWindow
    """Window reader returning values and the validity mask."""
    band_names: tuple[str, ...]
    """Names of the bands ``read`` returns, in order."""


def open_raster(href: str | Path) -> rasterio.DatasetReader:
    """Open a local or remote raster, turning a missing, corrupt or truncated file into a clear
    error.

    Remote hrefs (``https://…``, ``/vsicurl/…``, ``s3://…``) are opened through GDAL's virtual
    file systems, so windowed reads fetch only the byte ranges they need; a failure to read one
    is a fetch error (the server may come back), a bad local file a read error.
    """
    remote = is_remote(href)
    if not remote and not Path(href).exists():
        raise SourceReadError(f"source file {href} does not exist; re-run its source asset")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            ds = rasterio.open(str(href) if remote else Path(href))
    except rasterio.errors.RasterioIOError as exc:
        if remote:
            raise SourceFetchError(
                f"cannot read remote raster {href} ({exc}); the server failed or refused, or "
                "the object is not a raster"
            ) from exc
        raise SourceReadError(
            f"cannot open {href} as a raster ({exc}); the file is corrupt or truncated: "
            f"{repair_hint(href)}"
        ) from exc
    return _georeferenced(ds, str(href))


def _georeferenced(ds: rasterio.DatasetReader, name: str) -> rasterio.DatasetReader:
    if ds.crs is None or ds.transform.is_identity:
        ds.close()
        raise SourceReadError(
            f"{name} has no CRS or geotransform: the file is corrupt or truncated, or is not a "
            f"georeferenced product file; {repair_hint(name)}"
        )
    return ds


def read_checked(ds: rasterio.DatasetReader, indexes: list[int], window: Window) -> np.ndarray:
    """Read bands, surfacing truncated-file decode errors as ``SourceReadError``."""
    try:
        return ds.read(indexes, window=window, boundless=False)
    except rasterio.errors.RasterioIOError as exc:
        raise SourceReadError(
            f"reading {ds.name} failed ({exc}); the file is corrupt or truncated: "
            f"{repair_hint(ds.name)}"
        ) from exc


def write_netcdf_variable(
    path: Path,
    profile: Mapping[str, Any],
    values: np.ndarray,
    *,
    variable: str,
    units: str,
    long_name: str,
    attributes: Mapping[str, str],
) -> None:
    """One single-band CF NetCDF-4 variable written by GDAL's netCDF driver.

    ``profile`` is a one-band raster profile (size, dtype, CRS, transform, nodata); the grid
    mapping and coordinates come from it, ``attributes`` become global attributes, and
    ``rasterio.open(path)`` reads the variable back with its CRS, transform and nodata.
    """
    from rasterio.io import MemoryFile
    from rasterio.shutil import copy

    with MemoryFile() as memory:
        with memory.open(**{**profile, "driver": "GTiff"}) as staging:
            staging.write(values, 1)
            staging.update_tags(1, NETCDF_VARNAME=variable, units=units, long_name=long_name)
            staging.update_tags(**{f"NC_GLOBAL#{k}": v for k, v in attributes.items()})
        with memory.open() as source:
            copy(
                source,
                path,
                driver="netCDF",
                FORMAT="NC4",
                COMPRESS="DEFLATE",
                ZLEVEL="4",
                WRITE_GDAL_VERSION="NO",
                WRITE_GDAL_HISTORY="NO",
            )
