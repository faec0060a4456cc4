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

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from citycube.agents import calculator
from citycube.agents.calculator import Wording
from citycube.agents.cases import GuardedView, hide_years, load_case_file
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
    out = load_case_file(
        files.cases,
        lambda row: SchoolCase(
            case_key=row["case_key"],
            city=row["city"],
            tile_id=row["tile_id"],
            school_name=row["school_name"],
            phase=row["phase"],
            enrollment=tuple(int(v) for v in row["enrollment"]),
            capacity=tuple(int(v) for v in row["capacity"]),
        ),
        SchoolCasesError(
            f"no school capacity cases in {folder}: build a release whose scope includes "
            "London (e.g. make run CITIES=London YEARS=2021-2024)"
        ),
    )
    if not out:
        manifest = json.loads(files.manifest.read_text(encoding="utf-8"))
        raise SchoolCasesError(f"the release has no school capacity cases: {manifest['note']}")
    return out


GUARD = "city = ? AND year BETWEEN ? AND ? AND (source_year IS NULL OR source_year <= ?)"
"""What every urban query is limited to: the case's city, years up to period 0, products of
period 0 or earlier."""


class UrbanView(GuardedView):
    """The cube's urban data a school case may read, with periods for years."""

    guard_sql = GUARD

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        case: SchoolCase,
        shared: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(con, case)
        self.shared = {} if shared is None else shared  # city-wide results kept across cases

    def guard(self) -> list[Any]:
        """Parameters of :data:`GUARD`."""
        return [self.case.city, CUTOFF_YEAR - URBAN_PERIODS + 1, CUTOFF_YEAR, CUTOFF_YEAR]

    def years(self, periods: Iterable[int] | None) -> list[int]:
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

    def check_tiles(self, tiles: Sequence[str] | None) -> list[str]:
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
        return self._observations(modality, tiles, fields, periods)


# ------------------------------------------------------------------------------ calculate

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
"""Functions ``calculate`` knows."""
WORDING = Wording(
    example="(637+724+753)/3",
    unparsable="calculate: {expression!r} is not an expression ({reason})",
    exponent="calculate: exponents above {limit} are not evaluated",
    not_allowed="calculate: {source!r} is not allowed (numbers, + - * / // % **, parentheses "
    "and {functions})",
    failed="calculate: {expression!r} cannot be evaluated ({error})",
    not_finite="calculate: {expression!r} is not a finite number",
)
"""The school task's ``calculate`` errors."""


def calculate(expression: Any) -> float:
    """The value of an arithmetic expression: numbers, + − × ÷ // % **, parentheses and
    abs, min, max, round, ceil, floor, sqrt, sum, mean. Nothing else is evaluated."""
    return calculator.evaluate(expression, functions=_FUNCTIONS, max_exponent=64, wording=WORDING)


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
        return hide_years(band, self.case)

    def _raster_facts(self, spec: Any, chip: Any, values: np.ndarray) -> dict[str, Any]:
        facts = super()._raster_facts(spec, chip, values)
        source_period = facts.pop("source_period")
        return {**facts, "source_period": source_period}  # listed last

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
