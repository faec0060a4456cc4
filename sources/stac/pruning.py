"""Keep the STAC family's caches of fetched bytes within a size and an age.

The caches (clear masks ``qa/``, band windows ``windows/``, Zarr chunks ``zarr/`` under
``<data root>/sources/.stac/``) make reruns read nothing again, but nothing else ever deletes
them: a Landsat city-year leaves about a thousand window files behind. Pruning deletes the
entries used longest ago (an entry's modification time, which every load refreshes: see
:func:`sources.stac.cachefiles.touch`) until the caches fit the budget, and every entry not
used within ``older_than_s``.

Deleting an entry only costs a read from the source again: every cache treats an absent or
damaged entry as a miss. An entry whose file lock another process holds (a fetch reading that
scene right now) is left alone. Search records, the scratch folder and installed items are not
caches and are never touched.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

CACHE_FOLDERS = ("qa", "windows", "zarr")
"""The folders of ``<data root>/sources/.stac`` that hold cache entries."""
ENTRY_SUFFIXES = (".npz", ".win", ".chunk")
"""Cache entries: clear masks, band windows, Zarr chunks (locks and temp files are not)."""


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    size: int
    last_used: float
    """Seconds since the epoch: when the entry was written or last loaded."""


@dataclass(frozen=True)
class PruneReport:
    """What a prune found and did (or, dry, would do)."""

    entries: int
    bytes: int
    removed: int
    removed_bytes: int
    skipped_locked: int
    dry_run: bool

    @property
    def kept_bytes(self) -> int:
        return self.bytes - self.removed_bytes

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        text = (
            f"{self.entries} cache entries, {_size(self.bytes)}: {verb} {self.removed} "
            f"({_size(self.removed_bytes)}), {_size(self.kept_bytes)} kept"
        )
        if self.skipped_locked:
            text += f"; {self.skipped_locked} in use by a running fetch left alone"
        return text


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cache_entries(state_dir: Path) -> list[CacheEntry]:
    """Every cache entry under ``state_dir`` (``<data root>/sources/.stac``), oldest use first."""
    entries = []
    for folder in CACHE_FOLDERS:
        for path in _files(Path(state_dir) / folder):
            if path.name.startswith(".") or path.suffix not in ENTRY_SUFFIXES:
                continue
            try:
                stat = path.stat()
            except OSError:  # removed meanwhile
                continue
            entries.append(CacheEntry(path, stat.st_size, stat.st_mtime))
    entries.sort(key=lambda e: (e.last_used, str(e.path)))
    return entries


def _files(root: Path) -> Iterator[Path]:
    for folder, _, names in os.walk(root):
        for name in names:
            yield Path(folder) / name


def prune_caches(
    state_dir: Path,
    *,
    max_bytes: int | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> PruneReport:
    """Delete cache entries unused for ``older_than_s`` seconds, then the least recently used
    ones until the rest fit in ``max_bytes``; with ``dry_run`` only count them."""
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
    if older_than_s is not None and older_than_s < 0:
        raise ValueError(f"older_than_s must be at least 0, got {older_than_s}")
    entries = cache_entries(state_dir)
    total = sum(e.size for e in entries)
    cutoff = None if older_than_s is None else (time.time() if now is None else now) - older_than_s
    remaining = total
    removed = removed_bytes = locked = 0
    for entry in entries:  # least recently used first
        too_old = cutoff is not None and entry.last_used < cutoff
        too_big = max_bytes is not None and remaining > max_bytes
        if not (too_old or too_big):
            continue
        if not dry_run and not _remove(entry.path):
            locked += 1
            continue
        removed += 1
        removed_bytes += entry.size
        remaining -= entry.size
    if not dry_run:
        _remove_empty_folders(state_dir)
    return PruneReport(len(entries), total, removed, removed_bytes, locked, dry_run)


def _remove(path: Path) -> bool:
    """Delete an entry and its lock file unless a fetch holds the lock; False if it does."""
    lock_path = path.with_suffix(".lock")
    if not lock_path.exists():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return True
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    try:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(FileNotFoundError):
            lock_path.unlink()
    finally:
        lock.release()
    return True


def _remove_empty_folders(state_dir: Path) -> None:
    for folder in CACHE_FOLDERS:
        root = Path(state_dir) / folder
        for parent, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            if Path(parent) != root:
                with contextlib.suppress(OSError):  # not empty, or gone
                    os.rmdir(parent)
