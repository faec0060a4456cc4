"""Pair index, splits and sampled instances of the any-to-any translation benchmark.

Unpartitioned assets over the staged cube: each materialisation reads the city-years the
checked staged database is about to publish, writes into the release's draft and adds its
files to the staged snapshot, so ``cube/database`` publishes them with the tables they were
computed from (and a failing check, theirs or the cube's, publishes neither). A build that adds
years refreshes them with the rest. The splits depend only on the grids and stay put; a key's
draw depends only on the seed, its route and itself, so added city-years add candidates
without reshuffling the others.
"""

import dagster as dg
from pydantic import Field

from assets.common import published_path, published_table
from assets.cube import STAGED_DATABASE_KEY, TILES_KEY
from citycube.catalogue.modalities import Catalogue
from citycube.tasks.sampling import DEFAULT_TOTAL, SAMPLING_SEED
from pipelines.resources import CubeResource

PAIRS_KEY = dg.AssetKey(["benchmark", "translation_pairs"])
SPLITS_KEY = dg.AssetKey(["benchmark", "splits"])
INSTANCES_KEY = dg.AssetKey(["benchmark", "translation_instances"])
GROUP = "benchmark"

HEATMAP_PREVIEW_PX = 700
"""Longest side of the route heatmap embedded in the Dagster UI (the file is full size)."""


class InstancesConfig(dg.Config):
    """How many instances to sample, and the seed of every draw."""

    total: int = Field(
        default=DEFAULT_TOTAL,
        ge=0,
        description="Instances over all splits (AgenticCity-Bench: 269,472 on the complete "
        "cube); a partial cube gives what its pairs allow and the manifest says so.",
    )
    seed: int = Field(default=SAMPLING_SEED, description="Seed of every draw.")


def build_benchmark_assets(catalogue: Catalogue) -> list[dg.AssetsDefinition]:
    """The pair index, the splits and the sampled instances."""

    @dg.asset(
        key=PAIRS_KEY, deps=[STAGED_DATABASE_KEY], group_name=GROUP, kinds={"duckdb", "parquet"}
    )
    def translation_pairs(cube: CubeResource) -> dg.MaterializeResult:
        """Directed source → target routes each (city, scale, tile, year) offers (Table 14)."""
        from PIL import Image

        from citycube.reports.thumbnails import png_data_uri
        from citycube.tasks.translation import BenchmarkFiles, summary_markdown, write_pair_index
        from citycube.tasks.views import stage_views

        release = cube.release()
        found = write_pair_index(release, catalogue)
        views = stage_views(release, catalogue)
        files = BenchmarkFiles.draft(release)
        with Image.open(files.heatmap) as heatmap:
            uri = png_data_uri(heatmap.convert("RGB"), HEATMAP_PREVIEW_PX)
        return dg.MaterializeResult(
            metadata={
                **published_table(release, files.pairs),
                "route_counts": dg.MetadataValue.path(
                    str(published_path(release, files.route_counts))
                ),
                "keys": found["keys"],
                "city_years": found["city_years"],
                "pairs": found["pairs"],
                "pairs_by_product": found["pairs_by_product"],
                "routes_with_pairs": found["routes_with_pairs"],
                "views": dg.MetadataValue.json(views),
                "route_counts_table": dg.MetadataValue.md(
                    summary_markdown(found["counts"], found["labels"])
                ),
                "heatmap": dg.MetadataValue.md(f"![pairs per route]({uri})"),
            }
        )

    @dg.asset(
        key=SPLITS_KEY,
        deps=[TILES_KEY, STAGED_DATABASE_KEY],
        group_name=GROUP,
        kinds={"parquet"},
        check_specs=[
            dg.AssetCheckSpec(
                "no_cross_split_overlap",
                asset=SPLITS_KEY,
                blocking=True,
                description="Blocking: no tile of one split (train, validation, test) overlaps "
                "a tile of another, at either scale.",
            )
        ],
    )
    def splits(cube: CubeResource) -> dg.MaterializeResult:
        """Train / validation / test by whole 10 km parent cells (seeded, stable over years)."""
        from citycube.tasks.translation import BenchmarkFiles, write_splits
        from citycube.tasks.views import stage_views

        release = cube.release()
        found = write_splits(release)
        views = stage_views(release, catalogue)
        overlaps = found["overlaps"]
        return dg.MaterializeResult(
            metadata={
                **published_table(release, BenchmarkFiles.draft(release).splits),
                "seed": found["seed"],
                "partitions": dg.MetadataValue.json(found["summary"]),
                "views": dg.MetadataValue.json(views),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="no_cross_split_overlap",
                    passed=not overlaps,
                    description="no tile of one partition overlaps a tile of another, "
                    "at either scale",
                    metadata={"overlapping_pairs": dg.MetadataValue.json(overlaps[:20])},
                )
            ],
        )

    @dg.asset(
        key=INSTANCES_KEY,
        deps=[PAIRS_KEY, SPLITS_KEY],
        group_name=GROUP,
        kinds={"parquet", "json"},
    )
    def translation_instances(config: InstancesConfig, cube: CubeResource) -> dg.MaterializeResult:
        """Route-balanced, target-anchored translation instances with their manifest."""
        from citycube.tasks.translation import BenchmarkFiles, write_instances
        from citycube.tasks.views import stage_views

        release = cube.release()
        result = write_instances(release, catalogue, total=config.total, seed=config.seed)
        views = stage_views(release, catalogue)
        files = BenchmarkFiles.draft(release)
        return dg.MaterializeResult(
            metadata={
                **published_table(release, files.instances),
                "manifest": dg.MetadataValue.path(str(published_path(release, files.manifest))),
                "seed": config.seed,
                "requested": dg.MetadataValue.json(result.requested),
                "achieved": dg.MetadataValue.json(result.achieved),
                "complete": result.complete,
                "instances": result.instances.num_rows,
                "views": dg.MetadataValue.json(views),
            }
        )

    return [translation_pairs, splits, translation_instances]
