"""The EV charging expansion cases over MCP: the run, the server, the scripted agent, scores.

The server (official ``mcp`` SDK) serves one :class:`EvRun`: ``list_cases`` and
``start_case`` open a case, App. D's nine tools read it, ``submit_forecast`` ends it. Tool logic
lives in :mod:`citycube.agents.ev_charging`; this module only wires it to the protocol.

The scripted agent (no language model) solves every case with one of the direct baselines
(:data:`STRATEGIES`): it reads the charging history with ``inspect_case``, computes the previous
two-year change with ``calculate`` where its rule needs it, and submits citing those calls, so
its scores equal :func:`citycube.tasks.ev_charging.baseline_scores` exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from citycube.agents.ev_charging import EV_TOOLS, UNCOUNTED, EvSession, load_ev_cases
from citycube.agents.session import CaseRun, validate_run_name
from citycube.errors import AgentCaseError
from citycube.tasks.ev_charging import BASELINES, RANGES, EvFiles, range_of
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

STRATEGIES: tuple[str, ...] = BASELINES
"""The scripted agent's rules: the task's direct baselines."""
SCORE_TABLE = "ev_agent_scores"
"""The table of this task's run scores a release publishes (what ``agents show`` prints)."""
INSTRUCTIONS = (
    "EV charging-site planning. Forecast the net change in publicly available EV charging "
    "ports in one 2 km x 2 km tile from t-2 to t (two years) and choose one of the supplied "
    "ranges A-D for ports(t) - ports(t-2). Call list_cases, then start_case. Use inspect_case "
    "for the charging history at t-4, t-3 and t-2. Use list_modalities and list_assets to "
    "discover historical data through t-2; inspect tables (read_table), rasters "
    "(describe_raster, view_raster) and baseline records (inspect_baseline), and use "
    "calculate for arithmetic. Each time unit is one year; calendar years are hidden. Ports "
    "count vehicles that can charge simultaneously (Level 1, Level 2 and DC fast), whereas "
    "stations are separate counts. Option A includes zero or negative growth. Missing values "
    "are unknown, not zero. Cite only evidence_id values your calls returned. Call "
    "submit_forecast with the range, confidence (0-1), a concise explanation, a reason for "
    "each range A-D, evidence ids and limitations. A successful submission ends the case."
)
"""AgenticCity-Bench App. D's EV task prompt, with the case tools added."""
CUBE_TOOL_DOCS = CubeToolDocs(
    list_assets="Table, raster and baseline assets of the case, with fields and periods.",
    read_table=(
        "Rows of a table asset (default: the case's tile, every field, periods through t-2)."
    ),
    describe_raster="Bands, shape and per-band statistics of a raster asset at a period (<= -2).",
    view_raster="A PNG preview of a raster asset at a period (<= -2).",
)
"""What the EV server's clients read of the cube-asset tools (periods up to t-2)."""


class EvRun(CaseRun):
    """A run of one agent over a release's EV cases, one case open at a time."""

    def __init__(self, release: Release, run_dir: Path, agent: str) -> None:
        import duckdb

        from citycube.catalogue.modalities import load_catalogue

        files = EvFiles.published(release)
        self.cases = load_ev_cases(files.root)
        self.stations = files.stations
        self.release_root = release.root
        self.catalogue = load_catalogue()
        self.con = duckdb.connect(str(release.duckdb_file), read_only=True)
        self.run_dir = run_dir
        self.session: EvSession | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        from citycube.io.atomic import write_text_atomic

        record = {
            "run": run_dir.name,
            "agent": agent,
            "task": "ev_charging",
            "tools": list(EV_TOOLS),
            "release": release.version,
        }
        write_text_atomic(json.dumps(record, indent=2) + "\n", run_dir / "run.json")

    def case_keys(self) -> list[str]:
        """The cases this run may open, in key order."""
        return sorted(self.cases)

    def start_case(self, case_key: str) -> dict[str, Any]:
        """Open a case (closing the one open) and return its message."""
        if case_key not in self.cases:
            raise AgentCaseError(f"no EV case {case_key!r}: take keys from list_cases")
        if self.session is not None:
            self.session.close()
        case = self.cases[case_key]
        self.session = EvSession(
            case,
            self.con,
            self.catalogue,
            self.release_root,
            self.stations,
            self.run_dir / "cases" / case_key,
        )
        return case.message()


def case_count(release: Release) -> int:
    """How many cases the release publishes (0 when it has none)."""
    from citycube.tasks.ev_charging import EvFiles

    path = EvFiles.published(release).cases
    return pq.read_metadata(path).num_rows if path.exists() else 0


def open_run(release: Release, run_dir: Path, *, agent: str) -> EvRun:
    """An :class:`EvRun` over the published release, writing into ``run_dir``."""
    if not release.duckdb_file.exists():
        raise AgentCaseError(
            f"no published cube at {release.duckdb_file}: build a release first (make run)"
        )
    validate_run_name(run_dir.name)
    return EvRun(release, run_dir, agent)


def build_server(run: EvRun) -> MCPServer:
    """An MCP server with the case tools and App. D's nine EV tools."""
    server = new_server("citycube-ev-charging", INSTRUCTIONS)

    def inspect_case() -> str:
        """The case, the question and the charging history at t-4, t-3 and t-2."""
        return result_text(run.call("inspect_case"))

    def list_modalities() -> str:
        """Modalities with data through t-2 for the case, and whether table or raster."""
        return result_text(run.call("list_modalities"))

    def inspect_baseline() -> str:
        """The station records behind the t-2 count of the case's tile."""
        return result_text(run.call("inspect_baseline"))

    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / // % **, min, max, abs, round, ...)."""
        return result_text(run.call("calculate", {"expression": expression}))

    def submit_forecast(
        range: str,
        confidence: float,
        explanation: str,
        range_reasons: dict[str, str],
        evidence_ids: list[str],
        limitations: str,
    ) -> str:
        """Submit the range A-D with confidence, explanation, a reason per range, evidence
        ids and limitations; a valid submission ends the case."""
        args = {
            "range": range,
            "confidence": confidence,
            "explanation": explanation,
            "range_reasons": range_reasons,
            "evidence_ids": evidence_ids,
            "limitations": limitations,
        }
        return result_text(run.call("submit_forecast", args))

    add_case_tools(
        server,
        run,
        "Keys of the EV cases this server serves.",
        "Open a case and return its message (city, tile, ranges A-D).",
    )
    add_tools(server, inspect_case, list_modalities)
    add_cube_tools(server, run, CUBE_TOOL_DOCS)
    add_tools(server, inspect_baseline, calculate, submit_forecast)
    return server


async def scripted_agent(client: Any, strategy: str) -> int:
    """Solve every case the connected server offers with one baseline rule; cases answered.

    ``constant_A`` reads the case and answers A; ``recent_change`` computes
    ports(t−2) − ports(t−4) with ``calculate`` and answers that change's range (A where
    t−4's count is unknown), as :func:`citycube.tasks.ev_charging.baseline_predictions` does.
    """
    if strategy not in STRATEGIES:
        raise AgentCaseError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    keys = result_json(await client.call_tool("list_cases", {}))["cases"]
    answered = 0
    for key in keys:
        message = result_json(await client.call_tool("start_case", {"case_key": key}))
        case = result_json(await client.call_tool("inspect_case", {}))
        evidence = [case["evidence_id"]]
        history = {h["period"]: h["ports"] for h in case["charging_history"]}
        if strategy == "constant_A":
            label = "A"
            explanation = "constant-class baseline: always the no-growth range A"
        else:
            old, new = history[-4], history[-2]
            if old is None:
                label = "A"
                explanation = "the count at t-4 is unknown; no trend to carry forward: range A"
            else:
                calc = result_json(
                    await client.call_tool("calculate", {"expression": f"{new} - {old}"})
                )
                evidence.append(calc["evidence_id"])
                change = int(calc["value"])
                label = range_of(message["city"], change)
                explanation = f"the previous two-year change {change} carried forward"
        reasons = {
            r: ("chosen: " if r == label else "not chosen: ") + message["ranges"][r] for r in RANGES
        }
        result_json(
            await client.call_tool(
                "submit_forecast",
                {
                    "range": label,
                    "confidence": 0.25,
                    "explanation": explanation,
                    "range_reasons": reasons,
                    "evidence_ids": evidence,
                    "limitations": f"scripted {strategy} rule; no urban data used",
                },
            )
        )
        answered += 1
    return answered


def read_predictions(run_dir: Path) -> dict[str, str]:
    """Case key → submitted range of one run folder."""
    out = {}
    for path in sorted((run_dir / "cases").glob("*/submission.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        out[record["case_key"]] = record["range"]
    return out


CALL_COUNT_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("case_key", pa.string()),
        ("tool_calls", pa.int64()),
        ("failed_calls", pa.int64()),
        ("submitted", pa.bool_()),
        ("range", pa.string()),
    ]
)
"""``ev_agent_runs``: one row per run and case."""


def score_runs(release: Release, run_dirs: Sequence[Path]) -> dict[str, pa.Table]:
    """``ev_agent_runs`` and ``ev_agent_scores`` of some run folders; a run must have
    answered every case to be scored."""
    from citycube.agents.trajectory import read_trajectory
    from citycube.tasks.ev_charging import SCORE_SCHEMA, score_table

    references = pq.read_table(EvFiles.published(release).references)
    keys = references.column("case_key").to_pylist()
    rows: dict[str, list[Any]] = {f.name: [] for f in CALL_COUNT_SCHEMA}
    scores = []
    for run_dir in run_dirs:
        predicted = read_predictions(run_dir)
        for key in keys:
            path = run_dir / "cases" / key / "trajectory.jsonl"
            calls = read_trajectory(path) if path.exists() else []
            counted = [c for c in calls if c["tool"] not in UNCOUNTED]
            rows["run"].append(run_dir.name)
            rows["case_key"].append(key)
            rows["tool_calls"].append(len(counted))
            rows["failed_calls"].append(sum(1 for c in counted if not c["ok"]))
            rows["submitted"].append(key in predicted)
            rows["range"].append(predicted.get(key))
        answered = {k: predicted.get(k, "none") for k in keys}
        scores.append(_score(references, run_dir.name, answered, score_table))
    table = pa.concat_tables([SCORE_SCHEMA.empty_table(), *scores])
    return {"ev_agent_runs": pa.table(rows, schema=CALL_COUNT_SCHEMA), SCORE_TABLE: table}


def _score(references: pa.Table, name: str, predicted: dict[str, str], score_table: Any) -> Any:
    """One run's scores; a missing answer is a fifth label that matches no reference."""
    valid = {k: v for k, v in predicted.items() if v in RANGES}
    if len(valid) < len(predicted):
        missing = sorted(set(predicted) - set(valid))
        raise AgentCaseError(
            f"run {name} left {len(missing)} cases unanswered ({missing[:3]}): score complete "
            "runs only"
        )
    return score_table(references, {name: valid})
