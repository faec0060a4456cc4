"""Install a fetched item once, atomically: stage it, record it complete, move it into place.

Every adapter that puts files on disk uses this. The files of an item are written into a
staging directory next to the item's final place (same filesystem, so the move is atomic), a
completion record (``_complete.json``) is written last and synced, and the directory is moved
into place with one rename. A killed fetch therefore leaves at most a staging directory, which
the next fetch of the same item removes once its writer is gone; it never leaves a half item
that looks complete. A complete item whose record matches the requested identity is reused,
as long as its files still have the size and SHA-256 the record took at install: an item
truncated or garbled since (a cut CSV would silently lower totals) is made again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from citycube.errors import DiskFullError, no_space_left
from citycube.io.atomic import atomic_path, replace_dir_atomic, write_text_atomic
from citycube.io.digest import file_sha256, file_state
from citycube.io.scratch import owned_name, remove_dead_leftovers

log = logging.getLogger(__name__)

COMPLETE_MARKER = "_complete.json"
"""Written last into an item directory; its presence means the item is whole."""


@dataclass(frozen=True)
class StagedFiles:
    """What a writer put into the staging directory."""

    files: Mapping[str, str]
    """File name (relative to the item directory) by role."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Adapter metadata kept in the completion record (scene ids, units, …)."""


@dataclass(frozen=True)
class InstalledItem:
    """A complete item on disk and its completion record."""

    directory: Path
    """The item's final directory."""
    record: Mapping[str, Any]
    """The completion record: identity, files by role, extra metadata."""

    @property
    def files(self) -> dict[str, Path]:
        """Absolute paths by role."""
        return {role: self.directory / name for role, name in self.record["files"].items()}

    @property
    def extra(self) -> dict[str, Any]:
        """Adapter metadata recorded with the item."""
        return dict(self.record.get("extra", {}))

    @property
    def fingerprint(self) -> str:
        """Digest of the completion record: changes whenever the item is re-made differently."""
        text = json.dumps(self.record, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def repair_hint(path: str | Path) -> str:
    """What to delete so a damaged source file is fetched again: its whole item directory.

    Deleting the file alone is not enough when the item's completion record survives it (and
    for remote or unstaged files there is no item directory, only the file).
    """
    for folder in Path(path).parents:
        if (folder / COMPLETE_MARKER).exists():
            return f"delete its item directory {folder} and re-run its source asset"
    # Not in an item directory: nothing the pipeline installed, so no path to delete is named
    # (the file may lie anywhere, even outside the data root).
    return "replace the file with the product's own (re-run its source asset to fetch it again)"


def installed_item(final: Path, identity: Mapping[str, Any]) -> InstalledItem | None:
    """The complete item at ``final`` if its record matches ``identity`` and its files exist."""
    try:
        record = json.loads((final / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if any(record.get(key) != value for key, value in identity.items()):
        return None
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return None
    sums = record.get("checksums")
    names = [*files.values(), *(sums if isinstance(sums, dict) else ())]
    outside = sorted({str(name) for name in names if not _inside(final, name)})
    if outside:
        log.warning(
            "source item %s has a completion record naming files outside its directory (%s); "
            "the record is refused and the item made again",
            final,
            ", ".join(outside),
        )
        return None
    item = InstalledItem(final, record)
    if not all(path.exists() for path in item.files.values()):
        return None
    damaged = _damaged_files(item)
    if damaged:
        log.warning(
            "source item %s was changed after it was installed (%s differ from its record); "
            "it is made again",
            final,
            ", ".join(damaged),
        )
        return None
    return item


def _inside(directory: Path, name: object) -> bool:
    """True for a plain relative file name that stays inside ``directory``: a record naming
    '/etc/passwd' or '../../x' would make the pipeline read (and advise deleting) any file."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        return False
    root = directory.resolve()
    return (root / name).resolve().is_relative_to(root)


def _file_checksums(directory: Path, names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of each file of an item (by name), recorded when it is installed."""
    sums: dict[str, dict[str, Any]] = {}
    for name in sorted(set(names.values())):
        path = directory / name
        if path.is_file():
            sums[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return sums


_verified: dict[tuple[str, int, int], str] = {}
"""(path, size, mtime) → SHA-256 already checked in this process: a worker reading the same
item for many partitions hashes each file once."""

VERIFIED_FILE = ".verified.json"
"""Kept in an item directory: each file's state (size, modification and change times, inode)
when its SHA-256 last matched the record. A file still in that state is not read again by
other processes; a file written since has another change time (which cannot be set back from
user space) and is hashed again."""


def _read_verified(directory: Path) -> dict[str, Any]:
    try:
        states = json.loads((directory / VERIFIED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return states if isinstance(states, dict) else {}


def _write_verified(directory: Path, states: Mapping[str, Any]) -> None:
    """Record verified states, atomically; a directory that cannot be written is left as is
    (the files are then hashed again next time, nothing worse)."""
    with contextlib.suppress(OSError), atomic_path(directory / VERIFIED_FILE) as tmp:
        tmp.write_text(json.dumps(states, sort_keys=True), encoding="utf-8")


def _remember_verified(directory: Path, sums: Mapping[str, Mapping[str, Any]]) -> None:
    """Files this process just hashed and installed need no second hash when read back.

    Only when the installed record is the one written here (another worker may have completed
    the same item first, and then its files are checked as any others are).
    """
    try:
        installed = json.loads((directory / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(installed, dict) or installed.get("checksums") != sums:
        return
    states = {}
    for name, expected in sums.items():
        path = directory / name
        try:
            state = file_state(path)
        except OSError:
            continue
        if state[0] == expected["bytes"]:
            _verified[(str(path), state[0], state[1])] = expected["sha256"]
            states[name] = {"state": state, "sha256": expected["sha256"]}
    _write_verified(directory, states)


def _damaged_files(item: InstalledItem) -> list[str]:
    """Files whose size or SHA-256 differ from the item's record (truncated, garbled, replaced).

    Records written before checksums were kept have none, and are trusted as before.
    """
    sums = item.record.get("checksums")
    if not isinstance(sums, dict):
        return []
    damaged = []
    states: dict[str, Any] | None = None  # the item's verified states, read when first needed
    hashed = False
    for name, expected in sums.items():
        path = item.directory / name
        try:
            state = file_state(path)
        except OSError:
            damaged.append(name)
            continue
        if state[0] != expected.get("bytes"):
            damaged.append(name)
            continue
        key = (str(path), state[0], state[1])
        digest = _verified.get(key)
        if digest is None:
            states = _read_verified(item.directory) if states is None else states
            known = states.get(name)
            if isinstance(known, dict) and known.get("state") == state:
                digest = known.get("sha256")
            else:
                digest = file_sha256(path)
                hashed = True
                states[name] = {"state": state, "sha256": digest}
        if digest != expected.get("sha256"):
            damaged.append(name)
            continue
        _verified[key] = digest
    if hashed and not damaged and states is not None:
        _write_verified(item.directory, states)
    return damaged


def install_item(
    final: Path, identity: Mapping[str, Any], write: Callable[[Path], StagedFiles]
) -> InstalledItem:
    """Reuse the complete item at ``final``, or stage it with ``write`` and move it into place.

    ``identity`` (product, city, source year, version, …) is stored in the completion record
    and must match for an item to be reused; anything else found at ``final`` is replaced.
    """
    existing = installed_item(final, identity)
    if existing is not None:
        return existing
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(final)
        staging = owned_name(final)
        staging.mkdir()
    except OSError as exc:
        if no_space_left(final.parent, exc):
            raise DiskFullError.at(final, "nothing of the item was installed") from exc
        raise
    try:
        try:
            staged = write(staging)
        except Exception as exc:  # GDAL, OGR, Arrow and Python each word a full disk their way
            if no_space_left(staging, exc):
                raise DiskFullError.at(final, "nothing of the item was installed") from exc
            raise
        missing = [name for name in staged.files.values() if not (staging / name).exists()]
        if missing:
            raise RuntimeError(f"the writer of {final} did not write {missing}")
        record = {
            **identity,
            "files": dict(staged.files),
            "extra": dict(staged.extra),
            "checksums": _file_checksums(staging, staged.files),
        }
        text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
        write_text_atomic(text, staging / COMPLETE_MARKER, durable=True)
        _move_into_place(staging, final, identity)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # already gone when it was moved
    _remember_verified(final, record["checksums"])
    item = installed_item(final, identity)
    if item is None:
        raise RuntimeError(f"item {final} vanished right after it was installed")
    return item


def _move_into_place(staging: Path, final: Path, identity: Mapping[str, Any]) -> None:
    """Rename ``staging`` to ``final``; an item someone else completed meanwhile is kept."""
    if installed_item(final, identity) is not None:
        return
    try:
        replace_dir_atomic(staging, final)  # whatever was at final is removed
    except OSError:
        if installed_item(final, identity) is None:
            raise
