"""Automation: the yearly build of every city once a year has closed, and the build of the
city-years users request from the UI.

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

The ``city_year_requests`` sensor walks the same stages for the city-years a user requests from
the UI, as partitions of ``requests/city_year`` (assets/requests.py): Dagster's launch dialog
backfills from one partitioning only, so one launch of a request stands for the whole build.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date

import dagster as dg

from citycube.catalogue.cities import load_cities
from citycube.catalogue.temporal import last_closed_year, today
from pipelines.partitions import YEARS, city_year_partitions, split_key
from pipelines.selection import (
    PartitionsByKey,
    Selection,
    build_selection,
    is_empty,
    merged,
    source_periods_first,
    unmaterialized,
)

SENSOR_NAME = "yearly_build"
BUILT_SELECTION = dg.AssetSelection.all() - dg.AssetSelection.groups("requests")
"""What the sensors build: every asset but the requests users make."""
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


def stages_for(
    partitions: PartitionsByKey, city_years: Iterable[tuple[str, int]]
) -> list[tuple[str, Selection]]:
    """The three stages of building some city-years, (name, asset partitions), in order."""
    selection = merged(*(build_selection(partitions, [c], [y]) for c, y in city_years))
    first, rest = source_periods_first(partitions, selection)
    per_year = {k: v for k, v in rest.items() if v is not None}
    cube = {k: v for k, v in rest.items() if v is None}
    return list(zip(STAGES, (first, per_year, cube), strict=True))


def year_stages(partitions: PartitionsByKey, year: int) -> list[tuple[str, Selection]]:
    """The three stages of a year's build for every city."""
    return stages_for(partitions, [(city, year) for city in load_cities()])


def run_requests(
    partitions: PartitionsByKey,
    tags: Mapping[str, str],
    key_prefix: str,
    stage: str,
    selection: Selection,
) -> list[dg.RunRequest]:
    """One run request per partition key of each partitioning in ``selection`` (one for the
    unpartitioned assets), each keyed so that the sensor launches it once."""
    # Within a stage a partition key names one partitioning: a city (static), a city × epoch
    # (sources) or a city × year (city-years).
    groups: dict[str | None, list[dg.AssetKey]] = defaultdict(list)
    for key, keys in selection.items():
        for partition in (None,) if keys is None else keys:
            groups[partition].append(key)
    return [
        dg.RunRequest(
            run_key=f"{key_prefix}:{stage}:{partition or 'all'}",
            asset_selection=sorted(keys, key=lambda k: k.to_user_string()),
            partition_key=partition,
            tags={**tags, STAGE_TAG: stage},
        )
        for partition, keys in sorted(groups.items(), key=lambda g: g[0] or "")
    ]


@dataclass(frozen=True)
class StageRuns:
    """The runs of one stage of a build, as the instance records them."""

    in_flight: Sequence[str]
    failed: Sequence[str]
    succeeded: Sequence[str]


def stage_runs(instance: dg.DagsterInstance, tags: Mapping[str, str], stage: str) -> StageRuns:
    """Ids of the stage's runs that are in flight, failed or canceled, and succeeded."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={**tags, STAGE_TAG: stage}))
    return StageRuns(
        in_flight=[r.run_id for r in runs if not r.is_finished],
        failed=[r.run_id for r in runs if r.status in FAILED],
        succeeded=[r.run_id for r in runs if r.status == dg.DagsterRunStatus.SUCCESS],
    )


def next_stage(
    instance: dg.DagsterInstance,
    partitions: PartitionsByKey,
    stages: Sequence[tuple[str, Selection]],
    tags: Mapping[str, str],
    key_prefix: str,
    what: str,
) -> list[dg.RunRequest] | dg.SkipReason | None:
    """The runs of the first stage that is not done, why nothing is asked for now, or None
    when every stage is done. A stage is done when its partitions are materialised (the
    cube's: when a run of it with ``tags`` succeeded)."""
    for stage, selection in stages:
        runs = stage_runs(instance, tags, stage)
        if stage == "cube":
            wanted, done = selection, bool(runs.succeeded) or is_empty(selection)
        else:
            wanted = unmaterialized(instance, partitions, selection)
            done = is_empty(wanted)
        if done:
            continue
        if runs.in_flight:
            return dg.SkipReason(
                f"{what}: waiting for {len(runs.in_flight)} run(s) of the {stage} stage"
            )
        if runs.failed:
            shown = ", ".join(runs.failed[:5]) + (" …" if len(runs.failed) > 5 else "")
            return dg.SkipReason(
                f"{what}: {len(runs.failed)} run(s) of the {stage} stage failed or were "
                f"canceled ({shown}); re-execute them from the Runs page and the build goes on"
            )
        return run_requests(partitions, tags, key_prefix, stage, wanted)
    return None


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
    stages = year_stages(partitions, year)
    step = next_stage(instance, partitions, stages, {YEAR_TAG: str(year)}, str(year), str(year))
    if step is None:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"{year} is built for every city"), cursor=str(year)
        )
    if isinstance(step, dg.SkipReason):
        return step
    return dg.SensorResult(run_requests=step)


def build_yearly_build(
    partitions: PartitionsByKey, clock: Callable[[], date] = today
) -> dg.SensorDefinition:
    """The yearly sensor over the Definitions' assets (``partitions``: each asset's partitions
    definition, handed in by the Definitions that hold the sensor; ``clock``: today's date)."""

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=INTERVAL_S,
        asset_selection=BUILT_SELECTION,
        description=DESCRIPTION,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def yearly_build(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        return evaluate_year(context.instance, partitions, clock(), context.cursor)

    return yearly_build


REQUESTS_SENSOR = "city_year_requests"
REQUEST_TAG = "citycube/request"
"""Tag of the runs that build a request: the run id of the request."""
REQUESTS_INTERVAL_S = 5
"""Seconds between two evaluations (the sensor daemon's own loop): a stage's runs follow the
last one's within seconds."""
REQUESTS_DESCRIPTION = (
    "Builds the city-years materialised as partitions of requests/city_year: the static and "
    "5-year products they read that are not materialised yet, then their city × year "
    "partitions, then the cube, benchmark and report assets (one run per partition, run keys "
    "keep each request to one run). Requests made together are built together; later ones "
    "wait for them. A failed run holds the request until it is re-executed; the tick names it."
)


@dataclass(frozen=True)
class RequestQueue:
    """The sensor's cursor: the last request event read, the batch being built, the rest."""

    after: int = -1
    batch_id: str = ""
    batch: tuple[str, ...] = ()
    queued: tuple[tuple[str, str], ...] = ()
    """(request id, partition key) read after the batch started."""

    def to_json(self) -> str:
        return json.dumps(
            {"after": self.after, "id": self.batch_id, "batch": self.batch, "queued": self.queued}
        )

    @classmethod
    def from_json(cls, text: str | None) -> RequestQueue:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            data["after"],
            data["id"],
            tuple(data["batch"]),
            tuple((i, k) for i, k in data["queued"]),
        )


def city_year_of(key: str) -> tuple[str, int]:
    """(city, year) of a city × year partition key."""
    city, year = split_key(city_year_partitions, key)
    return city, int(year or 0)


def evaluate_requests(
    instance: dg.DagsterInstance,
    partitions: PartitionsByKey,
    request_key: dg.AssetKey,
    cursor: str | None,
) -> dg.SensorResult | dg.SkipReason:
    """What the request sensor asks for: the next stage of the batch of requests being built."""
    queue = RequestQueue.from_json(cursor)
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=request_key, after_storage_id=queue.after),
        limit=1000,
        ascending=True,
    ).records
    queued = list(queue.queued)
    after = queue.after
    for record in records:
        after = max(after, record.storage_id)
        key = record.partition_key
        if key and (record.run_id, key) not in queued:
            queued.append((record.run_id, key))
    batch_id, batch = queue.batch_id, queue.batch
    if not batch and queued:  # every request read so far is built together
        batch_id, batch = queued[0][0], tuple(sorted({k for _, k in queued}))
        queued = []
    if not batch:
        return dg.SensorResult(
            skip_reason=dg.SkipReason("no city-year requested"),
            cursor=RequestQueue(after).to_json(),
        )
    stages = stages_for(partitions, [city_year_of(k) for k in batch])
    what = f"request {', '.join(batch[:4])}{' …' if len(batch) > 4 else ''}"
    step = next_stage(instance, partitions, stages, {REQUEST_TAG: batch_id}, batch_id, what)
    if step is None:  # built: the next batch starts at the next evaluation
        done = RequestQueue(after, queued=tuple(queued))
        return dg.SensorResult(skip_reason=dg.SkipReason(f"{what} is built"), cursor=done.to_json())
    state = RequestQueue(after, batch_id, batch, tuple(queued)).to_json()
    if isinstance(step, dg.SkipReason):
        return dg.SensorResult(skip_reason=step, cursor=state)
    return dg.SensorResult(run_requests=step, cursor=state)


def build_city_year_requests(
    partitions: PartitionsByKey, request_key: dg.AssetKey
) -> dg.SensorDefinition:
    """The sensor that builds what users request through ``request_key``."""

    @dg.sensor(
        name=REQUESTS_SENSOR,
        minimum_interval_seconds=REQUESTS_INTERVAL_S,
        asset_selection=BUILT_SELECTION,
        description=REQUESTS_DESCRIPTION,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def city_year_requests(
        context: dg.SensorEvaluationContext,
    ) -> dg.SensorResult | dg.SkipReason:
        return evaluate_requests(context.instance, partitions, request_key, context.cursor)

    return city_year_requests
