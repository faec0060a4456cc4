"""Point densities (``log1p_point_density``): log(1 + points/km²) per tile."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from citycube.catalogue.cities import SCALES, get_city
from citycube.catalogue.products import load_products
from citycube.grid.tiles import city_grid
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    RuleInput,
    result_row,
)
from citycube.processing.vectors import iter_points, point_counts


def tile_results(job: RuleInput) -> pd.DataFrame:
    """log(1 + points/km²) per tile; a tile without points has no trace data (unavailable)."""
    city, item, fields = job.city, job.item, job.fields
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
                rows.append(result_row(tile_id, scale, f.name, value, math.nan, reason))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)
