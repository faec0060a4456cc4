"""Per-scene clear masks on disk, so the Landsat products of a city-year read QA_PIXEL once.

OPT, NDVI and HEAT are three products with three adapters (each fetched by its own step, maybe
in its own process), but they mask the same scenes with the same QA bits on the same city grid.
The first fetch to need a scene's mask reads the scene's QA_PIXEL window, reduces it to one
boolean per pixel (clear and inside the scene's footprint) and keeps it under
``<data root>/sources/.stac/qa/<city>/<year>/``; the others load it instead of reading QA again.

A mask is keyed by everything it depends on: the scene id, the QA asset's unsigned href, the
target grid (CRS, transform, shape), the invalid bits and the reader version. A file lock per
key makes a second process wait for the first instead of reading the same QA at the same time.
Masks are written atomically; an unreadable mask file is read again from the source and
replaced. Loading a mask gives exactly the array computing it gives, so composites are the same
with or without the cache.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from citycube.io.atomic import atomic_path
from sources.stac import cachefiles

MASK_VERSION = "clear-mask-1"
"""Bump when what a mask holds changes (masking rules, reader)."""


class ClearMaskCache:
    """Clear masks of scenes under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits = 0
        """Masks loaded from disk by this instance (for tests and logs)."""
        self.misses = 0
        """Masks computed by this instance."""
        self._lock = threading.Lock()

    def path(self, city: str, year: int, scene_id: str, key: Mapping[str, Any]) -> Path:
        """Where a scene's mask lives."""
        text = json.dumps({**key, "version": MASK_VERSION}, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        return self.root / city / str(year) / f"{scene_id}.{digest}.npz"

    def get(
        self,
        city: str,
        year: int,
        scene_id: str,
        key: Mapping[str, Any],
        compute: Callable[[], np.ndarray],
    ) -> np.ndarray:
        """The scene's mask: loaded when kept, else computed by ``compute`` and kept."""
        with self.lock(city, year, scene_id, key):
            mask = self.load(city, year, scene_id, key)
            if mask is None:
                mask = np.asarray(compute(), dtype=bool)
                self.save(city, year, scene_id, key, mask)
            return mask

    def load(
        self, city: str, year: int, scene_id: str, key: Mapping[str, Any]
    ) -> np.ndarray | None:
        """The kept mask; None when absent or unreadable."""
        path = self.path(city, year, scene_id, key)
        mask = _load(path)
        if mask is not None:
            cachefiles.touch(path)
            with self._lock:
                self.hits += 1
        return mask

    def has(self, city: str, year: int, scene_id: str, key: Mapping[str, Any]) -> bool:
        """Whether a mask is kept (not checked: ``load`` checks it)."""
        return self.path(city, year, scene_id, key).is_file()

    def save(
        self, city: str, year: int, scene_id: str, key: Mapping[str, Any], mask: np.ndarray
    ) -> None:
        """Keep a mask just computed."""
        path = self.path(city, year, scene_id, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        _save(path, np.asarray(mask, dtype=bool))
        with self._lock:
            self.misses += 1

    def lock(self, city: str, year: int, scene_id: str, key: Mapping[str, Any]) -> FileLock:
        """A lock named by ``key`` (a scene's QA on a grid, while its blocks are read)."""
        path = self.path(city, year, scene_id, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path.with_suffix(".lock")))


def _save(path: Path, mask: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        np.savez_compressed(out, bits=np.packbits(mask, axis=None), shape=np.array(mask.shape))


_NPY_HEADERS = threading.Lock()
"""Serialises reading ``.npz`` members: numpy parses each member's header with
``ast.literal_eval``, and CPython 3.11's parser is not safe to run in several threads at once
("AST constructor recursion depth mismatch"), which composites loading masks block by block
in parallel would otherwise hit."""


def _load(path: Path) -> np.ndarray | None:
    try:
        with _NPY_HEADERS, np.load(path) as saved:
            shape = tuple(int(v) for v in saved["shape"])
            bits = saved["bits"]
        count = int(np.prod(shape))
        return np.unpackbits(bits, count=count).astype(bool).reshape(shape)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError):
        return None  # damaged: computed again and replaced
