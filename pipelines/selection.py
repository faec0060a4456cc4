"""Which asset partitions a selection of cities and years needs, across all partitionings.

A selection maps each asset key to the partition keys wanted (``None`` for an unpartitioned
asset, taken whole): what ``launchPartitionBackfill`` is sent (pipelines/graphql.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import dagster as dg

from pipelines.partitions import city_epoch_partitions, city_partitions, keys_for

Selection = dict[dg.AssetKey, tuple[str, ...] | None]
"""Asset key → the partition keys to build (``None``: an unpartitioned asset)."""
PartitionsByKey = Mapping[dg.AssetKey, dg.PartitionsDefinition | None]
"""Asset key → its partitions definition (``None``: unpartitioned)."""


REQUESTS_GROUP = "requests"
"""Assets that record what users ask for from the UI; a build never builds them."""


def partitions_by_key(defs: dg.Definitions) -> dict[dg.AssetKey, dg.PartitionsDefinition | None]:
    """The partitions definition of every asset of ``defs`` that a build builds (all but the
    requests)."""
    return {
        spec.key: spec.partitions_def
        for spec in defs.resolve_all_asset_specs()
        if spec.group_name != REQUESTS_GROUP
    }


def build_selection(
    partitions: PartitionsByKey,
    cities: Iterable[str],
    years: Iterable[int],
    assets: Iterable[dg.AssetKey] | None = None,
) -> Selection:
    """The partitions of every asset (or of ``assets``) that the cities and years need.

    Static assets take the cities' partitions, epoch assets the epochs of the years, annual
    ones every city-year; unpartitioned cube assets are included whole.
    """
    cities, years = list(cities), list(years)
    keys = set(assets) if assets is not None else set(partitions)
    selection: Selection = {}
    for key in sorted(keys, key=lambda k: k.to_user_string()):
        partitions_def = partitions[key]
        if partitions_def is None:
            selection[key] = None
        else:
            selection[key] = tuple(keys_for(partitions_def, cities, years))  # type: ignore[arg-type]
    return selection


def source_periods_first(
    partitions: PartitionsByKey, selection: Selection
) -> tuple[Selection, Selection]:
    """(the static and epoch assets' partitions, the rest) of a build's selection.

    Everything partitioned by city × year that reads a static or epoch product (its
    observations, a conversion series) can only join a run once that product is materialised.
    In one backfill with the rest, Dagster requests those assets in a second run per city after
    the first, each a process that loads the code; built first, every city-year asset of a city
    fits in one run.
    """
    ahead = (city_partitions, city_epoch_partitions)
    first = {k: v for k, v in selection.items() if partitions[k] in ahead}
    rest = {k: v for k, v in selection.items() if k not in first}
    return first, rest


def is_empty(selection: Selection) -> bool:
    """True when a selection holds no partition and no unpartitioned asset."""
    return not any(keys is None or keys for keys in selection.values())


def merged(*selections: Selection) -> Selection:
    """Every partition of any of ``selections``."""
    out: dict[dg.AssetKey, set[str] | None] = {}
    for selection in selections:
        for key, keys in selection.items():
            if keys is None or (key in out and out[key] is None):  # all of them
                out[key] = None
            else:
                out[key] = set(out.get(key) or ()) | set(keys)
    return {k: None if v is None else tuple(sorted(v)) for k, v in out.items()}


def unmaterialized(
    instance: dg.DagsterInstance, partitions: PartitionsByKey, selection: Selection
) -> Selection:
    """The partitions of ``selection`` that have no materialisation (e.g. their run failed)."""
    left: Selection = {}
    for key, keys in selection.items():
        partitions_def = partitions[key]
        if keys is None or partitions_def is None:
            if instance.get_latest_materialization_event(key) is None:
                left[key] = None
            continue
        status = instance.get_status_by_partition(key, list(keys), partitions_def)
        if missing := _not_materialized(keys, status):
            left[key] = missing
    return left


def _not_materialized(keys: Sequence[str], status: Mapping[str, object] | None) -> tuple[str, ...]:
    status = status or {}
    return tuple(k for k in keys if getattr(status.get(k), "value", None) != "MATERIALIZED")
