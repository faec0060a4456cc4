"""`citycube releases`: every release under the data root with its provenance and state."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
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


def _replace_observations_view(release: Release) -> None:
    """What a hostile or careless writer does: the same view, NTL values times ten."""
    with duckdb.connect(str(release.duckdb_file)) as con:
        (sql,) = con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'observations'"
        ).fetchone()
        select = sql.split(" AS ", 1)[1].rstrip(";")
        con.execute(
            "CREATE OR REPLACE VIEW observations AS SELECT * REPLACE "
            "(CASE WHEN modality = 'NTL' THEN value * 10 ELSE value END AS value) "
            f"FROM ({select})"
        )


def test_the_database_readers_open_is_covered_by_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = build_release(tmp_path, "v1")
    manifest = read_manifest(release)
    assert manifest["files"]["cube.duckdb"]["bytes"] == release.duckdb_file.stat().st_size
    assert {"observations", "chip_index", "tiles", "availability"} <= set(
        manifest["database"]["views"]
    )
    assert manifest["database"]["tables"]["published_observations"]["rows"] == 2
    size = release.duckdb_file.stat().st_size
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        before = con.execute("SELECT sum(value) FROM observations WHERE modality = 'NTL'")
        total = before.fetchone()[0]

    _replace_observations_view(release)
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        after = con.execute("SELECT sum(value) FROM observations WHERE modality = 'NTL'")
        assert after.fetchone()[0] == pytest.approx(10 * total)  # what readers now get
    assert release.duckdb_file.stat().st_size == size  # the listing's size check alone passes
    check = verify_release(release)
    assert not check.ok and check.database == ["view observations differs from the manifest"]
    (summary,) = list_releases(tmp_path)
    assert summary.manifest == "differs"
    assert summary.manifest_problems[0] == "view observations differs from the manifest"
    data = ["--data", str(tmp_path), "--release", "v1"]
    assert main([*data, "verify"]) == 1
    out = capsys.readouterr().out
    assert "problems in cube.duckdb:" in out and "view observations differs" in out

    assert main([*data, "views"]) == 0  # rebuilt from the published tables: listed anew
    assert "manifest updated" in capsys.readouterr().out
    assert verify_release(release).ok


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


def test_a_moved_release_reads_its_old_place_until_its_views_are_rebuilt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    build_release(tmp_path / "old", "v1", modalities=("NTL",))
    (tmp_path / "new" / "releases").mkdir(parents=True)
    old, new = tmp_path / "old" / "releases" / "v1", tmp_path / "new" / "releases" / "v1"
    shutil.copytree(old, new, symlinks=True)  # as `cp -a` or `mv` across disks
    moved = Release(tmp_path / "new", "v1")
    check = verify_release(moved)
    assert not check.ok and check.database[0].startswith(
        f"its views read files of the release at {(tmp_path / 'old' / 'releases' / 'v1')}"
    )
    assert (
        "was moved or copied; rebuild its views with `citycube --release v1 views`"
        in (check.database[0])
    )
    assert main(["--data", str(tmp_path / "new"), "--release", "v1", "views"]) == 0
    assert verify_release(moved).ok
