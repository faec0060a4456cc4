"""The Dagster instance of ``DAGSTER_HOME``: its ``dagster.yaml`` and its storage.

Two storages, chosen by one setting, each with Dagster's standard ``storage:`` configuration:

- SQLite files in ``DAGSTER_HOME`` (``history/``, ``schedules/``): the default, nothing to
  install or run;
- PostgreSQL, when ``CITYCUBE_POSTGRES_URL`` is set
  (``postgresql+psycopg2://user:password@host:port/database``):
  runs, event logs and schedule state go to that database. The URL is not written into
  ``dagster.yaml``: the file names the variable, and every Dagster process reads it when it
  loads the instance.

``ensure_dagster_home`` writes ``dagster.yaml`` once (edit it freely, it is not overwritten)
and creates the storage before any process works in parallel. A ``DAGSTER_HOME`` keeps the
storage it was made with: asking it for the other one is an error that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg

POSTGRES_URL_ENV = "CITYCUBE_POSTGRES_URL"
"""Set to a PostgreSQL URL, a new ``DAGSTER_HOME`` keeps its runs and events in that database."""
DRIVER = "postgresql+psycopg2"
"""The URL scheme dagster-postgres works with: SQLAlchemy 2.1 reads a bare ``postgresql://`` as
psycopg 3, whose server-side parameters Dagster's ``NOTIFY`` statement cannot take."""
MAX_CONCURRENT_RUNS = 8
"""Runs the queued run coordinator lets execute at once; the work itself is bounded by the
dask workers, so this only bounds how many runs wait on them."""

_HEADER = """\
# Written by `citycube dagster-home` (and `citycube build`); edit freely, it is not overwritten.
telemetry:
  enabled: false
"""
SQLITE_STORAGE = """\
# Runs and event logs in SQLite files under history/, schedule state under schedules/
# (docs/operations.md, "Instance storage").
storage:
  sqlite:
    base_dir: {home}
"""
POSTGRES_STORAGE = f"""\
# Runs, event logs and schedule state in PostgreSQL, at the URL in ${POSTGRES_URL_ENV}: every
# Dagster process reads it when it loads the instance (docs/operations.md, "Instance storage").
storage:
  postgres:
    postgres_url:
      env: {POSTGRES_URL_ENV}
"""
RUN_COORDINATOR = """\
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: {max_runs}
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: {max_runs}
    # On a loaded machine the code server can take over 60 s to answer a launch request; the
    # queue then puts the run back and retries it instead of failing the build.
    max_user_code_failure_retries: 3
    user_code_failure_retry_delay: 5
"""


def postgres_url() -> str:
    """The PostgreSQL URL asked for, or '' for the SQLite default."""
    from citycube.errors import SpecError

    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if url and not url.startswith(f"{DRIVER}://"):
        scheme = url.split("://", 1)[0] if "://" in url else "(none)"
        raise SpecError(
            f"{POSTGRES_URL_ENV} must be a URL of the form {DRIVER}://user:password@host:port/"
            f"database (the psycopg2 driver Dagster's PostgreSQL storage uses), not scheme "
            f"{scheme!r}"
        )
    return url


def dagster_yaml(home: Path, postgres: bool) -> str:
    """The text of a new ``dagster.yaml`` for ``home`` with the chosen storage."""
    sqlite = SQLITE_STORAGE.format(home=json.dumps(str(home)))
    storage = POSTGRES_STORAGE if postgres else sqlite
    return _HEADER + storage + RUN_COORDINATOR.format(max_runs=MAX_CONCURRENT_RUNS)


def configured_storage(config: Path) -> str:
    """Which storage an existing ``dagster.yaml`` configures.

    'sqlite' (Dagster's default too), 'postgres' (from ``CITYCUBE_POSTGRES_URL``),
    'postgres-own' (PostgreSQL configured in the file itself), or 'retired' (the event log
    class of earlier CityCube versions, which no longer exists).
    """
    import yaml

    from citycube.errors import SpecError

    try:
        settings = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{config} is not valid YAML: {exc}") from None
    if not isinstance(settings, dict):
        raise SpecError(f"{config} is not a mapping of Dagster instance settings")
    storage = settings.get("storage") or {}
    modules = [
        str((settings.get(key) or {}).get("module", ""))
        for key in ("run_storage", "event_log_storage", "schedule_storage")
    ]
    if "pipelines.event_storage" in modules:
        return "retired"
    if isinstance(storage, dict) and "postgres" in storage:
        url = (storage["postgres"] or {}).get("postgres_url")
        from_env = isinstance(url, dict) and url.get("env") == POSTGRES_URL_ENV
        return "postgres" if from_env else "postgres-own"
    if any(module.startswith("dagster_postgres") for module in modules):
        return "postgres-own"
    return "sqlite"


def _check_storage(home: Path, config: Path, wanted_postgres: bool) -> None:
    """Refuse a ``DAGSTER_HOME`` whose ``dagster.yaml`` configures the other storage."""
    from citycube.errors import SpecError

    found = configured_storage(config)
    fresh = "use a new, empty DAGSTER_HOME"
    if found == "retired":
        raise SpecError(
            f"DAGSTER_HOME {home} was made by an earlier CityCube whose SQLite event log "
            "(pipelines.event_storage) no longer exists. It holds only the run history: move "
            f"it aside or delete it (e.g. `rm -r {home}`) and run the command again; the data "
            "root and its releases are not affected"
        )
    if wanted_postgres and found == "sqlite":
        raise SpecError(
            f"{POSTGRES_URL_ENV} is set, but DAGSTER_HOME {home} keeps its runs and events in "
            f"SQLite ({config}). A DAGSTER_HOME keeps the storage it was made with: to use "
            f"PostgreSQL, {fresh} (e.g. DAGSTER_HOME={home}-pg); to go on with SQLite here, "
            f"unset {POSTGRES_URL_ENV}. Nothing is copied between the two"
        )
    if wanted_postgres and found == "postgres-own":
        raise SpecError(
            f"{POSTGRES_URL_ENV} is set, but {config} configures its PostgreSQL storage itself; "
            f"unset {POSTGRES_URL_ENV} to use that, or {fresh}"
        )
    if not wanted_postgres and found == "postgres":
        raise SpecError(
            f"DAGSTER_HOME {home} keeps its runs and events in PostgreSQL at the URL in "
            f"{POSTGRES_URL_ENV}, which is not set: set it to that database's URL, or {fresh} "
            "for SQLite (e.g. DAGSTER_HOME=.dagster_home_sqlite)"
        )


@contextlib.contextmanager
def open_instance(home: Path) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance of ``home``, as every Dagster process loads it
    (``DagsterInstance.get()`` with ``DAGSTER_HOME`` pointing at it), closed on exit."""
    import dagster as dg

    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home.resolve())
    try:
        instance = dg.DagsterInstance.get()
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
    with instance:
        yield instance


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    with contextlib.suppress(Exception):
        return make_url(url).render_as_string(hide_password=True)
    return "(an unreadable URL)"


def ensure_dagster_home(home: Path) -> Path:
    """Create DAGSTER_HOME, its ``dagster.yaml`` and its storage once, before any process works
    in parallel; the resolved path.

    Two processes creating a fresh instance's tables at the same moment can both run its schema
    migrations and break it for good, so the storage is created here, by one process, and
    everything started later only opens it. The storage is SQLite unless
    ``CITYCUBE_POSTGRES_URL`` is set (module docstring).
    """
    from citycube.errors import SpecError

    url = postgres_url()
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if config.exists():
        _check_storage(home, config, wanted_postgres=bool(url))
    else:
        config.write_text(dagster_yaml(home, postgres=bool(url)), encoding="utf-8")
    try:
        with open_instance(home):  # creates the storage (tables, schema migrations)
            pass
    except ImportError as exc:
        raise SpecError(
            f"PostgreSQL storage needs dagster-postgres, which is not installed ({exc}); "
            "run `make install`"
        ) from None
    except Exception as exc:
        if not url:
            raise
        cause = exc.__cause__ or exc  # dagster-postgres wraps the driver's error after retries
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        raise SpecError(
            f"cannot open the Dagster instance's storage in PostgreSQL at {_redacted(url)} "
            f"({POSTGRES_URL_ENV}): {reason}. Check that the server is running, that the "
            "database exists and that the URL's user may create tables in it"
        ) from None
    return home


@contextlib.contextmanager
def sqlite_kept_open(home: Path) -> Iterator[int]:
    """Hold one idle connection to each SQLite database of the instance while a build runs.

    Dagster's SQLite storages open and close a connection for every read and write. When the
    connection closing is a database's last one, SQLite folds the write-ahead log back into the
    database and deletes it, a few fsyncs each time. While another connection stays open no
    close is the last, and the log is folded back every 1000 pages as usual. Yields how many
    are held (none for PostgreSQL storage).
    """
    import sqlite3

    connections = []
    try:
        for path in sorted((home / "history").rglob("*.db")):
            with contextlib.suppress(sqlite3.Error):
                connection = sqlite3.connect(path, timeout=30, check_same_thread=False)
                connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
                connections.append(connection)
        yield len(connections)
    finally:
        for connection in connections:
            connection.close()
