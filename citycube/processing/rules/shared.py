"""What several aggregation rules share: the per-tile result rows and their reasons, the
tiles of a city in table order, and the block-by-block tile summaries of the image rules."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import Catalogue, FieldSpec, ModalitySpec
from citycube.cube.release import Release
from citycube.errors import SourceReadError
from citycube.grid.tiles import PixelGrid, Tile, city_grid, pixel_grid
from citycube.items.protocol import SourceItem
from citycube.items.staging import repair_hint
from citycube.processing.chips import TilePixelSummary, blocks, row_bands, tile_pixel_summaries

__all__ = [
    "RESULT_COLUMNS",
    "BlockObserver",
    "BlockSummaries",
    "ProgressFn",
    "RuleInput",
    "all_tiles",
    "cell_sizes",
    "chip_attrs",
    "meets",
    "require_valid_pixels",
    "result_row",
    "source_label",
    "summary_rows",
    "tile_windows",
    "unavailable_reason",
]

ProgressFn = Callable[[str], None]
BlockObserver = Callable[[int, int, np.ndarray, np.ndarray], None]
"""Told of every chip block written: (row_start, col_start, values as stored, valid)."""


@dataclass(frozen=True)
class RuleInput:
    """What a rule turns into tile values: one source item of a modality for one city."""

    modality: ModalitySpec
    """The modality whose fields are computed."""
    catalogue: Catalogue
    """The catalogue the modality belongs to (legends, other modalities)."""
    city: str
    """The city whose tile grids receive the values."""
    item: SourceItem
    """The installed source item read."""
    fields: Sequence[FieldSpec]
    """The item's fields (a product's field group)."""
    release: Release
    """Where image rules write their chips."""
    progress: ProgressFn | None = None
    """Told of progress on long work (image rules)."""
    on_written: Sequence[BlockObserver] = ()
    """Told of every chip block written (image rules)."""


RESULT_COLUMNS = ["tile_id", "scale", "field", "value", "valid_fraction", "reason", "classes"]
"""Per-tile results; ``classes`` counts the distinct valid ids of a categorical chip (stored for
categorical modalities only)."""


def meets(valid_fraction: float, threshold: float) -> bool:
    """Threshold test that treats an exact limit as met despite float rounding."""
    return valid_fraction >= threshold - 1e-9


def source_label(source_year: int | None) -> str:
    """An item's label in chip store names: its source year, or 'static'."""
    return "static" if source_year is None else str(source_year)


@cache
def all_tiles(city: str) -> tuple[Tile, ...]:
    """Every tile of both grids, in the order of every per-city table (built once per city)."""
    return tuple(t for scale in SCALES for t in city_grid(city, scale).tiles())


@cache
def tile_windows(city: str, resolution_m: float) -> np.ndarray:
    """(tiles, 4) pixel windows (row, col, height, width) of ``all_tiles`` at a resolution."""
    grid = pixel_grid(city, resolution_m)
    windows = np.array([grid.window(t) for t in all_tiles(city)], dtype=np.int32)
    windows.setflags(write=False)
    return windows.reshape(-1, 4)


def require_valid_pixels(valid: float, city: str, href: str) -> None:
    """Refuse a raster without a single valid pixel over the whole city.

    All NaN, all nodata or a file of another place: such a file is broken or mislabelled, and
    taken as it is it would only look like a gap in the source (every tile unavailable).
    """
    if valid > 0:
        return
    raise SourceReadError(
        f"{href} has no valid pixel over {city}: every cell under the city is nodata, NaN or "
        "outside the file, so the file is empty, wrongly masked or of another place; "
        f"{repair_hint(href)}",
        reason="no_valid_pixels_in_source",
    )


class BlockSummaries:
    """Tile summaries gathered block by block, handed back in the order rows have always had.

    That order is by 10 km row band, then by tile (2 km row-major, then 5 km), so a partition
    writes the same rows in the same order however the work is cut into blocks. Every tile
    must lie inside exactly one block; a tile that straddled blocks would otherwise vanish.
    """

    def __init__(self, grid: PixelGrid) -> None:
        self.grid = grid
        self.blocks, self._tiles_in, self._order = _block_plan(grid)
        self._tiles = {tile.tile_id: tile for tile in all_tiles(grid.city)}
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


@cache
def _block_plan(
    grid: PixelGrid,
) -> tuple[list[tuple[int, int, int, int]], dict[tuple[int, int], list[Tile]], dict[str, tuple]]:
    """The grid's blocks, the tiles each block holds, and every tile's (row band, index) order.

    Worked out once per pixel grid: every partition of the city's modalities at that
    resolution cuts the same blocks.
    """
    tiles = all_tiles(grid.city)
    grid_blocks = blocks(grid)
    bands = row_bands(grid)
    tiles_in: dict[tuple[int, int], list[Tile]] = {}
    order: dict[str, tuple[int, int]] = {}
    for index, (tile, window) in enumerate(
        zip(tiles, tile_windows(grid.city, grid.resolution).tolist(), strict=True)
    ):
        row_off, col_off, height, width = window
        holder = next(
            (
                (row_start, col_start)
                for row_start, row_stop, col_start, col_stop in grid_blocks
                if row_start <= row_off
                and row_off + height <= row_stop
                and col_start <= col_off
                and col_off + width <= col_stop
            ),
            None,
        )
        if holder is None:
            raise ValueError(f"{tile.tile_id} does not lie inside one block of its pixel grid")
        tiles_in.setdefault(holder, []).append(tile)
        band = next(i for i, (start, stop) in enumerate(bands) if start <= row_off < stop)
        order[tile.tile_id] = (band, index)
    return grid_blocks, tiles_in, order


def chip_attrs(
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


def result_row(
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


def summary_rows(
    modality: ModalitySpec,
    summaries: Sequence[tuple[Tile, TilePixelSummary]],
    categorical: bool,
    invalid_means_uncovered: bool = False,
) -> list[dict]:
    """One row per tile and field; a tile under the valid-pixel threshold is unavailable.

    ``invalid_means_uncovered``: the only invalid pixels are those outside the source's
    coverage (a vector item with a coverage file), so such a tile lies outside what the
    source reports on (``outside_source_coverage``) rather than holding bad pixels.
    """
    rows = []
    for tile, summary in summaries:
        fraction = summary.valid_pixels / summary.total_pixels
        ok = meets(fraction, modality.validity.min_valid_fraction)
        reason = None
        if not ok and invalid_means_uncovered:
            reason = "outside_source_coverage"
        elif not ok:
            reason = "no_valid_pixels" if summary.valid_pixels == 0 else "insufficient_valid_pixels"
        for i, f in enumerate(modality.fields):
            if categorical:
                value = float(summary.mode_class) if summary.mode_class is not None else math.nan
            else:
                value = summary.band_means[i] * f.scale + f.offset
            row = result_row(tile.tile_id, tile.scale, f.name, value, fraction, reason)
            if categorical and summary.class_counts is not None:
                row["classes"] = len(summary.class_counts)  # single-class chips: diversity
            rows.append(row)
    return rows


def unavailable_reason(
    covered: float, fraction: float, threshold: float, value: float, non_negative: bool
):
    if covered <= 0:
        return "outside_source_coverage"
    if not meets(fraction, threshold):
        return "insufficient_valid_support"
    if not np.isfinite(value):
        return "no_valid_support"
    if non_negative and value < 0:  # zero stays available; positivity is a pairing rule
        return "negative_value"
    return None


def cell_sizes(fields: Sequence[FieldSpec]) -> list[int]:
    """The distinct cell sizes of the fields that take the median of cell medians."""
    return sorted({f.aggregation.cell_m for f in fields if f.aggregation is not None})
