"""The food-access reference source and case set (AgenticCity-Bench App. D.1, D.3.1).

``sources/usda_food_atlas`` fetches, per city, the Food Access Research Atlas 2019 labels joined
to census-tract polygons (the real ERS and Census files, or their sample twin in the default
source set); a city outside the United States records why it has none. The unpartitioned
``benchmark/food_access_cases`` transfers the labels of the cities the staged cube holds to
1 km cells, selects the cases by the paper's rule and writes them, with the counts per city and
stratum and the baselines' scores, into the release, published with the cube as DuckDB views.
"""

import dagster as dg

from assets.common import SINGLE_RUN, SOURCE_RETRY, published_path, published_table
from assets.cube import STAGED_DATABASE_KEY
from pipelines.partitions import city_partitions
from pipelines.resources import CubeResource

FOOD_SOURCE_KEY = dg.AssetKey(["sources", "usda_food_atlas"])
FOOD_CASES_KEY = dg.AssetKey(["benchmark", "food_access_cases"])


def _source(cube: CubeResource):
    from citycube.items.protocol import load_source_set_spec
    from sources.usda_food_atlas.select import food_atlas_source

    return food_atlas_source(load_source_set_spec(cube.sources_for_tasks().path or None))


def build_food_access_assets() -> list[dg.AssetsDefinition]:
    """The reference source per city and the case set."""

    @dg.asset(
        key=FOOD_SOURCE_KEY,
        partitions_def=city_partitions,
        backfill_policy=SINGLE_RUN,
        retry_policy=SOURCE_RETRY,
        group_name="sources",
        kinds={"python"},
        description="Food Access Research Atlas 2019 tract labels with tract polygons, per city.",
    )
    def usda_food_atlas(
        context: dg.AssetExecutionContext, cube: CubeResource
    ) -> dg.MaterializeResult:
        from sources.usda_food_atlas import fetch_city

        source, sources_dir = _source(cube), cube.release().sources_dir
        done = [fetch_city(source, city, sources_dir) for city in context.partition_keys]
        return dg.MaterializeResult(metadata={"cities": dg.MetadataValue.json(done)})

    @dg.asset(
        key=FOOD_CASES_KEY,
        deps=[STAGED_DATABASE_KEY, FOOD_SOURCE_KEY],
        group_name="benchmark",
        kinds={"duckdb", "parquet"},
    )
    def food_access_cases(cube: CubeResource) -> dg.MaterializeResult:
        """150 food-access tiles (38/38/37/37) where the scope has them; counts say why not."""
        from citycube.cube.release import build_connection
        from citycube.tasks.food_access import (
            FoodAccessFiles,
            counts_markdown,
            write_food_access_cases,
        )
        from citycube.tasks.views import stage_views
        from sources.usda_food_atlas import read_city

        release = cube.release()
        with build_connection(release) as con:
            scope = [c for (c,) in con.execute(
                "SELECT DISTINCT city FROM observations ORDER BY city").fetchall()]  # fmt: skip
        source = _source(cube)
        tracts, unavailable = {}, {}
        for city in scope:
            frame, reason = read_city(source, city, release.sources_dir)
            if frame is not None:
                tracts[city] = frame
            else:
                unavailable[city] = reason
        found = write_food_access_cases(release, tracts, scope, unavailable)
        views = stage_views(release, cube.catalogue())
        files = FoodAccessFiles.draft(release)
        counts = found.counts
        return dg.MaterializeResult(
            metadata={
                **published_table(release, files.cases, name="cases"),
                "reference": dg.MetadataValue.path(str(published_path(release, files.reference))),
                "selected": len(found.cases),
                "wanted": 150,
                "counts": dg.MetadataValue.md(counts_markdown(counts)),
                "views": dg.MetadataValue.json(views),
            }
        )

    return [usda_food_atlas, food_access_cases]
