"""Translation instances sampled from the pair index inside each split (AgenticCity-Bench App. C).

- **Route-balanced quotas.** Each partition's total is shared across the directed routes as
  evenly as their available pairs allow (max-min fair): a route with fewer pairs than the even
  share gives all it has, the rest goes to the others. Train and validation use these quotas.
- **Target-anchored test.** For each target, test keys (city, scale, tile, year) are drawn as
  anchors and every source offered at an anchor is scored on it: two sources of a target share
  a reference wherever both are offered, but a source absent at an anchor (some are present at
  only a minority of their target's anchors) is not scored there, so routes of one target are
  compared on overlapping, not identical, reference sets. The per-target totals are balanced
  the same way and met exactly: an anchor that would overshoot is passed over for one that
  fits, and only when none fits does one anchor give part of its sources.
- **Shortfall only for want of pairs.** Every split gets its total whenever its keys hold that
  many (source, target) pairs; otherwise every route gives all it has and the result says
  which split ran short, with the pairs it holds.
- **Diversity for categorical targets.** A key whose target chip holds a single class is kept
  at ``SINGLE_CLASS_WEIGHT`` times the rate of a diverse one (weighted sampling without
  replacement), never dropped.
- **Reproducible and stable.** A key's draw for a route comes from a hash of the seed, the
  route and the key itself, not from its position: the same cube and seed give the same
  instances, and a key keeps its draw when other city-years are added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from citycube.tasks.splits import PAPER_SPLIT_SIZES, SPLIT_SHARES, SPLITS

DEFAULT_TOTAL = sum(PAPER_SPLIT_SIZES.values())
"""Instances of a complete cube by default: 269,472 (AgenticCity-Bench)."""

SAMPLING_SEED = 0
"""Default seed of every draw; recorded in the manifest."""

SINGLE_CLASS_WEIGHT = 0.25
"""Sampling weight of a single-class tile for a categorical target (a diverse tile weighs 1)."""

INSTANCE_SCHEMA = pa.schema(
    [
        pa.field("instance_id", pa.int64(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("scale", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("year", pa.int16(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("target", pa.string(), nullable=False),
        pa.field("single_class_target", pa.bool_(), nullable=False),
    ]
)


def split_totals(total: int, shares: Mapping[str, float] = SPLIT_SHARES) -> dict[str, int]:
    """``total`` shared by the split shares, whole numbers by largest remainder."""
    names = list(shares)
    exact = np.array([shares[n] for n in names]) * total
    base = np.floor(exact).astype(np.int64)
    extra = total - int(base.sum())
    remainder = np.round(exact - base, 9)  # equal shares tie exactly: the earlier split wins
    for i in np.argsort(-remainder, kind="stable")[:extra]:
        base[i] += 1
    return {n: int(b) for n, b in zip(names, base, strict=True)}


def balanced_quotas(capacity: np.ndarray, total: int) -> np.ndarray:
    """Max-min fair whole quotas: as equal as possible, none above its capacity, summing to
    ``min(total, capacity.sum())``. Leftover units go to the first routes with room."""
    capacity = np.asarray(capacity, dtype=np.int64)
    if total >= int(capacity.sum()):
        return capacity.copy()
    lo, hi = 0, int(capacity.max(initial=0))
    while lo < hi:  # the largest level whose capped sum fits
        mid = (lo + hi + 1) // 2
        if int(np.minimum(capacity, mid).sum()) <= total:
            lo = mid
        else:
            hi = mid - 1
    quotas = np.minimum(capacity, lo)
    remainder = total - int(quotas.sum())
    room = np.flatnonzero(capacity > lo)[:remainder]
    quotas[room] += 1
    return quotas


def key_hashes(tile_ids: Sequence[str], years: Sequence[int]) -> np.ndarray:
    """A stable 64-bit hash of each (tile, year) key (tile ids carry city and scale)."""
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(f"{t}|{y}".encode(), digest_size=8).digest(), "little")
            for t, y in zip(tile_ids, years, strict=True)
        ),
        dtype=np.uint64,
        count=len(tile_ids),
    )


def _salt(seed: int, *parts: str) -> np.uint64:
    text = "|".join([str(seed), *parts]).encode()
    return np.uint64(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little"))


def _uniform(hashes: np.ndarray, salt: np.uint64) -> np.ndarray:
    """Uniform draws in (0, 1) from key hashes mixed with a salt (splitmix64 finaliser)."""
    with np.errstate(over="ignore"):
        z = hashes ^ salt
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _priorities(u: np.ndarray, single: np.ndarray | None) -> np.ndarray:
    """Efraimidis–Spirakis keys: the largest k are a weighted sample without replacement."""
    weight = np.ones_like(u) if single is None else np.where(single, SINGLE_CLASS_WEIGHT, 1.0)
    return np.log(u) / weight


@dataclass
class SampleResult:
    """Sampled instances and what was asked for against what was possible."""

    instances: pa.Table
    """One row per instance (``INSTANCE_SCHEMA``)."""
    routes: pa.Table
    """Per split and route: pairs available, quota and sampled."""
    requested: dict[str, int]
    """Instances asked for per split."""
    achieved: dict[str, int]
    """Instances sampled per split."""
    available: dict[str, int] = field(default_factory=dict)
    """(key, route) pairs the keys of each split hold: the most a split can give."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Seed, weights and rules, for the manifest."""

    @property
    def complete(self) -> bool:
        """True when every split got what it asked for."""
        return all(self.achieved[s] >= self.requested[s] for s in self.requested)

    @property
    def shortfalls(self) -> dict[str, str]:
        """Why each split that got less than it asked for ran short, by split name."""
        return {
            name: (
                f"{name}: {self.requested[name]:,} instances asked for, "
                f"{self.achieved[name]:,} sampled: the split's keys hold "
                f"{self.available.get(name, 0):,} (source, target) pairs in all, "
                "and every route gave all it has"
            )
            for name in self.requested
            if self.achieved[name] < self.requested[name]
        }

    @property
    def note(self) -> str:
        """One line for the manifest: complete, or which splits ran short and why."""
        if self.complete:
            return "every split got what it asked for"
        return "; ".join(self.shortfalls.values())


@dataclass(frozen=True)
class _Keys:
    """The keys of one split as arrays."""

    rows: np.ndarray
    masks: np.ndarray
    single: np.ndarray
    hashes: np.ndarray


def sample_instances(
    pairs: pa.Table,
    splits: pa.Table,
    order: Sequence[str],
    *,
    categorical: Sequence[str] = (),
    single_class: pa.Table | None = None,
    total: int = DEFAULT_TOTAL,
    seed: int = SAMPLING_SEED,
) -> SampleResult:
    """Sample ``total`` instances from the pair index ``pairs`` within ``splits``.

    ``pairs`` has the pair-index columns (city, scale, tile_id, year, modality_mask), bits in
    ``order``; ``splits`` maps tile_id to split. ``single_class`` lists (tile_id, year,
    modality) whose chip holds one class; categorical targets draw those at a lower rate.
    """
    n = len(order)
    index = pc.index_in(pairs["tile_id"], value_set=splits["tile_id"])
    split_of = pc.take(splits["split"], index).to_numpy(zero_copy_only=False)
    masks = pairs["modality_mask"].to_numpy().astype(np.int64)
    hashes = key_hashes(pairs["tile_id"].to_pylist(), pairs["year"].to_pylist())
    single = _single_class_masks(pairs, hashes, order, single_class)
    categorical_bits = np.array([code in categorical for code in order])
    requested = split_totals(total)
    offered = ((masks[:, None] >> np.arange(n)) & 1).astype(bool)

    chosen: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    route_rows: list[dict[str, Any]] = []
    available: dict[str, int] = {}
    for name in SPLITS:
        rows = np.flatnonzero(split_of == name)
        keys = _Keys(rows, masks[rows], single[rows], hashes[rows])
        if name == "test":
            picked = _anchored(keys, offered[rows], order, categorical_bits, requested[name], seed)
        else:
            picked = _balanced(keys, offered[rows], order, categorical_bits, requested[name], seed)
        chosen.append((np.full(len(picked[0]), SPLITS.index(name)), *picked))
        sampled = np.zeros((n, n), dtype=np.int64)
        np.add.at(sampled, (picked[1], picked[2]), 1)
        pairs_here = offered[rows].T.astype(np.int64) @ offered[rows].astype(np.int64)
        np.fill_diagonal(pairs_here, 0)
        available[name] = int(pairs_here.sum())
        quotas = picked[3]
        for s in range(n):
            for t in range(n):
                if s != t:
                    route_rows.append(
                        {
                            "split": name,
                            "source": order[s],
                            "target": order[t],
                            "pairs": int(pairs_here[s, t]),
                            "quota": int(quotas[s, t]),
                            "sampled": int(sampled[s, t]),
                        }
                    )
    instances = _instance_table(pairs, order, single, chosen)
    achieved = {
        name: int(pc.sum(pc.equal(instances["split"], name)).as_py() or 0) for name in SPLITS
    }
    return SampleResult(
        instances=instances,
        routes=pa.Table.from_pylist(route_rows),
        requested=requested,
        achieved=achieved,
        available=available,
        settings={
            "seed": seed,
            "total": total,
            "single_class_weight": SINGLE_CLASS_WEIGHT,
            "categorical_targets": [c for c in order if c in categorical],
            "modality_order": list(order),
        },
    )


def _single_class_masks(
    pairs: pa.Table, hashes: np.ndarray, order: Sequence[str], single_class: pa.Table | None
) -> np.ndarray:
    """Per key, a bit mask of the modalities whose chip holds a single class."""
    out = np.zeros(pairs.num_rows, dtype=np.int64)
    if single_class is None or single_class.num_rows == 0:
        return out
    flagged = single_class.filter(single_class["single_class"])
    flagged_hashes = key_hashes(flagged["tile_id"].to_pylist(), flagged["year"].to_pylist())
    bits = np.array(
        [1 << order.index(m) if m in order else 0 for m in flagged["modality"].to_pylist()],
        dtype=np.int64,
    )
    per_hash: dict[int, int] = {}
    for h, b in zip(flagged_hashes.tolist(), bits.tolist(), strict=True):
        per_hash[h] = per_hash.get(h, 0) | b
    if per_hash:
        known = np.fromiter(per_hash, dtype=np.uint64, count=len(per_hash))
        values = np.fromiter(per_hash.values(), dtype=np.int64, count=len(per_hash))
        sorter = np.argsort(known)
        position = np.searchsorted(known, hashes, sorter=sorter).clip(0, len(known) - 1)
        hit = known[sorter[position]] == hashes
        out[hit] = values[sorter[position[hit]]]
    return out


def _balanced(
    keys: _Keys,
    offered: np.ndarray,
    order: Sequence[str],
    categorical: np.ndarray,
    total: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Route-balanced quotas over every directed route, each filled by its best draws."""
    n = len(order)
    counts = offered.T.astype(np.int64) @ offered.astype(np.int64)
    np.fill_diagonal(counts, 0)
    off = ~np.eye(n, dtype=bool)
    quotas = np.zeros((n, n), dtype=np.int64)
    quotas[off] = balanced_quotas(counts[off], total)
    out_rows, out_source, out_target = [], [], []
    for s in range(n):
        for t in range(n):
            q = int(quotas[s, t])
            if s == t or q == 0:
                continue
            candidates = np.flatnonzero(offered[:, s] & offered[:, t])
            u = _uniform(keys.hashes[candidates], _salt(seed, "route", order[s], order[t]))
            single = (keys.single[candidates] >> t) & 1 if categorical[t] else None
            priority = _priorities(u, None if single is None else single.astype(bool))
            if q < len(candidates):
                best = np.argpartition(-priority, q - 1)[:q]
            else:
                best = np.arange(len(candidates))
            out_rows.append(keys.rows[candidates[best]])
            out_source.append(np.full(len(best), s))
            out_target.append(np.full(len(best), t))
    return _concat(out_rows), _concat(out_source), _concat(out_target), quotas


def _anchored(
    keys: _Keys,
    offered: np.ndarray,
    order: Sequence[str],
    categorical: np.ndarray,
    total: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per target, anchor keys in draw order; every source offered at an anchor is scored.

    Each target's anchors fill its balanced quota exactly (:func:`_fill_anchors`), so the test
    split reaches its total whenever its keys hold that many pairs.
    """
    n = len(order)
    sources_at = offered.sum(axis=1) - 1  # instances an anchor adds for any target it offers
    capacity = np.array([int(sources_at[offered[:, t]].sum()) for t in range(n)])
    per_target = balanced_quotas(capacity, total)
    quotas = np.zeros((n, n), dtype=np.int64)
    out_rows, out_source, out_target = [], [], []
    for t in range(n):
        candidates = np.flatnonzero(offered[:, t])
        if per_target[t] == 0 or not len(candidates):
            continue
        u = _uniform(keys.hashes[candidates], _salt(seed, "anchor", order[t]))
        single = ((keys.single[candidates] >> t) & 1).astype(bool) if categorical[t] else None
        ranked = candidates[np.argsort(-_priorities(u, single), kind="stable")]
        taken, passed_over, missing = _fill_anchors(ranked, sources_at[ranked], int(per_target[t]))
        partial_sources = (
            _best_sources(keys.hashes[passed_over], offered[passed_over], t, missing, order, seed)
            if missing and passed_over >= 0
            else set()
        )
        for s in range(n):
            if s == t:
                continue
            with_source = taken[offered[taken, s]]
            if s in partial_sources:
                with_source = np.append(with_source, passed_over)
            out_rows.append(keys.rows[with_source])
            out_source.append(np.full(len(with_source), s))
            out_target.append(np.full(len(with_source), t))
            quotas[s, t] = len(with_source)
    return _concat(out_rows), _concat(out_source), _concat(out_target), quotas


def _fill_anchors(ranked: np.ndarray, cost: np.ndarray, quota: int) -> tuple[np.ndarray, int, int]:
    """Anchors of one target in draw order whose instances add up to ``quota`` exactly.

    Anchors are taken in draw order while they fit; one that would overshoot is passed over for
    the next that fits, so every taken anchor is whole. Returns the taken anchors, the first
    anchor passed over and what is still missing (non-zero only when no remaining anchor is
    small enough: the caller then takes that many sources of the passed-over anchor).
    """
    end = int(np.searchsorted(np.cumsum(cost), quota, "right"))
    taken = [ranked[:end]]
    left = quota - int(cost[:end].sum())
    first_over = ranked[end] if left and end < len(ranked) else -1
    position = end + 1
    while left and position < len(ranked):
        fits = np.flatnonzero(cost[position:] <= left)
        if not len(fits):
            break
        position += int(fits[0])
        taken.append(ranked[position : position + 1])
        left -= int(cost[position])
        position += 1
    return np.concatenate(taken), int(first_over), left


def _best_sources(
    key_hash: np.uint64, offered: np.ndarray, t: int, count: int, order: Sequence[str], seed: int
) -> set[int]:
    """The ``count`` sources of one key with the highest draws for their route to ``t``: the
    part of an anchor taken when no whole anchor fits a target's quota."""
    sources = [s for s in np.flatnonzero(offered).tolist() if s != t]
    draws = [
        float(_uniform(np.array([key_hash]), _salt(seed, "route", order[s], order[t]))[0])
        for s in sources
    ]
    return {sources[i] for i in np.argsort(-np.asarray(draws), kind="stable")[:count]}


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _instance_table(
    pairs: pa.Table,
    order: Sequence[str],
    single: np.ndarray,
    chosen: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> pa.Table:
    split_index = _concat([c[0] for c in chosen]).astype(np.int64)
    rows = _concat([c[1] for c in chosen]).astype(np.int64)
    source = _concat([c[2] for c in chosen]).astype(np.int64)
    target = _concat([c[3] for c in chosen]).astype(np.int64)
    codes = np.asarray(order, dtype=object)
    keys = pairs.select(["city", "scale", "tile_id", "year"]).take(pa.array(rows))
    table = pa.table(
        {
            "split": pa.array(np.asarray(SPLITS, dtype=object)[split_index], pa.string()),
            **{name: keys[name] for name in keys.column_names},
            "source": pa.array(codes[source], pa.string()),
            "target": pa.array(codes[target], pa.string()),
            "single_class_target": pa.array(((single[rows] >> target) & 1).astype(bool)),
        }
    )
    if table.num_rows:
        table = table.sort_by(
            [(c, "ascending") for c in ("split", "target", "source", "city", "scale", "tile_id")]
            + [("year", "ascending")]
        )
    table = table.add_column(0, "instance_id", pa.array(np.arange(table.num_rows), pa.int64()))
    return table.cast(INSTANCE_SCHEMA)
