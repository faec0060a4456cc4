"""The school capacity case asset through Dagster: with London in the cube, the real adapter
fetches the reference files over loopback HTTP and the cases are published as views; without
London, the case set is empty and says why."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from assets.tasks.school_capacity import build_school_assets
from citycube.cube.release import (
    OBSERVATION_SCHEMA,
    Release,
    build_duckdb,
    publish_database,
    release_metadata,
    write_tiles,
)
from citycube.grid.tiles import city_grid
from citycube.tasks.school_capacity import SchoolFiles
from pipelines.resources import CubeResource
from sources.sample.school_capacity import sample_school_files
from tests.school_fixtures import CAT, stage_london


def _materialise(release: Release, config: dict | None = None) -> None:
    result = dg.materialize(
        build_school_assets(),
        resources={"cube": CubeResource(data_root=str(release.data_root), release_version="t")},
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"benchmark__school_cases": {"config": config or {}}}},
    )
    assert result.success


def test_london_cases_from_the_real_source_over_loopback(
    tmp_path: Path, file_server: tuple[str, Path, Path]
) -> None:
    base, served, log = file_server
    names = []
    for name, body in sample_school_files("London").items():
        (served / name).write_bytes(body)
        names.append(name)
    release, meta = stage_london(tmp_path)
    capacity = [f"{base}/{n}" for n in sorted(names) if n.startswith("capacity_")]
    _materialise(release, {"capacity_urls": capacity, "gias_url": f"{base}/gias.csv"})
    publish_database(release, meta)
    assert len(log.read_text().splitlines()) == 5
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM school_cases").fetchone() == (100,)
        strata = dict(
            con.execute("SELECT stratum, count(*) FROM school_targets GROUP BY 1").fetchall()
        )
        assert strata == {"balanced": 50, "shortage": 50}
        rate = con.execute(
            "SELECT value FROM school_baseline_scores WHERE strategy = 'three_year_mean' "
            "AND \"group\" = 'all' AND metric = 'balanced_rate_pct'"
        ).fetchone()
        assert rate is not None and 0 < rate[0] <= 100
    manifest = json.loads(SchoolFiles.published(release).manifest.read_text())
    assert manifest["complete"] and manifest["source"]["synthetic"] is False
    assert manifest["source"]["urls"]["gias"].endswith("/gias.csv")


def test_a_scope_without_london_gets_no_cases_and_says_why(tmp_path: Path) -> None:
    release = Release(tmp_path / "data", "t")
    write_tiles(release)
    rows = [
        {
            "tile_id": t,
            "city": "Boston",
            "scale": "2km",
            "year": 2020,
            "modality": "HEAT",
            "field": "mean_c",
            "value": 14.0,
            "unit": "°C",
            "valid_fraction": 1.0,
            "available": True,
            "reason": None,
            "temporal_basis": "annual",
            "source_year": 2020,
            "source_id": "test",
            "source_version": "0",
            "synthetic": True,
        }
        for t in city_grid("Boston", "2km").tile_ids()
    ]
    path = release.observations_file("Boston", 2020, "HEAT")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=OBSERVATION_SCHEMA), path)
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    _materialise(release)
    publish_database(release, meta)
    manifest = json.loads(SchoolFiles.published(release).manifest.read_text())
    assert manifest["cases"] == 0 and not manifest["complete"]
    assert "London is not in the cube's scope (Boston)" in manifest["note"]
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM school_cases").fetchone() == (0,)
        note = con.execute("SELECT note FROM school_eligibility WHERE item = 'note'").fetchone()
        assert note is not None and "England" in note[0]
