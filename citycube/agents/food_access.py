"""The food-access tools of one case (AgenticCity-Bench App. D, seven tools) and their run.

A case is a 2 km tile whose four 1 km cells (``s00`` NW, ``s01`` NE, ``s10`` SW, ``s11`` SE)
the agent labels ``not_low_access_land10``, ``low_access_land10`` or ``lila_land10``. The tools
read the published cube for the case's tile only, and only observations dated before the case's
cut-off (2020-01-01; the Atlas labels are of 2019): a row of a later year, or of a product
whose source year is 2020 or later (an epoch product), is never served. The reference labels,
the stratum and the assignment scores are never read.

Tools: ``list_reference_assets`` (tables and rasters of the tile with their years),
``inspect_table`` and ``describe_raster`` / ``view_raster`` (table and raster inspection),
``get_cell_summaries`` (a raster's statistics per 1 km cell), ``calculate`` (arithmetic) and
``submit_predictions`` (one label per cell, with confidence, reason and evidence cited as
``evidence-NNNN/ASSET_ID: observation`` from a successful inspection of that asset).
"""

from __future__ import annotations

import ast
import io
import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from citycube.agents.cases import load_case_file
from citycube.agents.cube_tools import parse_asset_id
from citycube.agents.session import CaseRun, ToolResult, ToolSession
from citycube.agents.trajectory import canonical_json
from citycube.errors import AgentCaseError, FoodAccessSubmissionError
from citycube.tasks.food_access import CELL_NAMES, CELLS, CUTOFF, LABELS, FoodAccessFiles

if TYPE_CHECKING:
    import duckdb

    from citycube.catalogue.modalities import Catalogue
    from citycube.cube.release import Release

FOOD_TOOLS = (
    "list_reference_assets",
    "inspect_table",
    "describe_raster",
    "view_raster",
    "get_cell_summaries",
    "calculate",
    "submit_predictions",
)
"""App. D's seven food-access tools."""
INSPECTIONS = frozenset({"inspect_table", "describe_raster", "view_raster", "get_cell_summaries"})
"""Calls whose result a submission may cite for their asset."""
CUTOFF_YEAR = int(CUTOFF[:4])
"""First year no evidence may come from."""
GUARD = "city = ? AND tile_id = ? AND year < ? AND (source_year IS NULL OR source_year < ?)"
"""What every query is limited to: the case's city and tile, years and source years before the
cut-off. The four parameters are :meth:`FoodCase.guard`'s."""
EVIDENCE = re.compile(r"^(evidence-\d{4})/([A-Za-z0-9_]+/(?:table|raster))(?::\s*(.*))?$", re.S)
"""A cited observation: ``evidence-NNNN/ASSET_ID: observation``."""
PROMPT = (
    "Predict FoodAccess for four 1 km x 1 km cells in this 2 km x 2 km tile: s00 (NW), s01 (NE), "
    "s10 (SW), and s11 (SE). Assign each cell one of not_low_access_land10, low_access_land10, "
    "or lila_land10. Low access means that at least 500 people or 33% of a census tract live "
    "beyond one mile (urban) or ten miles (rural) from a qualifying supermarket; these "
    "tract-derived labels are transferred to the grid rather than measured independently per "
    "cell. Discover assets with list_reference_assets; inspect relevant tables, raster "
    "descriptions, images, and cell-level summaries. Generic retail or food-service classes are "
    "not supermarkets. Missing evidence is unknown, not absence. Call submit_predictions with "
    "one label, confidence, reason, and evidence for each cell, plus limitations. Each cited "
    "observation must refer to a successfully inspected result in the form "
    "evidence-NNNN/asset_ID: observation. A successful submission ends the task."
)
"""The case-independent instruction (AgenticCity-Bench App. D, food access)."""


@dataclass(frozen=True)
class FoodCase:
    """One food-access case as the agent may know it."""

    case_id: str
    city: str
    tile_id: str
    scale: str
    cutoff: str

    def message(self) -> dict[str, Any]:
        """The case message: tile, cells, classes, cut-off and the task's instruction."""
        return {
            "case_id": self.case_id,
            "task": "food_access",
            "city": self.city,
            "tile_id": self.tile_id,
            "scale": self.scale,
            "cells": dict(CELL_NAMES),
            "labels": list(LABELS),
            "evidence_cutoff": self.cutoff,
            "instructions": PROMPT,
        }

    def guard(self) -> list[Any]:
        """Parameters of :data:`GUARD`."""
        return [self.city, self.tile_id, CUTOFF_YEAR, CUTOFF_YEAR]


def load_food_cases(folder: Path) -> dict[str, FoodCase]:
    """The cases of a benchmark folder (no reference is read; none without a case file)."""
    cases = FoodAccessFiles(folder).cases
    return load_case_file(cases, lambda row: FoodCase(**row), None, key="case_id")


def parse_asset(asset_id: Any) -> tuple[str, str]:
    """``"POP/table"`` → (``POP``, ``table``), or a clear error."""
    return parse_asset_id(asset_id, "list_reference_assets")


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_FUNCS: dict[str, Any] = {
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "sum": lambda *a: sum(a),
    "mean": lambda *a: sum(a) / len(a),
}


def evaluate(expression: str) -> float:
    """An arithmetic expression's value: numbers, + - * / % **, parentheses and a few
    functions (abs, min, max, round, sqrt, log, exp, sum, mean); nothing else is run."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(walk(node.right)) > 64:
                raise AgentCaseError("calculate: exponents above 64 are not allowed")
            return float(_OPS[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.operand)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return float(_FUNCS[node.func.id](*[walk(a) for a in node.args]))
        raise AgentCaseError(
            f"calculate: {ast.dump(node)[:60]} is not allowed; use numbers, + - * / % **, "
            f"parentheses and {', '.join(_FUNCS)}"
        )

    if not isinstance(expression, str) or len(expression) > 2000:
        raise AgentCaseError("calculate: give the expression as text of at most 2000 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise AgentCaseError(f"calculate: {expression!r} is not an expression ({exc.msg})") from exc
    try:
        return walk(tree)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
        raise AgentCaseError(f"calculate: {expression!r} has no value ({exc})") from exc


class FoodAccessSession(ToolSession):
    """One food-access case being solved with the seven tools."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        case: FoodCase,
        catalogue: Catalogue,
        release_root: Path,
        case_dir: Path,
    ) -> None:
        super().__init__(case_dir, FOOD_TOOLS, "food_access")
        self.con = con
        self.case = case
        self.catalogue = catalogue
        self.release_root = release_root
        self._assets: dict[str, dict[str, Any]] | None = None

    # -- reading the cube under the guard ---------------------------------------------------

    def _name(self, code: str) -> str:
        try:
            return self.catalogue.get(code).name
        except (KeyError, ValueError, AttributeError):
            return code

    def _table_assets(self) -> dict[str, dict[str, Any]]:
        found = self.con.execute(
            "SELECT modality, field, min(unit), list(DISTINCT year ORDER BY year) "
            f"FILTER (WHERE available) FROM observations WHERE {GUARD} "
            "GROUP BY modality, field ORDER BY modality, field",
            self.case.guard(),
        ).fetchall()
        out: dict[str, dict[str, Any]] = {}
        for code, field, unit, years in found:
            entry = out.setdefault(
                f"{code}/table",
                {
                    "asset_id": f"{code}/table",
                    "modality": code,
                    "name": self._name(code),
                    "kind": "table",
                    "spatial_support": "2 km tile",
                    "fields": [],
                    "years": set(),
                },
            )
            entry["fields"].append({"field": field, "unit": unit})
            entry["years"].update(years or [])
        return {k: {**v, "years": sorted(v["years"])} for k, v in out.items()}

    def _raster_assets(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for code, year, res in self.con.execute(
            f"SELECT modality, year, resolution_m FROM chip_index WHERE {GUARD} AND available "
            "ORDER BY modality, year",
            self.case.guard(),
        ).fetchall():
            entry = out.setdefault(
                f"{code}/raster",
                {
                    "asset_id": f"{code}/raster",
                    "modality": code,
                    "name": self._name(code),
                    "kind": "raster",
                    "resolution_m": float(res),
                    "years": [],
                },
            )
            entry["years"].append(int(year))
        return out

    def _raster(self, asset_id: str, year: Any) -> tuple[Any, list[str], np.ndarray, np.ndarray]:
        from citycube.tasks.loader import chip_group

        code, kind = parse_asset(asset_id)
        if kind != "raster":
            raise AgentCaseError(f"{asset_id} is a table: use inspect_table")
        year = int(year)
        found = self.con.execute(
            "SELECT store, row_off, col_off, height, width, source_year FROM chip_index "
            f"WHERE {GUARD} AND modality = ? AND year = ? AND available",
            [*self.case.guard(), code, year],
        ).fetchone()
        if found is None:
            raise AgentCaseError(
                f"no {asset_id} of this tile in {year} before the evidence cut-off {CUTOFF}: "
                "list_reference_assets names the rasters and their years"
            )
        store, r, c, h, w, source_year = found
        group = chip_group(str(self.release_root / store))
        values = np.asarray(group["data"][:, r : r + h, c : c + w])
        valid = np.asarray(group["valid"][r : r + h, c : c + w]).astype(bool)
        bands = [str(b) for b in np.asarray(group["band"][:])]
        return (code, source_year), bands, values, valid

    # -- the seven tools --------------------------------------------------------------------

    def _all_assets(self) -> dict[str, dict[str, Any]]:
        """The tile's assets before the cut-off (read once per case)."""
        if self._assets is None:
            self._assets = {**self._table_assets(), **self._raster_assets()}
        return self._assets

    def _tool_list_reference_assets(self, evidence: str) -> ToolResult:
        assets = list(self._all_assets().values())
        return ToolResult(
            {
                "evidence_id": evidence,
                "case": self.case.message() | {"instructions": None},
                "evidence_cutoff": CUTOFF,
                "assets": assets,
            }
        )

    def _tool_inspect_table(
        self,
        evidence: str,
        asset_id: str,
        fields: Sequence[str] | None = None,
        years: Sequence[int] | None = None,
    ) -> ToolResult:
        code, kind = parse_asset(asset_id)
        if kind != "table":
            raise AgentCaseError(f"{asset_id} is a raster: use describe_raster or view_raster")
        sql = (
            "SELECT year, field, value, unit, valid_fraction, available, reason, temporal_basis, "
            f"source_year, source_id FROM observations WHERE {GUARD} AND modality = ?"
        )
        params: list[Any] = [*self.case.guard(), code]
        if fields:
            sql += f" AND field IN ({', '.join('?' * len(fields))})"
            params += [str(f) for f in fields]
        if years:
            sql += f" AND year IN ({', '.join('?' * len(years))})"
            params += [int(y) for y in years]
        rows = self.con.execute(sql + " ORDER BY field, year", params).fetchall()
        if not rows and asset_id not in self._all_assets():
            raise AgentCaseError(
                f"no {asset_id} rows for this tile before {CUTOFF}: take asset ids from "
                "list_reference_assets"
            )
        names = (
            "year",
            "field",
            "value",
            "unit",
            "valid_fraction",
            "available",
            "reason",
            "temporal_basis",
            "source_year",
            "source",
        )
        out = []
        for row in rows:
            item = dict(zip(names, row, strict=True))
            value = item["value"]
            item["value"] = None if value is None or not math.isfinite(value) else float(value)
            out.append(item)
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "tile_id": self.case.tile_id,
                "spatial_support": "2 km tile",
                "rows": out,
            }
        )

    def _tool_describe_raster(self, evidence: str, asset_id: str, year: int) -> ToolResult:
        (code, source_year), bands, values, valid = self._raster(asset_id, year)
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "year": int(year),
                "source_year": source_year,
                "shape": list(values.shape),
                "valid_fraction": float(valid.mean()) if valid.size else 0.0,
                "kind": self._kind(code),
                "bands": _band_stats(bands, values, valid),
            }
        )

    def _kind(self, code: str) -> str | None:
        try:
            return self.catalogue.get(code).kind.value
        except (KeyError, ValueError, AttributeError):
            return None

    def _tool_view_raster(self, evidence: str, asset_id: str, year: int) -> ToolResult:
        from PIL import Image

        from citycube.reports.render import render_chip

        (code, _), _bands, values, valid = self._raster(asset_id, year)
        rgba = render_chip(self.catalogue.get(code), self.catalogue, values, valid)
        buffer = io.BytesIO()
        Image.fromarray(rgba, mode="RGBA").save(buffer, format="PNG")
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "year": int(year),
                "width": int(rgba.shape[1]),
                "height": int(rgba.shape[0]),
                "format": "png",
            },
            image=buffer.getvalue(),
        )

    def _tool_get_cell_summaries(
        self, evidence: str, asset_id: str, year: int, band: str | None = None
    ) -> ToolResult:
        _code, kind = parse_asset(asset_id)
        if kind == "table":
            raise AgentCaseError(
                f"{asset_id} is a table of 2 km tile values: cell summaries need a raster asset"
            )
        (_, source_year), bands, values, valid = self._raster(asset_id, year)
        if band is not None and band not in bands:
            raise AgentCaseError(f"{asset_id} has no band {band!r}: one of {bands}")
        h, w = valid.shape
        rows = {"0": slice(0, h // 2), "1": slice(h // 2, h)}
        cols = {"0": slice(0, w // 2), "1": slice(w // 2, w)}
        cells = {}
        for cell in CELLS:
            window = (rows[cell[1]], cols[cell[2]])
            picked = [(b, v) for b, v in zip(bands, values, strict=True) if band in (None, b)]
            cells[cell] = {
                "position": CELL_NAMES[cell],
                "bands": _band_stats(
                    [b for b, _ in picked], np.stack([v[window] for _, v in picked]), valid[window]
                ),
            }
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "year": int(year),
                "source_year": source_year,
                "cells": cells,
            }
        )

    def _tool_calculate(self, evidence: str, expression: str) -> ToolResult:
        return ToolResult(
            {"evidence_id": evidence, "expression": expression, "value": evaluate(expression)}
        )

    def _tool_submit_predictions(
        self, evidence: str, predictions: Any = None, limitations: Any = None
    ) -> ToolResult:
        from citycube.io.atomic import write_text_atomic

        answer = validate_predictions(predictions, limitations, self._citable())
        record = {"case_id": self.case.case_id, "evidence_id": evidence, **answer}
        write_text_atomic(canonical_json(record) + "\n", self.case_dir / "submission.json")
        self.submission = answer
        return ToolResult({"evidence_id": evidence, "accepted": True, "case_ended": True})

    def _citable(self) -> dict[str, str] | None:
        """Evidence id → asset id of the successful inspections so far; None when the tile has
        no asset at all (then a cell's evidence may be empty)."""
        if not self._all_assets():
            return None
        return {
            c.evidence_id: str(c.arguments.get("asset_id"))
            for c in self.calls
            if c.ok and c.tool in INSPECTIONS
        }


def _band_stats(bands: Sequence[str], values: np.ndarray, valid: np.ndarray) -> list[dict]:
    out = []
    for name, band in zip(bands, values, strict=True):
        x = band[valid].astype(np.float64)
        x = x[np.isfinite(x)]
        stats: dict[str, Any] = {
            "band": name,
            "valid_pixels": int(x.size),
            "valid_fraction": float(x.size / valid.size) if valid.size else 0.0,
        }
        if x.size:
            stats |= {"min": float(x.min()), "max": float(x.max()), "mean": float(x.mean())}
        else:
            stats |= {"min": None, "max": None, "mean": None}
        out.append(stats)
    return out


def validate_predictions(
    predictions: Any, limitations: Any, citable: Mapping[str, str] | None
) -> dict[str, Any]:
    """A submission's predictions checked: every cell once, a known label, a confidence in
    [0, 1], a reason and evidence citing a successful inspection of the named asset."""

    def bad(message: str) -> FoodAccessSubmissionError:
        return FoodAccessSubmissionError(message)

    if not isinstance(predictions, Mapping):
        raise bad(
            "predictions must be an object with one entry per cell (s00, s01, s10, s11), each "
            "{label, confidence, reason, evidence}"
        )
    if set(predictions) != set(CELLS):
        raise bad(
            f"predictions must name exactly the cells {', '.join(CELLS)}; got "
            f"{sorted(map(str, predictions))}"
        )
    if not isinstance(limitations, str) or not limitations.strip():
        raise bad("limitations must be a non-empty text")
    out: dict[str, Any] = {}
    for cell in CELLS:
        entry = predictions[cell]
        if not isinstance(entry, Mapping):
            raise bad(f"{cell}: give {{label, confidence, reason, evidence}}")
        label, confidence = entry.get("label"), entry.get("confidence")
        reason, cited = entry.get("reason"), entry.get("evidence")
        if label not in LABELS:
            raise bad(f"{cell}: label {label!r} is not one of {', '.join(LABELS)}")
        if (
            isinstance(confidence, bool)
            or not isinstance(confidence, int | float)
            or not 0 <= confidence <= 1
        ):
            raise bad(f"{cell}: confidence must be a number from 0 to 1, not {confidence!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise bad(f"{cell}: reason must be a non-empty text")
        if not isinstance(cited, list) or not all(isinstance(e, str) for e in cited):
            raise bad(f"{cell}: evidence must be a list of 'evidence-NNNN/ASSET_ID: observation'")
        if citable is not None and not cited:
            raise bad(f"{cell}: cite at least one inspected observation")
        for item in cited:
            match = EVIDENCE.match(item.strip())
            if match is None:
                raise bad(
                    f"{cell}: {item!r} is not of the form evidence-NNNN/ASSET_ID: observation"
                )
            ref, asset = match.group(1), match.group(2)
            if citable is None or citable.get(ref) != asset:
                raise bad(
                    f"{cell}: {ref} is not a successful inspection of {asset} in this case; cite "
                    "the evidence id of an inspect_table, describe_raster, view_raster or "
                    "get_cell_summaries call of that asset"
                )
        out[cell] = {
            "label": label,
            "confidence": float(confidence),
            "reason": reason,
            "evidence": list(cited),
        }
    return {"predictions": out, "limitations": limitations}


class FoodAccessRun(CaseRun):
    """A run of one agent over a release's food-access cases, one case open at a time, each in
    ``run_dir/cases/<case_id>/`` (trajectory, submission, workspace). The run takes over
    ``con``: closing the run closes it."""

    case_word = "id"

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        cases: Mapping[str, FoodCase],
        catalogue: Catalogue,
        release_root: Path,
        run_dir: Path,
        *,
        agent: str = "unnamed",
    ) -> None:
        from citycube.io.atomic import write_text_atomic

        self.con = con
        self.cases = dict(cases)
        self.catalogue = catalogue
        self.release_root = release_root
        self.run_dir = run_dir
        self.session: FoodAccessSession | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "run": run_dir.name,
            "agent": agent,
            "task": "food_access",
            "tools": list(FOOD_TOOLS),
        }
        write_text_atomic(json.dumps(record, indent=2) + "\n", run_dir / "run.json")

    def case_keys(self) -> list[str]:
        """The run's case ids, in order."""
        return sorted(self.cases)

    def start_case(self, case_key: str) -> dict[str, Any]:
        """Open a case (closing the one open) and return its message."""
        if case_key not in self.cases:
            raise AgentCaseError(f"no case {case_key!r} in this run: take ids from list_cases")
        self.end_case()
        self.session = FoodAccessSession(
            self.con,
            self.cases[case_key],
            self.catalogue,
            self.release_root,
            self.run_dir / "cases" / case_key,
        )
        return self.cases[case_key].message()


def open_food_run(release: Release, run_dir: Path, *, agent: str) -> FoodAccessRun:
    """A run over the release's published food-access cases."""
    import duckdb

    from citycube.agents.session import validate_run_name
    from citycube.catalogue.modalities import load_catalogue

    if not release.duckdb_file.exists():
        raise AgentCaseError(
            f"no published cube at {release.duckdb_file}: build a release first (make run)"
        )
    validate_run_name(run_dir.name)
    cases = load_food_cases(FoodAccessFiles.published(release).root)
    con = duckdb.connect(str(release.duckdb_file), read_only=True)
    try:
        return FoodAccessRun(con, cases, load_catalogue(), release.root, run_dir, agent=agent)
    except BaseException:
        con.close()
        raise


def run_predictions(run_dir: Path) -> list[dict[str, Any]]:
    """(case_id, cell, label) of every accepted submission of a run."""
    rows = []
    for path in sorted((run_dir / "cases").glob("*/submission.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        for cell, entry in record["predictions"].items():
            rows.append({"case_id": record["case_id"], "cell": cell, "label": entry["label"]})
    return rows
