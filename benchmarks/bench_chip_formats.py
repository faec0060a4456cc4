"""Benchmark: what icechunk chip stores cost against plain Zarr on one city-year's build.

The sources of Boston 2020 are generated once; then every enabled modality is processed into
a fresh release in each chip format, the two formats taking turns so that a machine whose
speed drifts (other work on it) slows both alike. Wall and CPU seconds of the processing are
reported per format, with the bytes and files the chip stores take on disk.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import BenchConfig, BenchResult, log
from benchmarks.bench_build import CITY, YEAR
from benchmarks.bench_modalities import fetch_items
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import CHIP_FORMATS, Release
from citycube.processing.compute import process_partition
from sources.sample import SampleBackend


def _chip_footprint(release: Release) -> tuple[int, int]:
    """(bytes, files) of the release's chip stores."""
    files = [p for p in (release.root / "chips").rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def _process(data_root: Path, version: str, chip_format: str) -> dict[str, float]:
    catalogue = load_catalogue()
    backend = SampleBackend()
    release = Release(data_root, version, chip_format)
    wall, cpu = time.perf_counter(), time.process_time()
    for modality in catalogue.enabled():
        process_partition(modality, catalogue, CITY, YEAR, backend, release)
    seconds = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    size, files = _chip_footprint(release)
    shutil.rmtree(release.root, ignore_errors=True)
    return {**seconds, "chip_bytes": size, "chip_files": files}


def run(config: BenchConfig) -> BenchResult:
    """Interleaved builds of one city-year in each chip format from the same sources."""
    catalogue = load_catalogue()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CHIP_FORMATS}
    with tempfile.TemporaryDirectory(prefix="citycube-bench-chips-") as tmp:
        data_root = Path(tmp)
        backend, release = SampleBackend(), Release(data_root, "sources")
        for modality in catalogue.enabled():
            fetch_items(modality, backend, release, CITY, YEAR)
        for attempt in range(config.repeats):
            order = CHIP_FORMATS if attempt % 2 == 0 else tuple(reversed(CHIP_FORMATS))
            for name in order:
                figures = _process(data_root, f"{name}-{attempt}", name)
                runs[name].append(figures)
                log(
                    f"    {name} {attempt + 1}/{config.repeats}: wall {figures['wall_s']:.2f} s, "
                    f"CPU {figures['cpu_s']:.2f} s (load {os.getloadavg()[0]:.1f})"
                )

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    zarr_wall, zarr_cpu = median("zarr", "wall_s"), median("zarr", "cpu_s")
    rows: list[list[Any]] = [
        [
            name,
            f"{median(name, 'wall_s'):.2f}",
            f"{median(name, 'cpu_s'):.2f}",
            f"{median(name, 'wall_s') / zarr_wall:.3f}×",
            f"{median(name, 'cpu_s') / zarr_cpu:.3f}×",
            f"{median(name, 'chip_bytes') / 1e6:.1f}",
            f"{median(name, 'chip_files'):.0f}",
        ]
        for name in CHIP_FORMATS
    ]
    return BenchResult(
        name="chip_formats",
        title=f"Chip store formats on one city-year's processing ({CITY} {YEAR})",
        baseline="plain Zarr chip stores, same sources, builds interleaved",
        columns=["format", "wall s", "CPU s", "wall ratio", "CPU ratio", "chip MB", "chip files"],
        rows=rows,
        notes=[
            "Sources generated once; each run processes every enabled modality into a fresh "
            "release (derived results, chips, observations); medians over the runs.",
        ],
        details={name: runs[name] for name in CHIP_FORMATS},
    )
