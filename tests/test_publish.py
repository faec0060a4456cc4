"""Draft → publish for the Parquet tables: readers only ever see published data.

A build writes observations and chip index partitions, the tiles table and the benchmark files
into the release's draft; building the database takes a snapshot of the draft and publishing
switches readers to it, every table at once. These tests rebuild a published release's tables
with other values and check what a reader sees before, during and after: a database opened
earlier keeps its values, the published files are never rewritten, a build killed at any
point or stopped by a failing check before publication changes nothing a reader sees, and a
publication never shows new tables beside old ones.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import citycube.cube.release as cube_module
import citycube.io.atomic as atomic_module
from assets.cube import DATABASE_KEY, STAGED_DATABASE_KEY, TILES_KEY, build_cube_assets
from assets.tasks import SPLITS_KEY, build_benchmark_assets
from citycube.cube.manifest import (
    TIMESTAMPED_FILES,
    refresh_database,
    verify_release,
    write_manifest,
)
from citycube.cube.release import (
    CHIP_INDEX_SCHEMA,
    KEPT_SNAPSHOTS,
    Release,
    build_duckdb,
    build_tiles_file,
    database_snapshot,
    file_metadata,
    publish_database,
    published_snapshot,
    release_metadata,
    write_parquet_atomic,
)
from citycube.io.digest import file_sha256
from citycube.tasks.translation import BenchmarkFiles
from citycube.tasks.views import stage_views, task_views
from pipelines.resources import CubeResource
from tests.release_fixtures import CAT, CITY, YEAR, build_release, rebuild_partitions

VIEWS = task_views(CAT)
"""The benchmark tasks' views, added to every database these tests build."""

REPO_ROOT = Path(__file__).resolve().parents[1]
QUERY = "SELECT sum(value) FROM observations WHERE modality = ? AND available"


def _total(con: duckdb.DuckDBPyConnection, modality: str = "NTL") -> float:
    return con.execute(QUERY, [modality]).fetchone()[0]


def _total_read_afresh(release: Release, modality: str = "NTL") -> float:
    """The total as a new reader sees it: another process (DuckDB shares one open database
    per file within a process, so a second connection here would see the first one's)."""
    return float(_read_afresh(release, QUERY.replace("?", f"'{modality}'")))


def _read_afresh(release: Release, sql: str) -> str:
    """The one value ``sql`` gives a new reader of ``cube.duckdb`` (another process)."""
    script = (
        "import duckdb, sys; con = duckdb.connect(sys.argv[1], read_only=True); "
        "print(con.execute(sys.argv[2]).fetchone()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(release.duckdb_file), sql],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def _rebuild_draft(release: Release, modality: str = "NTL", add: float = 1.0) -> None:
    """Write the partition again with every value raised by ``add``, as a rebuild would."""
    path = release.observations_file(CITY, YEAR, modality)
    table = pq.read_table(path)
    raised = pc.add(table["value"], pa.scalar(add))
    table = table.set_column(table.schema.get_field_index("value"), "value", raised)
    write_parquet_atomic(table, path, file_metadata(release))


def _stage_and_publish(release: Release) -> None:
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file, benchmark_views=VIEWS)
    publish_database(release, meta)


def _published_digests(release: Release) -> dict[str, str]:
    return {
        path.relative_to(release.root).as_posix(): file_sha256(path)
        for path in sorted(release.published_root.rglob("*.parquet"))
    }


TILES_SQL = "SELECT sum(utm_xmin) FROM tiles"
ROUTES_SQL = "SELECT sum(pairs) FROM translation_route_counts"


def _rebuild_tiles(release: Release, shift: float) -> None:
    """Write the draft's tiles table again with every tile moved ``shift`` metres east."""
    table = pq.read_table(release.tiles_file)
    moved = pc.add(table["utm_xmin"], pa.scalar(shift))
    table = table.set_column(table.schema.get_field_index("utm_xmin"), "utm_xmin", moved)
    write_parquet_atomic(table, release.tiles_file)


def _rebuild_benchmark(release: Release, pairs: int) -> Path:
    """Write a benchmark file (the route counts) into the draft, as a benchmark asset would."""
    table = pa.table({"source": ["NTL"], "target": ["POP"], "pairs": pa.array([pairs], pa.int64())})
    path = BenchmarkFiles.draft(release).route_counts_long
    return write_parquet_atomic(table, path, file_metadata(release))


def _rebuild_chip_index(release: Release, fraction: float) -> None:
    """Write a one-row chip index partition into the draft."""
    row = {
        "tile_id": f"{CITY}_2KM_r0_c0",
        "city": CITY,
        "scale": "2km",
        "year": YEAR,
        "modality": "LC",
        "store": "chips/LC/Amsterdam/2020.zarr",
        "row_off": 0,
        "col_off": 0,
        "height": 80,
        "width": 80,
        "resolution_m": 25.0,
        "valid_fraction": fraction,
        "available": True,
        "temporal_basis": "annual",
        "source_year": YEAR,
        "classes": 3,
    }
    table = pa.Table.from_pylist([row], schema=CHIP_INDEX_SCHEMA)
    write_parquet_atomic(table, release.chip_index_file(CITY, YEAR, "LC"), file_metadata(release))


def _published_bytes(release: Release) -> dict[str, bytes]:
    """The published tiles table and benchmark folder, byte for byte."""
    root = release.published_root
    files = [release.published_tiles_file, *sorted((root / "benchmark").glob("*"))]
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in files}


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
    check = verify_release(release)
    changed = set(check.changed) - TIMESTAMPED_FILES
    new_tables = f"published/observations/city={CITY}/year={YEAR}/NTL.parquet"
    assert changed == {new_tables, "cube.duckdb"}  # and the database that reads them
    assert not [p for p in check.database if "published_observations" in p]  # same partitions …
    assert "table release differs from the manifest" in check.database  # … a new snapshot
    write_manifest(release, release_metadata(release, source_set="t", synthetic=True), CAT)
    assert verify_release(release).ok


KILLED_BUILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
    from citycube.cube.release import (Release, build_duckdb, file_metadata, release_metadata,
                               snapshot_tables, write_parquet_atomic)
    from citycube.tasks.views import task_views
    from tests.release_fixtures import CAT, CITY, YEAR

    VIEWS = task_views(CAT)
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
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file, benchmark_views=VIEWS)
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
        assert _total(con) is not None
    assert database_snapshot(release.duckdb_file) == snapshots[-1]  # the rows it holds


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
    assert legacy.published_observations_file(CITY, YEAR, "NTL").parent.parent.parent == (
        legacy.root / "observations"
    )
    assert not legacy.draft_dir.exists()
    _stage_and_publish(legacy)
    assert legacy.observations_file(CITY, YEAR, "NTL").exists()
    assert legacy.tiles_file.exists()  # the tiles table too, into the draft
    with duckdb.connect(str(legacy.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM observations").fetchone()[0] == table.num_rows
    assert pq.read_table(legacy.published_observations_file(CITY, YEAR, "NTL")).equals(table)
    assert legacy.published_root == legacy.published_dir
    assert not (legacy.root / "observations").exists()
    assert not (legacy.root / "tiles.parquet").exists()


def test_a_release_published_before_the_published_folder_is_read_then_moved_into_it(
    release: Release,
) -> None:
    """The layout before ``published/``: tables, tiles and benchmark in the release folder."""
    _rebuild_benchmark(release, pairs=7)
    benchmark = release.root / "benchmark"
    benchmark.mkdir()
    counts = BenchmarkFiles.draft(release).route_counts_long
    os.link(counts, benchmark / counts.name)
    shutil.rmtree(release.draft_dir / "benchmark")
    release.tiles_file.unlink()  # the draft held neither
    for name in ("observations", "chip_index", "tiles.parquet", "derived"):
        os.replace(release.published_dir / name, release.root / name)
    release.published_dir.rmdir()
    (release.snapshots_dir / str(published_snapshot(release)) / "tiles.parquet").unlink()
    write_manifest(release, release_metadata(release, source_set="t", synthetic=True), CAT)
    assert release.published_root == release.root
    assert verify_release(release).ok
    observations = pq.read_table(release.published_observations_file(CITY, YEAR, "NTL"))

    # `citycube views` rebuilds the database over the published snapshot, moving nothing
    meta = release_metadata(release, source_set="t", synthetic=True)
    build_duckdb(release, CAT, meta, snapshot=published_snapshot(release), benchmark_views=VIEWS)
    assert not verify_release(release).ok  # a database with other views than listed …
    assert refresh_database(release)  # … which `citycube views` lists in the manifest
    assert not release.published_dir.exists() and verify_release(release).ok
    assert float(_read_afresh(release, TILES_SQL)) > 0
    assert _read_afresh(release, ROUTES_SQL) == "7"

    # the next publication adopts the tiles and benchmark files and moves everything
    _stage_and_publish(release)
    assert release.published_root == release.published_dir
    for name in ("observations", "chip_index", "tiles.parquet", "benchmark", "derived"):
        assert not (release.root / name).exists(), name
    assert release.published_tiles_file.is_file()
    assert pq.read_table(release.published_observations_file(CITY, YEAR, "NTL")).equals(
        observations
    )
    assert _read_afresh(release, ROUTES_SQL) == "7"
    write_manifest(release, meta, CAT)
    assert verify_release(release).ok


def test_a_rebuilt_tiles_table_and_benchmark_file_stay_unseen_until_publication(
    release: Release,
) -> None:
    _rebuild_benchmark(release, pairs=10)
    _stage_and_publish(release)
    tiles_before = float(_read_afresh(release, TILES_SQL))
    assert _read_afresh(release, ROUTES_SQL) == "10"
    published = _published_bytes(release)
    assert set(published) == {"tiles.parquet", "benchmark/route_counts_long.parquet"}

    _rebuild_tiles(release, shift=1.0)
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file, benchmark_views=VIEWS)
    _rebuild_benchmark(release, pairs=11)  # a benchmark asset, after the staged database
    assert "translation_route_counts" in stage_views(release, CAT)
    # written and staged, not published: no reader sees them, the files are unchanged
    assert float(_read_afresh(release, TILES_SQL)) == tiles_before
    assert _read_afresh(release, ROUTES_SQL) == "10"
    assert _published_bytes(release) == published
    # steps inside the build read what is about to be published
    assert build_tiles_file(release).read_bytes() == release.tiles_file.read_bytes()
    with duckdb.connect(str(release.staged_duckdb_file), read_only=True) as con:
        assert con.execute(ROUTES_SQL).fetchone()[0] == 11
        tiles = con.execute("SELECT count(*) FROM tiles").fetchone()[0]
        assert con.execute(TILES_SQL).fetchone()[0] == pytest.approx(tiles_before + tiles)

    publish_database(release, meta)
    assert float(_read_afresh(release, TILES_SQL)) == pytest.approx(tiles_before + tiles)
    assert _read_afresh(release, ROUTES_SQL) == "11"
    assert release.published_tiles_file.read_bytes() == release.tiles_file.read_bytes()
    assert _published_bytes(release) != published


def _exchange_works(folder: Path) -> bool:
    first, second = folder / "first", folder / "second"
    first.mkdir()
    second.mkdir()
    try:
        return atomic_module.exchange_paths(first, second)
    finally:
        shutil.rmtree(first)
        shutil.rmtree(second)


def test_a_publication_switches_every_table_at_once(
    release: Release, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _exchange_works(release.root):
        pytest.skip("this file system cannot exchange two folders in one step")
    _rebuild_chip_index(release, fraction=0.5)
    _rebuild_benchmark(release, pairs=10)
    _stage_and_publish(release)

    def seen() -> tuple[str | None, ...]:
        """What a reader of the published folder finds now."""
        root = release.published_root
        paths = (
            release.published_observations_file(CITY, YEAR, "NTL"),
            release.published_chip_index_file(CITY, YEAR, "LC"),
            root / "tiles.parquet",
            root / "benchmark" / "route_counts_long.parquet",
        )
        return tuple(file_sha256(p) if p.is_file() else None for p in paths)

    old = seen()
    assert None not in old
    _rebuild_draft(release, add=1.0)
    _rebuild_chip_index(release, fraction=0.75)
    _rebuild_tiles(release, shift=1.0)
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file, benchmark_views=VIEWS)
    _rebuild_benchmark(release, pairs=11)
    stage_views(release, CAT)
    assert seen() == old

    observed: list[tuple[str | None, ...]] = []

    def watching(function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, noting what a reader sees after each call (each step that moves a
        file or folder)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            observed.append(seen())
            return result

        return call

    monkeypatch.setattr(atomic_module, "exchange_paths", watching(atomic_module.exchange_paths))
    monkeypatch.setattr(os, "replace", watching(os.replace))
    monkeypatch.setattr(shutil, "rmtree", watching(shutil.rmtree))
    publish_database(release, meta)
    monkeypatch.undo()
    new = seen()
    assert all(a != b for a, b in zip(old, new, strict=True))  # every table was rebuilt
    assert observed and set(observed) <= {old, new}, "a reader saw old and new tables mixed"


def _materialize_cube(release: Release, *keys: dg.AssetKey) -> dg.ExecuteInProcessResult:
    """The tiles, the staged database, the splits and the publication, as a build runs them."""
    assets = [*build_cube_assets(CAT, publish_after=[SPLITS_KEY]), *build_benchmark_assets(CAT)]
    cube = CubeResource(
        data_root=str(release.data_root), release_version=release.version, chip_format="zarr"
    )
    return dg.materialize(
        assets,
        selection=list(keys),
        resources={"cube": cube},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_a_failing_blocking_check_leaves_the_published_tiles_and_benchmark_unchanged(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    import citycube.tasks.splits
    import citycube.tasks.translation

    good = _materialize_cube(release, STAGED_DATABASE_KEY, SPLITS_KEY, DATABASE_KEY)
    assert good.success
    published = _published_bytes(release)
    assert "benchmark/splits.parquet" in published
    splits_sql = "SELECT count(*) FILTER (WHERE split = 'train') FROM splits"
    tiles_sql, train = "SELECT count(*) FROM tiles", _read_afresh(release, splits_sql)
    tiles = _read_afresh(release, tiles_sql)

    # A tiles table one tile short: its blocking check fails, nothing after it runs.
    one_city = cube_module.tiles_frame([CITY])
    monkeypatch.setattr(cube_module, "tiles_frame", lambda cities=None: one_city.iloc[1:])
    short = _materialize_cube(release, TILES_KEY, STAGED_DATABASE_KEY, SPLITS_KEY, DATABASE_KEY)
    assert not short.success
    checks = {e.check_name: e.passed for e in short.get_asset_check_evaluations()}
    assert checks == {"tile_counts_match_spec": False}
    assert pq.read_table(release.tiles_file).num_rows == len(one_city) - 1  # in the draft
    assert _published_bytes(release) == published
    assert _read_afresh(release, tiles_sql) == tiles
    monkeypatch.undo()

    # Other splits whose overlap check fails: written into the draft, never published.
    split = citycube.tasks.translation.tile_splits
    monkeypatch.setattr(
        citycube.tasks.translation, "tile_splits", lambda tiles, seed: split(tiles, seed=seed + 1)
    )
    monkeypatch.setattr(
        citycube.tasks.splits, "cross_split_overlaps", lambda tiles, splits: [("a", "b")]
    )
    overlapping = _materialize_cube(release, STAGED_DATABASE_KEY, SPLITS_KEY, DATABASE_KEY)
    assert not overlapping.success
    checks = {e.check_name: e.passed for e in overlapping.get_asset_check_evaluations()}
    assert checks["no_cross_split_overlap"] is False
    materialized = {e.asset_key for e in overlapping.get_asset_materialization_events()}
    assert DATABASE_KEY not in materialized and SPLITS_KEY in materialized
    draft_splits = BenchmarkFiles.draft(release).splits.read_bytes()
    assert draft_splits != published["benchmark/splits.parquet"]
    assert _published_bytes(release) == published
    assert (_read_afresh(release, splits_sql), _read_afresh(release, tiles_sql)) == (train, tiles)


def _tree_bytes(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_build_blocked_by_a_check_changes_nothing_the_published_release_lists(
    tmp_path: Path,
) -> None:
    """Derived results, quick-looks and chips of a build that does not publish stay apart
    from the published ones: `verify` of the untouched release passes, and says what the
    build left aside."""
    release = build_release(
        tmp_path, "v1", modalities=("POP", "NTL", "DEM"), chip_format="icechunk"
    )
    assert verify_release(release).ok
    derived = release.published_derived_file("NTL", CITY, str(YEAR))
    assert derived.is_file()
    published = {name: _tree_bytes(release.published_root / name) for name in ("derived",)}
    total = _total_read_afresh(release)

    # NTL twice as bright and a raised DEM, and one value of 1e18: the values check fails
    rebuild_partitions(release, ("NTL", "DEM"), ntl_scale=2.0, dem_raise=50.0)
    draft = release.derived_file("NTL", CITY, str(YEAR))
    assert draft.read_bytes() != derived.read_bytes()
    partition = release.observations_file(CITY, YEAR, "NTL")
    table = pq.read_table(partition)
    values = table["value"].to_pylist()
    values[values.index(max(v for v in values if v is not None))] = 1e18
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values))
    write_parquet_atomic(table, partition, file_metadata(release))
    blocked = _materialize_cube(release, TILES_KEY, STAGED_DATABASE_KEY, DATABASE_KEY)
    assert not blocked.success
    checks = {e.check_name: e.passed for e in blocked.get_asset_check_evaluations()}
    assert checks["values_in_range_no_zero_fill"] is False

    check = verify_release(release)
    assert check.ok, check.lines()
    assert any(name.endswith("refs/branch.main/ref.json") for name in check.draft)
    assert "files of chip stores' draft commits" in "\n".join(check.lines())
    for name, files in published.items():
        assert _tree_bytes(release.published_root / name) == files, name
    assert not (release.root / "derived").exists() and not (release.root / "quicklooks").exists()
    assert _total_read_afresh(release) == pytest.approx(total)

    # a build that passes its checks publishes the draft's results, by hard links
    rebuild_partitions(release, ("NTL",), ntl_scale=2.0)  # results kept, partition written
    _stage_and_publish(release)
    draft = release.derived_file("NTL", CITY, str(YEAR))
    assert os.path.samefile(release.published_derived_file("NTL", CITY, str(YEAR)), draft)
    assert _total_read_afresh(release) == pytest.approx(2 * total, rel=1e-4)


def test_derived_results_of_the_layout_before_the_draft_are_reused_then_published(
    tmp_path: Path,
) -> None:
    """Derived results a build kept in the release folder itself: the next build reuses them
    from there (no new computation), and its publication moves them."""
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    # where an earlier layout left them, digests too
    os.replace(release.draft_dir / "derived", release.root / "derived")
    shutil.rmtree(release.published_dir / "derived")
    legacy = release.root / "derived" / "NTL" / CITY / f"{YEAR}.parquet"
    inode = legacy.stat().st_ino
    rebuild_partitions(release, ("NTL",))  # the same sources: kept, not computed again
    assert release.derived_file("NTL", CITY, str(YEAR)).stat().st_ino == inode
    _stage_and_publish(release)
    assert release.published_derived_file("NTL", CITY, str(YEAR)).stat().st_ino == inode
    assert not (release.root / "derived").exists() and not (release.root / "quicklooks").exists()


def test_chip_commits_of_an_interrupted_build_are_no_damage_but_a_moved_published_ref_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.cli import main

    release = build_release(tmp_path, "v1", modalities=("DEM",), chip_format="icechunk")
    (store,) = (release.root / "chips" / "DEM" / CITY).glob("*.icechunk")
    rebuild_partitions(release, ("DEM",), dem_raise=20.0)  # committed on main, never published
    check = verify_release(release)
    assert check.ok and check.draft, check.lines()
    inside = {name.split(".icechunk/", 1)[1].split("/", 1)[0] for name in check.draft}
    assert inside <= {"chunks", "manifests", "snapshots", "transactions", "refs"}
    assert main(["--data", str(tmp_path), "--release", "v1", "verify"]) == 0
    assert "files of chip stores' draft commits" in capsys.readouterr().out

    # readers follow `published`: pointing it at the unpublished commit is damage
    published_ref = store / "refs" / "branch.published" / "ref.json"
    published_ref.write_bytes((store / "refs" / "branch.main" / "ref.json").read_bytes())
    check = verify_release(release)
    assert not check.ok
    assert check.changed == [published_ref.relative_to(release.root).as_posix()]
