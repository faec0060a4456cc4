"""Source raster access shared by aggregation and chips: a grid description and a masked reader.

Validity is decided on the source's native grid (nodata, finite, coverage, QA bits, legend),
before any reprojection, so a failed read can never look like nodata.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from pyproj import CRS
from rasterio.windows import Window

from citycube.errors import SourceReadError


@dataclass(frozen=True)
class RasterGrid:
    """Where a raster's cells are: CRS, transform and shape."""

    crs: CRS
    """Coordinate reference system of the cells."""
    transform: Affine
    """Affine transform of the cell corners (north-up, no rotation)."""
    width: int
    """Columns."""
    height: int
    """Rows."""

    @property
    def res(self) -> tuple[float, float]:
        """(x, y) cell size, positive."""
        return (abs(self.transform.a), abs(self.transform.e))

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax)."""
        t = self.transform
        return (t.c, t.f + t.e * self.height, t.c + t.a * self.width, t.f)

    def key(self) -> str:
        """A stable text key for caching per-grid results (e.g. coverage weights)."""
        t = self.transform
        return (
            f"{self.crs.to_string()}|{t.a:.12g},{t.b:.12g},{t.c:.12g},"
            f"{t.d:.12g},{t.e:.12g},{t.f:.12g}|{self.width}x{self.height}"
        )

    @classmethod
    def of(cls, path: str | Path) -> RasterGrid:
        """The grid of a raster file."""
        with open_raster(path) as ds:
            return cls(CRS.from_user_input(ds.crs), ds.transform, ds.width, ds.height)


ReadWindow = Callable[[Window], tuple[np.ndarray, np.ndarray]]
"""Reads a window of the source grid: (values[bands, h, w], valid[h, w] bool)."""


@dataclass(frozen=True)
class MaskedSource:
    """A source raster on its native grid plus a reader that applies the validity rules."""

    grid: RasterGrid
    """The native grid."""
    read: ReadWindow
    """Window reader returning values and the validity mask."""
    band_names: tuple[str, ...]
    """Names of the bands ``read`` returns, in order."""


def open_raster(path: str | Path) -> rasterio.DatasetReader:
    """Open a raster, turning a missing, corrupt or truncated file into a clear error."""
    path = Path(path)
    if not path.exists():
        raise SourceReadError(f"source file {path} does not exist; re-run its source asset")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            ds = rasterio.open(path)
    except rasterio.errors.RasterioIOError as exc:
        raise SourceReadError(
            f"cannot open {path} as a raster ({exc}); the file is corrupt or truncated: "
            "delete it and re-run its source asset"
        ) from exc
    if ds.crs is None or ds.transform.is_identity:
        ds.close()
        raise SourceReadError(
            f"{path} has no CRS or geotransform: the file is corrupt or truncated, or is not a "
            "georeferenced product file; delete it and re-run its source asset"
        )
    return ds


def read_checked(ds: rasterio.DatasetReader, indexes: list[int], window: Window) -> np.ndarray:
    """Read bands, surfacing truncated-file decode errors as ``SourceReadError``."""
    try:
        return ds.read(indexes, window=window, boundless=False)
    except rasterio.errors.RasterioIOError as exc:
        raise SourceReadError(
            f"reading {ds.name} failed ({exc}); the file is corrupt or truncated: "
            "delete it and re-run its source asset"
        ) from exc
