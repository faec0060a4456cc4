"""The analysis tool profile: trend estimation, summary statistics and time-series diagnostics
on a short series, as Earth-Agent's Analysis and Statistics tool kits give them.

They take the numbers an agent already read (from get_history or read_table), so they reach no
data of their own and cannot leak any.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from citycube.agents.strategies import ar1_one_step, four_estimates
from citycube.errors import AgentCaseError

MAX_VALUES = 10_000
"""Longest series the analysis tools take."""


def _series(values: Sequence[Any], minimum: int) -> np.ndarray:
    if not isinstance(values, list | tuple) or not values:
        raise AgentCaseError("values must be a non-empty list of numbers")
    if len(values) > MAX_VALUES:
        raise AgentCaseError(f"values has {len(values)} numbers; at most {MAX_VALUES} are taken")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise AgentCaseError("values must all be numbers (no text, null or booleans)")
    y = np.asarray(values, dtype=np.float64)
    if not np.isfinite(y).all():
        raise AgentCaseError("values must be finite numbers: drop unavailable periods first")
    if len(y) < minimum:
        raise AgentCaseError(f"this tool needs at least {minimum} values, got {len(y)}")
    return y


def _x(periods: Sequence[Any] | None, n: int) -> np.ndarray:
    if periods is None:
        return np.arange(-n, 0, dtype=np.float64)
    if len(periods) != n:
        raise AgentCaseError(f"periods has {len(periods)} entries for {n} values")
    return np.asarray(periods, dtype=np.float64)


def summary_statistics(values: Sequence[Any]) -> dict[str, Any]:
    """Count, mean, standard deviation, quantiles, skewness of a series."""
    y = _series(values, 1)
    sd = float(y.std(ddof=1)) if len(y) > 1 else 0.0
    skew = float(np.mean(((y - y.mean()) / y.std()) ** 3)) if y.std() > 0 else 0.0
    q = np.quantile(y, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {
        "n": len(y),
        "mean": float(y.mean()),
        "std": sd,
        "min": float(q[0]),
        "q25": float(q[1]),
        "median": float(q[2]),
        "q75": float(q[3]),
        "max": float(q[4]),
        "skewness": skew,
    }


def trend_estimate(values: Sequence[Any], periods: Sequence[Any] | None = None) -> dict[str, Any]:
    """Least-squares line, Sen's slope and the Mann–Kendall S statistic of a series
    (``periods`` default to −n…−1), with the line's value at period 0."""
    y = _series(values, 3)
    x = _x(periods, len(y))
    slope, intercept = np.polyfit(x, y, 1)
    fitted = slope * x + intercept
    ss_tot = float(((y - y.mean()) ** 2).sum())
    pairs = [(j, i) for i in range(len(y)) for j in range(i)]
    sen = float(np.median([(y[i] - y[j]) / (x[i] - x[j]) for j, i in pairs if x[i] != x[j]]))
    s = int(sum(np.sign(y[i] - y[j]) for j, i in pairs))
    n = len(y)
    var_s = n * (n - 1) * (2 * n + 5) / 18.0
    z = 0.0 if s == 0 else (s - np.sign(s)) / np.sqrt(var_s)
    return {
        "n": n,
        "ols_slope_per_period": float(slope),
        "ols_intercept_at_period_0": float(intercept),
        "r2": float(1.0 - ((y - fitted) ** 2).sum() / ss_tot) if ss_tot > 0 else None,
        "sen_slope_per_period": sen,
        "mann_kendall_s": s,
        "mann_kendall_z": float(z),
    }


def time_series_diagnostics(values: Sequence[Any]) -> dict[str, Any]:
    """Lag-1 autocorrelation, first differences, the AR(1) one-step forecast and the four
    local estimates of AgenticCity-Bench App. D's property example."""
    y = _series(values, 3)
    d = np.diff(y)
    dev = y - y.mean()
    denom = float(dev @ dev)
    acf1 = float(dev[:-1] @ dev[1:]) / denom if denom > 0 else None
    return {
        "n": len(y),
        "lag1_autocorrelation": acf1,
        "first_differences": [float(v) for v in d],
        "mean_first_difference": float(d.mean()),
        "largest_absolute_change": float(np.abs(d).max()),
        "ar1_one_step": ar1_one_step(y.tolist()),
        "local_estimates": four_estimates(y.tolist()),
    }
