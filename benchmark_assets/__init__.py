"""Dagster assets of the translation benchmark, between the staged cube and its publication.

Thin wrappers over the pure core (``citycube.pairs``, ``citycube.splits``,
``citycube.sampling``, ``citycube.translation``, ``citycube.forecast``), in their own asset
group ``benchmark``: the translation track's inputs and the forecasting cases.
"""

from benchmark_assets.forecast import (
    FORECAST_CASES_KEY,
    FORECAST_SCORES_KEY,
    build_forecast_assets,
)
from benchmark_assets.translation import (
    INSTANCES_KEY,
    PAIRS_KEY,
    SPLITS_KEY,
    build_benchmark_assets,
)

__all__ = [
    "FORECAST_CASES_KEY",
    "FORECAST_SCORES_KEY",
    "INSTANCES_KEY",
    "PAIRS_KEY",
    "SPLITS_KEY",
    "build_benchmark_assets",
    "build_forecast_assets",
]
