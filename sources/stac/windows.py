"""Band windows on disk, so a scene's or tile's band is read once per city grid, whoever needs it.

OPT reads red, green and blue; NDVI reads red and nir08; HEAT reads the thermal band. Each is a
product of its own (own adapter, own Dagster step, maybe its own process), so without a cache
the red window of every scene is downloaded twice, and a fetch that fails at scene k and is
retried downloads every window of the scenes before k again. Here the first read of a window
keeps it under ``<data root>/sources/.stac/windows/<city>/<year>/`` (``static/`` for a static
product's tiles, such as the DEM's); later reads load it.

A window is keyed by everything its pixels depend on: the scene id, the asset key and its
unsigned href (never a token), the target grid (CRS, transform, shape), the band, the fill and
nodata values of the read and the reader version (``WINDOW_VERSION``). It is stored as the
values (in the asset's own type, Blosc-zstd compressed) and the footprint bits, in a checksummed
cache file (``sources.stac.cachefiles``: written atomically, sha256 verified on every load, a
damaged file deleted and read again from the source). A file lock per key makes a second process
wait for the first rather than download the same window at the same time, as the clear masks do.
Loading a window gives exactly the arrays reading it gives, so composites are the same bit for
bit with or without the cache. A failed read keeps nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pystac
from filelock import FileLock
from numcodecs import Blosc
from odc.geo.geobox import GeoBox

from sources.stac import cachefiles
from sources.stac.reading import AssetRead
from sources.stac.records import unsigned

WINDOW_VERSION = "band-window-1"
"""Bump when what a window holds changes (reader, warping rules)."""
_CODEC = Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE)
"""Compression of the values (zstd over shuffled bytes: compact and quick on 16-bit bands)."""


def grid_key(grid: GeoBox) -> dict[str, Any]:
    """What identifies the target grid in a cache key."""
    return {
        "crs": grid.crs.to_wkt(),
        "transform": [float(v) for v in tuple(grid.transform)[:6]],
        "shape": [int(v) for v in grid.shape],
    }


def window_key(
    item: pystac.Item, asset_key: str, grid: GeoBox, fill: float, nodata: float | None
) -> dict[str, Any]:
    """What an item's band window on the grid depends on (a block's adds the block): never
    a token, only the unsigned href."""
    asset = item.assets.get(asset_key)
    return {
        "scene": item.id,
        "asset": asset_key,
        "href": None if asset is None else unsigned(asset.href),
        **grid_key(grid),
        "band": 1,
        "fill": float(fill),
        "nodata": None if nodata is None else float(nodata),
    }


Period = int | str
"""A cache folder under the city: the source year, or 'static' for a static product."""


class WindowCache:
    """Band windows of scenes under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits = 0
        """Windows loaded from disk by this instance (for tests and logs)."""
        self.misses = 0
        """Windows read from the source by this instance."""
        self._lock = threading.Lock()

    def path(
        self, city: str, year: Period, scene_id: str, asset: str, key: Mapping[str, Any]
    ) -> Path:
        """Where a window lives: one folder per city-year, named by scene and asset."""
        name = f"{scene_id}.{asset}.{cachefiles.digest(self._full(key))[:20]}.win"
        return self.root / city / str(year) / name

    def get(
        self,
        city: str,
        year: Period,
        scene_id: str,
        asset: str,
        key: Mapping[str, Any],
        read: Callable[[], AssetRead],
    ) -> AssetRead:
        """The window: loaded when kept and whole, else read by ``read`` and kept."""
        with self.lock(city, year, scene_id, asset, key):
            window = self.load(city, year, scene_id, asset, key)
            if window is None:
                window = read()
                self.save(city, year, scene_id, asset, key, window)
            return window

    def has(
        self, city: str, year: Period, scene_id: str, asset: str, key: Mapping[str, Any]
    ) -> bool:
        """Whether a window is kept (not checked: ``load`` checks it)."""
        return self.path(city, year, scene_id, asset, key).is_file()

    def load(
        self, city: str, year: Period, scene_id: str, asset: str, key: Mapping[str, Any]
    ) -> AssetRead | None:
        """The kept window if it is whole; None when absent or damaged (then deleted)."""
        kept = _load(self.path(city, year, scene_id, asset, key), self._full(key))
        if kept is not None:
            with self._lock:
                self.hits += 1
        return kept

    def save(
        self,
        city: str,
        year: Period,
        scene_id: str,
        asset: str,
        key: Mapping[str, Any],
        window: AssetRead,
    ) -> None:
        """Keep a window just read from the source."""
        path = self.path(city, year, scene_id, asset, key)
        _save(path, self._full(key), window)
        with self._lock:
            self.misses += 1

    def lock(
        self, city: str, year: Period, scene_id: str, asset: str, key: Mapping[str, Any]
    ) -> FileLock:
        """A lock named by ``key`` (e.g. a scene's asset on a grid, for reading its blocks),
        so a second process waits for the first instead of reading the same windows."""
        path = self.path(city, year, scene_id, asset, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path.with_suffix(".lock")))

    @staticmethod
    def _full(key: Mapping[str, Any]) -> dict[str, Any]:
        return {**key, "version": WINDOW_VERSION}


def _save(path: Path, key: Mapping[str, Any], window: AssetRead) -> None:
    values = np.ascontiguousarray(window.values)
    packed = _CODEC.encode(values)
    bits = np.packbits(np.asarray(window.covered, dtype=bool), axis=None).tobytes()
    cachefiles.write(
        path,
        key,
        bytes(packed) + bits,
        dtype=values.dtype.str,
        shape=list(values.shape),
        values_size=len(packed),
    )


def _load(path: Path, key: Mapping[str, Any]) -> AssetRead | None:
    entry = cachefiles.read(path, key)
    if entry is None:
        return None
    header, payload = entry
    try:
        shape = tuple(int(v) for v in header["shape"])
        dtype = np.dtype(header["dtype"])
        split = int(header["values_size"])
        raw = _CODEC.decode(payload[:split])
        values = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        count = int(np.prod(shape))
        bits = np.frombuffer(payload[split:], dtype=np.uint8)
        covered = np.unpackbits(bits, count=count).astype(bool).reshape(shape)
    except (KeyError, TypeError, ValueError, RuntimeError):
        cachefiles.discard(path)  # checksummed but not decodable: a writer of another layout
        return None
    return AssetRead(values, covered)
