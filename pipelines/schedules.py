"""The yearly backfill: once a year has closed, build it for every city.

A year needs more than its city-year partitions (the epoch it falls in, the cube database), so
the request is an asset backfill over everything the year needs. Schedules can only start runs
of one job, so a sensor that checks the date once an hour asks for the backfill instead.

Dagster 1.13 has no public way for a sensor to *return* an asset backfill: a ``RunRequest``
that becomes one exists only as ``RunRequest.for_asset_graph_subset``, which takes Dagster's
private ``AssetGraphSubset`` (its docstring says it is left private on purpose), and a plain
``RunRequest`` is one run of one partition (range) of assets of one partitioning, with no
ordering between runs. The closest public mechanism is the one the UI and ``citycube build``
use: the sensor requests the backfill through Dagster's GraphQL API (``launchPartitionBackfill``
with ``partitionsByAssets``, run by ``dagster-graphql`` on workspace.yaml), then moves its
cursor on so it asks once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg

from citycube.catalogue.cities import load_cities
from citycube.catalogue.temporal import CALENDAR
from pipelines.graphql import DagsterGraphQL
from pipelines.selection import PartitionsByKey, Selection, build_selection

RELEASE_DAY = (1, 15)
"""(month, day) after which last year is built: most annual products are out by then."""
WORKSPACE_FILE = Path(__file__).resolve().parent.parent / "workspace.yaml"


def year_due(today: date) -> int:
    """The latest closed year whose build is due on ``today``."""
    return today.year - 1 if (today.month, today.day) >= RELEASE_DAY else today.year - 2


@dataclass(frozen=True)
class YearlyBackfill:
    """The backfill of one year for every city."""

    year: int
    selection: Selection
    tags: dict[str, str]

    @property
    def title(self) -> str:
        return f"yearly backfill of {self.year}"


def yearly_request(
    partitions: PartitionsByKey, today: date, cursor: str | None
) -> YearlyBackfill | dg.SkipReason:
    """The backfill for the year due, once (the cursor remembers the last one)."""
    year = year_due(today)
    if year not in CALENDAR:
        return dg.SkipReason(f"{year} is outside the {CALENDAR[0]}–{CALENDAR[-1]} calendar")
    if cursor and int(cursor) >= year:
        return dg.SkipReason(f"the backfill of {year} was already requested")
    selection = build_selection(partitions, load_cities(), [year])
    tags = {"citycube/trigger": "yearly_backfill", "citycube/year": str(year)}
    return YearlyBackfill(year, selection, tags)


def launch_yearly(
    backfill: YearlyBackfill, partitions: PartitionsByKey, graphql: DagsterGraphQL
) -> str:
    """Request the yearly backfill through Dagster's GraphQL API; its id."""
    return graphql.launch_backfill(
        backfill.selection,
        partitions,
        tags=backfill.tags,
        title=backfill.title,
        description=f"every city, {backfill.year}",
    )


def build_yearly_backfill(partitions: PartitionsByKey) -> dg.SensorDefinition:
    """The yearly sensor over the Definitions' assets (``partitions``: each asset's partitions
    definition, handed in by the Definitions that hold the sensor)."""

    @dg.sensor(name="yearly_backfill", minimum_interval_seconds=3600)
    def yearly_backfill(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        """From 15 January, backfill last year for every city (once per year)."""
        request = yearly_request(partitions, datetime.now(UTC).date(), context.cursor)
        if isinstance(request, dg.SkipReason):
            return request
        backfill_id = launch_yearly(request, partitions, DagsterGraphQL(WORKSPACE_FILE))
        context.log.info(f"requested backfill {backfill_id} of {request.year}")
        return dg.SensorResult(run_requests=[], cursor=str(request.year))

    return yearly_backfill
