"""Chip stores kept as icechunk repositories: each write one commit, a release a tag.

A store written in the ``icechunk`` chip format (``Release.chip_format``) is the folder
``chips/<MODALITY>/<city>/<period>.icechunk``, an icechunk repository on the local file
system holding the same Zarr v3 hierarchy as a plain ``.zarr`` store (same documents, same
codecs, same chunk bytes). What icechunk adds:

- **A write is one commit.** The writer stages every block in a session and commits once, when
  every pixel is written; until then the branch ``main`` points at the last commit. A killed
  or failed write leaves unreferenced chunk files behind, never a visible partial store.
- **Draft and published.** Builds commit on ``main``; publishing the database moves the branch
  ``published`` of every repository to ``main`` (:func:`publish_chip_stores`). Readers open
  ``published`` when it exists, so a rebuild that commits new chips is invisible to them until
  the next publication, as the published tables are.
- **A release is a tag.** ``citycube freeze`` tags every repository with the release version
  (:func:`tag_chip_stores`): ``open_chips(path, ref="sample-0.1.0")`` reads exactly what was
  frozen, whatever is committed later.
- **History.** Every earlier commit stays readable (``Repository.ancestry``), and icechunk can
  list what a commit changed, until a garbage collection (:func:`collect_store_garbage`)
  expires the commits no branch or tag points at and deletes what only they referenced.

One repository per store, never one per release: each store has exactly one writer at a time
(the derive task of its source period; a build holds the release's lock), so commits never
race. icechunk's local file system storage does not make a branch update a compare-and-swap
(it warns that it is not safe for concurrent commits), so parallel workers committing to one
shared repository could lose a commit; separate repositories need no conflict handling at all.

The repository files are covered by the release manifest like any other file, so ``verify``
catches a flipped byte in a chunk, a manifest, a snapshot or a ref.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import icechunk
import xarray as xr
import zarr
from zarr.buffer import default_buffer_prototype

from citycube.cube.chips_zarr import ICECHUNK_SUFFIX, ChipStoreWriter, remove_other_formats
from citycube.errors import (
    ChipsNotFoundError,
    CorruptReleaseError,
    CubeWriteError,
    ReleaseImmutableError,
)
from citycube.grid.tiles import PixelGrid

DRAFT_BRANCH = "main"
"""Where every write commits."""
PUBLISHED_BRANCH = "published"
"""Moved to the draft branch's commit when the release's database is published."""

# icechunk warns on every open of a local repository that concurrent commits are unsafe; the
# one-writer-per-repository layout above is the answer, so only errors are logged.
icechunk.set_logs_filter("error")


def _storage(path: Path) -> icechunk.Storage:
    return icechunk.local_filesystem_storage(str(Path(path).resolve()))


INLINE_CHUNK_BYTES = 8192
"""Chunks up to this size are kept inside the array's manifest instead of a file of their own.

Half of a city-year's chunks are this small (validity masks, nearly empty blocks of a vector
layer); as files each cost a create, which on some file systems is the dearest part of a small
write, and on object storage a request. Manifests grow by at most this much per such chunk.
"""


def _write_config() -> icechunk.RepositoryConfig:
    """What a writer's session uses; readers need none to read inlined chunks."""
    config = icechunk.RepositoryConfig.default()
    config.inline_chunk_threshold_bytes = INLINE_CHUNK_BYTES
    return config


def open_repository(path: Path) -> icechunk.Repository:
    """The icechunk repository of a chip store, with an error that says how to make it."""
    path = Path(path)
    if not path.is_dir():
        raise ChipsNotFoundError(
            f"no chip store at {path}; materialise its derived asset to write the chips"
        )
    try:
        return icechunk.Repository.open(_storage(path))
    except icechunk.IcechunkError as exc:  # a folder is there, but not a repository it reads
        raise damaged_store(path, exc) from exc


def damaged_store(path: Path, exc: Exception) -> CorruptReleaseError:
    """The error for a chip store whose refs, snapshots or manifests cannot be read."""
    first = next((line.strip(" x|") for line in str(exc).splitlines() if line.strip(" x|")), "")
    return CorruptReleaseError(
        f"the chip store {path} is damaged: {first or type(exc).__name__}. Rebuild its "
        "partition (materialise its derived asset again) or restore the store from a copy"
    )


def icechunk_session(path: Path, ref: str | None = None) -> icechunk.Session:
    """A read-only session of the store at ``ref``: a tag or a branch name.

    Without ``ref``: the ``published`` branch when the release has been published, else
    ``main`` (a store no database has published yet). A ref or snapshot that cannot be read
    is a damaged store (``CorruptReleaseError``), not a missing one.
    """
    repo = open_repository(path)
    try:
        branches = set(repo.list_branches())
        if ref is None:
            ref = PUBLISHED_BRANCH if PUBLISHED_BRANCH in branches else DRAFT_BRANCH
        tags = set(repo.list_tags())
        if ref in branches or ref in tags:
            snapshot = repo.lookup_branch(ref) if ref in branches else repo.lookup_tag(ref)
            repo.lookup_snapshot(snapshot)  # the commit the ref names must be there
            return repo.readonly_session(snapshot_id=snapshot)
    except icechunk.IcechunkError as exc:
        raise damaged_store(path, exc) from exc
    raise ChipsNotFoundError(
        f"the chip store {path} has no branch or tag {ref!r} (branches: "
        f"{', '.join(sorted(branches))}; tags: {', '.join(sorted(tags)) or 'none'}); a release "
        "gets its tag when it is frozen (`citycube freeze`)"
    )


def open_icechunk_chips(path: Path, ref: str | None = None) -> xr.Dataset:
    """:func:`citycube.cube.chips.open_chips` for an icechunk store: lazy, not dask-backed."""
    try:
        return xr.open_zarr(
            icechunk_session(path, ref).store,
            chunks=None,
            zarr_format=3,
            consolidated=False,
            decode_coords="all",
            mask_and_scale=False,
        )
    except zarr.errors.GroupNotFoundError as exc:  # a repository whose write never committed
        raise ChipsNotFoundError(
            f"the chip store {path} has no committed chips; rebuild its partition"
        ) from exc
    except icechunk.IcechunkError as exc:  # a snapshot or manifest the refs point at is gone
        raise damaged_store(path, exc) from exc


class IcechunkChipWriter(ChipStoreWriter):
    """:class:`~citycube.cube.chips_zarr.ChipStoreWriter` into an icechunk repository: one commit.

    The documents and chunks are the ones the plain writer produces, set in a writable session
    of ``main`` instead of files of a temp folder; ``commit`` commits the session once every
    pixel is written. What the previous commit held is deleted in the same session first, so
    the new commit holds exactly this write (a chunk left out reads as fill).
    """

    def __init__(
        self,
        path: Path,
        pixel_grid: PixelGrid,
        band_names: Sequence[str],
        dtype: Any,
        fill_value: Any,
        attrs: dict[str, Any] | Any,
    ) -> None:
        super().__init__(path, pixel_grid, band_names, dtype, fill_value, attrs)
        self._session: icechunk.Session | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[str, bytes | None]] = []
        """Keys to set (bytes) or delete (None), sent to icechunk together by ``_flush``."""
        self._new_repository = False
        """True when the store did not exist: its repository is made in the temp sibling and
        renamed into place after its first commit, so a killed first write leaves no
        repository without a commit under the real name."""
        self.snapshot_id: str | None = None
        """The commit this writer made (after ``commit``)."""

    def _run(self, awaitable: Any) -> Any:
        assert self._loop is not None
        return self._loop.run_until_complete(awaitable)

    @property
    def _store(self) -> icechunk.IcechunkStore:
        assert self._session is not None
        return self._session.store

    def _begin_store(self) -> None:
        self._new_repository = not self.path.is_dir()
        if self._new_repository:
            repo = icechunk.Repository.create(_storage(self._tmp_path))
        else:
            repo = icechunk.Repository.open(_storage(self.path))
        repo = repo.reopen(_write_config())  # for this writer only: no config file is saved
        self._session = repo.writable_session(DRAFT_BRANCH)
        self._loop = asyncio.new_event_loop()
        store = self._store

        async def clear() -> None:
            names = [name async for name in store.list_dir("")]
            for name in names:
                if name != "zarr.json":
                    await store.delete_dir(name)

        self._run(clear())

    def _put_key(self, key: str, payload: bytes) -> None:
        if key.endswith("zarr.json") and b"NaN" in payload:
            payload = _strict_json(payload)
        self._pending.append((key, bytes(payload)))

    def _drop_key(self, key: str) -> None:
        self._pending.append((key, None))

    def _flush(self) -> None:
        """Send the pending sets and deletes to icechunk in one pass of the event loop.

        One loop pass per key cost more than the chunks' compression (each waits for
        icechunk's own threads). Documents go first and in order (a node's parent before it),
        then the chunks together: a block's chunk keys are distinct.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return
        store = self._store

        wrap = default_buffer_prototype().buffer.from_bytes  # a view of the bytes, no copy

        async def apply(key: str, payload: bytes | None) -> None:
            if payload is not None:
                await store.set(key, wrap(payload))
            elif await store.exists(key):
                await store.delete(key)

        async def apply_all() -> None:  # icechunk's calls need a running loop when made
            documents = [(k, v) for k, v in pending if k.endswith("zarr.json")]
            chunks = [(k, v) for k, v in pending if not k.endswith("zarr.json")]
            for key, payload in documents:  # in order: a node's parent before the node
                await apply(key, payload)
            if len({key for key, _ in chunks}) == len(chunks):
                await asyncio.gather(*(apply(key, payload) for key, payload in chunks))
            else:  # the same key twice: keep the order
                for key, payload in chunks:
                    await apply(key, payload)

        self._run(apply_all())

    def _write_template(self) -> None:
        super()._write_template()
        self._flush()

    def write_rows(self, row_start: int, values: Any, valid: Any, *, col_start: int = 0) -> None:
        try:
            super().write_rows(row_start, values, valid, col_start=col_start)
        finally:
            try:
                self._flush()
            except Exception as exc:
                raise CubeWriteError(
                    f"writing rows from {row_start} of {self.path} failed: {exc}"
                ) from exc

    def _group(self) -> zarr.Group:
        if self._zarr_group is None:
            assert self._session is not None
            self._flush()
            self._zarr_group = zarr.open_group(self._session.store, mode="r+", zarr_format=3)
        return self._zarr_group

    def commit(self) -> None:
        """Commit the session: readers of ``main`` see the whole new store from now on."""
        if self._committed:
            return
        if not self._started or self._session is None:
            raise RuntimeError("nothing to commit: the writer was never entered")
        self._check_covered()
        try:
            self._flush()
            self.snapshot_id = self._session.commit(
                f"chips {'/'.join(self.path.parts[-3:])}",
                metadata={
                    k: v for k, v in self.attrs.items() if isinstance(v, str | int | float | bool)
                },
            )
            if self._new_repository:  # the first commit: the repository comes into view
                self._tmp_path.rename(self.path)
        except (icechunk.IcechunkError, OSError) as exc:
            raise CubeWriteError.writing(self.path, exc) from exc
        self._committed = True
        remove_other_formats(self.path)

    def _discard(self) -> None:
        """Drop the session (uncommitted blocks stay unreferenced) and the event loop.

        A repository made for a first write and never renamed into place is deleted whole.
        """
        if self._new_repository and not self._committed:
            shutil.rmtree(self._tmp_path, ignore_errors=True)
        self._session = None
        self._zarr_group = None
        self._arrays = {}
        self._pending = []
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def _strict_json(document: bytes) -> bytes:
    """A Zarr document with NaN attribute values spelled "NaN", as Zarr spells a NaN fill value.

    Zarr writes a NaN attribute (a float store's ``nodata``) as the bare token ``NaN``, which
    Python reads back but icechunk, parsing strict JSON, refuses.
    """

    def spelled(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if isinstance(value, dict):
            return {k: spelled(v) for k, v in value.items()}
        if isinstance(value, list):
            return [spelled(v) for v in value]
        return value

    return json.dumps(spelled(json.loads(document)), indent=2).encode()


def chip_repositories(release: Any) -> list[Path]:
    """Every icechunk chip store of a release, sorted."""
    return sorted(Path(release.root).glob(f"chips/*/*/*{ICECHUNK_SUFFIX}"))


def publish_chip_stores(release: Any) -> int:
    """Point every store's ``published`` branch at its latest commit; how many moved.

    Called when the release's database is published, so the chips readers open and the
    partitions the database shows change together.
    """
    moved = 0
    for path in chip_repositories(release):
        repo = open_repository(path)
        head = repo.lookup_branch(DRAFT_BRANCH)
        if PUBLISHED_BRANCH not in repo.list_branches():
            repo.create_branch(PUBLISHED_BRANCH, head)
        elif repo.lookup_branch(PUBLISHED_BRANCH) != head:
            repo.reset_branch(PUBLISHED_BRANCH, head)
        else:
            continue
        moved += 1
    return moved


def tag_chip_stores(release: Any, tag: str) -> list[Path]:
    """Tag every store's published commit (``main`` if never published) with ``tag``.

    A tag names one commit for good: a store already tagged at that commit is left alone, one
    tagged at another commit is an error. Returns the files the tags added (for the manifest).
    """
    added: list[Path] = []
    for path in chip_repositories(release):
        repo = open_repository(path)
        branches = set(repo.list_branches())
        head = repo.lookup_branch(PUBLISHED_BRANCH if PUBLISHED_BRANCH in branches else "main")
        if tag in set(repo.list_tags()):
            if repo.lookup_tag(tag) != head:
                raise ReleaseImmutableError(
                    f"the chip store {path} already has a tag {tag!r} at another commit; a "
                    "release's chips are tagged once"
                )
            continue
        before = {p for p in path.rglob("*") if p.is_file()}
        repo.create_tag(tag, head)
        added += sorted(p for p in path.rglob("*") if p.is_file() and p not in before)
    return added


@dataclass(frozen=True)
class StoreGarbage:
    """What one garbage collection of a chip store removed."""

    snapshots_expired: int
    """Commits taken out of the history (no branch or tag pointed at them)."""
    chunks_deleted: int
    """Chunk files no remaining commit referenced (replaced writes, killed writes)."""
    bytes_deleted: int
    """Bytes of every deleted object."""
    objects_deleted: int
    """Manifests, snapshots, transaction logs and attribute files deleted besides chunks."""


def collect_store_garbage(path: Path, older_than: datetime) -> StoreGarbage:
    """Expire the commits older than ``older_than`` that no branch or tag points at, then delete
    every object older than it that no remaining commit references.

    icechunk's own ``expire_snapshots`` and ``garbage_collect`` do the work: a rebuild commits
    new chunks and keeps the old ones for the history, and a killed write leaves chunks no
    commit references; both stay on disk until this runs. The heads of ``main`` and
    ``published`` and every tag stay whole. Objects newer than ``older_than`` are kept, so a
    reader still on a recent commit is not cut off.
    """
    repo = open_repository(path)
    try:  # read every head first: a damaged ref is a damaged store, not a failed write
        heads = [repo.lookup_branch(b) for b in repo.list_branches()]
        heads += [repo.lookup_tag(t) for t in repo.list_tags()]
        for snapshot in heads:
            repo.lookup_snapshot(snapshot)
    except icechunk.IcechunkError as exc:
        raise damaged_store(path, exc) from exc
    try:
        expired = repo.expire_snapshots(older_than)
        summary = repo.garbage_collect(older_than)
    except icechunk.IcechunkError as exc:
        raise CubeWriteError.writing(path, exc) from exc
    others = (
        summary.manifests_deleted
        + summary.snapshots_deleted
        + summary.transaction_logs_deleted
        + summary.attributes_deleted
    )
    return StoreGarbage(len(expired), summary.chunks_deleted, summary.bytes_deleted, others)


def store_content_digest(path: Path, ref: str | None = None) -> str:
    """SHA-256 of what a chip store holds at ``ref`` (default: as readers open it): every key
    of its Zarr hierarchy with its bytes, in key order.

    Two writes of the same chips give the same digest, although icechunk names its snapshots
    and chunk files at random, so the repository files of a rebuild never hash the same.
    """
    store = icechunk_session(path, ref).store

    async def digest() -> str:
        keys = sorted([key async for key in store.list()])
        sha = hashlib.sha256()
        for key in keys:
            value = await store.get(key, prototype=default_buffer_prototype())
            data = b"" if value is None else value.to_bytes()
            sha.update(f"{key}\0{len(data)}\0".encode())
            sha.update(data)
        return sha.hexdigest()

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(digest())
    finally:
        loop.close()


def commit_count(path: Path, ref: str = DRAFT_BRANCH) -> int:
    """Commits in the history of ``ref`` (the repository's creation included)."""
    repo = open_repository(path)
    return sum(1 for _ in repo.ancestry(branch=ref))


__all__ = [
    "DRAFT_BRANCH",
    "PUBLISHED_BRANCH",
    "IcechunkChipWriter",
    "StoreGarbage",
    "chip_repositories",
    "collect_store_garbage",
    "commit_count",
    "icechunk_session",
    "open_icechunk_chips",
    "open_repository",
    "publish_chip_stores",
    "store_content_digest",
    "tag_chip_stores",
]
