"""Temporal rules (AgenticCity-Bench App. B.4): which source year serves a calendar year, and how
it is labelled.

No interpolation and no carrying values into years a source does not cover: those years stay
missing. Reuse (epoch, static) is labelled so it never passes as an independent observation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime

from citycube.catalogue.modalities import Temporal
from citycube.errors import UnknownYearError

FIRST_YEAR = 2000
LAST_YEAR = 2025
CALENDAR: tuple[int, ...] = tuple(range(FIRST_YEAR, LAST_YEAR + 1))
"""The paper's calendar: the default scope of a release (``--years all``)."""
EPOCH_LENGTH = 5
RELEASE_DAY = (1, 15)
"""(month, day) from which last year counts as closed: most annual products are out by then."""
TODAY_ENV = "CITYCUBE_TODAY"
"""An ISO date taken as today by the calendar and the yearly automation (unset: the UTC date),
e.g. to see what they would do on a later day."""


def today() -> date:
    """Today's date (UTC), or the date ``CITYCUBE_TODAY`` names."""
    text = os.environ.get(TODAY_ENV, "").strip()
    if not text:
        return datetime.now(UTC).date()
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        raise UnknownYearError(
            f"{TODAY_ENV}={text!r} is not a date; write it as YYYY-MM-DD or unset it"
        ) from exc


def last_closed_year(on: date) -> int:
    """The latest year that is closed on ``on``: last year from 15 January, else the one before."""
    return on.year - 1 if (on.month, on.day) >= RELEASE_DAY else on.year - 2


def open_calendar(on: date | None = None) -> tuple[int, ...]:
    """Every year that can be built on ``on`` (default: today): the paper's 2000–2025 and each
    year closed since, so the calendar grows by one year every 15 January."""
    last = max(LAST_YEAR, last_closed_year(on or today()))
    return tuple(range(FIRST_YEAR, last + 1))


def epochs_of(years: Iterable[int]) -> tuple[int, ...]:
    """First years of the 5-year epochs that ``years`` fall in, in order."""
    return tuple(sorted({epoch_of(y) for y in years}))


def check_year(year: int) -> int:
    """Reject years outside the open calendar with an error that says what is allowed."""
    calendar = open_calendar()
    if year not in calendar:
        when = (
            f" (a year can be built from 15 January of the next; {year} from 15 January {year + 1})"
            if year > calendar[-1]
            else ""
        )
        raise UnknownYearError(
            f"year {year} is outside the calendar {FIRST_YEAR}–{calendar[-1]}{when}; choose a "
            "year in that range"
        )
    return year


def parse_years(text: str) -> list[int]:
    """Parse '2019', '2019-2021', '2000,2005,2010-2012' or 'all' into calendar years."""
    text = text.strip()
    if text in ("all", "*"):
        return list(CALENDAR)
    years: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                if lo > hi:
                    raise UnknownYearError(
                        f"year range {part!r} is reversed; write it as {hi}-{lo}"
                    )
                span = range(lo, hi + 1)
            else:
                span = range(int(part), int(part) + 1)
        except ValueError as exc:
            raise UnknownYearError(
                f"cannot read years from {part!r}; use e.g. 2019, 2019-2021 or all"
            ) from exc
        years.update(check_year(y) for y in span)
    if not years:
        raise UnknownYearError("no years given; use e.g. 2019, 2019-2021 or all")
    return sorted(years)


@dataclass(frozen=True)
class Resolution:
    """How one calendar year is served by a source."""

    year: int
    """Calendar year asked for."""
    source_year: int | None
    """Source year used; None for static data or when missing."""
    basis: str
    """'annual', 'epoch', 'static', 'snapshot' or 'city_record'."""
    missing_reason: str | None
    """Stable reason code when the year cannot be served, else None."""

    @property
    def available(self) -> bool:
        """True when a source year serves this calendar year."""
        return self.missing_reason is None


BASIS: dict[Temporal, str] = {
    Temporal.ANNUAL: "annual",
    Temporal.EPOCH: "epoch",
    Temporal.STATIC: "static",
    Temporal.SNAPSHOT: "snapshot",
    Temporal.CITY_YEARS: "city_record",
}


def epoch_of(year: int) -> int:
    """The first year of the 5-year epoch containing ``year`` (2000, 2005, …)."""
    return year - (year - FIRST_YEAR) % EPOCH_LENGTH


def resolve(temporal: Temporal, year: int, source_years: Iterable[int] | None) -> Resolution:
    """Decide which source year serves ``year`` under a temporal kind.

    ``source_years`` is what the source covers (None for static sources).
    """
    check_year(year)
    basis = BASIS[temporal]
    if temporal == Temporal.STATIC:
        return Resolution(year, None, basis, None)
    covered = set(source_years or ())
    if not covered:  # the source publishes nothing for this city at all
        return Resolution(year, None, basis, "outside_source_coverage")
    wanted = epoch_of(year) if temporal == Temporal.EPOCH else year
    if wanted in covered:
        return Resolution(year, wanted, basis, None)
    return Resolution(year, None, basis, "source_year_missing")


EPOCHS: tuple[int, ...] = tuple(range(FIRST_YEAR, LAST_YEAR + 1, EPOCH_LENGTH))
"""First years of the 5-year source epochs (2000, 2005, …, 2025)."""


def period_of(temporal: Temporal, year: int) -> int | None:
    """The source period that serves a calendar year: its epoch, itself, or None (static).

    Results are computed once per source period and reused by every calendar year it serves.
    """
    check_year(year)
    if temporal == Temporal.STATIC:
        return None
    if temporal == Temporal.EPOCH:
        return epoch_of(year)
    return year


def period_label(period: int | None) -> str:
    """File label of a source period: the year, or 'static'."""
    return "static" if period is None else str(period)
