"""Run the CityCube benchmarks: ``make bench`` or ``python -m benchmarks.run --help``.

Writes ``benchmarks/results/latest.json`` (every figure and run) and ``latest.md`` (the tables
also printed at the end). Each benchmark compares against a baseline measured in the same run,
so the ratios stay meaningful on a machine that is busy with other work.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import BenchConfig, BenchResult, log

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_REPEATS = 5
QUICK_REPEATS = 3
MIN_REPEATS = 3


@dataclass(frozen=True)
class Benchmark:
    """A benchmark module and what it measures."""

    name: str
    module: str
    summary: str
    in_quick: bool

    def load(self) -> Callable[[BenchConfig], BenchResult]:
        """The module's ``run`` function (imported on demand)."""
        return importlib.import_module(self.module).run


BENCHMARKS = (
    Benchmark(
        "aggregation",
        "benchmarks.bench_aggregate",
        "exact tile aggregation vs exactextract (30 m and aligned 1 km same CRS, 1/120° lon/lat, "
        "Mollweide)",
        True,
    ),
    Benchmark(
        "modalities",
        "benchmarks.bench_modalities",
        "process_partition tile-years/s per enabled modality (Boston 2020) vs decoding the files",
        True,
    ),
    Benchmark(
        "memory",
        "benchmarks.bench_memory",
        "peak RSS of OPT for Amsterdam, London, Christchurch vs an import-only subprocess",
        True,
    ),
    Benchmark(
        "stac_bytes",
        "benchmarks.bench_stac_bytes",
        "bytes STAC-served city-years fetch over HTTP vs the distinct windows they need",
        True,
    ),
    Benchmark(
        "stac_memory",
        "benchmarks.bench_stac_memory",
        "peak RSS of one Landsat OPT composite, 512-px blocks vs the whole window, as the "
        "window grows",
        True,
    ),
    Benchmark(
        "translation",
        "benchmarks.bench_translation",
        "pair index, splits and 269,472 sampled instances for the whole calendar (synthetic "
        "observations) vs one DuckDB scan of them",
        False,
    ),
    Benchmark(
        "build",
        "benchmarks.bench_build",
        "sample build of one city-year (fetch + every enabled modality) vs decoding the files",
        False,
    ),
    Benchmark(
        "chip_formats",
        "benchmarks.bench_chip_formats",
        "one city-year processed with icechunk chip stores vs plain Zarr, interleaved",
        False,
    ),
    Benchmark(
        "incremental",
        "benchmarks.bench_incremental",
        "bytes written by rebuilding one city-year of a built release vs its full build",
        False,
    ),
    Benchmark(
        "orchestration",
        "benchmarks.bench_orchestration",
        "Dagster's bookkeeping per partition: citycube build vs the same tasks straight on dask",
        False,
    ),
    Benchmark(
        "queries",
        "benchmarks.bench_queries",
        "availability matrix and one tile's history on a whole-calendar release "
        "(CITYCUBE_QUERY_RELEASE, or synthetic) vs a native DuckDB table",
        False,
    ),
    Benchmark(
        "calendar",
        "benchmarks.bench_calendar",
        "the whole calendar: generation, then the build, vs decoding every source file once",
        False,
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line with a help text that lists the benchmarks."""
    listing = "\n".join(f"  {b.name:<12} {b.summary}" for b in BENCHMARKS)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=(
            "Run the CityCube benchmarks. Every figure is the median of repeated runs and is "
            "reported with a ratio against a baseline measured in the same run."
        ),
        epilog=f"benchmarks:\n{listing}\n\n"
        "examples:\n"
        "  python -m benchmarks.run                      # everything (~50 min on 2 cores)\n"
        "  python -m benchmarks.run --quick              # smaller scope (~1.5 min)\n"
        "  python -m benchmarks.run --only aggregation --only memory\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REPEATS} repeats, one memory round per city, skip 'build' unless named",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[b.name for b in BENCHMARKS],
        metavar="NAME",
        help="run only this benchmark (repeatable): " + ", ".join(BY_NAME),
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help=f"timed runs per measurement (default {DEFAULT_REPEATS}, "
        f"{QUICK_REPEATS} with --quick; at least {MIN_REPEATS})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "latest.json",
        help="JSON results file; the markdown tables go next to it with a .md suffix "
        "(default: benchmarks/results/latest.json)",
    )
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS} (medians of fewer are noise)")
    return args


def selected(args: argparse.Namespace) -> list[Benchmark]:
    """Named benchmarks, or all (less the slow ones under --quick)."""
    if args.only:
        return [BY_NAME[name] for name in dict.fromkeys(args.only)]
    return [b for b in BENCHMARKS if b.in_quick or not args.quick]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _first_line_with(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info() -> dict[str, Any]:
    """Where and with what the figures were measured."""
    import rasterio

    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "platform": platform.platform(),
        "cpu": _first_line_with("/proc/cpuinfo", "model name"),
        "cpu_count": os.cpu_count(),
        "memory": _first_line_with("/proc/meminfo", "MemTotal"),
        "python": platform.python_version(),
        "commit": _commit(),
        "versions": {
            "numpy": _version("numpy"),
            "scipy": _version("scipy"),
            "rasterio": _version("rasterio"),
            "gdal": rasterio.__gdal_version__,
            "exactextract": _version("exactextract"),
            "pyproj": _version("pyproj"),
        },
    }


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def markdown(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    """The tables of a run, with the conditions they were measured in."""
    lines = [
        "# CityCube benchmark results",
        "",
        f"- date (UTC): {meta['date_utc']}; commit {meta['commit']}",
        f"- machine: {meta['cpu']}, {meta['cpu_count']} cores, {meta['memory']}; "
        f"{meta['platform']}",
        f"- load average before / after: {meta['load_before']} / {meta['load_after']}",
        f"- mode: {'quick' if meta['quick'] else 'full'}, median of {meta['repeats']} runs; "
        f"total {meta['elapsed_s']:.0f} s",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
    ]
    for name, result in results.items():
        if "error" in result:
            lines += [f"## {name}", "", f"**failed:** `{result['error']}`", ""]
            continue
        lines += [f"## {result['title']}", "", f"Baseline: {result['baseline']}.", ""]
        lines.append("| " + " | ".join(_cell(c) for c in result["columns"]) + " |")
        lines.append("|" + "---|" * len(result["columns"]))
        for row in result["rows"]:
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        lines.append("")
        lines += [f"- {note}" for note in result["notes"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks, then write and print the results."""
    args = parse_args(argv)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    config = BenchConfig(repeats=repeats, quick=args.quick)
    meta = machine_info()
    meta.update(quick=args.quick, repeats=repeats, load_before=_load())
    chosen = selected(args)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    failed = False
    for index, bench in enumerate(chosen, 1):
        log(f"[{index}/{len(chosen)}] {bench.name}: {bench.summary}")
        bench_start = time.perf_counter()
        try:
            results[bench.name] = bench.load()(config).as_dict()
        except Exception as exc:  # report the others even if one fails
            traceback.print_exc()
            results[bench.name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed = True
        elapsed = time.perf_counter() - bench_start
        results[bench.name]["elapsed_s"] = elapsed
        log(f"[{index}/{len(chosen)}] {bench.name} done in {elapsed:.0f} s")
    meta.update(load_after=_load(), elapsed_s=time.perf_counter() - started)

    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "benchmarks": results}, indent=2) + "\n")
    table = markdown(meta, results)
    out.with_suffix(".md").write_text(table + "\n")
    print()
    print(table)
    log(f"results: {out} and {out.with_suffix('.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
