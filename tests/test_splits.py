"""Splits by whole 10 km parent cells: no tile of one partition overlaps another's."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from citycube.tasks.splits import (
    SPLIT_SHARES,
    SPLITS,
    cross_split_overlaps,
    split_summary,
    tile_parent_table,
    tile_splits,
)


@pytest.fixture(scope="module")
def tiles() -> pa.Table:
    return tile_parent_table()


@pytest.fixture(scope="module")
def splits(tiles: pa.Table) -> pa.Table:
    return tile_splits(tiles)


def test_every_tile_of_the_16_cities_has_one_split(tiles: pa.Table, splits: pa.Table) -> None:
    assert splits.num_rows == tiles.num_rows == 5836 + 750
    assert set(splits["split"].to_pylist()) == set(SPLITS)


def test_no_train_tile_overlaps_a_validation_or_test_tile_at_either_scale(
    tiles: pa.Table, splits: pa.Table
) -> None:
    assert cross_split_overlaps(tiles, splits) == []


def test_the_overlap_check_finds_a_leak(tiles: pa.Table, splits: pa.Table) -> None:
    """Moving one 2 km tile out of its parent's split must show up as overlaps at 5 km."""
    boston_2km = pc.and_(pc.equal(splits["city"], "Boston"), pc.equal(splits["scale"], "2km"))
    row = pc.index(boston_2km, True).as_py()
    moved = "test" if splits["split"][row].as_py() != "test" else "train"
    split = splits["split"].to_pylist()
    split[row] = moved
    leaky = splits.set_column(4, "split", pa.array(split))
    found = cross_split_overlaps(tiles, leaky)
    assert found and all(splits["tile_id"][row].as_py() in pair for pair in found)


def test_parents_stay_whole_and_shares_follow_the_paper(splits: pa.Table) -> None:
    per_parent = splits.group_by("parent_id").aggregate([("split", "count_distinct")])
    assert set(per_parent["split_count_distinct"].to_pylist()) == {1}
    summary = split_summary(splits)
    total = sum(s["tiles"] for s in summary.values())
    for name in SPLITS:
        assert summary[name]["tiles"] / total == pytest.approx(SPLIT_SHARES[name], abs=0.02)
    # every city takes part in every partition
    cities = splits.group_by("city").aggregate([("split", "count_distinct")])
    assert set(cities["split_count_distinct"].to_pylist()) == {3}


def test_the_seed_decides_and_reproduces_the_assignment(tiles: pa.Table) -> None:
    again = tile_splits(tiles)
    other = tile_splits(tiles, seed=1)
    assert again.equals(tile_splits(tiles))
    assert other["split"].to_pylist() != again["split"].to_pylist()
    assert cross_split_overlaps(tiles, other) == []
