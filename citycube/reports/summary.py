"""A short text summary of a release's database, printed at the end of a build."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb


def summary_text(duckdb_file: Path) -> str:
    """A short DuckDB summary of a release: tiles, availability, fields."""
    import duckdb

    from citycube.io.database import database_error

    try:
        con = duckdb.connect(str(duckdb_file), read_only=True)
    except duckdb.Error as exc:
        raise database_error(duckdb_file, exc) from None
    try:
        return _summary(con, duckdb_file)
    except duckdb.IOException as exc:  # a damaged block is met when it is read
        raise database_error(duckdb_file, exc) from None
    finally:
        con.close()


def _summary(con: duckdb.DuckDBPyConnection, duckdb_file: Path) -> str:
    """The summary's lines from an open connection."""
    out = [f"release database: {duckdb_file}"]
    tiles = con.execute("SELECT scale, count(*) FROM tiles GROUP BY 1 ORDER BY 1").fetchall()
    out.append("tiles: " + ", ".join(f"{s}={n}" for s, n in tiles))
    rel = dict(con.execute("SELECT key, value FROM release").fetchall())
    out.append(f"version {rel.get('version')}  synthetic={rel.get('synthetic')}")
    rows = con.execute(
        """
        SELECT modality, city, count(DISTINCT year) AS years,
               count(*) FILTER (WHERE available) AS available_rows, count(*) AS rows,
               string_agg(DISTINCT reason, ', ') FILTER (WHERE reason IS NOT NULL) AS reasons
        FROM observations GROUP BY ALL ORDER BY modality, city
        """
    ).fetchall()
    out.append(f"{'modality':<9}{'city':<14}{'years':>6}{'available':>12}{'rows':>8}  reasons")
    for m, c, y, a, n, r in rows:
        out.append(f"{m:<9}{c:<14}{y:>6}{a:>12}{n:>8}  {r or '-'}")
    return "\n".join(out)
