"""The representation protocol's speed: the three built-in embeddings on a release's 2 km tiles.

``python -m benchmarks.bench_represent [--cities Amsterdam,Boston] [--seeds 42,24,7,0,100]``
builds a release of synthetic observations (one year, every field of the 18 modalities, the
sample family's layout; benchmarks/bench_translation.py writes them) for the cities, then runs
``citycube represent``'s evaluation: nine tasks (all but the chip-based class fractions, whose
chips the synthetic release does not have) × three embeddings × block10 and random splits × the
seeds, MLP head, and times it. Baseline: for every MLP fit, the closed-form least-squares fit
of a linear model on the same arrays (numpy ``lstsq``), i.e. the cheapest fit any head can have.
Writes benchmarks/results/represent.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq

from benchmarks.bench_translation import write_synthetic_observations
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles
from citycube.represent.run import RunConfig, evaluate
from citycube.represent.splits import SEEDS
from citycube.represent.tasks import TASKS

RESULTS = Path(__file__).resolve().parent / "results"
YEAR = 2024


def _lstsq_seconds(folder: Path) -> float:
    """Seconds of a least-squares fit on the train rows of every aligned table and split."""
    splits = pq.read_table(folder / "splits.parquet").to_pandas()
    total = 0.0
    for aligned in sorted((folder / "aligned").glob("*/*/*.parquet")):
        city, task = aligned.parts[-2], aligned.stem
        table = pq.read_table(aligned).to_pandas().set_index("tile_id")
        X = table.filter(regex=r"^f\d+$").to_numpy()
        mine = splits[(splits["city"] == city) & (splits["task"] == task)]
        for _, part in mine.groupby(["protocol", "seed"]):
            train = part.loc[part["split"] == "train", "tile_id"]
            rows = table.index.get_indexer(train)
            rows = rows[rows >= 0]
            Xt = np.column_stack([X[rows], np.ones(len(rows))])
            y = np.random.default_rng(0).normal(size=len(rows))
            start = time.perf_counter()
            np.linalg.lstsq(Xt, y, rcond=None)
            total += time.perf_counter() - start
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cities", default="Amsterdam,Boston")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    args = parser.parse_args()
    cities = tuple(args.cities.split(","))
    seeds = tuple(int(s) for s in args.seeds.split(","))
    catalogue = load_catalogue()
    with tempfile.TemporaryDirectory(prefix="bench-represent-") as tmp:
        release = Release(Path(tmp) / "data", "bench")
        write_tiles(release)
        write_synthetic_observations(
            release.draft_dir / "observations", catalogue, years=(YEAR,), cities=cities
        )
        build_duckdb(
            release, catalogue, release_metadata(release, source_set="bench", synthetic=True)
        )
        config = RunConfig(
            cities=cities,
            tasks=tuple(t for t in TASKS if t != "LCD"),
            seeds=seeds,
            year=YEAR,
        )
        load = os.getloadavg()
        with duckdb.connect(str(release.duckdb_file), read_only=True) as con:
            result = evaluate(con, release.root, config, Path(tmp) / "run")
        baseline = _lstsq_seconds(Path(tmp) / "run")
        units = int(result.alignment.groupby(["city", "task"])["task_units"].first().sum())
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}",
        "load_before": [round(v, 2) for v in load],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "cities": list(cities),
        "seeds": list(seeds),
        "task_units": units,
        "fits": len(result.results),
        "seconds": round(result.seconds, 1),
        "seconds_per_fit": round(result.seconds / max(len(result.results), 1), 3),
        "median_epochs": float(result.results["epochs"].median()),
        "lstsq_seconds": round(baseline, 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "represent.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    md = [
        "# Representation protocol speed",
        "",
        f"- date (UTC): {record['date']}; machine: {record['machine']}",
        f"- load average before / after: {record['load_before']} / {record['load_after']}",
        "",
        "| cities | task units | fits | protocol s | s per fit | median epochs | lstsq s |",
        "|---|---|---|---|---|---|---|",
        f"| {', '.join(cities)} | {units:,} | {record['fits']:,} | {record['seconds']} | "
        f"{record['seconds_per_fit']} | {record['median_epochs']:.0f} | "
        f"{record['lstsq_seconds']} |",
        "",
        "Three built-in embeddings × nine tasks × block10 and random splits × "
        f"{len(seeds)} seeds, MLP head (1024 hidden, Adam, batch 512, ≤ 100 epochs, patience "
        "10), on synthetic observations of one year. The lstsq column is the time of a "
        "closed-form linear least-squares fit on the same training arrays, the floor of any "
        "head; the protocol time includes alignment, targets, splits and every file written.",
        "",
    ]
    (RESULTS / "represent.md").write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
