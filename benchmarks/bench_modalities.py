"""Benchmark 2: processing throughput per modality, for one city-year of sample data.

Each enabled modality is processed with ``process_partition`` exactly as the Dagster asset
does it, into a temporary release. Sources are fetched (generated) first so their synthesis is
not timed, and the derived results are removed before every run so the work is really done.
The baseline is a lower bound for any processing: decoding the same source files once (every
pixel of a raster, every feature of a vector file, every row of a table).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import geopandas as gpd
import pandas as pd
import pyarrow.parquet as pq
import pyogrio
import pyogrio.errors
import rasterio
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

from benchmarks import BenchConfig, BenchResult, log, time_repeats
from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import Catalogue, ModalitySpec, load_catalogue
from citycube.catalogue.temporal import resolve
from citycube.cube.release import Release
from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.items.protocol import SourceItem
from citycube.processing.compute import PartitionSummary, process_partition
from sources.sample import SampleBackend

CITY = "Boston"
YEAR = 2020
VECTOR_SUFFIXES = (".gpkg", ".geojson", ".json", ".shp", ".fgb", ".parquet")
BASELINE = (
    "decoding every pixel, feature or row of the same source files once (rasterio for "
    "rasters, geopandas/pyogrio for vectors and GeoParquet, pandas for CSV)"
)


def fetch_items(
    modality: ModalitySpec, backend: SampleBackend, release: Release, city: str, year: int
) -> list[SourceItem]:
    """The source items the partition will use, generated now so they are not timed later.

    Auxiliary products (static series such as CPI and PPP) included: a build fetches them as
    source assets of their own, not inside the modality's processing.
    """
    items = []
    for product in modality.products():
        resolution = resolve(modality.temporal, year, backend.source_years(product, city))
        if resolution.available:
            items.append(backend.fetch(product, city, resolution.source_year, release.sources_dir))
    for product in modality.auxiliary_products:
        with contextlib.suppress(SourceUnavailableError):
            items.append(backend.fetch(product, city, None, release.sources_dir))
    return items


def source_files(items: list[SourceItem]) -> list[Path]:
    """Every file of the items (data, QA, per-variable layers)."""
    return [Path(path) for item in items for path in item.files.values()]


def _read_vector(path: Path) -> int:
    """Decode every feature of every layer (geometry included); returns the feature count."""
    if path.suffix == ".parquet":
        try:
            return len(gpd.read_parquet(path))
        except ValueError:  # plain Parquet without geometry metadata
            return pq.read_table(path).num_rows
    layers = pyogrio.list_layers(path)
    return sum(len(gpd.read_file(path, layer=name)) for name, _ in layers)


def _read_file(path: str | Path) -> int:
    """Decode a file completely, as processing must: pixels, features or rows.

    Rasters (and their subdatasets) with rasterio, vector files and GeoParquet with
    geopandas, CSV with pandas; anything else is read as bytes. Returns values read.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(path) as ds:
                if ds.count:
                    return int(ds.read().size)
                subdatasets = list(ds.subdatasets)
        if subdatasets:
            return sum(_read_file(sub) for sub in subdatasets)
    except RasterioIOError:
        pass
    path = Path(path)
    if path.suffix.lower() in VECTOR_SUFFIXES:
        try:
            return _read_vector(path)
        except pyogrio.errors.DataSourceError:
            if path.suffix.lower() != ".json":
                raise
            return len(json.loads(path.read_bytes()))  # a plain JSON document (e.g. a series)
    if path.suffix.lower() == ".csv":
        return int(pd.read_csv(path).size)
    return len(path.read_bytes())


def decode_every_file(paths: list[Path]) -> int:
    """Decode every file once (see ``_read_file``); the lower bound of any processing."""
    return sum(_read_file(path) for path in paths)


def describe(paths: list[Path]) -> str:
    """Shape, bands and type of the files, e.g. ``1801×2201×3 uint8 + 6 × 36×49×1 uint16``."""
    kinds: Counter[str] = Counter()
    for path in paths:
        try:
            with rasterio.open(path) as ds:
                kinds[f"{ds.height}×{ds.width}×{ds.count} {ds.dtypes[0] if ds.count else ''}"] += 1
        except RasterioIOError:
            kinds[f"{path.suffix} {path.stat().st_size // 1024} KiB"] += 1
    return " + ".join(k if n == 1 else f"{n} × {k}" for k, n in kinds.items())


def clear_derived(release: Release, code: str, *, coverage: bool) -> None:
    """Remove cached tile results (and optionally coverage weights) so the work is redone."""
    shutil.rmtree(release.draft_dir / "derived" / code, ignore_errors=True)
    if coverage:
        shutil.rmtree(release.cache_dir / "coverage", ignore_errors=True)


def run(config: BenchConfig) -> BenchResult:
    """Time every enabled modality for one city-year against a read-only pass."""
    catalogue = load_catalogue()
    backend = SampleBackend()
    result = BenchResult(
        name="modalities",
        title=f"Per-modality processing throughput ({CITY} {YEAR}, both scales)",
        baseline=BASELINE,
        columns=[
            "modality",
            "source files",
            "process s",
            "tile-years/s",
            "decode-only s",
            "ratio (process / decode)",
            "warm-coverage s",
            "tile-years/s (warm)",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="citycube-bench-mod-") as tmp:
        release = Release(Path(tmp), "bench")
        for modality in catalogue.enabled():
            log(f"  {modality.code}: fetching sources (untimed)")
            items = fetch_items(modality, backend, release, CITY, YEAR)
            paths = source_files(items)
            result.details[modality.code] = _run_modality(
                modality, catalogue, backend, release, paths, config, result
            )
    result.notes += [
        f"tile-years/s counts the tiles of both scales for one year ({CITY}: "
        + " + ".join(str(city_grid(CITY, scale).n_tiles) for scale in SCALES)
        + f" = {sum(city_grid(CITY, scale).n_tiles for scale in SCALES)}).",
        "process s: derived results and coverage weights removed before each run (the first "
        "year of a source). warm-coverage s (numeric modalities): derived results removed, "
        "coverage weights kept, i.e. a later year of the same source grid.",
        "Image modalities write Zarr chips at 25 m and summarise tiles; numeric ones reduce "
        "their sources onto both tile grids. Every partition writes one observations Parquet.",
        "The ratio is how many times the bare decode the whole partition costs (≥ 1; lower is "
        "better).",
    ]
    return result


def _run_modality(
    modality: ModalitySpec,
    catalogue: Catalogue,
    backend: SampleBackend,
    release: Release,
    paths: list[Path],
    config: BenchConfig,
    result: BenchResult,
) -> dict[str, Any]:
    code = modality.code
    read_time, _ = time_repeats(
        lambda: decode_every_file(paths), config.repeats, label="decode every file"
    )

    def process() -> PartitionSummary:
        return process_partition(modality, catalogue, CITY, YEAR, backend, release)

    cold_time, summary = time_repeats(
        process,
        config.repeats,
        setup=lambda: clear_derived(release, code, coverage=True),
        label="process_partition",
    )
    tiles = summary.tiles
    detail: dict[str, Any] = {
        "tiles": tiles,
        "available_tiles": summary.available_tiles,
        "source_files": [p.name for p in paths],
        "source_bytes_on_disk": sum(p.stat().st_size for p in paths),
        "read_only": read_time.as_dict(),
        "process": cold_time.as_dict(),
        "tile_years_per_s": tiles / cold_time.median_s,
        "ratio_process_over_read": cold_time.median_s / read_time.median_s,
    }
    warm_cells = ["–", "–"]
    if not modality.is_image:
        warm_time, _ = time_repeats(
            process,
            config.repeats,
            setup=lambda: clear_derived(release, code, coverage=False),
            label="process_partition, coverage cached",
        )
        detail["process_warm_coverage"] = warm_time.as_dict()
        detail["tile_years_per_s_warm"] = tiles / warm_time.median_s
        warm_cells = [f"{warm_time.median_s:.3f}", f"{tiles / warm_time.median_s:,.0f}"]
    result.rows.append(
        [
            code,
            describe(paths),
            f"{cold_time.median_s:.3f}",
            f"{tiles / cold_time.median_s:,.0f}",
            f"{read_time.median_s:.4f}",
            f"{cold_time.median_s / read_time.median_s:.0f}×",
            *warm_cells,
        ]
    )
    return detail
