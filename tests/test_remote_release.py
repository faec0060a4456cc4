"""A release served over HTTP is queried in place, reading only the blocks a query needs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from benchmarks.bench_translation import write_synthetic_observations
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles
from citycube.cube.remote import open_remote_release
from citycube.errors import CorruptReleaseError, RemoteReleaseError
from pipelines.cli import main
from tests.release_fixtures import build_release

HISTORY = """
    SELECT year, modality, field, value, unit, available, reason FROM observations
    WHERE tile_id = ? AND modality = 'POP' ORDER BY year, field
"""


def _served_bytes(log: Path, name: str) -> tuple[int, int]:
    """Bytes the server sent for files whose path ends in ``name``, and how many requests.

    The server logs a request once its body is sent, which may be just after the client has it:
    wait until the log has not grown for a moment."""
    size = -1
    while log.exists() and log.stat().st_size != size:
        size = log.stat().st_size
        time.sleep(0.3)
    sent = requests = 0
    for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
        _method, path, _range, _status, size, *_ = line.split()
        if path.endswith(name):
            sent += int(size)
            requests += 1
    return sent, requests


def _synthetic_release(data_root: Path) -> Release:
    """A published release of 201,144 synthetic observations (three cities, six years, every
    modality): 8 MB of database, enough blocks for a one-tile query to skip most of them."""
    catalogue = load_catalogue()
    release = Release(data_root, "v1")
    write_synthetic_observations(
        release.draft_dir / "observations",
        catalogue,
        years=(2016, 2017, 2018, 2019, 2020, 2021),
        cities=("Amsterdam", "Boston", "London"),
    )
    write_tiles(release)
    meta = release_metadata(release, source_set="synthetic", synthetic=True)
    build_duckdb(release, catalogue, meta)
    return release


def _blocks_holding(con: duckdb.DuckDBPyConnection, tile: str, columns: tuple[str, ...]) -> int:
    """How many storage blocks hold ``columns`` of the row groups where the tile's POP rows are.

    DuckDB packs column segments into 256 KiB blocks at checkpoint, and how it packs them can
    differ from one build of the same rows to the next: this counts them in the file at hand."""
    groups = con.execute(
        "SELECT row_group_id, sum(count) FROM pragma_storage_info('observations') "
        "WHERE column_name = 'tile_id' GROUP BY ALL ORDER BY 1"
    ).fetchall()
    rowids = con.execute(
        "SELECT rowid FROM observations WHERE tile_id = ? AND modality = 'POP'", [tile]
    ).fetchall()
    wanted, first = set(), 0
    for group, rows in groups:
        if any(first <= rowid < first + rows for (rowid,) in rowids):
            wanted.add(group)
        first += rows
    marks = ", ".join("?" for _ in columns)
    return con.execute(
        "SELECT count(DISTINCT block_id) FROM pragma_storage_info('observations') "
        f"WHERE block_id >= 0 AND column_name IN ({marks}) "
        f"AND row_group_id IN ({', '.join('?' for _ in wanted)})",
        [*columns, *sorted(wanted)],
    ).fetchone()[0]


def test_one_tile_from_a_served_release_reads_a_small_part_of_its_database(
    file_server: tuple[str, Path, Path],
) -> None:
    base, served, log = file_server
    release = _synthetic_release(served)
    size = release.duckdb_file.stat().st_size
    columns = ("tile_id", "modality", "year", "field", "value", "unit", "available", "reason")
    with duckdb.connect(str(release.duckdb_file), read_only=True) as local:
        tile = local.execute("SELECT min(tile_id) FROM tiles WHERE scale = '2km'").fetchone()[0]
        expected = local.execute(HISTORY, [tile]).fetchall()
        tiles = local.execute("SELECT count(*) FROM tiles").fetchone()[0]
        blocks = _blocks_holding(local, tile, columns)
        total_blocks = local.execute("SELECT total_blocks FROM pragma_database_size()").fetchone()[
            0
        ]
    assert len({row[0] for row in expected}) == 6
    assert 0 < blocks < total_blocks / 2, "the tile's rows are a small part of the database"

    con = open_remote_release(f"{base}/releases/v1/")
    try:
        opened, _ = _served_bytes(log, "/cube.duckdb")
        assert con.execute(HISTORY, [tile]).fetchall() == expected
        read, requests = _served_bytes(log, "/cube.duckdb")
        assert con.execute("SELECT count(*) FROM tiles").fetchone()[0] == tiles
    finally:
        con.close()
    assert requests > 1, "DuckDB read the database with Range requests"
    # Opening reads the header and catalogue (about 1.6 MB, whatever the size); the query
    # then reads at most the blocks of the columns and row groups it touches (fewer when
    # their min/max statistics skip a segment).
    block = 256 * 1024
    assert 0 < read - opened <= blocks * block, (
        f"the query read {read - opened} bytes, more than the {blocks} blocks holding its rows"
    )
    assert read <= size / 3, f"read {read} of {size} bytes in {requests} requests"
    assert _served_bytes(log, ".parquet") == (0, 0), "the database alone answers"


def test_the_cli_queries_a_served_release_and_says_why_it_cannot(
    file_server: tuple[str, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, served, _log = file_server
    build_release(served, "v1", modalities=("NTL",))
    url = f"{base}/releases/v1"
    sql = "SELECT modality, count(*) AS n FROM observations GROUP BY ALL"
    assert main(["query", "--url", url, sql]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "modality\tn" and out[1].startswith("NTL\t")
    assert main(["--data", str(served), "--release", "v1", "query", sql]) == 0
    assert capsys.readouterr().out.splitlines() == out, "the same rows as the local release"

    assert main(["query", "--url", f"{base}/releases/nope/", sql]) == 2
    assert "[CC312] the server answers HTTP 404" in capsys.readouterr().err
    (served / "releases" / "junk").mkdir()
    (served / "releases" / "junk" / "cube.duckdb").write_bytes(b"not a database" * 1000)
    assert main(["query", "--url", f"{base}/releases/junk/", sql]) == 2
    assert "[CC308]" in capsys.readouterr().err


def test_an_unreachable_server_or_a_bad_url_is_a_clear_error() -> None:
    with pytest.raises(RemoteReleaseError, match=r"\[CC312\] cannot reach"):
        open_remote_release("http://127.0.0.1:9/releases/v1/")
    with pytest.raises(RemoteReleaseError, match="not an http"):
        open_remote_release("file:///tmp/releases/v1")


def test_a_served_file_that_is_no_database_is_told_apart(
    file_server: tuple[str, Path, Path],
) -> None:
    base, served, _log = file_server
    (served / "cube.duckdb").write_bytes(b"\0" * 8192 + b"not a database")
    with pytest.raises(CorruptReleaseError, match="not with a DuckDB database"):
        open_remote_release(f"{base}/cube.duckdb")


def test_an_extension_built_for_another_duckdb_is_named_not_loaded(tmp_path: Path) -> None:
    """A wheel of the extension for another DuckDB version: the CLI says which to install."""
    package = tmp_path / "duckdb_extension_httpfs"
    (package / "extensions" / "v1.4.0").mkdir(parents=True)
    (package / "extensions" / "v1.4.0" / "httpfs.duckdb_extension").write_bytes(b"\0" * 64)
    (package / "__init__.py").write_text("", encoding="utf-8")
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "query", "--url", "http://127.0.0.1:9/v1/", "1"],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"[CC312] no httpfs extension for DuckDB {duckdb.__version__}" in done.stderr
    assert "v1.4.0" in done.stderr and "Traceback" not in done.stderr
