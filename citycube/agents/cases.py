"""A forecasting case as an agent may see it: periods −10…−1 of its city, no calendar year.

The view is cut from the published release on the server side. It knows the case's origin year
(to turn years into periods) but never hands it out: every row it returns carries a relative
period instead of a year, values from a product of period 0 or later (an epoch product whose
source year is the origin or after) are left out, and the held-out reference is never read.
Text that could name a year (units such as ``GBP (nominal, 2020)``, source ids, reasons) is
rewritten with the year replaced by its period.

The planning tasks reuse two parts: :func:`load_case_file` (a case file read into cases by key)
and :class:`GuardedView` (the guarded queries, periods for years), which the school capacity
view extends with its own guard; EV charging reads through :class:`CaseView` itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import pyarrow.parquet as pq

from citycube.errors import AgentCaseError, CityCubeError
from citycube.tasks.forecast import HISTORY, HISTORY_PERIODS, ForecastFiles

if TYPE_CHECKING:
    import duckdb

    from citycube.cube.release import Release

YEAR_PATTERN = re.compile(r"(?<![0-9A-Za-z])(19[0-9]{2}|20[0-9]{2})(?![0-9A-Za-z])")
"""A calendar year inside a text (what no tool output may contain)."""

C = TypeVar("C")
"""A task's case type."""


class Dated(Protocol):
    """A case that knows the relative period of a calendar year (server side)."""

    def period(self, year: int) -> int:
        """The relative period of ``year``."""
        ...


CASE_FIELDS = ("case_key", "target", "city", "tile_id", "scale", "unit", "aggregation")
"""The case message's fields (AgenticCity-Bench App. D: city and tile, target, unit, aggregation,
prediction period 0 and the history window)."""


@dataclass(frozen=True)
class Case:
    """One forecasting case, with the origin year that only the server may know."""

    case_key: str
    """Opaque key (no year)."""
    target: str
    """``lst``, ``carbon`` or ``property``."""
    city: str
    """City key."""
    tile_id: str
    """The 2 km tile forecast."""
    scale: str
    """Tile scale (``2km``)."""
    unit: str
    """Unit of the target and the answer."""
    aggregation: str
    """What one tile's value is."""
    history: tuple[float, ...]
    """Values of periods −10…−1."""
    origin_year: int
    """Calendar year of period 0: server side only, never in a tool's output."""

    def message(self) -> dict[str, Any]:
        """The case message an agent starts from (no year, no reference)."""
        return {
            **{name: getattr(self, name) for name in CASE_FIELDS},
            "prediction_period": 0,
            "history_window": [HISTORY_PERIODS[0], HISTORY_PERIODS[-1]],
        }

    def period(self, year: int) -> int:
        """The relative period of a calendar year."""
        return int(year) - self.origin_year


def load_case_file(
    path: Path,
    make: Callable[[dict[str, Any]], C],
    missing: CityCubeError | None,
    *,
    key: str = "case_key",
) -> dict[str, C]:
    """A task's published cases by key: ``make`` turns each row of its case file into a case.

    Only the case file is read, never a reference. A missing file raises ``missing`` (a task
    that may have no cases passes None and gets none)."""
    if not path.exists():
        if missing is None:
            return {}
        raise missing
    return {row[key]: make(row) for row in pq.read_table(path).to_pylist()}


def load_cases(folder: Path) -> dict[str, Case]:
    """The forecasting cases of a benchmark folder, by case key.

    Of the held-out file only the origin year is read; the reference column is not loaded.
    """
    files = ForecastFiles(folder)
    if not files.cases.exists() or not files.references.exists():
        raise AgentCaseError(
            f"no forecasting cases in {folder}: build a release whose cube has complete "
            "2010–2024 panels (e.g. make run CITIES=Boston YEARS=2010-2024)"
        )
    cases = pq.read_table(files.cases).to_pylist()
    origins = dict(
        zip(
            *pq.read_table(files.references, columns=["case_key", "origin_year"])
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    out: dict[str, Case] = {}
    for row in cases:
        out[row["case_key"]] = Case(
            case_key=row["case_key"],
            target=row["target"],
            city=row["city"],
            tile_id=row["tile_id"],
            scale=row["scale"],
            unit=row["unit"],
            aggregation=row["aggregation"],
            history=tuple(float(v) for v in row["history"]),
            origin_year=int(origins[row["case_key"]]),
        )
    return out


def release_cases(release: Release) -> dict[str, Case]:
    """The published release's forecasting cases."""
    return load_cases(ForecastFiles.published(release).root)


def hide_years(text: str | None, case: Dated) -> str | None:
    """``text`` with every calendar year replaced by its period (``period -3``)."""
    if text is None:
        return None
    return YEAR_PATTERN.sub(lambda m: f"period {case.period(int(m.group(1)))}", text)


def _known_periods(periods: Iterable[int] | None) -> list[int]:
    if periods is None:
        return list(HISTORY_PERIODS)
    out = sorted({int(p) for p in periods})
    bad = [p for p in out if p not in HISTORY_PERIODS]
    if bad:
        raise AgentCaseError(
            f"periods {bad} are outside the case's history: ask for periods "
            f"{HISTORY_PERIODS[0]}…{HISTORY_PERIODS[-1]} (period 0 is what is forecast)"
        )
    return out


GUARD = "city = ? AND year BETWEEN ? AND ? AND (source_year IS NULL OR source_year < ?)"
"""What every query of a case view is limited to: the case's city, its history years, products
from before period 0. Each query's first four parameters are :meth:`CaseView.guard`'s."""

OBSERVATION_COLUMNS = (
    "tile_id, scale, year, modality, field, value, unit, valid_fraction, available, reason, "
    "temporal_basis, source_year, source_id"
)


def observation_query(
    guard: str,
    guard_params: Sequence[Any],
    modality: str,
    tiles: Sequence[str],
    years: Sequence[int],
    fields: Sequence[str] | None,
) -> tuple[str, list[Any]]:
    """The SQL and parameters of a view's observation rows: ``guard`` (a task's leakage guard,
    its parameters first) and one modality, tiles, years and optionally fields, ordered."""
    # IN lists of parameters (not list_contains) so DuckDB can prune row groups by tile
    sql = (
        f"SELECT {OBSERVATION_COLUMNS} FROM observations WHERE {guard} AND modality = ? "
        f"AND tile_id IN ({', '.join('?' * len(tiles))}) "
        f"AND year IN ({', '.join('?' * len(years))})"
    )
    params = [*guard_params, modality, *tiles, *years]
    if fields:
        names = [str(f) for f in fields]
        sql += f" AND field IN ({', '.join('?' * len(names))})"
        params += names
    sql += " ORDER BY scale, tile_id, field, year"
    return sql, params


@dataclass(frozen=True)
class Chip:
    """Where one tile's chip of one period is (server side: the store path names a year)."""

    store: str
    row_off: int
    col_off: int
    height: int
    width: int
    resolution_m: float
    valid_fraction: float
    available: bool
    source_period: int | None


class GuardedView:
    """What a case may read of the release through its task's leakage guard, with periods in
    place of years: the queries the forecasting and school views share.

    Every query is limited by :attr:`guard_sql` (a subclass's ``GUARD``) with :meth:`guard`'s
    parameters first; the case turns years into periods (``case.period``) and texts are
    rewritten by :func:`hide_years`. A subclass says which periods and tiles a case may ask
    for (:meth:`years`, :meth:`check_tiles`)."""

    guard_sql: str
    """The task's guard (SQL with ``?`` parameters)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, case: Any) -> None:
        self.con = con
        self.case = case

    def guard(self) -> list[Any]:
        """Parameters of :attr:`guard_sql` for this case."""
        raise NotImplementedError

    def years(self, periods: Iterable[int] | None) -> list[int]:
        """Calendar years of the periods asked for (default: all the case may see), or a clear
        error for one it may not."""
        raise NotImplementedError

    def check_tiles(self, tiles: Sequence[str] | None) -> list[str]:
        """``tiles`` (default: the case's tile) after checking the case may read them."""
        raise NotImplementedError

    def _row(self, values: Sequence[Any]) -> dict[str, Any]:
        tile, scale, year, mod, field, value, unit, vf, ok, reason, basis, sy, sid = values
        case = self.case
        return {
            "tile_id": tile,
            "scale": scale,
            "period": case.period(year),
            "modality": mod,
            "field": field,
            "value": None if value is None or not np.isfinite(value) else float(value),
            "unit": hide_years(unit, case),
            "valid_fraction": vf,
            "available": bool(ok),
            "reason": hide_years(reason, case),
            "temporal_basis": basis,
            "source_period": None if sy is None else case.period(sy),
            "source": hide_years(sid, case),
        }

    def _observations(
        self,
        modality: str,
        tiles: Sequence[str] | None,
        fields: Sequence[str] | None,
        periods: Iterable[int] | None,
    ) -> list[dict[str, Any]]:
        """Rows of one modality (a subclass has checked the case may read it)."""
        years, wanted = self.years(periods), self.check_tiles(tiles)
        guard, params = self.guard_sql, self.guard()
        sql, params = observation_query(guard, params, modality, wanted, years, fields)
        return [self._row(r) for r in self.con.execute(sql, params).fetchall()]

    def table_assets(self) -> list[dict[str, Any]]:
        """Per modality of the case's tile: its fields with units and the periods at which at
        least one field is available (one query)."""
        found = self.con.execute(
            f"SELECT modality, field, min(unit), list(DISTINCT year) FILTER (WHERE available) "
            f"FROM observations WHERE {self.guard_sql} AND tile_id = ? GROUP BY modality, field "
            "ORDER BY modality, field",
            [*self.guard(), self.case.tile_id],
        ).fetchall()
        out: dict[str, dict[str, Any]] = {}
        for modality, field, unit, years in found:
            entry = out.setdefault(modality, {"modality": modality, "fields": [], "periods": set()})
            entry["fields"].append({"field": field, "unit": hide_years(unit, self.case)})
            entry["periods"].update(self.case.period(y) for y in years or [])
        return [{**e, "periods": sorted(e["periods"])} for e in out.values()]

    def chip(self, modality: str, period: int, tile: str | None = None) -> Chip:
        """The chip of one tile (default: the case's) and period, or a clear error."""
        (year,) = self.years([period])
        (tile,) = self.check_tiles([tile] if tile else None)
        found = self.con.execute(
            "SELECT store, row_off, col_off, height, width, resolution_m, valid_fraction, "
            f"available, source_year FROM chip_index WHERE {self.guard_sql} AND modality = ? "
            "AND tile_id = ? AND year = ?",
            [*self.guard(), modality, tile, year],
        ).fetchone()
        if found is None:
            raise AgentCaseError(
                f"no {modality} raster of {tile} at period {int(period)}: list_assets names the "
                "raster assets and their periods"
            )
        store, r, c, h, w, res, vf, ok, sy = found
        source_period = None if sy is None else self.case.period(sy)
        return Chip(store, r, c, h, w, float(res), float(vf), bool(ok), source_period)

    def chip_periods(self) -> dict[str, list[int]]:
        """Raster modalities of the case's tile and the periods each has a chip at."""
        out: dict[str, list[int]] = {}
        for mod, year in self.con.execute(
            f"SELECT modality, year FROM chip_index WHERE {self.guard_sql} AND tile_id = ? "
            "ORDER BY modality, year",
            [*self.guard(), self.case.tile_id],
        ).fetchall():
            out.setdefault(mod, []).append(self.case.period(year))
        return out


class CaseView(GuardedView):
    """Everything an agent may read for one forecasting case, with periods, not years.

    Every query goes through the release's DuckDB views under :data:`GUARD`; rows come back
    with ``period`` and ``source_period`` in place of ``year`` and ``source_year``.
    """

    guard_sql = GUARD

    def __init__(self, con: duckdb.DuckDBPyConnection, case: Case) -> None:
        super().__init__(con, case)
        self._modalities: list[str] | None = None
        self._tiles: list[str] | None = None

    def guard(self) -> list[Any]:
        """Parameters of :data:`GUARD` for this case."""
        c = self.case
        return [c.city, c.origin_year - HISTORY, c.origin_year - 1, c.origin_year]

    def years(self, periods: Iterable[int] | None) -> list[int]:
        """Years of history periods (default: all ten), or a clear error for period 0 on."""
        return [self.case.origin_year + p for p in _known_periods(periods)]

    @property
    def tiles(self) -> list[str]:
        """Tiles of the case's city (both scales) with observations in the history."""
        if self._tiles is None:
            found = self.con.execute(
                "SELECT tile_id FROM tiles WHERE city = ?", [self.case.city]
            ).fetchall()
            self._tiles = sorted({t for (t,) in found} | {self.case.tile_id})
        return self._tiles

    def modalities(self) -> list[str]:
        """Modalities with at least one row in the history."""
        if self._modalities is None:
            found = self.con.execute(
                f"SELECT DISTINCT modality FROM observations WHERE {GUARD}", self.guard()
            ).fetchall()
            self._modalities = sorted(m for (m,) in found)
        return self._modalities

    def rows(
        self,
        modality: str,
        tiles: Sequence[str] | None = None,
        fields: Sequence[str] | None = None,
        periods: Iterable[int] | None = None,
    ) -> list[dict[str, Any]]:
        """Rows of one modality for some tiles (default: the case's tile), fields and periods."""
        if modality not in self.modalities():
            raise AgentCaseError(
                f"modality {modality!r} has no data in this case: call list_assets for the "
                "assets there are"
            )
        return self._observations(modality, tiles, fields, periods)

    def check_tiles(self, tiles: Sequence[str] | None) -> list[str]:
        """``tiles`` (default: the case's tile) after checking each is of the case's city."""
        if not tiles:
            return [self.case.tile_id]
        if isinstance(tiles, str) or not all(isinstance(t, str) for t in tiles):
            raise AgentCaseError("tiles must be a list of tile ids")
        known = set(self.tiles)
        bad = [t for t in tiles if t not in known]
        if bad:
            raise AgentCaseError(
                f"tiles {bad[:5]} are not tiles of this case's city {self.case.city}: use the "
                "case's tile or those list_assets names"
            )
        return list(dict.fromkeys(tiles))
