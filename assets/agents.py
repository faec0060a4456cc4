"""The scripted baseline agent on the published forecasting cases, over MCP.

Downstream of the published database and the forecasting cases: the asset serves the cases
through the MCP server (a subprocess per strategy, stdio), lets the scripted agent solve them,
scores the runs and adds ``agent_runs``, ``agent_tool_calls`` and ``agent_scores`` to the
release (Parquet under ``agents/`` and views in ``cube.duckdb``) before the manifest is written.
When asked (``CITYCUBE_PLANNING_AGENTS=1``, which ``make agents`` sets, or the run's config), the
planning and resource tasks (EV charging, school capacity, food access) are run the same way,
each with its baselines as scripted rules, into ``agents/<task>/`` and ``<task>_agent_*`` views.
A task without cases in the release gets no runs and says so.
"""

import os
from typing import Any

import dagster as dg
from pydantic import Field

from assets.cube import DATABASE_KEY
from assets.tasks import FORECAST_SCORES_KEY
from pipelines.resources import CubeResource

AGENT_RUNS_KEY = dg.AssetKey(["agents", "scripted_runs"])
PLANNING_ENV = "CITYCUBE_PLANNING_AGENTS"
"""Set to 1 to run the planning tasks' scripted agents in builds (a few seconds per rule)."""
GROUP = "agents"


class ScriptedRunsConfig(dg.Config):
    """Which cases the scripted agent solves and with which tools."""

    series_per_target: int = Field(
        default=2,
        ge=0,
        description="Cases of each target's first N selected series (5 cases each); 0: all.",
    )
    profile: str = Field(default="analysis", description="Tool profile: forecast or analysis.")
    planning_tasks: bool = Field(
        default=False,
        description="Also run the planning and resource tasks (EV charging, school capacity, "
        f"food access) whose cases the release has; {PLANNING_ENV}=1 in the environment (make "
        "agents sets it) does the same.",
    )


def build_agent_assets() -> list[dg.AssetsDefinition]:
    """The scripted agent's runs and their scores, as views of the release."""

    @dg.asset(
        key=AGENT_RUNS_KEY,
        deps=[DATABASE_KEY, FORECAST_SCORES_KEY],
        group_name=GROUP,
        kinds={"python", "duckdb", "parquet"},
    )
    def scripted_runs(config: ScriptedRunsConfig, cube: CubeResource) -> dg.MaterializeResult:
        """Last-year, ten-year-mean and median-of-four rules solved through the MCP tools, and
        each planning task's baselines through its own tools."""
        import pyarrow.parquet as pq

        from citycube.agents.strategies import STRATEGIES
        from citycube.agents.views import publish_agent_tables, publish_task_tables
        from citycube.tasks.forecast import ForecastFiles
        from pipelines.agents import (
            PLANNING_TASKS,
            planning_task,
            run_strategies,
            score_runs,
            scores_text,
        )

        release = cube.release()
        metadata: dict[str, Any] = {}
        references = ForecastFiles.published(release).references
        if not references.exists() or pq.read_metadata(references).num_rows == 0:
            metadata["forecast"] = "the release has no forecasting cases: no runs"
            run_dirs: list = []
            views: list[str] = []
        else:
            run_dirs = run_strategies(
                release.data_root,
                release,
                list(STRATEGIES),
                series_per_target=config.series_per_target or None,
                profile=config.profile,
            )
            tables = score_runs(release, run_dirs)
            views = publish_agent_tables(release, tables)
            metadata["scores"] = dg.MetadataValue.md(scores_text(tables["agent_scores"]))
            metadata["tool_calls"] = tables["agent_tool_calls"].num_rows
        planning = config.planning_tasks or os.environ.get(PLANNING_ENV) == "1"
        for task in PLANNING_TASKS if planning else ():
            module = planning_task(task)
            cases = module.case_count(release)
            if not cases:
                metadata[task] = "the release has no cases of this task: no runs"
                continue
            task_dirs = run_strategies(
                release.data_root, release, list(module.STRATEGIES), task=task
            )
            task_tables = module.score_runs(release, task_dirs)
            views += publish_task_tables(release, task, task_tables)
            run_dirs += task_dirs
            metadata[task] = f"{cases} cases × {len(task_dirs)} scripted rules"
        return dg.MaterializeResult(
            metadata={
                "runs": len(run_dirs),
                **metadata,
                "trajectories": dg.MetadataValue.json([str(d / "cases") for d in run_dirs]),
                "views": dg.MetadataValue.json(views),
            }
        )

    return [scripted_runs]
