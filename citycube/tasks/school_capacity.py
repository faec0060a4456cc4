"""School capacity planning cases (AgenticCity-Bench App. D.1, D.3.1): London schools whose
enrollment and capacity of 2021/22–2023/24 are given, to forecast 2024/25 enrollment and plan
added seats.

Eligibility follows the paper: a primary or secondary school with exactly one record in each
academic year 2021/22–2024/25, the same phase in all of them, enrollment known and ≥ 0,
capacity known and > 0, and a coordinate on the city's 2 km grid. Schools go to a development
or a test pool by a hash of their tile, so co-located schools share a pool; cases come from the
test pool, at most one school per tile. With ``E₊₁`` the target-year enrollment and ``C₀`` the
last historical capacity, a school is *balanced* when 0.95 ≤ E₊₁/C₀ ≤ 1.05, *shortage* above,
*surplus* below (excluded). The paper's cohort keeps 20 pilot cases, which are not published;
here both strata are filled in one fixed hash order of (seed, URN), to 50 cases each, 30 primary
and 20 secondary per stratum (60 and 40 in all, the paper's split).

The records come in as one table (built by the source adapter, see ``sources.dfe_schools``):
``urn, academic_year, phase, capacity, pupils, name, tile_id, location_reason``.

Scoring (App. D.3.1): enrollment MAE; a plan of capacity ``C = C₀ + added`` is balanced when
0.95 ≤ E/C ≤ 1.05. The paper's capacity-balance equation did not survive in our copy of the
text; the score used here is ``100 · min(E/C, C/E)``: 100 at E = C, falling symmetrically in the
ratio on either side (a 5 % surplus or shortage scores about 95).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import duckdb

    from citycube.cube.release import Release

CITY = "London"
"""The city the reference covers (the publications cover England)."""
HISTORY_YEARS = (2021, 2022, 2023)
"""Academic years the agent sees (2021/22–2023/24), periods −2, −1 and 0."""
TARGET_YEAR = 2024
"""The academic year planned for (2024/25), period +1."""
PHASES = ("primary", "secondary")
"""Phases kept."""
BALANCED = (0.95, 1.05)
"""Utilisation band of a balanced school or plan."""
QUOTAS: dict[tuple[str, str], int] = {
    ("balanced", "primary"): 30,
    ("balanced", "secondary"): 20,
    ("shortage", "primary"): 30,
    ("shortage", "secondary"): 20,
}
"""Cases per stratum and phase: 50 balanced and 50 shortage, 60 primary and 40 secondary."""
TEST_SHARE = 0.5
"""Share of tiles in the test pool."""
DEFAULT_SEED = 20_240
"""Seed of the pool and selection hashes."""
REASONS = (
    "not_primary_or_secondary",
    "missing_year",
    "duplicate_record",
    "inconsistent_phase",
    "invalid_enrollment",
    "invalid_capacity",
    "no_grid_coordinate",
)
"""Why a school is not eligible, in the order they are checked (the first that applies)."""

CASE_SCHEMA = pa.schema(
    [
        ("case_key", pa.string()),
        ("city", pa.string()),
        ("tile_id", pa.string()),
        ("school_name", pa.string()),
        ("phase", pa.string()),
        ("enrollment", pa.list_(pa.int64())),
        ("capacity", pa.list_(pa.int64())),
    ]
)
"""What an agent is given: periods −2, −1, 0 (no years, no URN, no target)."""
REFERENCE_SCHEMA = pa.schema(
    [
        ("case_key", pa.string()),
        ("urn", pa.int64()),
        ("tile_id", pa.string()),
        ("phase", pa.string()),
        ("stratum", pa.string()),
        ("history_years", pa.list_(pa.int16())),
        ("target_year", pa.int16()),
        ("capacity_0", pa.int64()),
        ("target_enrollment", pa.int64()),
        ("target_capacity", pa.int64()),
        ("ratio", pa.float64()),
        ("selection_order", pa.int32()),
    ]
)
"""Held out: the school's URN, the years, the target enrollment and its stratum."""
SCORE_SCHEMA = pa.schema(
    [
        ("strategy", pa.string()),
        ("group", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("cases", pa.int64()),
        ("submitted", pa.int64()),
    ]
)
"""One row per strategy, group (``all``, a stratum, a phase) and metric."""


def _hash(*parts: object) -> int:
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def pool_of(tile_id: str, seed: int = DEFAULT_SEED) -> str:
    """``test`` or ``dev`` by a hash of the tile (schools of one tile share a pool)."""
    return "test" if _hash(seed, "pool", tile_id) / 2**64 < TEST_SHARE else "dev"


def case_key(urn: int, seed: int = DEFAULT_SEED) -> str:
    """An opaque case key (``school_plan_<12 hex>``): no URN, no year."""
    return "school_plan_" + hashlib.sha256(f"{seed}:{urn}".encode()).hexdigest()[:12]


def stratum(enrollment: float, capacity: float) -> str:
    """``balanced``, ``shortage`` or ``surplus`` of enrollment against capacity."""
    ratio = enrollment / capacity
    if ratio > BALANCED[1]:
        return "shortage"
    return "balanced" if ratio >= BALANCED[0] else "surplus"


@dataclass(frozen=True)
class School:
    """An eligible school: its records of 2021/22–2024/25 in year order."""

    urn: int
    name: str
    phase: str
    tile_id: str
    enrollment: tuple[int, ...]
    capacity: tuple[int, ...]

    @property
    def stratum(self) -> str:
        """Target-year enrollment against the last historical capacity."""
        return stratum(self.enrollment[-1], self.capacity[-2])


def eligible_schools(records: pa.Table) -> tuple[list[School], Counter[str]]:
    """The eligible schools, and how many were left out for each reason (:data:`REASONS`)."""
    years = (*HISTORY_YEARS, TARGET_YEAR)
    by_urn: dict[int, list[dict[str, Any]]] = {}
    for row in records.to_pylist():
        by_urn.setdefault(int(row["urn"]), []).append(row)
    schools: list[School] = []
    reasons: Counter[str] = Counter()
    for urn in sorted(by_urn):
        rows = [r for r in by_urn[urn] if r["academic_year"] in years]
        counts = Counter(r["academic_year"] for r in rows)
        phases = {r["phase"] for r in rows}
        gias = {r.get("gias_phase") for r in rows} - {None}
        if not phases & set(PHASES):
            reason = "not_primary_or_secondary"
        elif any(counts[y] == 0 for y in years):
            reason = "missing_year"
        elif any(counts[y] > 1 for y in years):
            reason = "duplicate_record"
        elif len(phases) != 1 or (gias and gias != phases):
            reason = "inconsistent_phase"
        elif any(r["pupils"] is None or r["pupils"] < 0 for r in rows):
            reason = "invalid_enrollment"
        elif any(r["capacity"] is None or r["capacity"] <= 0 for r in rows):
            reason = "invalid_capacity"
        elif rows[0].get("tile_id") is None:
            reason = "no_grid_coordinate"
        else:
            rows.sort(key=lambda r: r["academic_year"])
            schools.append(
                School(
                    urn=urn,
                    name=str(rows[0].get("name") or ""),
                    phase=rows[0]["phase"],
                    tile_id=rows[0]["tile_id"],
                    enrollment=tuple(int(r["pupils"]) for r in rows),
                    capacity=tuple(int(r["capacity"]) for r in rows),
                )
            )
            continue
        reasons[reason] += 1
    return schools, reasons


@dataclass
class SchoolCaseSet:
    """The selected cases, their held-out references and how the counts came about."""

    cases: pa.Table
    references: pa.Table
    eligibility: pa.Table
    requested: dict[str, int]
    achieved: dict[str, int]
    note: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every quota filled."""
        return self.achieved == self.requested


def _cell_name(cell: tuple[str, str]) -> str:
    return f"{cell[0]}/{cell[1]}"


def select_cases(
    records: pa.Table | None,
    *,
    seed: int = DEFAULT_SEED,
    quotas: Mapping[tuple[str, str], int] | None = None,
    unavailable: str | None = None,
) -> SchoolCaseSet:
    """The case set of the records (or an empty one saying ``unavailable``).

    All eligible test-pool schools that are not surplus are taken in one hash order of
    (seed, URN); a school joins when its stratum × phase quota is open and its tile has no
    case yet.
    """
    quotas = dict(QUOTAS if quotas is None else quotas)
    requested = {_cell_name(c): n for c, n in quotas.items()}
    settings = {
        "seed": seed,
        "city": CITY,
        "history_years": list(HISTORY_YEARS),
        "target_year": TARGET_YEAR,
        "balanced_band": list(BALANCED),
        "test_share": TEST_SHARE,
        "quotas": requested,
    }
    if records is None:
        return SchoolCaseSet(
            CASE_SCHEMA.empty_table(),
            REFERENCE_SCHEMA.empty_table(),
            _eligibility_table(Counter(), {}, unavailable or "no records"),
            requested,
            {k: 0 for k in requested},
            unavailable or "no records",
            settings,
        )
    schools, reasons = eligible_schools(records)
    tested = [s for s in schools if pool_of(s.tile_id, seed) == "test"]
    reasons["dev_pool"] = len(schools) - len(tested)
    candidates = sorted(tested, key=lambda s: (_hash(seed, "order", s.urn), s.urn))
    taken: list[School] = []
    used_tiles: set[str] = set()
    filled: Counter[tuple[str, str]] = Counter()
    found: Counter[str] = Counter()
    for school in candidates:
        cell = (school.stratum, school.phase)
        found[_cell_name(cell)] += 1
        if school.tile_id in used_tiles or filled[cell] >= quotas.get(cell, 0):
            continue
        taken.append(school)
        used_tiles.add(school.tile_id)
        filled[cell] += 1
    achieved = {_cell_name(c): filled[c] for c in quotas}
    short = {k: (achieved[k], requested[k]) for k in requested if achieved[k] < requested[k]}
    if not short:
        note = "every stratum and phase got the cases it asked for"
    else:
        parts = ", ".join(f"{k} {a} of {r}" for k, (a, r) in short.items())
        note = (
            f"the records allow fewer cases than asked for ({parts}): the test pool holds "
            f"{len(tested)} eligible schools in {len({s.tile_id for s in tested})} tiles "
            f"({', '.join(f'{k} {v}' for k, v in sorted(found.items()))})"
        )
    cases, refs = [], []
    for order, s in enumerate(taken):
        key = case_key(s.urn, seed)
        cases.append(
            {
                "case_key": key,
                "city": CITY,
                "tile_id": s.tile_id,
                "school_name": s.name,
                "phase": s.phase,
                "enrollment": list(s.enrollment[:-1]),
                "capacity": list(s.capacity[:-1]),
            }
        )
        refs.append(
            {
                "case_key": key,
                "urn": s.urn,
                "tile_id": s.tile_id,
                "phase": s.phase,
                "stratum": s.stratum,
                "history_years": list(HISTORY_YEARS),
                "target_year": TARGET_YEAR,
                "capacity_0": s.capacity[-2],
                "target_enrollment": s.enrollment[-1],
                "target_capacity": s.capacity[-1],
                "ratio": s.enrollment[-1] / s.capacity[-2],
                "selection_order": order,
            }
        )
    order = sorted(range(len(cases)), key=lambda i: cases[i]["case_key"])
    return SchoolCaseSet(
        pa.Table.from_pylist([cases[i] for i in order], schema=CASE_SCHEMA),
        pa.Table.from_pylist([refs[i] for i in order], schema=REFERENCE_SCHEMA),
        _eligibility_table(reasons, found, note, eligible=len(schools)),
        requested,
        achieved,
        note,
        settings,
    )


def _eligibility_table(
    reasons: Counter[str], found: Mapping[str, int], note: str, eligible: int = 0
) -> pa.Table:
    rows = [{"item": "eligible", "schools": eligible, "note": None}]
    rows += [{"item": f"excluded:{r}", "schools": reasons.get(r, 0), "note": None} for r in REASONS]
    rows.append({"item": "excluded:dev_pool", "schools": reasons.get("dev_pool", 0), "note": None})
    rows += [
        {"item": f"test_pool:{k}", "schools": v, "note": None} for k, v in sorted(found.items())
    ]
    rows.append({"item": "note", "schools": None, "note": note})
    schema = pa.schema([("item", pa.string()), ("schools", pa.int64()), ("note", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


# ------------------------------------------------------------------------------ plans


def half_up(value: float) -> int:
    """Round half up (not to even), so a rule gives the same integer everywhere."""
    return math.floor(value + 0.5)


def plan_from_forecast(predicted: int, capacity_0: int) -> int:
    """Seats to add so planned capacity meets the forecast (never a reduction)."""
    return max(0, int(predicted) - int(capacity_0))


def baseline_plan(strategy: str, enrollment: Sequence[int], capacity: Sequence[int]) -> dict:
    """A direct baseline's plan for a case's history: ``three_year_mean`` (the paper's) forecasts
    the mean of the three enrollments, ``last_year`` the last one; both add the seats the
    forecast exceeds period-0 capacity by."""
    if strategy == "three_year_mean":
        predicted = half_up(sum(enrollment) / len(enrollment))
    elif strategy == "last_year":
        predicted = int(enrollment[-1])
    else:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    return {
        "predicted_enrollment": predicted,
        "added_seats": plan_from_forecast(predicted, capacity[-1]),
    }


STRATEGIES = ("three_year_mean", "last_year")
"""The direct baselines (AgenticCity-Bench Table 5 reports ``three_year_mean``)."""


def balance_score(enrollment: float, capacity: float) -> float:
    """``100 · min(E/C, C/E)``: 100 when enrollment equals capacity."""
    if enrollment <= 0 or capacity <= 0:
        return 0.0
    return 100.0 * min(enrollment / capacity, capacity / enrollment)


def score_plans(
    references: pa.Table, plans: Mapping[str, Mapping[str, Any]], strategy: str
) -> pa.Table:
    """Scores of the plans (by case key) against the references, overall, per stratum and
    per phase. A case without a plan counts as not balanced with score 0; the MAE is over
    the plans given (``submitted``)."""
    refs = references.to_pylist()
    groups: dict[str, list[dict[str, Any]]] = {"all": refs}
    for r in refs:
        groups.setdefault(f"stratum:{r['stratum']}", []).append(r)
        groups.setdefault(f"phase:{r['phase']}", []).append(r)
    rows = []
    for group, members in groups.items():
        given = [(r, plans[r["case_key"]]) for r in members if r["case_key"] in plans]
        errors, balanced, scores = [], 0, []
        added = shortfall = surplus = existing_surplus = 0
        for r, p in given:
            e, c0 = int(r["target_enrollment"]), int(r["capacity_0"])
            c = c0 + int(p["added_seats"])
            errors.append(abs(float(p["predicted_enrollment"]) - e))
            balanced += BALANCED[0] <= e / c <= BALANCED[1]
            scores.append(balance_score(e, c))
            added += int(p["added_seats"])
            shortfall += max(0, e - c)
            surplus += max(0, c - e)
            existing_surplus += max(0, c0 - e)
        n = len(members)
        metrics = {
            "enrollment_mae": sum(errors) / len(errors) if errors else float("nan"),
            "balanced_rate_pct": 100.0 * balanced / n if n else float("nan"),
            "mean_balance_score": sum(scores) / n if n else float("nan"),
            "added_seats": float(added),
            "shortfall_seats": float(shortfall),
            "surplus_seats": float(surplus),
            "surplus_seats_existing": float(existing_surplus),
            "surplus_seats_from_expansion": float(surplus - existing_surplus),
        }
        rows += [
            {
                "strategy": strategy,
                "group": group,
                "metric": m,
                "value": v,
                "cases": n,
                "submitted": len(given),
            }
            for m, v in metrics.items()
        ]
    return pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)


def baseline_scores(cases: pa.Table, references: pa.Table) -> pa.Table:
    """Both direct baselines' scores."""
    tables = []
    for strategy in STRATEGIES:
        plans = {
            c["case_key"]: baseline_plan(strategy, c["enrollment"], c["capacity"])
            for c in cases.to_pylist()
        }
        tables.append(score_plans(references, plans, strategy))
    return pa.concat_tables(tables) if tables else SCORE_SCHEMA.empty_table()


# ------------------------------------------------------------------------------ files


@dataclass(frozen=True)
class SchoolFiles:
    """Paths of the school-capacity cases in one benchmark folder."""

    root: Path

    @classmethod
    def draft(cls, release: Release) -> SchoolFiles:
        """Where a build writes them."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.draft_dir / BENCHMARK_DIR)

    @classmethod
    def published(cls, release: Release) -> SchoolFiles:
        """The published ones."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.published_root / BENCHMARK_DIR)

    @property
    def cases(self) -> Path:
        """What a planner is given (no years, no URN, no target)."""
        return self.root / "school_cases.parquet"

    @property
    def references(self) -> Path:
        """Held out: URN, years, target enrollment, stratum."""
        return self.root / "school_targets.parquet"

    @property
    def eligibility(self) -> Path:
        """Schools kept and left out, by reason, and the counts' note."""
        return self.root / "school_eligibility.parquet"

    @property
    def scores(self) -> Path:
        """The direct baselines' scores."""
        return self.root / "school_baseline_scores.parquet"

    @property
    def manifest(self) -> Path:
        """Settings, requested and achieved counts, the note and the files' hashes."""
        return self.root / "school_manifest.json"


def write_school_cases(
    release: Release, found: SchoolCaseSet, provenance: Mapping[str, Any]
) -> SchoolFiles:
    """Cases, references, eligibility, baseline scores and manifest into the draft."""
    from citycube.cube.release import file_metadata, write_json_atomic, write_parquet_atomic
    from citycube.io.digest import file_sha256

    files = SchoolFiles.draft(release)
    meta = file_metadata(release, **{"citycube:school_settings": json.dumps(found.settings)})
    write_parquet_atomic(found.cases, files.cases, meta)
    write_parquet_atomic(found.references, files.references, meta)
    write_parquet_atomic(found.eligibility, files.eligibility, meta)
    write_parquet_atomic(baseline_scores(found.cases, found.references), files.scores, meta)
    manifest = {
        "release": release.version,
        **found.settings,
        "requested": found.requested,
        "achieved": found.achieved,
        "complete": found.complete,
        "cases": found.cases.num_rows,
        "note": found.note,
        "pilot_cases": "AgenticCity-Bench's 20 pilot cases are not published; both strata are "
        "filled in the hash order alone",
        "source": dict(provenance),
        "files": {
            name: {"path": p.name, "sha256": file_sha256(p)}
            for name, p in (
                ("cases", files.cases),
                ("references", files.references),
                ("eligibility", files.eligibility),
                ("scores", files.scores),
            )
        },
    }
    write_json_atomic(manifest, files.manifest)
    return files


def create_school_views(con: duckdb.DuckDBPyConnection, folder: Path) -> list[str]:
    """Views over the school files present now in ``folder``; the names created."""
    from citycube.cube.release import create_file_view

    files = SchoolFiles(folder)
    created = []
    for name, path in (
        ("school_cases", files.cases),
        ("school_targets", files.references),
        ("school_eligibility", files.eligibility),
        ("school_baseline_scores", files.scores),
    ):
        if path.exists():
            create_file_view(con, name, path)
            created.append(name)
    return created
