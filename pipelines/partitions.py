"""Partitions, defined once: by city (static), city × epoch and city × year.

Work is partitioned by the period its source publishes, so each result is computed once by one
writer: static products per city, 5-year products per city × epoch, annual and snapshot
products per city × year. Observations are per city × year and reach their source period
through the partition mappings below.

The years are those of the open calendar on the day the code is loaded: the paper's 2000–2025
and every year closed since (a year closes on 15 January of the next), so a code location
loaded (or reloaded) after 15 January 2027 offers 2026.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import dagster as dg

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import Temporal
from citycube.catalogue.temporal import epoch_of, epochs_of, open_calendar

CITY = "city"
YEAR = "year"
EPOCH = "epoch"

YEARS: tuple[int, ...] = open_calendar()
"""The years the partitions offer: the open calendar on the day the code was loaded."""
city_partitions = dg.StaticPartitionsDefinition(list(load_cities()))
year_partitions = dg.StaticPartitionsDefinition([str(y) for y in YEARS])
epoch_partitions = dg.StaticPartitionsDefinition([str(e) for e in epochs_of(YEARS)])
city_year_partitions = dg.MultiPartitionsDefinition({CITY: city_partitions, YEAR: year_partitions})
city_epoch_partitions = dg.MultiPartitionsDefinition(
    {CITY: city_partitions, EPOCH: epoch_partitions}
)

PartitionsDef = dg.StaticPartitionsDefinition | dg.MultiPartitionsDefinition


def period_partitions(temporal: Temporal) -> PartitionsDef:
    """The partitions of work keyed by a temporal kind's source period."""
    if temporal == Temporal.STATIC:
        return city_partitions
    if temporal == Temporal.EPOCH:
        return city_epoch_partitions
    return city_year_partitions


def city_year_key(city: str, year: int) -> dg.MultiPartitionKey:
    """The partition key of one city-year."""
    return dg.MultiPartitionKey({CITY: city, YEAR: str(year)})


def split_key(partitions: PartitionsDef, key: str) -> tuple[str, int | None]:
    """(city, year or epoch) of a partition key; the period is None for city partitions."""
    if isinstance(partitions, dg.MultiPartitionsDefinition):
        dims = partitions.get_partition_key_from_str(str(key)).keys_by_dimension
        return dims[CITY], int(dims.get(YEAR) or dims[EPOCH])
    return str(key), None


def keys_for(partitions: PartitionsDef, cities: Iterable[str], years: Iterable[int]) -> list[str]:
    """The partition keys of a definition that a selection of cities and years needs."""
    cities, years = list(cities), sorted(set(years))
    if partitions == city_partitions:
        return list(cities)
    if partitions == city_epoch_partitions:
        epochs = sorted({epoch_of(y) for y in years})
        return [dg.MultiPartitionKey({CITY: c, EPOCH: str(e)}) for c in cities for e in epochs]
    if partitions == city_year_partitions:
        return [city_year_key(c, y) for c in cities for y in years]
    raise ValueError(f"unknown partitions definition {partitions}")


def _epoch_years() -> dict[str, list[str]]:
    return {str(e): [str(y) for y in YEARS if epoch_of(y) == e] for e in epochs_of(YEARS)}


def mapping_between(upstream: PartitionsDef, downstream: PartitionsDef) -> dg.PartitionMapping:
    """How a downstream partition finds the upstream partitions it reads.

    city × year reads its city's static partition and its epoch's partition; anything reads the
    same partition of an asset partitioned the same way.
    """
    with warnings.catch_warnings():  # these mappings are stable in use; Dagster flags them beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        if upstream == downstream:
            return dg.IdentityPartitionMapping()
        if upstream == city_partitions:
            return dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=CITY)
        if upstream == city_epoch_partitions and downstream == city_year_partitions:
            return dg.MultiPartitionMapping(
                {
                    CITY: dg.DimensionPartitionMapping(CITY, dg.IdentityPartitionMapping()),
                    EPOCH: dg.DimensionPartitionMapping(
                        YEAR, dg.StaticPartitionMapping(_epoch_years())
                    ),
                }
            )
    raise ValueError(f"no partition mapping from {upstream} to {downstream}")
