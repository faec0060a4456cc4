"""Backfill requests through Dagster's GraphQL API: a selection of partitions of the city,
city × epoch and city × year partitionings (and unpartitioned assets) arrives whole, and only
it."""

from __future__ import annotations

import dagster as dg
import pytest

from pipelines.definitions import defs
from pipelines.graphql import key_ranges, partitions_by_assets
from pipelines.partitions import city_epoch_partitions, city_partitions, city_year_partitions
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
    everything = {OPT: None}
    assert merged(everything, {OPT: ("Boston|2020",)}) == everything  # all stays all
    assert merged({OPT: ("Boston|2020",)}, everything) == everything
    selectors = {
        tuple(s["assetKey"]["path"]): s["partitions"]
        for s in partitions_by_assets(selection, partitions)
    }
    assert selectors[("cube", "database")] is None  # the whole unpartitioned asset
    # Amsterdam|2020 and Amsterdam|2024 are not neighbours in the city × year ordering.
    opt_ranges = selectors[("modalities", "opt")]["ranges"]
    assert {"start": "Amsterdam|2020", "end": "Amsterdam|2020"} in opt_ranges
    assert len(opt_ranges) == 4


def test_what_a_build_made_counts_not_what_an_earlier_build_made() -> None:
    """A second release built on the same DAGSTER_HOME waits for its own cube, not the first's:
    what is missing is read from the runs of the build's own backfill."""
    import io

    from pipelines.build import BACKFILL_TAG, ProgressPrinter

    years = dg.StaticPartitionsDefinition(["2020", "2021"])

    @dg.asset
    def cube_database() -> None:
        return None

    @dg.asset
    def cube_manifest() -> None:
        return None

    @dg.asset(partitions_def=years)
    def observations() -> None:
        return None

    instance = dg.DagsterInstance.ephemeral()
    key, other, yearly = cube_database.key, cube_manifest.key, observations.key
    everything = [cube_database, cube_manifest, observations]
    for year in ("2020", "2021"):  # an earlier build, by another backfill
        assert dg.materialize(
            everything, instance=instance, partition_key=year, tags={BACKFILL_TAG: "earlier"}
        ).success
    selection = {key: None, other: None, yearly: ("2020", "2021")}
    printer = ProgressPrinter(instance, io.StringIO())
    printer.follow("this")
    printer.poll()
    assert printer.missing(selection) == selection

    def this_build(assets: list[dg.AssetsDefinition], year: str | None = None) -> None:
        tags = {BACKFILL_TAG: "this"}
        assert dg.materialize(assets, instance=instance, partition_key=year, tags=tags).success
        printer.poll()

    this_build([cube_database])
    assert printer.missing(selection) == {other: None, yearly: ("2020", "2021")}
    this_build([observations], "2021")
    assert printer.missing(selection) == {other: None, yearly: ("2020",)}
    this_build([cube_manifest, observations], "2020")
    assert printer.missing(selection) == {}
    printer.follow("next")  # the next backfill starts from nothing
    assert printer.missing({key: None}) == {key: None}


def test_a_fetch_only_build_leaves_out_the_sources_that_read_the_cube(tmp_path) -> None:
    """`--assets sources` on a data root with no cube: the planning tasks' sources, which
    fetch for the staged cube's cities, are left out (they could only fail); once a cube is
    staged the same selection takes them."""
    from assets.cube import STAGED_DATABASE_KEY
    from assets.tasks.ev_charging import EV_SOURCE_KEY
    from citycube.cube.release import Release
    from pipelines.build import BuildRequest, backfill_phases, cube_readers_left_out

    request = BuildRequest(
        cities=["Boston"], years=[2020], release="r", data_root=str(tmp_path), workers=1,
        assets=["sources"],
    )  # fmt: skip
    left_out = cube_readers_left_out(request)
    assert EV_SOURCE_KEY in left_out
    phased = {key for _, selection in backfill_phases(request) for key in selection}
    assert phased and not phased & set(left_out)
    assert all(key.path[0] == "sources" for key in phased)

    everything = BuildRequest(**{**request.__dict__, "assets": []})
    assert cube_readers_left_out(everything) == []  # the cube is built first, then they run
    with_cube = BuildRequest(**{**request.__dict__, "assets": ["sources", "cube"]})
    assert cube_readers_left_out(with_cube) == []
    assert STAGED_DATABASE_KEY in {k for _, s in backfill_phases(with_cube) for k in s}

    staged = Release(tmp_path, "r").staged_duckdb_file
    staged.parent.mkdir(parents=True)
    staged.touch()
    assert cube_readers_left_out(request) == []
