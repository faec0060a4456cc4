"""`citycube releases`: every release under the data root with its provenance and state."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from citycube.cube.manifest import read_manifest, verify_release
from citycube.cube.release import Release
from citycube.cube.releases import list_releases
from citycube.errors import ReleaseNotFoundError
from pipelines.cli import main
from tests.release_fixtures import CAT, build_release


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One published release, one draft (partitions written, never published)."""
    root = tmp_path_factory.mktemp("data")
    build_release(root, "v1")
    draft = Release(root, "v2-draft")
    source = Release(root, "v1").observations_file("Amsterdam", 2020, "POP")
    target = draft.observations_file("Amsterdam", 2020, "POP")
    target.parent.mkdir(parents=True)
    target.write_bytes(source.read_bytes())
    (root / "releases" / ".tmp-abc").mkdir()  # a leftover, never a release
    return root


def test_the_manifest_records_sources_digest_code_versions_and_build_time(
    data_root: Path,
) -> None:
    manifest = read_manifest(Release(data_root, "v1"))
    assert manifest["sources"]["test_pop"] == {
        "source_id": "test:test_pop",
        "version": "t1",
        "synthetic": True,
        "licence": "test fixture",
        "attribution": "tests",
    }
    assert len(manifest["catalogue_digest"]) == 12 and manifest["built_at"].endswith("Z")
    assert manifest["engine_version"] and manifest["package_version"]
    assert set(manifest["code_versions"]) == {m.code for m in CAT.modalities}
    assert manifest["code_versions"]["POP"].startswith(manifest["engine_version"] + "-")


def test_releases_lists_published_and_draft_releases(data_root: Path) -> None:
    published, draft = list_releases(data_root)
    assert (published.version, published.published, published.manifest) == ("v1", True, "matches")
    assert published.cities == ("Amsterdam",) and published.years == (2020,)
    assert published.modalities == ("NTL", "POP") and published.partitions == 2
    assert published.partitions_from == "database"
    assert {(s.source_id, s.version) for s in published.sources} == {
        ("test:test_ntl", "t1"),
        ("test:test_pop", "t1"),
    }
    assert published.catalogue_digest and published.built_at and published.synthetic
    assert (draft.version, draft.published, draft.manifest) == ("v2-draft", False, "absent")
    assert (draft.partitions, draft.partitions_from) == (1, "files")


def test_a_truncated_file_shows_in_the_listing_without_hashing(tmp_path: Path) -> None:
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    path = release.observations_file("Amsterdam", 2020, "NTL")
    path.write_bytes(path.read_bytes()[:-10])
    (summary,) = list_releases(tmp_path)
    assert summary.manifest == "differs"
    changed = "changed published/observations/city=Amsterdam/year=2020/NTL.parquet"
    assert summary.manifest_problems == (changed,)


def test_the_releases_command_prints_text_json_and_how_to_open(
    data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data", str(data_root), "releases"]) == 0
    out = capsys.readouterr().out
    assert "v1  published" in out and "v2-draft  draft" in out
    assert "1 cities (Amsterdam), 1 years (2020), 2 modalities: 2 partitions" in out
    assert "manifest matches" in out and "t1: test:test_ntl, test:test_pop" in out
    assert main(["--data", str(data_root), "releases", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["version"] for r in listed] == ["v1", "v2-draft"]
    assert main(["--data", str(data_root), "releases", "--open", "v1"]) == 0
    out = capsys.readouterr().out
    database = str((data_root / "releases" / "v1" / "cube.duckdb").resolve())
    assert f".venv/bin/duckdb -readonly {database} -c" in out
    assert "POP" in out and "tiles:" in out  # the read-only summary


def test_opening_a_missing_or_unpublished_release_says_what_to_do(
    data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data", str(data_root), "releases", "--open", "v9"]) == 2
    assert "no release 'v9'" in capsys.readouterr().err
    assert main(["--data", str(data_root), "releases", "--open", "v2-draft"]) == 2
    err = capsys.readouterr().err
    assert "has no published database" in err and "build" in err
    with pytest.raises(SystemExit):
        main(["--data", str(data_root), "releases", "--open", "../v1"])
    assert "is not allowed" in capsys.readouterr().err


def test_a_frozen_release_is_final_and_every_write_path_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from assets.reports import DATASET_CARD_KEY, build_report_assets
    from citycube.cube.releases import ensure_writable, freeze_release
    from citycube.errors import ReleaseImmutableError
    from pipelines.resources import CubeResource

    release = build_release(tmp_path, "rel-1.0.0")
    ensure_writable(release)  # a draft: rebuilt in place freely
    build_release(tmp_path, "rel-1.0.0")
    data = ["--data", str(tmp_path), "--release", "rel-1.0.0"]
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    assert main([*data, "freeze"]) == 0
    assert "release rel-1.0.0 is final" in capsys.readouterr().out
    assert freeze_release(release)["manifest_sha256"]  # freezing again keeps the record
    (summary,) = list_releases(tmp_path)
    assert summary.final and summary.frozen_at and summary.manifest == "matches"
    assert main(["--data", str(tmp_path), "releases"]) == 0
    assert "rel-1.0.0  FINAL (immutable, frozen" in capsys.readouterr().out

    fix = "build a new version instead, e.g. `make run CITYCUBE_RELEASE=rel-1.0.1`"
    for command in (["build", "--cities", "Amsterdam", "--years", "2020"], ["report"], ["card"]):
        assert main([*data, *command]) == 2
        err = capsys.readouterr().err
        assert "[CC306] release rel-1.0.0 is final" in err and fix in err
    assert not (tmp_path / "dagster_home").exists()  # refused before anything was written
    with pytest.raises(ReleaseImmutableError, match=r"rel-1\.0\.1"):
        CubeResource(data_root=str(tmp_path), release_version="rel-1.0.0").release()
    (card_asset,) = [a for a in build_report_assets(CAT) if a.key == DATASET_CARD_KEY]
    result = dg.materialize(
        [card_asset],
        resources={"cube": CubeResource(data_root=str(tmp_path), release_version="rel-1.0.0")},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success  # a run launched from the UI cannot change it either
    assert main([*data, "views"]) == 0  # the database (views only) may be rebuilt after a move
    assert main([*data, "verify"]) == 0
    capsys.readouterr()

    manifest = release.root / "manifest.json"
    manifest.write_text(manifest.read_text(encoding="utf-8") + " ", encoding="utf-8")
    assert main([*data, "verify"]) == 1
    assert "not the one it was frozen with" in capsys.readouterr().err


def test_only_an_intact_published_release_can_be_frozen(tmp_path: Path) -> None:
    from citycube.cube.releases import freeze_release, next_version
    from citycube.errors import ReleaseImmutableError

    release = build_release(tmp_path, "v1", modalities=("NTL",))
    path = release.observations_file("Amsterdam", 2020, "NTL")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ReleaseImmutableError, match="differs from its manifest"):
        freeze_release(release)
    with pytest.raises(ReleaseNotFoundError, match="no published database"):
        freeze_release(Release(tmp_path, "never-built"))
    assert [next_version(v) for v in ("sample-0.1.0", "v9", "2026.12", "draft")] == [
        "sample-0.1.1",
        "v10",
        "2026.13",
        "draft-2",
    ]


def _replace_availability_view(release: Release) -> None:
    """What a hostile or careless writer does: the same view, every city-year unavailable."""
    with duckdb.connect(str(release.duckdb_file)) as con:
        (sql,) = con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'availability'"
        ).fetchone()
        select = sql.split(" AS ", 1)[1].rstrip(";")
        con.execute(
            "CREATE OR REPLACE VIEW availability AS SELECT * REPLACE (false AS available) "
            f"FROM ({select})"
        )


def test_the_database_readers_open_is_covered_by_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = build_release(tmp_path, "v1")
    manifest = read_manifest(release)
    assert manifest["files"]["cube.duckdb"]["bytes"] == release.duckdb_file.stat().st_size
    assert {"availability"} <= set(manifest["database"]["views"])
    tables = manifest["database"]["tables"]
    assert {"observations", "chip_index", "tiles"} <= set(tables)
    assert tables["published_observations"]["rows"] == 2

    _replace_availability_view(release)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert not con.execute("SELECT bool_or(available) FROM availability").fetchone()[0]
    check = verify_release(release)
    assert not check.ok and check.database == ["view availability differs from the manifest"]
    (summary,) = list_releases(tmp_path)
    assert summary.manifest == "differs"
    assert "view availability differs from the manifest" in summary.manifest_problems
    data = ["--data", str(tmp_path), "--release", "v1"]
    assert main([*data, "verify"]) == 1
    out = capsys.readouterr().out
    assert "problems in cube.duckdb:" in out and "view availability differs" in out

    assert main([*data, "views"]) == 0  # rebuilt from the published tables: listed anew
    assert "manifest updated" in capsys.readouterr().out
    assert verify_release(release).ok


@pytest.mark.parametrize("rows", [10, 100_000], ids=["small-table", "large-table"])
def test_a_changed_row_of_a_database_table_is_caught(tmp_path: Path, rows: int) -> None:
    """The rows readers query are in the database: changing one value of a table, small
    (hashed from its sorted rows) or large (hashed inside DuckDB), is caught by verify."""
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    meta = json.loads(release.metadata_file.read_text(encoding="utf-8"))
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute(f"CREATE TABLE extra AS SELECT range AS i, range / 2 AS x FROM range({rows})")
    from citycube.cube.manifest import write_manifest

    write_manifest(release, meta, CAT)
    assert verify_release(release).ok
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute("UPDATE extra SET x = x + 1e-9 WHERE i = 7")
    assert verify_release(release).database == ["table extra differs from the manifest"]
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute("UPDATE extra SET x = x - 1e-9 WHERE i = 7")
        con.execute("UPDATE observations SET value = value * 10 WHERE modality = 'NTL'")
    assert verify_release(release).database == ["table observations differs from the manifest"]


def test_a_damaged_block_of_the_database_is_caught_by_verify_and_the_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    data = bytearray(release.duckdb_file.read_bytes())
    data[len(data) // 2 + 100] ^= 0xFF  # inside a block the catalogue or a table uses
    release.duckdb_file.write_bytes(bytes(data))
    check = verify_release(release)
    assert check.changed == ["cube.duckdb"]
    assert check.database and check.database[0].startswith("cube.duckdb cannot be read (")
    (summary,) = list_releases(tmp_path)  # sizes only: the same size, yet caught
    assert summary.manifest == "differs"
    assert summary.manifest_problems[0].startswith("cube.duckdb cannot be read (")
    assert main(["--data", str(tmp_path), "--release", "v1", "verify"]) == 1
    assert "release v1 differs from its manifest" in capsys.readouterr().err


def test_a_write_ahead_log_beside_the_database_is_not_in_the_manifest(tmp_path: Path) -> None:
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    (release.root / "cube.duckdb.wal").write_bytes(b"writes a reader would replay")
    assert verify_release(release).unexpected == ["cube.duckdb.wal"]


def _benchmark_views(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """The tasks' views over a small translation pair index and splits table written here."""
    from citycube.tasks.pairs import modality_order
    from citycube.tasks.translation import BenchmarkFiles
    from citycube.tasks.views import create_task_views

    files = BenchmarkFiles(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tiles = ["Amsterdam_2KM_r0_c0", "Amsterdam_2KM_r0_c1"]
    pairs = {"city": ["Amsterdam"] * 2, "scale": ["2km"] * 2, "tile_id": tiles, "year": [2020] * 2}
    pq.write_table(pa.table({**pairs, "modality_mask": pa.array([3, 7], pa.int64())}), files.pairs)
    pq.write_table(pa.table({"tile_id": tiles, "split": ["train", "test"]}), files.splits)
    return create_task_views(con, folder, modality_order(CAT))


def _every_relation(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[object, ...]]]:
    """Every table's and view's rows, sorted."""
    names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    views = "SELECT view_name FROM duckdb_views() WHERE NOT internal"
    names += [r[0] for r in con.execute(views).fetchall()]
    return {n: con.execute(f"SELECT * FROM {n} ORDER BY ALL").fetchall() for n in names}


def test_a_moved_release_answers_every_view_and_command_from_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database holds its tables: moving the folder and querying it from another working
    directory needs no rebuild, and the manifest still matches."""
    import shutil

    from citycube.cube.manifest import write_manifest
    from citycube.cube.release import build_duckdb, release_metadata

    release = build_release(tmp_path / "old", "v1", modalities=("NTL",))
    meta = release_metadata(release, source_set="local-test", synthetic=True)
    build_duckdb(release, CAT, meta, benchmark_views=_benchmark_views)
    write_manifest(release, meta, CAT)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        before = _every_relation(con)
    assert {"observations", "tiles", "chip_index", "availability"} <= set(before)
    assert {"translation_pairs", "translation_routes", "splits"} <= set(before)
    assert before["observations"] and len(before["translation_routes"]) == 2 + 6

    (tmp_path / "new" / "releases").mkdir(parents=True)
    shutil.move(release.root, tmp_path / "new" / "releases" / "v1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    moved = Release(tmp_path / "new", "v1")
    with duckdb.connect(str(moved.duckdb_file), read_only=True) as con:
        assert _every_relation(con) == before
    assert verify_release(moved).ok
    assert main(["--data", str(tmp_path / "new"), "--release", "v1", "summary"]) == 0
    assert main(["--data", str(tmp_path / "new"), "--release", "v1", "verify"]) == 0
    out = capsys.readouterr().out
    assert "tiles: 2km=" in out and "release v1 is intact" in out


def test_a_release_whose_views_read_another_place_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database of a release built when views read the files by absolute path, then moved:
    the CLI names the cause and the command that fixes it, not a bare SQL error."""
    release = build_release(tmp_path, "v1", modalities=("NTL",))
    import shutil

    gone = tmp_path / "before" / "releases" / "v1" / "published" / "observations"
    shutil.copytree(release.published_root / "observations", gone)  # where it was built
    with duckdb.connect(str(release.duckdb_file)) as con:
        con.execute("DROP TABLE observations")
        con.execute(
            "CREATE VIEW observations AS SELECT * FROM read_parquet("
            f"'{gone}/city=*/year=*/*.parquet')"
        )
    shutil.rmtree(tmp_path / "before")
    assert main(["--data", str(tmp_path), "--release", "v1", "summary"]) == 2
    err = capsys.readouterr().err
    assert "[CC311]" in err and "was moved or copied" in err
    assert f"`citycube --data {tmp_path} --release v1 views`" in err
    assert main(["--data", str(tmp_path), "--release", "v1", "views"]) == 0
    assert main(["--data", str(tmp_path), "--release", "v1", "summary"]) == 0
