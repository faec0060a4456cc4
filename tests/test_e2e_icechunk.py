"""End to end with icechunk chip stores: `citycube build` through the project's Dagster
definitions with ``CITYCUBE_CHIPS=icechunk``, then the published chips and observations read
back and compared with the same partitions built by the core into plain Zarr, before and
after a garbage collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.chips import open_chips
from citycube.cube.chips_icechunk import PUBLISHED_BRANCH, chip_repositories, open_repository
from citycube.cube.manifest import verify_release
from citycube.cube.release import Release
from citycube.processing.compute import process_partition
from pipelines.cli import main
from sources.sample import SampleBackend

pytestmark = pytest.mark.e2e(builds=1)

REPO_ROOT = Path(__file__).resolve().parents[1]
CITY, YEAR, RELEASE = "Amsterdam", 2020, "ice-e2e"
IMAGES = ("DEM", "LC")
"""A static and an annual image modality: their chips go into icechunk stores."""
COMPARED = ["tile_id", "scale", "field", "value", "valid_fraction", "available", "reason"]


def _assets() -> str:
    catalogue = load_catalogue()
    products = {
        p
        for code in IMAGES
        for p in (*catalogue.get(code).products(), *catalogue.get(code).auxiliary_products)
    }
    prefixes = [f"sources/{p}" for p in sorted(products)]
    for group in ("derived", "modalities"):
        prefixes += [f"{group}/{code.lower()}" for code in IMAGES]
    return ",".join([*prefixes, "cube"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("ice-e2e")
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(root / "data")]
    command += ["--release", RELEASE, "build", "--cities", CITY, "--years", str(YEAR)]
    command += ["--workers", "1", "--assets", _assets()]
    env = {**os.environ, "DAGSTER_HOME": str(root / "home"), "CITYCUBE_CHIPS": "icechunk"}
    env.pop("CITYCUBE_DASK_SCHEDULER", None)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return Release(root / "data", RELEASE, "icechunk")


@pytest.fixture(scope="module")
def plain(built: Release) -> Release:
    """The same partitions built by the core into plain Zarr, from the same sources."""
    catalogue = load_catalogue()
    release = Release(built.data_root, "plain-check", "zarr")
    for code in IMAGES:
        process_partition(catalogue.get(code), catalogue, CITY, YEAR, SampleBackend(), release)
    return release


def _published_rows(release: Release, code: str) -> list[dict]:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        table = con.execute(
            f"SELECT {', '.join(COMPARED)} FROM observations WHERE modality = ? "
            "ORDER BY tile_id, field",
            [code],
        ).to_arrow_table()
    return table.to_pylist()


def _stores(release: Release) -> dict[str, str]:
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        return dict(con.execute("SELECT DISTINCT modality, store FROM chip_index").fetchall())


def _assert_published_values_match(built: Release, plain: Release) -> None:
    stores = _stores(built)
    assert set(stores) == set(IMAGES)
    for code in IMAGES:
        assert stores[code].endswith(".icechunk")
        with (
            open_chips(built.root / stores[code]) as published,
            open_chips(plain.chip_store(code, CITY, Path(stores[code]).stem)) as expected,
        ):
            assert published.attrs["modality"] == code
            for name in ("data", "valid"):
                np.testing.assert_array_equal(published[name].values, expected[name].values)
        rows = pq.read_table(plain.observations_file(CITY, YEAR, code)).sort_by(
            [("tile_id", "ascending"), ("field", "ascending")]
        )
        assert _published_rows(built, code) == rows.select(COMPARED).to_pylist()


def test_the_build_publishes_icechunk_chips_that_read_back_as_the_core_writes_them(
    built: Release, plain: Release
) -> None:
    stores = chip_repositories(built)
    assert {s.parent.parent.name for s in stores} == set(IMAGES)
    for store in stores:
        repo = open_repository(store)
        assert repo.lookup_branch(PUBLISHED_BRANCH) == repo.lookup_branch("main")
    assert not list(built.root.glob("chips/*/*/*.zarr"))
    _assert_published_values_match(built, plain)
    assert verify_release(built).ok


def test_garbage_collection_keeps_the_published_values(
    built: Release, plain: Release, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data", str(built.data_root), "--release", RELEASE, "gc", "--older-than", "0"]
    assert main(args) == 0
    assert f"{len(IMAGES)} icechunk chip stores" in capsys.readouterr().out
    _assert_published_values_match(built, plain)
    assert verify_release(built).ok
