"""Scheduled yearly backfill: one run per city for the year that has just closed."""

import dagster as dg

from assets.modalities import modality_assets
from assets.reports import quicklooks
from assets.sources import source_assets
from citycube.cities import load_cities
from citycube.temporal import CALENDAR
from pipelines.partitions import city_year_key, city_year_partitions

city_year_assets = [
    a
    for a in [*source_assets, *modality_assets, quicklooks]
    if a.partitions_def == city_year_partitions
]

city_year_job = dg.define_asset_job(
    "city_year_job",
    selection=dg.AssetSelection.assets(*city_year_assets),
    description="Fetch sources and build every processed modality for one city-year.",
)


@dg.schedule(cron_schedule="0 3 15 1 *", job=city_year_job, execution_timezone="UTC")
def yearly_backfill(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
    """On 15 January, build last year's partition for every city (if it is in the calendar)."""
    year = context.scheduled_execution_time.year - 1
    if year not in CALENDAR:
        return dg.SkipReason(f"{year} is outside the {CALENDAR[0]}–{CALENDAR[-1]} calendar")
    return [
        dg.RunRequest(run_key=f"{city}-{year}", partition_key=city_year_key(city, year))
        for city in load_cities()
    ]
