"""Benchmark 5: what Dagster's bookkeeping costs per partition.

The same selection (Amsterdam and Boston × 2019–2021, all modalities, both grids) is processed
twice from fetched sources: once by ``citycube build`` (a Dagster asset backfill: instance,
code server, runs, event log, checks) and once by submitting the same partition tasks straight
to a dask LocalCluster of the same size, with no Dagster. The difference, per asset partition
the build materialised, is Dagster's overhead.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchmarks import BenchConfig, BenchResult, Timing, log
from benchmarks.builds import citycube_build, direct_build, partitions_materialized

CITIES = ("Amsterdam", "Boston")
YEARS = (2019, 2020, 2021)
WORKERS = 2
MAX_REPEATS = 3
"""Each repeat is two whole builds; three medians are enough here."""


def _reset(data_root: Path, release: str) -> None:
    """Keep the fetched sources and coverage weights; drop every result of the release."""
    shutil.rmtree(data_root / "releases" / release, ignore_errors=True)


def run(config: BenchConfig) -> BenchResult:
    """Build the selection through Dagster and straight on dask, alternately."""
    from dask.distributed import Client, LocalCluster

    repeats = min(config.repeats, MAX_REPEATS)
    release = "bench-orchestration"
    dagster_runs: list[float] = []
    direct_runs: list[float] = []
    partitions = 0
    with tempfile.TemporaryDirectory(prefix="citycube-bench-orch-") as tmp:
        data = Path(tmp) / "data"
        log("    fetching sources once (untimed)")
        citycube_build(
            data,
            Path(tmp) / "home-fetch",
            release,
            ",".join(CITIES),
            ",".join(map(str, YEARS)),
            WORKERS,
            assets="sources",
        )
        with LocalCluster(n_workers=WORKERS, threads_per_worker=1, dashboard_address=None) as lc:
            client = Client(lc)
            for attempt in range(repeats):
                _reset(data, release)
                direct_runs.append(direct_build(data, release, CITIES, YEARS, client))
                _reset(data, release)
                seconds, output = citycube_build(
                    data,
                    Path(tmp) / f"home{attempt}",
                    release,
                    ",".join(CITIES),
                    ",".join(map(str, YEARS)),
                    WORKERS,
                )
                dagster_runs.append(seconds)
                partitions = partitions_materialized(output)
                log(
                    f"    {attempt + 1}/{repeats}: direct {direct_runs[-1]:.1f} s, "
                    f"through Dagster {seconds:.1f} s ({partitions} asset partitions)"
                )
            client.close()
    dagster, direct = Timing(tuple(dagster_runs)), Timing(tuple(direct_runs))
    overhead = dagster.median_s - direct.median_s
    per_partition = overhead / partitions if partitions else float("nan")
    result = BenchResult(
        name="orchestration",
        title=(
            f"Dagster bookkeeping per partition ({'+'.join(CITIES)} × {YEARS[0]}–{YEARS[-1]}, "
            f"{WORKERS} dask workers, sources fetched)"
        ),
        baseline="the same partition tasks submitted straight to a dask LocalCluster (no Dagster)",
        columns=[
            "through Dagster s",
            "straight on dask s",
            "ratio (Dagster / direct)",
            "asset partitions",
            "overhead per partition s",
        ],
        rows=[
            [
                f"{dagster.median_s:.1f}",
                f"{direct.median_s:.1f}",
                f"{dagster.median_s / direct.median_s:.2f}×",
                partitions,
                f"{per_partition:.3f}",
            ]
        ],
        notes=[
            "Through Dagster: `citycube build` on a new DAGSTER_HOME — instance storage, code "
            "server, backfill, runs launched as processes, event log, checks and the published "
            "database. Straight on dask: derive, observe, quick-looks, tiles, database, checks "
            "and report with the same tasks in the same order, on one warm cluster.",
            "Both start from the same fetched sources with every result of the release removed.",
        ],
    )
    result.details = {
        "dagster": dagster.as_dict(),
        "direct": direct.as_dict(),
        "asset_partitions": partitions,
        "overhead_s": overhead,
        "overhead_per_partition_s": per_partition,
    }
    return result
