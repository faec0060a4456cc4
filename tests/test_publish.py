"""Draft → publish for the Parquet tables: readers only ever see published data.

A build writes observations and chip index partitions into the release's draft; building the
database takes a snapshot of the draft and publishing switches readers to it. These tests
rebuild a published release's partitions with other values and check what a reader sees
before, during and after: a database opened earlier keeps its values, the published files are
never rewritten, and a build killed at any point before publication changes nothing a reader
sees.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from citycube.cube import (
    KEPT_SNAPSHOTS,
    Release,
    build_duckdb,
    file_metadata,
    publish_database,
    published_snapshot,
    release_metadata,
    write_parquet_atomic,
)
from citycube.manifest import TIMESTAMPED_FILES, file_sha256, verify_release, write_manifest
from tests.release_fixtures import CAT, CITY, YEAR, build_release

REPO_ROOT = Path(__file__).resolve().parents[1]
QUERY = "SELECT sum(value) FROM observations WHERE modality = ? AND available"


def _total(con: duckdb.DuckDBPyConnection, modality: str = "NTL") -> float:
    return con.execute(QUERY, [modality]).fetchone()[0]


def _total_read_afresh(release: Release, modality: str = "NTL") -> float:
    """The total as a new reader sees it: another process (DuckDB shares one open database
    per file within a process, so a second connection here would see the first one's)."""
    script = (
        "import duckdb, sys; con = duckdb.connect(sys.argv[1], read_only=True); "
        f"print(con.execute({QUERY!r}, [sys.argv[2]]).fetchone()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(release.duckdb_file), modality],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return float(out.stdout)


def _rebuild_draft(release: Release, modality: str = "NTL", add: float = 1.0) -> None:
    """Write the partition again with every value raised by ``add``, as a rebuild would."""
    path = release.observations_file(CITY, YEAR, modality)
    table = pq.read_table(path)
    raised = pc.add(table["value"], pa.scalar(add))
    table = table.set_column(table.schema.get_field_index("value"), "value", raised)
    write_parquet_atomic(table, path, file_metadata(release))


def _stage_and_publish(release: Release) -> None:
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    publish_database(release, meta)


def _published_digests(release: Release) -> dict[str, str]:
    return {
        path.relative_to(release.root).as_posix(): file_sha256(path)
        for path in sorted(release.published_root.rglob("*.parquet"))
    }


@pytest.fixture
def release(tmp_path: Path) -> Release:
    return build_release(tmp_path, "v1")


def test_a_reader_opened_before_a_rebuild_keeps_its_values_until_it_reopens(
    release: Release,
) -> None:
    reader = duckdb.connect(str(release.duckdb_file), read_only=True)
    before = _total(reader)
    published_file = release.published_observations_file(CITY, YEAR, "NTL")
    published_bytes = published_file.read_bytes()

    _rebuild_draft(release, add=1.0)
    assert _total_read_afresh(release) == before  # written, not published: nobody sees it
    assert published_file.read_bytes() == published_bytes

    _stage_and_publish(release)
    assert _total(reader) == before  # the database opened before reads its own snapshot
    tiles = reader.execute(
        "SELECT count(value) FROM observations WHERE modality = 'NTL' AND available"
    ).fetchone()[0]
    assert _total_read_afresh(release) == pytest.approx(before + tiles)
    assert published_file.read_bytes() != published_bytes  # the folder shows the new data
    reader.close()


def test_publishing_never_rewrites_a_file_it_published(release: Release) -> None:
    published = release.published_observations_file(CITY, YEAR, "NTL")
    handle = published.open("rb")  # a reader in the middle of the old file
    old = os.fstat(handle.fileno())
    digest = file_sha256(published)
    for add in (1.0, 2.0):
        _rebuild_draft(release, add=add)
        _stage_and_publish(release)
    # the old file's bytes were never touched: its inode still holds them
    assert os.fstat(handle.fileno()).st_mtime_ns == old.st_mtime_ns
    assert hashlib.sha256(handle.read()).hexdigest() == digest
    handle.close()
    assert file_sha256(published) != digest


def test_the_manifest_and_verify_cover_the_published_tables_not_the_draft(
    release: Release,
) -> None:
    _rebuild_draft(release, add=5.0)  # a draft differs from the published release …
    assert verify_release(release).ok  # … and the release is still the one published
    names = {p.relative_to(release.root).as_posix() for p in release.root.rglob("*.parquet")}
    assert f"published/observations/city={CITY}/year={YEAR}/NTL.parquet" in names
    assert "published/tiles.parquet" in names
    _stage_and_publish(release)
    changed = set(verify_release(release).changed) - TIMESTAMPED_FILES
    assert changed == {f"published/observations/city={CITY}/year={YEAR}/NTL.parquet"}
    write_manifest(release, release_metadata(release, source_set="t", synthetic=True), CAT)
    assert verify_release(release).ok


KILLED_BUILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
    from citycube.cube import (Release, build_duckdb, file_metadata, release_metadata,
                               snapshot_tables, write_parquet_atomic)
    from tests.release_fixtures import CAT, CITY, YEAR

    release, stop = Release(Path(sys.argv[1]), "v1"), sys.argv[2]
    for n, code in enumerate(("NTL", "POP")):
        path = release.observations_file(CITY, YEAR, code)
        table = pq.read_table(path)
        value = pc.add(table["value"], pa.scalar(100.0))
        table = table.set_column(table.schema.get_field_index("value"), "value", value)
        write_parquet_atomic(table, path, file_metadata(release))
        if stop == "draft":
            os.kill(os.getpid(), signal.SIGKILL)
    if stop == "snapshot":
        snapshot_tables(release)
        os.kill(os.getpid(), signal.SIGKILL)
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    os.kill(os.getpid(), signal.SIGKILL)  # staged, checked, not yet published
    """
)


@pytest.mark.parametrize("stop", ["draft", "snapshot", "staged"])
def test_a_build_killed_before_publication_changes_nothing_a_reader_sees(
    release: Release, stop: str
) -> None:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        totals = (_total(con, "NTL"), _total(con, "POP"))
    files = _published_digests(release)
    snapshot = published_snapshot(release)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BUILD, str(release.data_root), stop],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _published_digests(release) == files
    assert published_snapshot(release) == snapshot
    assert verify_release(release).ok
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert (_total(con, "NTL"), _total(con, "POP")) == totals
    # the rerun publishes the rebuilt values in full
    _stage_and_publish(release)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert _total(con, "NTL") > totals[0]
        if stop != "draft":  # the killed draft build had rewritten NTL only
            assert _total(con, "POP") > totals[1]


def test_old_snapshots_are_pruned_and_the_published_one_kept(release: Release) -> None:
    for add in range(1, 5):
        _rebuild_draft(release, add=float(add))
        _stage_and_publish(release)
    snapshots = sorted(p.name for p in release.snapshots_dir.iterdir())
    assert len(snapshots) == KEPT_SNAPSHOTS  # the published one and the one before
    assert published_snapshot(release) == snapshots[-1]
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        (view,) = con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'observations'"
        ).fetchone()
        assert _total(con) is not None
    assert f"/.snapshots/{snapshots[-1]}/observations/" in view


def test_a_release_laid_out_before_drafts_is_adopted_on_its_next_publication(
    tmp_path: Path,
) -> None:
    release = build_release(tmp_path, "v1")
    table = pq.read_table(release.observations_file(CITY, YEAR, "NTL"))
    legacy = Release(tmp_path, "old")
    legacy.root.mkdir(parents=True)
    (legacy.root / "tiles.parquet").write_bytes(release.tiles_file.read_bytes())
    # partitions written straight into the published folder, with no draft, as before
    write_parquet_atomic(table, legacy.published_observations_file(CITY, YEAR, "NTL"))
    assert not legacy.draft_dir.exists()
    _stage_and_publish(legacy)
    assert legacy.observations_file(CITY, YEAR, "NTL").exists()
    with duckdb.connect(str(legacy.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM observations").fetchone()[0] == table.num_rows
    assert pq.read_table(legacy.published_observations_file(CITY, YEAR, "NTL")).equals(table)
