"""Train/validation/test splits of a city-task's units (CityRep §3.3 and App. C.1).

A block split lays a ``k × k`` block grid over the bounding box, in grid index space, of the
units that carry a label, keeps the non-empty blocks, shuffles them with the seed, sends 20 %
of them to test and 10 % of the rest to validation: units follow their block. The random split
uses the same ratios on units (the leakage diagnostic). The parent split is the dataset's own
10 km parent-cell split (AgenticCity-Bench App. C), one assignment for every seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from citycube.errors import EmbeddingError

SEEDS = (42, 24, 7, 0, 100)
"""CityRep's five split seeds."""
TEST_SHARE = 0.2
VAL_SHARE = 0.1
"""Share of the blocks (units) left after the test draw that go to validation."""
PROTOCOLS = ("block10", "block20", "parent", "random")
SPATIAL = ("block10", "block20", "parent")


@dataclass(frozen=True)
class Split:
    """One split of one city-task: a label and a block per unit (block -1 when unit-wise)."""

    protocol: str
    seed: int
    split: np.ndarray
    block: np.ndarray

    def mask(self, part: str) -> np.ndarray:
        return self.split == part


def _share(n: int, share: float) -> int:
    """How many of ``n`` items a share takes: rounded, at least one when there are two."""
    return min(n - 1, max(1, round(share * n))) if n >= 2 else 0


def _assign(n_items: int, seed: int) -> np.ndarray:
    """'train'/'val'/'test' for ``n_items`` items, shuffled by ``seed``."""
    order = np.random.default_rng(seed).permutation(n_items)
    n_test = _share(n_items, TEST_SHARE)
    n_val = _share(n_items - n_test, VAL_SHARE)
    labels = np.full(n_items, "train", dtype=object)
    labels[order[:n_test]] = "test"
    labels[order[n_test : n_test + n_val]] = "val"
    return labels


def block_ids(row: np.ndarray, col: np.ndarray, blocks: int) -> np.ndarray:
    """Block of each unit on a ``blocks × blocks`` grid over the units' index extent."""
    row, col = np.asarray(row), np.asarray(col)
    if row.size == 0:
        return np.zeros(0, np.int64)
    r0, c0 = row.min(), col.min()
    height, width = row.max() - r0 + 1, col.max() - c0 + 1
    br = np.minimum((row - r0) * blocks // height, blocks - 1)
    bc = np.minimum((col - c0) * blocks // width, blocks - 1)
    return (br * blocks + bc).astype(np.int64)


def block_split(row: np.ndarray, col: np.ndarray, blocks: int, seed: int) -> Split:
    """Blocks, not units, drawn to test and validation; only non-empty blocks take part."""
    ids = block_ids(row, col, blocks)
    occupied, inverse = np.unique(ids, return_inverse=True)
    labels = _assign(len(occupied), seed)
    return Split(f"block{blocks}", seed, labels[inverse], ids)


def random_split(n: int, seed: int) -> Split:
    """Units drawn one by one with the block split's ratios."""
    return Split("random", seed, _assign(n, seed), np.full(n, -1, np.int64))


def parent_split(tile_ids: np.ndarray, dataset_split: Mapping[str, str]) -> Split:
    """The release's own 10 km parent split (train/val/test per tile)."""
    labels = np.array([dataset_split.get(str(t), "") for t in tile_ids], dtype=object)
    missing = int((labels == "").sum())
    if missing:
        raise EmbeddingError(
            f"{missing} task tiles have no dataset split; materialise benchmark/splits first"
        )
    return Split("parent", 0, labels, np.full(len(labels), -1, np.int64))


def make_split(
    protocol: str,
    seed: int,
    tile_ids: np.ndarray,
    row: np.ndarray,
    col: np.ndarray,
    dataset_split: Mapping[str, str] | None = None,
) -> Split:
    """The split of one protocol and seed for units at grid index (row, col)."""
    if protocol == "block10":
        return block_split(row, col, 10, seed)
    if protocol == "block20":
        return block_split(row, col, 20, seed)
    if protocol == "random":
        return random_split(len(tile_ids), seed)
    if protocol == "parent":
        if dataset_split is None:
            raise EmbeddingError("the parent protocol needs the release's splits table")
        return parent_split(tile_ids, dataset_split)
    raise EmbeddingError(f"unknown split protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")


def split_table(city: str, task: str, scale: str, tile_ids: np.ndarray, split: Split) -> pa.Table:
    """The split as rows of (city, task, scale, protocol, seed, tile_id, block, split)."""
    n = len(tile_ids)
    return pa.table(
        {
            "city": pa.array([city] * n),
            "task": pa.array([task] * n),
            "scale": pa.array([scale] * n),
            "protocol": pa.array([split.protocol] * n),
            "seed": pa.array(np.full(n, split.seed, np.int32)),
            "tile_id": pa.array([str(t) for t in tile_ids]),
            "block": pa.array(split.block),
            "split": pa.array([str(s) for s in split.split]),
        }
    )
