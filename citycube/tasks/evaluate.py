"""Scoring translation predictions on a split, route by route (AgenticCity-Bench Table 2's form).

A predictor maps an instance's resolved source (and the target's code) to an array shaped like
the target: (fields,) for numeric targets, (bands, h, w) for image chips. Scores pool every
value of a route's instances before the metric is taken: squared and absolute errors are
summed over all values (valid reference pixels only), mIoU from pooled per-class intersections
and unions, clDice from pooled skeleton overlaps. Normalising ranges are the 1st–99th
percentiles of the training split: numeric fields from the observations, image targets from a
seeded sample of training chips (``RANGE_CHIPS`` per modality). OPT is scored on RGB scaled to
[0, 1], the scale of AgenticCity-Bench's OPT MSE figures.

The reference predictor (``score`` without a predictor) is the training mean: the mean of each
numeric field over the training split, a constant chip of each band's training pixel mean, or
the most frequent class (RD: road where the training road share exceeds one half). It ignores
the source, so every source of a target scores the same: the floor a translation model has to
beat.

The nearest-tile reference (``NearestTilePredictor``) predicts, for each instance, the target of
the training instance of the same route and scale whose source observation fields are nearest.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from citycube.catalogue.modalities import Catalogue, Kind
from citycube.cube.release import Release
from citycube.errors import UnknownModalityError
from citycube.tasks.loader import InstanceLoader, ModalityValue
from citycube.tasks.metrics import (
    UNAVAILABLE_METRICS,
    Metric,
    log_domain,
    metric_for,
    metrics_of,
    skeleton,
)
from citycube.tasks.pairs import modality_order

RANGE_CHIPS = 64
"""Training chips sampled per image modality for its pixel percentile range and mean."""

OPT_SCALE = 255.0
"""OPT values are uint8; they are scored on [0, 1]."""

Predictor = Callable[[ModalityValue, str, tuple[str, str, str, int]], np.ndarray | None]
"""(source, target code, key) -> prediction shaped like the target, or None for no answer."""


@dataclass(frozen=True)
class TrainingStats:
    """What the training split says about each target: ranges, means and majority classes."""

    ranges: dict[tuple[str, str], tuple[float, float]]
    """(modality, field or band) -> (p01, p99) of training values."""
    log1p_ranges: dict[tuple[str, str], tuple[float, float]]
    """(modality, field or band) -> (p01, p99) of log1p of training values."""
    means: dict[str, np.ndarray]
    """modality -> per field (numeric) or per band (image) training mean."""
    majority: dict[str, int]
    """categorical modality (and RD) -> most frequent training class (RD: 1 road, 0 none)."""


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(values, [1.0, 99.0])
    return float(low), float(high)


def training_stats(
    release: Release, catalogue: Catalogue, instances: pa.Table | None = None, seed: int = 0
) -> TrainingStats:
    """Ranges, means and majority classes of every target from the training split."""
    from citycube.tasks.translation import BenchmarkFiles, published_connection

    files = BenchmarkFiles.published(release)
    ranges: dict[tuple[str, str], tuple[float, float]] = {}
    log_ranges: dict[tuple[str, str], tuple[float, float]] = {}
    means: dict[str, np.ndarray] = {}
    majority: dict[str, int] = {}
    with published_connection(release) as con:
        con.execute(
            "CREATE TEMP TABLE train_tiles AS SELECT tile_id FROM read_parquet(?) "
            "WHERE split = 'train'",
            [str(files.splits)],
        )
        numeric = con.execute(
            """
            SELECT modality, field, list(value) FROM observations
            SEMI JOIN train_tiles USING (tile_id)
            WHERE available AND value IS NOT NULL AND isfinite(value)
            GROUP BY ALL
            """
        ).fetchall()
        chips = con.execute(
            """
            SELECT modality, store, row_off, col_off, height, width FROM chip_index
            SEMI JOIN train_tiles USING (tile_id)
            WHERE available
            """
        ).to_arrow_table()
    by_modality: dict[str, dict[str, np.ndarray]] = {}
    for modality, name, values in numeric:
        by_modality.setdefault(modality, {})[name] = np.asarray(values, dtype=np.float64)
    for spec in catalogue.modalities:
        if spec.is_image:
            continue
        found = by_modality.get(spec.code, {})
        if not found:
            continue
        for name, values in found.items():  # a field absent from training is not scored
            ranges[(spec.code, name)] = _percentiles(values)
            log_ranges[(spec.code, name)] = _percentiles(log_domain(spec.code, values))
        means[spec.code] = np.array(
            [found[f.name].mean() if f.name in found else np.nan for f in spec.fields]
        )
    rng = np.random.default_rng(seed)
    for spec in catalogue.modalities:
        if not spec.is_image:
            continue
        mine = chips.filter(pc.equal(chips["modality"], spec.code)).to_pylist()
        if not mine:
            continue
        picked = [
            mine[i] for i in sorted(rng.choice(len(mine), min(RANGE_CHIPS, len(mine)), False))
        ]
        bands: list[list[np.ndarray]] = []
        for row in picked:
            values, valid = _read_chip(release, row)
            if not bands:
                bands = [[] for _ in range(values.shape[0])]
            for b in range(values.shape[0]):
                bands[b].append(values[b][valid].astype(np.float64))
        pooled = [np.concatenate(b) if b else np.zeros(0) for b in bands]
        if not pooled or any(p.size == 0 for p in pooled):
            continue
        if spec.code == "OPT":
            pooled = [p / OPT_SCALE for p in pooled]
        names = (
            [f.name for f in spec.fields]
            if len(spec.fields) == len(pooled)
            else [f"band{b}" for b in range(len(pooled))]
        )
        for name, p in zip(names, pooled, strict=True):
            ranges[(spec.code, name)] = _percentiles(p)
            log_ranges[(spec.code, name)] = _percentiles(log_domain(spec.code, p))
        means[spec.code] = np.array([p.mean() for p in pooled])
        if spec.kind == Kind.CATEGORICAL_IMAGE:
            ids, counts = np.unique(pooled[0].astype(np.int64), return_counts=True)
            majority[spec.code] = int(ids[np.argmax(counts)])
        if spec.code == "RD":
            majority[spec.code] = int(pooled[0].mean() > 0.5)
    return TrainingStats(ranges, log_ranges, means, majority)


def _read_chip(release: Release, row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from citycube.tasks.loader import chip_group

    group = chip_group(str(release.root / row["store"]))
    r, c, h, w = row["row_off"], row["col_off"], row["height"], row["width"]
    values = np.asarray(group["data"][:, r : r + h, c : c + w])
    valid = np.asarray(group["valid"][r : r + h, c : c + w]).astype(bool)
    return values, valid


@dataclass
class _Pool:
    """Running sums of one route's errors, whatever the metric."""

    metric: Metric
    target: str
    instances: int = 0
    unpredicted: int = 0
    sq: dict[str, float] = field(default_factory=dict)
    ab: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    inter: dict[int, int] = field(default_factory=dict)
    union: dict[int, int] = field(default_factory=dict)
    skel: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int64))

    def add_values(self, names: Sequence[str], y: np.ndarray, p: np.ndarray) -> None:
        """Per field (numeric) or band (image): errors of the reference's finite values."""
        for i, name in enumerate(names):
            yi, pi = y[i].astype(np.float64).ravel(), p[i].astype(np.float64).ravel()
            keep = np.isfinite(yi)  # a non-finite prediction shows as a NaN score
            yi, pi = yi[keep], pi[keep]
            if self.metric in (Metric.LOG1P_NMAE, Metric.LOG1P_NMSE):
                yi, pi = log_domain(self.target, yi), log_domain(self.target, pi)
            err = yi - pi
            self.sq[name] = self.sq.get(name, 0.0) + float(np.sum(err**2))
            self.ab[name] = self.ab.get(name, 0.0) + float(np.sum(np.abs(err)))
            self.n[name] = self.n.get(name, 0) + int(err.size)

    def add_classes(self, y: np.ndarray, p: np.ndarray) -> None:
        """Per-class intersections and unions of valid pixels."""
        for c in np.union1d(y, p).tolist():
            in_y, in_p = y == c, p == c
            self.inter[c] = self.inter.get(c, 0) + int(np.count_nonzero(in_y & in_p))
            self.union[c] = self.union.get(c, 0) + int(np.count_nonzero(in_y | in_p))

    def add_centrelines(self, y: np.ndarray, p: np.ndarray) -> None:
        """Pooled clDice terms: prediction skeleton in reference, reference skeleton in
        prediction, and both skeletons' sizes."""
        sy, sp = skeleton(y), skeleton(p)
        self.skel += [
            np.count_nonzero(sp & y),
            np.count_nonzero(sp),
            np.count_nonzero(sy & p),
            np.count_nonzero(sy),
        ]

    def value(self, target: str, stats: TrainingStats) -> float:
        """The route's score (NaN when an instance went unpredicted)."""
        m = self.metric
        if self.unpredicted:
            return float("nan")
        if m == Metric.MSE:
            return sum(self.sq.values()) / max(sum(self.n.values()), 1)
        if m == Metric.MACRO_MIOU:
            ious = [self.inter[c] / self.union[c] for c in self.union if self.union[c]]
            return float(np.mean(ious)) if ious else float("nan")
        if m == Metric.CLDICE:
            hit_p, size_p, hit_y, size_y = (int(v) for v in self.skel)
            if size_p == 0 and size_y == 0:
                return 1.0
            precision = hit_p / size_p if size_p else 0.0
            sensitivity = hit_y / size_y if size_y else 0.0
            total = precision + sensitivity
            return 2 * precision * sensitivity / total if total else 0.0
        log = m in (Metric.LOG1P_NMAE, Metric.LOG1P_NMSE)
        ranges = stats.log1p_ranges if log else stats.ranges
        scores = []
        for name, n in self.n.items():
            if (target, name) not in ranges:
                continue
            low, high = ranges[(target, name)]
            span = high - low
            if n == 0 or not span > 0:
                continue
            if m in (Metric.NMAE, Metric.LOG1P_NMAE):
                scores.append(100.0 * self.ab[name] / n / span)
            else:
                scores.append(100.0 * self.sq[name] / n / span**2)
        return float(np.mean(scores)) if scores else float("nan")


def _constant(stats: TrainingStats, target: ModalityValue, code: str, kind: Kind) -> np.ndarray:
    """The training-mean prediction shaped like ``target``."""
    if target.valid is None:
        return stats.means[code].copy()
    shape = target.values.shape
    if kind == Kind.CATEGORICAL_IMAGE or code == "RD":
        return np.full(shape, stats.majority[code], dtype=target.values.dtype)
    mean = stats.means[code] * (OPT_SCALE if code == "OPT" else 1.0)
    return np.broadcast_to(mean[:, None, None], shape).astype(np.float64)


SCORE_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("target", pa.string()),
        ("metric", pa.string()),
        ("score", pa.float64()),
        ("instances", pa.int64()),
        ("available", pa.bool_()),
        ("reason", pa.string()),
    ]
)
"""One row per route and metric. ``available`` is false, ``score`` null and ``reason`` says why
(and how to compute it) for a Table 2 metric the project does not compute (OPT's LPIPS)."""


def target_codes(text: str, catalogue: Catalogue) -> list[str]:
    """The target codes of a comma-separated list, refused unless each is a modality the
    release processes: an unknown code would otherwise score nothing and look like a result."""
    asked = [t.strip() for t in text.split(",") if t.strip()]
    valid = [c for c in modality_order(catalogue) if c in {m.code for m in catalogue.enabled()}]
    unknown = [t for t in asked if t not in valid]
    if unknown or not asked:
        named = f"unknown target(s) {', '.join(unknown)}" if unknown else "no target given"
        raise UnknownModalityError(f"{named}; choose target codes from {', '.join(valid)}")
    return asked


def score(
    release: Release,
    catalogue: Catalogue,
    *,
    split: str = "test",
    predictor: Predictor | None = None,
    stats: TrainingStats | None = None,
    targets: Iterable[str] | None = None,
) -> pa.Table:
    """Per route of ``split``: the target's metric over its instances (``SCORE_SCHEMA``).

    Without a predictor the training-mean reference is scored. A predictor with
    ``reads_source = False`` gets the source's code only (an empty value), not its array.
    Routes whose target has no training range or mean (absent from the training split) are
    left out.
    """
    stats = stats or training_stats(release, catalogue)
    loader = InstanceLoader(release, split=split, catalogue=catalogue)
    wanted = set(targets) if targets is not None else None
    pools: dict[tuple[str, str], _Pool] = {}
    reference_cache: tuple[tuple[str, int, str], ModalityValue] | None = None
    columns = ["city", "scale", "tile_id", "year", "source", "target"]
    rows = loader.instances.select(columns).to_pylist()
    order = sorted(
        range(len(rows)), key=lambda i: (rows[i]["target"], rows[i]["tile_id"], rows[i]["year"])
    )
    if wanted is not None:
        present = sorted({r["target"] for r in rows if r["target"] in stats.means})
        absent = sorted(wanted - set(present))
        if absent:
            raise UnknownModalityError(
                f"no {split} instance of {release.root} has target(s) {', '.join(absent)}; its "
                f"{split} split's targets are {', '.join(present) or 'none'}"
            )
    for i in order:
        row = rows[i]
        code = row["target"]
        if (wanted is not None and code not in wanted) or code not in stats.means:
            continue
        spec = catalogue.get(code)
        metric = metric_for(code)
        ref_key = (row["tile_id"], row["year"], code)
        if reference_cache is None or reference_cache[0] != ref_key:
            reference_cache = (ref_key, loader.resolve(row["tile_id"], row["year"], code))
        reference = reference_cache[1]
        if predictor is None:
            prediction = _constant(stats, reference, code, spec.kind)
        else:
            if getattr(predictor, "reads_source", True):
                source = loader.resolve(row["tile_id"], row["year"], row["source"])
            else:  # it looks the source up itself: no chip read
                source = ModalityValue(row["source"], (), np.zeros(0), None)
            key = (row["city"], row["scale"], row["tile_id"], row["year"])
            predicted = predictor(source, code, key)
            prediction = None if predicted is None else np.asarray(predicted)
        pool = pools.setdefault((row["source"], code), _Pool(metric, code))
        pool.instances += 1
        if prediction is None:  # the predictor has no answer: the route scores NaN
            pool.unpredicted += 1
            continue
        _add(pool, reference, prediction, code, spec.kind)
    out = []
    for (source, target), pool in sorted(pools.items()):
        for metric in metrics_of(target):
            scored = metric not in UNAVAILABLE_METRICS
            out.append(
                {
                    "source": source,
                    "target": target,
                    "metric": metric.value,
                    "score": pool.value(target, stats) if scored else None,
                    "instances": pool.instances,
                    "available": scored,
                    "reason": None if scored else UNAVAILABLE_METRICS[metric],
                }
            )
    return pa.Table.from_pylist(out, schema=SCORE_SCHEMA)


def _add(
    pool: _Pool, reference: ModalityValue, prediction: np.ndarray, code: str, kind: Kind
) -> None:
    if reference.valid is None:  # numeric: one value per field
        names = list(reference.fields)
        pool.add_values(names, reference.values[:, None], prediction.reshape(-1)[:, None])
        return
    valid = reference.valid
    if kind == Kind.CATEGORICAL_IMAGE:
        pool.add_classes(reference.values[0][valid], prediction[0][valid])
        return
    if code == "RD":
        pool.add_centrelines(reference.values[0] > 0, prediction[0] > 0)
        return
    scale = OPT_SCALE if code == "OPT" else 1.0
    y = np.where(valid, reference.values.astype(np.float64) / scale, np.nan)
    p = prediction.astype(np.float64) / scale
    names = (
        list(reference.fields)
        if len(reference.fields) == y.shape[0]
        else [f"band{b}" for b in range(y.shape[0])]
    )
    pool.add_values(names, y, p)


def write_scores(table: pa.Table, path: Path, release: Release) -> Path:
    """Write scores to ``path`` (outside the release, so its manifest stays valid)."""
    from citycube.cube.release import file_metadata, write_parquet_atomic

    return write_parquet_atomic(table, path, file_metadata(release))


def score_matrix_markdown(table: pa.Table, order: Sequence[str]) -> str:
    """Targets as columns, sources as rows (Table 2's form): one column per target and metric
    (OPT: MSE and LPIPS), a metric the project does not compute shown as "n/a" with its
    reason below the table."""
    cells = {(r["source"], r["target"], r["metric"]): r for r in table.to_pylist()}
    columns = [
        (t, m.value)
        for t in order
        for m in metrics_of(t)
        if any(k[1] == t and k[2] == m.value for k in cells)
    ]
    several = {t for t, _ in columns if sum(c[0] == t for c in columns) > 1}
    header = [f"{t} {_METRIC_LABEL.get(m, m)}" if t in several else t for t, m in columns]
    lines = ["| source / target | " + " | ".join(header) + " |", "|---" * (len(columns) + 1) + "|"]
    for s in order:
        found = [cells.get((s, t, m)) for t, m in columns]
        if all(r is None for r in found):
            continue
        shown = [_cell(r) for r in found]
        lines.append(f"| {s} | " + " | ".join(shown) + " |")
    reasons: dict[tuple[str, str], str] = {}
    for row in cells.values():
        if not row["available"]:
            reasons.setdefault((row["target"], row["metric"]), row["reason"])
    for (t, m), reason in reasons.items():
        lines += ["", f"{t} {_METRIC_LABEL.get(m, m)}: {reason}"]
    return "\n".join(lines)


_METRIC_LABEL = {"mse": "MSE", "lpips": "LPIPS"}


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    if not row["available"]:
        return "n/a"
    return f"{row['score']:.3f}"


class NearestTilePredictor:
    """The project's own nearest-tile reference (AgenticCity-Bench has no such baseline): the
    target of the nearest training instance.

    For a test instance of route source → target, the candidates are the training instances of
    the same route and scale (so a chip has the shape the reference has). Each key's source is
    described by its observation fields (numeric modalities: their values; image modalities:
    the band means of valid pixels, or the dominant class of categorical ones), as the
    published observations hold them. The distance is the mean over the fields finite at both
    keys of the squared difference in training standard deviations (each field standardised by
    its mean and standard deviation over the training instances' keys of that source), or, for
    a class id, 0 when the classes agree and 1 when not. The nearest candidate, first in
    (tile, year) order on ties, gives its target as the prediction (gaps filled: ``_filled``);
    a route without training instances at the scale, or a key sharing no finite field with any
    of them, gets no answer (None), and its route scores NaN.
    """

    reads_source = False
    """It describes the source by its observation fields, so ``score`` need not read chips."""

    def __init__(self, release: Release, catalogue: Catalogue) -> None:
        import pyarrow.parquet as pq

        from citycube.tasks.translation import BenchmarkFiles, published_connection

        self.catalogue = catalogue
        files = BenchmarkFiles.published(release)
        instances = pq.read_table(files.instances)
        train = instances.filter(pc.equal(instances["split"], "train"))
        self.loader = InstanceLoader(release, split="train", catalogue=catalogue, instances=train)
        keys = instances.select(["tile_id", "year", "source"])
        with published_connection(release) as con:
            con.register("_keys", keys)
            found = con.execute(
                """
                SELECT o.tile_id, o.year, o.modality, o.field, o.value
                FROM observations AS o
                SEMI JOIN (SELECT DISTINCT tile_id, year, source FROM _keys) AS k
                  ON o.tile_id = k.tile_id AND o.year = k.year AND o.modality = k.source
                """
            ).fetchall()
        self._fields = {m.code: [f.name for f in m.fields] for m in catalogue.modalities}
        self._vectors: dict[tuple[str, int, str], np.ndarray] = {}
        values: dict[tuple[str, int, str], dict[str, float]] = {}
        for tile, year, code, name, value in found:
            values.setdefault((tile, year, code), {})[name] = np.nan if value is None else value
        for (tile, year, code), fields in values.items():
            self._vectors[(tile, year, code)] = np.array(
                [fields.get(n, np.nan) for n in self._fields[code]], dtype=np.float64
            )
        self._categorical = {
            m.code for m in catalogue.modalities if m.kind == Kind.CATEGORICAL_IMAGE
        }
        rows = train.select(["scale", "tile_id", "year", "source", "target"]).to_pylist()
        rows.sort(key=lambda r: (r["tile_id"], r["year"]))
        by_route: dict[tuple[str, str, str], list[tuple[str, int]]] = {}
        for r in rows:
            by_route.setdefault((r["source"], r["target"], r["scale"]), []).append(
                (r["tile_id"], r["year"])
            )
        self._scale: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for code in {r["source"] for r in rows}:
            seen = {(r["tile_id"], r["year"]) for r in rows if r["source"] == code}
            matrix = np.array([self._vector(t, y, code) for t, y in sorted(seen)])
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, std = np.nanmean(matrix, axis=0), np.nanstd(matrix, axis=0)
            std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
            self._scale[code] = (np.nan_to_num(mean), std)
        self._routes = {
            route: (keys_, np.array([self._vector(t, y, route[0]) for t, y in keys_]))
            for route, keys_ in by_route.items()
        }
        self._targets: dict[tuple[str, int, str], np.ndarray] = {}
        self._means: dict[str, np.ndarray] = {}

    def _vector(self, tile: str, year: int, code: str) -> np.ndarray:
        found = self._vectors.get((tile, year, code))
        if found is None:
            return np.full(len(self._fields[code]), np.nan)
        return found

    def distances(self, code: str, query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Distance of ``query`` to each row of ``candidates`` (source fields of ``code``)."""
        both = np.isfinite(candidates) & np.isfinite(query)[None, :]
        if code in self._categorical:
            per_field = (candidates != query[None, :]).astype(np.float64)
        else:
            _, std = self._scale[code]
            per_field = ((candidates - query[None, :]) / std[None, :]) ** 2
        shared = both.sum(axis=1)
        total = np.where(both, per_field, 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(shared > 0, total / np.maximum(shared, 1), np.inf)

    def nearest(
        self, source: str, target: str, key: tuple[str, str, str, int]
    ) -> tuple[str, int] | None:
        """The training (tile, year) whose source is nearest to ``key``'s, or None."""
        route = self._routes.get((source, target, key[1]))
        if route is None:
            return None
        keys, candidates = route
        d = self.distances(source, self._vector(key[2], key[3], source), candidates)
        if not np.isfinite(d).any():
            return None
        return keys[int(np.argmin(d))]

    def __call__(
        self, source: ModalityValue, target: str, key: tuple[str, str, str, int]
    ) -> np.ndarray | None:
        """The nearest training instance's target (None when there is none)."""
        found = self.nearest(source.modality, target, key)
        if found is None:
            return None
        cache_key = (found[0], found[1], target)
        if cache_key not in self._targets:
            if len(self._targets) > 256:
                self._targets.clear()
            value = self.loader.resolve(found[0], found[1], target)
            self._targets[cache_key] = self._filled(value, target)
        return self._targets[cache_key]

    def _filled(self, value: ModalityValue, target: str) -> np.ndarray:
        """The borrowed target with its gaps filled, so that every reference value is scored.

        A chip's invalid pixels take the chip's own valid mean per band (its most frequent
        valid value for class maps and roads); a missing numeric field (AQ offers either of
        two) takes that field's mean over the training instances of the target.
        """
        values = np.array(value.values, copy=True)
        if value.valid is None:
            gaps = ~np.isfinite(values)
            if gaps.any():
                values[gaps] = self._field_means(target)[gaps]
            return values
        classes = target == "RD" or self.catalogue.get(target).kind == Kind.CATEGORICAL_IMAGE
        for b in range(values.shape[0]):
            band = values[b]
            ok = value.valid & (np.isfinite(band) if band.dtype.kind == "f" else True)
            if ok.all() or not ok.any():
                continue
            if classes:
                ids, counts = np.unique(band[ok], return_counts=True)
                band[~ok] = ids[np.argmax(counts)]
            else:
                band[~ok] = band[ok].mean()
        return values

    def _field_means(self, target: str) -> np.ndarray:
        if target not in self._means:
            keys = {(r["tile_id"], r["year"]) for r in self.loader.rows if r["target"] == target}
            rows = [self.loader.resolve(t, y, target).values for t, y in sorted(keys)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                self._means[target] = np.nanmean(np.array(rows), axis=0)
        return self._means[target]
