"""Cube quality checks as plain functions over DuckDB, so Dagster and tests share them."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Catalogue
from citycube.cube.release import OBSERVATION_SCHEMA


@dataclass(frozen=True)
class CheckOutcome:
    """Result of one check: pass/fail, a one-line description and details."""

    passed: bool
    description: str
    details: dict = field(default_factory=dict)


_DUCK_TYPES = {
    "string": "VARCHAR",
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
}


def check_schema(con: duckdb.DuckDBPyConnection) -> CheckOutcome:
    """Observations have exactly the documented columns and types."""
    actual = {r[0]: r[1] for r in con.execute("DESCRIBE observations").fetchall()}
    expected = {f.name: _DUCK_TYPES[str(f.type)] for f in OBSERVATION_SCHEMA}
    problems = {k: (actual.get(k), v) for k, v in expected.items() if actual.get(k) != v}
    extra = sorted(set(actual) - set(expected))
    described = [f"column {k} is {a or 'missing'}, {v} expected" for k, (a, v) in problems.items()]
    described += [f"column {k} is not in the schema" for k in extra]
    return CheckOutcome(
        not problems and not extra,
        _failed("observations columns and types match the schema", described),
        {"mismatched": {k: list(v) for k, v in problems.items()}, "unexpected": extra},
    )


MOST_PARTITIONS = 10
"""Failing partitions a check's description names (its details count them all)."""


def _failed(description: str, partitions: list[str]) -> str:
    """A failed check's description: what it checks, then the partitions that fail it."""
    if not partitions:
        return description
    named = "; ".join(partitions[:MOST_PARTITIONS])
    more = len(partitions) - MOST_PARTITIONS
    return f"{description}: FAILED in {named}" + (f"; and {more} more" if more > 0 else "")


def check_unique_keys(con: duckdb.DuckDBPyConnection) -> CheckOutcome:
    """No duplicate (tile, year, modality, field) rows."""
    dupes = con.execute(
        """
        SELECT count(*) FROM (
          SELECT tile_id, year, modality, field FROM observations
          GROUP BY ALL HAVING count(*) > 1)
        """
    ).fetchone()[0]
    description = "tile/year/modality/field keys are unique"
    if dupes == 0:
        return CheckOutcome(True, description, {"duplicates": 0})
    rows = con.execute(  # only when it fails: which partitions hold the duplicates
        """
        SELECT modality, city, year, count(*) FROM (
          SELECT tile_id, year, modality, field, any_value(city) AS city FROM observations
          GROUP BY tile_id, year, modality, field HAVING count(*) > 1)
        GROUP BY ALL ORDER BY ALL
        """
    ).fetchall()
    partitions = [f"{m} {c} {y} ({n} duplicated keys)" for m, c, y, n in rows]
    return CheckOutcome(
        False, _failed(description, partitions), {"duplicates": dupes, "partitions": partitions}
    )


UNCOVERED_REASONS = ("source_year_missing", "outside_source_coverage")
"""Reasons that say the source does not cover the tile-year: not held against availability."""


@dataclass(frozen=True)
class ModalityCounts:
    """One modality's row counts, from one scan of the observations."""

    rows: int
    available: int
    inconsistent: int
    """Available rows without a finite value or with a reason; unavailable rows with a value
    or without a reason."""
    out_of_range: int
    """Available rows outside the modality's ``value_range``."""
    covered: int
    """Rows whose source covers the tile-year (no reason in ``UNCOVERED_REASONS``)."""
    covered_available: int


def modality_counts(
    con: duckdb.DuckDBPyConnection, catalogue: Catalogue | None = None
) -> dict[str, ModalityCounts]:
    """Every modality's counts in one scan of the observations (ranges from ``catalogue``).

    The value and availability checks and the row totals each read all of a whole-calendar
    release's 7,500 Parquet files in a query of their own (2–3 s each); they share this one.
    """
    ranged = [m for m in (catalogue.modalities if catalogue else []) if m.value_range is not None]
    rows = con.execute(
        """
        WITH ranges AS (
            SELECT unnest(?::VARCHAR[]) AS modality, unnest(?::DOUBLE[]) AS lo,
                   unnest(?::DOUBLE[]) AS hi
        ), marked AS (
            SELECT o.modality, o.available, o.value, o.reason, r.lo, r.hi,
                   coalesce(o.reason, '') NOT IN (SELECT unnest(?::VARCHAR[])) AS covered
            FROM observations AS o LEFT JOIN ranges AS r USING (modality)
        )
        SELECT modality,
               count(*),
               count(*) FILTER (WHERE available),
               count(*) FILTER (
                   WHERE (available AND (value IS NULL OR NOT isfinite(value)
                                         OR reason IS NOT NULL))
                      OR (NOT available AND (value IS NOT NULL OR reason IS NULL))
               ),
               count(*) FILTER (WHERE available AND (value < lo OR value > hi)),
               count(*) FILTER (WHERE covered),
               count(*) FILTER (WHERE covered AND available)
        FROM marked GROUP BY modality ORDER BY modality
        """,
        [
            [m.code for m in ranged],
            [float(m.value_range[0]) for m in ranged],  # type: ignore[index]
            [float(m.value_range[1]) for m in ranged],  # type: ignore[index]
            list(UNCOVERED_REASONS),
        ],
    ).fetchall()
    return {code: ModalityCounts(*(int(n) for n in counts)) for code, *counts in rows}


def check_values(
    con: duckdb.DuckDBPyConnection,
    catalogue: Catalogue,
    counts: dict[str, ModalityCounts] | None = None,
) -> CheckOutcome:
    """Available rows hold a finite value in range; unavailable rows hold NULL and a reason.

    ``counts``: :func:`modality_counts` with the same catalogue, when already taken.
    """
    counts = counts if counts is not None else modality_counts(con, catalogue)
    bad_nulls = sum(c.inconsistent for c in counts.values())
    out_of_range = {code: c.out_of_range for code, c in counts.items() if c.out_of_range}
    description = "values are in range; unavailable rows are NULL with a reason (no zero-fill)"
    details: dict = {"inconsistent_rows": bad_nulls, "out_of_range": out_of_range}
    if bad_nulls == 0 and not out_of_range:
        return CheckOutcome(True, description, details)
    partitions = _value_problems(con, catalogue)  # only when it fails: a scan of its own
    details["partitions"] = partitions
    return CheckOutcome(False, _failed(description, partitions), details)


def _value_problems(con: duckdb.DuckDBPyConnection, catalogue: Catalogue) -> list[str]:
    """Each (modality, city, year) partition that fails the value check, and how."""
    ranged = [m for m in catalogue.modalities if m.value_range is not None]
    rows = con.execute(
        """
        WITH ranges AS (
            SELECT unnest(?::VARCHAR[]) AS modality, unnest(?::DOUBLE[]) AS lo,
                   unnest(?::DOUBLE[]) AS hi
        ), marked AS (
            SELECT o.modality, o.city, o.year, o.value, r.lo, r.hi,
                   (o.available AND (o.value IS NULL OR NOT isfinite(o.value)
                                     OR o.reason IS NOT NULL))
                   OR (NOT o.available AND (o.value IS NOT NULL OR o.reason IS NULL))
                     AS inconsistent,
                   o.available AND (o.value < r.lo OR o.value > r.hi) AS outside
            FROM observations AS o LEFT JOIN ranges AS r USING (modality)
        )
        SELECT modality, city, year,
               count(*) FILTER (WHERE inconsistent),
               count(*) FILTER (WHERE outside),
               min(value) FILTER (WHERE outside), max(value) FILTER (WHERE outside),
               any_value(lo), any_value(hi)
        FROM marked GROUP BY modality, city, year
        HAVING count(*) FILTER (WHERE inconsistent OR outside) > 0
        ORDER BY modality, city, year
        """,
        [
            [m.code for m in ranged],
            [float(m.value_range[0]) for m in ranged],  # type: ignore[index]
            [float(m.value_range[1]) for m in ranged],  # type: ignore[index]
        ],
    ).fetchall()
    out = []
    for modality, city, year, inconsistent, outside, low, high, lo, hi in rows:
        what = []
        if outside:
            what.append(
                f"{outside} values outside {modality}'s range [{lo:g}, {hi:g}] "
                f"(from {low:g} to {high:g})"
            )
        if inconsistent:
            what.append(
                f"{inconsistent} rows whose value does not match their availability "
                "(a zero-filled unavailable tile, or an available one without a finite value)"
            )
        out.append(f"{modality} {city} {year}: {', '.join(what)}")
    return out


def check_availability_floor(
    con: duckdb.DuckDBPyConnection,
    floor: float = 0.25,
    counts: dict[str, ModalityCounts] | None = None,
) -> CheckOutcome:
    """Where a source covers the year, at least ``floor`` of tiles are available per modality."""
    counts = counts if counts is not None else modality_counts(con)
    shares = {m: c.covered_available / c.covered for m, c in counts.items() if c.covered}
    low = {m: round(s, 4) for m, s in shares.items() if s < floor}
    return CheckOutcome(
        not low,
        f"each modality has ≥ {floor:.0%} of tiles available where its source covers the year",
        {"shares": {m: round(s, 4) for m, s in shares.items()}, "below_floor": low},
    )


def check_tile_counts(con: duckdb.DuckDBPyConnection) -> CheckOutcome:
    """The tiles table matches the grid sizes of AgenticCity-Bench Table 7 for every city and
    scale."""
    counts = {
        (c, s): n
        for c, s, n in con.execute(
            "SELECT city, scale, count(*) FROM tiles GROUP BY ALL"
        ).fetchall()
    }
    wrong = {}
    for key, spec in load_cities().items():
        for scale in ("2km", "5km"):
            shape = spec.grid_shape(scale)  # type: ignore[arg-type]
            if counts.get((key, scale)) != shape.rows * shape.cols:
                wrong[f"{key}/{scale}"] = [counts.get((key, scale)), shape.rows * shape.cols]
    description = "tile counts match AgenticCity-Bench Table 7 for every city and scale"
    partitions = [f"{key}: {got} tiles, {want} expected" for key, (got, want) in wrong.items()]
    return CheckOutcome(not wrong, _failed(description, partitions), wrong)
