"""Scoring agent runs: their submissions against the held-out references, and their tool use.

A run folder (:class:`citycube.agents.tools.AgentRun`) holds ``run.json`` and per case a
trajectory and, when the agent answered validly, a submission. Three tables come out of it,
each row carrying the run, the release id and the catalogue digest:

* ``agent_runs``: one row per case of the release, with the submission (or none) and its calls;
* ``agent_tool_calls``: one row per logged call;
* ``agent_scores``: MAE, MAPE, RMSE and R² with the forecasting track's block-bootstrap
  intervals (:func:`citycube.tasks.forecast.score_cases`, on the cases the run answered), plus
  tool-call statistics counted as AgenticCity-Bench App. 10.4.1 counts them (every call,
  failed ones included, the submission left out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from citycube.agents.tools import UNCOUNTED
from citycube.agents.trajectory import read_trajectory
from citycube.errors import AgentCaseError
from citycube.tasks.forecast import (
    BOOTSTRAP_REPLICATES,
    BOOTSTRAP_SEED,
    SCORE_SCHEMA,
    score_cases,
)

RUN_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("agent", pa.string()),
        ("profile", pa.string()),
        ("release", pa.string()),
        ("catalogue_digest", pa.string()),
        ("case_key", pa.string()),
        ("target", pa.string()),
        ("city", pa.string()),
        ("submitted", pa.bool_()),
        ("prediction", pa.float64()),
        ("unit", pa.string()),
        ("modalities_used", pa.list_(pa.string())),
        ("modules_used", pa.list_(pa.string())),
        ("tool_calls", pa.int64()),
        ("failed_calls", pa.int64()),
    ]
)
"""``agent_runs``: one row per run and case of the release."""

CALL_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("release", pa.string()),
        ("catalogue_digest", pa.string()),
        ("case_key", pa.string()),
        ("seq", pa.int64()),
        ("tool", pa.string()),
        ("arguments", pa.string()),
        ("evidence_id", pa.string()),
        ("ok", pa.bool_()),
        ("error", pa.string()),
        ("result_digest", pa.string()),
        ("duration_ms", pa.float64()),
        ("counted", pa.bool_()),
    ]
)
"""``agent_tool_calls``: one row per logged call (``counted``: not the submission)."""

AGENT_SCORE_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("release", pa.string()),
        ("catalogue_digest", pa.string()),
        *(f for f in SCORE_SCHEMA if f.name != "method"),  # the forecasting track's score rows
        ("submitted", pa.int64()),
    ]
)
"""``agent_scores``: forecast metrics and tool-call statistics per run, target and group."""


def read_run(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of a run folder, or a clear error."""
    path = run_dir / "run.json"
    if not path.exists():
        raise AgentCaseError(f"{run_dir} is not an agent run (no run.json): run an agent first")
    return json.loads(path.read_text(encoding="utf-8"))


def _identity(record: dict[str, Any]) -> dict[str, Any]:
    """The columns every row of a run carries: the run, the release and the catalogue digest."""
    return {k: record[k] for k in ("run", "release", "catalogue_digest")}


def run_tables(
    run_dir: Path, references: pa.Table
) -> tuple[dict[str, Any], pa.Table, pa.Table, dict[str, float]]:
    """(run record, ``agent_runs`` rows, ``agent_tool_calls`` rows, predictions by case key)."""
    record = read_run(run_dir)
    common = _identity(record)
    runs: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    predictions: dict[str, float] = {}
    for ref in references.select(["case_key", "target", "city"]).to_pylist():
        case_dir = run_dir / "cases" / ref["case_key"]
        lines = read_trajectory(case_dir / "trajectory.jsonl") if case_dir.exists() else []
        for line in lines:
            calls.append(
                {
                    **common,
                    "case_key": ref["case_key"],
                    "seq": line["seq"],
                    "tool": line["tool"],
                    "arguments": json.dumps(line["arguments"], sort_keys=True),
                    "evidence_id": line["evidence_id"],
                    "ok": line["ok"],
                    "error": line["error"],
                    "result_digest": line["result_digest"],
                    "duration_ms": line["duration_ms"],
                    "counted": line["tool"] not in UNCOUNTED,
                }
            )
        sub_path = case_dir / "submission.json"
        sub = json.loads(sub_path.read_text(encoding="utf-8")) if sub_path.exists() else None
        if sub is not None:
            predictions[ref["case_key"]] = float(sub["prediction"])
        counted = [line for line in lines if line["tool"] not in UNCOUNTED]
        runs.append(
            {
                **common,
                "agent": record["agent"],
                "profile": record["profile"],
                "case_key": ref["case_key"],
                "target": ref["target"],
                "city": ref["city"],
                "submitted": sub is not None,
                "prediction": None if sub is None else float(sub["prediction"]),
                "unit": None if sub is None else sub["unit"],
                "modalities_used": None if sub is None else sub["modalities_used"],
                "modules_used": None if sub is None else sub["modules_used"],
                "tool_calls": len(counted),
                "failed_calls": sum(1 for line in counted if not line["ok"]),
            }
        )
    return (
        record,
        pa.Table.from_pylist(runs, schema=RUN_SCHEMA),
        pa.Table.from_pylist(calls, schema=CALL_SCHEMA),
        predictions,
    )


def _call_stats(runs: pa.Table, target: str) -> list[dict[str, Any]]:
    rows = [r for r in runs.to_pylist() if r["target"] == target and r["submitted"]]
    counts = np.array([r["tool_calls"] for r in rows], dtype=np.float64)
    if counts.size == 0:
        return []
    stats = {
        "tool_calls_per_case": float(counts.mean()),
        "tool_calls_median": float(np.median(counts)),
        "failed_calls_per_case": float(np.mean([r["failed_calls"] for r in rows])),
    }
    return [
        {"metric": m, "value": v, "ci_low": None, "ci_high": None, "unit": "calls"}
        for m, v in stats.items()
    ]


def score_run(
    run_dir: Path,
    references: pa.Table,
    *,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(``agent_runs``, ``agent_tool_calls``, ``agent_scores``) of one run folder.

    Each target is scored on the cases the run answered validly (``submitted`` says how many
    of the target's cases that is): an unanswered case has no prediction to score.
    """
    record, runs, calls, predictions = run_tables(run_dir, references)
    answered = pa.array([k in predictions for k in references["case_key"].to_pylist()])
    scores = score_cases(
        references.filter(answered),
        {record["run"]: predictions},
        replicates=replicates,
        seed=seed,
    )
    common = _identity(record)
    rows: list[dict[str, Any]] = []
    submitted = {
        t: sum(1 for r in runs.to_pylist() if r["target"] == t and r["submitted"])
        for t in set(runs["target"].to_pylist())
    }
    for r in scores.to_pylist():
        rows.append(
            {
                **common,
                **{k: r[k] for k in ("target", "group", "metric", "value", "ci_low", "ci_high")},
                "unit": r["unit"],
                "cases": r["cases"],
                "blocks": r["blocks"],
                "submitted": submitted.get(r["target"], 0),
            }
        )
    for target in sorted(submitted):
        for stat in _call_stats(runs, target):
            rows.append(
                {
                    **common,
                    "target": target,
                    "group": "all",
                    **stat,
                    "cases": submitted[target],
                    "blocks": None,
                    "submitted": submitted[target],
                }
            )
    return runs, calls, pa.Table.from_pylist(rows, schema=AGENT_SCORE_SCHEMA)


def concat(tables: Iterable[pa.Table], schema: pa.Schema) -> pa.Table:
    """Tables of one schema as one (an empty one of ``schema`` when there are none)."""
    tables = list(tables)
    return pa.concat_tables(tables) if tables else schema.empty_table()
