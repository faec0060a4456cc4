"""Turn one modality's source item into tile observations (and chips for image modalities).

The work splits in two so reuse is cheap and honest:
- ``tile_results``: per-tile values for one *source* year (or the static item), computed once
  and cached under ``derived/`` — an epoch or static item serves many calendar years;
- ``observation_table``: the rows for one *calendar* year, labelled with how that year is
  served (annual, epoch, static) and never zero-filled when it is not.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from citycube.aggregate import aggregate_tiles
from citycube.catalogue import Aggregation, Catalogue, Kind, ModalitySpec
from citycube.chips import ChipStoreWriter, row_bands, tile_pixel_summaries, warp_rows
from citycube.cities import SCALES
from citycube.cube import (
    CHIP_INDEX_SCHEMA,
    OBSERVATION_SCHEMA,
    Release,
    file_metadata,
    write_parquet_atomic,
)
from citycube.grids import PixelGrid, Tile, city_grid, pixel_grid
from citycube.readers import open_masked_source
from citycube.temporal import Resolution, resolve
from sources.base import SourceBackend, SourceItem

ProgressFn = Callable[[str], None]

RESULT_COLUMNS = ["tile_id", "scale", "field", "value", "valid_fraction", "reason"]


def _meets(valid_fraction: float, threshold: float) -> bool:
    """Threshold test that treats an exact limit as met despite float rounding."""
    return valid_fraction >= threshold - 1e-9


def _label(source_year: int | None) -> str:
    return "static" if source_year is None else str(source_year)


def item_signature(item: SourceItem) -> str:
    """Changes whenever the item's files change, so stale derived results are recomputed."""
    parts = [item.source_id, item.version]
    for role, path in sorted(item.files.items()):
        stat = Path(path).stat()
        parts.append(f"{role}:{Path(path).name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


def _all_tiles(city: str) -> list[Tile]:
    return [t for scale in SCALES for t in city_grid(city, scale).tiles()]


def _image_results(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    item: SourceItem,
    release: Release,
    progress: ProgressFn | None,
) -> pd.DataFrame:
    """Warp once onto the city's pixel grid, band by band; write chips; summarise tiles."""
    assert modality.chip is not None
    grid: PixelGrid = pixel_grid(city, modality.chip.resolution_m)
    categorical = modality.kind == Kind.CATEGORICAL_IMAGE
    valid_ids = catalogue.valid_ids(modality)
    bands = [f.band for f in modality.fields]
    tiles = _all_tiles(city)
    dtype = np.dtype(modality.chip.dtype)
    fill = 255 if categorical else (0 if np.issubdtype(dtype, np.integer) else np.nan)
    attrs = {
        "citycube_release": release.version,
        "modality": modality.code,
        "city": city,
        "source_id": item.source_id,
        "source_version": item.version,
        "source_year": item.source_year if item.source_year is not None else "static",
        "synthetic": str(item.synthetic).lower(),
        "resolution_m": modality.chip.resolution_m,
        "resampling": modality.chip.resampling.value,
    }
    store = release.chip_store(modality.code, city, _label(item.source_year))
    rows: list[dict] = []
    with (
        open_masked_source(item, modality, bands, valid_ids) as source,
        ChipStoreWriter(store, grid, [f.name for f in modality.fields], dtype, fill, attrs) as w,
    ):
        for row_start, row_stop in row_bands(grid):
            values, valid = warp_rows(source, grid, row_start, row_stop, categorical=categorical)
            if np.issubdtype(dtype, np.integer) and not categorical:
                stored = np.where(valid, np.clip(np.rint(values), 0, np.iinfo(dtype).max), fill)
            else:
                stored = np.where(valid, values, fill)
            w.write_rows(row_start, stored.astype(dtype), valid)
            in_band = [t for t in tiles if row_start <= grid.window(t)[0] < row_stop]
            for summary in tile_pixel_summaries(
                values, valid, row_start, grid, in_band, categorical=categorical
            ):
                fraction = summary.valid_pixels / summary.total_pixels
                ok = _meets(fraction, modality.validity.min_valid_fraction)
                reason = (
                    None
                    if ok
                    else (
                        "no_valid_pixels"
                        if summary.valid_pixels == 0
                        else "insufficient_valid_pixels"
                    )
                )
                scale = "2km" if "_2KM_" in summary.tile_id else "5km"
                for i, f in enumerate(modality.fields):
                    value = (
                        float(summary.mode_class)
                        if categorical and summary.mode_class is not None
                        else (summary.band_means[i] if not categorical else math.nan)
                    )
                    rows.append(
                        {
                            "tile_id": summary.tile_id,
                            "scale": scale,
                            "field": f.name,
                            "value": value if ok else math.nan,
                            "valid_fraction": fraction,
                            "reason": reason,
                        }
                    )
            if progress:
                progress(f"{modality.code} {city} rows {row_stop}/{grid.height}")
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _numeric_results(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    items: dict[str, SourceItem],
    release: Release,
) -> pd.DataFrame:
    """Exact area-weighted aggregation of each field's product onto both tile grids."""
    rows: list[dict] = []
    threshold = modality.validity.min_valid_fraction
    for product, item in items.items():
        fields = [f for f in modality.fields if (f.product or modality.product) == product]
        with open_masked_source(item, modality, [f.band for f in fields]) as source:
            for scale in SCALES:
                grid = city_grid(city, scale)
                stats = aggregate_tiles(source, grid, cache_dir=release.cache_dir / "coverage")
                nominal_km2 = grid.tile_size**2 / 1e6
                for t_index, tile_id in enumerate(grid.tile_ids()):
                    fraction = float(stats.valid_fraction[t_index])
                    covered = float(stats.covered_fraction[t_index])
                    for b, f in enumerate(fields):
                        if modality.aggregation == Aggregation.SUM_PER_NOMINAL_AREA:
                            value = float(stats.total[b, t_index]) / nominal_km2
                        elif modality.aggregation == Aggregation.AREA_MEAN:
                            value = float(stats.mean[b, t_index])
                        else:
                            raise NotImplementedError(
                                f"{modality.code}: aggregation {modality.aggregation} is declared "
                                "but not implemented for raster sources"
                            )
                        if covered <= 0:
                            reason = "outside_source_coverage"
                        elif not _meets(fraction, threshold):
                            reason = "insufficient_valid_support"
                        elif modality.validity.positive and not value > 0:
                            reason = "non_positive_value"
                        else:
                            reason = None
                        rows.append(
                            {
                                "tile_id": tile_id,
                                "scale": scale,
                                "field": f.name,
                                "value": value if reason is None else math.nan,
                                "valid_fraction": fraction,
                                "reason": reason,
                            }
                        )
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def tile_results(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    items: dict[str, SourceItem],
    release: Release,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Per-tile results for one source year; cached until the source item changes."""
    first = next(iter(items.values()))
    label = _label(first.source_year)
    cached = release.derived_file(modality.code, city, label)
    signature = "||".join(item_signature(i) for i in items.values())
    chips_ok = not modality.is_image or release.chip_store(modality.code, city, label).exists()
    if cached.exists() and chips_ok:
        meta = pq.read_schema(cached).metadata or {}
        if meta.get(b"citycube:signature", b"").decode() == signature:
            return pq.read_table(cached).to_pandas()
    if modality.is_image:
        frame = _image_results(modality, catalogue, city, first, release, progress)
    else:
        frame = _numeric_results(modality, catalogue, city, items, release)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    write_parquet_atomic(table, cached, file_metadata(release, **{"citycube:signature": signature}))
    return frame


@dataclass(frozen=True)
class PartitionSummary:
    """What one (modality, city, year) partition wrote."""

    modality: str
    city: str
    year: int
    rows: int
    tiles: int
    available_tiles: int
    basis: str
    source_year: int | None
    reason_counts: dict[str, int]
    path: Path

    def as_metadata(self) -> dict:
        """Plain values for Dagster materialisation metadata."""
        return {
            "rows": self.rows,
            "tiles": self.tiles,
            "available_tiles": self.available_tiles,
            "availability": round(self.available_tiles / self.tiles, 4) if self.tiles else 0.0,
            "temporal_basis": self.basis,
            "source_year": self.source_year if self.source_year is not None else "static/none",
            "reasons": json.dumps(self.reason_counts),
            "path": str(self.path),
        }


def _missing_results(modality: ModalitySpec, city: str, reason: str) -> pd.DataFrame:
    rows = [
        {
            "tile_id": t.tile_id,
            "scale": t.scale,
            "field": f.name,
            "value": math.nan,
            "valid_fraction": math.nan,
            "reason": reason,
        }
        for t in _all_tiles(city)
        for f in modality.fields
    ]
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def observation_table(
    modality: ModalitySpec,
    city: str,
    year: int,
    resolution: Resolution,
    results: pd.DataFrame,
    source_id: str,
    source_version: str,
    synthetic: bool,
) -> pa.Table:
    """Rows for one calendar year: values only where available, NULL plus a reason elsewhere."""
    units = {f.name: f.unit for f in modality.fields}
    available = results["reason"].isna().to_numpy()
    value = results["value"].to_numpy(dtype=float)
    fraction = results["valid_fraction"].to_numpy(dtype=float)
    n = len(results)
    columns = {
        "tile_id": results["tile_id"].tolist(),
        "city": [city] * n,
        "scale": results["scale"].tolist(),
        "year": [year] * n,
        "modality": [modality.code] * n,
        "field": results["field"].tolist(),
        "value": [
            float(v) if ok and np.isfinite(v) else None
            for v, ok in zip(value, available, strict=True)
        ],
        "unit": [units[f] for f in results["field"]],
        "valid_fraction": [float(v) if np.isfinite(v) else None for v in fraction],
        "available": available.tolist(),
        "reason": [None if ok else r for ok, r in zip(available, results["reason"], strict=True)],
        "temporal_basis": [resolution.basis] * n,
        "source_year": [resolution.source_year] * n,
        "source_id": [source_id] * n,
        "source_version": [source_version] * n,
        "synthetic": [synthetic] * n,
    }
    return pa.Table.from_pydict(columns, schema=OBSERVATION_SCHEMA)


def chip_index_table(
    modality: ModalitySpec,
    city: str,
    year: int,
    resolution: Resolution,
    results: pd.DataFrame,
    release: Release,
) -> pa.Table:
    """Where each tile's chip lives: store path (relative to the release) and pixel window."""
    assert modality.chip is not None
    grid = pixel_grid(city, modality.chip.resolution_m)
    store = release.chip_store(modality.code, city, _label(resolution.source_year))
    per_tile = results.drop_duplicates("tile_id").set_index("tile_id")
    rows = []
    for tile in _all_tiles(city):
        row_off, col_off, height, width = grid.window(tile)
        rec = per_tile.loc[tile.tile_id]
        rows.append(
            {
                "tile_id": tile.tile_id,
                "city": city,
                "scale": tile.scale,
                "year": year,
                "modality": modality.code,
                "store": str(store.relative_to(release.root)),
                "row_off": row_off,
                "col_off": col_off,
                "height": height,
                "width": width,
                "resolution_m": float(modality.chip.resolution_m),
                "valid_fraction": float(rec["valid_fraction"]),
                "available": bool(pd.isna(rec["reason"])),
                "temporal_basis": resolution.basis,
                "source_year": resolution.source_year,
            }
        )
    return pa.Table.from_pylist(rows, schema=CHIP_INDEX_SCHEMA)


def process_partition(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    year: int,
    backend: SourceBackend,
    release: Release,
    progress: ProgressFn | None = None,
) -> PartitionSummary:
    """Build and write one (modality, city, year) partition of the cube."""
    products = modality.products()
    resolutions = {
        p: resolve(modality.temporal, year, backend.source_years(p, city)) for p in products
    }
    resolution = resolutions[products[0]]
    items: dict[str, SourceItem] = {}
    if resolution.available:
        for p in products:
            items[p] = backend.fetch(p, city, resolutions[p].source_year, release.sources_dir)
        results = tile_results(modality, catalogue, city, items, release, progress)
        first = items[products[0]]
        source_id, source_version, synthetic = first.source_id, first.version, first.synthetic
    else:
        results = _missing_results(modality, city, resolution.missing_reason or "unavailable")
        source_id = f"{backend.name}:{products[0]}"
        source_version, synthetic = "n/a", backend.name == "sample"
    table = observation_table(
        modality, city, year, resolution, results, source_id, source_version, synthetic
    )
    meta = file_metadata(release, **{"citycube:synthetic": str(synthetic).lower()})
    if modality.is_image and resolution.available:
        write_parquet_atomic(
            chip_index_table(modality, city, year, resolution, results, release),
            release.chip_index_file(city, year, modality.code),
            meta,
        )
    else:
        release.chip_index_file(city, year, modality.code).unlink(missing_ok=True)
    path = write_parquet_atomic(table, release.observations_file(city, year, modality.code), meta)
    per_tile = results.drop_duplicates("tile_id")
    reasons = per_tile["reason"].dropna().value_counts().to_dict()
    return PartitionSummary(
        modality=modality.code,
        city=city,
        year=year,
        rows=table.num_rows,
        tiles=len(per_tile),
        available_tiles=int(per_tile["reason"].isna().sum()),
        basis=resolution.basis,
        source_year=resolution.source_year,
        reason_counts={str(k): int(v) for k, v in reasons.items()},
        path=path,
    )


def partition_keys(cities: Sequence[str], years: Sequence[int]) -> list[tuple[str, int]]:
    """(city, year) pairs in build order."""
    return [(c, y) for c in cities for y in years]
