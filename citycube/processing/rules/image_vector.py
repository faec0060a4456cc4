"""Vector images (``is_image`` with ``rasterize``): vector features drawn straight onto the
chip grid, block by block, written as chips, and summarised per tile like raster images."""

from __future__ import annotations

import numpy as np
import pandas as pd

from citycube.catalogue.cities import get_city
from citycube.catalogue.modalities import Kind
from citycube.catalogue.products import load_products
from citycube.cube.chips import chip_writer
from citycube.grid.tiles import pixel_grid
from citycube.processing.chips import block_memory
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    BlockSummaries,
    RuleInput,
    chip_attrs,
    source_label,
    summary_rows,
)
from citycube.processing.vectors import open_vector_layer, rasterize_block


def tile_results(job: RuleInput) -> pd.DataFrame:
    """Draw vector features straight onto the chip grid (no buffering), write chips, summarise."""
    modality, city, item, release, progress, on_written = (
        job.modality,
        job.city,
        job.item,
        job.release,
        job.progress,
        job.on_written,
    )
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
    store = release.chip_store(modality.code, city, source_label(item.source_year))
    attrs = chip_attrs(modality, city, item, release)
    fill = 255 if categorical else 0
    summaries = BlockSummaries(grid)
    with (
        block_memory() as release_block,
        chip_writer(store, grid, [f.name for f in modality.fields], dtype, fill, attrs) as w,
    ):
        w.on_written.extend(on_written)
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
        summary_rows(
            modality,
            summaries.ordered(),
            categorical,
            invalid_means_uncovered=layer.coverage is not None,
        ),
        columns=RESULT_COLUMNS,
    )
