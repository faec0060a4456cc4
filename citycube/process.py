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
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
from pyproj import Transformer

from citycube.aggregate import aggregate_tiles
from citycube.catalogue import Aggregation, Catalogue, Conversion, FieldSpec, Kind, ModalitySpec
from citycube.chips import (
    ChipStoreWriter,
    TilePixelSummary,
    block_memory,
    blocks,
    row_bands,
    tile_pixel_summaries,
    warp_block,
)
from citycube.cities import SCALES, get_city
from citycube.cube import (
    CHIP_INDEX_SCHEMA,
    OBSERVATION_SCHEMA,
    Release,
    file_metadata,
    write_parquet_atomic,
)
from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.grids import PixelGrid, Tile, city_grid, pixel_grid
from citycube.memory import bound_process_memory
from citycube.money import ppp_2017_factor
from citycube.products import load_products
from citycube.readers import open_masked_source
from citycube.temporal import Resolution, resolve
from citycube.vectors import (
    coverage_fractions,
    iter_points,
    load_coverage,
    load_records,
    open_vector_layer,
    point_counts,
    rasterize_block,
    tile_index,
)
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
    """Warp once onto the city's pixel grid, block by block; write chips; summarise tiles."""
    assert modality.chip is not None
    grid: PixelGrid = pixel_grid(city, modality.chip.resolution_m)
    categorical = modality.kind == Kind.CATEGORICAL_IMAGE
    valid_ids = catalogue.valid_ids(modality)
    bands = [f.band for f in modality.fields]
    dtype = np.dtype(modality.chip.dtype)
    fill = 255 if categorical else (0 if np.issubdtype(dtype, np.integer) else np.nan)
    store = release.chip_store(modality.code, city, _label(item.source_year))
    attrs = _chip_attrs(modality, city, item, release)
    summaries = _BlockSummaries(grid, _all_tiles(city))
    with (
        block_memory() as release_block,
        open_masked_source(item, modality, bands, valid_ids) as source,
        ChipStoreWriter(store, grid, [f.name for f in modality.fields], dtype, fill, attrs) as w,
    ):
        for row_start, row_stop, col_start, col_stop in summaries.blocks:
            values, valid = warp_block(
                source, grid, row_start, row_stop, col_start, col_stop, categorical=categorical
            )
            w.write_block(
                row_start, col_start, _chip_values(values, valid, dtype, fill, categorical), valid
            )
            summaries.add(values, valid, row_start, col_start, categorical=categorical)
            del values, valid
            release_block()
            if progress:
                progress(summaries.progress(modality.code, city, row_stop, col_stop))
    return pd.DataFrame(
        _summary_rows(modality, summaries.ordered(), categorical), columns=RESULT_COLUMNS
    )


def _chip_values(
    values: np.ndarray, valid: np.ndarray, dtype: np.dtype, fill: float, categorical: bool
) -> np.ndarray:
    """Warped values as the chip store takes them: rounded into [0, max] for integer images,
    ids cast to the store type. Float images, and integer images of an unsigned type (whose
    range starts at 0), go as they are: the writer rounds, clips, casts and fills them."""
    if categorical:
        return np.where(valid, values, fill).astype(dtype)
    if np.issubdtype(dtype, np.integer) and np.iinfo(dtype).min < 0:
        rounded = np.clip(np.rint(values), 0, np.iinfo(dtype).max)
        return np.where(valid, rounded, fill).astype(dtype)
    return values


def _vector_image_results(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    item: SourceItem,
    release: Release,
    progress: ProgressFn | None,
) -> pd.DataFrame:
    """Draw vector features straight onto the chip grid (no buffering), write chips, summarise."""
    assert modality.chip is not None and modality.rasterize is not None
    spec = modality.rasterize
    grid = pixel_grid(city, modality.chip.resolution_m)
    categorical = modality.kind == Kind.CATEGORICAL_IMAGE
    dtype = np.dtype(modality.chip.dtype)
    layer = open_vector_layer(
        item.files["data"],
        spec,
        get_city(city).epsg,
        load_products()[item.product].expected_crs(city),
        item.files.get("coverage"),
    )
    store = release.chip_store(modality.code, city, _label(item.source_year))
    attrs = _chip_attrs(modality, city, item, release)
    fill = 255 if categorical else 0
    summaries = _BlockSummaries(grid, _all_tiles(city))
    with (
        block_memory() as release_block,
        ChipStoreWriter(store, grid, [f.name for f in modality.fields], dtype, fill, attrs) as w,
    ):
        for row_start, row_stop, col_start, col_stop in summaries.blocks:
            values, valid = rasterize_block(
                layer,
                grid,
                row_start,
                row_stop,
                col_start,
                col_stop,
                background=spec.background,
                dtype=dtype,
            )
            w.write_block(row_start, col_start, values, valid)  # already the store type
            summaries.add(
                values if categorical or np.issubdtype(dtype, np.integer) else values.astype(float),
                valid,
                row_start,
                col_start,
                categorical=categorical,
            )
            del values, valid
            release_block()
            if progress:
                progress(summaries.progress(modality.code, city, row_stop, col_stop))
    return pd.DataFrame(
        _summary_rows(modality, summaries.ordered(), categorical), columns=RESULT_COLUMNS
    )


class _BlockSummaries:
    """Tile summaries gathered block by block, handed back in the order rows have always had.

    That order is by 10 km row band, then by tile (2 km row-major, then 5 km), so a partition
    writes the same rows in the same order however the work is cut into blocks. Every tile
    must lie inside exactly one block; a tile that straddled blocks would otherwise vanish.
    """

    def __init__(self, grid: PixelGrid, tiles: Sequence[Tile]) -> None:
        self.grid = grid
        self.blocks = blocks(grid)
        bands = row_bands(grid)
        self._tiles_in: dict[tuple[int, int], list[Tile]] = {}
        self._order: dict[str, tuple[int, int]] = {}
        self._tiles = {tile.tile_id: tile for tile in tiles}
        for index, tile in enumerate(tiles):
            row_off, col_off, height, width = grid.window(tile)
            holder = next(
                (
                    (row_start, col_start)
                    for row_start, row_stop, col_start, col_stop in self.blocks
                    if row_start <= row_off
                    and row_off + height <= row_stop
                    and col_start <= col_off
                    and col_off + width <= col_stop
                ),
                None,
            )
            if holder is None:
                raise ValueError(f"{tile.tile_id} does not lie inside one block of its pixel grid")
            self._tiles_in.setdefault(holder, []).append(tile)
            band = next(i for i, (start, stop) in enumerate(bands) if start <= row_off < stop)
            self._order[tile.tile_id] = (band, index)
        self._done: dict[str, TilePixelSummary] = {}

    def add(
        self,
        values: np.ndarray,
        valid: np.ndarray,
        row_start: int,
        col_start: int,
        *,
        categorical: bool,
    ) -> None:
        """Summarise the tiles of the block at (row_start, col_start)."""
        tiles = self._tiles_in.get((row_start, col_start), [])
        for summary in tile_pixel_summaries(
            values, valid, row_start, col_start, self.grid, tiles, categorical=categorical
        ):
            self._done[summary.tile_id] = summary

    def ordered(self) -> list[tuple[Tile, TilePixelSummary]]:
        """Every tile with its summary, by row band and then tile order."""
        missing = self._order.keys() - self._done.keys()
        if missing:
            raise RuntimeError(f"{len(missing)} tiles were never summarised, e.g. {min(missing)}")
        ids = sorted(self._order, key=self._order.__getitem__)
        return [(self._tiles[t], self._done[t]) for t in ids]

    def progress(self, code: str, city: str, row_stop: int, col_stop: int) -> str:
        """A progress line: the block just finished, by its far row and column."""
        return f"{code} {city} rows {row_stop}/{self.grid.height} cols {col_stop}/{self.grid.width}"


def _chip_attrs(
    modality: ModalitySpec, city: str, item: SourceItem, release: Release
) -> dict[str, object]:
    assert modality.chip is not None
    return {
        "citycube_release": release.version,
        "modality": modality.code,
        "city": city,
        "source_id": item.source_id,
        "source_version": item.version,
        "source_year": item.source_year if item.source_year is not None else "static",
        "synthetic": str(item.synthetic).lower(),
        "resolution_m": modality.chip.resolution_m,
        "resampling": "rasterized" if modality.rasterize else modality.chip.resampling.value,
    }


def _result_row(
    tile_id: str, scale: str, field: str, value: float, fraction: float, reason: str | None
) -> dict[str, object]:
    """One per-tile result; the value is kept only when the tile is available."""
    return {
        "tile_id": tile_id,
        "scale": scale,
        "field": field,
        "value": value if reason is None else math.nan,
        "valid_fraction": fraction,
        "reason": reason,
    }


def _summary_rows(
    modality: ModalitySpec,
    summaries: Sequence[tuple[Tile, TilePixelSummary]],
    categorical: bool,
) -> list[dict]:
    rows = []
    for tile, summary in summaries:
        fraction = summary.valid_pixels / summary.total_pixels
        ok = _meets(fraction, modality.validity.min_valid_fraction)
        reason = None
        if not ok:
            reason = "no_valid_pixels" if summary.valid_pixels == 0 else "insufficient_valid_pixels"
        for i, f in enumerate(modality.fields):
            if categorical:
                value = float(summary.mode_class) if summary.mode_class is not None else math.nan
            else:
                value = summary.band_means[i] * f.scale + f.offset
            rows.append(_result_row(tile.tile_id, tile.scale, f.name, value, fraction, reason))
    return rows


def _reason(covered: float, fraction: float, threshold: float, value: float, positive: bool):
    if covered <= 0:
        return "outside_source_coverage"
    if not _meets(fraction, threshold):
        return "insufficient_valid_support"
    if not np.isfinite(value):
        return "no_valid_support"
    if positive and not value > 0:
        return "non_positive_value"
    return None


def _numeric_results(
    modality: ModalitySpec,
    city: str,
    item: SourceItem,
    fields: Sequence[FieldSpec],
    release: Release,
) -> pd.DataFrame:
    """Exact area-weighted aggregation of each file (role) onto both tile grids.

    Fields in different files are aggregated with their own validity masks, so one field's gaps
    never remove another's values (e.g. weather variables, or AQ's two products).
    """
    rows: list[dict] = []
    threshold = modality.validity.min_valid_fraction
    by_role: dict[str, list[FieldSpec]] = {}
    for f in fields:
        by_role.setdefault(f.role_for(item.product), []).append(f)
    for role, role_fields in by_role.items():
        bands = [f.band for f in role_fields]
        with open_masked_source(item, modality, bands, role=role) as source:
            for scale in SCALES:
                grid = city_grid(city, scale)
                stats = aggregate_tiles(source, grid, cache_dir=release.cache_dir / "coverage")
                nominal_km2 = grid.tile_size**2 / 1e6
                for t_index, tile_id in enumerate(grid.tile_ids()):
                    fraction = float(stats.valid_fraction[t_index])
                    covered = float(stats.covered_fraction[t_index])
                    for b, f in enumerate(role_fields):
                        if modality.aggregation == Aggregation.SUM_PER_NOMINAL_AREA:
                            value = float(stats.total[b, t_index]) * f.scale / nominal_km2
                        elif modality.aggregation == Aggregation.AREA_MEAN:
                            value = float(stats.mean[b, t_index]) * f.scale + f.offset
                        else:
                            raise NotImplementedError(
                                f"{modality.code}: {modality.aggregation} does not apply to rasters"
                            )
                        reason = _reason(
                            covered, fraction, threshold, value, modality.validity.positive
                        )
                        rows.append(_result_row(tile_id, scale, f.name, value, fraction, reason))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _point_density_results(
    modality: ModalitySpec, city: str, item: SourceItem, fields: Sequence[FieldSpec]
) -> pd.DataFrame:
    """log(1 + points/km²) per tile; a tile without points has no trace data (unavailable)."""
    grids = {scale: city_grid(city, scale) for scale in SCALES}
    counts = {scale: np.zeros(grid.n_tiles, dtype=np.int64) for scale, grid in grids.items()}
    expected_crs = load_products()[item.product].expected_crs(city)
    for x, y in iter_points(item.files["data"], get_city(city).epsg, expected_crs):
        for scale, grid in grids.items():
            counts[scale] += point_counts(grid, x, y)
    rows: list[dict] = []
    for scale, grid in grids.items():
        density = counts[scale] / (grid.tile_size**2 / 1e6)
        for t_index, tile_id in enumerate(grid.tile_ids()):
            value = float(np.log1p(density[t_index]))
            reason = None if counts[scale][t_index] > 0 else "no_trace_data"
            for f in fields:
                rows.append(_result_row(tile_id, scale, f.name, value, math.nan, reason))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _record_sum_results(
    modality: ModalitySpec, city: str, item: SourceItem, fields: Sequence[FieldSpec]
) -> pd.DataFrame:
    """Sum of record values inside the reported coverage ÷ nominal tile area; never scaled up.

    The valid support of a tile is the share of its area inside the coverage polygon (e.g. a
    city limit): outside it the tile is unavailable, not zero.
    """
    epsg = get_city(city).epsg
    if "coverage" not in item.files:
        raise SourceReadError(f"{item.product} item for {city} has no 'coverage' file")
    coverage = load_coverage(item.files["coverage"], epsg)
    threshold = modality.validity.min_valid_fraction
    rows: list[dict] = []
    for f in fields:
        lon, lat, values, _unusable = load_records(
            item.files["data"], f.column or "value", item.source_year
        )
        x, y = Transformer.from_crs(4326, epsg, always_xy=True).transform(lon, lat)
        inside = shapely.contains_xy(coverage, x, y)
        for scale in SCALES:
            grid = city_grid(city, scale)
            fractions = coverage_fractions(grid, coverage)
            index = tile_index(grid, np.asarray(x)[inside], np.asarray(y)[inside])
            keep = index >= 0
            sums = np.bincount(index[keep], weights=values[inside][keep], minlength=grid.n_tiles)
            nominal_km2 = grid.tile_size**2 / 1e6
            for t_index, tile_id in enumerate(grid.tile_ids()):
                fraction = float(fractions[t_index])
                value = float(sums[t_index]) * f.scale / nominal_km2
                reason = _reason(fraction, fraction, threshold, value, modality.validity.positive)
                rows.append(_result_row(tile_id, scale, f.name, value, fraction, reason))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _apply_conversions(
    frame: pd.DataFrame,
    fields: Sequence[FieldSpec],
    city: str,
    source_year: int | None,
    aux: dict[str, SourceItem],
) -> pd.DataFrame:
    """Convert money to 2017 PPP international dollars (keeping the local field as is)."""
    for f in fields:
        if f.conversion != Conversion.PPP_2017:
            continue
        factor = None
        if source_year is not None and "worldbank_indicators" in aux:
            factor = ppp_2017_factor(aux["worldbank_indicators"], get_city(city).iso3, source_year)
        rows = frame["field"] == f.name
        if factor is None:
            frame.loc[rows & frame["reason"].isna(), "reason"] = "conversion_factor_missing"
            frame.loc[rows, "value"] = math.nan
        else:
            frame.loc[rows, "value"] = frame.loc[rows, "value"] * factor
    return frame


def _compute(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    item: SourceItem,
    fields: Sequence[FieldSpec],
    aux: dict[str, SourceItem],
    release: Release,
    progress: ProgressFn | None,
) -> pd.DataFrame:
    fmt = load_products()[item.product].format if item.product in load_products() else "raster"
    if modality.is_image:
        if modality.rasterize is not None:
            frame = _vector_image_results(modality, catalogue, city, item, release, progress)
        else:
            frame = _image_results(modality, catalogue, city, item, release, progress)
    elif modality.aggregation == Aggregation.LOG1P_POINT_DENSITY:
        frame = _point_density_results(modality, city, item, fields)
    elif fmt == "records":
        frame = _record_sum_results(modality, city, item, fields)
    else:
        frame = _numeric_results(modality, city, item, fields, release)
    return _apply_conversions(frame, fields, city, item.source_year, aux)


def tile_results(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    item: SourceItem,
    fields: Sequence[FieldSpec],
    release: Release,
    aux: dict[str, SourceItem] | None = None,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Per-tile results of one field group for one source year; cached until sources change."""
    aux = aux or {}
    label = _label(item.source_year)
    cached = release.derived_file(modality.code, city, f"{item.product}-{label}")
    signature = "||".join(item_signature(i) for i in (item, *aux.values()))
    chips_ok = not modality.is_image or release.chip_store(modality.code, city, label).exists()
    if cached.exists() and chips_ok:
        meta = pq.read_schema(cached).metadata or {}
        if meta.get(b"citycube:signature", b"").decode() == signature:
            return pq.read_table(cached).to_pandas()
    frame = _compute(modality, catalogue, city, item, fields, aux, release, progress)
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


def _missing_results(fields: Sequence[FieldSpec], city: str, reason: str) -> pd.DataFrame:
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
        for f in fields
    ]
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


@dataclass(frozen=True)
class Provenance:
    """Who served one field group of a partition, and how its year was resolved."""

    resolution: Resolution
    source_id: str
    source_version: str
    synthetic: bool


def observation_table(
    modality: ModalitySpec,
    city: str,
    year: int,
    provenance: Provenance,
    results: pd.DataFrame,
) -> pa.Table:
    """Rows for one calendar year: values only where available, NULL plus a reason elsewhere."""
    units = {f.name: f.unit for f in modality.fields}
    available = results["reason"].isna().to_numpy()
    value = results["value"].to_numpy(dtype=float)
    fraction = results["valid_fraction"].to_numpy(dtype=float)
    n = len(results)
    resolution = provenance.resolution
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
        "source_id": [provenance.source_id] * n,
        "source_version": [provenance.source_version] * n,
        "synthetic": [provenance.synthetic] * n,
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


def _fetch_aux(
    modality: ModalitySpec, city: str, backend: SourceBackend, release: Release
) -> dict[str, SourceItem]:
    aux: dict[str, SourceItem] = {}
    for product in modality.auxiliary_products:
        try:
            aux[product] = backend.fetch(product, city, None, release.sources_dir)
        except SourceUnavailableError:
            continue  # conversions that need it mark their fields unavailable
    return aux


def process_partition(
    modality: ModalitySpec,
    catalogue: Catalogue,
    city: str,
    year: int,
    backend: SourceBackend,
    release: Release,
    progress: ProgressFn | None = None,
) -> PartitionSummary:
    """Build and write one (modality, city, year) partition of the cube.

    Field groups served by different products (AQ's NO2 and PM2.5) are resolved, fetched and
    aggregated independently: one product's missing year never blanks or fills the other.
    """
    bound_process_memory()
    tables: list[pa.Table] = []
    frames: list[pd.DataFrame] = []
    image_resolution: Resolution | None = None
    aux = _fetch_aux(modality, city, backend, release)
    sample = backend.name == "sample"
    for product, fields in modality.field_groups(city):
        resolution = resolve(modality.temporal, year, backend.source_years(product, city))
        provenance = Provenance(resolution, f"{backend.name}:{product}", "n/a", sample)
        if not resolution.available:
            results = _missing_results(fields, city, resolution.missing_reason or "unavailable")
        else:
            try:
                item = backend.fetch(product, city, resolution.source_year, release.sources_dir)
            except SourceUnavailableError as exc:
                resolution = Resolution(year, None, resolution.basis, exc.reason)
                provenance = Provenance(resolution, provenance.source_id, "n/a", sample)
                results = _missing_results(fields, city, exc.reason)
            else:
                results = tile_results(
                    modality, catalogue, city, item, fields, release, aux, progress
                )
                provenance = Provenance(resolution, item.source_id, item.version, item.synthetic)
                if modality.is_image:
                    image_resolution = resolution
        tables.append(observation_table(modality, city, year, provenance, results))
        frames.append(results)
    table = pa.concat_tables(tables)
    results = pd.concat(frames, ignore_index=True)
    synthetic = bool(pc.all(table["synthetic"]).as_py()) if table.num_rows else sample
    meta = file_metadata(release, **{"citycube:synthetic": str(synthetic).lower()})
    if modality.is_image and image_resolution is not None:
        write_parquet_atomic(
            chip_index_table(modality, city, year, image_resolution, results, release),
            release.chip_index_file(city, year, modality.code),
            meta,
        )
    else:
        release.chip_index_file(city, year, modality.code).unlink(missing_ok=True)
    path = write_parquet_atomic(table, release.observations_file(city, year, modality.code), meta)
    per_tile = (
        results.assign(ok=results["reason"].isna())
        .groupby("tile_id")
        .agg(ok=("ok", "any"), reason=("reason", "first"))
    )
    reasons = results.drop_duplicates(["tile_id", "reason"])["reason"].dropna().value_counts()
    first = tables[0]
    basis = first["temporal_basis"][0].as_py()
    source_year = first["source_year"][0].as_py()
    return PartitionSummary(
        modality=modality.code,
        city=city,
        year=year,
        rows=table.num_rows,
        tiles=len(per_tile),
        available_tiles=int(per_tile["ok"].sum()),
        basis=basis,
        source_year=source_year,
        reason_counts={str(k): int(v) for k, v in reasons.items()},
        path=path,
    )
