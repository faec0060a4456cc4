"""The yearly build: once a year has closed, build it for every city.

A year needs more than its city-year partitions: the static and epoch products it reads must be
materialised first (a city-year's observations refuse to run without them, CC303), and the cube
assets come last. The ``yearly_build`` sensor targets every asset and walks those three stages
with plain run requests, one run per partition of each partitioning:

1. ``sources``: the static (city) and epoch (city × epoch) partitions the year reads that are
   not materialised yet (after the first year, usually only a new epoch's);
2. ``city-years``: every city × year partition of the year;
3. ``cube``: the unpartitioned cube, benchmark and report assets, in one run.

Each evaluation reads the instance (which partitions are materialised, which of the stage's
runs are in flight or failed) and asks for the first stage that is not done; run keys make a
request that is already launched a no-op. Evaluating the sensor has no side effect ("Test
sensor" in the UI only shows what it would request); the sensor daemon launches the runs. A run
that failed stops the year where it is, with the failed runs named in the tick, until they are
re-executed. Once the cube run succeeds the cursor records the year, and the sensor waits for
the next 15 January.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date

import dagster as dg

from citycube.catalogue.cities import load_cities
from citycube.catalogue.temporal import last_closed_year, today
from pipelines.partitions import YEARS
from pipelines.selection import (
    PartitionsByKey,
    Selection,
    build_selection,
    is_empty,
    source_periods_first,
    unmaterialized,
)

SENSOR_NAME = "yearly_build"
INTERVAL_S = 900
"""Seconds between two evaluations: a stage's runs are followed within a quarter of an hour."""
YEAR_TAG = "citycube/yearly"
"""Tag of the yearly build's runs: the year they build."""
STAGE_TAG = "citycube/stage"
"""Tag of the yearly build's runs: their stage (``sources``, ``city-years`` or ``cube``)."""
STAGES = ("sources", "city-years", "cube")
DESCRIPTION = (
    "From 15 January, builds last year for every city: first the static and 5-year products "
    "the year reads that are not materialised yet, then every city-year partition, then the "
    "cube, benchmark and report assets (one run per partition; run keys keep each request to "
    "one run). A failed run holds the year until it is re-executed; the tick names it. The "
    "cursor is the last year built; a code location loaded before a year closed does not offer "
    "that year's partitions: reload it."
)
FAILED = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})


def year_due(on: date) -> int:
    """The latest closed year, whose build is due on ``on``."""
    return last_closed_year(on)


def year_stages(partitions: PartitionsByKey, year: int) -> list[tuple[str, Selection]]:
    """The three stages of a year's build, (name, asset partitions), in order."""
    selection = build_selection(partitions, load_cities(), [year])
    first, rest = source_periods_first(partitions, selection)
    per_year = {k: v for k, v in rest.items() if v is not None}
    cube = {k: v for k, v in rest.items() if v is None}
    return list(zip(STAGES, (first, per_year, cube), strict=True))


def run_requests(
    partitions: PartitionsByKey, year: int, stage: str, selection: Selection
) -> list[dg.RunRequest]:
    """One run request per partition key of each partitioning in ``selection`` (one for the
    unpartitioned assets), each keyed so that the sensor launches it once."""
    # Within a stage a partition key names one partitioning: a city (static), a city × epoch
    # (sources) or a city × year (city-years).
    groups: dict[str | None, list[dg.AssetKey]] = defaultdict(list)
    for key, keys in selection.items():
        for partition in (None,) if keys is None else keys:
            groups[partition].append(key)
    tags = {YEAR_TAG: str(year), STAGE_TAG: stage}
    return [
        dg.RunRequest(
            run_key=f"{year}:{stage}:{partition or 'all'}",
            asset_selection=sorted(keys, key=lambda k: k.to_user_string()),
            partition_key=partition,
            tags=tags,
        )
        for partition, keys in sorted(groups.items(), key=lambda g: g[0] or "")
    ]


@dataclass(frozen=True)
class StageRuns:
    """The runs of one stage of a year's build, as the instance records them."""

    in_flight: Sequence[str]
    failed: Sequence[str]
    succeeded: Sequence[str]


def stage_runs(instance: dg.DagsterInstance, year: int, stage: str) -> StageRuns:
    """Ids of the stage's runs that are in flight, failed or canceled, and succeeded."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={YEAR_TAG: str(year), STAGE_TAG: stage}))
    return StageRuns(
        in_flight=[r.run_id for r in runs if not r.is_finished],
        failed=[r.run_id for r in runs if r.status in FAILED],
        succeeded=[r.run_id for r in runs if r.status == dg.DagsterRunStatus.SUCCESS],
    )


def evaluate_year(
    instance: dg.DagsterInstance, partitions: PartitionsByKey, on: date, cursor: str | None
) -> dg.SensorResult | dg.SkipReason:
    """What the yearly build asks for on ``on``: the next stage's runs, or why nothing."""
    year = year_due(on)
    if cursor and int(cursor) >= year:
        return dg.SkipReason(
            f"{year} is built for every city; {year + 1} is due from 15 January {year + 2}"
        )
    if year not in YEARS:
        return dg.SkipReason(
            f"{year} is due but the loaded code offers the years {YEARS[0]}–{YEARS[-1]}: "
            "reload the code location (Deployment → Reload) to add it"
        )
    for stage, selection in year_stages(partitions, year):
        runs = stage_runs(instance, year, stage)
        if stage == "cube":
            wanted, done = selection, bool(runs.succeeded)
        else:
            wanted = unmaterialized(instance, partitions, selection)
            done = is_empty(wanted)
        if done:
            continue
        if runs.in_flight:
            return dg.SkipReason(
                f"{year}: waiting for {len(runs.in_flight)} run(s) of the {stage} stage"
            )
        if runs.failed:
            shown = ", ".join(runs.failed[:5]) + (" …" if len(runs.failed) > 5 else "")
            return dg.SkipReason(
                f"{year}: {len(runs.failed)} run(s) of the {stage} stage failed or were canceled "
                f"({shown}); re-execute them from the Runs page and the build goes on"
            )
        return dg.SensorResult(run_requests=run_requests(partitions, year, stage, wanted))
    return dg.SensorResult(
        skip_reason=dg.SkipReason(f"{year} is built for every city"), cursor=str(year)
    )


def build_yearly_build(
    partitions: PartitionsByKey, clock: Callable[[], date] = today
) -> dg.SensorDefinition:
    """The yearly sensor over the Definitions' assets (``partitions``: each asset's partitions
    definition, handed in by the Definitions that hold the sensor; ``clock``: today's date)."""

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=INTERVAL_S,
        asset_selection=dg.AssetSelection.all(),
        description=DESCRIPTION,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def yearly_build(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        return evaluate_year(context.instance, partitions, clock(), context.cursor)

    return yearly_build
