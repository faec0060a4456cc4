"""The food-access task over MCP: its seven tools as a server, the scripted agent of its
baselines and the scores of runs (AgenticCity-Bench App. D, food access).

The scripted agent answers every case with one constant class (its strategy), after listing the
case's assets and inspecting one of them, whose evidence id it cites; run through a real MCP
session it reproduces the direct baselines of ``citycube.tasks.food_access`` exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.agents.food_access import FoodAccessRun, open_food_run, run_predictions
from citycube.errors import AgentCaseError
from citycube.tasks.food_access import CELLS, LABELS, FoodAccessFiles
from pipelines.agent_tasks.cube_tools import add_tools, new_server, result_text
from pipelines.agents import result_json

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from citycube.cube.release import Release

STRATEGIES = tuple(f"constant_{label}" for label in LABELS)
"""The scripted agent's rules: one constant class per strategy (the majority-class baseline is
the one whose class is the candidate pool's most frequent, as the baseline scores mark)."""
SCORE_TABLE = "food_access_agent_scores"
"""The table of this task's run scores a release publishes (what ``agents show`` prints)."""
INSTRUCTIONS = (
    "CityCube food-access cases. list_cases, then start_case(case_id); per case use "
    "list_reference_assets, inspect_table, describe_raster, view_raster, get_cell_summaries and "
    "calculate, and end it with submit_predictions."
)


def case_count(release: Release) -> int:
    """How many cases the release publishes (0 when it has none)."""
    from citycube.tasks.food_access import FoodAccessFiles

    path = FoodAccessFiles.published(release).cases
    return pq.read_metadata(path).num_rows if path.exists() else 0


def open_run(release: Release, run_dir: Path, *, agent: str) -> FoodAccessRun:
    """A run over the release's published food-access cases, writing into ``run_dir``."""
    return open_food_run(release, run_dir, agent=agent)


def build_server(run: FoodAccessRun) -> MCPServer:
    """An MCP server with the case tools and the seven food-access tools."""
    from mcp.server.mcpserver import Image

    server = new_server("citycube-food-access", INSTRUCTIONS)

    def list_cases() -> str:
        """Ids of the food-access cases this server serves."""
        return json.dumps({"cases": run.case_keys()})

    def start_case(case_id: str) -> str:
        """Open a case; its message names the tile, the four cells, the classes and cut-off."""
        return json.dumps(run.start_case(case_id), ensure_ascii=False)

    def list_reference_assets() -> str:
        """Tables and rasters of the case's tile dated before the evidence cut-off."""
        return result_text(run.call("list_reference_assets"))

    def inspect_table(
        asset_id: str, fields: list[str] | None = None, years: list[int] | None = None
    ) -> str:
        """Rows of a table asset for the case's 2 km tile (fields and years optional)."""
        args: dict[str, Any] = {"asset_id": asset_id}
        args |= {k: v for k, v in (("fields", fields), ("years", years)) if v}
        return result_text(run.call("inspect_table", args))

    def describe_raster(asset_id: str, year: int) -> str:
        """Bands, shape and per-band statistics of a raster asset of the tile in a year."""
        return result_text(run.call("describe_raster", {"asset_id": asset_id, "year": year}))

    def view_raster(asset_id: str, year: int) -> list[Any]:
        """A PNG preview of a raster asset of the tile in a year."""
        result = run.call("view_raster", {"asset_id": asset_id, "year": year})
        return [result_text(result), Image(data=result.image, format="png")]

    def get_cell_summaries(asset_id: str, year: int, band: str | None = None) -> str:
        """Per 1 km cell (s00 NW, s01 NE, s10 SW, s11 SE): a raster's band statistics."""
        args: dict[str, Any] = {"asset_id": asset_id, "year": year}
        return result_text(run.call("get_cell_summaries", args | ({"band": band} if band else {})))

    def calculate(expression: str) -> str:
        """The value of an arithmetic expression."""
        return result_text(run.call("calculate", {"expression": expression}))

    def submit_predictions(predictions: dict[str, Any], limitations: str) -> str:
        """Submit one {label, confidence, reason, evidence} per cell and the limitations; a
        valid submission ends the case."""
        args = {"predictions": predictions, "limitations": limitations}
        return result_text(run.call("submit_predictions", args))

    add_tools(
        server,
        list_cases,
        start_case,
        list_reference_assets,
        inspect_table,
        describe_raster,
        view_raster,
        get_cell_summaries,
        calculate,
        submit_predictions,
    )
    return server


async def scripted_agent(client: Any, strategy: str) -> int:
    """Answer every case the connected server offers with the strategy's constant class,
    citing one inspected asset per cell; the number of cases answered."""
    if strategy not in STRATEGIES:
        raise AgentCaseError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    label = strategy.removeprefix("constant_")
    cases = result_json(await client.call_tool("list_cases", {}))["cases"]
    answered = 0
    for case in cases:
        result_json(await client.call_tool("start_case", {"case_id": case}))
        assets = result_json(await client.call_tool("list_reference_assets", {}))["assets"]
        cited: list[str] = []
        rasters = [a for a in assets if a["kind"] == "raster" and a["years"]]
        tables = [a for a in assets if a["kind"] == "table" and a["years"]]
        if rasters:
            asset = rasters[0]
            args = {"asset_id": asset["asset_id"], "year": asset["years"][-1]}
            found = result_json(await client.call_tool("get_cell_summaries", args))
            note = f"cell summaries of {asset['years'][-1]}"
        elif tables:
            asset = tables[0]
            found = result_json(
                await client.call_tool("inspect_table", {"asset_id": asset["asset_id"]})
            )
            note = f"{len(found['rows'])} tile rows"
        else:
            found = None
        if found is not None:
            cited = [f"{found['evidence_id']}/{asset['asset_id']}: {note}"]
        predictions = {
            cell: {
                "label": label,
                "confidence": 0.5,
                "evidence": cited,
                "reason": f"{strategy} baseline: the same class for every cell",
            }
            for cell in CELLS
        }
        limitations = "A constant-class baseline: the cited asset is not used for the label."
        args = {"predictions": predictions, "limitations": limitations}
        result_json(await client.call_tool("submit_predictions", args))
        answered += 1
    return answered


SCORE_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("agent", pa.string()),
        ("n_cases", pa.int64()),
        ("n_submitted", pa.int64()),
        ("n_cells", pa.int64()),
        ("cell_accuracy", pa.float64()),
        ("macro_f1", pa.float64()),
        ("exact_case_accuracy", pa.float64()),
        *[(f"recall_{c}", pa.float64()) for c in LABELS],
        ("mean_calls", pa.float64()),
    ]
)


def score_runs(release: Release, run_dirs: Sequence[Path]) -> dict[str, pa.Table]:
    """``food_access_agent_scores``: per run the task's metrics over every published case
    (a case without a valid submission counts its four cells wrong)."""
    import pandas as pd

    from citycube.agents.trajectory import read_trajectory
    from citycube.tasks.food_access import score

    reference = pq.read_table(FoodAccessFiles.published(release).reference).to_pandas()
    rows = []
    for run_dir in run_dirs:
        record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        predicted = pd.DataFrame(run_predictions(run_dir), columns=["case_id", "cell", "label"])
        calls = [
            len(read_trajectory(p)) for p in sorted((run_dir / "cases").glob("*/trajectory.jsonl"))
        ]
        scored = score(reference, predicted)
        rows.append(
            {
                "run": run_dir.name,
                "agent": record.get("agent"),
                "n_submitted": int(predicted["case_id"].nunique()),
                **scored,
                "mean_calls": sum(calls) / len(calls) if calls else None,
            }
        )
    return {SCORE_TABLE: pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)}
