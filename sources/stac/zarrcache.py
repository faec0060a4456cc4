"""Zarr chunks on disk, so the cities and years that share a chunk of a store download it once.

Daymet's annual store is read by windows: each city-year fetch reads the chunks under its city
window at its year. Boston, DC, NYC and San Francisco of one year may share chunks (the real
store's chunks are hundreds of kilometres wide), and a chunk spanning several time steps is
shared by every year it holds. :class:`CachingStore` wraps the store zarr reads through and
keeps each chunk it fetches under
``<data root>/sources/.stac/zarr/<host>/<store path>/<generation>/<chunk key>.chunk``, in a
checksummed cache file (``sources.stac.cachefiles``: written atomically, sha256 verified on
every load, a damaged file deleted and fetched again).

**Keys hold no credential.** A chunk is keyed by the store's *unsigned* URL (its blob-storage
href, before signing and mirroring; any SAS or API key stripped from its query), the chunk key
and the store's generation; the token travels only with the requests.

**A changed store is noticed.** Metadata (``.zmetadata``, ``.zarray``, ``.zattrs``,
``.zgroup``, ``zarr.json``) is never cached: every open fetches it again (a few kB, one request
for a consolidated store). The generation is the sha256 of the metadata documents the open
read, so a store whose metadata changes in any byte — a year appended, a chunk shape, codec or
fill value changed, attributes rewritten — is read into fresh entries and never mixed with the
old ones. A rewrite that changes chunk bytes and leaves every metadata byte as it was is not
noticed; clear the folder after such a rewrite (Daymet's published versions change metadata).

**A chunk that does not decode is not kept.** The server's bytes are cached as they came; if
decoding any chunk of an open fails, every chunk the open read (fetched or loaded) is deleted
from the cache, so a store repaired upstream is read afresh and garbage is never replayed.

Only whole objects are cached; byte-range reads (sharded Zarr v3) go to the store as before.
No lock is held across a request: two processes that miss the same chunk at the same moment
both download it, and each installs it by an atomic rename, so the file is whole whichever
wins. A lock held on zarr's event loop while a request is retried or abandoned is a way to
wait forever (a retried open meets the lock of its own abandoned first attempt); a duplicate
download of one chunk is the cheaper risk. Chunks the store does not have (zarr's fill value)
are not remembered: each open asks again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, Store
from zarr.storage import WrapperStore

from sources.stac import cachefiles
from sources.stac.records import unsigned

CHUNK_VERSION = "zarr-chunk-1"
"""Bump when what a cached chunk holds changes."""
METADATA_NAMES = frozenset({".zmetadata", ".zarray", ".zattrs", ".zgroup", "zarr.json"})
"""Object names that are metadata (Zarr v2 and v3): never cached, they make the generation."""


class ChunkCache:
    """Chunks of Zarr stores under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits = 0
        """Chunks loaded from disk by this instance (for tests and logs)."""
        self.misses = 0
        """Chunks fetched from the store by this instance."""
        self._lock = threading.Lock()

    def wrap(self, store: Store, store_url: str) -> CachingStore:
        """``store`` (the signed store at ``store_url``), its chunks kept here."""
        return CachingStore(store, cache=self, store_url=store_url)

    def path(self, store_url: str, generation: str, chunk_key: str) -> Path:
        """Where a chunk of a store's generation lives."""
        parts = urlsplit(unsigned(store_url))
        store_dir = self.root / (parts.netloc or "local") / parts.path.strip("/")
        return store_dir / generation[:16] / f"{chunk_key}.chunk"

    def _count(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1


@dataclass
class _OpenState:
    """What one open of a store has read: shared by the copies zarr makes of the wrapper."""

    metadata: dict[str, str] = field(default_factory=dict)
    """sha256 of every metadata document read, by key."""
    touched: set[Path] = field(default_factory=set)
    """Cache files of the chunks read (fetched or loaded)."""
    discarded: bool = False
    """Set once a decoding failure discarded the open's chunks: requests still in flight
    (zarr does not cancel a failed read's siblings) must not keep their bytes afterwards."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def generation(self) -> str:
        with self.lock:
            return cachefiles.digest(dict(self.metadata))


class CachingStore(WrapperStore[Store]):
    """A read-only store whose whole-chunk reads go through a :class:`ChunkCache`."""

    def __init__(
        self,
        store: Store,
        *,
        cache: ChunkCache,
        store_url: str,
        state: _OpenState | None = None,
    ) -> None:
        super().__init__(store)
        self.cache = cache
        self.store_url = unsigned(store_url).rstrip("/")
        self._state = _OpenState() if state is None else state

    def _with_store(self, store: Store) -> CachingStore:
        return type(self)(store, cache=self.cache, store_url=self.store_url, state=self._state)

    def discard_read_chunks(self) -> int:
        """Delete the cache files of every chunk this open read; how many there were."""
        with self._state.lock:
            self._state.discarded = True
            touched = list(self._state.touched)
            self._state.touched.clear()
        for path in touched:
            cachefiles.discard(path)
        return len(touched)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """An object of the store: metadata always from the store, a chunk from the cache when
        it holds it whole, else from the store (and then kept)."""
        if key.rsplit("/", 1)[-1] in METADATA_NAMES:
            value = await self._store.get(key, prototype, byte_range)
            if value is not None and byte_range is None:
                digest = hashlib.sha256(value.to_bytes()).hexdigest()
                with self._state.lock:
                    self._state.metadata[key] = digest
            return value
        if byte_range is not None or not self._state.metadata or ".." in key.split("/"):
            return await self._store.get(key, prototype, byte_range)
        generation = self._state.generation()
        entry = {
            "store": self.store_url,
            "generation": generation,
            "chunk": key,
            "version": CHUNK_VERSION,
        }
        path = self.cache.path(self.store_url, generation, key)
        with self._state.lock:
            self._state.touched.add(path)
        kept = _load(path, entry)
        if kept is not None:
            self.cache._count(hit=True)
            return prototype.buffer.from_bytes(kept)
        value = await self._store.get(key, prototype)
        if value is None:
            return None
        with self._state.lock:  # written before a discard (which then deletes it), or never
            if not self._state.discarded:
                cachefiles.write(path, entry, value.to_bytes())
        self.cache._count(hit=False)
        return value

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield (key, await self.get(key, prototype, byte_range))

    def __repr__(self) -> str:
        return f"CachingStore({self.store_url!r}, cache={str(self.cache.root)!r})"

    def __eq__(self, value: Any) -> bool:
        return isinstance(value, CachingStore) and self._store == value._store


def _load(path: Path, entry: dict[str, Any]) -> memoryview | None:
    kept = cachefiles.read(path, entry)
    return None if kept is None else kept[1]
