"""Sample source generation time per product: cold (fresh process) and warm (per year).

Not part of ``make bench``: it starts a fresh interpreter for every (city, product) so the cold
figure is honest, which takes about ten minutes for two cities and three runs. Run it when
changing the generators in ``sources/sample``::

    .venv/bin/python -m benchmarks.bench_generation                      # this checkout
    .venv/bin/python -m benchmarks.bench_generation --runs 5 --out /tmp/gen.json
    .venv/bin/python -m benchmarks.bench_generation --products landsat_c2l2 glc_fcs30d \\
        --roots before=/tmp/old-checkout after=.                         # interleaved A/B

(``git worktree add /tmp/old-checkout <commit>`` or ``git archive <commit> | tar -x -C DIR``
gives an old checkout; the venv's packages are used for both.)

For every (city, product) a worker process imports the backend (not timed), then times

- **cold**: ``SampleBackend().fetch`` of the year nearest 2020 (or the static item), which
  also builds the city's ``synthetic_city`` and anything the product caches per city;
- **warm**: fetches of the three years nearest 2020 (2020, 2019, 2021 for annual products;
  2020, 2015, 2025 for epochs; the static item three times) into fresh destinations, in the
  same process: what every further year costs a worker that already built the city.

Two pseudo-products complete the picture: ``synthetic_city`` (the world alone, cold) and
``all`` (every product for 2020 cold, then every annual product for 2019 and for 2021 warm:
one city-year as the pipeline's workers see it). Each figure is the median over ``--runs``
(warm: median of the per-run medians). With several ``--roots`` the versions alternate
worker by worker, so a busy machine slows them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CITIES = ("Boston", "Christchurch")
"""A mid-size and a large (in extent) city."""
TARGET_YEAR = 2020
"""Years are picked nearest to this one."""
EPOCH_PRODUCTS = ("ghs_pop", "ghs_built_v")
"""Products made once per 5-year epoch, left out of the per-year total."""
PSEUDO_PRODUCTS = ("synthetic_city", "all")
"""Rows that are not products (excluded from the sums)."""


def nearest_years(years: list[int] | None) -> list[int | None]:
    """The three years nearest TARGET_YEAR (the static item three times for a static product)."""
    if years is None:
        return [None, None, None]
    return sorted(years, key=lambda y: (abs(y - TARGET_YEAR), y))[:3]


def measure(product: str, city: str) -> dict[str, Any]:
    """Run in a fresh process: the cold fetch, then three warm ones."""
    from sources.sample.backend import SampleBackend
    from sources.sample.world import synthetic_city

    backend = SampleBackend(seed=0)
    if product == "synthetic_city":
        start = time.perf_counter()
        synthetic_city(city, 0)
        return {"cold": time.perf_counter() - start, "warm": []}
    if product == "all":
        return _measure_city_year(backend, city)
    years = nearest_years(backend.source_years(product, city))
    if not years:
        return {"skip": True}
    with tempfile.TemporaryDirectory(prefix="citycube-bench-gen-") as tmp:
        start = time.perf_counter()
        backend.fetch(product, city, years[0], Path(tmp) / "cold")
        cold = time.perf_counter() - start
        warm = []
        for i, year in enumerate(years):
            start = time.perf_counter()
            backend.fetch(product, city, year, Path(tmp) / f"warm{i}")
            warm.append(time.perf_counter() - start)
    return {"cold": cold, "warm": warm, "years": years}


def _measure_city_year(backend: Any, city: str) -> dict[str, Any]:
    """Every product of TARGET_YEAR cold, then the annual products of two more years warm."""
    products = backend.products()
    with tempfile.TemporaryDirectory(prefix="citycube-bench-gen-") as tmp:
        start = time.perf_counter()
        for product in products:
            years = backend.source_years(product, city)
            if years is not None and not years:
                continue
            year = None if years is None else nearest_years(years)[0]
            backend.fetch(product, city, year, Path(tmp) / "cold")
        cold = time.perf_counter() - start
        warm = []
        for year in (TARGET_YEAR - 1, TARGET_YEAR + 1):
            start = time.perf_counter()
            for product in products:
                years = backend.source_years(product, city)
                if years is None or year not in years or product in EPOCH_PRODUCTS:
                    continue
                backend.fetch(product, city, year, Path(tmp) / f"warm{year}")
            warm.append(time.perf_counter() - start)
    return {"cold": cold, "warm": warm}


def run_worker(product: str, city: str, root: str) -> dict[str, Any]:
    """``measure`` in a fresh interpreter, with ``root`` first on the import path if given.

    The worker runs this file as a script from the temporary directory, so neither the current
    directory nor this checkout shadows the ``sources`` package of ``root``.
    """
    env = dict(os.environ)
    if root:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(root).resolve()), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", product, city],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """A markdown table of medians, one row per product, cold and warm per city."""
    cities = list(results)
    header = " | ".join(f"{c} cold s | {c} warm s/year" for c in cities)
    lines = [f"| product | {header} |", "|---" * (1 + 2 * len(cities)) + "|"]
    totals = {city: [0.0, 0.0] for city in cities}
    for product in results[cities[0]]:
        cells = []
        for city in cities:
            runs = [r for r in results[city].get(product, []) if not r.get("skip")]
            if not runs:
                cells += ["–", "–"]
                continue
            cold = statistics.median(r["cold"] for r in runs)
            warm_runs = [statistics.median(r["warm"]) for r in runs if r["warm"]]
            warm = statistics.median(warm_runs) if warm_runs else None
            cells += [f"{cold:.3f}", "–" if warm is None else f"{warm:.3f}"]
            if product not in PSEUDO_PRODUCTS and warm is not None:
                totals[city][0] += cold
                totals[city][1] += warm
        lines.append(f"| {product} | " + " | ".join(cells) + " |")
    sums = [f"{totals[c][0]:.3f} | {totals[c][1]:.3f}" for c in cities]
    lines.append("| sum of products | " + " | ".join(sums) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: measure, print progress and the tables, optionally save JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=2, metavar=("PRODUCT", "CITY"), help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=3, help="repeats (median; default 3)")
    parser.add_argument("--cities", nargs="+", default=list(CITIES))
    parser.add_argument("--products", nargs="+", help="default: every product plus totals")
    parser.add_argument(
        "--roots",
        nargs="+",
        default=["current="],
        help="LABEL=PATH checkouts to compare, measured alternately (default: this one)",
    )
    parser.add_argument("--out", type=Path, help="write every run and the tables as JSON")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(*args.worker)))
        return 0

    from sources.sample.backend import SampleBackend

    products = args.products or [
        "synthetic_city",
        *SampleBackend().products(),
        "all",
    ]
    roots = [tuple(r.split("=", 1)) if "=" in r else (r, r) for r in args.roots]
    results: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        label: {city: {} for city in args.cities} for label, _ in roots
    }
    for run in range(args.runs):
        for city in args.cities:
            for product in products:
                for label, root in roots if run % 2 == 0 else roots[::-1]:
                    r = run_worker(product, city, root)
                    results[label][city].setdefault(product, []).append(r)
                    if not r.get("skip"):
                        warm = " ".join(f"{w:.3f}" for w in r["warm"])
                        print(
                            f"run {run + 1}/{args.runs} {label} {city} {product}: "
                            f"cold {r['cold']:.3f} s, warm {warm}",
                            flush=True,
                        )
    tables = {label: summarise(by_city) for label, by_city in results.items()}
    for label, table in tables.items():
        print(f"\n## {label}\n\n{table}")
    if args.out:
        args.out.write_text(json.dumps({"results": results, "tables": tables}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
