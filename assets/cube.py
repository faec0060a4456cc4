"""Cube assets downstream of the modalities: the tiles table, then the DuckDB catalogue, built
aside and checked, then published.

Write, audit, publish: ``cube/tiles`` writes the tiles table into the release's draft,
``cube/staged_database`` builds the new database next to the release over a snapshot of the
draft and carries the cube's quality checks, and the benchmark assets add their files to that
snapshot. The ERROR checks are blocking, so when one fails Dagster does not run
``cube/database``, which is what moves the checked file over ``cube.duckdb``, switches the
published tables (observations, chip index, tiles, benchmark) to the snapshot in one step and
writes ``release.json``; the previous database and tables stay published and the reports are
not redone.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import dagster as dg

from assets.common import modality_asset_key, published_path, table_metadata
from citycube.catalogue.modalities import Catalogue
from citycube.cube.release import build_duckdb, publish_database, release_metadata, write_tiles
from pipelines.resources import CubeResource

if TYPE_CHECKING:  # imported where the checks run
    import duckdb

    from citycube.cube import checks

TILES_KEY = dg.AssetKey(["cube", "tiles"])
STAGED_DATABASE_KEY = dg.AssetKey(["cube", "staged_database"])
DATABASE_KEY = dg.AssetKey(["cube", "database"])

DATABASE_CHECKS = [
    ("schema_matches", dg.AssetCheckSeverity.ERROR),
    ("unique_keys", dg.AssetCheckSeverity.ERROR),
    ("values_in_range_no_zero_fill", dg.AssetCheckSeverity.ERROR),
    ("availability_floor", dg.AssetCheckSeverity.WARN),
]
"""Checks of the staged database; ERROR ones block publishing."""
CHECK_DESCRIPTIONS = {
    "tile_counts_match_spec": "Blocking: the 2 km and 5 km tile counts of every city match "
    "AgenticCity-Bench Table 7.",
    "schema_matches": "Blocking: the observations have exactly the documented columns and types.",
    "unique_keys": "Blocking: no two observations share (tile, year, modality, field).",
    "values_in_range_no_zero_fill": "Blocking: available values are finite and in their "
    "modality's declared range; unavailable ones are NULL with a reason (never a zero fill).",
    "availability_floor": "Warning only: where a source covers the year, at least a quarter "
    "of the tiles are available for each modality.",
}
"""What each check verifies, shown with the check in the UI."""


def database_tables(path: str) -> dict[str, object]:
    """Every table and view of a DuckDB database with its row count, as a table the UI shows,
    and the observations' row count as ``dagster/row_count``."""
    import duckdb

    with duckdb.connect(path, read_only=True) as con:
        names = con.execute(
            "SELECT table_name, table_type FROM information_schema.tables "
            "WHERE table_schema = 'main' ORDER BY table_type, table_name"
        ).fetchall()
        rows = [
            (name, "view" if kind == "VIEW" else "table", _count(con, name)) for name, kind in names
        ]
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn("name", "string"),
            dg.TableColumn("kind", "string"),
            dg.TableColumn("rows", "int"),
        ]
    )
    records = [dg.TableRecord({"name": n, "kind": k, "rows": r}) for n, k, r in rows]
    counts = {n: r for n, _, r in rows}
    return {
        "tables": dg.MetadataValue.table(records, schema=schema),
        "tables_and_views": len(rows),
        **({"dagster/row_count": counts["observations"]} if "observations" in counts else {}),
    }


def _count(con: "duckdb.DuckDBPyConnection", name: str) -> int:
    quoted = '"' + name.replace('"', '""') + '"'
    return int(con.execute(f"SELECT count(*) FROM {quoted}").fetchone()[0])


def _check_result(
    name: str, severity: dg.AssetCheckSeverity, outcome: "checks.CheckOutcome"
) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name,
        passed=outcome.passed,
        severity=severity,
        description=outcome.description,
        metadata={"details": dg.MetadataValue.json(outcome.details)},
    )


@dg.asset(
    key=TILES_KEY,
    group_name="cube",
    kinds={"python", "geoparquet"},
    check_specs=[
        dg.AssetCheckSpec(
            "tile_counts_match_spec",
            asset=TILES_KEY,
            blocking=True,
            description=CHECK_DESCRIPTIONS["tile_counts_match_spec"],
        )
    ],
)
def tiles_table(cube: CubeResource) -> dg.MaterializeResult:
    """GeoParquet table of every 2 km and 5 km tile of the 16 cities (WGS84 geometry), in the
    draft: published with the database."""
    import duckdb

    from citycube.cube import checks

    path = write_tiles(cube.release())
    with duckdb.connect() as con:
        con.read_parquet(str(path)).create_view("tiles")
        outcome = checks.check_tile_counts(con)
        per_scale = dict(con.sql("SELECT scale, count(*) FROM tiles GROUP BY 1").fetchall())
    release = cube.release()
    return dg.MaterializeResult(
        metadata={
            **table_metadata(path),
            "path": dg.MetadataValue.path(str(published_path(release, path))),
            "tiles_2km": per_scale.get("2km"),
            "tiles_5km": per_scale.get("5km"),
        },
        check_results=[
            _check_result("tile_counts_match_spec", dg.AssetCheckSeverity.ERROR, outcome)
        ],
    )


def _preview(con: "duckdb.DuckDBPyConnection") -> str:
    rows = con.execute(
        """
        SELECT city, modality,
               round(100 * avg(available::INT), 1) AS pct,
               count(DISTINCT year) AS years
        FROM observations GROUP BY ALL ORDER BY city, modality
        """
    ).fetchall()
    lines = ["| city | modality | tiles available % | years |", "|---|---|---|---|"]
    lines += [f"| {c} | {m} | {p} | {y} |" for c, m, p, y in rows]
    return "\n".join(lines)


def _release_metadata(cube: CubeResource) -> dict:
    sources = cube.sources()
    return release_metadata(
        cube.release(),
        source_set=sources.name,
        synthetic=sources.synthetic,
        sources=sources.provenance(),
    )


def build_cube_assets(
    catalogue: Catalogue, publish_after: Sequence[dg.AssetKey] = ()
) -> list[dg.AssetsDefinition]:
    """Tiles, the staged and checked database, and its publication (after ``publish_after``
    too: the assets that add files to the staged snapshot)."""
    modality_keys = [modality_asset_key(m.code) for m in catalogue.enabled()]

    @dg.asset(
        key=STAGED_DATABASE_KEY,
        deps=[TILES_KEY, *modality_keys],
        group_name="cube",
        kinds={"duckdb"},
        check_specs=[
            dg.AssetCheckSpec(
                name,
                asset=STAGED_DATABASE_KEY,
                blocking=severity == dg.AssetCheckSeverity.ERROR,
                description=CHECK_DESCRIPTIONS[name],
            )
            for name, severity in DATABASE_CHECKS
        ],
    )
    def staged_database(cube: CubeResource) -> dg.MaterializeResult:
        """A new DuckDB catalogue over the release's Parquet, built aside and checked."""
        import duckdb

        from citycube.cube import checks
        from citycube.tasks.views import task_views  # pandas and geopandas: loaded when used

        release = cube.release()
        if not release.tiles_file.exists() and not release.published_tiles_file.exists():
            write_tiles(release)  # else the draft's, or the published one (adopted)
        path = build_duckdb(
            release,
            catalogue,
            _release_metadata(cube),
            path=release.staged_duckdb_file,
            benchmark_views=task_views(catalogue),
        )
        with duckdb.connect(str(path), read_only=True) as con:
            counts = checks.modality_counts(con, catalogue)  # one scan for three figures
            outcomes = [
                checks.check_schema(con),
                checks.check_unique_keys(con),
                checks.check_values(con, catalogue, counts),
                checks.check_availability_floor(con, counts=counts),
            ]
            rows = sum(c.rows for c in counts.values())
            available = sum(c.available for c in counts.values())
            preview = _preview(con)
        return dg.MaterializeResult(
            metadata={
                **database_tables(str(path)),
                "path": dg.MetadataValue.path(str(path)),
                "release": release.version,
                "observation_rows": rows,
                "available_rows": available,
                "availability_preview": dg.MetadataValue.md(preview),
            },
            check_results=[
                _check_result(name, severity, outcome)
                for (name, severity), outcome in zip(DATABASE_CHECKS, outcomes, strict=True)
            ],
        )

    @dg.asset(
        key=DATABASE_KEY,
        deps=[STAGED_DATABASE_KEY, *publish_after],
        group_name="cube",
        kinds={"duckdb"},
    )
    def database(cube: CubeResource) -> dg.MaterializeResult:
        """The published ``cube.duckdb``, tables and ``release.json``, replaced only by checked
        ones."""
        release = cube.release()
        meta = _release_metadata(cube)
        path = publish_database(release, meta)
        return dg.MaterializeResult(
            metadata={
                **database_tables(str(path)),
                "path": dg.MetadataValue.path(str(path)),
                "release": release.version,
                "synthetic": meta["synthetic"],
                "source_set": meta["source_set"],
            }
        )

    return [tiles_table, staged_database, database]
