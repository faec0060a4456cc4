"""School capacity planning cases: eligibility, pools, strata, the hash-ordered selection, the
scorer and the direct baselines (AgenticCity-Bench App. D.1, D.3.1)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from citycube.tasks.school_capacity import (
    QUOTAS,
    balance_score,
    baseline_plan,
    eligible_schools,
    pool_of,
    score_plans,
    select_cases,
)
from sources.dfe_schools import item_records
from sources.sample.school_capacity import sample_school_item

YEARS = (2021, 2022, 2023, 2024)


@pytest.fixture(scope="module")
def sample_records(tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    root = tmp_path_factory.mktemp("school-sources")
    return item_records(sample_school_item("London", root, seed=0), "London")


def record(urn: int, year: int, **kw: object) -> dict:
    return {
        "urn": urn,
        "academic_year": year,
        "phase": kw.get("phase", "primary"),
        "capacity": kw.get("capacity", 100),
        "pupils": kw.get("pupils", 100),
        "name": f"School {urn}",
        "gias_phase": kw.get("gias_phase", "primary"),
        "tile_id": kw.get("tile_id", "London_2KM_r1_c1"),
        "location_reason": None,
    }


def test_each_exclusion_rule_is_counted() -> None:
    rows = [record(1, y) for y in YEARS]  # eligible
    rows += [record(2, y, phase="nursery", gias_phase="nursery") for y in YEARS]
    rows += [record(3, y) for y in YEARS[:3]]  # no target year
    rows += [record(4, y) for y in YEARS] + [record(4, 2022)]
    rows += [record(5, y, phase="secondary" if y == 2024 else "primary") for y in YEARS]
    rows += [record(6, y, pupils=None if y == 2022 else 90) for y in YEARS]
    rows += [record(7, y, pupils=-1 if y == 2021 else 90) for y in YEARS]
    rows += [record(8, y, capacity=0 if y == 2023 else 90) for y in YEARS]
    rows += [record(9, y, tile_id=None) for y in YEARS]
    rows += [record(10, y, gias_phase="secondary") for y in YEARS]
    schools, reasons = eligible_schools(pa.Table.from_pylist(rows))
    assert [s.urn for s in schools] == [1]
    assert reasons == Counter(
        {
            "not_primary_or_secondary": 1,
            "missing_year": 1,
            "duplicate_record": 1,
            "inconsistent_phase": 2,
            "invalid_enrollment": 2,
            "invalid_capacity": 1,
            "no_grid_coordinate": 1,
        }
    )


def test_the_sample_gives_the_papers_counts_by_the_papers_rules(sample_records: pa.Table) -> None:
    found = select_cases(sample_records)
    assert found.complete and found.cases.num_rows == 100
    refs = found.references.to_pylist()
    assert Counter(r["phase"] for r in refs) == {"primary": 60, "secondary": 40}
    assert Counter(r["stratum"] for r in refs) == {"balanced": 50, "shortage": 50}
    assert Counter((r["stratum"], r["phase"]) for r in refs) == QUOTAS
    assert len({r["tile_id"] for r in refs}) == 100  # one school per tile
    assert all(pool_of(r["tile_id"]) == "test" for r in refs)
    for r in refs:
        assert r["target_enrollment"] / r["capacity_0"] == pytest.approx(r["ratio"])
        if r["stratum"] == "balanced":
            assert 0.95 <= r["ratio"] <= 1.05
        else:
            assert r["ratio"] > 1.05
    # what the agent is given has no year, no URN and no target
    assert set(found.cases.column_names) == {
        "case_key", "city", "tile_id", "school_name", "phase", "enrollment", "capacity"
    }  # fmt: skip
    assert all(len(c["enrollment"]) == 3 for c in found.cases.to_pylist())
    again = select_cases(sample_records)
    assert again.references.equals(found.references)
    other = select_cases(sample_records, seed=7)
    assert set(other.references["urn"].to_pylist()) != set(found.references["urn"].to_pylist())


def test_co_located_schools_share_a_pool(sample_records: pa.Table) -> None:
    schools, _ = eligible_schools(sample_records)
    by_tile: dict[str, set[str]] = {}
    for s in schools:
        by_tile.setdefault(s.tile_id, set()).add(pool_of(s.tile_id))
    assert any(len([s for s in schools if s.tile_id == t]) > 1 for t in by_tile)
    assert all(len(p) == 1 for p in by_tile.values())
    assert {p for ps in by_tile.values() for p in ps} == {"dev", "test"}


def test_too_few_records_say_how_many_were_found(sample_records: pa.Table) -> None:
    few = sample_records.slice(0, 400)
    found = select_cases(few)
    assert not found.complete
    assert sum(found.achieved.values()) == found.cases.num_rows < 100
    assert "fewer cases than asked for" in found.note and "test pool holds" in found.note
    empty = select_cases(None, unavailable="London is not in the build's scope")
    assert empty.cases.num_rows == 0 and empty.note == "London is not in the build's scope"


def test_the_score_peaks_when_enrollment_meets_capacity() -> None:
    assert balance_score(100, 100) == 100.0
    assert balance_score(95, 100) == pytest.approx(95.0)
    assert balance_score(100, 95) == pytest.approx(95.0)
    assert balance_score(100, 90) < balance_score(100, 99) < 100.0


def test_plans_are_scored_against_the_held_out_enrollment() -> None:
    refs = pa.Table.from_pylist(
        [
            {"case_key": "a", "stratum": "shortage", "phase": "primary",
             "target_enrollment": 788, "capacity_0": 600},
            {"case_key": "b", "stratum": "balanced", "phase": "secondary",
             "target_enrollment": 90, "capacity_0": 100},
            {"case_key": "c", "stratum": "balanced", "phase": "primary",
             "target_enrollment": 100, "capacity_0": 100},
        ]
    )  # fmt: skip
    plans = {
        "a": {"predicted_enrollment": 782, "added_seats": 145},  # C=745: 105.77 %, shortage
        "b": {"predicted_enrollment": 92, "added_seats": 0},  # C=100: 90 %, surplus
    }
    rows = {(r["group"], r["metric"]): r for r in score_plans(refs, plans, "x").to_pylist()}
    assert rows[("all", "enrollment_mae")]["value"] == pytest.approx(4.0)
    assert rows[("all", "enrollment_mae")]["submitted"] == 2
    assert rows[("all", "balanced_rate_pct")]["value"] == 0.0  # c has no plan
    expected = (100 * 745 / 788 + 100 * 90 / 100 + 0.0) / 3
    assert rows[("all", "mean_balance_score")]["value"] == pytest.approx(expected)
    assert rows[("all", "added_seats")]["value"] == 145
    assert rows[("all", "shortfall_seats")]["value"] == 43
    assert rows[("all", "surplus_seats")]["value"] == 10
    assert rows[("all", "surplus_seats_existing")]["value"] == 10
    assert rows[("all", "surplus_seats_from_expansion")]["value"] == 0
    assert rows[("stratum:shortage", "balanced_rate_pct")]["cases"] == 1


def test_the_three_year_mean_baseline() -> None:
    plan = baseline_plan("three_year_mean", [637, 724, 753], [600, 600, 600])
    assert plan == {"predicted_enrollment": 705, "added_seats": 105}
    assert baseline_plan("three_year_mean", [1, 2, 2], [9, 9, 9])["predicted_enrollment"] == 2
    assert baseline_plan("last_year", [500, 510, 520], [600, 600, 530]) == {
        "predicted_enrollment": 520,
        "added_seats": 0,
    }
    with pytest.raises(ValueError, match="unknown strategy"):
        baseline_plan("median", [1, 2, 3], [1, 1, 1])


def test_sample_files_are_only_for_london(tmp_path: Path) -> None:
    from citycube.errors import SourceUnavailableError

    with pytest.raises(SourceUnavailableError, match="England only") as err:
        sample_school_item("Boston", tmp_path)
    assert err.value.reason == "outside_source_coverage"
