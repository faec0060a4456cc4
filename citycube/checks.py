"""Cube quality checks as plain functions over DuckDB, so Dagster and tests share them."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from citycube.catalogue import Catalogue
from citycube.cities import load_cities
from citycube.cube import OBSERVATION_SCHEMA


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
    return CheckOutcome(
        not problems and not extra,
        "observations columns and types match the schema",
        {"mismatched": {k: list(v) for k, v in problems.items()}, "unexpected": extra},
    )


def check_unique_keys(con: duckdb.DuckDBPyConnection) -> CheckOutcome:
    """No duplicate (tile, year, modality, field) rows."""
    dupes = con.execute(
        """
        SELECT count(*) FROM (
          SELECT tile_id, year, modality, field FROM observations
          GROUP BY ALL HAVING count(*) > 1)
        """
    ).fetchone()[0]
    return CheckOutcome(
        dupes == 0, "tile/year/modality/field keys are unique", {"duplicates": dupes}
    )


def check_values(con: duckdb.DuckDBPyConnection, catalogue: Catalogue) -> CheckOutcome:
    """Available rows hold a finite value in range; unavailable rows hold NULL and a reason.

    One scan of the observations for every modality's range (a query per modality read all of
    a whole-calendar release's Parquet 18 times).
    """
    ranged = [m for m in catalogue.modalities if m.value_range is not None]
    rows = con.execute(
        """
        WITH ranges AS (
            SELECT unnest(?::VARCHAR[]) AS modality, unnest(?::DOUBLE[]) AS lo,
                   unnest(?::DOUBLE[]) AS hi
        )
        SELECT o.modality,
               count(*) FILTER (
                   WHERE (o.available AND (o.value IS NULL OR NOT isfinite(o.value)
                                           OR o.reason IS NOT NULL))
                      OR (NOT o.available AND (o.value IS NOT NULL OR o.reason IS NULL))
               ) AS inconsistent,
               count(*) FILTER (WHERE o.available AND (o.value < r.lo OR o.value > r.hi))
                   AS out_of_range
        FROM observations AS o LEFT JOIN ranges AS r USING (modality)
        GROUP BY o.modality ORDER BY o.modality
        """,
        [
            [m.code for m in ranged],
            [float(m.value_range[0]) for m in ranged],  # type: ignore[index]
            [float(m.value_range[1]) for m in ranged],  # type: ignore[index]
        ],
    ).fetchall()
    bad_nulls = sum(int(inconsistent) for _, inconsistent, _ in rows)
    out_of_range = {code: int(n) for code, _, n in rows if n}
    return CheckOutcome(
        bad_nulls == 0 and not out_of_range,
        "values are in range; unavailable rows are NULL with a reason (no zero-fill)",
        {"inconsistent_rows": bad_nulls, "out_of_range": out_of_range},
    )


def check_availability_floor(con: duckdb.DuckDBPyConnection, floor: float = 0.25) -> CheckOutcome:
    """Where a source covers the year, at least ``floor`` of tiles are available per modality."""
    rows = con.execute(
        """
        SELECT modality, avg(available::INT) AS share FROM observations
        WHERE coalesce(reason, '') NOT IN ('source_year_missing', 'outside_source_coverage')
        GROUP BY modality ORDER BY modality
        """
    ).fetchall()
    low = {m: round(s, 4) for m, s in rows if s < floor}
    return CheckOutcome(
        not low,
        f"each modality has ≥ {floor:.0%} of tiles available where its source covers the year",
        {"shares": {m: round(s, 4) for m, s in rows}, "below_floor": low},
    )


def check_tile_counts(con: duckdb.DuckDBPyConnection) -> CheckOutcome:
    """The tiles table matches the grid sizes of SPEC §1 for every city and scale."""
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
    return CheckOutcome(not wrong, "tile counts match SPEC §1 for every city and scale", wrong)
