"""Query a release served over HTTP(S) in place, reading only the blocks a query needs.

A published release is one folder; its ``cube.duckdb`` holds every table and view readers
query. DuckDB attaches a database file served with Range requests read-only and fetches the
blocks a query touches, so a one-tile query reads a small part of the file instead of all of
it. That needs DuckDB's ``httpfs`` extension. An extension loads only into the DuckDB version
it was built for, and installing one from DuckDB's site needs the network at run time, so the
project installs the ``duckdb-extension-httpfs`` wheel of the pinned DuckDB and loads its file
by path; DuckDB is told never to install or load an extension by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit
from urllib.request import Request, urlopen

from citycube.errors import CorruptReleaseError, RemoteReleaseError

if TYPE_CHECKING:
    import duckdb

DATABASE_NAME = "cube.duckdb"
ALIAS = "cube"
"""The name the release's database is attached under (``cube.observations`` also works)."""

_UNREACHABLE = ("Could not establish connection", "Connection refused", "Could not resolve")
_NOT_DATABASE = ("not a valid DuckDB database file", "is not a valid DuckDB database")


def httpfs_extension() -> Path:
    """The ``httpfs`` extension file built for the installed DuckDB, from its PyPI wheel."""
    import duckdb

    try:
        import duckdb_extension_httpfs
    except ImportError:
        raise RemoteReleaseError(
            "DuckDB's httpfs extension is not installed, so releases served over HTTP(S) cannot "
            f"be read: install `duckdb-extension-httpfs=={duckdb.__version__}` (`make install` "
            "does), or download the release and query its cube.duckdb locally"
        ) from None
    root = Path(duckdb_extension_httpfs.__file__).parent / "extensions"
    path = root / f"v{duckdb.__version__}" / "httpfs.duckdb_extension"
    if not path.is_file():
        built = sorted(p.name for p in root.glob("v*")) if root.is_dir() else []
        raise RemoteReleaseError(
            f"no httpfs extension for DuckDB {duckdb.__version__} under {root} (the wheel holds "
            f"{', '.join(built) or 'none'}): an extension loads only into the DuckDB it was built "
            f"for; install `duckdb-extension-httpfs=={duckdb.__version__}`"
        )
    return path


def database_url(url: str) -> str:
    """The URL of a release's ``cube.duckdb`` from the release folder's URL (or the file's)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteReleaseError(
            f"{url!r} is not an http:// or https:// URL; give the URL of a release folder, e.g. "
            "https://example.org/releases/sample-0.1.0/"
        )
    if parts.path.endswith("/" + DATABASE_NAME):
        return url
    return url.rstrip("/") + "/" + DATABASE_NAME


def _literal(text: str) -> str:
    """A SQL string literal (LOAD and ATTACH take no parameters)."""
    return "'" + text.replace("'", "''") + "'"


def open_remote_release(url: str) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the release served at ``url`` (its folder or its
    ``cube.duckdb``), with that database attached as ``cube`` and made the default, so
    ``SELECT … FROM observations`` reads it. Raises :class:`RemoteReleaseError` when the
    extension is missing or the server does not answer with the file, and
    :class:`CorruptReleaseError` when what it serves is not a DuckDB database."""
    import duckdb

    target = database_url(url)
    extension = httpfs_extension()
    con = duckdb.connect(
        ":memory:",
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
    )
    try:
        con.execute(f"LOAD {_literal(str(extension))}")
    except duckdb.Error as exc:
        con.close()
        raise RemoteReleaseError(
            f"cannot load DuckDB's httpfs extension from {extension} ({_first(exc)}): reinstall "
            f"`duckdb-extension-httpfs=={duckdb.__version__}`"
        ) from None
    try:
        con.execute(f"ATTACH {_literal(target)} AS {ALIAS} (READ_ONLY)")
        con.execute(f"USE {ALIAS}")
    except duckdb.Error as exc:
        con.close()
        raise _remote_error(target, exc) from None
    return con


def _first(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _probe(target: str) -> int | None:
    """The HTTP status a HEAD request for ``target`` gets, or None when nothing answers."""
    try:
        with urlopen(Request(target, method="HEAD"), timeout=10) as response:
            return int(response.status)
    except HTTPError as exc:
        return int(exc.code)
    except (URLError, OSError):
        return None


def _remote_error(target: str, exc: Exception) -> RemoteReleaseError | CorruptReleaseError:
    """The error for a failed ATTACH, told apart by DuckDB's message."""
    first = _first(exc)
    if any(marker in str(exc) for marker in _NOT_DATABASE):
        return CorruptReleaseError(
            f"cannot read {target} ({first}): the server answers, but not with a DuckDB database; "
            "check that the URL points at a release folder holding cube.duckdb"
        )
    answer = _probe(target)  # DuckDB says "does not exist" for a refused connection and a 404
    if answer is None or any(marker in str(exc) for marker in _UNREACHABLE):
        return RemoteReleaseError(
            f"cannot reach {target} ({first}): check the host and port and that the server runs"
        )
    if answer >= 400:
        return RemoteReleaseError(
            f"the server answers HTTP {answer} for {target}: no release database there; check "
            "the URL (a release folder, e.g. …/releases/<version>/)"
        )
    return RemoteReleaseError(
        f"cannot open {target} ({first}): the server must serve the release's cube.duckdb with "
        "HTTP Range requests; check the URL (a release folder, e.g. …/releases/<version>/)"
    )
