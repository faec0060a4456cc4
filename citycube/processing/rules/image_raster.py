"""Raster images (``is_image``, no ``rasterize``): each source warped once onto the city's pixel
grid, block by block, written as chips, and summarised per tile (band means, or the dominant
class of a categorical image)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from citycube.catalogue.modalities import Kind
from citycube.cube.chips import chip_writer
from citycube.grid.tiles import PixelGrid, pixel_grid
from citycube.items.readers import open_masked_source
from citycube.processing.chips import block_memory, warp_block
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    BlockSummaries,
    RuleInput,
    chip_attrs,
    require_valid_pixels,
    source_label,
    summary_rows,
)


def tile_results(job: RuleInput) -> pd.DataFrame:
    """Warp once onto the city's pixel grid, block by block; write chips; summarise tiles."""
    modality, catalogue, city, item, release, progress, on_written = (
        job.modality,
        job.catalogue,
        job.city,
        job.item,
        job.release,
        job.progress,
        job.on_written,
    )
    assert modality.chip is not None
    grid: PixelGrid = pixel_grid(city, modality.chip.resolution_m)
    categorical = modality.kind == Kind.CATEGORICAL_IMAGE
    valid_ids = catalogue.valid_ids(modality)
    bands = [f.band for f in modality.fields]
    dtype = np.dtype(modality.chip.dtype)
    fill = 255 if categorical else (0 if np.issubdtype(dtype, np.integer) else np.nan)
    store = release.chip_store(modality.code, city, source_label(item.source_year))
    attrs = chip_attrs(modality, city, item, release)
    summaries = BlockSummaries(grid)
    with (
        block_memory() as release_block,
        open_masked_source(item, modality, bands, valid_ids) as source,
        chip_writer(store, grid, [f.name for f in modality.fields], dtype, fill, attrs) as w,
    ):
        w.on_written.extend(on_written)
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
        ordered = summaries.ordered()
        # Inside the writer: a refused item leaves the chips of the last good run in place.
        require_valid_pixels(sum(s.valid_pixels for _, s in ordered), city, item.href("data"))
    return pd.DataFrame(summary_rows(modality, ordered, categorical), columns=RESULT_COLUMNS)


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
