"""`citycube releases`: every release under the data root with its provenance and state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from citycube.cube import Release
from citycube.manifest import read_manifest
from citycube.releases import list_releases
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
    changed = "changed observations/city=Amsterdam/year=2020/NTL.parquet"
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
