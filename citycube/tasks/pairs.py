"""Translation pair index: which directed source → target routes each (city, scale, tile, year)
offers among the 18 modalities (AgenticCity-Bench §2 and Table 14).

A key offers a modality when every pairing field of it is available with a finite value (any
one for AQ, whose two products are independent), and positive where the modality's pairing
rule says so (PROP, GPS, ELEC). Routes are then every
ordered pair of distinct offered modalities: 18 × 17 = 306 at most. Instead of one row per
route (tens of millions for the whole calendar), the index stores one row per key with a bit
mask of its offered modalities; routes and their counts follow from the masks.

AgenticCity-Bench's Table 14 counts in another unit: a route once per source product at each
end (OPT once per sensor, AQ once per product), so its counts can exceed the number of keys.
The index also records, per offered modality, how many of its source products pass
(``products``), and :func:`route_counts_by_product` counts the paper's way from it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from citycube.catalogue.modalities import Catalogue

if TYPE_CHECKING:
    import duckdb

TABLE_ORDER: tuple[str, ...] = (
    "OPT", "DEM", "NDVI", "HF", "BV", "LC", "LU", "POI", "RD",
    "HEAT", "WTH", "AQ", "CO2", "POP", "PROP", "ELEC", "NTL", "GPS",
)  # fmt: skip
"""Modality order of AgenticCity-Bench Table 14 (rows and columns); bit i of a mask is
modality i."""

PAIR_INDEX_SCHEMA = pa.schema(
    [
        pa.field("city", pa.string(), nullable=False),
        pa.field("scale", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("year", pa.int16(), nullable=False),
        pa.field("modality_mask", pa.int32(), nullable=False),
        pa.field("modalities", pa.list_(pa.string()), nullable=False),
        pa.field("n_routes", pa.int16(), nullable=False),
        pa.field("products", pa.list_(pa.int8()), nullable=False),
    ]
)
"""One row per key offering at least one route: the offered modalities as a mask and a list,
and for each of them the number of its source products that pass its pairing rule (2 for AQ
where NO2 and PM2.5 both do, else 1)."""


def modality_order(catalogue: Catalogue) -> list[str]:
    """Table 14's order, restricted to (and then extended by) the catalogue's modalities."""
    codes = [m.code for m in catalogue.modalities]
    return [c for c in TABLE_ORDER if c in codes] + [c for c in codes if c not in TABLE_ORDER]


def pairing_rules(catalogue: Catalogue, order: Sequence[str] | None = None) -> pa.Table:
    """(modality, field, field_bit, positive, product) for every pairing field, as a small table.

    Each pairing field gets its own bit (27 fields in all), so a key's passing fields fold into
    one integer and a modality is offered when all of its fields' bits are set.
    """
    order = list(order or modality_order(catalogue))
    rows = []
    for code in order:
        spec = catalogue.get(code)
        fields = {f.name: f for f in spec.fields}
        for name in spec.pairing_fields:
            rows.append(
                {
                    "modality": code,
                    "field": name,
                    "field_bit": 1 << len(rows),
                    "positive": spec.pairing.positive,
                    "product": spec.product_for(fields[name]),
                }
            )
    if len(rows) > 63:
        raise ValueError(f"{len(rows)} pairing fields do not fit one 64-bit mask")
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("modality", pa.string()),
                ("field", pa.string()),
                ("field_bit", pa.int64()),
                ("positive", pa.bool_()),
                ("product", pa.string()),
            ]
        ),
    )


def modality_masks(
    field_masks: np.ndarray,
    rules: pa.Table,
    order: Sequence[str],
    any_of: Collection[str] | None = None,
) -> np.ndarray:
    """Modality bit masks (bit i: ``order[i]`` offered) from masks of passing pairing fields.

    A modality is offered when all its pairing fields pass, or any one for those in ``any_of``.
    """
    field_masks = np.asarray(field_masks, dtype=np.int64)
    out = np.zeros(len(field_masks), dtype=np.int64)
    modality = np.asarray(rules["modality"].to_pylist(), dtype=object)
    bits = rules["field_bit"].to_numpy()
    for i, code in enumerate(order):
        needed = np.int64(np.bitwise_or.reduce(bits[modality == code], initial=0))
        if not needed:
            continue
        if any_of is not None and code in any_of:
            passing = (field_masks & needed) != 0
        else:
            passing = (field_masks & needed) == needed
        out |= np.where(passing, np.int64(1) << i, 0)
    return out


def product_counts(
    field_masks: np.ndarray,
    rules: pa.Table,
    order: Sequence[str],
    any_of: Collection[str] | None = None,
) -> np.ndarray:
    """(keys, modalities) number of each modality's source products that pass, 0 where the
    modality is not offered (:func:`modality_masks`'s rule, applied per product)."""
    field_masks = np.asarray(field_masks, dtype=np.int64)
    offered = mask_matrix(modality_masks(field_masks, rules, order, any_of), len(order))
    out = np.zeros((len(field_masks), len(order)), dtype=np.int64)
    modality = np.asarray(rules["modality"].to_pylist(), dtype=object)
    product = np.asarray(rules["product"].to_pylist(), dtype=object)
    bits = rules["field_bit"].to_numpy()
    for i, code in enumerate(order):
        for name in dict.fromkeys(product[modality == code].tolist()):
            needed = np.int64(np.bitwise_or.reduce(bits[(modality == code) & (product == name)]))
            if any_of is not None and code in any_of:
                out[:, i] += (field_masks & needed) != 0
            else:
                out[:, i] += (field_masks & needed) == needed
    return out * offered


def pair_index(
    con: duckdb.DuckDBPyConnection, catalogue: Catalogue, observations: str = "observations"
) -> pa.Table:
    """The pair index of every key in ``observations`` (a view, table or SQL relation name).

    One grouped pass in DuckDB, one group per (tile, year): the passing pairing fields' bits
    are OR-ed, then the modalities whose fields all pass are the key's offered modalities.
    Keys offering fewer than two modalities have no route and are left out.
    """
    order = modality_order(catalogue)
    rules = pairing_rules(catalogue, order)
    con.register("_pairing_rules", rules)
    try:
        keys = con.execute(
            f"""
            SELECT o.tile_id, o.year::SMALLINT AS year,
                   any_value(o.city) AS city, any_value(o.scale) AS scale,
                   bit_or(r.field_bit) AS field_mask
            FROM {observations} AS o
            JOIN _pairing_rules AS r ON o.modality = r.modality AND o.field = r.field
            WHERE o.available AND o.value IS NOT NULL AND isfinite(o.value)
                  AND (NOT r.positive OR o.value > 0)
            GROUP BY o.tile_id, o.year
            """
        ).to_arrow_table()
    finally:
        con.unregister("_pairing_rules")
    any_of = {c for c in order if catalogue.get(c).pairing.needs == "any"}
    masks = modality_masks(keys["field_mask"].to_numpy(), rules, order, any_of)
    units = product_counts(keys["field_mask"].to_numpy(), rules, order, any_of)
    offered = mask_matrix(masks, len(order)).astype(bool)
    n = offered.sum(axis=1)
    keep = n >= 2
    keys, offered, masks, n = keys.filter(pa.array(keep)), offered[keep], masks[keep], n[keep]
    units = units[keep]
    offsets = pa.array(np.concatenate([[0], np.cumsum(n)]).astype(np.int32))
    codes = np.asarray(order, dtype=object)[np.nonzero(offered)[1]]
    table = pa.table(
        {
            "city": keys["city"],
            "scale": keys["scale"],
            "tile_id": keys["tile_id"],
            "year": keys["year"],
            "modality_mask": pa.array(masks, pa.int32()),
            "modalities": pa.ListArray.from_arrays(offsets, pa.array(codes, pa.string())),
            "n_routes": pa.array(n * (n - 1), pa.int16()),
            "products": pa.ListArray.from_arrays(offsets, pa.array(units[offered], pa.int8())),
        }
    )
    return table.cast(PAIR_INDEX_SCHEMA).sort_by(
        [
            ("city", "ascending"),
            ("scale", "ascending"),
            ("tile_id", "ascending"),
            ("year", "ascending"),
        ]
    )


def mask_matrix(masks: np.ndarray, n_modalities: int) -> np.ndarray:
    """(keys, modalities) 0/1 matrix of which modality each mask offers."""
    bits = np.arange(n_modalities, dtype=np.int64)
    return ((np.asarray(masks, dtype=np.int64)[:, None] >> bits) & 1).astype(np.int32)


def route_counts(masks: np.ndarray, n_modalities: int) -> np.ndarray:
    """(source, target) pair counts: keys offering both, zero on the diagonal (Table 14)."""
    offered = mask_matrix(masks, n_modalities).astype(np.float64)
    counts = np.rint(offered.T @ offered).astype(np.int64)  # exact: integer sums far below 2^53
    np.fill_diagonal(counts, 0)
    return counts


def product_matrix(pairs: pa.Table, order: Sequence[str]) -> np.ndarray:
    """(keys, modalities) products per offered modality, from a pair index's ``products``."""
    offered = mask_matrix(pairs["modality_mask"].to_numpy(), len(order)).astype(bool)
    out = np.zeros(offered.shape, dtype=np.int64)
    out[offered] = pairs["products"].combine_chunks().flatten().to_numpy()
    return out


def route_counts_by_product(units: np.ndarray) -> np.ndarray:
    """(source, target) pair counts in Table 14's unit: each key adds the product of the two
    modalities' product counts (OPT per sensor, AQ per product), zero on the diagonal."""
    units = np.asarray(units, dtype=np.float64)
    counts = np.rint(units.T @ units).astype(np.int64)  # exact: integer sums far below 2^53
    np.fill_diagonal(counts, 0)
    return counts


def route_count_table(counts: np.ndarray, order: Sequence[str], catalogue: Catalogue) -> pa.Table:
    """Table 14's form: one row per source, one column per target (labels as the papers write)."""
    labels = [catalogue.get(c).display_code for c in order]
    columns: dict[str, pa.Array] = {
        "source": pa.array(labels, pa.string()),
        "source_code": pa.array(list(order), pa.string()),
    }
    for j, label in enumerate(labels):
        column = [None if i == j else int(counts[i, j]) for i in range(len(order))]
        columns[label] = pa.array(column, pa.int64())
    return pa.table(columns)


def route_count_long(
    counts: np.ndarray, order: Sequence[str], by_product: np.ndarray | None = None
) -> pa.Table:
    """(source, target, pairs) for the 306 directed routes, in Table 14's order, with
    ``pairs_by_product`` (Table 14's unit, :func:`route_counts_by_product`) when given."""
    n = len(order)
    source, target = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    off = source != target
    columns = {
        "source": pa.array(np.asarray(order)[source[off]], pa.string()),
        "target": pa.array(np.asarray(order)[target[off]], pa.string()),
        "pairs": pa.array(counts[off], pa.int64()),
    }
    if by_product is not None:
        columns["pairs_by_product"] = pa.array(by_product[off], pa.int64())
    return pa.table(columns)


def write_route_heatmap(counts: np.ndarray, labels: Sequence[str], path: Path) -> Path:
    """A source × target heatmap of pair counts (log colour scale, counts written in cells)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    from citycube.io.atomic import atomic_path

    n = len(labels)
    shown = np.where(np.eye(n, dtype=bool), np.nan, counts.astype(float))
    shown[shown == 0] = np.nan  # no pair: blank, not the lowest colour
    finite = shown[np.isfinite(shown)]
    norm = (
        LogNorm(vmin=max(1.0, finite.min()), vmax=max(2.0, finite.max())) if finite.size else None
    )
    fig, ax = plt.subplots(figsize=(11, 9.5), dpi=110)
    image = ax.imshow(shown, cmap="viridis", norm=norm)
    ax.set_xticks(range(n), labels, rotation=60, ha="right")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("target modality")
    ax.set_ylabel("source modality")
    ax.set_title("Translation pairs per directed route")
    for i in range(n):
        for j in range(n):
            if i != j:
                text = f"{int(counts[i, j]):,}" if counts[i, j] < 1e6 else f"{counts[i, j]:.2g}"
                bright = norm is not None and counts[i, j] > 0 and norm(counts[i, j]) > 0.6
                colour = "black" if bright else ("white" if counts[i, j] > 0 else "grey")
                ax.text(j, i, text, ha="center", va="center", fontsize=5.5, color=colour)
    fig.colorbar(image, ax=ax, shrink=0.8, label="pairs (log scale)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path
