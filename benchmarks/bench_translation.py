"""Benchmark 9: the translation benchmark's inputs for the whole calendar of all 16 cities.

Pair index, splits and sampled instances (269,472 by default) are computed from a synthetic,
full-calendar-sized observations table (16 cities × 26 years × 18 modalities, both grids, every
field: one Parquet file per city-year-modality, as a release lays them out), read through
DuckDB. Building the real calendar takes tens of minutes (benchmark ``calendar``); the steps
measured here read only the observations' keys, availability and values, which the synthetic
table has in the real layout and size. Availability follows each modality's real coverage
(ELEC and PROP in a few cities, CO2 to 2024, NTL from 2012, zeros where the release keeps them);
categorical modalities get a chip index with class counts, which the diversity rule reads.
Target: under 60 s on the project's 2-core machine. Baseline: one DuckDB scan of the same
files (``count(*)`` over the key, availability and value columns).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks import BenchConfig, BenchResult, log, time_repeats
from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Catalogue, Kind, load_catalogue
from citycube.catalogue.temporal import CALENDAR
from citycube.cube.release import CHIP_INDEX_SCHEMA, OBSERVATION_SCHEMA, Release
from citycube.tasks.pairs import modality_order, pair_index, route_counts
from citycube.tasks.sampling import sample_instances
from citycube.tasks.splits import tile_parent_table, tile_splits
from citycube.tasks.translation import categorical_codes, single_class_flags

TARGET_S = 60.0
"""Pair index + splits + instances for the whole calendar, on 2 cores."""

RECORD_CITIES = {"ELEC": 4, "PROP": 8}
"""Cities with official records, as in AgenticCity-Bench (ELEC and PROP cover only a few)."""

YEARS_SERVED = {"CO2": (2000, 2024), "NTL": (2012, 2025)}
"""Modalities whose source covers only part of the calendar."""


def write_synthetic_observations(
    root: Path,
    catalogue: Catalogue,
    seed: int = 0,
    years: tuple[int, ...] = CALENDAR,
    cities: tuple[str, ...] = (),
    chip_index_root: Path | None = None,
) -> int:
    """Write one Parquet file per city-year-modality under ``root``; the number of rows.

    With ``chip_index_root``, categorical modalities also get chip-index files there, with a
    class count per chip (a fifth of them single-class), as a release's chip index has them.
    """
    rng = np.random.default_rng(seed)
    cities = cities or tuple(load_cities())
    tiles = tile_parent_table(cities)
    record_cities = {
        code: {cities[i] for i in rng.choice(len(cities), min(n, len(cities)), replace=False)}
        for code, n in RECORD_CITIES.items()
    }
    rows = 0
    for city in cities:
        mine = tiles.filter(pc.equal(tiles["city"], city))
        ids, scales = mine["tile_id"], mine["scale"]
        n = mine.num_rows
        for year in years:
            for spec in catalogue.modalities:
                served = YEARS_SERVED.get(spec.code, (years[0], years[-1]))
                covered = served[0] <= year <= served[1]
                if spec.code in record_cities and city not in record_cities[spec.code]:
                    covered = False
                available = (rng.random(n) < 0.9) & covered
                parts = []
                for f in spec.fields:
                    value = rng.gamma(2.0, 50.0, n)
                    value[rng.random(n) < 0.03] = 0.0  # genuine zeros stay available
                    part = pa.table(
                        {
                            "tile_id": ids,
                            "city": pa.array([city] * n),
                            "scale": scales,
                            "year": pa.array(np.full(n, year, np.int16)),
                            "modality": pa.array([spec.code] * n),
                            "field": pa.array([f.name] * n),
                            "value": pa.array(value, mask=~available),
                            "unit": pa.array([f.unit] * n),
                            "valid_fraction": pa.array(np.where(available, 1.0, 0.2)),
                            "available": pa.array(available),
                            "reason": pa.array(
                                np.where(available, None, "outside_source_coverage"), pa.string()
                            ),
                            "temporal_basis": pa.array(["annual"] * n),
                            "source_year": pa.array(np.full(n, year, np.int16)),
                            "source_id": pa.array([f"bench:{spec.product}"] * n),
                            "source_version": pa.array(["0"] * n),
                            "synthetic": pa.array(np.ones(n, bool)),
                        }
                    )
                    parts.append(part.cast(OBSERVATION_SCHEMA))
                path = root / f"city={city}" / f"year={year}" / f"{spec.code}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.concat_tables(parts), path, compression="zstd")
                rows += n * len(parts)
                if chip_index_root is not None and spec.kind == Kind.CATEGORICAL_IMAGE:
                    classes = np.where(rng.random(n) < 0.2, 1, rng.integers(2, 8, n))
                    index = {
                        "tile_id": ids,
                        "city": pa.array([city] * n),
                        "scale": scales,
                        "year": pa.array(np.full(n, year, np.int16)),
                        "modality": pa.array([spec.code] * n),
                        "store": pa.array([f"chips/{spec.code}/{city}/{year}.zarr"] * n),
                        **{k: pa.array(np.zeros(n, np.int32)) for k in ("row_off", "col_off")},
                        **{k: pa.array(np.full(n, 80, np.int32)) for k in ("height", "width")},
                        "resolution_m": pa.array(np.full(n, 25.0)),
                        "valid_fraction": pa.array(np.where(available, 1.0, 0.2)),
                        "available": pa.array(available),
                        "temporal_basis": pa.array(["annual"] * n),
                        "source_year": pa.array(np.full(n, year, np.int16)),
                        "classes": pa.array(classes.astype(np.int16)),
                    }
                    chip_path = chip_index_root / path.relative_to(root)
                    chip_path.parent.mkdir(parents=True, exist_ok=True)
                    table = pa.table(index).cast(CHIP_INDEX_SCHEMA)
                    pq.write_table(table, chip_path, compression="zstd")
    return rows


def _view(con: duckdb.DuckDBPyConnection, name: str, root: Path) -> None:
    pattern = str(root / "city=*" / "year=*" / "*.parquet")
    con.execute(
        f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet('{pattern}', "
        "hive_partitioning = false, union_by_name = true)"
    )


def benchmark_inputs(release: Release, catalogue: Catalogue) -> dict[str, float | int]:
    """Pair index, splits and instances from the release's observations and chip index, as the
    assets compute them, each step timed."""
    timings: dict[str, float | int] = {}
    start = time.perf_counter()
    categorical = categorical_codes(catalogue)
    with duckdb.connect() as con:
        _view(con, "observations", release.root / "observations")
        _view(con, "chip_index", release.root / "chip_index")
        pairs = pair_index(con, catalogue)
        order = modality_order(catalogue)
        counts = route_counts(pairs["modality_mask"].to_numpy(), len(order))
        timings["pair_index_s"] = time.perf_counter() - start
        step = time.perf_counter()
        splits = tile_splits(tile_parent_table())
        timings["splits_s"] = time.perf_counter() - step
        step = time.perf_counter()
        flags = single_class_flags(release, con, categorical)
    result = sample_instances(pairs, splits, order, categorical=categorical, single_class=flags)
    timings["instances_s"] = time.perf_counter() - step
    timings["total_s"] = time.perf_counter() - start
    timings["keys"] = pairs.num_rows
    timings["pairs"] = int(counts.sum())
    timings["instances"] = result.instances.num_rows
    for name, n in result.achieved.items():
        timings[f"instances_{name}"] = n
    return timings


def _scan(root: Path) -> int:
    with duckdb.connect() as con:
        _view(con, "observations", root)
        return con.execute(
            "SELECT count(*) FROM observations WHERE available AND value IS NOT NULL "
            "AND tile_id IS NOT NULL AND year > 0"
        ).fetchone()[0]


def run(config: BenchConfig) -> BenchResult:
    """Time the three steps on a synthetic whole calendar (a shorter calendar when quick)."""
    catalogue = load_catalogue()
    years = CALENDAR[-6:] if config.quick else CALENDAR
    with tempfile.TemporaryDirectory(prefix="citycube-bench-translation-") as tmp:
        release = Release(Path(tmp), "bench")
        root = release.root / "observations"
        log(f"    writing synthetic observations: 16 cities × {len(years)} years × 18 modalities")
        started = time.perf_counter()
        rows = write_synthetic_observations(
            root, catalogue, years=tuple(years), chip_index_root=release.root / "chip_index"
        )
        files = len(list(root.glob("city=*/year=*/*.parquet")))
        log(f"    {rows:,} rows in {files} files ({time.perf_counter() - started:.0f} s)")
        scan, _ = time_repeats(lambda: _scan(root), config.repeats, label="DuckDB scan")
        steps, figures = time_repeats(
            lambda: benchmark_inputs(release, catalogue),
            config.repeats,
            label="pairs+splits+sample",
        )
    total = steps.median_s
    result = BenchResult(
        name="translation",
        title=f"Translation inputs, 16 cities × {len(years)} years (synthetic observations)",
        baseline="one DuckDB scan of the observation files (key, availability, value)",
        columns=[
            "keys",
            "pairs",
            "instances (train/val/test)",
            "pair index s",
            "splits s",
            "instances s",
            "total s",
            "scan s",
            "ratio (total / scan)",
        ],
        rows=[
            [
                f"{figures['keys']:,}",
                f"{figures['pairs']:,}",
                f"{figures['instances']:,} ({figures['instances_train']:,}/"
                f"{figures['instances_val']:,}/{figures['instances_test']:,})",
                f"{figures['pair_index_s']:.1f}",
                f"{figures['splits_s']:.1f}",
                f"{figures['instances_s']:.1f}",
                f"{total:.1f}",
                f"{scan.median_s:.1f}",
                f"{total / scan.median_s:.1f}×",
            ]
        ],
        notes=[
            f"{rows:,} observation rows in {files} Parquet files (one per city-year-modality). "
            f"Target: under {TARGET_S:.0f} s for the whole calendar; "
            f"{'met' if total < TARGET_S else 'NOT met'} ({total:.1f} s median). The step "
            "columns are the last run's; total is the median of the runs.",
            "Instances include the single-class flags of LC, LU and POI chips, read from the "
            "chip index's class counts as the asset reads them (synthetic counts here).",
        ],
    )
    result.details = {
        "rows": rows,
        "files": files,
        "years": len(years),
        "steps": steps.as_dict(),
        "scan": scan.as_dict(),
        **figures,
    }
    return result
