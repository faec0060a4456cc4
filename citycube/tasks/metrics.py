"""Translation metrics (AgenticCity-Bench App. C): set by the target modality alone.

NMAE and NMSE divide by the target field's 1st–99th percentile range of the training split
(squared for NMSE) and are reported ×100 as percentages; multi-field targets macro-average
NMSE over their fields. The log1p variants compare ``log1p`` of reference and prediction and
normalise by the percentile range of ``log1p`` of the training values; they serve targets that
cannot be negative, so every value (reference, prediction, training) is clipped at 0 before
``log1p`` (:func:`log1p_scale`, the one rule): a prediction of −2 scores as a prediction of 0,
never as NaN. MSE, macro mIoU and clDice stay on their native scales.

OPT's second metric in Table 2, LPIPS, needs a pretrained network: it is listed with its
target (``FURTHER_METRICS``) but not computed, and every score table says so in its own rows
(``UNAVAILABLE_METRICS``), never with a stand-in value.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike


class Metric(StrEnum):
    """How a target modality is scored."""

    MSE = "mse"
    NMAE = "nmae"
    LOG1P_NMAE = "log1p_nmae"
    MACRO_NMSE = "macro_nmse"
    LOG1P_NMSE = "log1p_nmse"
    MACRO_MIOU = "macro_miou"
    CLDICE = "cldice"
    LPIPS = "lpips"


TARGET_METRICS: Mapping[str, Metric] = {
    "OPT": Metric.MSE,
    "DEM": Metric.NMAE,
    "NDVI": Metric.NMAE,
    "HF": Metric.NMAE,
    "BV": Metric.LOG1P_NMAE,
    "LC": Metric.MACRO_MIOU,
    "LU": Metric.MACRO_MIOU,
    "RD": Metric.CLDICE,
    "HEAT": Metric.MACRO_NMSE,
    "WTH": Metric.MACRO_NMSE,
    "AQ": Metric.MACRO_NMSE,
    "CO2": Metric.LOG1P_NMSE,
    "POP": Metric.LOG1P_NMSE,
    "PROP": Metric.LOG1P_NMSE,
    "ELEC": Metric.LOG1P_NMSE,
    "NTL": Metric.LOG1P_NMSE,
    "GPS": Metric.LOG1P_NMSE,
}
"""AgenticCity-Bench Table 2's metric per target. POI is not scored in the paper's tables; as a
categorical map it would take macro mIoU (``metric_for``)."""

FURTHER_METRICS: Mapping[str, tuple[Metric, ...]] = {"OPT": (Metric.LPIPS,)}
"""Table 2's further metrics of a target, reported beside its metric (OPT: MSE and LPIPS)."""

UNAVAILABLE_METRICS: Mapping[Metric, str] = {
    Metric.LPIPS: (
        "not computed: LPIPS compares deep features of a pretrained network (AlexNet or VGG "
        "with LPIPS's learned linear layers); the project installs no deep-learning framework "
        "and downloads no weights at run time, and a stand-in network would not be LPIPS. To "
        "report it, install torch and the lpips package with their AlexNet weights available "
        "offline and score the OPT predictions and references (both RGB in [0, 1], rescaled to "
        "[-1, 1]) with lpips.LPIPS(net='alex'), averaged over a route's instances."
    ),
}
"""Table 2's metrics the project does not compute, with why and how to get them."""


def metrics_of(target: str) -> tuple[Metric, ...]:
    """Every metric Table 2 reports for a target: its own, then its further ones."""
    return (metric_for(target), *FURTHER_METRICS.get(target, ()))


STORED_AS_LOG1P = frozenset({"GPS"})
"""Targets whose published value is already log1p of the quantity (GPS: log(1 + points/km²),
AgenticCity-Bench Table 12): their log1p metrics read the stored value as the log domain, so
log1p is applied once, not twice."""

PERCENTILES = (1.0, 99.0)
"""The training-distribution range that normalises NMAE and NMSE."""


def metric_for(target: str) -> Metric:
    """The metric of a target modality (POI, unscored in the paper, as a categorical map)."""
    if target == "POI":
        return Metric.MACRO_MIOU
    if target not in TARGET_METRICS:
        raise KeyError(f"no translation metric for target {target!r}")
    return TARGET_METRICS[target]


def _pair(reference: ArrayLike, prediction: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(reference, dtype=np.float64)
    p = np.asarray(prediction, dtype=np.float64)
    if y.shape != p.shape:
        raise ValueError(f"reference {y.shape} and prediction {p.shape} differ in shape")
    if y.size == 0:
        raise ValueError("no values to score")
    return y, p


def log1p_scale(values: ArrayLike) -> np.ndarray:
    """``log1p`` of values clipped at 0: the log domain of the log1p metrics (their targets are
    non-negative, so a negative value, a prediction's or a rounding's, counts as 0)."""
    return np.log1p(np.clip(np.asarray(values, dtype=np.float64), 0.0, None))


def log_domain(target: str, values: ArrayLike) -> np.ndarray:
    """A log1p-scored target's values in the log domain: :func:`log1p_scale`, or, for a target
    stored as log1p already, the stored value clipped at 0 (the same rule, applied once)."""
    if target in STORED_AS_LOG1P:
        return np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    return log1p_scale(values)


def percentile_range(training_values: ArrayLike, *, log1p: bool = False) -> tuple[float, float]:
    """(p01, p99) of the finite training values (of ``log1p`` of them for log1p metrics)."""
    values = np.asarray(training_values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("no finite training values to take a percentile range from")
    if log1p:
        values = log1p_scale(values)
    low, high = np.percentile(values, PERCENTILES)
    return float(low), float(high)


def _span(value_range: tuple[float, float]) -> float:
    low, high = value_range
    span = float(high) - float(low)
    if not span > 0:
        raise ValueError(f"percentile range {value_range} is empty: the field cannot be normalised")
    return span


def mse(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Mean squared error (OPT: RGB values as given)."""
    y, p = _pair(reference, prediction)
    return float(np.mean((y - p) ** 2))


def nmae(reference: ArrayLike, prediction: ArrayLike, value_range: tuple[float, float]) -> float:
    """100 × mean absolute error ÷ (p99 − p01) of the training distribution."""
    y, p = _pair(reference, prediction)
    return float(100.0 * np.mean(np.abs(y - p)) / _span(value_range))


def nmse(reference: ArrayLike, prediction: ArrayLike, value_range: tuple[float, float]) -> float:
    """100 × mean squared error ÷ (p99 − p01)² of the training distribution."""
    y, p = _pair(reference, prediction)
    return float(100.0 * np.mean((y - p) ** 2) / _span(value_range) ** 2)


def log1p_nmae(
    reference: ArrayLike, prediction: ArrayLike, log1p_range: tuple[float, float]
) -> float:
    """NMAE of ``log1p`` values; ``log1p_range`` is ``percentile_range(train, log1p=True)``."""
    y, p = _pair(reference, prediction)
    return nmae(log1p_scale(y), log1p_scale(p), log1p_range)


def log1p_nmse(
    reference: ArrayLike, prediction: ArrayLike, log1p_range: tuple[float, float]
) -> float:
    """NMSE of ``log1p`` values; ``log1p_range`` is ``percentile_range(train, log1p=True)``."""
    y, p = _pair(reference, prediction)
    return nmse(log1p_scale(y), log1p_scale(p), log1p_range)


def macro_nmse(
    fields: Mapping[str, tuple[ArrayLike, ArrayLike]],
    ranges: Mapping[str, tuple[float, float]],
) -> float:
    """Mean over fields of each field's NMSE with its own range (HEAT, WTH, AQ)."""
    if not fields:
        raise ValueError("no fields to score")
    return float(np.mean([nmse(y, p, ranges[name]) for name, (y, p) in fields.items()]))


def macro_miou(
    reference: ArrayLike,
    prediction: ArrayLike,
    classes: Iterable[int] | None = None,
    valid: ArrayLike | None = None,
) -> float:
    """Mean over classes of intersection ÷ union of their pixels.

    ``classes`` defaults to those present in the reference or the prediction; a listed class
    absent from both is skipped (its IoU is undefined). ``valid`` masks pixels out.
    """
    y = np.asarray(reference)
    p = np.asarray(prediction)
    if y.shape != p.shape:
        raise ValueError(f"reference {y.shape} and prediction {p.shape} differ in shape")
    if valid is not None:
        keep = np.asarray(valid, dtype=bool)
        y, p = y[keep], p[keep]
    y, p = y.ravel(), p.ravel()
    wanted = np.union1d(y, p) if classes is None else np.asarray(list(classes))
    ious = []
    for c in wanted:
        in_y, in_p = y == c, p == c
        union = np.count_nonzero(in_y | in_p)
        if union:
            ious.append(np.count_nonzero(in_y & in_p) / union)
    if not ious:
        raise ValueError("no class present in the reference or the prediction")
    return float(np.mean(ious))


def skeleton(mask: ArrayLike) -> np.ndarray:
    """One-pixel-wide centrelines of a binary mask (Zhang–Suen thinning, 8-connected)."""
    image = np.pad(np.asarray(mask, dtype=bool), 1).astype(np.uint8)
    while True:
        changed = False
        for step in (0, 1):
            p = image
            # neighbours P2..P9, clockwise from north
            n = [
                p[:-2, 1:-1], p[:-2, 2:], p[1:-1, 2:], p[2:, 2:],
                p[2:, 1:-1], p[2:, :-2], p[1:-1, :-2], p[:-2, :-2],
            ]  # fmt: skip
            count = sum(x.astype(np.int32) for x in n)
            ring = [*n, n[0]]
            transitions = sum(
                ((a == 0) & (b == 1)).astype(np.int32) for a, b in itertools.pairwise(ring)
            )
            if step == 0:
                c1 = n[0] * n[2] * n[4]
                c2 = n[2] * n[4] * n[6]
            else:
                c1 = n[0] * n[2] * n[6]
                c2 = n[0] * n[4] * n[6]
            remove = (
                (p[1:-1, 1:-1] == 1)
                & (count >= 2)
                & (count <= 6)
                & (transitions == 1)
                & (c1 == 0)
                & (c2 == 0)
            )
            if remove.any():
                image[1:-1, 1:-1][remove] = 0
                changed = True
        if not changed:
            return image[1:-1, 1:-1].astype(bool)


def cldice(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Centreline Dice of binary masks (RD): harmonic mean of topology precision (share of the
    prediction's skeleton inside the reference) and sensitivity (share of the reference's
    skeleton inside the prediction). 1.0 when both are empty; 0.0 when only one is."""
    y = np.asarray(reference, dtype=bool)
    p = np.asarray(prediction, dtype=bool)
    if y.shape != p.shape:
        raise ValueError(f"reference {y.shape} and prediction {p.shape} differ in shape")
    if not y.any() and not p.any():
        return 1.0
    if not y.any() or not p.any():
        return 0.0
    skeleton_y, skeleton_p = skeleton(y), skeleton(p)
    precision = np.count_nonzero(skeleton_p & y) / max(np.count_nonzero(skeleton_p), 1)
    sensitivity = np.count_nonzero(skeleton_y & p) / max(np.count_nonzero(skeleton_y), 1)
    if precision + sensitivity == 0:
        return 0.0
    return float(2 * precision * sensitivity / (precision + sensitivity))


# ------------------------------------------------------------------------------ forecasting
# AgenticCity-Bench App. D: LST and carbon are judged by MAE in their units, property by MAPE (local
# currencies differ, so errors are compared as percentages); RMSE and R² supplement them. R²
# takes the reference mean of the evaluated group itself.


def mae(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Mean absolute error, in the reference's unit."""
    y, p = _pair(reference, prediction)
    return float(np.mean(np.abs(y - p)))


def mape(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Mean absolute percentage error, 100 · mean |y − ŷ| / |y| (references must not be 0)."""
    y, p = _pair(reference, prediction)
    if np.any(y == 0):
        raise ValueError("MAPE is undefined for a reference of 0")
    return float(100.0 * np.mean(np.abs(y - p) / np.abs(y)))


def rmse(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Root mean squared error, in the reference's unit."""
    y, p = _pair(reference, prediction)
    return float(np.sqrt(np.mean((y - p) ** 2)))


def r_squared(reference: ArrayLike, prediction: ArrayLike) -> float:
    """Coefficient of determination, 1 − Σ(y − ŷ)² / Σ(y − ȳ)²; NaN when every y is equal."""
    y, p = _pair(reference, prediction)
    total = float(np.sum((y - y.mean()) ** 2))
    if not total > 0:
        return float("nan")
    return 1.0 - float(np.sum((y - p) ** 2)) / total
