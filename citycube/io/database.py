"""Why a release database could not be opened or read, told apart from its message.

DuckDB raises the same ``IOException`` for a file another process holds (a lock) and for a
file that is damaged, cut short or not a database at all; the remedies differ (close the other
process, or rebuild or restore the file), so the message decides which error it is.
"""

from __future__ import annotations

from pathlib import Path

from citycube.errors import CityCubeError, CorruptReleaseError, DatabaseBusyError

_LOCKED = ("Could not set lock", "Conflicting lock")


def database_error(path: Path, exc: Exception) -> CityCubeError:
    """The error to raise for ``exc`` met opening or reading the database at ``path``."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if any(marker in first for marker in _LOCKED):
        return DatabaseBusyError(
            f"cannot open {path} ({first}): another process holds it (a `duckdb` shell or a "
            "running build); close it and run the command again"
        )
    return CorruptReleaseError(
        f"cannot read {path} ({first}): the database file is damaged, cut short or not a DuckDB "
        "database. Rebuild the release (`citycube build` with the same --release), or restore "
        "the file from a copy; `citycube verify` tells which other files differ from the "
        "release's manifest"
    )
