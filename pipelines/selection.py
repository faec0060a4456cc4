"""Which asset partitions a selection of cities and years needs, across all partitionings."""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph

from pipelines.partitions import city_epoch_partitions, city_partitions, keys_for


def build_selection(
    asset_graph: BaseAssetGraph,
    cities: Iterable[str],
    years: Iterable[int],
    assets: Iterable[dg.AssetKey] | None = None,
) -> AssetGraphSubset:
    """The partitions of every asset (or of ``assets``) that the cities and years need.

    Static assets take the cities' partitions, epoch assets the epochs of the years, annual
    ones every city-year; unpartitioned cube assets are included whole.
    """
    cities, years = list(cities), list(years)
    keys = set(assets) if assets is not None else set(asset_graph.materializable_asset_keys)
    partitioned: dict[dg.AssetKey, object] = {}
    whole: set[dg.AssetKey] = set()
    for key in keys:
        partitions = asset_graph.get(key).partitions_def
        if partitions is None:
            whole.add(key)
            continue
        wanted = keys_for(partitions, cities, years)  # type: ignore[arg-type]
        partitioned[key] = partitions.subset_with_partition_keys(wanted)
    return AssetGraphSubset(
        partitions_subsets_by_asset_key=partitioned,  # type: ignore[arg-type]
        non_partitioned_asset_keys=whole,
    )


def source_periods_first(
    asset_graph: BaseAssetGraph, subset: AssetGraphSubset
) -> tuple[AssetGraphSubset, AssetGraphSubset]:
    """(the static and epoch assets' partitions, the rest) of a build's selection.

    Everything partitioned by city × year that reads a static or epoch product (its
    observations, a conversion series) can only join a run once that product is materialised.
    In one backfill with the rest, Dagster requests those assets in a second run per city after
    the first, each a process that loads the code; built first, every city-year asset of a city
    fits in one run.
    """
    ahead = {
        key
        for key in subset.asset_keys
        if asset_graph.get(key).partitions_def in (city_partitions, city_epoch_partitions)
    }
    first = subset.filter_asset_keys(ahead)
    return first, subset - first
