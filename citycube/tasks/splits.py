"""Leakage-proof train / validation / test splits by whole 10 km parent cells (AgenticCity-Bench
App. C).

Every 2 km and 5 km tile nests in exactly one 10 km lattice cell (``parent_id``), so assigning
whole parent cells keeps every scale, year and modality of a place in one partition: a tile of
one partition never overlaps a tile of another at either scale.

The assignment depends on the grids alone, never on which city-years the cube holds, so it
stays fixed as years are added. Within each city, parent cells are visited in the order of a
seeded hash of their id and each goes to the partition furthest below its target share of the
city's tiles; every city then contributes to every partition where it has enough cells.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPLITS: tuple[str, ...] = ("train", "val", "test")
"""Partition names, in the order of their shares."""

PAPER_SPLIT_SIZES: Mapping[str, int] = {"train": 172_032, "val": 48_720, "test": 48_720}
"""Instances per partition in AgenticCity-Bench (269,472 in all): the proportions the splits
aim at."""

SPLIT_SHARES: Mapping[str, float] = {
    name: size / sum(PAPER_SPLIT_SIZES.values()) for name, size in PAPER_SPLIT_SIZES.items()
}
"""Target share of each city's tiles per partition: 63.84 % / 18.08 % / 18.08 %."""

SPLIT_SEED = 0
"""Seed of the parent-cell order. Changing it reshuffles every split; it is recorded with the
splits so a consumer can tell which assignment it holds."""

SPLIT_SCHEMA = pa.schema(
    [
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("scale", pa.string(), nullable=False),
        pa.field("parent_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)


def tile_parent_table(cities: Iterable[str] | None = None) -> pa.Table:
    """Every tile with its parent cell and UTM bounds, straight from the grids (no I/O)."""
    from citycube.catalogue.cities import SCALES, load_cities
    from citycube.grid.tiles import city_grid

    rows: dict[str, list] = {k: [] for k in ("tile_id", "city", "scale", "parent_id")}
    bounds: list[tuple[float, float, float, float]] = []
    for city in cities or load_cities():
        for scale in SCALES:
            for tile in city_grid(city, scale).tiles():
                rows["tile_id"].append(tile.tile_id)
                rows["city"].append(city)
                rows["scale"].append(scale)
                rows["parent_id"].append(tile.parent_id)
                bounds.append(tile.bounds)
    box = np.asarray(bounds, dtype=np.float64).reshape(-1, 4)
    return pa.table(
        {
            **rows,
            "utm_xmin": box[:, 0],
            "utm_ymin": box[:, 1],
            "utm_xmax": box[:, 2],
            "utm_ymax": box[:, 3],
        }
    )


def _order_key(seed: int, parent_id: str) -> bytes:
    return hashlib.sha256(f"{seed}:{parent_id}".encode()).digest()


def assign_parents(
    cities: np.ndarray,
    parent_ids: np.ndarray,
    weights: np.ndarray,
    *,
    seed: int = SPLIT_SEED,
    shares: Mapping[str, float] = SPLIT_SHARES,
) -> dict[str, str]:
    """Partition of every parent cell: per city, hash order, each to the largest shortfall.

    ``weights`` count the tiles of each parent (both scales), so the shares are shares of tiles.
    """
    names = list(shares)
    target = np.array([shares[n] for n in names], dtype=np.float64)
    out: dict[str, str] = {}
    for city in sorted(set(cities.tolist())):
        mine = np.flatnonzero(cities == city)
        order = sorted(mine, key=lambda i: _order_key(seed, str(parent_ids[i])))
        total = float(weights[mine].sum())
        assigned = np.zeros(len(names))
        for i in order:
            choice = int(np.argmax(target * total - assigned))
            assigned[choice] += float(weights[i])
            out[str(parent_ids[i])] = names[choice]
    return out


def tile_splits(
    tiles: pa.Table, *, seed: int = SPLIT_SEED, shares: Mapping[str, float] = SPLIT_SHARES
) -> pa.Table:
    """The partition of every tile of ``tiles`` (columns tile_id, city, scale, parent_id)."""
    parents = tiles.group_by(["city", "parent_id"]).aggregate([("tile_id", "count")])
    split_of = assign_parents(
        parents["city"].to_numpy(zero_copy_only=False),
        parents["parent_id"].to_numpy(zero_copy_only=False),
        parents["tile_id_count"].to_numpy(),
        seed=seed,
        shares=shares,
    )
    keys = pa.array(list(split_of), pa.string())
    values = pa.array(list(split_of.values()), pa.string())
    split = pc.take(values, pc.index_in(tiles["parent_id"], value_set=keys))
    table = pa.table(
        {
            "tile_id": tiles["tile_id"],
            "city": tiles["city"],
            "scale": tiles["scale"],
            "parent_id": tiles["parent_id"],
            "split": split,
        }
    )
    return table.cast(SPLIT_SCHEMA)


def cross_split_overlaps(tiles: pa.Table, splits: pa.Table) -> list[tuple[str, str]]:
    """Pairs of tiles in different partitions whose areas overlap (should be none).

    ``tiles`` carries UTM bounds (``utm_xmin`` … ``utm_ymax``); each city is checked all
    against all, both scales together, since the grids of a city share its UTM CRS.
    """
    joined = tiles.select(["tile_id", "city", "utm_xmin", "utm_ymin", "utm_xmax", "utm_ymax"])
    split_of = dict(zip(splits["tile_id"].to_pylist(), splits["split"].to_pylist(), strict=True))
    ids = np.asarray(joined["tile_id"].to_pylist(), dtype=object)
    cities = np.asarray(joined["city"].to_pylist(), dtype=object)
    part = np.asarray([split_of[t] for t in ids], dtype=object)
    box = np.column_stack([joined[c].to_numpy() for c in joined.column_names[2:]])
    found: list[tuple[str, str]] = []
    for city in sorted(set(cities.tolist())):
        mine = np.flatnonzero(cities == city)
        b = box[mine]
        width = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
        height = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
        overlap = (width > 0) & (height > 0) & (part[mine][:, None] != part[mine][None, :])
        for i, j in zip(*np.nonzero(np.triu(overlap)), strict=True):
            found.append((str(ids[mine[i]]), str(ids[mine[j]])))
    return found


def split_summary(splits: pa.Table) -> dict[str, dict[str, int]]:
    """Tiles and parent cells per partition."""
    out: dict[str, dict[str, int]] = {}
    for name in SPLITS:
        mine = splits.filter(pc.equal(splits["split"], name))
        out[name] = {
            "tiles": mine.num_rows,
            "parents": len(set(mine["parent_id"].to_pylist())),
        }
    return out
