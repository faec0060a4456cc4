"""Checksummed cache files: written atomically, verified on every read, never trusted blindly.

The family's caches of fetched bytes (Landsat band windows, ``sources.stac.windows``; Zarr
chunks, ``sources.stac.zarrcache``) keep each entry as one file::

    citycube-cache 1\\n
    {"key": …, "sha256": "<of the payload>", "size": <payload bytes>, …}\\n
    <payload>

The header names what the entry is (its key, credential-free) and the sha256 and length of the
payload. A file is written to a temporary name beside its place and renamed over it, so a reader
sees either nothing or a whole file. A read checks the magic line, the key, the length and the
checksum; a file that fails any check (truncated by a crash or a full disk, bit rot, a key
collision, a half-copied cache) is deleted and reported as absent, so the caller reads the bytes
from the source again and writes a fresh entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from citycube.io.atomic import atomic_path

MAGIC = b"citycube-cache 1\n"
"""First line of every cache file (the layout's version)."""


def canonical(key: Mapping[str, Any]) -> str:
    """A key as canonical JSON text (sorted keys, no spaces): what digests and headers use."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


def digest(key: Mapping[str, Any]) -> str:
    """sha256 (hex) of a key's canonical text."""
    return hashlib.sha256(canonical(key).encode()).hexdigest()


def write(path: Path, key: Mapping[str, Any], payload: bytes, **fields: Any) -> None:
    """Write ``payload`` under ``key`` at ``path`` atomically, with its sha256 and length.

    ``fields`` are kept in the header next to the key (e.g. dtype and shape of an array).
    """
    header = {
        **fields,
        "key": json.loads(canonical(key)),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        out.write(MAGIC)
        out.write(canonical(header).encode())
        out.write(b"\n")
        out.write(payload)


def read(path: Path, key: Mapping[str, Any]) -> tuple[dict[str, Any], memoryview] | None:
    """(header, payload) of the entry at ``path`` if it is whole and holds ``key``; else None.

    The payload is a view of the file's bytes (no copy: a Zarr chunk may be hundreds of MB). A
    file that exists but fails a check is deleted (it would fail again).
    """
    try:
        data = path.read_bytes()
    except OSError:  # absent, or unreadable: the caller reads from the source
        return None
    checked = _checked(data, key)
    if checked is None:
        discard(path)
    else:
        touch(path)
    return checked


def touch(path: Path) -> None:
    """Mark an entry as just used (every load does), so pruning the caches keeps it longest
    (``sources.stac.pruning``)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def discard(path: Path) -> None:
    """Delete a cache file (gone already is fine; a file another process holds or replaced is
    checked again by the next read)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _checked(data: bytes, key: Mapping[str, Any]) -> tuple[dict[str, Any], memoryview] | None:
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(data[len(MAGIC) : end])
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("key") != json.loads(canonical(key)):
        return None
    payload = memoryview(data)[end + 1 :]
    if header.get("size") != len(payload):
        return None
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None
    return header, payload
