"""Why a release database could not be opened or read, told apart from its message.

DuckDB raises the same ``IOException`` for a file another process holds (a lock) and for a
file that is damaged, cut short or not a database at all; the remedies differ (close the other
process, or rebuild or restore the file), so the message decides which error it is.
"""

from __future__ import annotations

from pathlib import Path

from citycube.errors import (
    CityCubeError,
    CorruptReleaseError,
    DatabaseBusyError,
    ReleaseMovedError,
)

_LOCKED = ("Could not set lock", "Conflicting lock")
_MISSING_FILES = "No files found that match the pattern"


def database_error(path: Path, exc: Exception) -> CityCubeError:
    """The error to raise for ``exc`` met opening or reading the database at ``path``."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if any(marker in first for marker in _LOCKED):
        return DatabaseBusyError(
            f"cannot open {path} ({first}): another process holds it (a `duckdb` shell or a "
            "running build); close it and run the command again"
        )
    if _MISSING_FILES in first:  # a view over files, written where the release was before
        release = path.parent
        return ReleaseMovedError(
            f"cannot read {path} ({first}): its views read the files of the release where it was "
            f"built, and {release} was moved or copied from there. Rebuild its views with "
            f"`citycube --data {release.parent.parent} --release {release.name} views` "
            "(releases built now hold their tables in the database and can move freely)"
        )
    return CorruptReleaseError(
        f"cannot read {path} ({first}): the database file is damaged, cut short or not a DuckDB "
        "database. Rebuild the release (`citycube build` with the same --release), or restore "
        "the file from a copy; `citycube verify` tells which other files differ from the "
        "release's manifest"
    )
