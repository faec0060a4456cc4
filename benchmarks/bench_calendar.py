"""Benchmark 6: the whole sample calendar, as ``make run CITIES=all YEARS=2000-2025`` builds it.

16 cities × 26 years × 18 modalities, both grids, 2 dask workers, fresh data root and
DAGSTER_HOME, in two builds: the source assets alone (sample generation), then everything else
(processing, Dagster, the cube; the sources are reused), on SQLite or PostgreSQL
(``CITYCUBE_BENCH_CALENDAR_STORAGE``). Baseline: decoding every source file
of the calendar once, in 2 processes — the lower bound of any processing of those files.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from benchmarks import BenchConfig, BenchResult, log
from benchmarks.builds import citycube_build, decode_files, partitions_materialized, source_files

WORKERS = 2
PREVIOUS_CALENDAR_S = 3811.0
"""The whole calendar's build time before the backfill and dask execution (63 min 31 s)."""
STORAGE_ENV = "CITYCUBE_BENCH_CALENDAR_STORAGE"
"""The Dagster instance's storage for the calendar's builds: ``sqlite`` (the default), or
``postgres`` / ``pgbouncer``: a PostgreSQL server of its own (tests/postgres_server.py),
reached directly or through PgBouncer (docs/operations.md, "Instance storage")."""
KEEP_ENV = "CITYCUBE_BENCH_CALENDAR_DIR"
"""Where to build the calendar and keep it (data root, DAGSTER_HOME with the build logs) for
inspection afterwards; unset: a temporary directory, removed at the end."""


@contextlib.contextmanager
def _work_dir() -> Iterator[Path]:
    kept = os.environ.get(KEEP_ENV, "")
    if kept:
        path = Path(kept).resolve()
        if path.exists() and any(path.iterdir()):
            raise RuntimeError(f"{KEEP_ENV}={path} is not empty; the calendar starts from nothing")
        path.mkdir(parents=True, exist_ok=True)
        log(f"    building in {path} (kept)")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="citycube-bench-calendar-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def _storage(kind: str) -> Iterator[None]:
    """Point the builds at the storage asked for (``CITYCUBE_POSTGRES_URL``) for the block."""
    if kind == "sqlite":
        yield
        return
    if kind not in ("postgres", "pgbouncer"):
        raise RuntimeError(f"{STORAGE_ENV}={kind!r}: say sqlite, postgres or pgbouncer")
    from pipelines.instance import POSTGRES_URL_ENV
    from tests.postgres_server import pgbouncer, postgres_server

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_server())
        if kind == "pgbouncer":
            url = stack.enter_context(pgbouncer(url))
        stack.enter_context(mock.patch.dict(os.environ, {POSTGRES_URL_ENV: url}))
        yield


def run(config: BenchConfig) -> BenchResult:
    """Generate, then build, the whole calendar once (it takes tens of minutes)."""
    storage = os.environ.get(STORAGE_ENV, "sqlite").strip() or "sqlite"
    with _work_dir() as tmp, _storage(storage):
        log(f"    instance storage: {storage}")
        data = tmp / "data"
        log("    generating every source of the calendar (citycube build --assets sources)")
        generate_s, generated = citycube_build(
            data, tmp / "home", "calendar", "all", "all", WORKERS, assets="sources"
        )
        (tmp / "generate.out").write_text(generated, encoding="utf-8")
        log(f"    generation: {generate_s:.0f} s; building the calendar")
        build_s, output = citycube_build(data, tmp / "home", "calendar", "all", "all", WORKERS)
        (tmp / "build.out").write_text(output, encoding="utf-8")
        partitions = partitions_materialized(output)
        files = source_files(data)
        log(f"    build: {build_s:.0f} s; decoding {len(files)} source files once")
        decode_s = decode_files(files, WORKERS)
        size_gb = sum(p.stat().st_size for p in files) / 1e9
    total = generate_s + build_s
    result = BenchResult(
        name="calendar",
        title="The whole sample calendar (16 cities × 26 years × 18 modalities, 2 workers)",
        baseline=f"decoding every source file of the calendar once ({WORKERS} processes)",
        columns=[
            "generate sources s",
            "build s",
            "total",
            "decode-only s",
            "ratio (build / decode)",
            "asset partitions",
        ],
        rows=[
            [
                f"{generate_s:.0f}",
                f"{build_s:.0f}",
                f"{total / 60:.1f} min",
                f"{decode_s:.0f}",
                f"{build_s / decode_s:.1f}×",
                partitions,
            ]
        ],
        notes=[
            f"Dagster's instance storage: {storage} ({STORAGE_ENV}).",
            f"{len(files)} source files, {size_gb:.1f} GB. The build reuses the generated "
            "sources; it covers processing, the Dagster backfill and runs, the checked "
            "database and the report.",
            f"Before the backfill and dask execution the calendar took {PREVIOUS_CALENDAR_S:.0f} "
            f"s to build (generation included): now {total:.0f} s "
            f"({PREVIOUS_CALENDAR_S / total:.1f}× faster).",
        ],
    )
    result.details = {
        "storage": storage,
        "generate_s": generate_s,
        "build_s": build_s,
        "total_s": total,
        "decode_s": decode_s,
        "source_files": len(files),
        "source_gb": size_gb,
        "asset_partitions": partitions,
    }
    return result
