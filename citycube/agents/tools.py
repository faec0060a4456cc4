"""The forecasting tools of one case (AgenticCity-Bench App. D) and the run that serves them.

Every tool is a method of :class:`CaseSession`; the shared :class:`ToolSession` numbers each
call, gives it a citable evidence id, logs it to the case's trajectory and returns a result
that is a function of the release, the case and the arguments only (no clock, no random
state), so a recorded run replays call for call. The tools read a :class:`CaseView` (periods
−10…−1, no calendar year, no reference) and write only into the case's workspace.

Two profiles: ``forecast`` (App. D's tool names) and ``analysis``, which adds the trend,
summary-statistics and time-series-diagnostics tools that Earth-Agent's adapter gives.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from citycube.agents import analysis
from citycube.agents.cases import Case, CaseView, hide_years
from citycube.agents.cube_tools import CubeAssetTools, parse_asset_id
from citycube.agents.session import (
    CaseRun,
    ToolResult,
    ToolSession,
    workspace_file,
)
from citycube.agents.submission import Submission, validate_submission
from citycube.agents.trajectory import canonical_json, read_trajectory
from citycube.errors import AgentCaseError, CityCubeError

if TYPE_CHECKING:
    import duckdb

    from citycube.catalogue.modalities import Catalogue

FORECAST_TOOLS = (
    "get_history",
    "list_assets",
    "read_table",
    "describe_raster",
    "view_raster",
    "materialize_asset",
    "submit_answer",
)
"""App. D's forecasting tools (``submit_answer`` takes the JSON answer)."""
ANALYSIS_TOOLS = ("trend_estimate", "summary_statistics", "time_series_diagnostics")
"""Earth-Agent-style analysis tools of the second profile."""
PROFILES: dict[str, tuple[str, ...]] = {
    "forecast": FORECAST_TOOLS,
    "analysis": FORECAST_TOOLS + ANALYSIS_TOOLS,
}
"""Tool profiles by name."""
UNCOUNTED = ("submit_answer",)
"""Calls not counted as tool use (App. 10.4.1 leaves the submission out)."""


class CaseSession(CubeAssetTools, ToolSession):
    """One forecasting case being solved: the profile's tools over a :class:`CaseView`."""

    def __init__(
        self,
        view: CaseView,
        catalogue: Catalogue,
        release_root: Path,
        case_dir: Path,
        profile: str = "analysis",
    ) -> None:
        if profile not in PROFILES:
            raise AgentCaseError(f"unknown tool profile {profile!r}: one of {', '.join(PROFILES)}")
        super().__init__(case_dir, PROFILES[profile], profile)
        self.view = view
        self.case = view.case
        self.catalogue = catalogue
        self.release_root = release_root
        self.submission: Submission | None = None

    # ------------------------------------------------------------------ forecast profile

    def _tool_get_history(self, evidence: str) -> ToolResult:
        case = self.case
        return ToolResult(
            {
                "evidence_id": evidence,
                "case": case.message(),
                "periods": list(range(-len(case.history), 0)),
                "values": list(case.history),
                "unit": case.unit,
            }
        )

    def _tool_list_assets(self, evidence: str) -> ToolResult:
        view, tile = self.view, self.case.tile_id
        return ToolResult(
            {
                "evidence_id": evidence,
                "case": self.case.message(),
                "assets": self._cube_assets(),
                "neighbour_tiles": neighbours(tile, view.tiles),
                "city_tiles": len(view.tiles),
            }
        )

    def _band_name(self, band: str) -> str | None:
        return hide_years(band, self.case)

    def _tool_materialize_asset(
        self,
        evidence: str,
        asset_id: str,
        name: str | None = None,
        period: int | None = None,
        tiles: Sequence[str] | None = None,
    ) -> ToolResult:
        from citycube.io.atomic import atomic_path
        from citycube.io.digest import file_sha256

        modality, kind = parse_asset_id(asset_id)
        if kind == "table":
            path = workspace_file(
                self.workspace, f"{modality}_table" if name is None else name, ".csv"
            )
            rows = self.view.rows(modality, tiles)
            columns = list(rows[0]) if rows else ["tile_id", "period", "field", "value"]
            with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
                f.write(",".join(columns) + "\n")
                for row in rows:
                    f.write(",".join(_csv_cell(row.get(c)) for c in columns) + "\n")
            extra: dict[str, Any] = {"rows": len(rows), "columns": columns}
        else:
            if period is None:
                raise AgentCaseError("materialize_asset of a raster needs its period")
            default = f"{modality}_raster_period{int(period)}"
            path = workspace_file(self.workspace, default if name is None else name, ".npy")
            _spec, _chip, bands, values, valid = self._raster(asset_id, int(period), None)
            data = np.where(valid[None], values.astype(np.float32), np.float32(np.nan))
            with atomic_path(path) as tmp, tmp.open("wb") as f:
                np.save(f, data, allow_pickle=False)
            extra = {"bands": bands, "shape": list(data.shape), "invalid": "NaN"}
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "path": path.name,
                "workspace_path": str(path),
                "bytes": path.stat().st_size,
                "sha256": file_sha256(path),
                **extra,
            }
        )

    def _tool_submit_answer(
        self,
        evidence: str,
        prediction: Any = None,
        unit: Any = None,
        reason: Any = None,
        modalities_used: Any = None,
        modules_used: Any = None,
        **extra: Any,
    ) -> ToolResult:
        from citycube.io.atomic import write_text_atomic

        given = {
            "prediction": prediction,
            "unit": unit,
            "reason": reason,
            "modalities_used": modalities_used,
            "modules_used": modules_used,
            **extra,
        }
        answer = {k: v for k, v in given.items() if v is not None or k in extra}
        called = self.called(UNCOUNTED)
        submission = validate_submission(
            answer,
            unit=self.case.unit,
            modalities=self.view.modalities(),
            tools_called=called,
        )
        record = {"case_key": self.case.case_key, "evidence_id": evidence, **submission.to_json()}
        write_text_atomic(canonical_json(record) + "\n", self.case_dir / "submission.json")
        self.submission = submission
        return ToolResult({"evidence_id": evidence, "accepted": True, "case_ended": True})

    # ------------------------------------------------------------------ analysis profile

    def _tool_trend_estimate(
        self, evidence: str, values: Sequence[Any], periods: Sequence[Any] | None = None
    ) -> ToolResult:
        return ToolResult({"evidence_id": evidence, **analysis.trend_estimate(values, periods)})

    def _tool_summary_statistics(self, evidence: str, values: Sequence[Any]) -> ToolResult:
        return ToolResult({"evidence_id": evidence, **analysis.summary_statistics(values)})

    def _tool_time_series_diagnostics(self, evidence: str, values: Sequence[Any]) -> ToolResult:
        return ToolResult({"evidence_id": evidence, **analysis.time_series_diagnostics(values)})


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if any(ch in text for ch in ',"\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


TILE_PATTERN = re.compile(r"(?P<prefix>.+)_r(?P<row>[0-9]+)_c(?P<col>[0-9]+)")


def neighbours(tile: str, tiles: Sequence[str]) -> list[str]:
    """The (up to eight) tiles around ``tile`` at its scale that the city has."""
    m = TILE_PATTERN.fullmatch(tile)
    if m is None:
        return []
    known = set(tiles)
    r, c = int(m["row"]), int(m["col"])
    out = []
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            other = f"{m['prefix']}_r{r + dr}_c{c + dc}"
            if (dr or dc) and other in known:
                out.append(other)
    return out


# ------------------------------------------------------------------------------ runs


class AgentRun(CaseRun):
    """A run of one agent over a release's cases: one case open at a time, each in its own
    folder (``cases/<case_key>/``: trajectory, submission, workspace) under ``run_dir``. The
    run takes over ``con``: closing the run closes it."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        cases: Mapping[str, Case],
        catalogue: Catalogue,
        release_root: Path,
        run_dir: Path,
        *,
        profile: str = "analysis",
        agent: str = "unnamed",
        allowed: Sequence[str] | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise AgentCaseError(f"unknown tool profile {profile!r}: one of {', '.join(PROFILES)}")
        self.con = con
        self.cases = dict(cases)
        self.catalogue = catalogue
        self.release_root = release_root
        self.run_dir = run_dir
        self.profile = profile
        self.allowed = set(allowed) if allowed else None
        self.session: CaseSession | None = None
        release = dict(con.execute("SELECT key, value FROM release").fetchall())
        self.release_id = json.loads(release.get("version", "null"))
        self.catalogue_digest = json.loads(release.get("catalogue_digest", "null"))
        run_dir.mkdir(parents=True, exist_ok=True)
        from citycube.io.atomic import write_text_atomic

        record = {
            "run": run_dir.name,
            "agent": agent,
            "profile": profile,
            "tools": list(PROFILES[profile]),
            "release": self.release_id,
            "catalogue_digest": self.catalogue_digest,
        }
        write_text_atomic(json.dumps(record, indent=2) + "\n", run_dir / "run.json")

    def case_keys(self) -> list[str]:
        """The cases this run may open, in key order."""
        return sorted(k for k in self.cases if self.allowed is None or k in self.allowed)

    def start_case(self, case_key: str) -> dict[str, Any]:
        """Open a case (closing the one open) and return its case message."""
        if case_key not in self.case_keys():
            raise AgentCaseError(
                f"no case {case_key!r} in this run: take case keys from list_cases"
            )
        self.end_case()
        case = self.cases[case_key]
        view = CaseView(self.con, case)
        case_dir = self.run_dir / "cases" / case_key
        self.session = CaseSession(view, self.catalogue, self.release_root, case_dir, self.profile)
        return case.message()


# ------------------------------------------------------------------------------ replay


def replay_case(run: AgentRun, case_key: str, recorded: Sequence[dict[str, Any]]) -> list[dict]:
    """Issue a recorded trajectory's calls again on ``run`` (offline, no MCP) and return the
    new trajectory's lines; equal to ``recorded`` but for timing when the tools are
    deterministic for the release and the case. The case is ended, the run left open."""
    run.start_case(case_key)
    for line in recorded:
        # a recorded failure must fail again: the lines compare its message's digest
        with contextlib.suppress(CityCubeError):
            run.call(line["tool"], line["arguments"])
    session = run.session
    assert session is not None
    run.end_case()
    return read_trajectory(session.case_dir / "trajectory.jsonl")
