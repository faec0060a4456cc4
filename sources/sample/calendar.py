"""The sample's per-city calendar: how many years each product with gaps holds in each city.

AgenticCity-Bench reports availability twice, per modality (Table 10, city-years of 416) and per
city (Table 11, (year, modality) combinations of 468). The sample's products follow their sources'
calendars, and most of those leave no choice: OPT, DEM, NDVI, BV, LC, LU, WTH and POP serve
every year (8 × 26 = 208 per city), CO2 every year but 2025 (25), AQ the 15 years with both
NO2 and PM2.5, and PROP and ELEC the years of each city's records. What Table 11 leaves of a
city's total after those is shared by the products that do have a choice: the building
footprints (static, so 0 or 26 years), night-time lights, the surface-temperature record and
the three OpenStreetMap products (roads, buildings, GPS traces).

This is a small transportation problem: the free cells of each city must add up to its
remainder (row sums) and each product's cells to its Table 10 count (column sums), every cell
within what the source can hold. The assignment below is one solution, chosen to stay close
to the sources' histories:

- Building footprints miss the two cities with the least room: Shanghai, whose Table 11 total
  (316) is the lowest by 37, and Christchurch (353, the next lowest); 14 cities × 26 = 364.
- Night-time lights: Table 10's 404 is 416 less 12, the pre-VIIRS years 2000–2011 of one
  city. They are counted against Shanghai, so the other 15 cities carry all 26 years in the
  paper's table (the release serves 2012–2025 only: the ``ntl-before-2012`` departure).
- Surface temperature (HEAT, 358): the 15 cities of AgenticCity-Bench's LST forecasting cohort keep
  every year of 2010–2024 and miss 0–4 others; Shanghai misses 10, at least four of them in
  2010–2024.
- OpenStreetMap roads (300), buildings (288) and GPS traces (284): the latest years of each
  city, starting between 2005 and 2019 (the first full-history extract is 1 January 2005;
  GPS trace points keep the time they were recorded, so logs uploaded later reach back to
  2002). Busy, early-mapped cities start first; Tokyo, Xiong'an and above all Shanghai late.

``tests/test_sample_calendar.py`` derives the availability matrix from the products' own year
sets and checks both tables, minus the documented departures, against ``schemas/paper.yaml``.
Which years are missing is drawn per city from the backend seed; only the counts are fixed, so
every seed meets the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from citycube.catalogue.cities import get_city
from sources.sample.world import FIRST_YEAR, LAST_YEAR, stable_hash


@dataclass(frozen=True)
class CityCalendar:
    """Years held by each product with gaps in one city (of the 26 calendar years)."""

    surface_temperature: int
    """Years of the Landsat surface-temperature record (HEAT)."""
    roads: int
    """OpenStreetMap road snapshots (RD)."""
    buildings: int
    """OpenStreetMap building snapshots (POI)."""
    gps_traces: int
    """Years with public GPS trace points (GPS)."""


CITY_CALENDARS: dict[str, CityCalendar] = {
    "Amsterdam": CityCalendar(26, 21, 21, 24),
    "Boston": CityCalendar(23, 20, 20, 19),
    "Busan": CityCalendar(23, 21, 19, 20),
    "CapeTown": CityCalendar(23, 20, 20, 20),
    "Christchurch": CityCalendar(23, 19, 19, 18),
    "DC": CityCalendar(23, 19, 18, 18),
    "London": CityCalendar(23, 21, 21, 20),
    "Lyon": CityCalendar(22, 20, 19, 18),
    "NYC": CityCalendar(23, 18, 17, 17),
    "SanFrancisco": CityCalendar(23, 20, 19, 19),
    "Santiago": CityCalendar(22, 20, 18, 19),
    "Shanghai": CityCalendar(16, 10, 9, 7),
    "Singapore": CityCalendar(22, 18, 17, 16),
    "Sydney": CityCalendar(23, 21, 20, 20),
    "Tokyo": CityCalendar(21, 15, 14, 13),
    "XiongAn": CityCalendar(22, 17, 17, 16),
}
"""Per city: HEAT 358, RD 300, POI 288 and GPS 284 city-years in all (AgenticCity-Bench
Table 10)."""

FOOTPRINT_UNCOVERED_CITIES = frozenset({"Christchurch", "Shanghai"})
"""Cities outside the building-footprint product's coverage (14 of 16 covered: HF 364)."""

FIRST_OSM_EXTRACT = 2005
"""First 1 January full-history extract with data (the project started in August 2004)."""
FIRST_GPS_YEAR = 2002
"""Earliest year of public GPS trace points (logs recorded before they were uploaded)."""
EARLY_GAP_SHARE = 0.5
"""Share of city-products whose record misses one year early on (an extract or a year with
no uploads), drawn per city and seed."""
EARLY_GAP_WINDOW = 5
"""The missing early year lies within this many years after the first."""


def city_calendar(city: str) -> CityCalendar:
    """A city's plan, with an error that names the cities planned."""
    get_city(city)
    if city not in CITY_CALENDARS:
        raise KeyError(f"no sample calendar for {city!r}; planned: {', '.join(CITY_CALENDARS)}")
    return CITY_CALENDARS[city]


def recent_years(product: str, city: str, count: int, earliest: int, seed: int) -> list[int]:
    """``count`` years up to the last calendar year, sometimes with one early year missing.

    Records like OSM snapshots grow towards the present, so the years held are the latest
    ones. For about half the cities (seeded per product, city and backend seed) the record
    starts one year earlier and misses one of its first few years instead, when ``earliest``
    leaves room for that.
    """
    if not 0 <= count <= LAST_YEAR - max(earliest, FIRST_YEAR) + 1:
        raise ValueError(f"{product} cannot hold {count} years of {city} from {earliest} on")
    rng = np.random.default_rng([stable_hash("sample-calendar", product, city), seed])
    first = LAST_YEAR - count + 1
    gap = rng.random() < EARLY_GAP_SHARE
    if not gap or count < 2 or first - 1 < earliest:
        return list(range(first, LAST_YEAR + 1))
    first -= 1
    last_gap = min(first + EARLY_GAP_WINDOW, LAST_YEAR - 1)
    missing = int(rng.integers(first + 1, last_gap + 1))
    return [y for y in range(first, LAST_YEAR + 1) if y != missing]
