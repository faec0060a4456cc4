"""A release's manifest: written over every file, and verify catches any change to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from citycube.cube.manifest import manifest_path, read_manifest, verify_release, write_manifest
from citycube.cube.release import Release
from citycube.errors import ReleaseNotFoundError
from pipelines.cli import main

FILES = {
    "observations/city=Boston/year=2020/OPT.parquet": b"PAR1 observations PAR1",
    "chip_index/city=Boston/year=2020/OPT.parquet": b"PAR1 index PAR1",
    "chips/OPT/Boston/2020.zarr/zarr.json": b'{"zarr_format": 3}',
    "chips/OPT/Boston/2020.zarr/data/c/0/0/0": bytes(range(256)) * 8,
    "quicklooks/OPT/Boston/2020.png": b"\x89PNG quick-look",
    "reports/availability_by_city.csv": b"city,available\nBoston,18\n",
    "tiles.parquet": b"PAR1 tiles PAR1",
    "release.json": b'{"version": "v1"}',
}


@pytest.fixture
def release(tmp_path: Path) -> Release:
    release = Release(tmp_path, "v1")
    for name, data in FILES.items():
        path = release.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (release.root / ".staging").mkdir()
    (release.root / ".staging" / "cube.duckdb").write_bytes(b"staged")
    write_manifest(release, {"catalogue_digest": "abc", "sources": {"odiac": {"version": "x"}}})
    return release


def test_the_manifest_lists_every_file_with_its_hash(release: Release) -> None:
    manifest = read_manifest(release)
    assert set(manifest["files"]) == set(FILES)  # not the staging area
    assert manifest["database"] is None  # no database yet
    chunk = manifest["files"]["chips/OPT/Boston/2020.zarr/data/c/0/0/0"]
    assert chunk["bytes"] == 2048 and len(chunk["sha256"]) == 64
    assert manifest["catalogue_digest"] == "abc" and manifest["sources"]["odiac"]["version"] == "x"
    assert manifest["totals"] == {"files": len(FILES), "bytes": sum(map(len, FILES.values()))}
    assert verify_release(release).ok


def test_one_flipped_byte_anywhere_is_caught(release: Release) -> None:
    for name in FILES:
        path = release.root / name
        original = path.read_bytes()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x01
        path.write_bytes(bytes(flipped))
        result = verify_release(release)
        assert result.changed == [name] and not result.ok
        path.write_bytes(original)
    assert verify_release(release).ok


def test_missing_and_unlisted_files_are_reported(release: Release) -> None:
    (release.root / "tiles.parquet").unlink()
    (release.root / "observations/city=Boston/year=2021").mkdir()
    (release.root / "observations/city=Boston/year=2021/OPT.parquet").write_bytes(b"new")
    (release.root / "cube.duckdb").write_bytes(b"a database written since")  # covered too
    (release.root / ".observations.tmp-123").write_bytes(b"temporary")  # not covered
    result = verify_release(release)
    assert result.missing == ["tiles.parquet"]
    assert result.unexpected == [
        "cube.duckdb",
        "observations/city=Boston/year=2021/OPT.parquet",
    ]
    assert result.changed == []


def test_the_verify_command_exits_by_the_result(
    release: Release, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data", str(release.data_root), "--release", "v1", "verify"]
    assert main(args) == 0
    assert "release v1 is intact" in capsys.readouterr().out
    chunk = release.root / "chips/OPT/Boston/2020.zarr/data/c/0/0/0"
    chunk.write_bytes(b"\xff" + chunk.read_bytes()[1:])
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "1 changed:" in captured.out and "data/c/0/0/0" in captured.out
    assert "differs from its manifest" in captured.err
    manifest_path(release).unlink()
    assert main(args) == 2
    assert "has no manifest" in capsys.readouterr().err


def test_a_damaged_manifest_is_an_error_not_a_pass(release: Release) -> None:
    manifest_path(release).write_text(json.dumps({"files": "none"}))
    with pytest.raises(ReleaseNotFoundError, match="no file list"):
        verify_release(release)


def test_a_rebuilt_manifest_hashes_only_the_files_written_since(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    rewritten = release.root / "observations/city=Boston/year=2020/OPT.parquet"
    rewritten.write_bytes(b"PAR1 rebuilt observations PAR1")
    restored = release.root / "quicklooks/OPT/Boston/2020.png"
    before = restored.stat()
    restored.write_bytes(b"\x89PNG quick-lool")  # same size, one byte off
    os.utime(restored, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back
    hashed = _count_hashes(monkeypatch, release)
    write_manifest(release, {})
    assert sorted(hashed) == sorted(
        ["observations/city=Boston/year=2020/OPT.parquet", "quicklooks/OPT/Boston/2020.png"]
    )
    monkeypatch.undo()
    assert verify_release(release).ok  # every carried-over hash is still the file's


def test_chunks_hashed_by_their_writer_are_not_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chip store's chunks written from bytes in hand come with their SHA-256; the manifest
    takes it while a chunk is untouched, and hashes what zarr wrote itself or what changed."""
    import hashlib

    import numpy as np

    from citycube.cube.chips_zarr import ChipStoreWriter
    from citycube.processing.chips import blocks
    from tests.test_chips import small_grid

    release = Release(tmp_path / "data", "chips")
    grid = small_grid(resolution=100.0, width=150, height=250)
    values = np.random.default_rng(3).integers(1, 200, (1, *grid.shape)).astype(np.uint8)
    valid = np.ones(grid.shape, bool)
    by_blocks, by_rows = release.root / "chips/a.zarr", release.root / "chips/b.zarr"
    with ChipStoreWriter(by_blocks, grid, ["b0"], np.uint8, 0, {}) as writer:
        for r0, r1, c0, c1 in blocks(grid):
            writer.write_block(r0, c0, values[:, r0:r1, c0:c1], valid[r0:r1, c0:c1])
    with ChipStoreWriter(by_rows, grid, ["b0"], np.uint8, 0, {}) as writer:
        for r0, r1, c0, c1 in blocks(grid):
            writer.write_block(r0, c0, values[:, r0:r1, c0:c1], valid[r0:r1, c0:c1])
        writer.write_rows(0, values[:, :37] // 2, valid[:37])  # cuts chunks: zarr rewrites
    changed = by_blocks / "data/c/0/1/1"
    changed.write_bytes(changed.read_bytes()[:-1] + b"\x00")  # after the writer hashed it

    hashed = _count_hashes(monkeypatch, release)
    write_manifest(release, {})
    files = read_manifest(release)["files"]
    chunks = [name for name in files if "/c/" in name]
    assert [n for n in chunks if n.startswith("chips/a.zarr/") and n in hashed] == [
        "chips/a.zarr/data/c/0/1/1"
    ]
    assert all(n in hashed for n in chunks if n.startswith("chips/b.zarr/data/"))
    assert not any(name.endswith(".json") and "/." in name for name in files)
    for name, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((release.root / name).read_bytes()).hexdigest()


def _count_hashes(monkeypatch: pytest.MonkeyPatch, release: Release) -> list[str]:
    """The release-relative names of the files the manifest hashes from now on, as it does."""
    import citycube.cube.manifest as manifest_module

    hashed: list[str] = []
    real = manifest_module.file_sha256

    def counting(path: str | Path) -> str:
        hashed.append(Path(path).relative_to(release.root).as_posix())
        return real(path)

    monkeypatch.setattr(manifest_module, "file_sha256", counting)
    return hashed


def test_a_manifest_written_before_the_database_was_listed_says_so(release: Release) -> None:
    manifest = read_manifest(release)
    manifest["format"] = 3
    del manifest["database"]
    manifest_path(release).write_text(json.dumps(manifest))
    (release.root / "cube.duckdb").write_bytes(b"a database of an older build")
    result = verify_release(release)
    assert result.ok and result.unexpected == []
    assert result.notes == [
        "this manifest (format 3) does not cover cube.duckdb: a rebuild writes one that does"
    ]


def test_a_large_table_is_digested_as_manifests_of_earlier_releases_recorded_it(
    tmp_path: Path,
) -> None:
    """A table too large to hash row by row in Python is digested inside DuckDB: the sums of
    each row's MD5 halves (``md5_number_upper``/``md5_number_lower`` of its text), so that a
    release verified now matches the manifest an earlier build recorded; and one changed
    row changes the digest."""
    import hashlib

    import duckdb

    from citycube.cube.manifest import LARGE_TABLE_ROWS, database_definitions

    release = Release(tmp_path, "v1")
    release.root.mkdir(parents=True)
    rows = LARGE_TABLE_ROWS + 5
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute(
            "CREATE TABLE observations AS SELECT 'tile ' || i::VARCHAR AS tile_id, "
            f"i % 7 = 0 AS available, i * 0.5 AS value FROM range({rows}) AS t(i)"
        )
        sums = con.execute(
            "SELECT sum(md5_number_upper(r::VARCHAR))::VARCHAR, "
            "sum(md5_number_lower(r::VARCHAR))::VARCHAR FROM observations AS r"
        ).fetchone()
        columns = [c[:2] for c in con.execute("DESCRIBE observations").fetchall()]
    recorded = json.dumps([columns, rows, sums], default=str)
    table = database_definitions(release)["tables"]["observations"]
    assert table == {"rows": rows, "sha256": hashlib.sha256(recorded.encode()).hexdigest()}
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute("UPDATE observations SET value = 1.0 WHERE tile_id = 'tile 3'")
    assert database_definitions(release)["tables"]["observations"]["sha256"] != table["sha256"]
