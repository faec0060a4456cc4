"""Cube assets downstream of the modalities: the tiles table and the DuckDB release catalogue."""

import dagster as dg
import duckdb

from assets.modalities import modality_assets
from citycube import checks
from citycube.cube import build_duckdb, release_metadata, write_json_atomic, write_tiles
from pipelines.resources import CubeResource

TILES_KEY = dg.AssetKey(["cube", "tiles"])
DATABASE_KEY = dg.AssetKey(["cube", "database"])


@dg.asset(
    key=TILES_KEY,
    group_name="cube",
    kinds={"python", "geoparquet"},
    check_specs=[dg.AssetCheckSpec("tile_counts_match_spec", asset=TILES_KEY)],
)
def tiles_table(cube: CubeResource) -> dg.MaterializeResult:
    """GeoParquet table of every 2 km and 5 km tile of the 16 cities (WGS84 geometry)."""
    release = cube.release()
    path = write_tiles(release)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW tiles AS SELECT * FROM read_parquet('{path}')")
    outcome = checks.check_tile_counts(con)
    per_scale = dict(con.execute("SELECT scale, count(*) FROM tiles GROUP BY 1").fetchall())
    con.close()
    return dg.MaterializeResult(
        metadata={
            "path": str(path),
            "tiles_2km": per_scale.get("2km"),
            "tiles_5km": per_scale.get("5km"),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="tile_counts_match_spec",
                passed=outcome.passed,
                description=outcome.description,
                metadata={"mismatches": dg.MetadataValue.json(outcome.details)},
            )
        ],
    )


_CHECKS = [
    ("schema_matches", dg.AssetCheckSeverity.ERROR),
    ("unique_keys", dg.AssetCheckSeverity.ERROR),
    ("values_in_range_no_zero_fill", dg.AssetCheckSeverity.ERROR),
    ("availability_floor", dg.AssetCheckSeverity.WARN),
]


def _preview(con: duckdb.DuckDBPyConnection) -> str:
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


@dg.asset(
    key=DATABASE_KEY,
    deps=[TILES_KEY, *[a.key for a in modality_assets]],
    group_name="cube",
    kinds={"duckdb"},
    check_specs=[dg.AssetCheckSpec(name, asset=DATABASE_KEY) for name, _ in _CHECKS],
)
def cube_database(cube: CubeResource) -> dg.MaterializeResult:
    """DuckDB file with views over the release's Parquet, plus release metadata and checks."""
    release = cube.release()
    if not release.tiles_file.exists():
        write_tiles(release)
    meta = release_metadata(
        release, backend=cube.backend, synthetic=cube.backend == "sample", extra={"seed": cube.seed}
    )
    path = build_duckdb(release, cube.catalogue(), meta)
    write_json_atomic(meta, release.metadata_file)
    con = duckdb.connect(str(path), read_only=True)
    try:
        outcomes = [
            checks.check_schema(con),
            checks.check_unique_keys(con),
            checks.check_values(con, cube.catalogue()),
            checks.check_availability_floor(con),
        ]
        rows = con.execute("SELECT count(*) FROM observations").fetchone()[0]
        available = con.execute(
            "SELECT count(*) FILTER (WHERE available) FROM observations"
        ).fetchone()[0]
        preview = _preview(con)
    finally:
        con.close()
    return dg.MaterializeResult(
        metadata={
            "path": str(path),
            "release": release.version,
            "observation_rows": rows,
            "available_rows": available,
            "availability_preview": dg.MetadataValue.md(preview),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=name,
                passed=o.passed,
                severity=severity,
                description=o.description,
                metadata={"details": dg.MetadataValue.json(o.details)},
            )
            for (name, severity), o in zip(_CHECKS, outcomes, strict=True)
        ],
    )


cube_assets = [tiles_table, cube_database]
