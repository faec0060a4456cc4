"""The Dagster instance's storage: SQLite in DAGSTER_HOME by default, PostgreSQL with
CITYCUBE_POSTGRES_URL; a DAGSTER_HOME never switches between them silently.

The PostgreSQL build runs against a real server from the ``pgserver`` wheel (the ``dev``
extra), started in a temporary folder on 127.0.0.1 (tests/postgres_server.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from citycube.errors import SpecError
from pipelines.instance import (
    POSTGRES_URL_ENV,
    configured_storage,
    dagster_yaml,
    ensure_dagster_home,
    open_instance,
)
from tests.postgres_server import pgbouncer_program

REPO_ROOT = Path(__file__).resolve().parents[1]
CITY, YEAR, RELEASE = "Amsterdam", 2020, "pg-e2e"
ASSETS = "sources/cop_dem_glo30,derived/dem,modalities/dem,cube"
"""The smallest build with a city-year in the release's database: DEM (a static image
modality from one source product) and the cube."""


def test_the_default_storage_is_dagster_s_sqlite_storage_in_dagster_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    home = ensure_dagster_home(tmp_path / "home")
    text = (home / "dagster.yaml").read_text(encoding="utf-8")
    assert "storage:\n  sqlite:\n    base_dir:" in text and "postgres" not in text
    assert configured_storage(home / "dagster.yaml") == "sqlite"
    with open_instance(home) as instance:
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
        assert instance.get_runs() == []
    assert (home / "history" / "runs.db").exists()  # created up front, by this process
    assert ensure_dagster_home(home) == home  # again: the file is kept, nothing changes
    assert (home / "dagster.yaml").read_text(encoding="utf-8") == text


def test_postgres_storage_names_the_variable_not_the_url(tmp_path: Path) -> None:
    text = dagster_yaml(tmp_path, postgres=True)
    assert "storage:\n  postgres:\n    postgres_url:\n      env: CITYCUBE_POSTGRES_URL" in text
    assert "sqlite" not in text
    config = tmp_path / "dagster.yaml"
    config.write_text(text, encoding="utf-8")
    assert configured_storage(config) == "postgres"


def test_a_dagster_home_keeps_the_storage_it_was_made_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    sqlite_home = ensure_dagster_home(tmp_path / "sqlite")
    monkeypatch.setenv(
        POSTGRES_URL_ENV, "postgresql+psycopg2://citycube:secret@127.0.0.1:5432/citycube"
    )
    with pytest.raises(SpecError) as asked_postgres:
        ensure_dagster_home(sqlite_home)
    message = asked_postgres.value.message
    assert "keeps its runs and events in SQLite" in message
    assert "new, empty DAGSTER_HOME" in message and f"unset {POSTGRES_URL_ENV}" in message
    assert "secret" not in message
    assert configured_storage(sqlite_home / "dagster.yaml") == "sqlite"  # untouched

    postgres_home = tmp_path / "postgres"
    postgres_home.mkdir()
    (postgres_home / "dagster.yaml").write_text(
        dagster_yaml(postgres_home, postgres=True), encoding="utf-8"
    )
    monkeypatch.delenv(POSTGRES_URL_ENV)
    with pytest.raises(SpecError, match=f"PostgreSQL at the URL in {POSTGRES_URL_ENV}, which is"):
        ensure_dagster_home(postgres_home)
    assert not (postgres_home / "history").exists()  # no SQLite storage was created beside it


def test_a_dagster_home_of_the_retired_event_log_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    home = tmp_path / "old"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "event_log_storage:\n  module: pipelines.event_storage\n"
        "  class: BatchedSqliteEventLogStorage\n  config:\n    base_dir: history\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecError, match="move it aside or delete it"):
        ensure_dagster_home(home)


def test_a_postgres_url_names_the_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POSTGRES_URL_ENV, "postgresql://citycube:secret@127.0.0.1/citycube")
    with pytest.raises(SpecError, match=r"postgresql\+psycopg2://user:password@host"):
        ensure_dagster_home(tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_an_unreachable_postgres_server_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.ports import free_loopback_port

    port = free_loopback_port()  # nothing listens there
    monkeypatch.setenv(
        POSTGRES_URL_ENV, f"postgresql+psycopg2://citycube:secret@127.0.0.1:{port}/x"
    )
    with pytest.raises(SpecError) as raised:
        ensure_dagster_home(tmp_path / "home")
    message = raised.value.message
    assert f"at postgresql+psycopg2://citycube:***@127.0.0.1:{port}/x" in message
    assert "secret" not in message and "server is running" in message


@pytest.mark.e2e(builds=1)
def test_a_city_year_builds_with_runs_and_events_in_postgresql(tmp_path: Path) -> None:
    """`citycube build` of one city-year with CITYCUBE_POSTGRES_URL set, against a real server:
    the runs and their events are rows in PostgreSQL, and the release holds the city-year."""
    import psycopg2

    from citycube.cube.release import Release
    from tests.postgres_server import postgres_server

    home, data = tmp_path / "dagster_home", tmp_path / "data"
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(data), "--release", RELEASE]
    command += ["build", "--cities", CITY, "--years", str(YEAR), "--workers", "1"]
    command += ["--assets", ASSETS]
    with postgres_server() as url:
        env = {**os.environ, "DAGSTER_HOME": str(home), POSTGRES_URL_ENV: url}
        env.pop("CITYCUBE_DASK_SCHEDULER", None)
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Done in" in done.stdout
        connection = psycopg2.connect(url.replace("+psycopg2", ""))
        with connection.cursor() as cursor:
            cursor.execute("SELECT status, count(*) FROM runs GROUP BY 1")
            runs = cursor.fetchall()
            cursor.execute("SELECT dagster_event_type, count(*) FROM event_logs GROUP BY 1")
            events = dict(cursor.fetchall())
            cursor.execute("SELECT count(*) FROM bulk_actions")
            backfills = cursor.fetchone()
        connection.close()
        elapsed = time.monotonic() - started
    assert dict(runs).keys() == {"SUCCESS"} and dict(runs)["SUCCESS"] >= 2, runs
    assert backfills == (2,)  # the build's two backfills
    kinds = dg.DagsterEventType
    assert events[kinds.RUN_SUCCESS.value] == dict(runs)["SUCCESS"], events
    # the source, derived, modality and cube assets' materialisations
    assert events[kinds.ASSET_MATERIALIZATION.value] >= 4, events
    # Nothing of the instance went to SQLite: DAGSTER_HOME holds only its config and logs.
    assert not list(home.rglob("*.db")), sorted(home.rglob("*.db"))
    release = Release(data, RELEASE)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        (rows,) = con.execute(
            "SELECT count(*) FROM observations WHERE city = ? AND year = ? AND modality = 'DEM'",
            [CITY, YEAR],
        ).fetchone()
    assert rows > 0
    print(f"PostgreSQL build: {elapsed:.0f} s; runs {runs}; events {sum(events.values())}")


def _sessions(url: str) -> int:
    """Sessions the server has opened to the database so far (PostgreSQL's own count)."""
    import psycopg2

    database = url.rsplit("/", 1)[1]
    server = url.replace("+psycopg2", "")
    connection = psycopg2.connect(server)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [database])
            return int(cursor.fetchone()[0])
    finally:
        connection.close()


def _materialize_through(
    url: str, server: str, home: Path, events: int, monkeypatch: pytest.MonkeyPatch
) -> int:
    """Sessions the ``server`` opened while an instance on ``url`` (the server itself, or
    PgBouncer in front of it) recorded ``events`` materialisations (one of them the count's)."""
    monkeypatch.setenv(POSTGRES_URL_ENV, url)
    ensure_dagster_home(home)
    with open_instance(home) as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("warm_up"))
        before = _sessions(server)
        for number in range(events):
            instance.report_runless_asset_event(
                dg.AssetMaterialization("tile_counts", partition=str(number))
            )
        assert instance.fetch_materializations(dg.AssetKey("tile_counts"), limit=1).records
    return _sessions(server) - before


@pytest.mark.skipif(
    pgbouncer_program() is None, reason="pgbouncer is not installed (Debian's pgbouncer package)"
)
def test_behind_pgbouncer_the_storage_reuses_a_few_server_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dagster-postgres opens a connection for every event it writes, and the server forks a
    process for each; behind PgBouncer (docs/operations.md) the same writes share a few."""
    from tests.postgres_server import pgbouncer, postgres_server

    with postgres_server() as url:
        direct = _materialize_through(url, url, tmp_path / "direct", 50, monkeypatch)
        with pgbouncer(url) as pooled:
            through = _materialize_through(pooled, url, tmp_path / "pooled", 50, monkeypatch)
    assert direct >= 50, "one server session per event at least, without PgBouncer"
    assert through <= 5, f"{through} server sessions for 50 events through PgBouncer"
