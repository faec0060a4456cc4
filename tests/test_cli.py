"""Command-line behaviour a user meets first: help, and clear errors for bad selections."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from citycube.cube.release import Release
from citycube.errors import InvalidNameError
from pipelines.build import BuildReport, BuildRequest, StopFlags, _conclude, root_cause
from pipelines.cli import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("build", "render", "report", "views", "summary", "verify", "dagster-home"):
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

    from citycube.catalogue.modalities import load_catalogue
    from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles

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

    from pipelines.instance import ensure_dagster_home

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


def test_a_build_keeps_the_instance_databases_open(tmp_path: Path) -> None:
    """Dagster's SQLite storage, whose databases the build holds open so that the runs' writes
    do not each fold the write-ahead log back into the database."""
    import sqlite3

    from pipelines.instance import ensure_dagster_home, open_instance, sqlite_kept_open

    home = ensure_dagster_home(tmp_path / "home")
    with open_instance(home) as instance:
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
    index = home / "history" / "runs" / "index.db"  # every run's asset events are indexed here
    with sqlite_kept_open(home) as held:
        assert held == 2  # the run storage and the event index
        writer = sqlite3.connect(index)
        writer.execute("CREATE TABLE probe (x)")
        writer.commit()
        writer.close()  # not the last connection: the log stays, nothing is folded back
        assert index.with_name("index.db-wal").exists()
    writer = sqlite3.connect(index)
    writer.execute("INSERT INTO probe VALUES (1)")
    writer.commit()
    writer.close()  # the last one: SQLite folds the log back and removes it
    assert not index.with_name("index.db-wal").exists()


# --------------------------------------------------------------------------------------------
# Hostile and broken input: refused with a clear error before anything is written


HOSTILE_RELEASES = [
    "../../escape",
    "/tmp/abs",
    "a/b",
    "rel*",
    "x'; COPY (SELECT 1) TO '/tmp/p'; --",
]
HOSTILE_RELEASES += ["", ".hidden", "a..b", "r" * 65, "sample 0.1", "a\nb"]


@pytest.mark.parametrize("release", HOSTILE_RELEASES)
def test_hostile_release_names_are_refused_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    data = tmp_path / "data"
    with pytest.raises(SystemExit) as exit_info:
        main(["--data", str(data), "--release", release, "build", "--cities", "Boston"])
    assert exit_info.value.code == 2
    assert "release version" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was written
    with pytest.raises(InvalidNameError):
        Release(data, release)  # the core refuses it too, whoever calls


def test_a_hostile_release_name_from_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CITYCUBE_RELEASE", "../../../etc")
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path / "data"), "summary"])
    assert "release version '../../../etc' is not allowed" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_safe_release_names_are_accepted(tmp_path: Path) -> None:
    for version in ("sample-0.1.0", "v2", "2026.12_rc1"):
        assert Release(tmp_path, version).root == tmp_path / "releases" / version


def test_an_empty_workers_setting_leaves_help_working_and_fails_the_build_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKERS", "")
    with pytest.raises(SystemExit) as help_exit:
        main(["build", "--help"])
    assert help_exit.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as build_exit:
        main(["--data", str(tmp_path / "data"), "build"])
    assert build_exit.value.code == 2
    assert "--workers (WORKERS) must be a whole number of at least 1, got ''" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path / "data"), "build", "--workers", "0"])
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [("--cities", "--cities (CITIES) is empty"), ("--years", "--years (YEARS) is empty")],
)
def test_an_empty_selection_is_an_error_not_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, message: str
) -> None:
    assert main(["--data", str(tmp_path / "data"), "build", option, ""]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_an_empty_data_root_is_refused_instead_of_meaning_the_current_folder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CITYCUBE_DATA", "")
    with pytest.raises(SystemExit) as exit_info:
        main(["build", "--cities", "Boston"])
    assert exit_info.value.code == 2
    assert "the data root (--data / CITYCUBE_DATA) is empty" in capsys.readouterr().err


def test_a_data_root_or_dagster_home_that_is_not_a_writable_directory_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    assert main(["--data", str(a_file), "build", "--cities", "Boston", "--years", "2020"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err

    monkeypatch.setenv("DAGSTER_HOME", str(a_file / "home"))
    data = tmp_path / "data"
    assert main(["--data", str(data), "build", "--cities", "Boston", "--years", "2020"]) == 2
    err = capsys.readouterr().err
    assert "DAGSTER_HOME" in err and "is not a writable directory" in err
    assert "Traceback" not in err


def test_summary_of_a_database_held_by_another_process_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import duckdb

    release = Release(tmp_path, "held")
    release.root.mkdir(parents=True)
    duckdb.connect(str(release.duckdb_file)).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_DATABASE, str(release.duckdb_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert main(["--data", str(tmp_path), "--release", "held", "summary"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert "[CC304]" in err and "close it and run the command again" in err


HOLD_DATABASE = """
import sys, time, duckdb
connection = duckdb.connect(sys.argv[1])
print("holding", flush=True)
time.sleep(60)
"""


def test_a_step_failure_shows_the_cause_not_dagsters_wrapper() -> None:
    from dagster._utils.error import SerializableErrorInfo

    library = SerializableErrorInfo("RasterioIOError: not a TIFF file\n", [], "RasterioIOError")
    ours = SerializableErrorInfo(
        "citycube.errors.SourceReadError: [CC201] cannot open x.tif as a raster\n",
        [],
        "SourceReadError",
        cause=library,
    )
    wrapper = SerializableErrorInfo(
        "dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while "
        'executing op "derived_annual":\n',
        [],
        "DagsterExecutionStepExecutionError",
        cause=ours,
    )
    assert root_cause(wrapper) == (
        "citycube.errors.SourceReadError: [CC201] cannot open x.tif as a raster"
    )
    plain = SerializableErrorInfo("Dagster wrapper\n", [], "DagsterError", cause=library)
    assert root_cause(plain) == "RasterioIOError: not a TIFF file"
    quoting = SerializableErrorInfo(
        "SourceReadError: [CC201] cannot read x.csv (C error: line 3\n); delete x.csv\n",
        [],
        "SourceReadError",
    )  # a library message with a line break inside: the fix after it is still shown
    assert (
        root_cause(quoting)
        == "SourceReadError: [CC201] cannot read x.csv (C error: line 3 ); delete x.csv"
    )


def test_a_failing_error_level_check_fails_the_build(tmp_path: Path) -> None:
    report = BuildReport(status="COMPLETED_SUCCESS", runs={"r": "success"})
    report.checks = {"unique_keys": "FAIL", "availability_summary": "WARN", "schema": "PASS"}
    request = BuildRequest(["Boston"], [2020], "sample-0.1.0", str(tmp_path), 1)
    out = io.StringIO()
    assert _conclude(request, "backfill", report, 1.0, StopFlags(), out) == 1
    text = out.getvalue()
    assert "Build FAILED" in text and "ERROR-level checks failed: unique_keys" in text

    passing = BuildReport(status="COMPLETED_SUCCESS", runs={"r": "success"})
    passing.checks = {"unique_keys": "PASS", "availability_summary": "WARN"}
    request = BuildRequest(["Boston"], [2020], "sample-0.1.0", str(tmp_path), 1, assets=["x"])
    assert _conclude(request, "backfill", passing, 1.0, StopFlags(), io.StringIO()) == 0
