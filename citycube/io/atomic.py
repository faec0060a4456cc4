"""The one atomic write: a result is made under a temporary name beside its place and renamed
over it, so a reader finds the previous version or the new one, whole, never half of one.

The temporary name is owned by the writing process (:func:`citycube.io.scratch.owned_name`):
what a killed writer leaves behind is removed by
:func:`citycube.io.scratch.remove_dead_leftovers`, never a live writer's file. A write that
raises removes its temporary and leaves the previous version in place.

Nothing is synced to disk unless asked (``durable=True``): most results can be made again,
and a sync per file would cost a build dearly; records that say "complete" ask for it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from citycube.io.scratch import owned_name

_FOLDER_IN_THE_WAY = (errno.ENOTEMPTY, errno.EEXIST)
"""What renaming a folder over a folder with entries fails with."""


@contextlib.contextmanager
def atomic_path(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to, with any library (pyarrow, Pillow, DuckDB,
    a folder of files, a symlink).

    When the block ends well, what was made there takes ``path``'s place in one rename (a
    folder replaces a folder through :func:`replace_dir_atomic`); when it raises, it is
    deleted and ``path`` is left as it was. ``durable`` syncs a written file to disk before the
    rename. The parent folder must exist: it is not made here.
    """
    tmp = owned_name(path)
    try:
        yield tmp
        if durable:
            fsync_path(tmp)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            if exc.errno not in _FOLDER_IN_THE_WAY or not _is_folder(tmp):
                raise
            replace_dir_atomic(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_text_atomic(text: str, path: Path, *, durable: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path`, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def write_json_atomic(data: Mapping[str, Any], path: Path, *, durable: bool = False) -> Path:
    """Write ``data`` as JSON (indented, keys sorted) through :func:`write_text_atomic`."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    return write_text_atomic(text, path, durable=durable)


def replace_dir_atomic(src: Path, dest: Path) -> None:
    """Put the complete folder ``src`` at ``dest``, then delete the folder it replaced.

    Where the system can exchange two paths in one step, a reader of ``dest`` sees the old
    folder or the new one, whole. Elsewhere the old folder is first moved aside (to a name
    owned by this process) and put back if the move fails: for that instant ``dest`` is
    absent, never partial.
    """
    if exchange_paths(src, dest):
        _remove(src)  # what was at dest, now at src
        return
    old: Path | None = owned_name(dest, "old")
    try:
        os.replace(dest, old)
    except FileNotFoundError:
        old = None
    try:
        os.replace(src, dest)
    except OSError:
        if old is not None:
            try:
                os.replace(old, dest)
            except OSError:  # something else is at dest by now: the old one is not wanted
                _remove(old)
        raise
    if old is not None:
        _remove(old)


def remove_dir_atomic(path: Path) -> None:
    """Remove the folder ``path`` in one step for its readers: renamed to a name this process
    owns, then deleted (a kill in between leaves a hidden leftover, never a partial folder at
    ``path``, and the next write there removes it). Nothing there: nothing done."""
    aside = owned_name(path, "old")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    _remove(aside)


_RENAME_EXCHANGE = 2
"""``renameat2`` flag: swap two paths in one step (Linux 3.15+, most local file systems)."""


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None


def exchange_paths(first: Path, second: Path) -> bool:
    """Swap two existing paths atomically; False where the system cannot (nothing changed)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_cwd = -100
    done = renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), _RENAME_EXCHANGE)
    return done == 0


def fsync_path(path: Path) -> None:
    """Flush the bytes of a written file to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _remove(path: Path) -> None:
    """Delete a temporary file, symlink or folder, if any (a failure to is no new error)."""
    if _is_folder(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
