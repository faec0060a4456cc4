"""Numeric rasters: the exact area-weighted mean (``area_mean``) or total per nominal tile
area (``sum_per_nominal_area``) of each file, or a field's median of cell medians."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from citycube.catalogue.cities import SCALES
from citycube.catalogue.modalities import Aggregation, FieldSpec
from citycube.grid.tiles import city_grid
from citycube.items.readers import open_masked_source
from citycube.processing.aggregate import aggregate_tiles, cell_median_tiles
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    RuleInput,
    all_tiles,
    cell_sizes,
    require_valid_pixels,
    result_row,
    unavailable_reason,
)


def tile_results(job: RuleInput) -> pd.DataFrame:
    """Exact area-weighted aggregation of each file (role) onto both tile grids.

    Fields in different files are aggregated with their own validity masks, so one field's gaps
    never remove another's values (e.g. weather variables, or AQ's two products). A field with
    its own rule (the median of cell medians) takes its value from that rule and its valid
    support, and so its availability and reason, from the same area-weighted pass.
    """
    modality, city, item, fields, release = (
        job.modality,
        job.city,
        job.item,
        job.fields,
        job.release,
    )
    rows: list[dict] = []
    threshold = modality.validity.min_valid_fraction
    by_role: dict[str, list[FieldSpec]] = {}
    for f in fields:
        by_role.setdefault(f.role_for(item.product), []).append(f)
    for role, role_fields in by_role.items():
        if role not in item.files and role in item.missing_roles:
            rows += _unpublished_rows(role_fields, city, item.missing_roles[role])
            continue
        bands = [f.band for f in role_fields]
        names = [f.name for f in role_fields]
        with open_masked_source(item, modality, bands, role=role, names=names) as source:
            valid_support = 0.0
            for scale in SCALES:
                grid = city_grid(city, scale)
                stats = aggregate_tiles(source, grid, cache_dir=release.cache_dir / "coverage")
                valid_support += float(np.nansum(stats.valid_fraction))
                medians = {
                    cell_m: cell_median_tiles(source, grid, cell_m)
                    for cell_m in cell_sizes(role_fields)
                }
                nominal_km2 = grid.tile_size**2 / 1e6
                for t_index, tile_id in enumerate(grid.tile_ids()):
                    fraction = float(stats.valid_fraction[t_index])
                    covered = float(stats.covered_fraction[t_index])
                    for b, f in enumerate(role_fields):
                        if f.aggregation is not None:
                            median = medians[f.aggregation.cell_m][b, t_index]
                            value = float(median) * f.scale + f.offset
                        elif modality.aggregation == Aggregation.SUM_PER_NOMINAL_AREA:
                            value = float(stats.total[b, t_index]) * f.scale / nominal_km2
                        elif modality.aggregation == Aggregation.AREA_MEAN:
                            value = float(stats.mean[b, t_index]) * f.scale + f.offset
                        else:
                            raise NotImplementedError(
                                f"{modality.code}: {modality.aggregation} does not apply to rasters"
                            )
                        reason = unavailable_reason(
                            covered, fraction, threshold, value, modality.validity.non_negative
                        )
                        rows.append(result_row(tile_id, scale, f.name, value, fraction, reason))
            require_valid_pixels(valid_support, city, item.href(role))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _unpublished_rows(fields: Sequence[FieldSpec], city: str, reason: str) -> list[dict]:
    """Rows of fields whose role the item does not publish: NULL with the item's reason."""
    return [
        result_row(t.tile_id, t.scale, f.name, math.nan, math.nan, reason)
        for t in all_tiles(city)
        for f in fields
    ]
