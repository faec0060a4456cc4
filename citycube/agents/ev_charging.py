"""The EV charging expansion tools of one case (AgenticCity-Bench App. D, nine tools).

An agent sees one 2 km tile of Boston, New York City or San Francisco at t−4, t−3 and t−2
(one year apart; calendar years hidden) and picks one of four city-specific ranges A–D for the
net change in public charging ports from t−2 to t (two years). The tools:

``inspect_case`` (the case and its charging history at t−4, t−3, t−2), ``list_modalities``,
``list_assets``, ``read_table``, ``describe_raster``, ``view_raster``, ``inspect_baseline``
(the station records behind the t−2 count), ``calculate`` (arithmetic) and
``submit_forecast`` (range, confidence, explanation, a reason per range, evidence ids,
limitations).

**Leakage guard.** Time is counted from the target t (period −2 is t−2). Cube data are read
through the forecasting :class:`~citycube.agents.cases.CaseView` with the forecast origin put
at the year after t−2, so only years up to t−2's year, and only products whose source year is
before the origin, can be returned; periods −1 and 0 (t−1, t) are refused. The case files an
agent's tools open hold no reference (ports at t, change, range): those are in a separate file
the tools never read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from citycube.agents import calculator
from citycube.agents.calculator import Wording
from citycube.agents.cases import Case, CaseView, load_case_file
from citycube.agents.cube_tools import CubeAssetTools
from citycube.agents.session import ToolResult, ToolSession
from citycube.agents.trajectory import canonical_json
from citycube.errors import AgentCaseError, EvSubmissionError
from citycube.tasks.ev_charging import (
    CALENDAR_YEAR_OF_T_MINUS_2,
    HISTORY_PERIODS,
    RANGES,
    EvFiles,
)

if TYPE_CHECKING:
    import duckdb

    from citycube.catalogue.modalities import Catalogue

EV_TOOLS = (
    "inspect_case",
    "list_modalities",
    "list_assets",
    "read_table",
    "describe_raster",
    "view_raster",
    "inspect_baseline",
    "calculate",
    "submit_forecast",
)
"""App. D's nine EV charging tools."""
UNCOUNTED = ("submit_forecast",)
"""Calls not counted as tool use."""
ORIGIN_YEAR = CALENDAR_YEAR_OF_T_MINUS_2 + 1
"""The forecast origin the cube view is cut at: t−2's year is its period −1."""
EV_PERIODS = tuple(range(-11, -1))
"""Periods of cube data an agent may ask for (t−11 … t−2)."""
HISTORY_OFFSET = {"t-4": -4, "t-3": -3, "t-2": -2}
"""History label → period relative to t."""
QUESTION = (
    "Forecast the net change in publicly available EV charging ports in this 2 km x 2 km tile "
    "from t-2 to t (two years). Choose one of the supplied ranges A-D for ports(t) - "
    "ports(t-2). Option A includes zero or negative growth. Ports count vehicles that can "
    "charge simultaneously (Level 1, Level 2 and DC fast); stations are separate counts. "
    "Missing values are unknown, not zero."
)
"""The case question (App. D's EV prompt, its task part)."""
EVIDENCE_PATTERN = re.compile(r"evidence-[0-9]{4,}")
"""A citable evidence id."""


@dataclass(frozen=True)
class EvCase:
    """One EV case as its tools may show it (no reference)."""

    case_key: str
    city: str
    tile_id: str
    history: dict[str, dict[str, Any]]
    """Per t−4, t−3, t−2: ports, by level, stations (and why unknown, if so)."""
    ranges: dict[str, str]
    """A–D → the city's interval text."""

    def message(self) -> dict[str, Any]:
        """The case message an agent starts from."""
        return {
            "case_key": self.case_key,
            "task": "ev_charging",
            "city": self.city,
            "tile_id": self.tile_id,
            "scale": "2km",
            "ranges": self.ranges,
            "history_periods": list(HISTORY_OFFSET.values()),
            "time_unit": "year",
        }


def load_ev_cases(folder: Path) -> dict[str, EvCase]:
    """The EV cases of a benchmark folder by key (the reference file is not opened)."""
    return load_case_file(
        EvFiles(folder).cases,
        lambda row: EvCase(
            case_key=row["case_key"],
            city=row["city"],
            tile_id=row["tile_id"],
            history=json.loads(row["history_json"]),
            ranges=json.loads(row["ranges_json"]),
        ),
        AgentCaseError(
            f"no EV charging cases in {folder}: build a release whose scope has Boston, New "
            "York City or San Francisco (make run)"
        ),
    )


def cube_case(case: EvCase) -> Case:
    """The forecasting view's case for an EV case: its origin is the year after t−2."""
    history = tuple(
        math.nan if case.history[p]["ports"] is None else float(case.history[p]["ports"])
        for p in HISTORY_PERIODS
    )
    return Case(
        case_key=case.case_key,
        target="ev_charging",
        city=case.city,
        tile_id=case.tile_id,
        scale="2km",
        unit="ports",
        aggregation="public charging ports in the tile",
        history=history,
        origin_year=ORIGIN_YEAR,
    )


PERIOD_TEXT = re.compile(r"period (-?[0-9]+)")


def _to_ev(period: int | None) -> int | None:
    """A forecasting-view period as a period relative to t."""
    return None if period is None else int(period) - 1


def _from_ev(period: Any) -> int:
    """A period relative to t as the forecasting view's, refusing t−1 and later."""
    if isinstance(period, bool) or not isinstance(period, int | float) or int(period) != period:
        raise AgentCaseError(f"period {period!r} is not a whole number of years")
    if int(period) not in EV_PERIODS:
        raise AgentCaseError(
            f"period {int(period)} is outside what this case may see: periods "
            f"{EV_PERIODS[0]}…{EV_PERIODS[-1]} (t-2 is the last; t-1 and t are what is forecast)"
        )
    return int(period) + 1


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return PERIOD_TEXT.sub(lambda m: f"period {int(m.group(1)) - 1}", value)
    return value


# ------------------------------------------------------------------------------ calculate

_FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "sum": lambda *v: sum(v),
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "mean": lambda *v: sum(v) / len(v),
}
"""Functions ``calculate`` knows."""
WORDING = Wording(
    example="(12 - 7) / 7",
    unparsable="cannot parse {expression!r}: {reason}",
    exponent="exponents above {limit} are refused",
    not_allowed="calculate takes numbers, + - * / // % **, parentheses and {functions}; not {dump}",
    failed="cannot evaluate {expression!r}: {error}",
    not_finite="{expression!r} has no finite value",
)
"""The EV task's ``calculate`` errors."""


def evaluate(expression: Any) -> float:
    """The value of an arithmetic expression (numbers, + − × ÷ // % **, a few functions)."""
    return calculator.evaluate(expression, functions=_FUNCTIONS, max_exponent=100, wording=WORDING)


# ------------------------------------------------------------------------------ submission


@dataclass(frozen=True)
class EvSubmission:
    """A valid submit_forecast."""

    range: str
    confidence: float
    explanation: str
    range_reasons: dict[str, str]
    evidence_ids: list[str]
    limitations: str

    def to_json(self) -> dict[str, Any]:
        """As recorded in ``submission.json``."""
        return {
            "range": self.range,
            "confidence": self.confidence,
            "explanation": self.explanation,
            "range_reasons": self.range_reasons,
            "evidence_ids": self.evidence_ids,
            "limitations": self.limitations,
        }


def validate_ev_submission(answer: Mapping[str, Any], citable: set[str]) -> EvSubmission:
    """The submission, or an error naming every field that is wrong and how to fix it."""
    problems = []
    extra = sorted(set(answer) - {f for f in EvSubmission.__dataclass_fields__})
    if extra:
        problems.append(f"unknown fields {extra}")
    label = answer.get("range")
    if label not in RANGES:
        problems.append(f"range must be one of {', '.join(RANGES)}, not {label!r}")
    confidence = answer.get("confidence")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not 0 <= confidence <= 1
    ):
        problems.append(f"confidence must be a number from 0 to 1, not {confidence!r}")
    for name in ("explanation", "limitations"):
        text = answer.get(name)
        if not isinstance(text, str) or not text.strip():
            problems.append(f"{name} must be a non-empty text")
    reasons = answer.get("range_reasons")
    if not isinstance(reasons, dict) or sorted(reasons) != list(RANGES):
        problems.append("range_reasons must give a reason for each of A, B, C and D")
    elif not all(isinstance(v, str) and v.strip() for v in reasons.values()):
        problems.append("every range reason must be a non-empty text")
    evidence = answer.get("evidence_ids")
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        problems.append("evidence_ids must be a list of evidence ids (evidence-NNNN)")
    else:
        bad = [e for e in evidence if not EVIDENCE_PATTERN.fullmatch(e) or e not in citable]
        if bad:
            problems.append(
                f"evidence ids {bad} are not successful earlier calls of this case: cite only "
                "evidence_id values your calls returned"
            )
    if problems:
        raise EvSubmissionError("submit_forecast is invalid: " + "; ".join(problems))
    return EvSubmission(
        range=str(label),
        confidence=float(confidence),  # type: ignore[arg-type]
        explanation=str(answer["explanation"]).strip(),
        range_reasons={k: str(reasons[k]).strip() for k in RANGES},  # type: ignore[index]
        evidence_ids=list(dict.fromkeys(evidence)),  # type: ignore[arg-type]
        limitations=str(answer["limitations"]).strip(),
    )


# ------------------------------------------------------------------------------ session


class EvSession(CubeAssetTools, ToolSession):
    """One EV charging case being solved with App. D's nine tools."""

    raster_std = False

    def __init__(
        self,
        case: EvCase,
        con: duckdb.DuckDBPyConnection,
        catalogue: Catalogue,
        release_root: Path,
        stations: Path,
        case_dir: Path,
    ) -> None:
        super().__init__(case_dir, EV_TOOLS, "ev_charging")
        self.case = case
        self.view = CaseView(con, cube_case(case))
        self.con = con
        self.catalogue = catalogue
        self.release_root = release_root
        self.stations = stations
        self.submission: EvSubmission | None = None

    def _tool_inspect_case(self, evidence: str) -> ToolResult:
        history = [
            {"period": HISTORY_OFFSET[label], **self.case.history[label]}
            for label in HISTORY_PERIODS
        ]
        return ToolResult(
            {
                "evidence_id": evidence,
                "case": self.case.message(),
                "question": QUESTION,
                "charging_history": history,
            }
        )

    def _tool_list_modalities(self, evidence: str) -> ToolResult:
        tables = {e["modality"]: e for e in self.view.table_assets()}
        rasters = self.view.chip_periods()
        out = []
        for code in sorted(set(self.view.modalities()) | set(rasters)):
            spec = self.catalogue.get(code)
            kinds = [k for k, on in (("table", code in tables), ("raster", code in rasters)) if on]
            out.append(
                {
                    "modality": code,
                    "name": spec.name,
                    "kinds": kinds,
                }
            )
        return ToolResult({"evidence_id": evidence, "modalities": out})

    def _tool_list_assets(self, evidence: str) -> ToolResult:
        assets: list[dict[str, Any]] = [
            {
                "asset_id": "EV/baseline",
                "kind": "baseline",
                "name": "Public charging stations counted at t-2 in the case's tile",
                "tool": "inspect_baseline",
                "periods_available": [-2],
            }
        ]
        assets += self._cube_assets()
        return ToolResult({"evidence_id": evidence, "assets": assets})

    def _period_out(self, period: Any) -> Any:
        return _to_ev(period)

    def _period_in(self, period: Any) -> int:
        return _from_ev(period)

    def _fields_out(self, fields: Any) -> Any:
        return [{**f, "unit": _text(f["unit"])} for f in fields]

    def _band_name(self, band: str) -> str | None:
        return _text(band)

    def _table_rows(
        self,
        modality: str,
        tiles: Sequence[str] | None,
        fields: Sequence[str] | None,
        periods: Sequence[int] | None,
    ) -> list[dict[str, Any]]:
        asked = None if periods is None else [_from_ev(p) for p in periods]
        rows = []
        for row in self.view.rows(modality, tiles, fields, asked):
            row = {k: _text(v) for k, v in row.items()}
            row["period"] = _to_ev(row["period"])
            row["source_period"] = _to_ev(row["source_period"])
            rows.append(row)
        return rows

    def _tool_inspect_baseline(self, evidence: str) -> ToolResult:
        import pyarrow.compute as pc

        table = pq.read_table(self.stations)
        mine = table.filter(pc.equal(table["tile_id"], self.case.tile_id))
        stations = [
            {k: v for k, v in row.items() if k not in ("city", "tile_id")}
            for row in mine.to_pylist()
        ]
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": "EV/baseline",
                "period": -2,
                "stations": stations,
                "station_count": len(stations),
                "note": "stations counted at t-2 (public, available or temporarily unavailable); "
                "opened_by is the first history period at which the station was open "
                "(t-4 also for older ones); a blank level has no port of that level",
            }
        )

    def _tool_calculate(self, evidence: str, expression: str) -> ToolResult:
        return ToolResult(
            {"evidence_id": evidence, "expression": expression, "value": evaluate(expression)}
        )

    def _tool_submit_forecast(self, evidence: str, **answer: Any) -> ToolResult:
        from citycube.io.atomic import write_text_atomic

        citable = {c.evidence_id for c in self.calls if c.ok and c.tool not in UNCOUNTED}
        submission = validate_ev_submission(answer, citable)
        record = {"case_key": self.case.case_key, "evidence_id": evidence, **submission.to_json()}
        write_text_atomic(canonical_json(record) + "\n", self.case_dir / "submission.json")
        self.submission = submission
        return ToolResult({"evidence_id": evidence, "accepted": True, "case_ended": True})
