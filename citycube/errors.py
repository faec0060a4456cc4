"""Domain errors with stable codes and messages that say what to change."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class CityCubeError(Exception):
    """Base class; ``code`` is stable so logs and tests can match on it."""

    code = "CC000"

    def __init__(self, message: str) -> None:
        super().__init__(f"[{self.code}] {message}")
        self.message = message

    def add_context(self, context: str) -> None:
        """Put what the error concerns (modality, city, period, source) in front of its message.

        Readers name the file; the caller knows which partition and source it belongs to. The
        error keeps its type, code, attributes, cause and traceback, so it is re-raised as is.
        """
        if context and not self.message.startswith(context):
            self.message = f"{context}: {self.message}"
            self.args = (f"[{self.code}] {self.message}",)

    def __reduce__(self) -> tuple[type, tuple[object, ...], dict[str, object]]:
        """Pickle by message and attributes, so errors cross process boundaries intact."""
        return (type(self), (self.message,), dict(self.__dict__))


@contextmanager
def in_context(context: str) -> Iterator[None]:
    """Put ``context`` (what is being worked on: modality, city, period, source) in front of
    the message of any CityCube error raised inside, so that an error from a step working on
    many partitions says which one failed."""
    try:
        yield
    except CityCubeError as exc:
        exc.add_context(context)
        raise


class SpecError(CityCubeError):
    """A declarative spec (cities, modalities, sources) failed validation."""

    code = "CC100"


class UnknownCityError(CityCubeError):
    """A city key that the catalogue does not declare."""

    code = "CC101"


class UnknownYearError(CityCubeError):
    """A year outside the calendar (2000 to the last closed year)."""

    code = "CC102"


class UnknownModalityError(CityCubeError):
    """A modality code that the catalogue does not declare."""

    code = "CC103"


class UnknownTileError(CityCubeError):
    """A tile id that is malformed or lies outside its city's grid."""

    code = "CC104"


class UnknownProductError(CityCubeError):
    """A source product id that no adapter of the configured source set serves."""

    code = "CC105"


class InvalidNameError(CityCubeError):
    """A name that becomes part of a path or query (a release version) is not allowed."""

    code = "CC106"


class UnknownAssetError(CityCubeError):
    """A selection of assets (``--assets`` prefixes) that names no asset of the build."""

    code = "CC107"


class InputFileError(CityCubeError):
    """A file given to a command (forecast predictions) is not what the command reads."""

    code = "CC108"


class SourceUnavailableError(CityCubeError):
    """The source does not cover the request (a year or area it never published)."""

    code = "CC200"

    def __init__(self, message: str, reason: str = "source_year_missing") -> None:
        super().__init__(message)
        self.reason = reason


class SourceReadError(CityCubeError):
    """A source file is corrupt, truncated or not what its product promises (CRS, bands)."""

    code = "CC201"

    def __init__(self, message: str, reason: str = "unreadable_source") -> None:
        super().__init__(message)
        self.reason = reason


class SourceFetchError(CityCubeError):
    """A server failed or refused while fetching a source.

    ``transient`` errors (timeouts, 429, 5xx) are worth retrying; the source assets' retry
    policy retries only those.
    """

    code = "CC202"

    def __init__(
        self,
        message: str,
        transient: bool = True,
        reason: str = "server_error",
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.reason = reason
        self.status = status
        """The HTTP status the server answered with, when one did (404 tells 'not published')."""


class OfflineRecordError(SourceFetchError):
    """Offline, a source request has nothing recorded to answer it (a STAC search never made
    online, an asset not in the mirror). Not transient: rerunning offline cannot help; run the
    same build online once, or add the file to the mirror."""

    code = "CC203"

    def __init__(self, message: str, reason: str = "not_recorded") -> None:
        super().__init__(message, transient=False, reason=reason)


class CubeWriteError(CityCubeError):
    """A cube partition could not be written; the previous version is left intact."""

    code = "CC300"

    @classmethod
    def writing(cls, path: Path, exc: Exception) -> CubeWriteError:
        """A failed write of ``path``: why, and what to change (the old version is kept).

        A full disk is told as such (``DiskFullError``), whatever library met it."""
        if no_space_left(path, exc):
            return DiskFullError.at(path, "the previous version, if any, is unchanged")
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return cls(
            f"could not write {path} ({why}); the previous version, if any, is unchanged. Make "
            f"{path.parent} a writable directory (a file, a folder in the file's place or a "
            "read-only or full disk is in the way) and run the same command again"
        )


class DiskFullError(CubeWriteError):
    """A write failed because the file system it goes to has no space left."""

    code = "CC309"

    @classmethod
    def at(cls, path: Path, kept: str) -> DiskFullError:
        """The error for a write of ``path``; ``kept`` says what stays as it was."""
        return cls(
            f"no space left on {_mount_point(Path(path))} (writing {path}); {kept}. Free space "
            "there (`citycube gc` deletes unreferenced chunks and old snapshots) or point the "
            "data root at a larger disk, and run the same command again"
        )


_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = ("No space left on device", "database or disk is full", "Disk quota exceeded")
LOW_SPACE_BYTES = 1 << 20
"""Below this many free bytes a failed write is put down to a full disk: GDAL and OGR report
one as 'TIFFAppendToStrip:Write error' or 'cannot rollback', without an errno."""


def no_space_left(path: Path, exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it came from) is a full disk: an ENOSPC or EDQUOT
    errno, a library's own words for it, or any failure while ``path``'s file system has less
    than ``LOW_SPACE_BYTES`` free."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _NO_SPACE_ERRNOS:
            return True
        if any(text in str(current) for text in _NO_SPACE_TEXT):
            return True
        current = current.__cause__ or current.__context__
    for folder in (Path(path), *Path(path).parents):
        try:
            stats = os.statvfs(folder)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize < LOW_SPACE_BYTES
    return False


def _mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` is (or would be) on."""
    folder = Path(os.path.abspath(path))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


class DatabaseBusyError(CityCubeError):
    """A release database is locked by another process (a DuckDB shell, a running build)."""

    code = "CC304"


class CorruptReleaseError(CityCubeError):
    """A release's database or chip store cannot be read: damaged blocks or refs, cut short, or
    not in its format. Not a lock (``DatabaseBusyError``), not a write (``CubeWriteError``)."""

    code = "CC308"


class ReleaseMovedError(CityCubeError):
    """A release database whose views read files at another place: a release built before its
    tables were held in the database, then moved or copied. Rebuilding its views fixes it."""

    code = "CC311"


class RemoteReleaseError(CityCubeError):
    """A release served over HTTP(S) cannot be opened: the server is unreachable or has no
    ``cube.duckdb`` there, or DuckDB's ``httpfs`` extension for this DuckDB is not installed."""

    code = "CC312"


class BuildBusyError(CityCubeError):
    """Another build is building the same release, or drives the same Dagster instance."""

    code = "CC305"


class NoWorkersError(CityCubeError):
    """The dask cluster a step sends its partitions to has had no worker for too long."""

    code = "CC310"


class DerivedResultsMissingError(CityCubeError):
    """Observations were asked for a year whose source period has not been derived yet."""

    code = "CC303"


class ChipsNotFoundError(CityCubeError):
    """A release holds no chips for the request (numeric modality, unbuilt or uncovered year)."""

    code = "CC301"


class CardValidationError(CityCubeError):
    """A release's dataset card (STAC Collection, Croissant, data card) is missing or invalid."""

    code = "CC307"


class ReleaseImmutableError(CityCubeError):
    """A final (frozen) release was asked to change: rebuilds go into a new version."""

    code = "CC306"


class ReleaseNotFoundError(CityCubeError):
    """A release, or its DuckDB database, is not where the data root and version point."""

    code = "CC302"


class AgentCaseError(CityCubeError):
    """An agent asked a case's tools for something outside the case (an unknown case or asset,
    a period outside −10…−1, a tile of another city, a tool of another profile)."""

    code = "CC400"


class SubmissionError(CityCubeError):
    """An agent's answer does not have the submission's form (prediction, unit, reason,
    modalities_used, modules_used)."""

    code = "CC401"


class WorkspacePathError(CityCubeError):
    """A path an agent named would leave its case's workspace."""

    code = "CC402"


class EmbeddingError(CityCubeError):
    """An embedding, task or split of the representation evaluation cannot be used as given."""

    code = "CC403"


class FoodAtlasSourceError(CityCubeError):
    """A Food Access Research Atlas table or census tract file cannot be read as its source
    serves it (missing sheet or column, bad tract id, no geometry, unknown CRS)."""

    code = "CC420"


class FoodAccessCaseError(CityCubeError):
    """A food-access case set cannot be built or read as asked (unknown city, no labelled
    tracts over the grid, a case or cell that does not exist)."""

    code = "CC421"


class FoodAccessSubmissionError(CityCubeError):
    """A food-access submission does not have its form: one known label per cell, each with
    confidence, reason and evidence cited as evidence-NNNN/asset_ID from a successful call."""

    code = "CC422"


class SchoolPlanError(CityCubeError):
    """A school-capacity plan does not have the submission's form (predicted_enrollment ≥ 0,
    an integer added_seats ≥ 0, evidence ids of this case's successful reads, a reason)."""

    code = "CC415"


class SchoolCasesError(CityCubeError):
    """A release has no school-capacity cases to serve (London not in its scope, or its
    school reference unavailable)."""

    code = "CC416"


class StationFileError(SourceReadError):
    """An Alternative Fuels Data Center station file (API JSON or archived CSV snapshot) lacks a
    column the EV charging task reads, or holds a value it cannot parse."""

    code = "CC410"


class EvSubmissionError(SubmissionError):
    """An EV charging answer does not have submit_forecast's form (range A–D, confidence,
    explanation, a reason per range, evidence ids, limitations)."""

    code = "CC411"


class ApiKeyMissingError(SourceFetchError):
    """A source that needs an API key was asked to fetch, but the environment variable that
    should hold the key is unset or empty."""

    code = "CC412"
