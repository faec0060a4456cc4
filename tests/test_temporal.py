"""Temporal rules: annual, epoch reuse, static reuse, missing years (AgenticCity-Bench App. B.4)."""

from __future__ import annotations

import pytest

from citycube.catalogue.modalities import Temporal
from citycube.catalogue.temporal import CALENDAR, epoch_of, parse_years, resolve, today
from citycube.errors import UnknownYearError

EPOCHS = [2000, 2005, 2010, 2015, 2020, 2025]


def test_calendar_is_2000_to_2025() -> None:
    assert CALENDAR[0] == 2000 and CALENDAR[-1] == 2025 and len(CALENDAR) == 26


def test_annual_uses_own_year_only() -> None:
    r = resolve(Temporal.ANNUAL, 2024, range(2000, 2025))
    assert (r.source_year, r.basis, r.available) == (2024, "annual", True)
    missing = resolve(Temporal.ANNUAL, 2025, range(2000, 2025))
    assert missing.source_year is None and missing.missing_reason == "source_year_missing"


@pytest.mark.parametrize(
    ("year", "epoch"),
    [(2000, 2000), (2004, 2000), (2005, 2005), (2019, 2015), (2024, 2020), (2025, 2025)],
)
def test_epoch_first_year_serves_whole_epoch(year: int, epoch: int) -> None:
    assert epoch_of(year) == epoch
    r = resolve(Temporal.EPOCH, year, EPOCHS)
    assert (r.source_year, r.basis) == (epoch, "epoch")


def test_missing_epoch_is_not_carried_from_neighbour() -> None:
    r = resolve(Temporal.EPOCH, 2012, [2000, 2005, 2015])
    assert not r.available and r.source_year is None


def test_static_reused_for_every_year() -> None:
    for year in CALENDAR:
        r = resolve(Temporal.STATIC, year, None)
        assert (r.source_year, r.basis, r.available) == (None, "static", True)


def test_unknown_years_rejected() -> None:
    with pytest.raises(UnknownYearError):
        resolve(Temporal.ANNUAL, 1999, [1999])
    with pytest.raises(UnknownYearError, match="outside the calendar"):
        parse_years(f"2024-{today().year}")  # this year has not closed yet
    with pytest.raises(UnknownYearError, match="cannot read"):
        parse_years("twenty")


def test_parse_years_forms() -> None:
    assert parse_years("all") == list(CALENDAR)
    assert parse_years("2000,2005,2010-2012") == [2000, 2005, 2010, 2011, 2012]


def test_source_without_any_year_for_the_city_is_outside_coverage() -> None:
    r = resolve(Temporal.ANNUAL, 2020, [])
    assert not r.available and r.missing_reason == "outside_source_coverage"


def test_a_year_is_accepted_once_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """2026 can be built from 15 January 2027; 'all' stays the paper's 2000–2025."""
    monkeypatch.setenv("CITYCUBE_TODAY", "2027-01-14")
    with pytest.raises(UnknownYearError, match="2000–2025"):
        parse_years("2026")
    monkeypatch.setenv("CITYCUBE_TODAY", "2027-01-15")
    assert parse_years("2025-2026") == [2025, 2026]
    assert parse_years("all") == list(CALENDAR)
    assert resolve(Temporal.EPOCH, 2026, EPOCHS).source_year == 2025
    monkeypatch.setenv("CITYCUBE_TODAY", "soon")
    with pytest.raises(UnknownYearError, match="CITYCUBE_TODAY"):
        parse_years("2020")
