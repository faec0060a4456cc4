"""Command-line behaviour a user meets first: help, and clear errors for bad selections."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("build", "render", "report", "views", "summary", "dagster-home"):
        assert command in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cities", "Atlantis"], "unknown city 'Atlantis'"),
        (["--cities", "Boston", "--years", "1999"], "outside the calendar 2000–2025"),
        (["--cities", "Boston", "--years", "soon"], "cannot read years"),
    ],
)
def test_bad_selection_fails_clearly_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["--data", str(tmp_path / "data"), "build", *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # nothing was written


def test_summary_without_a_release_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data", str(tmp_path), "summary"]) == 2
    assert "make run" in capsys.readouterr().err


def test_views_keeps_recorded_release_metadata(tmp_path: Path) -> None:
    """Rebuilding the views after a move keeps what the build recorded."""
    import json

    import duckdb

    from citycube.catalogue import load_catalogue
    from citycube.cube import Release, build_duckdb, release_metadata, write_tiles

    release = Release(tmp_path, "moved")
    write_tiles(release)
    meta = release_metadata(release, source_set="sample", synthetic=True, extra={"seed": 7})
    release.metadata_file.write_text(json.dumps(meta), encoding="utf-8")
    build_duckdb(release, load_catalogue(), meta)
    assert main(["--data", str(tmp_path), "--release", "moved", "views"]) == 0
    con = duckdb.connect(str(release.duckdb_file), read_only=True)
    recorded = dict(con.execute("SELECT key, value FROM release").fetchall())
    assert recorded["seed"] == "7" and recorded["source_set"] == '"sample"'


def _open_instance(home: str, results: object) -> None:
    import os

    os.environ["DAGSTER_HOME"] = home
    try:
        import dagster as dg

        with dg.DagsterInstance.get() as instance:
            instance.get_runs(limit=1)
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as exc:  # reported to the parent, which asserts on it
        results.put(f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]


def test_processes_opening_a_prepared_dagster_home_at_once_never_break_it(tmp_path: Path) -> None:
    """A fresh SQLite instance created by two processes at once can break for good; the
    build creates it once, before anything runs in parallel."""
    import multiprocessing

    from pipelines.build import ensure_dagster_home

    spawn = multiprocessing.get_context("spawn")
    for trial in range(2):
        home = ensure_dagster_home(tmp_path / f"home{trial}")
        results = spawn.Queue()
        workers = [
            spawn.Process(target=_open_instance, args=(str(home), results)) for _ in range(3)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
        assert [results.get(timeout=5) for _ in workers] == ["ok"] * 3
        assert "QueuedRunCoordinator" in (home / "dagster.yaml").read_text(encoding="utf-8")


def test_a_build_keeps_the_instance_databases_open_and_events_in_one_log(tmp_path: Path) -> None:
    """One SQLite event log for every run, held open by the build so that the runs' writes do
    not each fold the write-ahead log back into the database."""
    import sqlite3

    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from pipelines.build import ensure_dagster_home, sqlite_kept_open

    home = ensure_dagster_home(tmp_path / "home")
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert type(instance.event_log_storage).__name__ == "ConsolidatedSqliteEventLogStorage"
    event_log = home / "history" / "event_log.db"
    with sqlite_kept_open(home) as held:
        assert held == 2  # the event log and the run storage
        writer = sqlite3.connect(event_log)
        writer.execute("CREATE TABLE probe (x)")
        writer.commit()
        writer.close()  # not the last connection: the log stays, nothing is folded back
        assert (home / "history" / "event_log.db-wal").exists()
    writer = sqlite3.connect(event_log)
    writer.execute("INSERT INTO probe VALUES (1)")
    writer.commit()
    writer.close()  # the last one: SQLite folds the log back and removes it
    assert not (home / "history" / "event_log.db-wal").exists()
