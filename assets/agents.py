"""The scripted baseline agent on the published forecasting cases, over MCP.

Downstream of the published database and the forecasting cases: the asset serves the cases
through the MCP server (a subprocess per strategy, stdio), lets the scripted agent solve them,
scores the runs and adds ``agent_runs``, ``agent_tool_calls`` and ``agent_scores`` to the
release (Parquet under ``agents/`` and views in ``cube.duckdb``) before the manifest is written.
A release without forecasting cases gets no runs and says so.
"""

import dagster as dg
from pydantic import Field

from assets.cube import DATABASE_KEY
from assets.tasks import FORECAST_SCORES_KEY
from pipelines.resources import CubeResource

AGENT_RUNS_KEY = dg.AssetKey(["agents", "scripted_runs"])
GROUP = "agents"


class ScriptedRunsConfig(dg.Config):
    """Which cases the scripted agent solves and with which tools."""

    series_per_target: int = Field(
        default=2,
        ge=0,
        description="Cases of each target's first N selected series (5 cases each); 0: all.",
    )
    profile: str = Field(default="analysis", description="Tool profile: forecast or analysis.")


def build_agent_assets() -> list[dg.AssetsDefinition]:
    """The scripted agent's runs and their scores, as views of the release."""

    @dg.asset(
        key=AGENT_RUNS_KEY,
        deps=[DATABASE_KEY, FORECAST_SCORES_KEY],
        group_name=GROUP,
        kinds={"python", "duckdb", "parquet"},
    )
    def scripted_runs(config: ScriptedRunsConfig, cube: CubeResource) -> dg.MaterializeResult:
        """Last-year, ten-year-mean and median-of-four rules solved through the MCP tools."""
        import pyarrow.parquet as pq

        from citycube.agents.strategies import STRATEGIES
        from citycube.agents.views import publish_agent_tables
        from citycube.tasks.forecast import ForecastFiles
        from pipelines.agents import run_strategies, score_runs, scores_text

        release = cube.release()
        references = ForecastFiles.published(release).references
        if not references.exists() or pq.read_metadata(references).num_rows == 0:
            return dg.MaterializeResult(
                metadata={"runs": 0, "note": "the release has no forecasting cases: no runs"}
            )
        run_dirs = run_strategies(
            release.data_root,
            release,
            list(STRATEGIES),
            series_per_target=config.series_per_target or None,
            profile=config.profile,
        )
        tables = score_runs(release, run_dirs)
        views = publish_agent_tables(release, tables)
        return dg.MaterializeResult(
            metadata={
                "runs": len(run_dirs),
                "trajectories": dg.MetadataValue.json([str(d / "cases") for d in run_dirs]),
                "scores": dg.MetadataValue.md(scores_text(tables["agent_scores"])),
                "views": dg.MetadataValue.json(views),
                "tool_calls": tables["agent_tool_calls"].num_rows,
            }
        )

    return [scripted_runs]
