"""Dagster assets of the translation benchmark, between the staged cube and its publication.

Thin wrappers over the pure core (``citycube.tasks.pairs``, ``citycube.tasks.splits``,
``citycube.tasks.sampling``, ``citycube.tasks.translation``, ``citycube.tasks.forecast``), in their
own asset group ``benchmark``: the translation track's inputs and the forecasting cases; and
the representation evaluation of the built-in embeddings (``citycube.represent``), in group
``represent``, downstream of the published cube.
"""

from assets.tasks.forecast import (
    FORECAST_CASES_KEY,
    FORECAST_SCORES_KEY,
    build_forecast_assets,
)
from assets.tasks.represent import REPRESENT_KEY, build_represent_assets
from assets.tasks.translation import (
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
    "REPRESENT_KEY",
    "SPLITS_KEY",
    "build_benchmark_assets",
    "build_forecast_assets",
    "build_represent_assets",
]
