"""`citycube diff A B`: a rule change shows as exactly the partitions and tiles it touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from citycube.cube.diff import diff_releases, diff_text
from citycube.errors import InvalidNameError, ReleaseNotFoundError
from pipelines.cli import main
from tests.release_fixtures import CAT, CITY, YEAR, build_release, pop_threshold


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v1 as catalogued; v2 with POP's min_valid_fraction lowered from 0.5 to 0.4; v3 with
    NTL's source doubled; v4 without NTL."""
    root = tmp_path_factory.mktemp("data")
    build_release(root, "v1")
    build_release(root, "v2", pop_threshold(CAT, 0.4))
    build_release(root, "v3", ntl_scale=2.0)
    build_release(root, "v4", modalities=("POP",))
    return root


def test_a_lowered_threshold_changes_exactly_the_tile_it_decides(data_root: Path) -> None:
    diff = diff_releases(data_root, "v1", "v2")
    assert diff.changed == ((CITY, YEAR, "POP"),)
    assert (diff.added, diff.removed, diff.unchanged) == ((), (), 1)  # NTL untouched
    (pop,) = diff.fields
    assert (pop.field, pop.tiles) == ("population_density", 140 + 12)
    assert (pop.null_to_value, pop.value_to_null, pop.changed_values) == (1, 0, 0)
    assert pop.null_to_value_reasons == {"insufficient_valid_support": 1}
    assert pop.max_abs_change is None and pop.provenance_changed == 0
    assert diff_releases(data_root, "v2", "v1").fields[0].value_to_null_reasons == {
        "insufficient_valid_support": 1
    }


def test_a_changed_source_reports_every_changed_value_and_the_largest_change(
    data_root: Path,
) -> None:
    diff = diff_releases(data_root, "v1", "v3")
    assert diff.changed == ((CITY, YEAR, "NTL"),) and diff.unchanged == 1
    (ntl,) = diff.fields
    published = data_root / "releases/v1/published/observations/city=Amsterdam/year=2020"
    with duckdb.connect() as con:
        values = con.execute(
            "SELECT count(value), max(value) FROM read_parquet(?)", [str(published / "NTL.parquet")]
        ).fetchone()
    assert ntl.changed_values == values[0] == 152  # every tile has light, and all of it doubled
    assert ntl.max_abs_change == pytest.approx(values[1], rel=1e-5)  # doubled: Δ = the value
    assert (ntl.null_to_value, ntl.value_to_null) == (0, 0)


def test_partitions_added_and_removed(data_root: Path) -> None:
    diff = diff_releases(data_root, "v1", "v4")
    assert diff.removed == ((CITY, YEAR, "NTL"),) and diff.changed == () and diff.unchanged == 1
    assert diff_releases(data_root, "v4", "v1").added == ((CITY, YEAR, "NTL"),)
    same = diff_releases(data_root, "v1", "v1")
    assert same.identical and same.unchanged == 2 and "same values" in diff_text(same)


def test_the_diff_command_prints_a_table_or_json_and_exits_by_the_result(
    data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data", str(data_root), "diff", "v1", "v2"]) == 1
    out = capsys.readouterr().out
    assert "v1 → v2: 1 partitions changed, 0 added, 0 removed, 1 unchanged" in out
    (row,) = [line for line in out.splitlines() if line.startswith(CITY)]
    assert row.split()[:6] == [CITY, "2020", "POP", "population_density", "152", "0"]
    assert row.endswith("1 (insufficient_valid_support 1) / 0")
    assert main(["--data", str(data_root), "diff", "v1", "v4", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["removed"] == [{"city": CITY, "year": YEAR, "modality": "NTL"}]
    assert main(["--data", str(data_root), "diff", "v1", "v1"]) == 0


@pytest.mark.parametrize("hostile", ["../v1", "v1'; DROP TABLE x; --", "v*", "/tmp", "a/b"])
def test_hostile_release_names_are_refused_before_use(
    data_root: Path, hostile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidNameError):
        diff_releases(data_root, "v1", hostile)
    with pytest.raises(SystemExit):
        main(["--data", str(data_root), "diff", hostile, "v1"])
    assert "is not allowed" in capsys.readouterr().err


def test_a_missing_release_names_the_ones_there_are(data_root: Path) -> None:
    with pytest.raises(ReleaseNotFoundError, match="releases there: v1, v2, v3, v4"):
        diff_releases(data_root, "v1", "v9")


@pytest.fixture(scope="module")
def chip_releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two releases of the same DEM source: byte-identical chip stores and manifests."""
    root = tmp_path_factory.mktemp("chips")
    build_release(root, "c1", modalities=("DEM",))
    build_release(root, "c2", modalities=("DEM",))
    return root


def _store(root: Path, version: str) -> Path:
    (store,) = (root / "releases" / version / "chips" / "DEM" / CITY).glob("*.zarr")
    return store


def test_chips_rewritten_after_the_manifest_are_compared_by_content(
    chip_releases: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np
    import zarr

    same = diff_releases(chip_releases, "c1", "c2")
    assert same.identical and same.compared_chip_stores == 1
    manifests = [
        json.loads((chip_releases / "releases" / v / "manifest.json").read_text())["files"]
        for v in ("c1", "c2")
    ]
    chunks = [n for n in manifests[0] if n.startswith("chips/") and "/c/" in n]
    assert chunks and all(manifests[0][n]["sha256"] == manifests[1][n]["sha256"] for n in chunks)

    work = chip_releases / "rewritten"
    for version in ("c1", "c2"):
        shutil.copytree(chip_releases / "releases" / version, work / "releases" / version)
    data = zarr.open_group(str(_store(work, "c2")), mode="r+")["data"]
    block = np.asarray(data[0, :30, :40])
    data[0, :30, :40] = block + 100.0  # 1,200 pixels, written after the manifest
    diff = diff_releases(work, "c1", "c2")
    assert diff.changed == ((CITY, YEAR, "DEM"),) and not diff.fields  # the tables are equal
    (chips,) = diff.chips
    assert (chips.changed_pixels, chips.validity_changed) == (30 * 40, 0)
    assert chips.max_abs_change == pytest.approx(100.0)
    assert main(["--data", str(work), "diff", "c1", "c2"]) == 1
    out = capsys.readouterr().out
    compared = "compared: the observations of 1 partitions both publish, row by row, and 1 pairs"
    assert compared in out and "not as the manifests list them" in out
    assert "1200" in out.split("stores")[-1]  # the chip table's changed-pixel count


def test_a_chip_chunk_that_cannot_be_decoded_is_an_error_naming_the_stores(
    chip_releases: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = chip_releases / "garbled"
    for version in ("c1", "c2"):
        shutil.copytree(chip_releases / "releases" / version, work / "releases" / version)
    chunk = next(p for p in sorted((_store(work, "c2") / "data").rglob("*")) if p.is_file())
    chunk.write_bytes(b"\x00" * chunk.stat().st_size)  # no longer a zstd frame
    assert main(["--data", str(work), "diff", "c1", "c2"]) == 2
    err = capsys.readouterr().err
    assert "[CC301] the chip stores" in err and "could not be compared" in err
    assert str(_store(work, "c2")) in err and "citycube verify" in err
    assert "Traceback" not in err
