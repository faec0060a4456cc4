"""Which (city, year, modality) combinations the sample's calendars serve, without building.

Derived from the same declarations the sample backend answers with: each product's source
years per city and its coverage, the catalogue's temporal rule and per-city products with
their fallbacks, the every-field rule (a modality counts only when each of its field groups is
served) and, for money, whether the World Bank series the sample publishes convert that year.
Pixels are not looked at, so what only pixels decide (the Landsat 7 stripes of 2012, the
``landsat-2012`` departure) is not in it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from citycube.catalogue.cities import get_city, load_cities
from citycube.catalogue.modalities import Catalogue, Conversion, ModalitySpec, load_catalogue
from citycube.catalogue.temporal import CALENDAR, period_of, resolve
from citycube.processing.money import ppp_2017_factor_of
from sources.sample.backend import SampleBackend, SampleSource
from sources.sample.records import CPI_ID, PPP_ID, indicator_series

MoneySeries = dict[tuple[str, int], float | None]


def _serves(adapter: SampleSource, modality: ModalitySpec, city: str, year: int) -> bool:
    """Whether one product serves a calendar year in a city, as the derived step decides it."""
    if not adapter.covers(city):
        return False
    period = period_of(modality.temporal, year)
    if period is None:
        return True
    return resolve(modality.temporal, period, adapter.source_years(city)).available


def _money_series(seed: int) -> tuple[MoneySeries, MoneySeries]:
    """The sample's CPI and PPP series as (iso3, year) → value."""
    series = indicator_series(seed)

    def flat(indicator: str) -> MoneySeries:
        return {
            (iso3, year): value
            for iso3, by_year in series[indicator].items()
            for year, value in by_year.items()
        }

    return flat(CPI_ID), flat(PPP_ID)


def served_years(
    modality: ModalitySpec,
    city: str,
    backend: SampleBackend,
    money: tuple[MoneySeries, MoneySeries] | None = None,
) -> list[int]:
    """Calendar years in which every field of a modality is served in a city."""
    years = set(CALENDAR)
    for product, fields in modality.field_groups(city):
        choices = (product, *modality.fallbacks(product))
        adapters = [backend.product(p) for p in choices if p in backend]
        years &= {
            y
            for y in CALENDAR
            if any(_serves(a, modality, city, y) for a in adapters if isinstance(a, SampleSource))
        }
        if any(f.conversion == Conversion.PPP_2017 for f in fields):
            cpi, ppp = money or _money_series(backend.seed)
            iso3 = get_city(city).iso3
            years = {y for y in years if ppp_2017_factor_of(cpi, ppp, iso3, y) is not None}
    return sorted(years)


def sample_calendar(
    seed: int = 0, catalogue: Catalogue | None = None, cities: Iterable[str] | None = None
) -> dict[tuple[str, str], list[int]]:
    """(city, modality code) → the calendar years the sample serves."""
    catalogue = catalogue or load_catalogue()
    backend = SampleBackend(seed)
    money = _money_series(seed)
    return {
        (city, m.code): served_years(m, city, backend, money)
        for city in (cities or load_cities())
        for m in catalogue.modalities
    }


def availability_matrix(seed: int = 0, catalogue: Catalogue | None = None) -> pd.DataFrame:
    """Years served per city (rows, catalogue order of cities) and modality code (columns)."""
    catalogue = catalogue or load_catalogue()
    calendar = sample_calendar(seed, catalogue)
    cities = list(load_cities())
    codes = [m.code for m in catalogue.modalities]
    return pd.DataFrame(
        [[len(calendar[(c, code)]) for code in codes] for c in cities], index=cities, columns=codes
    )
