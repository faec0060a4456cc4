"""The school capacity planning tools of one case (AgenticCity-Bench App. D) and the run that
serves them.

Eight tools: ``read_school_history`` (enrollment and capacity at periods −2, −1, 0),
``list_modalities`` and ``list_assets`` (the cube's urban data for the school's city and tile),
``read_table``, ``describe_raster`` and ``view_raster`` (urban asset inspection), ``calculate``
(arithmetic) and ``submit_plan`` (predicted_enrollment and added_seats ≥ 0).

Period 0 is academic year 2023/24; the cube's urban data are served up to its first calendar
year (2023, period 0) and only from products of that year or earlier, with calendar years
replaced by periods in every text. The school's URN, the years and the target-year enrollment
never reach a tool.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from citycube.agents.cases import YEAR_PATTERN, observation_query
from citycube.agents.cube_tools import CubeAssetTools
from citycube.agents.session import CaseRun, ToolResult, ToolSession
from citycube.agents.trajectory import canonical_json
from citycube.errors import AgentCaseError, SchoolCasesError, SchoolPlanError
from citycube.tasks.school_capacity import HISTORY_YEARS, SchoolFiles

if TYPE_CHECKING:
    import duckdb

    from citycube.catalogue.modalities import Catalogue
    from citycube.cube.release import Release

SCHOOL_TOOLS = (
    "read_school_history",
    "list_modalities",
    "list_assets",
    "read_table",
    "describe_raster",
    "view_raster",
    "calculate",
    "submit_plan",
)
"""App. D's eight school-capacity tools."""
UNCOUNTED = ("submit_plan",)
"""Calls not counted as tool use (the submission)."""
PERIODS = (-2, -1, 0)
"""The school history's periods."""
CUTOFF_YEAR = HISTORY_YEARS[-1]
"""The last calendar year of urban data a case may see (period 0): server side only."""
URBAN_PERIODS = 10
"""Urban data reach back this many years before period 0."""
SOURCE_LABEL = "Department for Education, School capacity (school level)"
"""How the history's source is named; a synthetic reference says so."""
EVIDENCE = re.compile(r"evidence-[0-9]{4,}")
"""An evidence id, alone or followed by ``/asset_id``."""


@dataclass(frozen=True)
class SchoolCase:
    """One school case as published (no URN, no year, no target)."""

    case_key: str
    city: str
    tile_id: str
    school_name: str
    phase: str
    enrollment: tuple[int, ...]
    capacity: tuple[int, ...]

    def message(self) -> dict[str, Any]:
        """The case message an agent starts from."""
        return {
            "case_key": self.case_key,
            "city": self.city,
            "tile_id": self.tile_id,
            "school_name": self.school_name,
            "phase": self.phase,
            "history_periods": list(PERIODS),
            "planning_period": 1,
            "task": "forecast period +1 enrollment and choose added_seats >= 0 so that it is "
            "95%-105% of planned capacity (period-0 capacity plus added seats)",
        }

    def period(self, year: int) -> int:
        """The relative period of a calendar year (server side)."""
        return int(year) - CUTOFF_YEAR


def load_school_cases(folder: Path) -> dict[str, SchoolCase]:
    """The school cases of a benchmark folder, by key (the held-out file is not opened)."""
    files = SchoolFiles(folder)
    if not files.cases.exists():
        raise SchoolCasesError(
            f"no school capacity cases in {folder}: build a release whose scope includes "
            "London (e.g. make run CITIES=London YEARS=2021-2024)"
        )
    out = {}
    for row in pq.read_table(files.cases).to_pylist():
        out[row["case_key"]] = SchoolCase(
            case_key=row["case_key"],
            city=row["city"],
            tile_id=row["tile_id"],
            school_name=row["school_name"],
            phase=row["phase"],
            enrollment=tuple(int(v) for v in row["enrollment"]),
            capacity=tuple(int(v) for v in row["capacity"]),
        )
    if not out:
        manifest = json.loads(files.manifest.read_text(encoding="utf-8"))
        raise SchoolCasesError(f"the release has no school capacity cases: {manifest['note']}")
    return out


def hide_years(text: str | None) -> str | None:
    """``text`` with every calendar year replaced by its period."""
    if text is None:
        return None
    return YEAR_PATTERN.sub(lambda m: f"period {int(m.group(1)) - CUTOFF_YEAR}", text)


GUARD = "city = ? AND year BETWEEN ? AND ? AND (source_year IS NULL OR source_year <= ?)"
"""What every urban query is limited to: the case's city, years up to period 0, products of
period 0 or earlier."""


class UrbanView:
    """The cube's urban data a school case may read, with periods for years."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        case: SchoolCase,
        shared: dict[str, Any] | None = None,
    ) -> None:
        self.con = con
        self.case = case
        self.shared = {} if shared is None else shared  # city-wide results kept across cases

    def guard(self) -> list[Any]:
        """Parameters of :data:`GUARD`."""
        return [self.case.city, CUTOFF_YEAR - URBAN_PERIODS + 1, CUTOFF_YEAR, CUTOFF_YEAR]

    def periods(self, periods: Sequence[int] | None) -> list[int]:
        """Years of ``periods`` (default all), or a clear error for a later one."""
        allowed = list(range(1 - URBAN_PERIODS, 1))
        if periods is None:
            return [CUTOFF_YEAR + p for p in allowed]
        asked = sorted({int(p) for p in periods})
        bad = [p for p in asked if p not in allowed]
        if bad:
            raise AgentCaseError(
                f"periods {bad} are outside the case's evidence: urban data run from period "
                f"{allowed[0]} to 0 (period +1 is what is planned for)"
            )
        return [CUTOFF_YEAR + p for p in asked]

    def tiles(self, tiles: Sequence[str] | None) -> list[str]:
        """``tiles`` (default the case's) after checking they are of the case's city."""
        if not tiles:
            return [self.case.tile_id]
        if isinstance(tiles, str) or not all(isinstance(t, str) for t in tiles):
            raise AgentCaseError("tiles must be a list of tile ids")
        prefix = f"{self.case.city}_"
        bad = [t for t in tiles if not t.startswith(prefix)]
        if bad:
            raise AgentCaseError(f"tiles {bad[:5]} are not tiles of {self.case.city}")
        return list(dict.fromkeys(tiles))

    def modalities(self) -> list[dict[str, Any]]:
        """Modalities with rows for the city before the cut-off, with their periods."""
        key = f"modalities:{self.case.city}"
        if key not in self.shared:
            found = self.con.execute(
                f"SELECT modality, list(DISTINCT year) FROM observations WHERE {GUARD} "
                "GROUP BY modality ORDER BY modality",
                self.guard(),
            ).fetchall()
            self.shared[key] = [
                {"modality": m, "periods": sorted(self.case.period(y) for y in years)}
                for m, years in found
            ]
        return [dict(m, periods=list(m["periods"])) for m in self.shared[key]]

    def rows(
        self,
        modality: str,
        tiles: Sequence[str] | None,
        fields: Sequence[str] | None,
        periods: Sequence[int] | None,
    ) -> list[dict[str, Any]]:
        """Observation rows of a modality (periods, not years)."""
        known = {m["modality"] for m in self.modalities()}
        if modality not in known:
            raise AgentCaseError(
                f"modality {modality!r} has no data for this case: list_modalities names them"
            )
        years, wanted = self.periods(periods), self.tiles(tiles)
        sql, params = observation_query(GUARD, self.guard(), modality, wanted, years, fields)
        out = []
        for (
            tile,
            scale,
            year,
            mod,
            fld,
            value,
            unit,
            vf,
            ok,
            reason,
            basis,
            sy,
            sid,
        ) in self.con.execute(sql, params).fetchall():
            out.append(
                {
                    "tile_id": tile,
                    "scale": scale,
                    "period": self.case.period(year),
                    "modality": mod,
                    "field": fld,
                    "value": None if value is None or not np.isfinite(value) else float(value),
                    "unit": hide_years(unit),
                    "valid_fraction": vf,
                    "available": bool(ok),
                    "reason": hide_years(reason),
                    "temporal_basis": basis,
                    "source_period": None if sy is None else self.case.period(sy),
                    "source": hide_years(sid),
                }
            )
        return out

    def table_assets(self) -> list[dict[str, Any]]:
        """Per modality of the case's tile: fields, units and periods with a value."""
        found = self.con.execute(
            f"SELECT modality, field, min(unit), list(DISTINCT year) FILTER (WHERE available) "
            f"FROM observations WHERE {GUARD} AND tile_id = ? GROUP BY modality, field "
            "ORDER BY modality, field",
            [*self.guard(), self.case.tile_id],
        ).fetchall()
        out: dict[str, dict[str, Any]] = {}
        for modality, fld, unit, years in found:
            entry = out.setdefault(modality, {"modality": modality, "fields": [], "periods": set()})
            entry["fields"].append({"field": fld, "unit": hide_years(unit)})
            entry["periods"].update(self.case.period(y) for y in years or [])
        return [{**e, "periods": sorted(e["periods"])} for e in out.values()]

    def chip_periods(self) -> dict[str, list[int]]:
        """Raster modalities of the case's tile and their periods."""
        out: dict[str, list[int]] = {}
        for mod, year in self.con.execute(
            f"SELECT modality, year FROM chip_index WHERE {GUARD} AND tile_id = ? "
            "ORDER BY modality, year",
            [*self.guard(), self.case.tile_id],
        ).fetchall():
            out.setdefault(mod, []).append(self.case.period(year))
        return out

    def chip(self, modality: str, period: int, tile: str | None) -> tuple[Any, ...]:
        """(store, row, col, height, width, resolution, valid fraction, available, source
        period) of one chip, or a clear error."""
        (year,) = self.periods([period])
        (tile_id,) = self.tiles([tile] if tile else None)
        found = self.con.execute(
            "SELECT store, row_off, col_off, height, width, resolution_m, valid_fraction, "
            f"available, source_year FROM chip_index WHERE {GUARD} AND modality = ? "
            "AND tile_id = ? AND year = ?",
            [*self.guard(), modality, tile_id, year],
        ).fetchone()
        if found is None:
            raise AgentCaseError(
                f"no {modality} raster of {tile_id} at period {int(period)}: list_assets names "
                "the raster assets and their periods"
            )
        return found


# ------------------------------------------------------------------------------ calculate

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "ceil": math.ceil,
    "floor": math.floor,
    "sqrt": math.sqrt,
    "sum": lambda *v: sum(v),
    "mean": lambda *v: sum(v) / len(v),
}
MAX_EXPRESSION = 500
"""Longest expression ``calculate`` accepts."""


def calculate(expression: Any) -> float:
    """The value of an arithmetic expression: numbers, + − × ÷ // % **, parentheses and
    abs, min, max, round, ceil, floor, sqrt, sum, mean. Nothing else is evaluated."""
    if not isinstance(expression, str) or not expression.strip():
        raise AgentCaseError("calculate needs an arithmetic expression, e.g. '(637+724+753)/3'")
    if len(expression) > MAX_EXPRESSION:
        raise AgentCaseError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise AgentCaseError(
            f"calculate: {expression!r} is not an expression ({exc.msg})"
        ) from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise AgentCaseError("calculate: exponents above 64 are not evaluated")
            return _BINARY[type(node.op)](left, right)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise AgentCaseError(
            f"calculate: {ast.unparse(node)!r} is not allowed (numbers, + - * / // % **, "
            f"parentheses and {', '.join(_FUNCTIONS)})"
        )

    try:
        value = float(ev(tree))
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
        raise AgentCaseError(f"calculate: {expression!r} cannot be evaluated ({exc})") from None
    if not math.isfinite(value):
        raise AgentCaseError(f"calculate: {expression!r} is not a finite number")
    return value


# ------------------------------------------------------------------------------ session


class SchoolSession(CubeAssetTools, ToolSession):
    """One school case being solved with the eight tools."""

    def __init__(
        self,
        case: SchoolCase,
        con: duckdb.DuckDBPyConnection,
        catalogue: Catalogue,
        release_root: Path,
        case_dir: Path,
        shared: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(case_dir, SCHOOL_TOOLS, "school_capacity")
        self.case = case
        self.view = UrbanView(con, case, shared)
        self.catalogue = catalogue
        self.release_root = release_root
        self.submission: dict[str, Any] | None = None

    def _tool_read_school_history(self, evidence: str) -> ToolResult:
        c = self.case
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": "school_history",
                "case": c.message(),
                "periods": list(PERIODS),
                "enrollment": list(c.enrollment),
                "capacity": list(c.capacity),
                "utilisation": [
                    round(e / k, 4) for e, k in zip(c.enrollment, c.capacity, strict=True)
                ],
                "units": {"enrollment": "pupils on roll", "capacity": "places"},
                "source": self.view.shared.get("source", SOURCE_LABEL),
            }
        )

    def _tool_list_modalities(self, evidence: str) -> ToolResult:
        out = []
        for entry in self.view.modalities():
            spec = self.catalogue.get(entry["modality"])
            out.append({**entry, "name": spec.name})
        return ToolResult({"evidence_id": evidence, "city": self.case.city, "modalities": out})

    def _tool_list_assets(self, evidence: str) -> ToolResult:
        return ToolResult(
            {
                "evidence_id": evidence,
                "tile_id": self.case.tile_id,
                "assets": self._cube_assets(),
                "note": "a 2 km tile is not the school's catchment",
            }
        )

    def _band_name(self, band: str) -> str | None:
        return hide_years(band)

    def _chip(self, modality: str, period: Any, tile_id: str | None) -> tuple[str, tuple, Any]:
        store, r, c, h, w, res, vf, ok, sy = self.view.chip(modality, int(period), tile_id)
        meta = {
            "resolution_m": float(res),
            "valid_fraction": float(vf),
            "available": bool(ok),
            "source_period": None if sy is None else self.case.period(sy),
        }
        return store, (r, c, h, w), meta

    def _raster_facts(self, spec: Any, chip: Any, values: np.ndarray) -> dict[str, Any]:
        return {"kind": spec.kind.value, "shape": [int(s) for s in values.shape], **chip}

    def _tool_calculate(self, evidence: str, expression: str) -> ToolResult:
        return ToolResult(
            {"evidence_id": evidence, "expression": expression, "value": calculate(expression)}
        )

    def _tool_submit_plan(
        self,
        evidence: str,
        predicted_enrollment: Any = None,
        added_seats: Any = None,
        evidence_ids: Any = None,
        reason: Any = None,
    ) -> ToolResult:
        from citycube.io.atomic import write_text_atomic

        plan = validate_plan(
            predicted_enrollment,
            added_seats,
            evidence_ids,
            reason,
            cited_ok={c.evidence_id for c in self.calls if c.ok and c.tool not in UNCOUNTED},
        )
        record = {"case_key": self.case.case_key, "evidence_id": evidence, **plan}
        write_text_atomic(canonical_json(record) + "\n", self.case_dir / "submission.json")
        self.submission = plan
        capacity = self.case.capacity[-1] + plan["added_seats"]
        return ToolResult(
            {
                "evidence_id": evidence,
                "accepted": True,
                "case_ended": True,
                "planned_capacity": capacity,
            }
        )


def validate_plan(
    predicted_enrollment: Any,
    added_seats: Any,
    evidence_ids: Any,
    reason: Any,
    *,
    cited_ok: set[str],
) -> dict[str, Any]:
    """The plan, or a :class:`SchoolPlanError` saying what to change."""
    problems = []
    if (
        isinstance(predicted_enrollment, bool)
        or not isinstance(predicted_enrollment, int | float)
        or not math.isfinite(predicted_enrollment)
        or predicted_enrollment < 0
    ):
        problems.append("predicted_enrollment must be a number of pupils >= 0")
    if isinstance(added_seats, float) and added_seats.is_integer():
        added_seats = int(added_seats)
    if isinstance(added_seats, bool) or not isinstance(added_seats, int) or added_seats < 0:
        problems.append("added_seats must be an integer >= 0 (reductions are unavailable)")
    ids: list[str] = []
    if not isinstance(evidence_ids, list) or not evidence_ids:
        problems.append("evidence_ids must list the evidence ids (evidence-NNNN) cited")
    else:
        for item in evidence_ids:
            m = EVIDENCE.match(item) if isinstance(item, str) else None
            if m is None:
                problems.append(f"{item!r} is not an evidence id (evidence-NNNN[/asset_id])")
            elif m.group(0) not in cited_ok:
                problems.append(f"{m.group(0)} is not a successful read of this case")
            else:
                ids.append(item)
    if not isinstance(reason, str) or not reason.strip():
        problems.append("reason must say how the forecast and the seats were chosen")
    if problems:
        raise SchoolPlanError("the plan was not accepted: " + "; ".join(problems))
    return {
        "predicted_enrollment": float(predicted_enrollment),
        "added_seats": int(added_seats),
        "evidence_ids": ids,
        "reason": reason.strip(),
    }


class SchoolRun(CaseRun):
    """A run of one agent over a release's school cases (``cases/<case_key>/`` per case)."""

    def __init__(self, release: Release, run_dir: Path, *, agent: str) -> None:
        import duckdb

        from citycube.agents.session import validate_run_name
        from citycube.catalogue.modalities import load_catalogue
        from citycube.io.atomic import write_text_atomic

        if not release.duckdb_file.exists():
            raise SchoolCasesError(
                f"no published cube at {release.duckdb_file}: build a release first"
            )
        validate_run_name(run_dir.name)
        self.cases = load_school_cases(SchoolFiles.published(release).root)
        self.catalogue = load_catalogue()
        self.release_root = release.root
        manifest = SchoolFiles.published(release).manifest
        provenance = json.loads(manifest.read_text(encoding="utf-8")).get("source", {})
        self.shared: dict[str, Any] = {
            "source": f"{SOURCE_LABEL}, SYNTHETIC sample twin"
            if provenance.get("synthetic", True)
            else SOURCE_LABEL
        }
        self.run_dir = run_dir
        self.session: SchoolSession | None = None
        self.con = duckdb.connect(str(release.duckdb_file), read_only=True)
        try:
            meta = dict(self.con.execute("SELECT key, value FROM release").fetchall())
            run_dir.mkdir(parents=True, exist_ok=True)
            record = {
                "run": run_dir.name,
                "agent": agent,
                "profile": "school_capacity",
                "tools": list(SCHOOL_TOOLS),
                "release": json.loads(meta.get("version", "null")),
                "catalogue_digest": json.loads(meta.get("catalogue_digest", "null")),
            }
            write_text_atomic(json.dumps(record, indent=2) + "\n", run_dir / "run.json")
        except BaseException:  # no run to close: give the connection back here
            self.con.close()
            raise

    def case_keys(self) -> list[str]:
        """The cases, in key order."""
        return sorted(self.cases)

    def start_case(self, case_key: str) -> dict[str, Any]:
        """Open a case (closing the one open) and return its message."""
        if case_key not in self.cases:
            raise AgentCaseError(f"no case {case_key!r} in this run: take keys from list_cases")
        self.end_case()
        case = self.cases[case_key]
        self.session = SchoolSession(
            case,
            self.con,
            self.catalogue,
            self.release_root,
            self.run_dir / "cases" / case_key,
            self.shared,
        )
        return case.message()
