"""The sample's calendars against AgenticCity-Bench Tables 10 and 11, and spot checks by processing.

The availability matrix (years served per city and modality) is derived from the products'
own declarations (``sources.sample.availability``), never copied: any change to a sample
calendar that breaks either table, less the documented departures, fails here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import load_catalogue
from citycube.catalogue.temporal import CALENDAR
from citycube.cube.release import Release
from citycube.processing.compute import process_partition
from citycube.reports.paper import PaperTables, load_paper_tables
from sources.sample import SampleBackend
from sources.sample import calendar as sample_calendar_plan
from sources.sample.availability import availability_matrix, sample_calendar
from sources.sample.calendar import (
    CITY_CALENDARS,
    FIRST_GPS_YEAR,
    FIRST_OSM_EXTRACT,
    FOOTPRINT_UNCOVERED_CITIES,
)
from sources.sample.landsat_derived import ST_CORE_INCOMPLETE, ST_CORE_YEARS
from sources.sample.property import PROPERTY_RECORDS
from sources.sample.records import ELECTRICITY_YEARS

CAT = load_catalogue()
PAPER = load_paper_tables()
PIXEL_DEPARTURES = frozenset({"landsat-2012"})
"""Departures decided by pixels, which a calendar cannot see (spot-checked below)."""


def _after_pixel_departures(matrix: pd.DataFrame, paper: PaperTables) -> pd.DataFrame:
    """The calendar's matrix less the combinations pixel-level departures remove."""
    out = matrix.copy()
    for departure in paper.departures:
        if departure.id not in PIXEL_DEPARTURES:
            continue
        for code, by_city in departure.shortfall.items():
            for city, count in by_city.items():
                assert out.loc[city, code] >= count, (departure.id, code, city)
                out.loc[city, code] -= count
    return out


def _mismatches(matrix: pd.DataFrame, paper: PaperTables) -> dict[str, tuple[int, int]]:
    """Modalities and cities whose totals differ from the tables less the departures."""
    derived = _after_pixel_departures(matrix, paper)
    by_modality = derived.sum(axis=0).to_dict()
    by_city = derived.sum(axis=1).to_dict()
    wrong = {
        code: (int(by_modality[code]), n)
        for code, n in paper.expected_by_modality.items()
        if by_modality[code] != n
    }
    wrong |= {
        city: (int(by_city[city]), n)
        for city, n in paper.expected_by_city.items()
        if by_city[city] != n
    }
    return wrong


@pytest.mark.parametrize("seed", [0, 1])
def test_the_sample_meets_tables_10_and_11_less_the_documented_departures(seed: int) -> None:
    matrix = availability_matrix(seed, CAT)
    assert list(matrix.index) == list(load_cities())
    assert _mismatches(matrix, PAPER) == {}
    # Cells the departures explain: VIIRS years only, and the unconverted PROP years.
    assert set(matrix["NTL"]) == {14}
    prop = {c: len(r.years) for c, r in PROPERTY_RECORDS.items()}
    shortfall = next(d for d in PAPER.departures if d.id == "prop-unconverted-years").shortfall
    for city in matrix.index:
        expected = prop.get(city, 0) - shortfall["PROP"].get(city, 0)
        assert matrix.loc[city, "PROP"] == expected, city


def test_a_calendar_change_that_breaks_a_table_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = dict(CITY_CALENDARS)
    plan["Amsterdam"] = replace(plan["Amsterdam"], roads=plan["Amsterdam"].roads - 1)
    monkeypatch.setattr(sample_calendar_plan, "CITY_CALENDARS", plan)
    wrong = _mismatches(availability_matrix(0, CAT), PAPER)
    assert wrong == {
        "RD": (299, 300),
        "Amsterdam": (PAPER.expected_by_city["Amsterdam"] - 1, PAPER.expected_by_city["Amsterdam"]),
    }


def test_the_calendars_keep_the_sources_shapes() -> None:
    calendar = sample_calendar(0, CAT)
    for city in load_cities():
        earliest_years = {"RD": FIRST_OSM_EXTRACT, "POI": FIRST_OSM_EXTRACT, "GPS": FIRST_GPS_YEAR}
        for code, earliest in earliest_years.items():
            years = calendar[(city, code)]
            # The latest years, with at most one missing early on.
            assert years[0] >= earliest and years[-1] == 2025, (city, code)
            gaps = sorted(set(range(years[0], 2026)) - set(years))
            assert len(gaps) <= 1 and all(g - years[0] <= 5 for g in gaps), (city, code)
        heat = set(calendar[(city, "HEAT")])
        if city in ST_CORE_INCOMPLETE:
            assert len(set(ST_CORE_YEARS) - heat) >= 4
        else:  # AgenticCity-Bench's 15-city LST forecasting cohort
            assert set(ST_CORE_YEARS) <= heat
        assert calendar[(city, "AQ")] == list(range(2005, 2020))  # NO2 and PM2.5 both
        assert calendar[(city, "CO2")] == list(range(2000, 2025))  # ODIAC ends in 2024
        assert calendar[(city, "ELEC")] == list(ELECTRICITY_YEARS.get(city, ()))
        hf = calendar[(city, "HF")]
        assert hf == ([] if city in FOOTPRINT_UNCOVERED_CITIES else list(CALENDAR))


# --------------------------------------------------------------------------------------------
# Spot checks: real processing says the same as the calendar, with the reason.


@pytest.fixture(scope="module")
def backend() -> SampleBackend:
    return SampleBackend()


def _partition(code: str, city: str, year: int, backend: SampleBackend, root: Path) -> tuple:
    summary = process_partition(CAT.get(code), CAT, city, year, backend, Release(root, "t"))
    return summary.available_tiles, summary.tiles, set(summary.reason_counts)


def test_missing_years_come_out_unavailable_with_their_reason(
    backend: SampleBackend, tmp_path: Path
) -> None:
    calendar = sample_calendar(0, CAT, cities=["Shanghai", "Tokyo"])
    heat_missing = min(set(CALENDAR) - set(calendar[("Shanghai", "HEAT")]))
    roads_missing = min(set(CALENDAR) - set(calendar[("Tokyo", "RD")]))
    cases = (
        ("HEAT", "Shanghai", heat_missing, "source_year_missing"),
        ("HF", "Shanghai", 2020, "outside_source_coverage"),
        ("RD", "Tokyo", roads_missing, "source_year_missing"),
        ("NTL", "Tokyo", 2011, "source_year_missing"),
    )
    for code, city, year, reason in cases:
        available, tiles, reasons = _partition(code, city, year, backend, tmp_path / "data")
        assert (available, reasons) == (0, {reason}) and tiles > 0, (code, city, year)


def test_an_early_gps_year_the_calendar_adds_is_available(
    backend: SampleBackend, tmp_path: Path
) -> None:
    first = sample_calendar(0, CAT, cities=["Amsterdam"])[("Amsterdam", "GPS")][0]
    assert first < FIRST_OSM_EXTRACT  # traces recorded before the first extract
    available, _, _ = _partition("GPS", "Amsterdam", first, backend, tmp_path / "data")
    assert available > 0


def test_the_2012_landsat_departure_is_what_processing_finds(
    backend: SampleBackend, tmp_path: Path
) -> None:
    shortfall = next(d for d in PAPER.departures if d.id == "landsat-2012").shortfall
    assert shortfall["OPT"] == shortfall["NDVI"]
    # One city the departure counts (no tile passes the 98 % rule) and one it does not.
    available, _, reasons = _partition("OPT", "Sydney", 2012, backend, tmp_path / "data")
    assert "Sydney" in shortfall["OPT"]
    assert available == 0 and reasons == {"insufficient_valid_pixels"}
    available, _, _ = _partition("OPT", "Shanghai", 2012, backend, tmp_path / "data")
    assert "Shanghai" not in shortfall["OPT"]
    assert available > 0
