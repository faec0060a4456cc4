"""Shared by the build benchmarks: run ``citycube build`` on a data root, and do the same
partition work straight on a dask cluster without Dagster (the bookkeeping baseline)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from citycube.catalogue.modalities import load_catalogue
from citycube.catalogue.temporal import period_of
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles
from citycube.tasks.views import task_views

REPO_ROOT = Path(__file__).resolve().parent.parent


def citycube_build(
    data_root: Path,
    dagster_home: Path,
    release: str,
    cities: str,
    years: str,
    workers: int,
    assets: str = "",
    timeout: float = 6 * 3600,
) -> tuple[float, str]:
    """Run the build command as ``make run`` does; (seconds, its output). Raises on failure."""
    command = [sys.executable, "-m", "pipelines.cli", "--data", str(data_root)]
    command += ["--release", release, "build", "--cities", cities, "--years", years]
    command += ["--workers", str(workers)]
    if assets:
        command += ["--assets", assets]
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home)}
    env.pop("CITYCUBE_DASK_SCHEDULER", None)
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"citycube build failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return seconds, done.stdout


def partitions_materialized(output: str) -> int:
    """Asset partitions a build reported done: each step's last progress line (done = all)."""
    return sum(
        int(done)
        for done, total in re.findall(r"\]\s+\S+: (\d+)/(\d+) partitions", output)
        if done == total
    )


def _map(client: Any, function: Callable[..., Any], tasks: Iterable[tuple[Any, ...]]) -> None:
    futures = [client.submit(function, *args, pure=False) for args in tasks]
    for future in futures:
        future.result()


def direct_build(
    data_root: Path, release_version: str, cities: Sequence[str], years: Sequence[int], client: Any
) -> float:
    """The same partition work as a build, straight on dask with no Dagster; seconds.

    Sources must already be fetched (this is the processing baseline). Derived results and
    quick-looks per source period, observations per city-year, then tiles, database, checks and
    the report, in the order the build's runs do them.
    """
    import duckdb

    from citycube.cube import checks
    from citycube.processing.compute import write_observations
    from citycube.reports.availability import write_report
    from pipelines.partition_work import derive_with_quicklook
    from sources import load_source_set

    catalogue = load_catalogue()
    sources = load_source_set()
    release = Release(data_root, release_version)
    start = time.perf_counter()
    for modality in catalogue.enabled():
        periods = {period_of(modality.temporal, y) for y in years}  # {None} when static
        tasks = [(modality, catalogue, c, p, sources, release) for c in cities for p in periods]
        _map(client, derive_with_quicklook, tasks)
    for modality in catalogue.enabled():
        _map(client, write_observations, [(modality, c, y, release) for c in cities for y in years])
    write_tiles(release)
    meta = release_metadata(release, source_set=sources.name, synthetic=sources.synthetic)
    path = build_duckdb(release, catalogue, meta, benchmark_views=task_views(catalogue))
    with duckdb.connect(str(path), read_only=True) as con:
        checks.check_schema(con)
        checks.check_unique_keys(con)
        counts = checks.modality_counts(con, catalogue)
        checks.check_values(con, catalogue, counts)
        checks.check_availability_floor(con, counts=counts)
    write_report(release, catalogue)
    return time.perf_counter() - start


def _decode(path: str) -> int:
    from benchmarks.bench_modalities import decode_every_file

    decode_every_file([Path(path)])
    return 1


def decode_files(paths: Sequence[Path], workers: int) -> float:
    """Seconds to decode every file once, spread over ``workers`` processes."""
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_decode, [str(p) for p in paths], chunksize=16))
    return time.perf_counter() - start


def source_files(data_root: Path) -> list[Path]:
    """Every data file of every fetched source item (not STAC or completion records)."""
    skip = {".json"}
    return sorted(
        p
        for p in (data_root / "sources").rglob("*")
        if p.is_file() and p.suffix not in skip and not p.name.startswith(".")
    )
