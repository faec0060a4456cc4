"""The dataset card of a release: a STAC Collection (datacube), a Croissant file that mlcroissant
validates and reads, and a markdown card; written by an asset before the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import mlcroissant as mlc
import pyarrow.parquet as pq
import pystac
import pytest
from pystac.extensions.datacube import DatacubeExtension

from citycube.cube.manifest import read_manifest, verify_release
from citycube.cube.release import Release
from citycube.errors import CardValidationError
from citycube.reports.card import card_paths, datacube_problems, validate_card, write_card
from pipelines.cli import main
from tests.release_fixtures import CAT, CITY, FLIPPED_TILE, build_release


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    release = build_release(tmp_path_factory.mktemp("data"), "sample-0.2.0")
    write_card(release, CAT)
    return release


def _stac(release: Release) -> dict:
    return json.loads(card_paths(release)["stac"].read_text(encoding="utf-8"))


def test_the_stac_collection_is_valid_and_describes_the_cube(release: Release) -> None:
    stac = _stac(release)
    pystac.validation.validate_dict(stac, extensions=[])  # STAC core schema, shipped offline
    assert datacube_problems(stac) == []
    collection = pystac.Collection.from_dict(stac)
    cube = DatacubeExtension.ext(collection)
    assert set(cube.dimensions) == {"x", "y", "time", "scale"}
    assert cube.dimensions["time"].extent == ["2020-01-01T00:00:00Z", "2020-12-31T23:59:59Z"]
    assert {k: v.unit for k, v in cube.variables.items()} == {
        "NTL.radiance": "nW/cm²/sr",
        "POP.population_density": "persons/km²",
    }
    (bbox,) = collection.extent.spatial.bboxes  # one city: the overall box only
    west, south, east, north = bbox
    assert 4.5 < west < east < 5.2 and 52.1 < south < north < 52.5  # Amsterdam
    assert stac["summaries"]["citycube:synthetic"] == [True]
    assert {"observations", "tiles", "croissant", "card", "manifest"} <= set(collection.assets)


def test_missing_datacube_fields_are_reported(release: Release) -> None:
    stac = _stac(release)
    del stac["cube:variables"]["POP.population_density"]["unit"]
    stac["cube:dimensions"]["x"]["axis"] = "z"
    problems = datacube_problems(stac)
    assert "variable POP.population_density has no unit" in problems
    assert "dimension x needs type spatial, axis x and an extent" in problems


def test_mlcroissant_validates_and_reads_the_observations_and_tiles(release: Release) -> None:
    dataset = mlc.Dataset(jsonld=card_paths(release)["croissant"])
    assert dataset.metadata.version == "0.2.0"
    records = list(dataset.records("observations"))
    table = pq.read_table(release.published_root / "observations", partitioning=None).to_pylist()
    assert len(records) == len(table) == 2 * (140 + 12)
    flipped = [
        r
        for r in records
        if r["observations/tile_id"] == FLIPPED_TILE.encode()
        and r["observations/modality"] == b"POP"
    ]
    assert len(flipped) == 1 and flipped[0]["observations/available"] is False
    assert flipped[0]["observations/reason"] == b"insufficient_valid_support"
    tiles = list(dataset.records("tiles"))
    assert len(tiles) == 140 + 12 and {t["tiles/city"] for t in tiles} == {CITY.encode()}
    fields = {
        (r["released_fields/modality"], r["released_fields/unit"])
        for r in dataset.records("released_fields")
    }
    assert fields == {("NTL", "nW/cm²/sr"), ("POP", "persons/km²")}  # inline data: str


def test_the_data_card_states_coverage_availability_licences_and_limits(
    release: Release,
) -> None:
    card = card_paths(release)["card"].read_text(encoding="utf-8")
    assert "> **SYNTHETIC SAMPLE DATA" in card
    assert "| Amsterdam | Netherlands | EPSG:32631 | 10×14 (140) | 3×4 (12) |" in card
    assert "1 city × 1 year (2020), 2 of 18 modalities" in card
    assert (
        "| POP | Population | epoch | population_density (persons/km²) | 1/1 (100.0 %) | " in card
    )
    assert "151/152 (99.3 %)" in card  # the tile below POP's threshold
    assert (
        "| `test_pop` | test_pop | `test:test_pop` t1 | test fixture | tests | synthetic |" in card
    )
    assert "Modalities not in this release: BV," in card


def test_the_card_command_writes_and_validates(
    release: Release, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data", str(release.data_root), "--release", release.version, "card"]
    assert main([*args, "--validate"]) == 0
    out = capsys.readouterr().out
    assert "STAC 1.1.0 core schema and datacube fields" in out
    assert "record set observations: read 5 records" in out and "is valid" in out
    other = build_release(release.data_root, "v-without-card", modalities=("NTL",))
    assert (
        main(["--data", str(release.data_root), "--release", other.version, "card", "--validate"])
        == 2
    )
    assert "write the card with `citycube --release v-without-card card`" in capsys.readouterr().err
    assert main(["--data", str(release.data_root), "--release", other.version, "card"]) == 0
    assert validate_card(other)[-1].startswith("croissant.json: record set released_fields")
    card_paths(other)["croissant"].write_text('{"@type": "sc:Dataset"}', encoding="utf-8")
    with pytest.raises(CardValidationError, match="not valid Croissant"):
        validate_card(other)


def test_the_card_asset_runs_before_the_manifest_so_verify_covers_it(tmp_path: Path) -> None:
    from assets.reports import (
        DATASET_CARD_KEY,
        MANIFEST_KEY,
        PAPER_COMPARISON_KEY,
        build_report_assets,
    )
    from pipelines.resources import CubeResource

    release = build_release(tmp_path / "data", "v1")
    chosen = [a for a in build_report_assets(CAT) if a.key in (DATASET_CARD_KEY, MANIFEST_KEY)]
    assert chosen[1].asset_deps[MANIFEST_KEY] == {DATASET_CARD_KEY, PAPER_COMPARISON_KEY}
    cube = CubeResource(data_root=str(release.data_root), release_version="v1")
    result = dg.materialize(
        chosen, resources={"cube": cube}, instance=dg.DagsterInstance.ephemeral()
    )
    assert result.success
    listed = read_manifest(release)["files"]
    assert {"collection.json", "croissant.json", "README.md"} <= set(listed)
    assert verify_release(release).ok
