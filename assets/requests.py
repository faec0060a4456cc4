"""Requests for city-years, made from the Dagster UI: materialise a partition (city × year) of
``requests/city_year`` and the ``city_year_requests`` sensor builds everything it needs
(pipelines/schedules.py). The asset holds nothing but the request itself."""

import dagster as dg

from pipelines.partitions import city_year_partitions

REQUEST_KEY = dg.AssetKey(["requests", "city_year"])


@dg.asset(
    key=REQUEST_KEY,
    partitions_def=city_year_partitions,
    group_name="requests",
    kinds={"python"},
)
def city_year_request(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """Ask for city-years to be built: materialise their partitions (pick the cities and years
    in the launch dialog) and the city_year_requests sensor builds the static and 5-year
    products they read, their city × year partitions and then the cube, in order."""
    return dg.MaterializeResult(
        metadata={"requested": dg.MetadataValue.json(list(context.partition_keys))}
    )
