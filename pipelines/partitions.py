"""Partitions, defined once: city × year for annual work, city for static sources."""

from __future__ import annotations

import dagster as dg

from citycube.cities import load_cities
from citycube.temporal import CALENDAR

CITY = "city"
YEAR = "year"

city_partitions = dg.StaticPartitionsDefinition(list(load_cities()))
year_partitions = dg.StaticPartitionsDefinition([str(y) for y in CALENDAR])
city_year_partitions = dg.MultiPartitionsDefinition({CITY: city_partitions, YEAR: year_partitions})


def city_year_key(city: str, year: int) -> dg.MultiPartitionKey:
    """The partition key of one city-year."""
    return dg.MultiPartitionKey({CITY: city, YEAR: str(year)})


def split_key(context: dg.AssetExecutionContext) -> tuple[str, int | None]:
    """(city, year) of the running partition; year is None for city-only partitions."""
    key = context.partition_key
    if isinstance(key, dg.MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims[CITY], int(dims[YEAR])
    return str(key), None
