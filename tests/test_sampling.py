"""Sampling translation instances: balanced quotas, anchored test sets, diversity, seeds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from citycube.tasks.sampling import (
    DEFAULT_TOTAL,
    SINGLE_CLASS_WEIGHT,
    balanced_quotas,
    sample_instances,
    split_totals,
)
from citycube.tasks.splits import SPLITS as SPLITS_ORDER
from citycube.tasks.splits import tile_parent_table, tile_splits

ORDER = ["A", "B", "C", "LC"]


def test_split_totals_of_the_default_are_the_papers() -> None:
    assert DEFAULT_TOTAL == 269_472
    assert split_totals(DEFAULT_TOTAL) == {"train": 172_032, "val": 48_720, "test": 48_720}
    assert sum(split_totals(1001).values()) == 1001


def test_balanced_quotas_by_hand() -> None:
    # 10 over capacities 1, 2, 100, 100: the small ones give all, the rest share 7 -> 4 and 3
    assert balanced_quotas(np.array([1, 2, 100, 100]), 10).tolist() == [1, 2, 4, 3]
    assert balanced_quotas(np.array([5, 5]), 100).tolist() == [5, 5]  # capped: what is possible
    assert balanced_quotas(np.array([0, 9, 9]), 6).tolist() == [0, 3, 3]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=20),
    st.integers(0, 500),
)
def test_balanced_quotas_are_max_min_fair(capacity: list[int], total: int) -> None:
    cap = np.array(capacity)
    q = balanced_quotas(cap, total)
    assert (q >= 0).all() and (q <= cap).all()
    assert q.sum() == min(total, cap.sum())
    # no route below capacity has a quota 2 less than another's: as even as capacity allows
    short = q < cap
    if short.any():
        assert q.max() - q[short].min() <= 1


def _pairs(n_keys: int, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """Keys on Boston's 2 km tiles over a few years with random offered modalities."""
    tiles = tile_parent_table(["Boston"])
    splits = tile_splits(tiles)
    rng = np.random.default_rng(seed)
    ids = tiles["tile_id"].to_pylist()
    tile = rng.choice(len(ids), n_keys)
    year = rng.integers(2000, 2026, n_keys)
    masks = rng.integers(0, 16, n_keys)
    masks[masks.astype(np.int64) == 0] = 0b1111
    keys = {(ids[t], int(y)): int(m) for t, y, m in zip(tile, year, masks, strict=True)}
    pairs = pa.table(
        {
            "city": ["Boston"] * len(keys),
            "scale": [t.split("_")[1].lower() for t, _ in keys],
            "tile_id": [t for t, _ in keys],
            "year": pa.array([y for _, y in keys], pa.int16()),
            "modality_mask": pa.array(list(keys.values()), pa.int32()),
        }
    )
    return pairs, splits


def test_instances_respect_availability_quotas_and_splits() -> None:
    pairs, splits = _pairs(3000)
    result = sample_instances(pairs, splits, ORDER, total=600, seed=7)
    inst = result.instances
    assert inst.num_rows == sum(result.achieved.values()) > 0
    bit = {c: 1 << i for i, c in enumerate(ORDER)}
    masks = {
        (t, y): m
        for t, y, m in zip(
            pairs["tile_id"].to_pylist(),
            pairs["year"].to_pylist(),
            pairs["modality_mask"].to_pylist(),
            strict=True,
        )
    }
    split_of = dict(zip(splits["tile_id"].to_pylist(), splits["split"].to_pylist(), strict=True))
    for row in inst.to_pylist():
        mask = masks[(row["tile_id"], row["year"])]
        assert mask & bit[row["source"]] and mask & bit[row["target"]]
        assert row["source"] != row["target"] and split_of[row["tile_id"]] == row["split"]
    # no (key, route) twice
    keys = inst.select(["tile_id", "year", "source", "target"]).to_pylist()
    assert len({tuple(k.values()) for k in keys}) == len(keys)
    # train is route balanced: every route within one of the others unless it ran out
    routes = result.routes.filter(pc.equal(result.routes["split"], "train")).to_pylist()
    sampled = [r["sampled"] for r in routes if r["sampled"] < r["pairs"]]
    assert max(r["sampled"] for r in routes) - min(sampled or [0]) <= 1
    assert result.requested["train"] == result.achieved["train"]


def test_test_instances_are_target_anchored() -> None:
    pairs, splits = _pairs(3000)
    inst = sample_instances(pairs, splits, ORDER, total=600, seed=7).instances
    test = inst.filter(pc.equal(inst["split"], "test")).to_pylist()
    assert test
    bit = {c: 1 << i for i, c in enumerate(ORDER)}
    masks = {
        (t, y): m
        for t, y, m in zip(
            pairs["tile_id"].to_pylist(),
            pairs["year"].to_pylist(),
            pairs["modality_mask"].to_pylist(),
            strict=True,
        )
    }
    by_target: dict[str, dict[tuple, set[str]]] = {}
    for row in test:
        key = (row["city"], row["scale"], row["tile_id"], row["year"])
        by_target.setdefault(row["target"], {}).setdefault(key, set()).add(row["source"])
    for target, anchors in by_target.items():
        for key, sources in anchors.items():
            offered = {c for c in ORDER if masks[(key[2], key[3])] & bit[c]}
            assert sources == offered - {target}  # every offered source, on the same key


def test_same_seed_same_instances_other_seed_other_instances() -> None:
    pairs, splits = _pairs(2000)
    a = sample_instances(pairs, splits, ORDER, total=300, seed=1).instances
    b = sample_instances(pairs, splits, ORDER, total=300, seed=1).instances
    c = sample_instances(pairs, splits, ORDER, total=300, seed=2).instances
    assert a.equals(b) and not a.equals(c)


def test_added_keys_do_not_reshuffle_a_keys_draw() -> None:
    """A key's draw is its own: with quotas above every route's pairs, growth only adds."""
    pairs, splits = _pairs(400)
    small = sample_instances(pairs.slice(0, 200), splits, ORDER, total=10**6).instances
    big = sample_instances(pairs, splits, ORDER, total=10**6).instances
    columns = ["split", "tile_id", "year", "source", "target"]
    assert {tuple(r.values()) for r in small.select(columns).to_pylist()} <= {
        tuple(r.values()) for r in big.select(columns).to_pylist()
    }


def _anchors(result, split: str = "test") -> dict[str, dict[tuple, set[str]]]:
    rows = result.instances.filter(pc.equal(result.instances["split"], split)).to_pylist()
    out: dict[str, dict[tuple, set[str]]] = {}
    for row in rows:
        key = (row["tile_id"], row["year"])
        out.setdefault(row["target"], {}).setdefault(key, set()).add(row["source"])
    return out


@pytest.mark.parametrize("total", [601, 1000, 1003, 2222])
def test_test_split_reaches_its_total_exactly_with_whole_anchors(total: int) -> None:
    """Whole anchors in draw order stop short of a target's quota; the anchors that fit the
    rest are taken, so the split gets exactly what it asks for and every anchor stays whole."""
    pairs, splits = _pairs(3000)
    result = sample_instances(pairs, splits, ORDER, total=total, seed=7)
    assert result.achieved == result.requested and result.complete
    assert result.note == "every split got what it asked for" and not result.shortfalls
    bit = {c: 1 << i for i, c in enumerate(ORDER)}
    masks = dict(
        zip(
            zip(pairs["tile_id"].to_pylist(), pairs["year"].to_pylist(), strict=True),
            pairs["modality_mask"].to_pylist(),
            strict=True,
        )
    )
    partial = 0
    for target, anchors in _anchors(result).items():
        for key, sources in anchors.items():
            offered = {c for c in ORDER if masks[key] & bit[c]} - {target}
            assert sources <= offered
            partial += sources != offered
    assert partial <= len(ORDER)  # at most one partial anchor per target, only when no whole fits


def test_an_anchor_is_split_only_when_no_whole_anchor_fits() -> None:
    """Every key offers all four modalities (three sources an anchor): a target quota that is
    not a multiple of three is completed with part of one anchor, the same on every run."""
    pairs, splits = _pairs(3000)
    pairs = pairs.set_column(4, "modality_mask", pa.array([0b1111] * pairs.num_rows, pa.int32()))
    total = 2000  # test asks for 361: target quotas 91, 90, 90, 90, and 91 = 30 x 3 + 1
    first = sample_instances(pairs, splits, ORDER, total=total, seed=3)
    again = sample_instances(pairs, splits, ORDER, total=total, seed=3)
    assert first.achieved["test"] == first.requested["test"] == 361
    assert first.instances.equals(again.instances)
    sizes = {t: sorted(len(s) for s in a.values()) for t, a in _anchors(first).items()}
    assert sizes == {"A": [1] + [3] * 30, "B": [3] * 30, "C": [3] * 30, "LC": [3] * 30}


def test_a_short_split_says_why() -> None:
    pairs, splits = _pairs(300)
    result = sample_instances(pairs, splits, ORDER, total=10**6)
    assert not result.complete
    assert set(result.shortfalls) == set(SPLITS_ORDER)
    for name, reason in result.shortfalls.items():
        assert result.achieved[name] == result.available[name] < result.requested[name]
        assert reason.startswith(f"{name}: {result.requested[name]:,} instances asked for")
        assert f"hold {result.available[name]:,} (source, target) pairs" in reason
    assert result.note == "; ".join(result.shortfalls.values())


def test_partial_cube_reports_what_was_possible() -> None:
    pairs, splits = _pairs(50)
    result = sample_instances(pairs, splits, ORDER)
    assert not result.complete
    assert result.requested["train"] == 172_032
    assert 0 < result.achieved["train"] < result.requested["train"]
    routes = result.routes.filter(pc.equal(result.routes["split"], "train"))
    assert routes["sampled"].to_pylist() == routes["pairs"].to_pylist()  # all of it


def test_single_class_targets_are_kept_at_a_lower_rate() -> None:
    pairs, splits = _pairs(4000, seed=5)
    pairs = pairs.set_column(4, "modality_mask", pa.array([0b1001] * pairs.num_rows, pa.int32()))
    half = pairs.num_rows // 2
    flags = pa.table(
        {
            "tile_id": pairs["tile_id"],
            "year": pairs["year"],
            "modality": ["LC"] * pairs.num_rows,
            "single_class": [i < half for i in range(pairs.num_rows)],
        }
    )
    result = sample_instances(
        pairs, splits, ORDER, categorical=["LC"], single_class=flags, total=300, seed=3
    )
    train = result.instances.filter(pc.equal(result.instances["split"], "train"))
    to_lc = train.filter(pc.equal(train["target"], "LC"))["single_class_target"].to_pylist()
    from_lc = train.filter(pc.equal(train["source"], "LC"))["single_class_target"].to_pylist()
    assert to_lc and 0 < sum(to_lc) < len(to_lc) / 2  # kept, but fewer than their half share
    assert not any(from_lc)  # the rule is about categorical targets only
    assert SINGLE_CLASS_WEIGHT < 1


@pytest.mark.parametrize("total", [0, 17])
def test_small_totals(total: int) -> None:
    pairs, splits = _pairs(500)
    result = sample_instances(pairs, splits, ORDER, total=total)
    assert result.instances.num_rows <= total
