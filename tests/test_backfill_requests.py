"""Backfill requests through Dagster's GraphQL API: a selection of partitions of the city,
city × epoch and city × year partitionings (and unpartitioned assets) arrives whole, and only
it; the yearly sensor asks for the same backfill as a build of that year would."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from pipelines.definitions import defs
from pipelines.graphql import DagsterGraphQL, key_ranges, partitions_by_assets
from pipelines.instance import ensure_dagster_home
from pipelines.partitions import city_epoch_partitions, city_partitions, city_year_partitions
from pipelines.schedules import WORKSPACE_FILE, launch_yearly, year_due, yearly_request
from pipelines.selection import (
    build_selection,
    merged,
    partitions_by_key,
    source_periods_first,
)

OPT, POP = dg.AssetKey(["modalities", "opt"]), dg.AssetKey(["derived", "pop"])
DATABASE = dg.AssetKey(["cube", "database"])


def test_key_ranges_are_runs_of_consecutive_keys() -> None:
    ordered = ["a", "b", "c", "d", "e", "f"]
    assert key_ranges(ordered, ["b", "c", "d"]) == [("b", "d")]
    assert key_ranges(ordered, ["f", "a", "c", "d"]) == [("a", "a"), ("c", "d"), ("f", "f")]
    assert key_ranges(ordered, []) == []
    with pytest.raises(ValueError, match="not in the partitions definition"):
        key_ranges(ordered, ["z"])


def test_a_selection_spans_every_partitioning_and_splits_into_two_phases() -> None:
    partitions = partitions_by_key(defs)
    selection = build_selection(partitions, ["Amsterdam", "Boston"], [2020, 2024])
    kinds = {partitions[key] for key in selection}
    assert {city_partitions, city_epoch_partitions, city_year_partitions, None} <= kinds
    assert selection[DATABASE] is None
    assert sorted(selection[OPT]) == [
        "Amsterdam|2020",
        "Amsterdam|2024",
        "Boston|2020",
        "Boston|2024",
    ]
    first, rest = source_periods_first(partitions, selection)
    assert {partitions[k] for k in first} == {city_partitions, city_epoch_partitions}
    assert DATABASE in rest and OPT in rest and not set(first) & set(rest)
    assert merged(first, rest) == selection
    selectors = {
        tuple(s["assetKey"]["path"]): s["partitions"]
        for s in partitions_by_assets(selection, partitions)
    }
    assert selectors[("cube", "database")] is None  # the whole unpartitioned asset
    # Amsterdam|2020 and Amsterdam|2024 are not neighbours in the city × year ordering.
    opt_ranges = selectors[("modalities", "opt")]["ranges"]
    assert {"start": "Amsterdam|2020", "end": "Amsterdam|2020"} in opt_ranges
    assert len(opt_ranges) == 4


def test_the_yearly_sensor_requests_last_years_backfill_through_graphql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launched with ``dagster-graphql`` on workspace.yaml, the backfill Dagster stores
    targets exactly the year's partitions of every city, and the cube."""
    from dagster._core.instance.ref import InstanceRef

    home = ensure_dagster_home(tmp_path / "home")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    partitions = partitions_by_key(defs)
    assert year_due(dt.date(2025, 1, 14)) == 2023 and year_due(dt.date(2025, 1, 15)) == 2024
    request = yearly_request(partitions, dt.date(2025, 1, 15), cursor=None)
    assert not isinstance(request, dg.SkipReason)
    assert isinstance(yearly_request(partitions, dt.date(2025, 6, 1), "2024"), dg.SkipReason)

    backfill_id = launch_yearly(request, partitions, DagsterGraphQL(WORKSPACE_FILE))

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        backfill = instance.get_backfill(backfill_id)
        target = backfill.asset_backfill_data.target_subset
    assert backfill.status.value == "REQUESTED"
    assert backfill.tags["citycube/year"] == "2024"
    opt = target.get_partitions_subset(OPT).get_partition_keys()
    assert len(opt) == 16 and all(k.endswith("|2024") for k in opt)
    pop = target.get_partitions_subset(POP).get_partition_keys()
    assert sorted(pop)[0] == "Amsterdam|2020"  # 2024's epoch
    assert DATABASE in target.non_partitioned_asset_keys
    for key, keys in request.selection.items():
        if keys is not None:
            assert set(target.get_partitions_subset(key).get_partition_keys()) == set(keys)
    assert target.num_partitions_and_non_partitioned_assets == sum(
        1 if keys is None else len(keys) for keys in request.selection.values()
    )
