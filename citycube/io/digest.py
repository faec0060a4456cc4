"""The one file digest (SHA-256) and the file state that says when a digest may be stale.

Every room that records or checks a file's digest (installed source items, chip stores, the
release manifest, benchmark manifests) goes through these, so a digest means the same thing
everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

WRITTEN_DIGESTS = ".written-sha256.json"
"""Kept in a folder a writer just filled: each file's SHA-256, size and state, so that the
manifest does not read those bytes back."""


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read in blocks (files can be larger than memory)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_state(path: str | Path) -> list[int]:
    """What changes whenever a file's bytes can have changed: size, modification and change
    times, inode. The change time cannot be set back from user space, so a rewritten file
    never matches its earlier state, even with its modification time restored."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def write_digests(folder: Path, digests: Mapping[str, tuple[str, int]]) -> None:
    """Record the SHA-256 and size of files just written under ``folder`` (names relative to
    it), with each file's state now; a file whose size is not the one hashed is left out."""
    entries = {}
    for name, (sha256, size) in sorted(digests.items()):
        state = file_state(folder / name)
        if state[0] == size:
            entries[name] = {"sha256": sha256, "bytes": size, "state": state}
    (folder / WRITTEN_DIGESTS).write_text(json.dumps(entries), encoding="utf-8")
