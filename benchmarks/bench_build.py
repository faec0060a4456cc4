"""Benchmark 4: sample build time of one city-year, all enabled modalities.

What ``make run`` costs per partition: generating the synthetic source files (fetch) and
processing every enabled modality with ``process_partition`` into a fresh data root. The
baseline is the same lower bound as benchmark 2, decoding every file once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import BenchConfig, BenchResult, Timing, log
from benchmarks.bench_modalities import BASELINE, decode_every_file, fetch_items, source_files
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import BUILD_CHIP_FORMAT, Release
from citycube.processing.compute import process_partition
from sources.sample import SampleBackend

CITY = "Boston"
YEAR = 2020
CHIP_FORMAT_ENV = "CITYCUBE_CHIPS"
"""Chip store format the bench writes ('zarr' or 'icechunk'), as a build reads it."""


def chip_format() -> str:
    """The chip format of the bench's release: ``CITYCUBE_CHIPS``, else what builds write."""
    return os.environ.get(CHIP_FORMAT_ENV) or BUILD_CHIP_FORMAT


def build_once(data_root: Path) -> tuple[float, float, list[Path]]:
    """Fetch then process every enabled modality; (fetch s, process s, source files)."""
    catalogue = load_catalogue()
    backend = SampleBackend()
    release = Release(data_root, "bench-build", chip_format())
    start = time.perf_counter()
    paths: list[Path] = []
    for modality in catalogue.enabled():
        paths += source_files(fetch_items(modality, backend, release, CITY, YEAR))
    fetched = time.perf_counter()
    for modality in catalogue.enabled():
        process_partition(modality, catalogue, CITY, YEAR, backend, release)
    # Modalities may share a product; each file is read once by the baseline.
    return fetched - start, time.perf_counter() - fetched, list(dict.fromkeys(paths))


def run(config: BenchConfig) -> BenchResult:
    """Whole city-year builds from an empty data root, repeated."""
    fetch_runs: list[float] = []
    process_runs: list[float] = []
    read_runs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="citycube-bench-build-") as tmp:
        for attempt in range(config.repeats):
            root = Path(tmp) / f"run{attempt}"
            fetch_s, process_s, paths = build_once(root)
            start = time.perf_counter()
            decode_every_file(paths)
            read_runs.append(time.perf_counter() - start)
            fetch_runs.append(fetch_s)
            process_runs.append(process_s)
            log(
                f"    build {attempt + 1}/{config.repeats}: fetch {fetch_s:.2f} s, "
                f"process {process_s:.2f} s"
            )
            shutil.rmtree(root, ignore_errors=True)
    fetch, process, read = (
        Timing(tuple(fetch_runs)),
        Timing(tuple(process_runs)),
        Timing(tuple(read_runs)),
    )
    total_s = fetch.median_s + process.median_s
    n_modalities = len(load_catalogue().enabled())
    result = BenchResult(
        name="build",
        title=(
            f"Sample build time per city-year ({CITY} {YEAR}, {n_modalities} modalities, "
            f"{chip_format()} chips)"
        ),
        baseline=BASELINE,
        columns=[
            "fetch (generate) s",
            "process s",
            "total s",
            "decode-only s",
            "ratio (process / decode)",
        ],
        rows=[
            [
                f"{fetch.median_s:.2f}",
                f"{process.median_s:.2f}",
                f"{total_s:.2f}",
                f"{read.median_s:.4f}",
                f"{process.median_s / read.median_s:.1f}×",
            ]
        ],
        notes=[
            "Each run starts from an empty data root: sources generated, then every enabled "
            "modality processed for both scales (no Dagster overhead, no DuckDB views).",
        ],
    )
    details: dict[str, Any] = {
        "fetch": fetch.as_dict(),
        "process": process.as_dict(),
        "read_only": read.as_dict(),
        "total_median_s": total_s,
        "ratio_process_over_read": process.median_s / read.median_s,
    }
    result.details = details
    return result
