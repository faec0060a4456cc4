"""Forecasting cases of the agentic track and their baselines' scores.

Unpartitioned assets over the staged cube, like the translation inputs: each materialisation
reads the city-years the staged database is about to publish and its files are published with
them, so a build that completes a tile's 2010–2024 panel makes it eligible. The baselines are
scored as soon as the cases exist.
"""

import dagster as dg
from pydantic import Field

from assets.common import published_path, published_table, table_metadata
from assets.cube import STAGED_DATABASE_KEY, TILES_KEY
from pipelines.resources import CubeResource

FORECAST_CASES_KEY = dg.AssetKey(["benchmark", "forecast_cases"])
FORECAST_SCORES_KEY = dg.AssetKey(["benchmark", "forecast_baseline_scores"])
GROUP = "benchmark"


class ForecastCasesConfig(dg.Config):
    """How many cases to make per target (each selected tile gives five)."""

    lst_cases: int = Field(default=220, ge=0, description="LST cases (AgenticCity-Bench: 220).")
    carbon_cases: int = Field(
        default=220, ge=0, description="Carbon cases (AgenticCity-Bench: 220)."
    )
    property_cases: int = Field(
        default=160, ge=0, description="Property cases (AgenticCity-Bench: 160)."
    )


def build_forecast_assets() -> list[dg.AssetsDefinition]:
    """The forecasting cases and the scores of the two historical baselines."""

    @dg.asset(
        key=FORECAST_CASES_KEY,
        deps=[STAGED_DATABASE_KEY, TILES_KEY],
        group_name=GROUP,
        kinds={"duckdb", "parquet"},
    )
    def forecast_cases(config: ForecastCasesConfig, cube: CubeResource) -> dg.MaterializeResult:
        """LST, carbon and property forecasting cases (no years, no targets) and references."""
        from citycube.tasks.forecast import (
            ForecastFiles,
            eligibility_markdown,
            write_forecast_cases,
        )
        from citycube.tasks.views import stage_views

        release = cube.release()
        asked = {
            "lst": config.lst_cases,
            "carbon": config.carbon_cases,
            "property": config.property_cases,
        }
        found = write_forecast_cases(release, asked)
        views = stage_views(release, cube.catalogue())
        files = ForecastFiles.draft(release)
        return dg.MaterializeResult(
            metadata={
                **published_table(release, files.cases, name="cases"),
                "references": dg.MetadataValue.path(str(published_path(release, files.references))),
                "manifest": dg.MetadataValue.path(str(published_path(release, files.manifest))),
                "requested": dg.MetadataValue.json(found.requested),
                "achieved": dg.MetadataValue.json(found.achieved),
                "complete": found.complete,
                "eligibility": dg.MetadataValue.md(eligibility_markdown(found.eligibility)),
                "views": dg.MetadataValue.json(views),
            }
        )

    @dg.asset(
        key=FORECAST_SCORES_KEY,
        deps=[FORECAST_CASES_KEY],
        group_name=GROUP,
        kinds={"parquet", "csv"},
    )
    def forecast_baseline_scores(cube: CubeResource) -> dg.MaterializeResult:
        """Last-year and ten-year-mean baselines: MAE, MAPE, RMSE, R² with bootstrap intervals."""
        from citycube.tasks.forecast import write_baseline_scores
        from citycube.tasks.views import stage_views

        release = cube.release()
        scores, paths = write_baseline_scores(release)
        views = stage_views(release, cube.catalogue())
        return dg.MaterializeResult(
            metadata={
                **{
                    suffix: dg.MetadataValue.path(str(published_path(release, p)))
                    for suffix, p in paths.items()
                },
                **table_metadata(paths.get("parquet", ""), scores.num_rows),
                "rows": scores.num_rows,
                "summary": dg.MetadataValue.md(paths["md"].read_text(encoding="utf-8")),
                "views": dg.MetadataValue.json(views),
            }
        )

    return [forecast_cases, forecast_baseline_scores]
