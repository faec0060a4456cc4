"""Normalised city records (items in the records form): placed on both grids by the rule of
their spatial form."""

from __future__ import annotations

import logging

import pandas as pd

from citycube.catalogue.cities import SCALES, get_city
from citycube.catalogue.modalities import Aggregation
from citycube.grid.tiles import city_grid
from citycube.processing.records import place_records, tile_cell_medians, tile_values
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    RuleInput,
    cell_sizes,
    result_row,
    unavailable_reason,
)

log = logging.getLogger(__name__)


def tile_results(job: RuleInput) -> pd.DataFrame:
    """Normalised city records onto both grids by the rule of their spatial form.

    Sums (``sum_per_nominal_area``) are divided by the nominal tile area; means
    (``area_mean``) are weighted by record or by intersected area; a field with the median of
    cell medians takes it (``citycube.processing.records.tile_cell_medians``) with the form's
    support. The ingest counts (unusable rows, unmatched postcodes or units) travel in the frame's
    ``attrs``.
    """
    modality, city, item, fields = job.modality, job.city, job.item, job.fields
    if modality.aggregation not in (Aggregation.SUM_PER_NOMINAL_AREA, Aggregation.AREA_MEAN):
        raise NotImplementedError(f"{modality.code}: {modality.aggregation} is not a record rule")
    total = modality.aggregation == Aggregation.SUM_PER_NOMINAL_AREA
    placed = place_records(item, get_city(city).epsg, item.source_year)
    threshold = modality.validity.min_valid_fraction
    rows: list[dict] = []
    for scale in SCALES:
        grid = city_grid(city, scale)
        tiles = tile_values(placed, grid, total=total)
        medians = {cell_m: tile_cell_medians(placed, grid, cell_m) for cell_m in cell_sizes(fields)}
        for t_index, tile_id in enumerate(grid.tile_ids()):
            support = float(tiles.support[t_index])
            for f in fields:
                if f.aggregation is not None:
                    median = medians[f.aggregation.cell_m][t_index]
                    value = float(median) * f.scale + f.offset
                else:
                    value = float(tiles.value[t_index]) * f.scale + (0.0 if total else f.offset)
                reason = unavailable_reason(
                    float(tiles.covered[t_index]),
                    support,
                    threshold,
                    value,
                    modality.validity.non_negative,
                )
                rows.append(result_row(tile_id, scale, f.name, value, support, reason))
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    if placed.ingest is not None:
        frame.attrs["records"] = placed.ingest.as_dict()
        if placed.ingest.unmatched:
            log.warning(
                "%s %s %s: %d records have a key the declared table lacks (e.g. %s); left out",
                item.product,
                city,
                item.source_year,
                placed.ingest.unmatched,
                ", ".join(placed.ingest.unmatched_examples),
            )
    return frame
