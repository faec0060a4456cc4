"""One evaluation run: embeddings × tasks × cities × protocols × seeds × heads, and its files.

A run writes into its own folder: the aligned features, the alignment report, the split files,
the test predictions, the per-seed scores and the summary tables (see docs/representation.md).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from citycube.errors import EmbeddingError, InvalidNameError
from citycube.io.atomic import atomic_path
from citycube.represent import aggregate
from citycube.represent.builtin import BUILTIN, cube_features, random_features, sinusoidal
from citycube.represent.embeddings import (
    Aligned,
    Embedding,
    MissingPolicy,
    RasterEmbedding,
    TileUnits,
    align,
    prepare,
    read_table_embedding,
    tile_units,
)
from citycube.represent.heads import HEADS, Head, head_config
from citycube.represent.metrics import score
from citycube.represent.splits import PROTOCOLS, SEEDS, Split, make_split, split_table
from citycube.represent.tasks import TASKS, Target, TaskSpec, get_task, latest_year, load_target

MIN_UNITS = 20
"""A city-task with fewer labelled units is skipped (and listed with the reason)."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(name: str, what: str) -> str:
    """``name`` if it is safe as a folder or file name, else ``InvalidNameError``."""
    if not NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"{what} {name!r} is not allowed: use 1–64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class RunConfig:
    """What a run evaluates; the defaults are CityRep's main protocol plus the random split."""

    cities: tuple[str, ...]
    tasks: tuple[str, ...] = tuple(TASKS)
    embeddings: tuple[str, ...] = BUILTIN
    scale: str = "2km"
    year: int | None = None
    """None: each city-task's latest year with labels."""
    protocols: tuple[str, ...] = ("block10", "random")
    seeds: tuple[int, ...] = SEEDS
    heads: tuple[str, ...] = ("mlp",)
    policy: MissingPolicy = "drop"
    l2: bool = False
    max_epochs: int | None = None
    """Override of the heads' 100 epochs (for quick trials only; recorded)."""
    embedding_files: dict[str, str] = field(default_factory=dict)
    """Name → GeoTIFF (raster) or Parquet (h3 / lon+lat / tile_id table) of user embeddings."""

    def validate(self) -> None:
        for t in self.tasks:
            get_task(t)
        for p in self.protocols:
            if p not in PROTOCOLS:
                raise EmbeddingError(f"unknown protocol {p!r}; use {', '.join(PROTOCOLS)}")
        for h in self.heads:
            if h not in HEADS:
                raise EmbeddingError(f"unknown head {h!r}; use {', '.join(HEADS)}")
        for e in self.embeddings:
            check_name(e, "embedding name")
            if e not in BUILTIN and e not in self.embedding_files:
                raise EmbeddingError(
                    f"embedding {e!r} is neither built in ({', '.join(BUILTIN)}) nor given "
                    "as a file (--embedding NAME=PATH)"
                )
        if not self.cities:
            raise EmbeddingError("no cities to evaluate")


def _user_embedding(name: str, path: Path) -> Embedding:
    if path.suffix.lower() == ".zarr" and path.is_dir():
        return RasterEmbedding.from_zarr(name, path)
    if not path.is_file():
        raise EmbeddingError(f"embedding {name}: no file at {path}")
    if path.suffix.lower() in (".tif", ".tiff"):
        return RasterEmbedding.from_geotiff(name, path)
    if path.suffix.lower() == ".parquet":
        return read_table_embedding(name, path)
    raise EmbeddingError(
        f"embedding {name}: {path} is neither a GeoTIFF, a Zarr store nor a Parquet table"
    )


@dataclass
class RunResult:
    """The run's folder and its main tables (also written there)."""

    folder: Path
    results: pd.DataFrame
    tasks: pd.DataFrame
    ranks: pd.DataFrame
    alignment: pd.DataFrame
    skipped: pd.DataFrame
    seconds: float


def _write_table(table: pa.Table | pd.DataFrame, path: Path) -> None:
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")


def _aligned_table(features: np.ndarray, tile_ids: np.ndarray, zero: np.ndarray) -> pa.Table:
    columns: dict[str, object] = {
        "tile_id": pa.array([str(t) for t in tile_ids]),
        "zero_filled": pa.array(zero),
    }
    for j in range(features.shape[1]):
        columns[f"f{j}"] = pa.array(features[:, j])
    return pa.table(columns)


def _predictions(
    emb: str,
    head: str,
    split: Split,
    target: Target,
    tiles: np.ndarray,
    y: np.ndarray,
    pred: np.ndarray,
) -> pa.Table:
    n = len(tiles)
    columns: dict[str, object] = {
        "embedding": [emb] * n,
        "head": [head] * n,
        "protocol": [split.protocol] * n,
        "seed": pa.array(np.full(n, split.seed, np.int32)),
        "city": [target.city] * n,
        "task": [target.task.code] * n,
        "year": pa.array(np.full(n, target.year, np.int16)),
        "tile_id": [str(t) for t in tiles],
    }
    if target.task.kind == "distribution":
        columns["y"] = pa.array([None] * n, pa.float64())
        columns["pred"] = pa.array([None] * n, pa.float64())
        columns["y_fractions"] = pa.array(list(map(list, y)), pa.list_(pa.float64()))
        columns["pred_fractions"] = pa.array(list(map(list, pred)), pa.list_(pa.float64()))
    else:
        columns["y"] = pa.array(np.asarray(y, np.float64))
        columns["pred"] = pa.array(np.asarray(pred, np.float64))
        columns["y_fractions"] = pa.array([None] * n, pa.list_(pa.float64()))
        columns["pred_fractions"] = pa.array([None] * n, pa.list_(pa.float64()))
    return pa.table(columns)


def _dataset_split(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    try:
        rows = con.execute("SELECT tile_id, split FROM splits").fetchall()
    except duckdb.CatalogException:
        raise EmbeddingError(
            "the release has no `splits` view (the dataset's 10 km parent split); materialise "
            "benchmark/splits, or leave the parent protocol out"
        ) from None
    return {str(t): str(s) for t, s in rows}


def evaluate(
    con: duckdb.DuckDBPyConnection,
    release_root: Path,
    config: RunConfig,
    folder: Path,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Run the protocol on the release behind ``con`` and write every artifact into ``folder``."""
    config.validate()
    start = time.perf_counter()
    say = progress or (lambda _msg: None)
    user = {n: _user_embedding(n, Path(p)) for n, p in config.embedding_files.items()}
    dataset_split = _dataset_split(con) if "parent" in config.protocols else None
    results: list[dict[str, object]] = []
    reports: list[dict[str, object]] = []
    skipped: list[dict[str, object]] = []
    split_tables: list[pa.Table] = []
    prediction_tables: list[pa.Table] = []
    folder.mkdir(parents=True, exist_ok=True)
    for city in config.cities:
        units = tile_units(city, config.scale)
        index = {str(t): i for i, t in enumerate(units.tile_ids)}
        shared: dict[str, Aligned] = {}
        for code in config.tasks:
            task = get_task(code)
            year = config.year or latest_year(con, task, city, config.scale)
            if year is None:
                skipped.append({"city": city, "task": code, "reason": "no labels in the release"})
                continue
            target = load_target(con, task, city, config.scale, year, release_root)
            reason = _unusable(target)
            if reason:
                skipped.append({"city": city, "task": code, "year": year, "reason": reason})
                continue
            say(f"{city} {code} {year}: {len(target)} units")
            rows = np.array([index[str(t)] for t in target.tile_ids])
            splits = _splits(config, target, units, rows, dataset_split)
            for s in splits:
                split_tables.append(split_table(city, code, config.scale, target.tile_ids, s))
            for name in config.embeddings:
                aligned = _aligned(name, units, task, year, con, user, shared)
                if aligned is None:
                    skipped.append(
                        {
                            "city": city,
                            "task": code,
                            "year": year,
                            "embedding": name,
                            "reason": "no other modality's numeric field covers half the tiles",
                        }
                    )
                    continue
                feats, record = prepare(aligned, target.tile_ids, config.policy, config.l2)
                record.update(task=code, year=year)
                reports.append(record)
                _write_table(
                    _aligned_table(feats.X, feats.tile_ids, feats.zero_filled),
                    folder / "aligned" / name / city / f"{code}.parquet",
                )
                y = target.y[feats.keep]
                for s in splits:
                    part = s.split[feats.keep]
                    tr, va, te = part == "train", part == "val", part == "test"
                    if tr.sum() < 2 or te.sum() == 0:
                        skipped.append(
                            {
                                "city": city,
                                "task": code,
                                "year": year,
                                "embedding": name,
                                "protocol": s.protocol,
                                "seed": s.seed,
                                "reason": "too few kept units",
                            }
                        )
                        continue
                    for head in config.heads:
                        cfg = head_config(head)
                        if config.max_epochs:
                            cfg = type(cfg)(**{**asdict(cfg), "max_epochs": config.max_epochs})
                        model = Head(task.kind, cfg, seed=s.seed)
                        tick = time.perf_counter()
                        fit = model.fit(feats.X[tr], y[tr], feats.X[va], y[va])
                        pred = model.predict(feats.X[te])
                        fit_seconds = time.perf_counter() - tick
                        metrics = score(task.kind, y[te], pred)
                        results.append(
                            {
                                "embedding": name,
                                "head": head,
                                "protocol": s.protocol,
                                "seed": s.seed,
                                "city": city,
                                "task": code,
                                "year": year,
                                "kind": task.kind,
                                "primary": task.primary,
                                "score": metrics[task.primary],
                                **metrics,
                                "n_train": int(tr.sum()),
                                "n_val": int(va.sum()),
                                "n_test": int(te.sum()),
                                "epochs": fit.epochs,
                                "best_epoch": fit.best_epoch,
                                "fit_seconds": fit_seconds,
                            }
                        )
                        prediction_tables.append(
                            _predictions(name, head, s, target, feats.tile_ids[te], y[te], pred)
                        )
    return _finish(
        folder,
        config,
        results,
        reports,
        skipped,
        split_tables,
        prediction_tables,
        time.perf_counter() - start,
    )


def _unusable(target: Target) -> str | None:
    if len(target) < MIN_UNITS:
        return f"{len(target)} labelled units (fewer than {MIN_UNITS})"
    if target.task.kind == "classification" and len(np.unique(target.y)) < 2:
        return "one class only"
    if target.task.kind == "distribution" and target.y.shape[1] < 2:
        return "one class only"
    if target.task.kind == "regression" and np.ptp(target.y) == 0:
        return "constant target"
    return None


def _splits(
    config: RunConfig,
    target: Target,
    units: TileUnits,
    rows: np.ndarray,
    dataset_split: dict[str, str] | None,
) -> list[Split]:
    out = []
    for protocol in config.protocols:
        seeds = (0,) if protocol == "parent" else config.seeds
        for seed in seeds:
            out.append(
                make_split(
                    protocol, seed, target.tile_ids, units.row[rows], units.col[rows], dataset_split
                )
            )
    return out


def _aligned(
    name: str,
    units: TileUnits,
    task: TaskSpec,
    year: int,
    con: duckdb.DuckDBPyConnection,
    user: dict[str, Embedding],
    shared: dict[str, Aligned],
) -> Aligned | None:
    """The embedding aligned to the city's tiles (cached, except ``cube`` which is per task;
    None when the release has no field to offer as ``cube`` features)."""
    if name == "cube":
        features = cube_features(con, units, year, task.modality)
        return align(features, units) if features.values.shape[1] else None
    if name not in shared:
        if name == "sinusoidal":
            shared[name] = align(sinusoidal(), units)
        elif name == "random":
            shared[name] = align(random_features(units), units)
        else:
            shared[name] = align(user[name], units)
    return shared[name]


def _finish(
    folder: Path,
    config: RunConfig,
    results: list[dict[str, object]],
    reports: list[dict[str, object]],
    skipped: list[dict[str, object]],
    split_tables: Sequence[pa.Table],
    prediction_tables: Sequence[pa.Table],
    seconds: float,
) -> RunResult:
    res = pd.DataFrame(results)
    report = pd.DataFrame(reports)
    skip = pd.DataFrame(
        skipped, columns=["city", "task", "year", "embedding", "protocol", "seed", "reason"]
    )
    _write_csv(report, folder / "alignment_report.csv")
    _write_csv(skip, folder / "skipped.csv")
    if split_tables:
        splits = pa.concat_tables(split_tables)
        _write_table(splits, folder / "splits.parquet")
        _write_csv(
            aggregate.test_block_frequency(splits.to_pandas()), folder / "test_block_frequency.csv"
        )
    if prediction_tables:
        _write_table(pa.concat_tables(prediction_tables), folder / "predictions.parquet")
    tasks = ranks = pd.DataFrame()
    if not res.empty:
        _write_table(res, folder / "results.parquet")
        cities = aggregate.city_scores(res)
        tasks = aggregate.task_table(cities)
        ranks = aggregate.mean_city_rank(cities)
        _write_csv(cities, folder / "city_scores.csv")
        _write_csv(tasks, folder / "task_scores.csv")
        _write_csv(ranks, folder / "mean_city_rank.csv")
        spatial = [p for p in config.protocols if p != "random"]
        if "random" in config.protocols and spatial:
            deltas = pd.concat([aggregate.random_minus_spatial(tasks, p) for p in spatial])
            changes = pd.concat([aggregate.rank_changes(ranks, p) for p in spatial])
            _write_csv(deltas, folder / "random_minus_spatial.csv")
            _write_csv(changes, folder / "rank_changes.csv")
    run = {
        **asdict(config),
        "seconds": round(seconds, 2),
        "fits": len(res),
        "c_std_ddof": aggregate.C_STD_DDOF,
    }
    with atomic_path(folder / "run.json") as tmp:
        tmp.write_text(json.dumps(run, indent=2, default=str), encoding="utf-8")
    return RunResult(folder, res, tasks, ranks, report, skip, seconds)


def release_cities(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The cities that have observations in the release."""
    rows = con.execute("SELECT DISTINCT city FROM observations ORDER BY city").fetchall()
    return tuple(r[0] for r in rows)


def summary(result: RunResult) -> str:
    """The task table (mean over cities ± cross-city std) and mean city ranks, as text."""
    if result.tasks.empty:
        return "no task could be scored (see skipped.csv)"
    lines = []
    for (protocol, head), part in result.tasks.groupby(["protocol", "head"]):
        table = part.pivot(index="embedding", columns="task", values="avg")
        ranks = result.ranks[
            (result.ranks["protocol"] == protocol) & (result.ranks["head"] == head)
        ]
        overall = ranks[ranks["task"] == "overall"].set_index("embedding")["mean_rank"]
        table["mean city rank"] = overall
        lines.append(f"{protocol} · {head} (primary metric: R², macro F1 or KL)")
        lines.append(table.to_string(float_format=lambda v: f"{v:.3f}"))
    return "\n".join(lines)
