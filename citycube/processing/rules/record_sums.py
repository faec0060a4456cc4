"""Point records of a product in the ``records`` format: their values summed inside the
reported coverage per nominal tile area, or a field's median of cell medians."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import shapely
from pyproj import Transformer

from citycube.catalogue.cities import SCALES, get_city
from citycube.catalogue.products import load_products
from citycube.errors import SourceReadError
from citycube.grid.cells import CellLattice, median_of_cell_medians
from citycube.grid.tiles import city_grid
from citycube.processing.record_checks import check_inside, csv_line, require_declared_count
from citycube.processing.rules.shared import (
    RESULT_COLUMNS,
    RuleInput,
    result_row,
    unavailable_reason,
)
from citycube.processing.vectors import (
    check_declared_counts,
    coverage_fractions,
    load_coverage,
    load_records,
    tile_index,
)


def tile_results(job: RuleInput) -> pd.DataFrame:
    """Sum of record values inside the reported coverage ÷ nominal tile area; never scaled up.

    The valid support of a tile is the share of its area inside the coverage polygon (e.g. a
    city limit): outside it the tile is unavailable, not zero. A field with the median of cell
    medians takes it over the same records (each at its point), with the same support.
    """
    modality, city, item, fields = job.modality, job.city, job.item, job.fields
    epsg = get_city(city).epsg
    if "coverage" not in item.files:
        raise SourceReadError(f"{item.product} item for {city} has no 'coverage' file")
    coverage = load_coverage(item.files["coverage"], epsg)
    threshold = modality.validity.min_valid_fraction
    rows: list[dict] = []
    product = load_products().get(item.product)
    checks = product.records if product is not None else None
    path = Path(item.files["data"])
    for f in fields:
        require_declared_count(item.extra, path)
        records = load_records(path, f.column or "value", item.source_year, checks)
        check_declared_counts(records, item.extra, path)
        values = records.values
        x, y = Transformer.from_crs(4326, epsg, always_xy=True).transform(records.lon, records.lat)
        inside = shapely.contains_xy(coverage, x, y)
        where = f"{city}'s reporting area ({Path(item.files['coverage']).name})"
        check_inside(inside, records.positions, where, path, csv_line, (records.lon, records.lat))
        for scale in SCALES:
            grid = city_grid(city, scale)
            fractions = coverage_fractions(grid, coverage)
            index = tile_index(grid, np.asarray(x)[inside], np.asarray(y)[inside])
            keep = index >= 0
            sums = np.bincount(index[keep], weights=values[inside][keep], minlength=grid.n_tiles)
            if f.aggregation is not None:
                lattice = CellLattice(grid, f.aggregation.cell_m)
                cells = lattice.cell_index(np.asarray(x)[inside], np.asarray(y)[inside])
                tiles, medians = median_of_cell_medians(lattice, cells, values[inside])
                cell_values = np.full(grid.n_tiles, np.nan)
                cell_values[tiles] = medians
            nominal_km2 = grid.tile_size**2 / 1e6
            for t_index, tile_id in enumerate(grid.tile_ids()):
                fraction = float(fractions[t_index])
                if f.aggregation is not None:
                    value = float(cell_values[t_index]) * f.scale + f.offset
                else:
                    value = float(sums[t_index]) * f.scale / nominal_km2
                reason = unavailable_reason(
                    fraction, fraction, threshold, value, modality.validity.non_negative
                )
                rows.append(result_row(tile_id, scale, f.name, value, fraction, reason))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)
