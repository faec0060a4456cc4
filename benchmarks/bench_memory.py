"""Benchmark 3: peak memory against city size, for a raster and a vector image modality.

OPT warps 30 m Landsat onto 25 m chips; POI draws building footprints onto 10 m chips.
Processing goes by city-year and by 10 km × 10 km block on the city's lattice (raster windows
and vector features alike are read per block), so peak memory should follow the block, not the
city: neither its height nor its width. Each case runs in a
fresh subprocess so its peak RSS (``ru_maxrss``) is its own; a subprocess that only imports the
same modules is the baseline and is subtracted.

Linux keeps ``ru_maxrss`` across ``execve``, and a child created by a large process starts with
that process's resident size as its peak. The children are therefore started through a tiny
launcher interpreter, so the figure they read is theirs; ``VmHWM`` (the peak of the current
address space, reset by ``execve``) is recorded as a cross-check.

Run as a script (``python -m benchmarks.bench_memory --data ROOT [--city CITY]``) it is the
child: it processes one partition (or, without ``--city``, nothing) and prints its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyogrio
import rasterio

from benchmarks import BenchConfig, BenchResult, log
from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release
from citycube.grid.tiles import city_grid, pixel_grid
from citycube.processing.chips import blocks
from citycube.processing.compute import process_partition
from sources.sample import SampleBackend

MODALITY = "OPT"
PRODUCT = "landsat_c2l2"
VECTOR_MODALITY = "POI"
VECTOR_PRODUCT = "osm_buildings"
"""The largest vector source of the sample (building footprints)."""
YEAR = 2020
CITIES = ("Amsterdam", "London", "Christchurch")
"""Smallest, a middle one and the largest city by tile count."""
REPO_ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
FLAT_TOLERANCE = 1.25
"""Largest / smallest ratio still counted as not growing (allocator and import noise)."""


LAUNCHER = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
"""Runs its arguments as a child of a small process (see the module docstring)."""


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vm_hwm_bytes() -> int | None:
    """Peak RSS of the current address space from /proc (Linux), or None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def child(
    data_root: Path, city: str | None, release_version: str, modality: str = MODALITY
) -> dict[str, Any]:
    """Process one partition (or only set up, for the baseline) and report peak RSS."""
    catalogue = load_catalogue()
    backend = SampleBackend()
    release = Release(data_root, release_version)
    seconds = 0.0
    if city is not None:
        start = time.perf_counter()
        process_partition(catalogue.get(modality), catalogue, city, YEAR, backend, release)
        seconds = time.perf_counter() - start
    return {"peak_rss_bytes": peak_rss_bytes(), "vm_hwm_bytes": vm_hwm_bytes(), "seconds": seconds}


def run_child(
    data_root: Path, city: str | None, release_version: str, modality: str = MODALITY
) -> dict[str, Any]:
    """A fresh interpreter per measurement, so one case's peak cannot hide another's."""
    command = [sys.executable, "-c", LAUNCHER]
    command += [sys.executable, "-m", "benchmarks.bench_memory", "--data", str(data_root)]
    command += ["--release", release_version, "--modality", modality]
    if city is not None:
        command += ["--city", city]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child for {city or 'baseline'} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def city_sizes(data_root: Path, city: str) -> dict[str, int]:
    """What holding the whole city at once would cost, and the size of the largest block."""
    item = SampleBackend().fetch(PRODUCT, city, YEAR, data_root / "sources")
    raw = 0
    cells = 0
    bands = 0
    for role, path in item.files.items():
        with rasterio.open(path) as ds:
            raw += ds.width * ds.height * sum(np.dtype(d).itemsize for d in ds.dtypes)
            if role == "data":
                cells, bands = ds.width * ds.height, ds.count
    chip = load_catalogue().get(MODALITY).chip
    assert chip is not None, f"{MODALITY} is an image modality and declares its chips"
    chips = pixel_grid(city, chip.resolution_m)
    block_pixels = max((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in blocks(chips))
    return {
        "source_raw_bytes": raw,
        # Values as float32 plus a bool mask: the working form of the warp.
        "source_float32_bytes": cells * (bands * 4 + 1),
        "chip_grid_shape": [chips.height, chips.width],
        "chip_grid_float32_bytes": chips.width * chips.height * (bands * 4 + 1),
        "block_pixels": block_pixels,
    }


def vector_source_size(data_root: Path, city: str) -> tuple[int, int]:
    """Fetch the vector modality's source (untimed): its feature count and file size."""
    log(f"  fetching {VECTOR_PRODUCT} {city} {YEAR} (untimed)")
    item = SampleBackend().fetch(VECTOR_PRODUCT, city, YEAR, data_root / "sources")
    path = item.files["data"]
    layer = load_catalogue().get(VECTOR_MODALITY).rasterize
    assert layer is not None, f"{VECTOR_MODALITY} is drawn from vectors"
    return int(pyogrio.read_info(path, layer=layer.layer)["features"]), path.stat().st_size


def _tiles(city: str) -> int:
    return sum(city_grid(city, scale).n_tiles for scale in SCALES)


def run(config: BenchConfig) -> BenchResult:
    """Peak RSS increment per city against an import-only subprocess."""
    repeats = 1 if config.quick else config.repeats
    result = BenchResult(
        name="memory",
        title=(
            f"Peak memory vs city size ({MODALITY} {YEAR}: 30 m Landsat → 25 m chips; "
            f"{VECTOR_MODALITY}: building footprints → 10 m chips)"
        ),
        baseline="a subprocess that imports the same modules and processes nothing",
        columns=[
            "city",
            "tiles (2 km + 5 km)",
            "25 m grid (rows × cols)",
            "peak RSS MiB",
            "increment MiB",
            "increment per block pixel B",
            "process s",
            "whole source MiB (raw / float32)",
            "whole 25 m grid MiB (float32)",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="citycube-bench-mem-") as tmp:
        data_root = Path(tmp)
        sizes = {}
        for city in CITIES:
            log(f"  fetching {PRODUCT} {city} {YEAR} (untimed)")
            sizes[city] = city_sizes(data_root, city)
        peaks: dict[str, list[dict[str, Any]]] = {"baseline": [], **{c: [] for c in CITIES}}
        for attempt in range(repeats):
            log(f"  subprocess round {attempt + 1}/{repeats}")
            peaks["baseline"].append(run_child(data_root, None, f"mem-base-{attempt}"))
            for city in CITIES:
                peaks[city].append(run_child(data_root, city, f"mem-{city}-{attempt}"))
                log(f"    {city}: peak {peaks[city][-1]['peak_rss_bytes'] / MIB:.1f} MiB")
        vector_sizes = {city: vector_source_size(data_root, city) for city in CITIES}
        vector_peaks: dict[str, list[dict[str, Any]]] = {c: [] for c in CITIES}
        for attempt in range(repeats):
            log(f"  {VECTOR_MODALITY} subprocess round {attempt + 1}/{repeats}")
            for city in CITIES:
                version = f"mem-{VECTOR_MODALITY}-{city}-{attempt}"
                vector_peaks[city].append(run_child(data_root, city, version, VECTOR_MODALITY))
                log(f"    {city}: peak {vector_peaks[city][-1]['peak_rss_bytes'] / MIB:.1f} MiB")

    def median(case: str, key: str) -> float:
        return statistics.median(p[key] for p in peaks[case])

    base = median("baseline", "peak_rss_bytes")
    increments = {c: median(c, "peak_rss_bytes") - base for c in CITIES}
    per_block_pixel = {c: increments[c] / sizes[c]["block_pixels"] for c in CITIES}
    result.rows.append(["(baseline: imports only)", "", "", f"{base / MIB:.1f}"] + [""] * 5)
    for city in CITIES:
        s = sizes[city]
        rows, cols = s["chip_grid_shape"]
        result.rows.append(
            [
                city,
                str(_tiles(city)),
                f"{rows} × {cols}",
                f"{median(city, 'peak_rss_bytes') / MIB:.1f}",
                f"{increments[city] / MIB:.1f}",
                f"{per_block_pixel[city]:.0f}",
                f"{median(city, 'seconds'):.2f}",
                f"{s['source_raw_bytes'] / MIB:.1f} / {s['source_float32_bytes'] / MIB:.1f}",
                f"{s['chip_grid_float32_bytes'] / MIB:.1f}",
            ]
        )
    vector_increments = {
        c: statistics.median(p["peak_rss_bytes"] for p in vector_peaks[c]) - base for c in CITIES
    }
    for city in CITIES:
        features, file_bytes = vector_sizes[city]
        result.rows.append(
            [
                f"{VECTOR_MODALITY} {city} ({features:,} building features)",
                str(_tiles(city)),
                "",
                f"{(base + vector_increments[city]) / MIB:.1f}",
                f"{vector_increments[city] / MIB:.1f}",
                "",
                f"{statistics.median(p['seconds'] for p in vector_peaks[city]):.2f}",
                f"{file_bytes / MIB:.1f} (GeoPackage)",
                "",
            ]
        )
    smallest, largest = CITIES[0], CITIES[-1]
    ratio = increments[largest] / increments[smallest]
    vector_ratio = vector_increments[largest] / vector_increments[smallest]
    tile_ratio = _tiles(largest) / _tiles(smallest)
    width_ratio = sizes[largest]["chip_grid_shape"][1] / sizes[smallest]["chip_grid_shape"][1]
    height_ratio = sizes[largest]["chip_grid_shape"][0] / sizes[smallest]["chip_grid_shape"][0]
    block_spread = max(per_block_pixel.values()) / min(per_block_pixel.values())
    flat = ratio <= FLAT_TOLERANCE
    follows_block = block_spread <= FLAT_TOLERANCE
    result.notes += [
        f"Ratio of increments {largest} / {smallest}: {ratio:.2f}, for {tile_ratio:.1f}× the "
        f"tiles, {height_ratio:.1f}× the height and {width_ratio:.1f}× the width.",
        f"Target 'peak memory does not grow with city size': "
        f"{'met' if flat else 'not met'} (flat = ratio ≤ {FLAT_TOLERANCE}). "
        f"Target 'bounded by one block': {'met' if follows_block else 'not met'} — a block is "
        "10 km × 10 km of the city's lattice (400 × 400 pixels at 25 m) whatever the city's "
        f"size; the increment per block pixel varies by {block_spread:.2f}× across cities "
        f"(met = ≤ {FLAT_TOLERANCE}×).",
        f"{VECTOR_MODALITY} (OSM building footprints rasterised at 10 m, read block by block "
        f"through the GeoPackage's spatial index): ratio of increments {largest} / {smallest} "
        f"{vector_ratio:.2f} — {'flat' if vector_ratio <= FLAT_TOLERANCE else 'not flat'} "
        f"(≤ {FLAT_TOLERANCE}).",
        "Peak RSS is ru_maxrss, median over subprocess rounds; sources are generated "
        "beforehand by the parent, so the children only read them.",
        "Whole source: the Landsat RGB + QA files as stored (raw) and as float32 values plus a "
        "mask; whole 25 m grid: the city's chip grid in float32 plus a mask, i.e. what one "
        "whole-city warp would hold.",
    ]
    result.details = {
        "baseline_peak_rss_bytes": base,
        "rounds": repeats,
        "ratio_increment_largest_over_smallest": ratio,
        "tile_ratio_largest_over_smallest": tile_ratio,
        "width_ratio_largest_over_smallest": width_ratio,
        "height_ratio_largest_over_smallest": height_ratio,
        "increment_per_block_pixel_spread": block_spread,
        "flat": flat,
        "follows_block": follows_block,
        "vector": {
            "modality": VECTOR_MODALITY,
            "ratio_increment_largest_over_smallest": vector_ratio,
            "flat": vector_ratio <= FLAT_TOLERANCE,
            "cases": {
                city: {
                    "features": vector_sizes[city][0],
                    "file_bytes": vector_sizes[city][1],
                    "increment_bytes": vector_increments[city],
                    "runs": vector_peaks[city],
                }
                for city in CITIES
            },
        },
        "cases": {
            city: {
                "tiles": _tiles(city),
                "peak_rss_bytes": median(city, "peak_rss_bytes"),
                "increment_bytes": increments[city],
                "increment_per_block_pixel_bytes": per_block_pixel[city],
                "process_s": median(city, "seconds"),
                "runs": peaks[city],
                **sizes[city],
            }
            for city in CITIES
        },
    }
    return result


def main(argv: list[str] | None = None) -> int:
    """Child entry point: one measurement, printed as a JSON line."""
    parser = argparse.ArgumentParser(
        description="Measure peak RSS of one partition (the child of the memory benchmark)."
    )
    parser.add_argument("--data", type=Path, required=True, help="data root with fetched sources")
    parser.add_argument("--release", default="mem", help="release version to write into")
    parser.add_argument("--city", help="city to process; omit to measure imports only")
    parser.add_argument("--modality", default=MODALITY, help=f"modality (default {MODALITY})")
    args = parser.parse_args(argv)
    print(json.dumps(child(args.data, args.city, args.release, args.modality)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
