"""Benchmark 12: the queries users run on a release, against a native DuckDB table.

Two queries through the release's ``observations`` (a table in ``cube.duckdb``, sorted by
modality, city, tile and year): the availability matrix (modality × year: available rows and
rows) and one tile's history of one modality over the whole calendar. **Baseline:** a plain
DuckDB table holding the same rows in the order the partition files give them (copied with
``CREATE TABLE … AS SELECT * FROM read_parquet(…)``), in its own database file. For reference,
the layout releases had before, a view over every partition file semi-joined with the
published partitions, is timed too. **Targets** (the whole calendar): matrix ≤ 100 ms, history
≤ 20 ms, each within 2× of the baseline.

**Remote reads.** The release folder is then served by a loopback HTTP server with Range
support (``tests.http_file_server``) and opened in place with
:func:`citycube.cube.remote.open_remote_release`; the bytes the server sends for one tile's
history (its answer checked against the local one) are reported against the size of
``cube.duckdb`` and of the release folder.

The release is a whole-calendar build named by ``CITYCUBE_QUERY_RELEASE`` (its folder, e.g.
``data/releases/sample-0.1.0``; it is only read), or else a synthetic one of the same size
written by :func:`benchmarks.bench_translation.write_synthetic_observations` and published by
:func:`citycube.cube.release.build_duckdb` (6 years with ``--quick``); the details record which
(``release_kind``: ``pipeline`` or ``synthetic``) and its cities and years, and ``make docs``
quotes them with the examples' times in the querying guide.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from benchmarks import BenchConfig, BenchResult, Timing, log
from citycube.catalogue.modalities import load_catalogue
from citycube.catalogue.temporal import CALENDAR
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles

MATRIX_TARGET_S = 0.100
HISTORY_TARGET_S = 0.020
RATIO_TARGET = 2.0
RUNS = 25
"""Timed runs of each query per layout (they take milliseconds: more runs, steadier medians)."""
EARLIER = "earlier layout (view over files)"
EARLIER_RUNS = 3
"""Timed runs of the earlier layout, a reference that takes seconds a query."""

MATRIX = """
    SELECT modality, year, count(*) FILTER (WHERE available) AS available, count(*) AS rows
    FROM observations GROUP BY modality, year ORDER BY modality, year
"""
HISTORY = """
    SELECT year, field, value, unit, available, reason
    FROM observations WHERE tile_id = $tile AND modality = $modality ORDER BY year, field
"""
HISTORY_MODALITY = "POP"

EXAMPLES = {
    "availability matrix": MATRIX,
    "one tile's history": HISTORY,
    "a city's mean of a field in a year": """
        SELECT field, avg(value) AS mean, count(*) FILTER (WHERE available) AS tiles
        FROM observations
        WHERE city = 'Boston' AND year = 2020 AND modality = 'WTH' AND available
        GROUP BY field ORDER BY field
    """,
    "tiles joined to their WGS84 bounds": """
        SELECT o.tile_id, o.value AS tonne_c_per_km2, t.lon_min, t.lat_min, t.lon_max, t.lat_max
        FROM observations AS o JOIN tiles AS t USING (tile_id)
        WHERE o.modality = 'CO2' AND o.year = 2020 AND o.available
        ORDER BY o.value DESC LIMIT 10
    """,
    "availability by city and year": """
        SELECT city, year, modality,
               count(*) FILTER (WHERE available) AS available, count(*) AS total
        FROM observations GROUP BY ALL ORDER BY city, year, modality
    """,
    "city-years available per modality": """
        SELECT modality, count(*) FILTER (WHERE available) AS city_years, count(*) AS possible
        FROM availability GROUP BY modality ORDER BY modality
    """,
    "why tiles are unavailable": """
        SELECT modality, reason, count(*) AS tile_fields
        FROM observations WHERE NOT available
        GROUP BY ALL ORDER BY modality, tile_fields DESC
    """,
    "translation route counts": """
        SELECT source, target, pairs FROM translation_route_counts ORDER BY pairs DESC LIMIT 10
    """,
    "translation instances per split and target": """
        SELECT split, target, count(*) AS instances, count(DISTINCT tile_id || year) AS keys
        FROM translation_instances GROUP BY ALL ORDER BY split, target
    """,
    "forecasting baseline scores": "SELECT * FROM forecast_scores",
}
"""The example queries of the querying guide, timed on the release's database."""


def _old_layout_view(con: duckdb.DuckDBPyConnection, release: Path) -> None:
    """The ``observations`` view of the earlier layout, over the published files."""
    pattern = str(release / "published" / "observations" / "city=*" / "year=*" / "*.parquet")
    con.execute("CREATE TEMP TABLE parts AS SELECT * FROM release.published_observations")
    quoted = pattern.replace("'", "''")
    con.execute(
        "CREATE TEMP VIEW observations AS SELECT o.* FROM read_parquet("
        f"'{quoted}', hive_partitioning = false, union_by_name = true) AS o "
        "SEMI JOIN parts AS p ON o.city = p.city AND o.year = p.year AND o.modality = p.modality"
    )


def _connections(release: Path, scratch: Path) -> dict[str, duckdb.DuckDBPyConnection]:
    """One read-only connection per layout: the release, the native baseline, the old view."""
    pattern = str(release / "published" / "observations" / "city=*" / "year=*" / "*.parquet")
    baseline_file = scratch / "baseline.duckdb"
    with duckdb.connect(str(baseline_file)) as con:
        con.execute(
            "CREATE TABLE observations AS SELECT * FROM read_parquet(?, union_by_name = true)",
            [pattern],
        )
    old = duckdb.connect()
    database = str(release / "cube.duckdb").replace("'", "''")
    old.execute(f"ATTACH '{database}' AS release (READ_ONLY)")
    _old_layout_view(old, release)
    return {
        "release (cube.duckdb table)": duckdb.connect(str(release / "cube.duckdb"), read_only=True),
        "baseline (native table)": duckdb.connect(str(baseline_file), read_only=True),
        EARLIER: old,
    }


def _time_interleaved(
    cons: dict[str, duckdb.DuckDBPyConnection], sql: str, params: dict[str, Any], runs: int
) -> tuple[dict[str, Timing], dict[str, list[tuple[Any, ...]]]]:
    """Each layout's runs of one query, taking turns; the answers, to check they agree."""
    times: dict[str, list[float]] = {name: [] for name in cons}
    answers = {}
    for name, con in cons.items():  # one warm-up each: file metadata and blocks cached alike
        answers[name] = con.execute(sql, params).fetchall()
    for turn in range(runs):
        for name, con in cons.items():
            if name == EARLIER and turn >= EARLIER_RUNS:
                continue  # seconds a run: a few suffice for a reference
            started = time.perf_counter()
            con.execute(sql, params).fetchall()
            times[name].append(time.perf_counter() - started)
    return {name: Timing(tuple(t)) for name, t in times.items()}, answers


def _time_examples(
    con: duckdb.DuckDBPyConnection, params: dict[str, Any], runs: int
) -> dict[str, Timing | None]:
    """Each example query's runs (after one warm-up); None for a table the release lacks."""
    timings: dict[str, Timing | None] = {}
    for name, sql in EXAMPLES.items():
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        try:
            con.execute(sql, used).fetchall()
        except duckdb.CatalogException:
            timings[name] = None
            continue
        runs_s = []
        for _ in range(runs):
            started = time.perf_counter()
            con.execute(sql, used).fetchall()
            runs_s.append(time.perf_counter() - started)
        timings[name] = Timing(tuple(runs_s))
    return timings


def _served_bytes(log: Path) -> tuple[int, int]:
    """Bytes the server sent for ``cube.duckdb`` so far, and in how many requests."""
    sent = requests = 0
    for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
        _method, path, _range, _status, size, *_ = line.split()
        if path.endswith("/cube.duckdb"):
            sent, requests = sent + int(size), requests + 1
    return sent, requests


def _remote_reads(
    release: Path, scratch: Path, params: dict[str, Any], expected: list[tuple[Any, ...]]
) -> dict[str, Any]:
    """Bytes and requests one tile's history takes on the release served over loopback HTTP."""
    from citycube.cube.remote import open_remote_release
    from tests.http_file_server import serving

    log_file = scratch / "requests.log"
    with serving(release.parent, log_file) as url:
        started = time.perf_counter()
        con = open_remote_release(f"{url}/{release.name}/")
        open_s = time.perf_counter() - started
        opened, open_requests = _served_bytes(log_file)
        started = time.perf_counter()
        answer = con.execute(HISTORY, params).fetchall()
        query_s = time.perf_counter() - started
        con.close()
        total, requests = _served_bytes(log_file)
    files = {  # by inode: the draft, snapshots and published/ share files as hard links
        (st.st_dev, st.st_ino): st.st_size
        for p in release.rglob("*")
        if p.is_file() and "chips" not in p.parts
        for st in [p.stat()]
    }
    folder = sum(files.values())
    return {
        "database_bytes": (release / "cube.duckdb").stat().st_size,
        "folder_bytes_without_chips": folder,
        "open_bytes": opened,
        "open_requests": open_requests,
        "bytes": total,
        "requests": requests,
        "open_s": open_s,
        "query_s": query_s,
        "answer_agrees": answer == expected,
    }


def _synthetic_release(root: Path, quick: bool) -> Path:
    """A published release of synthetic whole-calendar observations (6 years when quick)."""
    from benchmarks.bench_translation import write_synthetic_observations

    catalogue = load_catalogue()
    years = CALENDAR[-6:] if quick else CALENDAR
    release = Release(root, "bench")
    log(f"    writing synthetic observations: 16 cities × {len(years)} years × 18 modalities")
    rows = write_synthetic_observations(
        release.draft_dir / "observations", catalogue, years=tuple(years)
    )
    write_tiles(release)
    started = time.perf_counter()
    meta = release_metadata(release, source_set="synthetic", synthetic=True)
    build_duckdb(release, catalogue, meta)
    log(f"    {rows:,} rows published in {time.perf_counter() - started:.1f} s")
    return release.root


def run(config: BenchConfig) -> BenchResult:
    """Time both queries on every layout, taking turns."""
    named = os.environ.get("CITYCUBE_QUERY_RELEASE")
    with tempfile.TemporaryDirectory(prefix="citycube-bench-queries-") as tmp:
        release = Path(named).resolve() if named else _synthetic_release(Path(tmp), config.quick)
        cons = _connections(release, Path(tmp))
        main = cons["release (cube.duckdb table)"]
        rows, files = main.execute(
            "SELECT (SELECT count(*) FROM observations), (SELECT count(*) FROM "
            "published_observations)"
        ).fetchone() or (0, 0)
        years, first_year, last_year, cities = main.execute(
            "SELECT count(DISTINCT year), min(year), max(year), count(DISTINCT city) "
            "FROM observations"
        ).fetchone() or (0, None, None, 0)
        tile = main.execute(
            "SELECT min(tile_id) FROM observations WHERE modality = ? AND scale = '2km'",
            [HISTORY_MODALITY],
        ).fetchone()[0]
        log(f"    {rows:,} observation rows, {files} partition files, {years} years; tile {tile}")
        runs = max(RUNS, config.repeats)
        matrix, matrix_answers = _time_interleaved(cons, MATRIX, {}, runs)
        params = {"tile": tile, "modality": HISTORY_MODALITY}
        history, history_answers = _time_interleaved(cons, HISTORY, params, runs)
        examples = _time_examples(main, params, runs)
        remote = _remote_reads(
            release, Path(tmp), params, history_answers["release (cube.duckdb table)"]
        )
        log(f"    remote one-tile history: {remote['bytes']:,} B in {remote['requests']} requests")
        for con in cons.values():
            con.close()
    agree = all(
        answers == next(iter(group.values()))
        for group in (matrix_answers, history_answers)
        for answers in group.values()
    )
    base = "baseline (native table)"
    table_rows = []
    for name in cons:
        m, h = matrix[name].median_s, history[name].median_s
        table_rows.append(
            [
                name,
                f"{m * 1000:.1f}",
                f"{m / matrix[base].median_s:.2f}",
                f"{h * 1000:.2f}",
                f"{h / history[base].median_s:.2f}",
            ]
        )
    ours_m = matrix["release (cube.duckdb table)"].median_s
    ours_h = history["release (cube.duckdb table)"].median_s
    met = (
        ours_m <= MATRIX_TARGET_S
        and ours_h <= HISTORY_TARGET_S
        and ours_m / matrix[base].median_s <= RATIO_TARGET
        and ours_h / history[base].median_s <= RATIO_TARGET
    )
    source = f"release {release.name}" if named else "synthetic release"
    return BenchResult(
        name="queries",
        title=(
            f"Queries on {source}: {rows:,} observation rows, {years} years "
            f"({files} partition files)"
        ),
        baseline="the same rows in a plain DuckDB table (file order), same run, taking turns",
        columns=[
            "layout",
            "availability matrix ms",
            "ratio",
            f"one tile's {HISTORY_MODALITY} history ms",
            "ratio",
        ],
        rows=table_rows,
        notes=[
            f"medians of {runs} runs after one warm-up ({EARLIER_RUNS} for the earlier layout); "
            "the layouts take turns",
            f"targets: matrix ≤ {MATRIX_TARGET_S * 1000:.0f} ms, history ≤ "
            f"{HISTORY_TARGET_S * 1000:.0f} ms, each ≤ {RATIO_TARGET:g}× the baseline: "
            + ("met" if met else "NOT met"),
            "answers identical across layouts: " + ("yes" if agree else "NO"),
            "served over loopback HTTP (Range requests), opened in place: one tile's "
            f"{HISTORY_MODALITY} history read {remote['bytes'] / 1e6:.1f} MB in "
            f"{remote['requests']} requests (opening: {remote['open_bytes'] / 1e6:.1f} MB in "
            f"{remote['open_requests']}), {remote['bytes'] / remote['database_bytes']:.1%} of the "
            f"{remote['database_bytes'] / 1e6:.1f} MB cube.duckdb and "
            f"{remote['bytes'] / remote['folder_bytes_without_chips']:.1%} of the "
            f"{remote['folder_bytes_without_chips'] / 1e6:.1f} MB release folder (without chips); "
            "answer identical to the local one: " + ("yes" if remote["answer_agrees"] else "NO"),
            "the querying guide's examples on the release (median ms): "
            + "; ".join(
                f"{name} {t.median_s * 1000:.1f}" if t else f"{name}: no such table"
                for name, t in examples.items()
            ),
        ],
        details={
            "release": str(release) if named else None,
            "release_kind": "pipeline" if named else "synthetic",
            "cities": cities,
            "first_year": first_year,
            "last_year": last_year,
            "rows": rows,
            "partition_files": files,
            "years": years,
            "tile": tile,
            "matrix": {name: t.as_dict() for name, t in matrix.items()},
            "history": {name: t.as_dict() for name, t in history.items()},
            "examples": {name: t.as_dict() if t else None for name, t in examples.items()},
            "targets_met": met,
            "answers_agree": agree,
            "remote": remote,
        },
    )
