"""The school capacity planning cases over MCP: the server, the scripted baseline agent and the
scorer of its runs.

The server (official ``mcp`` SDK) serves one :class:`citycube.agents.school_capacity.SchoolRun`:
``list_cases`` and ``start_case`` open a case, the eight tools of AgenticCity-Bench App. D read
it, ``submit_plan`` ends it. The scripted agent (no language model) is an MCP client that plans
every case with one of the direct baselines through the tools, so its scores equal theirs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.agents.school_capacity import UNCOUNTED, SchoolRun
from citycube.errors import AgentCaseError
from citycube.tasks.school_capacity import STRATEGIES
from pipelines.agent_tasks.cube_tools import (
    CubeToolDocs,
    add_case_tools,
    add_cube_tools,
    add_tools,
    new_server,
    result_text,
)
from pipelines.agents import result_json

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from citycube.cube.release import Release

__all__ = [
    "SCORE_TABLE",
    "STRATEGIES",
    "build_server",
    "open_run",
    "score_runs",
    "scripted_agent",
]

SCORE_TABLE = "school_agent_scores"
"""The table of this task's run scores a release publishes (what ``agents show`` prints)."""
INSTRUCTIONS = (
    "Forecast next-year enrollment and plan period-+1 capacity for the specified school. Call "
    "list_cases, then start_case with a case key. Read enrollment and capacity for periods -2, "
    "-1 and 0 with read_school_history. Choose an integer added_seats >= 0; planned capacity "
    "equals period-0 capacity plus added seats. Reductions are unavailable, but zero additions "
    "are allowed. Use only the case tools and evidence through period 0. Urban evidence "
    "(list_modalities, list_assets, read_table, describe_raster, view_raster) is optional: check "
    "its age, units and spatial coverage; a tile is not a verified school catchment. Missing "
    "data are unknown. Use calculate for arithmetic. Aim for next-year enrollment to be "
    "95%-105% of planned capacity. Submit predicted_enrollment, added_seats, evidence_ids "
    "(evidence-NNNN of successful reads) and a concise reason through submit_plan; a valid "
    "submission ends the case."
)
"""AgenticCity-Bench App. D's school prompt, with the case tools named."""
CUBE_TOOL_DOCS = CubeToolDocs(
    list_assets="Table and raster assets of the school's tile, with fields, units and periods.",
    read_table="Rows of a table asset (default: the school's tile, every field and period).",
)
"""What the school server's clients read of the cube-asset tools."""


def case_count(release: Release) -> int:
    """How many cases the release publishes (0 when it has none)."""
    from citycube.tasks.school_capacity import SchoolFiles

    path = SchoolFiles.published(release).cases
    return pq.read_metadata(path).num_rows if path.exists() else 0


def open_run(release: Release, run_dir: Path, *, agent: str) -> SchoolRun:
    """A run over the published release's school cases, writing into ``run_dir``."""
    return SchoolRun(release, run_dir, agent=agent)


def build_server(run: SchoolRun) -> MCPServer:
    """An MCP server with one typed function per tool of the run."""
    server = new_server("citycube-school-capacity", INSTRUCTIONS)

    def read_school_history() -> str:
        """Enrollment and capacity of the school at periods -2, -1 and 0."""
        return result_text(run.call("read_school_history"))

    def list_modalities() -> str:
        """The cube's modalities with data for the case's city up to period 0."""
        return result_text(run.call("list_modalities"))

    def calculate(expression: str) -> str:
        """The value of an arithmetic expression (+ - * / // % **, min, max, mean, ...)."""
        return result_text(run.call("calculate", {"expression": expression}))

    def submit_plan(
        predicted_enrollment: float, added_seats: int, evidence_ids: list[str], reason: str
    ) -> str:
        """Submit the plan; a valid one ends the case."""
        args = {
            "predicted_enrollment": predicted_enrollment,
            "added_seats": added_seats,
            "evidence_ids": evidence_ids,
            "reason": reason,
        }
        return result_text(run.call("submit_plan", args))

    add_case_tools(
        server,
        run,
        "Keys of the school cases this server serves.",
        "Open a case and return its message (city, tile, school, phase, periods).",
    )
    add_tools(server, read_school_history, list_modalities)
    add_cube_tools(server, run, CUBE_TOOL_DOCS)
    add_tools(server, calculate, submit_plan)
    return server


async def scripted_agent(client: Any, strategy: str) -> int:
    """Plan every case the connected server offers with one direct baseline; the number
    answered. Per case: the history, the asset list, a table of the school's tile, the
    forecast through ``calculate``, then the plan citing the history it read."""
    from citycube.tasks.school_capacity import half_up, plan_from_forecast

    if strategy not in STRATEGIES:
        raise AgentCaseError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    keys = result_json(await client.call_tool("list_cases", {}))["cases"]
    answered = 0
    for key in keys:
        await client.call_tool("start_case", {"case_key": key})
        history = result_json(await client.call_tool("read_school_history", {}))
        cited = [history["evidence_id"]]
        assets = result_json(await client.call_tool("list_assets", {}))["assets"]
        tables = [a for a in assets if a["kind"] == "table" and a["periods_available"]]
        if tables:
            table = result_json(
                await client.call_tool("read_table", {"asset_id": tables[0]["asset_id"]})
            )
            cited.append(f"{table['evidence_id']}/{tables[0]['asset_id']}")
        enrollment = [int(v) for v in history["enrollment"]]
        if strategy == "three_year_mean":
            expression = f"({' + '.join(map(str, enrollment))}) / {len(enrollment)}"
            mean = result_json(await client.call_tool("calculate", {"expression": expression}))
            predicted = half_up(mean["value"])
            reason = f"three-year mean {expression} = {mean['value']:.3f}, rounded"
        else:
            predicted = enrollment[-1]
            reason = "period-0 enrollment carried forward"
        added = plan_from_forecast(predicted, history["capacity"][-1])
        plan = {
            "predicted_enrollment": predicted,
            "added_seats": added,
            "evidence_ids": cited,
            "reason": f"{reason}; add the seats the forecast exceeds period-0 capacity by",
        }
        result_json(await client.call_tool("submit_plan", plan))
        answered += 1
    return answered


RUN_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("agent", pa.string()),
        ("release", pa.string()),
        ("case_key", pa.string()),
        ("submitted", pa.bool_()),
        ("predicted_enrollment", pa.float64()),
        ("added_seats", pa.int64()),
        ("tool_calls", pa.int64()),
        ("failed_calls", pa.int64()),
    ]
)
"""``school_agent_runs``: one row per run and case."""


def score_runs(release: Release, run_dirs: Sequence[Path]) -> dict[str, pa.Table]:
    """``school_agent_runs``, ``school_agent_tool_calls`` and ``school_agent_scores`` of some
    run folders (scores: :func:`citycube.tasks.school_capacity.score_plans`, plus calls per
    case counted without the submission)."""
    from citycube.agents.scoring import CALL_SCHEMA, read_run
    from citycube.agents.trajectory import read_trajectory
    from citycube.tasks.school_capacity import SCORE_SCHEMA, SchoolFiles, score_plans

    references = pq.read_table(SchoolFiles.published(release).references)
    keys = sorted(references["case_key"].to_pylist())
    runs, calls, scores = [], [], []
    for run_dir in run_dirs:
        record = read_run(run_dir)
        plans: dict[str, dict[str, Any]] = {}
        counted = 0
        for key in keys:
            case_dir = run_dir / "cases" / key
            lines = read_trajectory(case_dir / "trajectory.jsonl") if case_dir.exists() else []
            sub = case_dir / "submission.json"
            plan = json.loads(sub.read_text(encoding="utf-8")) if sub.exists() else None
            if plan is not None:
                plans[key] = plan
            counted += sum(1 for line in lines if line["tool"] not in UNCOUNTED)
            runs.append(
                {
                    "run": record["run"],
                    "agent": record["agent"],
                    "release": record["release"],
                    "case_key": key,
                    "submitted": plan is not None,
                    "predicted_enrollment": plan and plan["predicted_enrollment"],
                    "added_seats": plan and plan["added_seats"],
                    "tool_calls": len(lines),
                    "failed_calls": sum(1 for line in lines if not line["ok"]),
                }
            )
            for line in lines:
                calls.append(
                    {
                        "run": record["run"],
                        "release": record["release"],
                        "catalogue_digest": record["catalogue_digest"],
                        "case_key": key,
                        "seq": line["seq"],
                        "tool": line["tool"],
                        "arguments": json.dumps(line["arguments"], sort_keys=True),
                        "evidence_id": line["evidence_id"],
                        "ok": line["ok"],
                        "error": line.get("error"),
                        "result_digest": line["result_digest"],
                        "duration_ms": line["duration_ms"],
                        "counted": line["tool"] not in UNCOUNTED,
                    }
                )
        table = score_plans(references, plans, record["run"])
        extra = {
            "strategy": record["run"],
            "group": "all",
            "metric": "tool_calls_per_case",
            "value": counted / len(keys) if keys else float("nan"),
            "cases": len(keys),
            "submitted": len(plans),
        }
        scores.append(pa.concat_tables([table, pa.Table.from_pylist([extra], schema=SCORE_SCHEMA)]))
    return {
        "school_agent_runs": pa.Table.from_pylist(runs, schema=RUN_SCHEMA),
        "school_agent_tool_calls": pa.Table.from_pylist(calls, schema=CALL_SCHEMA),
        SCORE_TABLE: pa.concat_tables(scores) if scores else SCORE_SCHEMA.empty_table(),
    }
