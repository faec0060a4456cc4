"""Translation metrics against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from citycube.tasks.metrics import (
    TARGET_METRICS,
    Metric,
    cldice,
    log1p_nmae,
    log1p_nmse,
    macro_miou,
    macro_nmse,
    metric_for,
    mse,
    nmae,
    nmse,
    percentile_range,
    skeleton,
)


def test_mse_by_hand() -> None:
    # errors 1, -2, 0, 3 -> squares 1, 4, 0, 9 -> mean 3.5
    assert mse([1, 2, 3, 4], [0, 4, 3, 1]) == pytest.approx(3.5)


def test_percentile_range_of_training_values() -> None:
    # 0..100: numpy's linear percentiles are exactly 1 and 99
    assert percentile_range(np.arange(101.0)) == pytest.approx((1.0, 99.0))
    assert percentile_range([np.nan, 0.0, 100.0, np.inf]) == pytest.approx((1.0, 99.0))
    low, high = percentile_range(np.arange(101.0), log1p=True)
    assert (low, high) == pytest.approx(tuple(np.percentile(np.log1p(np.arange(101.0)), [1, 99])))


def test_nmae_and_nmse_by_hand() -> None:
    # range 1..9 spans 8; errors 2, -2, 4: |e| mean 8/3, e² mean 24/3 = 8
    y, p = [10, 20, 30], [8, 22, 26]
    assert nmae(y, p, (1, 9)) == pytest.approx(100 * (8 / 3) / 8)
    assert nmse(y, p, (1, 9)) == pytest.approx(100 * 8 / 64)


def test_macro_nmse_weights_fields_equally() -> None:
    # field a: errors 1, 1 over span 2 -> 100 * 1 / 4 = 25
    # field b: errors 10, 30 over span 100 -> 100 * 500 / 10000 = 5
    fields = {"a": ([0, 0], [1, -1]), "b": ([0, 0], [10, 30])}
    ranges = {"a": (0.0, 2.0), "b": (-50.0, 50.0)}
    assert macro_nmse(fields, ranges) == pytest.approx((25 + 5) / 2)


def test_log1p_variants_compare_log1p_values() -> None:
    # log1p(e - 1) = 1, log1p(e**3 - 1) = 3: an error of 2 over a log range spanning 4
    y, p = [math.e - 1], [math.e**3 - 1]
    assert log1p_nmae(y, p, (0.0, 4.0)) == pytest.approx(100 * 2 / 4)
    assert log1p_nmse(y, p, (0.0, 4.0)) == pytest.approx(100 * 4 / 16)


def test_log1p_metrics_clip_every_value_at_zero_first() -> None:
    """One rule in every log1p path: a negative prediction scores as 0, never as NaN."""
    y = [0.0, math.e - 1, math.e**2 - 1]
    clipped = log1p_nmse(y, [0.0, 0.0, 0.0], (0.0, 2.0))
    assert log1p_nmse(y, [-2.0, -0.5, 0.0], (0.0, 2.0)) == pytest.approx(clipped)
    assert math.isfinite(log1p_nmae(y, [-2.0, 1.0, 1.0], (0.0, 2.0)))
    assert percentile_range([-3.0, 0.0, math.e - 1], log1p=True) == pytest.approx(
        percentile_range([0.0, 0.0, math.e - 1], log1p=True)
    )


def test_an_empty_range_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        nmae([1.0], [2.0], (5.0, 5.0))


def test_macro_miou_by_hand() -> None:
    y = np.array([[0, 0], [1, 2]])
    p = np.array([[0, 1], [1, 1]])
    # class 0: inter 1, union 2 -> 0.5; class 1: inter 1, union 3 -> 1/3; class 2: 0 / 1
    assert macro_miou(y, p) == pytest.approx((0.5 + 1 / 3 + 0) / 3)
    # a listed class absent from both is skipped; a mask drops pixels
    assert macro_miou(y, p, classes=[0, 1, 2, 7]) == pytest.approx((0.5 + 1 / 3 + 0) / 3)
    assert macro_miou(y, p, valid=[[True, False], [True, False]]) == pytest.approx(1.0)


def test_skeleton_of_a_bar_is_a_line_inside_it() -> None:
    bar = np.zeros((9, 12), bool)
    bar[3:6, 1:11] = True
    thin = skeleton(bar)
    assert thin.any() and (thin <= bar).all()
    assert thin.sum(axis=0).max() == 1  # one pixel wide across the bar


def test_cldice_by_hand() -> None:
    road = np.zeros((9, 12), bool)
    road[3:6, 1:11] = True
    assert cldice(road, road) == pytest.approx(1.0)
    assert cldice(np.zeros_like(road), np.zeros_like(road)) == 1.0
    assert cldice(road, np.zeros_like(road)) == 0.0
    # The prediction covers the left half of the road: its own skeleton lies inside the
    # reference (precision 1); it covers the share of the reference skeleton left of column 6.
    half = road.copy()
    half[:, 6:] = False
    reference_skeleton = skeleton(road)
    sensitivity = (reference_skeleton & half).sum() / reference_skeleton.sum()
    assert cldice(road, half) == pytest.approx(2 * sensitivity / (1 + sensitivity))
    # A road elsewhere shares no centreline
    other = np.zeros_like(road)
    other[7:9, :] = True
    assert cldice(road, other) == 0.0


def test_every_target_has_its_paper_metric() -> None:
    assert metric_for("OPT") == Metric.MSE and metric_for("BV") == Metric.LOG1P_NMAE
    assert {metric_for(c) for c in ("DEM", "NDVI", "HF")} == {Metric.NMAE}
    assert {metric_for(c) for c in ("HEAT", "WTH", "AQ")} == {Metric.MACRO_NMSE}
    log1p = {"CO2", "POP", "PROP", "ELEC", "NTL", "GPS"}
    assert {c for c, m in TARGET_METRICS.items() if m == Metric.LOG1P_NMSE} == log1p
    assert metric_for("RD") == Metric.CLDICE and metric_for("LU") == Metric.MACRO_MIOU
    assert metric_for("POI") == Metric.MACRO_MIOU
    with pytest.raises(KeyError):
        metric_for("XYZ")


def test_forecast_metrics_by_hand() -> None:
    from citycube.tasks.metrics import mae, mape, r_squared, rmse

    assert mae([1.0, 2.0, 3.0], [2.0, 2.0, 5.0]) == pytest.approx(1.0)  # (1 + 0 + 2) / 3
    assert mape([100.0, 200.0], [110.0, 180.0]) == pytest.approx(10.0)  # (10 % + 10 %) / 2
    assert mape([-50.0], [-45.0]) == pytest.approx(10.0)  # |y| in the denominator
    assert rmse([0.0, 0.0], [3.0, 4.0]) == pytest.approx(np.sqrt(12.5))
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 4.0]) == pytest.approx(0.5)  # 1 - 1 / 2
    assert r_squared([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == pytest.approx(0.0)  # the mean
    assert np.isnan(r_squared([2.0, 2.0], [1.0, 3.0]))  # no variance to explain
    with pytest.raises(ValueError, match="undefined"):
        mape([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="differ in shape"):
        mae([1.0, 2.0], [1.0])
