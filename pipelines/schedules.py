"""The yearly backfill: once a year has closed, build it for every city.

A year needs more than its city-year partitions (the epoch it falls in, the cube database), so
the request is an asset backfill over everything the year needs. Schedules can only start runs
of one job, so a sensor that checks the date once an hour asks for the backfill instead.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import dagster as dg

from citycube.catalogue.cities import load_cities
from citycube.catalogue.temporal import CALENDAR
from pipelines.selection import build_selection

RELEASE_DAY = (1, 15)
"""(month, day) after which last year is built: most annual products are out by then."""


def year_due(today: date) -> int:
    """The latest closed year whose build is due on ``today``."""
    return today.year - 1 if (today.month, today.day) >= RELEASE_DAY else today.year - 2


def yearly_request(
    asset_graph: object, today: date, cursor: str | None
) -> dg.SensorResult | dg.SkipReason:
    """The backfill request for the year due, once (the cursor remembers the last one)."""
    year = year_due(today)
    if year not in CALENDAR:
        return dg.SkipReason(f"{year} is outside the {CALENDAR[0]}–{CALENDAR[-1]} calendar")
    if cursor and int(cursor) >= year:
        return dg.SkipReason(f"the backfill of {year} was already requested")
    subset = build_selection(asset_graph, load_cities(), [year])  # type: ignore[arg-type]
    request = dg.RunRequest.for_asset_graph_subset(
        subset, tags={"citycube/trigger": "yearly_backfill", "citycube/year": str(year)}
    )
    return dg.SensorResult(run_requests=[request], cursor=str(year))


@dg.sensor(name="yearly_backfill", minimum_interval_seconds=3600)
def yearly_backfill(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    """From 15 January, backfill last year for every city (once per year)."""
    graph = context.repository_def.asset_graph  # type: ignore[union-attr]
    return yearly_request(graph, datetime.now(UTC).date(), context.cursor)
