"""Chip stores as icechunk repositories: a commit per write, kill safety, parallel writers,
publication, a tag per frozen release, verification, and the chip part of ``diff``."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from citycube.cube import chips_icechunk as icechunk_chips
from citycube.cube.chips import chip_writer, open_chip_group, open_chips
from citycube.cube.chips_icechunk import (
    PUBLISHED_BRANCH,
    chip_repositories,
    commit_count,
    open_repository,
)
from citycube.cube.chips_zarr import ChipStoreWriter
from citycube.cube.diff import diff_releases, diff_text
from citycube.cube.manifest import read_manifest, verify_release
from citycube.cube.releases import freeze_release, query_help
from citycube.errors import ChipsNotFoundError, CubeWriteError
from citycube.grid.tiles import pixel_grid
from tests.release_fixtures import (
    CITY,
    DEM_HOLE_PX,
    DEM_RAISED_ROWS,
    YEAR,
    build_release,
)

GRID = pixel_grid(CITY, 100)  # 200 × 280 px, chunks of 100 × 100
BANDS = ["b0", "b1"]


def _values(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 250, (2, *GRID.shape), dtype=np.uint8)
    valid = rng.random(GRID.shape) > 0.1
    return values, valid


def _write(path: Path, seed: int, *, blank_first_block: bool = False) -> None:
    values, valid = _values(seed)
    if blank_first_block:
        values[:, :100, :100] = 0
        valid[:100, :100] = False
    with chip_writer(path, GRID, BANDS, np.uint8, 0, {"synthetic": True, "seed": seed}) as w:
        for r0 in range(0, GRID.height, 100):
            for c0 in range(0, GRID.width, 100):
                r1, c1 = min(r0 + 100, GRID.height), min(c0 + 100, GRID.width)
                w.write_block(r0, c0, values[:, r0:r1, c0:c1], valid[r0:r1, c0:c1])


def _stored(path: Path, ref: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    with open_chips(path, ref) as chips:
        return chips["data"].values, chips["valid"].values.astype(bool)


def _expected(seed: int) -> tuple[np.ndarray, np.ndarray]:
    values, valid = _values(seed)
    return np.where(valid, values, 0), valid


def test_an_icechunk_store_holds_the_zarr_store_and_each_write_is_one_commit(
    tmp_path: Path,
) -> None:
    plain, versioned = tmp_path / "plain.zarr", tmp_path / "versioned.icechunk"
    _write(plain, 1)
    _write(versioned, 1)
    assert isinstance(chip_writer(versioned, GRID, BANDS, np.uint8, 0, {}), ChipStoreWriter)
    with open_chips(plain) as a, open_chips(versioned) as b:
        assert a.attrs == b.attrs and a.rio.crs == b.rio.crs
        assert a.rio.transform() == b.rio.transform()
        np.testing.assert_array_equal(a["data"].values, b["data"].values)
        np.testing.assert_array_equal(a["valid"].values, b["valid"].values)
        np.testing.assert_array_equal(a["band"].values, b["band"].values)
    assert commit_count(versioned) == 2  # the repository's first commit, then the write
    # Chunks larger than INLINE_CHUNK_BYTES are files (the 6 data chunks of random bytes); the
    # masks and coordinates, smaller, sit inside the manifests.
    assert len(list((versioned / "chunks").iterdir())) == 6

    # A second write is one more commit; a block of nothing but fill reads as fill again
    # (its old chunk is not carried over), and the first write stays readable by snapshot.
    _write(versioned, 2, blank_first_block=True)
    assert commit_count(versioned) == 3
    values, valid = _stored(versioned)
    assert not valid[:100, :100].any() and not values[:, :100, :100].any()
    np.testing.assert_array_equal(values[:, 100:], _expected(2)[0][:, 100:])
    repo = open_repository(versioned)
    first = list(repo.ancestry(branch="main"))[1].id
    group = open_chip_group_at(versioned, first)
    np.testing.assert_array_equal(np.asarray(group["data"][:]), _expected(1)[0])

    # The loader's view (a Zarr group) of either format.
    np.testing.assert_array_equal(
        np.asarray(open_chip_group(versioned)["valid"][:]).astype(bool), valid
    )


def open_chip_group_at(path: Path, snapshot: str) -> Any:
    import zarr

    session = open_repository(path).readonly_session(snapshot_id=snapshot)
    return zarr.open_group(session.store, mode="r")


def test_a_failed_or_killed_write_leaves_the_last_commit(tmp_path: Path) -> None:
    store = tmp_path / "s.icechunk"
    _write(store, 1)
    # A write that never covers the grid is refused at commit: nothing new is visible.
    with (
        pytest.raises(CubeWriteError, match="never written"),
        chip_writer(store, GRID, BANDS, np.uint8, 0, {}) as w,
    ):
        w.write_block(0, 0, *(a[..., :100, :100] for a in _values(5)))
    # A process killed mid-write (no cleanup, no exception handler).
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from citycube.cube.chips_zarr import ChipStoreWriter
        from tests.test_icechunk_chips import _write

        original = ChipStoreWriter.write_block
        calls = []
        def write_then_die(self, *args, **kwargs):
            original(self, *args, **kwargs)
            calls.append(1)
            if len(calls) == 3:
                os._exit(9)
        ChipStoreWriter.write_block = write_then_die
        _write(Path({str(store)!r}), 7)
        """
    )
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", script], cwd=root, check=False).returncode == 9
    assert commit_count(store) == 2
    for got, want in zip(_stored(store), _expected(1), strict=True):
        np.testing.assert_array_equal(got, want)
    _write(store, 7)  # the next write commits as usual
    assert commit_count(store) == 3
    np.testing.assert_array_equal(_stored(store)[0], _expected(7)[0])


def test_a_first_write_that_fails_or_is_killed_leaves_no_store(tmp_path: Path) -> None:
    store = tmp_path / "new.icechunk"
    with (
        pytest.raises(CubeWriteError, match="never written"),
        chip_writer(store, GRID, BANDS, np.uint8, 0, {}) as w,
    ):
        w.write_block(0, 0, *(a[..., :100, :100] for a in _values(5)))
    assert not any(tmp_path.iterdir())  # neither the store nor its temp sibling
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from citycube.cube.chips_zarr import ChipStoreWriter
        from tests.test_icechunk_chips import _write

        original = ChipStoreWriter.write_block
        def write_then_die(self, *args, **kwargs):
            original(self, *args, **kwargs)
            os._exit(9)
        ChipStoreWriter.write_block = write_then_die
        _write(Path({str(store)!r}), 7)
        """
    )
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", script], cwd=root, check=False).returncode == 9
    assert not store.exists()  # a reader finds no store, not one without chips
    with pytest.raises(FileNotFoundError, match="no chip store"):
        open_chips(store)
    _write(store, 7)  # the next write removes the dead write's temp repository and commits
    assert [p.name for p in tmp_path.iterdir()] == [store.name]
    assert commit_count(store) == 2
    np.testing.assert_array_equal(_stored(store)[0], _expected(7)[0])


def _write_three_times(path: str) -> int:
    for seed in (11, 12, 13):
        _write(Path(path), seed)
    return commit_count(Path(path))


def test_parallel_writers_of_different_stores_lose_no_commit(tmp_path: Path) -> None:
    """One repository per store: workers writing different partitions never share a branch."""
    stores = [str(tmp_path / m / f"{CITY}" / "2020.icechunk") for m in ("A", "B", "C", "D")]
    context = multiprocessing.get_context("spawn")  # as dask starts its workers
    with ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        counts = list(pool.map(_write_three_times, stores))
    assert counts == [4, 4, 4, 4]
    for store in stores:
        np.testing.assert_array_equal(_stored(Path(store))[0], _expected(13)[0])


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """zarr: DEM and POP as plain Zarr; ice: the same in icechunk; raised: the DEM source
    lifted by 10 m in its first 1 km; holed: a nodata square in the DEM's first tile; frozen:
    as ice, for the test that rebuilds, publishes and freezes it."""
    root = tmp_path_factory.mktemp("data")
    build_release(root, "zarr", modalities=("DEM", "POP"))
    build_release(root, "ice", modalities=("DEM", "POP"), chip_format="icechunk")
    build_release(root, "frozen", modalities=("DEM", "POP"), chip_format="icechunk")
    build_release(root, "raised", modalities=("DEM", "POP"), dem_raise=10.0)
    build_release(root, "holed", modalities=("DEM", "POP"), dem_hole=True)
    return root


def test_publication_moves_the_published_branch_and_freeze_tags_it(data_root: Path) -> None:
    from citycube.cube.release import Release, build_duckdb, publish_database
    from citycube.processing.compute import process_partition
    from tests.release_fixtures import CAT, LocalFilesBackend, _local, _sources

    release = Release(data_root, "frozen", "icechunk")
    (store,) = chip_repositories(release)
    assert store == release.chip_store("DEM", CITY, "static")
    repo = open_repository(store)
    assert repo.lookup_branch(PUBLISHED_BRANCH) == repo.lookup_branch("main")
    assert verify_release(release).ok
    before = _stored(store)

    # A rebuild commits on main; readers keep the published chips until publication.
    items = _sources(data_root / "src" / "frozen-2", 1.0, dem_raise=10.0)
    process_partition(_local(CAT.get("DEM")), CAT, CITY, YEAR, LocalFilesBackend(items), release)
    assert commit_count(store) == 3 and commit_count(store, PUBLISHED_BRANCH) == 2
    np.testing.assert_array_equal(_stored(store)[0], before[0])
    with open_chips(store, draft=True) as draft:
        raised = draft["data"].values
    assert np.allclose(raised[0, :DEM_RAISED_ROWS] - before[0][0, :DEM_RAISED_ROWS], 10.0)
    meta = __import__("json").loads(release.metadata_file.read_text())
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    publish_database(release, meta)
    np.testing.assert_array_equal(_stored(store)[0], raised)
    from citycube.cube.manifest import write_manifest

    write_manifest(release, meta, CAT)

    # Freezing tags the published commit and lists the tag's files in the pinned manifest.
    record = freeze_release(release)
    assert record["chip_stores_tagged"] == 1
    assert open_repository(store).lookup_tag("frozen") == open_repository(store).lookup_branch(
        PUBLISHED_BRANCH
    )
    tag_files = [f for f in read_manifest(release)["files"] if "/refs/tag.frozen/" in f]
    assert tag_files, "the tag's ref file is in the manifest"
    assert verify_release(release).ok
    np.testing.assert_array_equal(_stored(store, "frozen")[0], raised)
    help_text = query_help(release)
    assert "1 icechunk chip stores (tag frozen)" in help_text and 'ref="frozen"' in help_text
    with pytest.raises(ChipsNotFoundError, match="no branch or tag 'nope'"):
        open_chips(store, "nope")

    # verify catches one flipped byte in the chunk data, a chunk file's or a manifest's (which
    # holds the chunks smaller than INLINE_CHUNK_BYTES).
    chunk = max(
        (p for p in store.rglob("*") if p.is_file() and p.parent.name in {"chunks", "manifests"}),
        key=lambda p: p.stat().st_size,
    )
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    check = verify_release(release)
    assert check.changed == [chunk.relative_to(release.root).as_posix()]


def test_diff_shows_the_chips_and_valid_fractions_a_change_touched(data_root: Path) -> None:
    # The same chips in the two formats are the same chips.
    assert diff_releases(data_root, "zarr", "ice").identical

    raised = diff_releases(data_root, "zarr", "raised")
    assert raised.changed == ((CITY, YEAR, "DEM"),) and raised.unchanged == 1  # POP untouched
    (chips,) = raised.chips
    assert (chips.store_a, chips.store_b) == ("chips/DEM/Amsterdam/static.zarr",) * 2
    grid = pixel_grid(CITY, 25)
    assert chips.pixels == grid.height * grid.width
    assert chips.changed_pixels == DEM_RAISED_ROWS * grid.width
    assert chips.validity_changed == 0
    assert chips.max_abs_change == pytest.approx(10.0, abs=1e-3)
    (field,) = raised.fields
    assert field.field == "elevation_m" and field.valid_fraction_changed == 0
    assert field.changed_values == 14 + 4  # the first row of 2 km and of 5 km tiles
    assert "chip pixels" in diff_text(raised)

    holed = diff_releases(data_root, "zarr", "holed")
    (chips,) = holed.chips
    assert chips.validity_changed == chips.changed_pixels == DEM_HOLE_PX**2
    assert chips.max_abs_change is None
    (field,) = holed.fields
    assert field.valid_fraction_changed == 1  # tile r0c0 of the 2 km grid (the 5 km grid is
    # smaller, placed inside the city's pixel grid, and does not reach its corner)
    assert field.max_valid_fraction_change == pytest.approx(DEM_HOLE_PX**2 / 80**2)
    assert "valid fractions changed" in diff_text(holed)


def test_garbage_collection_deletes_unreferenced_chunks_and_keeps_what_readers_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    from datetime import UTC, datetime, timedelta

    import icechunk

    from citycube.cube.manifest import write_manifest
    from citycube.cube.release import Release, build_duckdb, publish_database, published_snapshot
    from citycube.cube.releases import collect_garbage
    from citycube.errors import ReleaseImmutableError
    from citycube.processing.compute import process_partition
    from pipelines.cli import main
    from tests.release_fixtures import CAT, LocalFilesBackend, _local, _sources

    # The test city's chunks are small enough to be inlined; as files, as a real city's are.
    monkeypatch.setattr(icechunk_chips, "INLINE_CHUNK_BYTES", 0)
    started = datetime.now(UTC) - timedelta(seconds=2)
    release = build_release(tmp_path, "gc", modalities=("DEM",), chip_format="icechunk")
    (store,) = chip_repositories(release)
    first_write = open_repository(store).lookup_branch("main")
    # A rebuild replaces every chunk (the old ones stay for the history), a failed write
    # leaves chunks no commit references; the rebuild is published.
    items = _sources(tmp_path / "src" / "gc-2", 1.0, dem_raise=10.0)
    process_partition(_local(CAT.get("DEM")), CAT, CITY, YEAR, LocalFilesBackend(items), release)
    grid = pixel_grid(CITY, 25)
    with (
        pytest.raises(CubeWriteError, match="never written"),
        chip_writer(store, grid, ["elevation"], np.float32, np.nan, {}) as w,
    ):
        w.write_block(0, 0, np.ones((1, 100, 100), np.float32), np.ones((100, 100), bool))
    meta = json.loads(release.metadata_file.read_text())
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    publish_database(release, meta)
    write_manifest(release, meta, CAT)
    published = _stored(store)
    chunk_files = {p for p in (store / "chunks").iterdir()}
    table_snapshots = sorted(p.name for p in release.snapshots_dir.iterdir())
    assert len(table_snapshots) == 2  # the first publication's and the rebuild's

    # Nothing is older than a cutoff before the build: nothing goes.
    kept = collect_garbage(release, started)
    assert (kept.commits_expired, kept.chunks_deleted, kept.table_snapshots_deleted) == (0, 0, ())
    assert {p for p in (store / "chunks").iterdir()} == chunk_files

    report = collect_garbage(release, datetime.now(UTC) + timedelta(seconds=1))
    assert report.chip_stores == 1 and report.commits_expired >= 1
    assert report.chunks_deleted > 0 and report.bytes_deleted > 0
    left = {p for p in (store / "chunks").iterdir()}
    assert left < chunk_files and len(chunk_files) - len(left) == report.chunks_deleted
    assert report.table_snapshots_deleted == (table_snapshots[0],)
    assert [p.name for p in release.snapshots_dir.iterdir()] == [published_snapshot(release)]
    # What readers reach is whole: the published and draft heads, the database, verify.
    for ref in (None, "main"):
        values, valid = _stored(store, ref)
        np.testing.assert_array_equal(values, published[0])
        np.testing.assert_array_equal(valid, published[1])
    import duckdb

    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(value) FROM observations").fetchone()[0] > 0
    assert verify_release(release).ok
    # The replaced write is gone from the history.
    with pytest.raises(icechunk.IcechunkError):
        open_chip_group_at(store, first_write)["data"][:]

    # The command does the same and says what it removed; a final release is refused.
    assert main(["--data", str(tmp_path), "--release", "gc", "gc", "--older-than", "0"]) == 0
    assert "0 unreferenced chunks deleted" in capsys.readouterr().out
    freeze_release(release)
    with pytest.raises(ReleaseImmutableError, match="is final"):
        collect_garbage(release, datetime.now(UTC))
    assert Release(tmp_path, "gc").root.is_dir() and verify_release(release).ok


def test_two_builds_of_the_same_chips_have_the_same_content_not_the_same_files(
    tmp_path: Path,
) -> None:
    from citycube.cube.manifest import content_digests

    a, b = (  # the same release built twice, in two data roots
        build_release(tmp_path / root, "v1", modalities=("DEM",), chip_format="icechunk")
        for root in ("one", "two")
    )
    store = "chips/DEM/Amsterdam/static.icechunk"
    files_a, files_b = (set(read_manifest(r)["files"]) for r in (a, b))
    assert {f for f in files_a if f.startswith(store)} != {
        f for f in files_b if f.startswith(store)
    }  # snapshot and chunk ids are random
    digests_a, digests_b = content_digests(a), content_digests(b)
    assert digests_a[store] == digests_b[store]
    assert not any(name.startswith(f"{store}/") for name in digests_a)
    raised = build_release(
        tmp_path / "three", "v1", modalities=("DEM",), chip_format="icechunk", dem_raise=1.0
    )
    assert content_digests(raised)[store] != digests_a[store]
