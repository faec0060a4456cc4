"""The paper-vs-release report: AgenticCity-Bench's Tables 10 and 11 beside a release's
availability."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from citycube.catalogue.cities import load_cities
from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SpecError
from citycube.reports.availability import Availability
from citycube.reports.paper import (
    city_comparison,
    load_paper_tables,
    modality_comparison,
    parse_paper_tables,
    route_comparison,
    write_paper_comparison,
)
from citycube.tasks.pairs import TABLE_ORDER, route_count_long
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


def test_the_departures_leave_each_city_and_modality_an_expected_count() -> None:
    expected_city, expected_modality = PAPER.expected_by_city, PAPER.expected_by_modality
    assert expected_modality["NTL"] == 224 and expected_modality["PROP"] == 227
    assert expected_modality["OPT"] == expected_modality["NDVI"] == 405
    assert expected_city["Shanghai"] == 316  # NTL's twelve missing years are Shanghai's
    assert expected_city["Singapore"] == 418 - 12 - 2  # NTL, PROP 2024 and 2025
    assert sum(expected_city.values()) == sum(expected_modality.values()) == 6309 - 207


@pytest.mark.parametrize(
    ("shortfall", "message"),
    [
        ("      NTL: {Atlantis: 12}\n", "not modality codes or city keys"),
        ("      XYZ: {Boston: 1}\n", "not modality codes or city keys"),
        ("      ELEC: {Boston: 27}\n", "exceeds 26"),
        ("      ELEC: {Boston: 0}\n", "greater than 0"),
    ],
)
def test_a_wrong_shortfall_is_refused(shortfall: str, message: str) -> None:
    text = Path("schemas/paper.yaml").read_text(encoding="utf-8")
    anchor = "    shortfall:\n      PROP: {Busan: 1, DC: 1, London: 1, Singapore: 2}\n"
    assert anchor in text
    text = text.replace(anchor, anchor + shortfall)
    with pytest.raises(SpecError, match=message):
        parse_paper_tables(text).check_against(CAT)


def test_shortfalls_beyond_a_table_are_refused() -> None:
    text = Path("schemas/paper.yaml").read_text(encoding="utf-8")
    anchor = "    shortfall:\n      PROP: {Busan: 1, DC: 1, London: 1, Singapore: 2}\n"
    heavy = "      ELEC: {" + ", ".join(f"{c}: 26" for c in load_cities()) + "}\n"
    with pytest.raises(SpecError, match="departures remove more ELEC"):
        parse_paper_tables(text.replace(anchor, anchor + heavy))


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
    # The departures' shares: OPT loses 2012 in 11 cities, NTL 2000–2011 in 15.
    assert (rows["OPT"]["departures_shortfall"], rows["OPT"]["expected_available"]) == (11, 405)
    assert rows["OPT"]["difference_from_expected_count"] == 416 - 405
    assert (rows["NTL"]["expected_available"], rows["AQ"]["difference_from_expected_count"]) == (
        224,
        0,
    )
    by_city = city_comparison(_availability(available, years), CAT, PAPER).set_index("key")
    # Boston: OPT 26 + AQ 15 + ELEC 11 of 468 against the paper's 413.
    assert by_city.loc["Boston", "release_available"] == 52
    assert by_city.loc["Boston", "difference_count"] == 52 - 413
    # Boston's shares: NTL 12, OPT 1, NDVI 1.
    assert by_city.loc["Boston", "expected_available"] == 413 - 14
    assert by_city.loc["Boston", "difference_from_expected_count"] == 52 - 399
    assert by_city.loc["Shanghai", "departures_shortfall"] == 0


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
        "paper_vs_release_by_route.csv",
    }
    text = paths["paper_md"].read_text(encoding="utf-8")
    assert (
        "| OPT | 416 / 416 (100.000%) | −11 | 405 / 416 (97.356%) | 1 / 2 (50.000%) "
        "| -50.000 pp | – | -47.356 pp |"
    ) in text
    assert (
        "| Boston | 413 / 468 (88.248%) | −14 | 399 / 468 (85.256%) | not in the release "
        "| – | – | – |"
    ) in text
    for departure in PAPER.departures:
        assert f"(`{departure.id}`)" in text
    assert "- Removes: PROP 5 (Busan 1, Washington, D.C. 1, London 1, Singapore 2)" in text
    assert not list((release.root / "reports").glob(".*.tmp*"))


def test_table_14_is_the_papers_and_counts_opt_and_aq_per_product() -> None:
    """Every count of Table 14 above the calendar's 171,236 (tile, year) keys is an OPT or AQ
    route: one pair per key could not reach them, a count per source product can."""
    routes = PAPER.route_pairs()
    assert len(routes) == 306 and sum(routes.values()) == 28_249_584
    assert routes[("OPT", "AQ")] == routes[("AQ", "OPT")] == 306_563
    assert routes[("OPT", "BV")] == 207_654 and routes[("ELEC", "DEM")] == 9_112
    over = {route for route, n in routes.items() if n > 171_236}
    assert len(over) == 32 and all({"OPT", "AQ"} & set(route) for route in over)
    assert max(n for r, n in routes.items() if not {"OPT", "AQ"} & set(r)) == 133_144


def test_an_asymmetric_table_14_is_refused_on_load() -> None:
    text = Path("schemas/paper.yaml").read_text(encoding="utf-8")
    assert "  OPT: [null, 193379," in text
    with pytest.raises(SpecError, match="table14 is not symmetric: OPT → DEM 193378"):
        parse_paper_tables(text.replace("  OPT: [null, 193379,", "  OPT: [null, 193378,"))


def _routes(per_key: int, extra_aq: int) -> pa.Table:
    """Route counts of every route ``per_key``, AQ routes counting ``extra_aq`` more by product."""
    n = len(TABLE_ORDER)
    counts = np.full((n, n), per_key, dtype=np.int64)
    by_product = counts.copy()
    aq = TABLE_ORDER.index("AQ")
    by_product[aq, :] += extra_aq
    by_product[:, aq] += extra_aq
    np.fill_diagonal(counts, 0)
    np.fill_diagonal(by_product, 0)
    return route_count_long(counts, TABLE_ORDER, by_product)


def test_routes_are_compared_in_the_papers_unit() -> None:
    frame = route_comparison(_routes(1000, 500), PAPER).set_index(["source", "target"])
    row = frame.loc[("OPT", "AQ")]
    assert (row["paper_pairs"], row["release_pairs_by_product"]) == (306_563, 1500)
    assert (row["release_pairs_per_key"], row["difference_by_product"]) == (1000, 1500 - 306_563)
    assert frame.loc[("DEM", "NDVI"), "release_pairs_by_product"] == 1000
    old = _routes(1000, 0).drop_columns(["pairs_by_product"])  # a release counted per key only
    assert route_comparison(old, PAPER)["release_pairs_by_product"].isna().all()
    assert route_comparison(None, PAPER)["release_pairs_per_key"].isna().all()


def test_the_report_puts_table_14_beside_the_releases_routes(tmp_path: Path) -> None:
    from citycube.cube.release import write_parquet_atomic
    from citycube.tasks.translation import BenchmarkFiles

    release = build_small_release(tmp_path / "data")
    text = write_paper_comparison(release, CAT)["paper_md"].read_text(encoding="utf-8")
    assert "## Translation routes (AgenticCity-Bench Table 14)" in text
    assert "The release has no translation pair counts (benchmark not built)." in text
    write_parquet_atomic(_routes(1000, 500), BenchmarkFiles.published(release).route_counts_long)
    paths = write_paper_comparison(release, CAT)
    text = paths["paper_md"].read_text(encoding="utf-8")
    assert "32 of its 306 counts exceed the 171,236 (tile, year) keys" in text
    assert "| OPT → AQ | 306,563 | 1,500 | -305,063 | 1,000 |" in text
    assert "| DEM → OPT | 193,379 | 1,000 | -192,379 | 1,000 |" in text
    total = 306 * 1000 + 2 * 17 * 500
    assert (
        f"release by product {total:,} ({total - 28_249_584:+,}), release per key 306,000" in text
    )
    csv = pd.read_csv(paths["paper_route_csv"])
    assert len(csv) == 306 and csv["paper_pairs"].sum() == 28_249_584
