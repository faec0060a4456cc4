"""The school capacity case asset through Dagster: with London in the cube, the real adapter
fetches the reference files over loopback HTTP and the cases are published as views; without
London, the case set is empty and says why."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import duckdb

from assets.tasks.school_capacity import build_school_assets
from citycube.cube.release import Release, publish_database
from citycube.grid.tiles import city_grid
from citycube.tasks.school_capacity import SchoolFiles
from pipelines.resources import CubeResource
from sources.sample.school_capacity import sample_school_files
from tests.agent_fixtures import observation_row, stage_release, write_observations
from tests.school_fixtures import stage_london


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
    def boston_heat(release: Release) -> None:
        tiles = city_grid("Boston", "2km").tile_ids()
        rows = [
            observation_row("Boston", t, "2km", 2020, "HEAT", "mean_c", 14.0, unit="°C")
            for t in tiles
        ]
        write_observations(release, "Boston", 2020, "HEAT", rows)

    release, meta = stage_release(tmp_path, boston_heat)
    _materialise(release)
    publish_database(release, meta)
    manifest = json.loads(SchoolFiles.published(release).manifest.read_text())
    assert manifest["cases"] == 0 and not manifest["complete"]
    assert "London is not in the cube's scope (Boston)" in manifest["note"]
    with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM school_cases").fetchone() == (0,)
        note = con.execute("SELECT note FROM school_eligibility WHERE item = 'note'").fetchone()
        assert note is not None and "England" in note[0]
