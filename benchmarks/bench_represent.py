"""The representation protocol's speed: the three built-in embeddings on a release's 2 km tiles.

``python -m benchmarks.bench_represent [--cities Amsterdam,Boston|all] [--seeds 42,24,7,0,100]``
builds a release of synthetic observations (one year, every field of the 18 modalities, the
sample family's layout; benchmarks/bench_translation.py writes them) for the cities, then runs
``citycube represent``'s evaluation: nine tasks (all but the chip-based class fractions, whose
chips the synthetic release does not have) × three embeddings × block10 and random splits × the
seeds, MLP head, and times it. Baseline: scikit-learn's MLP with the same settings fitted on the
same training arrays for the same number of epochs.
Writes benchmarks/results/represent.{json,md}: one row per city scope, the newest run of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from benchmarks.bench_translation import write_synthetic_observations
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import Release, build_duckdb, release_metadata, write_tiles
from citycube.represent.run import RunConfig, evaluate
from citycube.represent.splits import SEEDS
from citycube.represent.tasks import TASKS

RESULTS = Path(__file__).resolve().parent / "results"
YEAR = 2024


def _sklearn_seconds(folder: Path, results: pd.DataFrame, targets: dict) -> float:
    """Seconds of scikit-learn's MLP with the same settings on the same training arrays.

    For each fit of the run: the same train rows, z-scored features (and targets) as the numpy
    head uses, one hidden layer of 1024, Adam at 1e-3, batches of 512, no L2 penalty, for as
    many epochs as the numpy head ran (scikit-learn's early stopping draws its own validation
    rows, so it is off and the epoch count is fixed instead).
    """
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    splits = pq.read_table(folder / "splits.parquet").to_pandas()
    splits = splits.set_index(["city", "task", "protocol", "seed", "tile_id"])["split"].sort_index()
    total = 0.0
    for row in results.itertuples():
        table = pq.read_table(folder / "aligned" / row.embedding / row.city / f"{row.task}.parquet")
        frame = table.to_pandas()
        part = splits.loc[(row.city, row.task, row.protocol, row.seed)]
        train = part.reindex(frame["tile_id"]).to_numpy() == "train"
        X = frame.filter(regex=r"^f\d+$").to_numpy()[train]
        y = targets[row.city, row.task].reindex(frame["tile_id"]).to_numpy()[train]
        std = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
        settings = dict(
            hidden_layer_sizes=(1024,),
            solver="adam",
            learning_rate_init=1e-3,
            batch_size=512,
            alpha=0.0,
            max_iter=int(row.epochs),
            n_iter_no_change=10**6,
            tol=0.0,
            random_state=int(row.seed),
        )
        if row.kind == "regression":
            model = MLPRegressor(**settings)
            y = (y - y.mean()) / (y.std() or 1.0)
        else:
            model = MLPClassifier(**settings)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "maximum iterations reached": the point here
            model.fit(X, y)
        total += time.perf_counter() - start
    return total


def _targets(con: duckdb.DuckDBPyConnection, results: pd.DataFrame) -> dict:
    from citycube.represent.tasks import load_target

    out = {}
    for (city, task, year), _ in results.groupby(["city", "task", "year"]):
        target = load_target(con, TASKS[task], city, "2km", int(year))
        out[city, task] = pd.Series(target.y, index=target.tile_ids)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cities", default="Amsterdam,Boston", help="comma-separated city names, or 'all' (16)"
    )
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    args = parser.parse_args()
    cities = tuple(args.cities.split(","))
    if args.cities == "all":
        from citycube.catalogue.cities import load_cities

        cities = tuple(load_cities())
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
            targets = _targets(con, result.results)
        load_mid = os.getloadavg()
        baseline = _sklearn_seconds(Path(tmp) / "run", result.results, targets)
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
        "fit_seconds": round(float(result.results["fit_seconds"].sum()), 1),
        "sklearn_seconds": round(baseline, 1),
        "load_before_sklearn": [round(v, 2) for v in load_mid],
    }
    RESULTS.mkdir(exist_ok=True)
    runs = _previous_runs()
    runs = [r for r in runs if r["cities"] != record["cities"]] + [record]
    runs.sort(key=lambda r: len(r["cities"]))
    (RESULTS / "represent.json").write_text(
        json.dumps({"runs": runs}, indent=2) + "\n", encoding="utf-8"
    )
    md = [
        "# Representation protocol speed",
        "",
        "| date (UTC) | load before / after | cities | task units | fits | median epochs | "
        "protocol s | heads s | scikit-learn s | ratio (heads / scikit-learn) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        names = run["cities"]
        shown = ", ".join(names) if len(names) <= 3 else "all"
        md.append(
            f"| {run['date']} | {run['load_before'][0]} / {run['load_after'][0]} | "
            f"{len(names)} ({shown}) | {run['task_units']:,} | {run['fits']:,} | "
            f"{run['median_epochs']:.0f} | {run['seconds']} | {run['fit_seconds']} | "
            f"{run['sklearn_seconds']} | "
            f"{run['fit_seconds'] / max(run['sklearn_seconds'], 1e-9):.2f}× |"
        )
    md += [
        "",
        f"Machine: {record['machine']}. Three built-in embeddings × nine tasks × block10 and "
        f"random splits × {len(seeds)} seeds, MLP head (1024 hidden, Adam, batch 512, ≤ 100 "
        "epochs, patience 10), on synthetic observations of one year. Protocol: the whole run "
        "(alignment, targets, splits, training, every file written); heads: the numpy heads' "
        "training and prediction alone; scikit-learn: MLPRegressor / MLPClassifier with the same "
        "settings on the same training arrays for the same number of epochs, measured after the "
        "run.",
        "",
    ]
    (RESULTS / "represent.md").write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))


def _previous_runs() -> list[dict]:
    """The runs recorded so far (a file of one run, the older form, counts as one)."""
    path = RESULTS / "represent.json"
    if not path.exists():
        return []
    recorded = json.loads(path.read_text(encoding="utf-8"))
    return list(recorded.get("runs", [recorded]))


if __name__ == "__main__":
    main()
