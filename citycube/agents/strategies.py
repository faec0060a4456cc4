"""Forecasting rules on a ten-value history, shared by the scripted agent and the direct check.

``last_year`` and ``ten_year_mean`` are AgenticCity-Bench's baselines, computed exactly as
:func:`citycube.tasks.forecast.baseline_predictions` computes them. ``median_of_four`` is the
rule App. D's property example shows an agent using: the median of four local estimates (the
most recent value, the median of the last three, an AR(1) one-step forecast, an exponentially
weighted forecast with alpha 0.7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

EWMA_ALPHA = 0.7
"""Weight of the newest value in the exponentially weighted estimate."""


def last_year(history: Sequence[float]) -> float:
    """Period −1's value."""
    return float(history[-1])


def ten_year_mean(history: Sequence[float]) -> float:
    """The mean of periods −10…−1."""
    return float(np.mean(history))


def ar1_one_step(history: Sequence[float]) -> float:
    """One step of y_t = c + φ·y_(t−1) fitted by least squares on consecutive pairs.

    A flat lagged series has no slope to fit: the forecast is then the last value.
    """
    y = np.asarray(history, dtype=np.float64)
    x, z = y[:-1], y[1:]
    dx = x - x.mean()
    sxx = float(dx @ dx)
    if len(x) < 2 or sxx == 0.0:
        return float(y[-1])
    phi = float(dx @ (z - z.mean())) / sxx
    c = float(z.mean()) - phi * float(x.mean())
    return c + phi * float(y[-1])


def ewma(history: Sequence[float], alpha: float = EWMA_ALPHA) -> float:
    """Exponentially weighted level, started at the first value."""
    level = float(history[0])
    for v in history[1:]:
        level = alpha * float(v) + (1.0 - alpha) * level
    return level


def four_estimates(history: Sequence[float]) -> dict[str, float]:
    """The four local estimates of App. D's property example."""
    return {
        "most_recent": float(history[-1]),
        "median_last_three": float(np.median(np.asarray(history[-3:], dtype=np.float64))),
        "ar1_one_step": ar1_one_step(history),
        "ewma_0_7": ewma(history),
    }


def median_of_four(history: Sequence[float]) -> float:
    """The median of the four local estimates."""
    return float(np.median(np.asarray(list(four_estimates(history).values()))))


STRATEGIES: dict[str, Callable[[Sequence[float]], float]] = {
    "last_year": last_year,
    "ten_year_mean": ten_year_mean,
    "median_of_four": median_of_four,
}
"""The scripted agent's rules by name."""
