"""Forecasting cases of the agentic track (AgenticCity-Bench App. D) and their scoring.

Three targets are forecast one year ahead on 2 km tiles from a ten-year history given in
relative periods −10…−1 (period 0 is the forecast origin, 2020–2024):

* ``lst``: the tile's annual mean land-surface temperature, HEAT ``mean_c`` in °C.
* ``carbon``: tonne C per tile per year. The release stores CO2 as a density (tonne C/km²/year:
  the valid ODIAC cell totals × covered fraction ÷ the nominal tile area), so the tile total is
  that density × the tile's area from the tiles table (4 km²). App. D sums the tile's four
  complete 1 km cells: the four cells partition the tile, so the sum of their exact
  coverage-weighted totals is this tile total (ODIAC's 30″ cells do not nest in UTM cells; each
  is counted by the share of its area inside), and the four are complete exactly when the tile
  has full valid support (``valid_fraction`` = 1), which every panel year must have.
* ``property``: App. D's tile value, the median of the valid 500 m cell medians in local
  currency, nominal: PROP's ``property_median_local``, whose catalogue entry declares that rule
  (``median_of_cell_medians`` on 500 m cells, ``citycube.grid.cells``) and is available under the
  same support rule as PROP's means. It must be positive (MAPE divides by it).

A tile is eligible for a target when every year 2010–2024 has an available, finite value (for
carbon with complete support) in one unit: the same currency for property, whose unit names
each year's price year. Selection follows App. D: per city, two eligible tiles in the order of
``sha256("<seed 0>:<target>:<tile>")`` (the initial cohort), then further tiles, each city's
remaining ones in the order of ``sha256("prediction600-seed42:<target>:<tile>")``, taken round
robin over the cities (in that hash's order of city names) until the target has
``cases ÷ 5`` series. Every series gives five cases, one per origin. Case files hold no calendar
year and no reference value: the case key is opaque and the paper-form case id
(``Boston_2KM_r7_c8_lst_2022``), the origin year and the reference sit in a separate file.

Scoring pools a target's cases (property: per city, in local currency; its MAPE also pooled
over cities) and reports MAE, MAPE, RMSE and R² with 95 % percentile intervals from
city-stratified tile-block bootstrap replicates (a block is all five cases of one tile; the same
draws for every method of an evaluation group).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from citycube.io.digest import file_sha256
from citycube.tasks.metrics import mae, mape, r_squared, rmse

if TYPE_CHECKING:
    import duckdb

    from citycube.cube.release import Release

PANEL_YEARS: tuple[int, ...] = tuple(range(2010, 2025))
"""Every year a tile needs a valid target in (App. D's complete panel)."""
ORIGINS: tuple[int, ...] = tuple(range(2020, 2025))
"""Forecast origins (period 0)."""
HISTORY = 10
"""History length: periods −10…−1."""
HISTORY_PERIODS: tuple[int, ...] = tuple(range(-HISTORY, 0))
"""The relative periods a case's history covers."""
SCALE = "2km"
"""Cases are 2 km tiles."""
INITIAL_SEED = 0
"""Seed of the initial cohort's per-city draw."""
INITIAL_PER_CITY = 2
"""Tiles per city in the initial cohort."""
EXPANSION_SEED = "prediction600-seed42"
"""Seed of the hash order the expansion cohort is taken in, round robin over cities."""
BOOTSTRAP_SEED = 20261024
"""Seed of the tile-block bootstrap."""
BOOTSTRAP_REPLICATES = 10_000
"""Bootstrap replicates per evaluation group."""
FULL_SUPPORT = 1.0 - 1e-9
"""Valid fraction at or above which a tile's support counts as complete."""

METRICS = ("mae", "mape", "rmse", "r2")
"""Metrics of each evaluation group, in reporting order."""


@dataclass(frozen=True)
class ForecastTarget:
    """One forecasting target: where it comes from in the cube and how it is scored."""

    name: str
    """Name used in case ids (``lst``, ``carbon``, ``property``)."""
    modality: str
    """Modality code in the cube."""
    field: str
    """Observation field read."""
    unit: str
    """Unit of the target as the cases state it (property: its currency is appended)."""
    aggregation: str
    """What one tile's value is, as the case message states it."""
    default_cases: int
    """Cases asked for by default (AgenticCity-Bench: 220 / 220 / 160)."""
    per_tile_area: bool
    """The stored value is per km²: multiply by the tile's area."""
    complete_support: bool
    """Every panel year needs full valid support."""
    positive: bool
    """Values must be > 0 (MAPE divides by them)."""
    per_city: bool
    """Scored per city (local currencies); its MAPE is also pooled."""
    headline: str
    """Table 4's metric for the target."""


TARGETS: tuple[ForecastTarget, ...] = (
    ForecastTarget(
        name="lst",
        modality="HEAT",
        field="mean_c",
        unit="°C",
        aggregation="annual tile-mean land-surface temperature (area-weighted mean of the "
        "Landsat ST annual mean)",
        default_cases=220,
        per_tile_area=False,
        complete_support=False,
        positive=False,
        per_city=False,
        headline="mae",
    ),
    ForecastTarget(
        name="carbon",
        modality="CO2",
        field="carbon_tc_km2",
        unit="tonne C/tile/year",
        aggregation="annual ODIAC carbon emissions summed over the tile (stored density × "
        "tile area), full valid support",
        default_cases=220,
        per_tile_area=True,
        complete_support=True,
        positive=False,
        per_city=False,
        headline="mae",
    ),
    ForecastTarget(
        name="property",
        modality="PROP",
        field="property_median_local",
        unit="local currency",
        aggregation="annual median of the valid 500 m cell-level property-value medians of the "
        "tile, local currency, nominal",
        default_cases=160,
        per_tile_area=False,
        complete_support=False,
        positive=True,
        per_city=True,
        headline="mape",
    ),
)
"""The three targets, in Table 4's order."""

TARGET_BY_NAME: Mapping[str, ForecastTarget] = {t.name: t for t in TARGETS}
"""Targets by name."""


def target(name: str) -> ForecastTarget:
    """A target by name, with a message naming the choices."""
    if name not in TARGET_BY_NAME:
        raise KeyError(f"unknown forecasting target {name!r}: one of {', '.join(TARGET_BY_NAME)}")
    return TARGET_BY_NAME[name]


def case_id(tile_id: str, target_name: str, origin: int) -> str:
    """The paper's case id, e.g. ``Boston_2KM_r7_c8_lst_2022`` (it names the year)."""
    return f"{tile_id}_{target_name}_{origin}"


def case_key(case: str) -> str:
    """The opaque key the case files use instead of the case id (which names the year)."""
    return "fc_" + hashlib.sha256(f"forecast-case:{case}".encode()).hexdigest()[:16]


def _rank(seed: object, *parts: str) -> str:
    return hashlib.sha256(":".join([str(seed), *parts]).encode()).hexdigest()


def unit_key(unit: str | None, spec: ForecastTarget) -> str | None:
    """What must not change over the panel: the unit, or for money the currency alone
    (``'GBP (nominal, 2020)'`` → ``'GBP'``; each year names its own price year)."""
    if unit is None:
        return None
    if spec.name == "property":
        return unit.split(" (nominal")[0].strip()
    return unit


# ------------------------------------------------------------------------------ eligibility


@dataclass(frozen=True)
class Panel:
    """Eligible tiles of one target, with their target series over ``PANEL_YEARS``."""

    spec: ForecastTarget
    """The target."""
    series: dict[str, np.ndarray]
    """tile_id -> target values, one per panel year."""
    city: dict[str, str]
    """tile_id -> city."""
    unit: dict[str, str]
    """tile_id -> the case unit (property: with its currency)."""
    counts: list[dict[str, Any]]
    """Per city: tiles seen, eligible, and why the others are not."""

    def eligible_by_city(self) -> dict[str, list[str]]:
        """City -> its eligible tiles, sorted."""
        out: dict[str, list[str]] = {}
        for tile in sorted(self.series):
            out.setdefault(self.city[tile], []).append(tile)
        return out


INELIGIBLE = ("missing_year", "unavailable", "incomplete_support", "not_positive", "unit_changes")
"""Why a tile is not eligible, the first failing rule counted: a panel year without a row, an
unavailable or non-finite value, incomplete support (carbon), a value ≤ 0 (property), or a
unit (currency) that changes over the panel."""

PANEL_SQL = """
SELECT o.city, o.tile_id, o.year, o.value, o.unit, o.available, o.valid_fraction,
       (t.utm_xmax - t.utm_xmin) * (t.utm_ymax - t.utm_ymin) / 1e6 AS area_km2
FROM observations AS o JOIN tiles AS t USING (tile_id)
WHERE o.modality = ? AND o.field = ? AND o.scale = ? AND o.year BETWEEN ? AND ?
ORDER BY o.city, o.tile_id, o.year
"""


def read_panel(con: duckdb.DuckDBPyConnection, spec: ForecastTarget) -> pa.Table:
    """The target's published observations over the panel years (2 km tiles)."""
    return con.execute(
        PANEL_SQL, [spec.modality, spec.field, SCALE, PANEL_YEARS[0], PANEL_YEARS[-1]]
    ).to_arrow_table()


def eligible_panel(rows: pa.Table, spec: ForecastTarget) -> Panel:
    """Tiles with a valid target in every panel year, in one unit (App. D's complete panel)."""
    years = {y: i for i, y in enumerate(PANEL_YEARS)}
    data = rows.to_pydict()
    per_tile: dict[str, list[int]] = {}
    for i, tile in enumerate(data["tile_id"]):
        per_tile.setdefault(tile, []).append(i)
    series: dict[str, np.ndarray] = {}
    cities: dict[str, str] = {}
    units: dict[str, str] = {}
    counts: dict[str, dict[str, Any]] = {}
    for tile in sorted(per_tile):
        members = per_tile[tile]
        city = data["city"][members[0]]
        c = counts.setdefault(
            city,
            {
                "target": spec.name,
                "city": city,
                "tiles": 0,
                "eligible": 0,
                **dict.fromkeys(INELIGIBLE, 0),
            },
        )
        c["tiles"] += 1
        values = np.full(len(PANEL_YEARS), np.nan)
        seen = np.zeros(len(PANEL_YEARS), dtype=bool)
        ok_available = ok_support = ok_positive = True
        unit_keys = set()
        for i in members:
            y = years.get(int(data["year"][i]))
            if y is None:
                continue
            seen[y] = True
            value = data["value"][i]
            if not data["available"][i] or value is None or not np.isfinite(value):
                ok_available = False
                continue
            if spec.complete_support and not (data["valid_fraction"][i] or 0.0) >= FULL_SUPPORT:
                ok_support = False
            if spec.positive and not value > 0:
                ok_positive = False
            unit_keys.add(unit_key(data["unit"][i], spec))
            area = data["area_km2"][i] if spec.per_tile_area else 1.0
            values[y] = float(value) * float(area)
        if not seen.all():
            c["missing_year"] += 1
        elif not ok_available:
            c["unavailable"] += 1
        elif not ok_support:
            c["incomplete_support"] += 1
        elif not ok_positive:
            c["not_positive"] += 1
        elif len(unit_keys) != 1:
            c["unit_changes"] += 1
        else:
            c["eligible"] += 1
            series[tile] = values
            cities[tile] = city
            (key,) = unit_keys
            units[tile] = spec.unit if spec.name != "property" else f"{key} (local currency)"
    return Panel(spec, series, cities, units, [counts[c] for c in sorted(counts)])


# ------------------------------------------------------------------------------ selection


@dataclass(frozen=True)
class Selected:
    """One selected tile–target series."""

    city: str
    """Its city."""
    tile_id: str
    """Its tile."""
    cohort: str
    """``initial`` (two per city, seed 0) or ``expansion`` (round robin, hash order)."""
    order: int
    """Position in the selection (0 first)."""


def select_series(
    eligible: Mapping[str, Sequence[str]],
    target_name: str,
    n_series: int,
    *,
    initial_seed: int = INITIAL_SEED,
    initial_per_city: int = INITIAL_PER_CITY,
    expansion_seed: str = EXPANSION_SEED,
) -> list[Selected]:
    """App. D's selection: an initial cohort of ``initial_per_city`` tiles per city, then an
    expansion round robin across cities, until ``n_series`` (or every eligible tile).

    Both orders are hashes of the seed, the target and the tile, so a city's picks do not move
    when other cities or tiles become eligible. The initial cohort is itself taken round robin
    (every city's first pick, then every city's second), which matters only when it alone would
    exceed ``n_series``. Cities take turns in the order of the expansion seed's hash of their
    names, so which cities get one series more is not alphabetical.
    """
    cities = sorted(c for c, tiles in eligible.items() if tiles)
    first = {
        c: sorted(eligible[c], key=lambda t: _rank(initial_seed, target_name, t)) for c in cities
    }
    turn = sorted(cities, key=lambda c: _rank(expansion_seed, target_name, "city", c))
    picked: list[Selected] = []
    taken: set[str] = set()
    for round_ in range(initial_per_city):
        for c in turn:
            if len(picked) >= n_series:
                return picked
            if round_ < len(first[c]):
                tile = first[c][round_]
                picked.append(Selected(c, tile, "initial", len(picked)))
                taken.add(tile)
    rest = {
        c: [
            t
            for t in sorted(eligible[c], key=lambda t: _rank(expansion_seed, target_name, t))
            if t not in taken
        ]
        for c in cities
    }
    while len(picked) < n_series and any(rest.values()):
        for c in turn:
            if len(picked) >= n_series:
                break
            if rest[c]:
                picked.append(Selected(c, rest[c].pop(0), "expansion", len(picked)))
    return picked


# ------------------------------------------------------------------------------ cases

CASE_SCHEMA = pa.schema(
    [
        ("case_key", pa.string()),
        ("target", pa.string()),
        ("city", pa.string()),
        ("tile_id", pa.string()),
        ("scale", pa.string()),
        ("unit", pa.string()),
        ("aggregation", pa.string()),
        ("prediction_period", pa.int8()),
        ("history_periods", pa.list_(pa.int8())),
        ("history", pa.list_(pa.float64())),
    ]
)
"""What a forecaster sees: no calendar year, no reference value."""

REFERENCE_SCHEMA = pa.schema(
    [
        ("case_key", pa.string()),
        ("case_id", pa.string()),
        ("target", pa.string()),
        ("city", pa.string()),
        ("tile_id", pa.string()),
        ("origin_year", pa.int16()),
        ("reference", pa.float64()),
        ("unit", pa.string()),
        ("cohort", pa.string()),
        ("series_order", pa.int32()),
    ]
)
"""Held out: the case id, its origin year and the observed value at period 0."""


@dataclass(frozen=True)
class CaseSet:
    """Cases of every target with their held-out references and what was asked for."""

    cases: pa.Table
    """``CASE_SCHEMA`` rows, in case-key order."""
    references: pa.Table
    """``REFERENCE_SCHEMA`` rows, in case-key order."""
    eligibility: pa.Table
    """Per target and city: tiles, eligible, selected and the reasons for ineligibility."""
    requested: dict[str, int]
    """Cases asked for per target."""
    achieved: dict[str, int]
    """Cases made per target."""
    settings: dict[str, Any]
    """Seeds and rules the cases were made with."""

    @property
    def complete(self) -> bool:
        """Every target got what it asked for."""
        return all(self.achieved[t] >= n for t, n in self.requested.items())


def forecast_settings() -> dict[str, Any]:
    """The seeds and rules the cases depend on (recorded in the manifest)."""
    return {
        "scale": SCALE,
        "panel_years": [PANEL_YEARS[0], PANEL_YEARS[-1]],
        "origins": list(ORIGINS),
        "history_periods": [HISTORY_PERIODS[0], HISTORY_PERIODS[-1]],
        "initial_seed": INITIAL_SEED,
        "initial_per_city": INITIAL_PER_CITY,
        "expansion_seed": EXPANSION_SEED,
    }


def make_cases(panels: Iterable[Panel], cases_per_target: Mapping[str, int]) -> CaseSet:
    """Select series per target and cut each into its five origin cases."""
    case_rows: list[dict[str, Any]] = []
    ref_rows: list[dict[str, Any]] = []
    counts: list[dict[str, Any]] = []
    requested: dict[str, int] = {}
    achieved: dict[str, int] = {}
    index = {y: i for i, y in enumerate(PANEL_YEARS)}
    for panel in panels:
        spec = panel.spec
        asked = int(cases_per_target.get(spec.name, spec.default_cases))
        requested[spec.name] = asked
        picked = select_series(panel.eligible_by_city(), spec.name, asked // len(ORIGINS))
        per_city: dict[str, int] = {}
        for s in picked:
            per_city[s.city] = per_city.get(s.city, 0) + 1
            values = panel.series[s.tile_id]
            for origin in ORIGINS:
                at = index[origin]
                cid = case_id(s.tile_id, spec.name, origin)
                key = case_key(cid)
                history = values[at - HISTORY : at]
                case_rows.append(
                    {
                        "case_key": key,
                        "target": spec.name,
                        "city": s.city,
                        "tile_id": s.tile_id,
                        "scale": SCALE,
                        "unit": panel.unit[s.tile_id],
                        "aggregation": spec.aggregation,
                        "prediction_period": 0,
                        "history_periods": list(HISTORY_PERIODS),
                        "history": [float(v) for v in history],
                    }
                )
                ref_rows.append(
                    {
                        "case_key": key,
                        "case_id": cid,
                        "target": spec.name,
                        "city": s.city,
                        "tile_id": s.tile_id,
                        "origin_year": origin,
                        "reference": float(values[at]),
                        "unit": panel.unit[s.tile_id],
                        "cohort": s.cohort,
                        "series_order": s.order,
                    }
                )
        achieved[spec.name] = len(picked) * len(ORIGINS)
        for c in panel.counts:
            counts.append({**c, "selected_series": per_city.get(c["city"], 0)})
    case_rows.sort(key=lambda r: r["case_key"])
    ref_rows.sort(key=lambda r: r["case_key"])
    eligibility = pa.Table.from_pylist(counts) if counts else _empty_eligibility()
    return CaseSet(
        cases=pa.Table.from_pylist(case_rows, schema=CASE_SCHEMA),
        references=pa.Table.from_pylist(ref_rows, schema=REFERENCE_SCHEMA),
        eligibility=eligibility,
        requested=requested,
        achieved=achieved,
        settings=forecast_settings(),
    )


def _empty_eligibility() -> pa.Table:
    columns = {"target": pa.string(), "city": pa.string()}
    columns |= {name: pa.int64() for name in (*INELIGIBLE, "tiles", "eligible")}
    columns["selected_series"] = pa.int64()
    return pa.table({name: pa.array([], kind) for name, kind in columns.items()})


def eligibility_markdown(eligibility: pa.Table) -> str:
    """The eligibility table as markdown (for the Dagster UI and the build's summary)."""
    if eligibility.num_rows == 0:
        return "no 2 km tile of the published cube has observations of the targets"
    names = eligibility.column_names
    lines = ["| " + " | ".join(names) + " |", "|---" * len(names) + "|"]
    for row in eligibility.to_pylist():
        lines.append("| " + " | ".join(str(row[n]) for n in names) + " |")
    return "\n".join(lines)


def build_cases(
    con: duckdb.DuckDBPyConnection,
    cases_per_target: Mapping[str, int] | None = None,
    targets: Iterable[str] | None = None,
) -> CaseSet:
    """Cases of the published cube behind ``con`` (views ``observations`` and ``tiles``)."""
    names = list(targets) if targets is not None else [t.name for t in TARGETS]
    panels = [eligible_panel(read_panel(con, target(n)), target(n)) for n in names]
    return make_cases(panels, cases_per_target or {})


# ------------------------------------------------------------------------------ scoring


def baseline_predictions(cases: pa.Table) -> dict[str, dict[str, float]]:
    """The two historical baselines per case key: period −1's value and the ten-year mean."""
    keys = cases["case_key"].to_pylist()
    history = cases["history"].to_pylist()
    return {
        "last_year": {k: float(h[-1]) for k, h in zip(keys, history, strict=True)},
        "ten_year_mean": {k: float(np.mean(h)) for k, h in zip(keys, history, strict=True)},
    }


def _from_sums(
    n: np.ndarray,
    sy: np.ndarray,
    syy: np.ndarray,
    sabs: np.ndarray,
    sape: np.ndarray,
    sse: np.ndarray,
) -> dict[str, np.ndarray]:
    """The four metrics from pooled sums (arrays of replicates, or scalars)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        total = syy - sy * sy / n
        r2 = np.where(total > 1e-12 * np.maximum(syy, 1e-300), 1.0 - sse / total, np.nan)
        return {
            "mae": sabs / n,
            "mape": 100.0 * sape / n,
            "rmse": np.sqrt(sse / n),
            "r2": r2,
        }


def block_draws(
    blocks: np.ndarray, strata: np.ndarray, replicates: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """How often each block is drawn in each replicate: (unique blocks, counts[replicates, B]).

    Within each stratum (in sorted order) its blocks are drawn with replacement as many times
    as it has blocks, from one generator seeded with ``seed``: the same draws serve every
    method of the group.
    """
    names, block_of = np.unique(blocks, return_inverse=True)
    stratum_of_block = np.empty(len(names), dtype=object)
    stratum_of_block[block_of] = strata
    rng = np.random.default_rng(seed)
    counts = np.zeros(replicates * len(names), dtype=np.int64)
    offsets = (np.arange(replicates, dtype=np.int64) * len(names))[:, None]
    for stratum in sorted(set(stratum_of_block.tolist())):
        members = np.flatnonzero(stratum_of_block == stratum)
        draws = members[rng.integers(0, len(members), size=(replicates, len(members)))]
        counts += np.bincount((offsets + draws).ravel(), minlength=counts.size)
    return names, counts.reshape(replicates, len(names))


def bootstrap_intervals(
    reference: np.ndarray,
    predictions: Mapping[str, np.ndarray],
    blocks: np.ndarray,
    strata: np.ndarray,
    *,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> dict[str, dict[str, tuple[float, float]]]:
    """Percentile intervals of every metric of every method, by stratified block bootstrap.

    Per block the sums the metrics need (cases, Σy, Σy², Σ|e|, Σ|e|/|y|, Σe²) are taken once;
    a replicate's sums are its block counts times those sums (one matrix product), so 10,000
    replicates cost milliseconds. R² uses each replicate's own reference mean.
    """
    y = np.asarray(reference, dtype=np.float64)
    names, counts = block_draws(np.asarray(blocks), np.asarray(strata), replicates, seed)
    block_of = np.searchsorted(names, np.asarray(blocks))
    nb = len(names)

    def per_block(values: np.ndarray) -> np.ndarray:
        return np.bincount(block_of, weights=values, minlength=nb)

    c = counts.astype(np.float64)
    n = c @ per_block(np.ones_like(y))
    sy = c @ per_block(y)
    syy = c @ per_block(y * y)
    tail = 100.0 * (1.0 - level) / 2.0
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for method, p in predictions.items():
        e = y - np.asarray(p, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ape = np.abs(e) / np.abs(y)
        values = _from_sums(
            n, sy, syy, c @ per_block(np.abs(e)), c @ per_block(ape), c @ per_block(e * e)
        )
        out[method] = {}
        for metric, v in values.items():
            finite = v[np.isfinite(v)]
            if finite.size == 0:
                out[method][metric] = (float("nan"), float("nan"))
                continue
            low, high = np.percentile(finite, [tail, 100.0 - tail])
            out[method][metric] = (float(low), float(high))
    return out


SCORE_SCHEMA = pa.schema(
    [
        ("target", pa.string()),
        ("group", pa.string()),
        ("method", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("unit", pa.string()),
        ("cases", pa.int64()),
        ("blocks", pa.int64()),
    ]
)
"""One row per target, evaluation group (``all`` or a city), method and metric."""


def _metric_unit(metric: str, unit: str) -> str:
    return {"mape": "%", "r2": "1"}.get(metric, unit)


def _group_rows(
    spec: ForecastTarget,
    group: str,
    refs: pa.Table,
    methods: Mapping[str, np.ndarray],
    metrics: Sequence[str],
    replicates: int,
    seed: int,
) -> list[dict[str, Any]]:
    y = refs["reference"].to_numpy()
    blocks = np.asarray(refs["tile_id"].to_pylist())
    strata = np.asarray(refs["city"].to_pylist())
    units = sorted(set(refs["unit"].to_pylist()))
    unit = units[0] if len(units) == 1 else "mixed"
    intervals = bootstrap_intervals(y, methods, blocks, strata, replicates=replicates, seed=seed)
    point = {"mae": mae, "mape": mape, "rmse": rmse, "r2": r_squared}
    rows = []
    for method, p in methods.items():
        for metric in metrics:
            if metric == "mape" and np.any(y == 0):
                value, (low, high) = float("nan"), (float("nan"), float("nan"))
            else:
                value, (low, high) = point[metric](y, p), intervals[method][metric]
            rows.append(
                {
                    "target": spec.name,
                    "group": group,
                    "method": method,
                    "metric": metric,
                    "value": value,
                    "ci_low": low,
                    "ci_high": high,
                    "unit": _metric_unit(metric, unit),
                    "cases": len(y),
                    "blocks": len(set(blocks.tolist())),
                }
            )
    return rows


def score_cases(
    references: pa.Table,
    predictions: Mapping[str, Mapping[str, float]],
    *,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> pa.Table:
    """Scores of each method (case key -> value) on the cases it predicts (``SCORE_SCHEMA``).

    A method is scored on a target when it predicts every case of that target; a target it
    leaves out entirely is skipped, one it covers in part is an error. LST and carbon pool
    their cases (group ``all``, strata cities); property is scored per city in local currency
    and its MAPE also pooled over cities (group ``all``). Each group's bootstrap is seeded with
    ``seed`` afresh, so a group's intervals do not depend on which other groups exist.
    """
    rows: list[dict[str, Any]] = []
    for spec in TARGETS:
        mask = np.asarray(references["target"].to_pylist()) == spec.name
        refs = references.filter(pa.array(mask))
        if refs.num_rows == 0:
            continue
        keys = refs["case_key"].to_pylist()
        methods: dict[str, np.ndarray] = {}
        for method, values in predictions.items():
            have = [k in values for k in keys]
            if not any(have):
                continue
            if not all(have):
                missing = [k for k, h in zip(keys, have, strict=True) if not h]
                raise ValueError(
                    f"{method} predicts {sum(have)} of {len(keys)} {spec.name} cases: give "
                    f"every case of a target or none (missing e.g. {missing[:3]})"
                )
            methods[method] = np.array([values[k] for k in keys], dtype=np.float64)
        if not methods:
            continue
        if not spec.per_city:
            rows += _group_rows(spec, "all", refs, methods, METRICS, replicates, seed)
            continue
        rows += _group_rows(spec, "all", refs, methods, ("mape",), replicates, seed)
        cities = np.asarray(refs["city"].to_pylist())
        for city in sorted(set(cities.tolist())):
            at = cities == city
            rows += _group_rows(
                spec,
                city,
                refs.filter(pa.array(at)),
                {m: p[at] for m, p in methods.items()},
                METRICS,
                replicates,
                seed,
            )
    return pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)


def resolve_predictions(
    references: pa.Table, ids: Sequence[str], values: Sequence[float]
) -> dict[str, float]:
    """Predictions keyed by case key, from rows keyed by case id or by case key."""
    by_id = dict(
        zip(references["case_id"].to_pylist(), references["case_key"].to_pylist(), strict=True)
    )
    known = set(by_id.values())
    out: dict[str, float] = {}
    unknown = []
    for i, v in zip(ids, values, strict=True):
        key = by_id.get(i, i if i in known else None)
        if key is None:
            unknown.append(i)
            continue
        if key in out:
            raise ValueError(f"case {i} is predicted twice")
        out[key] = float(v)
    if unknown:
        raise ValueError(
            f"{len(unknown)} predictions name no case of this release (e.g. {unknown[:3]}): "
            "use the case_id of forecast_targets or the case_key of forecast_cases"
        )
    return out


def _cell(row: Mapping[str, Any] | None, digits: int) -> str:
    if row is None or row["value"] is None or not np.isfinite(row["value"]):
        return "–"
    text = f"{row['value']:,.{digits}f}"
    if np.isfinite(row["ci_low"]):
        text += f" [{row['ci_low']:,.{digits}f}, {row['ci_high']:,.{digits}f}]"
    return text


def summary_markdown(scores: pa.Table) -> str:
    """Table 4's form (headline metric per target, methods as rows) and the RMSE / R² tables."""
    rows = scores.to_pylist()
    at = {(r["target"], r["group"], r["method"], r["metric"]): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    headers = {
        "lst": "LST MAE (°C)",
        "carbon": "Carbon MAE (tonne C/tile/year)",
        "property": "Property MAPE (%)",
    }
    lines = [
        "| method | " + " | ".join(headers[t.name] for t in TARGETS) + " |",
        "|---" * (len(TARGETS) + 1) + "|",
    ]
    for m in methods:
        cells = [_cell(at.get((t.name, "all", m, t.headline)), 3) for t in TARGETS]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Point estimate [95 % interval, city-stratified tile-block bootstrap].")
    groups = list(dict.fromkeys((r["target"], r["group"]) for r in rows if r["metric"] == "rmse"))
    for t, g in groups:
        sample = at.get((t, g, methods[0], "rmse")) or next(
            r for r in rows if (r["target"], r["group"], r["metric"]) == (t, g, "rmse")
        )
        title = t if g == "all" else f"{t}, {g}"
        lines += [
            "",
            f"**{title}** ({sample['cases']} cases, {sample['blocks']} tiles; RMSE in "
            f"{sample['unit']})",
            "",
            "| method | MAE | MAPE (%) | RMSE | R² |",
            "|---|---|---|---|---|",
        ]
        for m in methods:
            if (t, g, m, "rmse") not in at:
                continue
            cells = [_cell(at.get((t, g, m, k)), 3) for k in METRICS]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ release files


@dataclass(frozen=True)
class ForecastFiles:
    """Paths of the forecasting cases and their scores in one benchmark folder."""

    root: Path
    """The folder: the draft's (:meth:`draft`), a snapshot's or the published one
    (:meth:`published`)."""

    @classmethod
    def draft(cls, release: Release) -> ForecastFiles:
        """Where a build writes them (no reader opens the draft)."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.draft_dir / BENCHMARK_DIR)

    @classmethod
    def published(cls, release: Release) -> ForecastFiles:
        """The published ones (what readers see)."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.published_root / BENCHMARK_DIR)

    @property
    def cases(self) -> Path:
        """What a forecaster is given: no calendar years, no references."""
        return self.root / "forecast_cases.parquet"

    @property
    def references(self) -> Path:
        """Held out: case ids, origin years and observed values."""
        return self.root / "forecast_targets.parquet"

    @property
    def eligibility(self) -> Path:
        """Per target and city: tiles, eligible, selected, and why the others are not."""
        return self.root / "forecast_eligibility.parquet"

    @property
    def manifest(self) -> Path:
        """Settings, asked-for and achieved counts, and the files' hashes."""
        return self.root / "forecast_manifest.json"

    def scores(self, suffix: str) -> Path:
        """The baselines' scores (``parquet``, ``csv`` or ``md``)."""
        return self.root / f"forecast_baseline_scores.{suffix}"


def write_forecast_cases(
    release: Release, cases_per_target: Mapping[str, int] | None = None
) -> CaseSet:
    """Cases, references, eligibility and manifest of the forecasting track of the cube being
    built, into the draft (published with the tables they come from)."""
    from citycube.cube.release import (
        build_connection,
        file_metadata,
        write_json_atomic,
        write_parquet_atomic,
    )

    files = ForecastFiles.draft(release)
    with build_connection(release) as con:
        found = build_cases(con, cases_per_target)
    meta = file_metadata(release, **{"citycube:forecast_settings": json.dumps(found.settings)})
    write_parquet_atomic(found.cases, files.cases, meta)
    write_parquet_atomic(found.references, files.references, meta)
    write_parquet_atomic(found.eligibility, files.eligibility, meta)
    eligible = {
        t: {r["city"]: r["eligible"] for r in found.eligibility.to_pylist() if r["target"] == t}
        for t in found.requested
    }
    manifest = {
        "release": release.version,
        **found.settings,
        "requested": found.requested,
        "achieved": found.achieved,
        "complete": found.complete,
        "eligible_tiles": eligible,
        "note": (
            "every target got the cases it asked for"
            if found.complete
            else "the published cube holds fewer eligible tiles (complete 2010–2024 panels) "
            "than asked for: each target has the cases its eligible tiles allow"
        ),
        "files": {
            name: {"path": path.name, "sha256": file_sha256(path)}
            for name, path in (
                ("cases", files.cases),
                ("references", files.references),
                ("eligibility", files.eligibility),
            )
        },
    }
    write_json_atomic(manifest, files.manifest)
    return found


def write_scores(scores: pa.Table, stem: Path, release: Release) -> dict[str, Path]:
    """Scores as Parquet, CSV and a markdown summary next to each other (``stem``.*)."""
    import pyarrow.csv as pacsv

    from citycube.cube.release import file_metadata, write_parquet_atomic
    from citycube.io.atomic import atomic_path, write_text_atomic

    paths = {s: stem.with_name(f"{stem.name}.{s}") for s in ("parquet", "csv", "md")}
    write_parquet_atomic(scores, paths["parquet"], file_metadata(release))
    with atomic_path(paths["csv"]) as tmp:
        pacsv.write_csv(scores, str(tmp))
    write_text_atomic(summary_markdown(scores), paths["md"])
    return paths


def score_release(
    release: Release,
    predictions: Mapping[str, Mapping[str, float]] | None = None,
    *,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
    files: ForecastFiles | None = None,
) -> pa.Table:
    """The baselines (and ``predictions``: method -> case key -> value) on the release's cases
    (the published ones, or those in ``files``)."""
    import pyarrow.parquet as pq

    files = files or ForecastFiles.published(release)
    cases = pq.read_table(files.cases)
    references = pq.read_table(files.references)
    methods = {**(predictions or {}), **baseline_predictions(cases)}
    return score_cases(references, methods, replicates=replicates, seed=seed)


def write_baseline_scores(release: Release) -> tuple[pa.Table, dict[str, Path]]:
    """Score the two baselines on the draft's cases and write them into the draft."""
    files = ForecastFiles.draft(release)
    scores = score_release(release, files=files)
    stem = files.scores("parquet").with_suffix("")
    return scores, write_scores(scores, stem, release)


def create_forecast_views(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """Views over the forecasting files present now in ``folder`` (a snapshot's benchmark
    folder); the names created."""
    from citycube.cube.release import create_file_view

    files = ForecastFiles(folder)
    created = []
    for name, path in (
        ("forecast_cases", files.cases),
        ("forecast_targets", files.references),
        ("forecast_eligibility", files.eligibility),
        ("forecast_scores", files.scores("parquet")),
    ):
        if path.exists():
            create_file_view(con, name, path)
            created.append(name)
    return created
