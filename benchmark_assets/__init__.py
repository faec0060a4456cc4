"""Dagster assets of the translation benchmark, downstream of the published cube.

Thin wrappers over the pure core (``citycube.pairs``, ``citycube.splits``,
``citycube.sampling``, ``citycube.translation``), in their own asset group ``benchmark``.
"""

from benchmark_assets.translation import (
    INSTANCES_KEY,
    PAIRS_KEY,
    SPLITS_KEY,
    build_benchmark_assets,
)

__all__ = ["INSTANCES_KEY", "PAIRS_KEY", "SPLITS_KEY", "build_benchmark_assets"]
