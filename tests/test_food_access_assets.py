"""The food-access Dagster assets: the reference source per city (an item for Boston, the
reason for Amsterdam) and the case set staged as DuckDB views with its counts."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import duckdb
import pytest

from assets.tasks.food_access import FOOD_CASES_KEY, FOOD_SOURCE_KEY, build_food_access_assets
from benchmarks.bench_translation import write_synthetic_observations
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles
from pipelines.resources import CubeResource
from sources.sample.food_access import SampleFoodAtlas
from sources.usda_food_atlas import read_city

CAT = load_catalogue()


def test_the_default_scope_fetches_boston_and_explains_amsterdam(tmp_path: Path) -> None:
    release = Release(tmp_path / "data", "t")
    write_tiles(release)
    write_synthetic_observations(
        release.draft_dir / "observations",
        CAT,
        years=(2019,),
        cities=("Amsterdam", "Boston"),
        seed=1,
    )
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    resources = {"cube": CubeResource(data_root=str(tmp_path / "data"), release_version="t")}
    instance = dg.DagsterInstance.ephemeral()
    assets = build_food_access_assets()
    for city in ("Amsterdam", "Boston"):
        result = dg.materialize(
            assets,
            selection=[FOOD_SOURCE_KEY],
            partition_key=city,
            resources=resources,
            instance=instance,
        )
        assert result.success
    sources = tmp_path / "data" / "sources"
    (tag,) = [p.name for p in (sources / "usda_food_atlas").iterdir()]
    assert tag.startswith("sample-")
    source = SampleFoodAtlas(0)
    assert source.tag == tag
    nothing, reason = read_city(source, "Amsterdam", sources)
    assert nothing is None and reason is not None and "not a US city" in reason
    boston, _ = read_city(source, "Boston", sources)
    assert boston is not None and len(boston) > 0
    result = dg.materialize(
        assets, selection=[FOOD_CASES_KEY], resources=resources, instance=instance
    )
    assert result.success
    with duckdb.connect(str(release.staged_duckdb_file), read_only=True) as con:
        counts = {
            city: (int(selected), why)
            for city, selected, why in con.execute(
                "SELECT city, sum(selected), max(reason) FROM food_access_counts GROUP BY city"
            ).fetchall()
        }
        cases = con.execute("SELECT count(*) FROM food_access_cases").fetchone()[0]
    assert cases == 38 and counts["Boston"] == (38, "")
    assert counts["Amsterdam"] == (0, reason)
    assert counts["SanFrancisco"] == (0, "city not in this build's scope")


def test_a_source_set_with_atlas_options_picks_the_real_adapter(tmp_path: Path) -> None:
    from citycube.items.protocol import parse_source_set_spec
    from sources.usda_food_atlas import FoodAtlasSource
    from sources.usda_food_atlas.select import food_atlas_source

    spec = parse_source_set_spec(
        "name: real\ndefault: sample\noptions:\n  usda_food_atlas:\n"
        f"    cache_dir: {tmp_path}\n    atlas_url: http://127.0.0.1:1/atlas.xlsx\n"
    )
    assert isinstance(food_atlas_source(spec), FoodAtlasSource)
    with pytest.raises(Exception, match="CC420"):
        food_atlas_source(
            parse_source_set_spec(
                "name: bad\ndefault: sample\noptions:\n  usda_food_atlas:\n    nonsense: 1\n"
            )
        )
