"""The paper-vs-release report: seed 000's Tables 10 and 11 beside a release's availability."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from citycube.catalogue import load_catalogue
from citycube.cities import load_cities
from citycube.errors import SpecError
from citycube.paper import (
    city_comparison,
    load_paper_tables,
    modality_comparison,
    parse_paper_tables,
    write_paper_comparison,
)
from citycube.report import Availability
from tests.test_render import build_small_release

CAT = load_catalogue()
PAPER = load_paper_tables()


def _availability(available: set[tuple[str, int, str]], years: range) -> Availability:
    cities = list(load_cities())
    return Availability(
        scope=frozenset((c, y) for c in cities for y in years),
        processed=frozenset(m for _, _, m in available),
        available=frozenset(available),
        fields={},
        available_fields=frozenset(),
    )


def test_the_packaged_tables_are_the_papers_and_name_the_catalogues_keys() -> None:
    PAPER.check_against(CAT)
    assert (PAPER.overall.available, PAPER.overall.possible) == (6309, 7488)
    assert PAPER.by_modality["AQ"] == 240 and PAPER.by_city["Shanghai"] == 316
    assert {"ntl-before-2012", "opt-planet", "bv-resampled"} <= {d.id for d in PAPER.departures}


def test_a_mistyped_count_is_refused_on_load() -> None:
    text = Path("schemas/paper.yaml").read_text(encoding="utf-8").replace("AQ: 240", "AQ: 241")
    with pytest.raises(SpecError, match="by_modality sums to 6310"):
        parse_paper_tables(text)


def test_a_full_calendar_is_compared_count_by_count() -> None:
    cities = list(load_cities())
    years = range(2000, 2026)
    available = {(c, y, "OPT") for c in cities for y in years}
    available |= {(c, y, "AQ") for c in cities for y in range(2005, 2020)}  # 15 years
    available |= {("Boston", y, "ELEC") for y in range(2013, 2024)}
    by_modality = modality_comparison(_availability(available, years), CAT, PAPER)
    rows = by_modality.set_index("code").to_dict("index")
    assert rows["OPT"]["release_available"] == 416 and rows["OPT"]["difference_count"] == 0
    assert rows["AQ"]["difference_count"] == 0 and rows["AQ"]["difference_pp"] == 0.0
    assert rows["ELEC"]["release_available"] == 11
    assert rows["ELEC"]["difference_count"] == 11 - 111
    assert rows["ELEC"]["difference_pp"] == pytest.approx(round(100 * 11 / 416 - 26.683, 3))
    by_city = city_comparison(_availability(available, years), CAT, PAPER).set_index("key")
    # Boston: OPT 26 + AQ 15 + ELEC 11 of 468 against the paper's 413.
    assert by_city.loc["Boston", "release_available"] == 52
    assert by_city.loc["Boston", "difference_count"] == 52 - 413


def test_a_partial_release_compares_shares_only() -> None:
    available = {("Amsterdam", 2020, "OPT")}
    availability = Availability(
        scope=frozenset({("Amsterdam", 2020), ("Amsterdam", 2021)}),
        processed=frozenset({"OPT"}),
        available=frozenset(available),
        fields={},
        available_fields=frozenset(),
    )
    rows = modality_comparison(availability, CAT, PAPER).set_index("code").to_dict("index")
    assert (rows["OPT"]["release_available"], rows["OPT"]["release_possible"]) == (1, 2)
    assert rows["OPT"]["difference_pp"] == -50.0
    assert pd.isna(rows["OPT"]["difference_count"])
    by_city = city_comparison(availability, CAT, PAPER).set_index("key")
    assert by_city.loc["Boston", "release_possible"] == 0  # not in the release
    assert pd.isna(by_city.loc["Boston", "difference_pp"])


def test_the_report_files_of_a_release(tmp_path: Path) -> None:
    release = build_small_release(tmp_path / "data")
    paths = write_paper_comparison(release, CAT)
    assert {p.name for p in paths.values()} == {
        "paper_vs_release.md",
        "paper_vs_release_by_modality.csv",
        "paper_vs_release_by_city.csv",
    }
    text = paths["paper_md"].read_text(encoding="utf-8")
    assert "| OPT | 416 / 416 (100.000%) | 1 / 2 (50.000%) | -50.000 pp | – |" in text
    assert "| Boston | 413 / 468 (88.248%) | not in the release | – | – |" in text
    for departure in PAPER.departures:
        assert f"(`{departure.id}`)" in text
    assert not list((release.root / "reports").glob(".*.tmp"))
