"""Money harmonisation: local currency of a year → 2017 PPP international dollars.

value_2017ppp = value_local × CPI(2017) / CPI(year) ÷ PPP(2017), with the country's consumer
price index (World Bank FP.CPI.TOTL) and its PPP conversion factor (PA.NUS.PPP, local currency
units per international dollar). A missing factor leaves the value unavailable, never guessed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from citycube.errors import SourceReadError
from citycube.items.protocol import SourceItem
from citycube.items.staging import repair_hint

BASE_YEAR = 2017

COUNTRY_CURRENCIES: dict[str, str] = {
    "AUS": "AUD",
    "CHL": "CLP",
    "CHN": "CNY",
    "FRA": "EUR",
    "GBR": "GBP",
    "JPN": "JPY",
    "KOR": "KRW",
    "NLD": "EUR",
    "NZL": "NZD",
    "SGP": "SGD",
    "USA": "USD",
    "ZAF": "ZAR",
}
"""ISO 4217 currency of each country's PPP factor (PA.NUS.PPP is in local currency units)."""


def check_currency(currency: str, iso3: str, city: str) -> None:
    """Refuse money in another currency than the country's: its PPP factor would be wrong."""
    expected = COUNTRY_CURRENCIES.get(iso3)
    if expected is not None and currency != expected:
        raise SourceReadError(
            f"{city}: property values are in {currency}, but the World Bank PPP factor of "
            f"{iso3} converts {expected}; declare the records' currency correctly or convert "
            "them to the local currency first",
            reason="currency_mismatch",
        )


@cache
def _series(path: str) -> dict[tuple[str, int], float]:
    """(iso3, year) → value from a World Bank API v2 JSON response (nulls dropped)."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        records = payload[1]
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise SourceReadError(
            f"{path} is not a World Bank API v2 JSON response ({exc}); {repair_hint(path)}"
        ) from exc
    series: dict[tuple[str, int], float] = {}
    for index, record in enumerate(records or []):
        problem = _record_problem(record)
        if problem:
            raise SourceReadError(
                f"{path} record {index + 1} {problem}: the file is not a World Bank API v2 "
                f"JSON response (values are JSON numbers or null, dates years); "
                f"{repair_hint(path)}"
            )
        value = record.get("value")
        iso3 = record.get("countryiso3code")
        if value is None or not iso3:
            continue
        series[(iso3, int(record["date"]))] = float(value)
    return series


def _record_problem(record: object) -> str | None:
    """What is wrong with one record of a series, or None: a text value ('1,234.5', 'n/a')
    would otherwise fail deep inside a conversion, or worse, convert."""
    if not isinstance(record, dict):
        return f"is {type(record).__name__}, not an object"
    value, date = record.get("value"), record.get("date")
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    ):
        return f"({record.get('countryiso3code')} {date}) has value {value!r}, not a number"
    if not (isinstance(date, int | str) and str(date).isdigit() and len(str(date)) == 4):
        return f"({record.get('countryiso3code')}) has date {date!r}, not a year"
    return None


def ppp_2017_factor(indicators: SourceItem, iso3: str, year: int) -> float | None:
    """Multiplier from local currency of ``year`` to 2017 PPP international dollars, or None."""
    cpi = _series(str(indicators.local_path("cpi")))
    ppp = _series(str(indicators.local_path("ppp")))
    return ppp_2017_factor_of(cpi, ppp, iso3, year)


def ppp_2017_factor_of(
    cpi: Mapping[tuple[str, int], float | None],
    ppp: Mapping[tuple[str, int], float | None],
    iso3: str,
    year: int,
) -> float | None:
    """The same multiplier from series already read ((iso3, year) → value; None or absent when
    unpublished), so a calendar can tell which years convert without writing files."""
    cpi_year, cpi_base, ppp_base = (
        cpi.get((iso3, year)),
        cpi.get((iso3, BASE_YEAR)),
        ppp.get((iso3, BASE_YEAR)),
    )
    if not cpi_year or not cpi_base or not ppp_base:
        return None
    return (cpi_base / cpi_year) / ppp_base
