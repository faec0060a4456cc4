"""Forecasting cases and their scoring on a small hand-made cube.

The cube holds HEAT, CO2 and PROP observations of Boston, London and Busan for 2009–2025 on
both grids, published in a real ``cube.duckdb``. Which 2 km tiles have a complete 2010–2024
panel is decided tile by tile below, so eligibility, selection and the references can be
checked by hand; the assets then run through Dagster as ``make run`` runs them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.tasks import build_forecast_assets
from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import (
    OBSERVATION_SCHEMA,
    Release,
    build_duckdb,
    publish_database,
    release_metadata,
    write_tiles,
)
from citycube.grid.tiles import city_grid
from citycube.tasks.forecast import (
    CASE_SCHEMA,
    ORIGINS,
    PANEL_YEARS,
    ForecastFiles,
    baseline_predictions,
    block_draws,
    bootstrap_intervals,
    score_cases,
    select_series,
    write_forecast_cases,
)
from pipelines.resources import CubeResource

CAT = load_catalogue()
CITIES = ("Boston", "London", "Busan")
YEARS = tuple(range(2009, 2026))
ELIGIBLE_LST = {"Boston": 5, "London": 8, "Busan": 1}
"""The first n 2 km tiles of each city have a complete HEAT panel; the rest miss 2012."""
CURRENCY = {"Boston": "USD", "London": "GBP"}
"""PROP record cities (Busan has none: PROP unavailable there)."""


def _value(code: str, city: int, tile: int, year: int) -> float:
    """A smooth, distinct value per tile and year."""
    t = year - 2010
    if code == "HEAT":
        return 14.0 + city + 0.1 * tile + 0.05 * t + 0.3 * np.sin(tile + year)
    if code == "CO2":
        return 500.0 + 40.0 * tile - 5.0 * t + 10.0 * city
    return (300_000.0 + 1_000.0 * tile) * 1.03**t


def _rows(city_index: int, city: str, year: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"HEAT": [], "CO2": [], "PROP": []}
    for scale in ("2km", "5km"):
        for i, tile in enumerate(city_grid(city, scale).tile_ids()):
            heat_ok = scale == "5km" or i < ELIGIBLE_LST[city] or year != 2012
            # CO2: tile 3 has incomplete support in 2015; tile 4 is unavailable in 2020
            co2_fraction = 0.9 if (i == 3 and year == 2015) else 1.0
            co2_ok = not (i == 4 and year == 2020)
            prop_ok = city in CURRENCY and i < 12 and not (i == 11 and year == 2024)
            prop_value = _value("PROP", city_index, i, year) if i != 9 else 0.0  # 9: zero
            unit = f"{CURRENCY.get(city, 'XXX')} (nominal, {year})"
            if i == 10 and year == 2016:  # tile 10 changes currency for a year
                unit = f"EUR (nominal, {year})"
            fields = {
                "HEAT": [("mean_c", _value("HEAT", city_index, i, year), heat_ok, 1.0, "°C")],
                "CO2": [
                    (
                        "carbon_tc_km2",
                        _value("CO2", city_index, i, year),
                        co2_ok,
                        co2_fraction,
                        "tonne C/km²/year",
                    )
                ],
                "PROP": [
                    ("property_mean_2017ppp", prop_value / 1.5, prop_ok, 0.8, "2017 PPP"),
                    ("property_mean_local", prop_value, prop_ok, 0.8, unit),
                    # the target: a median of cell medians, unlike the mean (zero stays zero)
                    ("property_median_local", prop_value * 0.9, prop_ok, 0.8, unit),
                ],
            }
            for code, specs in fields.items():
                for name, value, ok, fraction, field_unit in specs:
                    out[code].append(
                        {
                            "tile_id": tile,
                            "city": city,
                            "scale": scale,
                            "year": year,
                            "modality": code,
                            "field": name,
                            "value": value if ok else None,
                            "unit": field_unit,
                            "valid_fraction": fraction if ok else 0.1,
                            "available": ok,
                            "reason": None if ok else "insufficient_valid_support",
                            "temporal_basis": "annual",
                            "source_year": year,
                            "source_id": "test",
                            "source_version": "0",
                            "synthetic": True,
                        }
                    )
    return out


def make_cube(root: Path) -> Release:
    """Write the hand-made observations and stage a database over them."""
    release = Release(root / "data", "t")
    write_tiles(release)
    for ci, city in enumerate(CITIES):
        for year in YEARS:
            for code, rows in _rows(ci, city, year).items():
                path = release.observations_file(city, year, code)
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.Table.from_pylist(rows, schema=OBSERVATION_SCHEMA), path)
    meta = release_metadata(release, source_set="test", synthetic=True)
    build_duckdb(release, CAT, meta, path=release.staged_duckdb_file)
    return release


ASKED = {"lst": 50, "carbon": 60, "property": 5000}


@pytest.fixture(scope="module")
def cube(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("forecast")
    release = make_cube(root)
    result = dg.materialize(
        build_forecast_assets(),
        resources={"cube": CubeResource(data_root=str(release.data_root), release_version="t")},
        instance=dg.DagsterInstance.ephemeral(),
        run_config={
            "ops": {
                "benchmark__forecast_cases": {
                    "config": {
                        "lst_cases": ASKED["lst"],
                        "carbon_cases": ASKED["carbon"],
                        "property_cases": ASKED["property"],
                    }
                }
            }
        },
    )
    assert result.success
    publish_database(release, release_metadata(release, source_set="test", synthetic=True))
    return release


def _tables(release: Release) -> tuple[pa.Table, pa.Table, pa.Table]:
    files = ForecastFiles.published(release)
    return (
        pq.read_table(files.cases),
        pq.read_table(files.references),
        pq.read_table(files.eligibility),
    )


def test_eligibility_by_hand(cube: Release) -> None:
    _, _, eligibility = _tables(cube)
    rows = {(r["target"], r["city"]): r for r in eligibility.to_pylist()}
    for city, n in ELIGIBLE_LST.items():
        assert rows[("lst", city)]["eligible"] == n
        assert rows[("lst", city)]["unavailable"] == rows[("lst", city)]["tiles"] - n
    # carbon: tile 3 incomplete support, tile 4 a missing year
    assert rows[("carbon", "Boston")]["incomplete_support"] == 1
    assert rows[("carbon", "Boston")]["unavailable"] == 1
    assert rows[("carbon", "Boston")]["eligible"] == 169 - 2
    # property: tiles 0-11 have records; 9 is zero, 10 changes currency, 11 misses 2024
    for city in CURRENCY:
        r = rows[("property", city)]
        assert (r["eligible"], r["not_positive"], r["unit_changes"]) == (9, 1, 1)
    assert rows[("property", "Busan")]["eligible"] == 0
    # 5 km tiles never count
    assert rows[("lst", "Boston")]["tiles"] == 169


def test_case_files_hold_no_years_and_no_targets(cube: Release) -> None:
    cases, references, _ = _tables(cube)
    assert cases.schema.names == CASE_SCHEMA.names
    assert not any(
        "year" in n or n in ("reference", "case_id", "target_value") for n in cases.schema.names
    )
    assert all(re.fullmatch(r"fc_[0-9a-f]{16}", k) for k in cases["case_key"].to_pylist())
    for name in ("city", "tile_id", "unit", "aggregation", "target"):
        for text in cases[name].to_pylist():
            assert not re.search(r"(19|20)\d\d", text), (name, text)
    assert set(cases["history_periods"].to_pylist()[0]) == set(range(-10, 0))
    # the reference of a case is not its history's last value, and keys are shared
    joined = {r["case_key"]: r for r in references.to_pylist()}
    assert set(joined) == set(cases["case_key"].to_pylist())
    for case in cases.to_pylist():
        ref = joined[case["case_key"]]
        assert case["history"][-1] != ref["reference"]
        assert case["tile_id"] == ref["tile_id"] and case["target"] == ref["target"]


def test_references_and_histories_match_the_cube(cube: Release) -> None:
    cases, references, _ = _tables(cube)
    history = dict(zip(cases["case_key"].to_pylist(), cases["history"].to_pylist(), strict=True))
    field = {"lst": ("HEAT", "mean_c"), "carbon": ("CO2", "carbon_tc_km2")}
    field["property"] = ("PROP", "property_median_local")
    with duckdb.connect(str(cube.duckdb_file), read_only=True) as con:
        rows = con.execute(
            "SELECT tile_id, modality, field, year, value FROM observations "
            "WHERE scale = '2km' AND value IS NOT NULL"
        ).fetchall()
    observed: dict[tuple[str, str, str], dict[int, float]] = {}
    for tile, code, name, year, value in rows:
        observed.setdefault((tile, code, name), {})[year] = value
    for ref in references.to_pylist():
        code, name = field[ref["target"]]
        values = observed[(ref["tile_id"], code, name)]
        scale = 4.0 if ref["target"] == "carbon" else 1.0  # tonne C/km² × 4 km²
        origin = ref["origin_year"]
        assert ref["reference"] == pytest.approx(values[origin] * scale)
        expected = [values[y] * scale for y in range(origin - 10, origin)]
        assert history[ref["case_key"]] == pytest.approx(expected)
        assert ref["case_id"] == f"{ref['tile_id']}_{ref['target']}_{origin}"


def test_case_ids_counts_and_round_robin(cube: Release) -> None:
    _, references, _ = _tables(cube)
    pattern = re.compile(r"^(Boston|London|Busan)_2KM_r\d+_c\d+_(lst|carbon|property)_20(2[0-4])$")
    assert all(pattern.match(i) for i in references["case_id"].to_pylist())
    assert len(set(references["case_id"].to_pylist())) == references.num_rows
    refs = references.to_pylist()
    series = {}
    for r in refs:
        series.setdefault(r["target"], {}).setdefault(r["tile_id"], []).append(r)
    # every series has exactly the five origins
    for tiles in series.values():
        for rows in tiles.values():
            assert sorted(r["origin_year"] for r in rows) == list(ORIGINS)
    per_city = {}
    for t, tiles in series.items():
        for rows in tiles.values():
            key = (t, rows[0]["city"])
            per_city[key] = per_city.get(key, 0) + 1
    # LST asks for 10 series: 2 + 2 + 1 initial, then 5 round robin over Boston (3 left) and
    # London (6 left)
    assert per_city[("lst", "Busan")] == 1
    assert per_city[("lst", "Boston")] + per_city[("lst", "London")] == 9
    assert abs(per_city[("lst", "Boston")] - per_city[("lst", "London")]) <= 1
    # carbon asks for 12 series over three cities with plenty: 4 each
    assert [per_city[("carbon", c)] for c in CITIES] == [4, 4, 4]
    # property asks for more than exists: every eligible tile, 9 per record city
    assert per_city[("property", "Boston")] == per_city[("property", "London")] == 9
    manifest = json.loads(ForecastFiles.published(cube).manifest.read_text(encoding="utf-8"))
    assert manifest["requested"] == ASKED
    assert manifest["achieved"] == {"lst": 50, "carbon": 60, "property": 90}
    assert manifest["complete"] is False
    assert manifest["eligible_tiles"]["lst"] == ELIGIBLE_LST


def test_selection_rules() -> None:
    eligible = {"A": [f"A_{i}" for i in range(5)], "B": ["B_0"], "C": [f"C_{i}" for i in range(4)]}
    picked = select_series(eligible, "lst", 8)
    assert [p.cohort for p in picked[:5]] == ["initial"] * 5
    assert {p.tile_id for p in picked[:5]} >= {"B_0"}
    assert sum(p.city == "A" for p in picked[:5]) == sum(p.city == "C" for p in picked[:5]) == 2
    rest = picked[5:]
    assert [p.cohort for p in rest] == ["expansion"] * 3
    cities = [p.city for p in rest]
    assert "B" not in cities and cities[0] != cities[1]  # turns alternate between A and C
    assert len({p.tile_id for p in picked}) == 8
    # a city's picks do not depend on the other cities
    alone = select_series({"A": eligible["A"]}, "lst", 2)
    assert [p.tile_id for p in alone] == [p.tile_id for p in picked if p.city == "A"][:2]
    # fewer series than the initial cohort: round robin, one per city first
    assert sorted(p.city for p in select_series(eligible, "lst", 3)) == ["A", "B", "C"]
    # seeded: another seed, another order
    other = select_series(eligible, "lst", 8, initial_seed=1, expansion_seed="x")
    assert [p.tile_id for p in other] != [p.tile_id for p in picked]


def test_cases_are_deterministic(cube: Release, tmp_path: Path) -> None:
    published, draft = ForecastFiles.published(cube), ForecastFiles.draft(cube)
    names = ("cases", "references", "eligibility")
    before = {n: getattr(published, n).read_bytes() for n in names}
    write_forecast_cases(cube, ASKED)  # outside a build: from the published cube, into the draft
    assert {n: getattr(draft, n).read_bytes() for n in names} == before


def test_baselines_scored_by_hand(cube: Release) -> None:
    cases, references, _ = _tables(cube)
    scores = pq.read_table(ForecastFiles.published(cube).scores("parquet")).to_pylist()
    at = {(r["target"], r["group"], r["method"], r["metric"]): r for r in scores}
    history = dict(zip(cases["case_key"].to_pylist(), cases["history"].to_pylist(), strict=True))
    lst = [r for r in references.to_pylist() if r["target"] == "lst"]
    y = np.array([r["reference"] for r in lst])
    last = np.array([history[r["case_key"]][-1] for r in lst])
    mean10 = np.array([np.mean(history[r["case_key"]]) for r in lst])
    assert at[("lst", "all", "last_year", "mae")]["value"] == pytest.approx(np.abs(y - last).mean())
    assert at[("lst", "all", "ten_year_mean", "rmse")]["value"] == pytest.approx(
        np.sqrt(((y - mean10) ** 2).mean())
    )
    r2 = 1 - ((y - last) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert at[("lst", "all", "last_year", "r2")]["value"] == pytest.approx(r2)
    # property: per city in its currency, MAPE pooled as well
    london = [
        r for r in references.to_pylist() if r["target"] == "property" and r["city"] == "London"
    ]
    y = np.array([r["reference"] for r in london])
    last = np.array([history[r["case_key"]][-1] for r in london])
    row = at[("property", "London", "last_year", "mape")]
    assert row["value"] == pytest.approx(100 * np.mean(np.abs(y - last) / y))
    assert at[("property", "London", "last_year", "rmse")]["unit"] == "GBP (local currency)"
    assert ("property", "all", "last_year", "mape") in at
    assert ("property", "all", "last_year", "rmse") not in at  # currencies are not pooled
    # every interval brackets its point estimate here (smooth series, many tiles)
    for r in scores:
        if r["metric"] in ("mae", "rmse", "mape"):
            slack = 1e-9 * abs(r["value"])
            assert r["ci_low"] - slack <= r["value"] <= r["ci_high"] + slack, r
    # the growth rate of the sample's property makes last year's value 3 % low: MAPE ≈ 2.9 %
    assert row["value"] == pytest.approx(100 * (1 - 1 / 1.03))


def test_views_are_queryable(cube: Release) -> None:
    with duckdb.connect(str(cube.duckdb_file), read_only=True) as con:
        n = con.execute("SELECT count(*) FROM forecast_cases").fetchone()[0]
        assert n == con.execute("SELECT count(*) FROM forecast_targets").fetchone()[0] == 200
        methods = con.execute("SELECT DISTINCT method FROM forecast_scores ORDER BY 1").fetchall()
        assert methods == [("last_year",), ("ten_year_mean",)]
        assert con.execute("SELECT sum(eligible) FROM forecast_eligibility").fetchone()[0] > 0


def test_scorer_cli_is_reproducible(cube: Release, tmp_path: Path) -> None:
    from pipelines.cli import main

    _, references, _ = _tables(cube)
    refs = references.to_pylist()
    predictions = tmp_path / "mine.csv"
    lines = ["case_id,prediction"] + [f"{r['case_id']},{r['reference'] * 1.01}" for r in refs]
    predictions.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["--data", str(cube.data_root), "--release", cube.version, "forecast-score"]
    for run in ("a", "b"):
        out = tmp_path / run
        assert main([*args, "--predictions", str(predictions), "--out", str(out)]) == 0
        assert main([*args, "--out", str(out), "--replicates", "2000"]) == 0
    for suffix in ("csv", "md"):
        for stem in ("forecast_mine", "forecast_baselines"):
            a = (tmp_path / "a" / f"{stem}.{suffix}").read_bytes()
            assert a == (tmp_path / "b" / f"{stem}.{suffix}").read_bytes()
    scores = pq.read_table(tmp_path / "a" / "forecast_mine.parquet").to_pylist()
    mine = {(r["target"], r["group"], r["metric"]): r for r in scores if r["method"] == "mine"}
    assert mine[("property", "all", "mape")]["value"] == pytest.approx(1.0)
    # the baselines are the same as the asset's (same seed, same replicates)
    asset = pq.read_table(ForecastFiles.published(cube).scores("parquet"))
    cli = pq.read_table(tmp_path / "a" / "forecast_mine.parquet")
    base = [r for r in cli.to_pylist() if r["method"] != "mine"]
    assert base == asset.to_pylist()
    markdown = (tmp_path / "a" / "forecast_mine.md").read_text(encoding="utf-8")
    assert "| mine |" in markdown and "LST MAE (°C)" in markdown
    # a file covering part of a target is refused, naming the problem
    partial = tmp_path / "partial.csv"
    partial.write_text("case_id,prediction\n" + f"{refs[0]['case_id']},1.0\n", encoding="utf-8")
    assert main([*args, "--predictions", str(partial), "--out", str(tmp_path)]) == 2
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("case_id,prediction\nParis_2KM_r0_c0_lst_2022,1\n", encoding="utf-8")
    assert main([*args, "--predictions", str(unknown), "--out", str(tmp_path)]) == 2


def test_bootstrap_draws_keep_each_city_s_tile_count() -> None:
    blocks = np.array(["a1", "a1", "a2", "b1", "b2", "b3", "b3"])
    strata = np.array(["A", "A", "A", "B", "B", "B", "B"])
    names, counts = block_draws(blocks, strata, 500, 7)
    assert list(names) == ["a1", "a2", "b1", "b2", "b3"]
    assert (counts[:, :2].sum(axis=1) == 2).all() and (counts[:, 2:].sum(axis=1) == 3).all()
    again = block_draws(blocks, strata, 500, 7)[1]
    assert (counts == again).all()
    assert not (counts == block_draws(blocks, strata, 500, 8)[1]).all()


def test_bootstrap_intervals_are_sane_and_fast() -> None:
    import time

    rng = np.random.default_rng(1)
    tiles = np.repeat([f"t{i}" for i in range(44)], 5)
    cities = np.repeat([f"c{i % 15}" for i in range(44)], 5)
    y = rng.normal(20, 3, tiles.size)
    methods = {"good": y + rng.normal(0, 0.5, y.size), "bad": y + rng.normal(0, 2.0, y.size)}
    start = time.perf_counter()
    ci = bootstrap_intervals(y, methods, tiles, cities)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0  # 10,000 replicates
    assert ci == bootstrap_intervals(y, methods, tiles, cities)  # same seed, same intervals
    for method, p in methods.items():
        mae = np.abs(y - p).mean()
        low, high = ci[method]["mae"]
        assert low < mae < high
        assert ci[method]["r2"][1] <= 1.0
    assert ci["good"]["rmse"][1] < ci["bad"]["rmse"][0]
    # a constant error has no spread at all
    flat = bootstrap_intervals(y, {"shift": y + 1.5}, tiles, cities, replicates=200)
    assert flat["shift"]["mae"] == pytest.approx((1.5, 1.5))
    # one block per city: every replicate is the sample itself
    single = np.repeat([f"c{i}" for i in range(44)], 5)
    fixed = bootstrap_intervals(y, methods, tiles, single, replicates=50)
    assert fixed["good"]["rmse"][0] == pytest.approx(np.sqrt(((y - methods["good"]) ** 2).mean()))


def test_score_cases_needs_all_or_none_of_a_target() -> None:
    refs = pa.table(
        {
            "case_key": ["k1", "k2"],
            "case_id": ["A_2KM_r0_c0_lst_2020", "A_2KM_r0_c0_lst_2021"],
            "target": ["lst", "lst"],
            "city": ["A", "A"],
            "tile_id": ["A_2KM_r0_c0"] * 2,
            "origin_year": pa.array([2020, 2021], pa.int16()),
            "reference": [10.0, 12.0],
            "unit": ["°C", "°C"],
        }
    )
    with pytest.raises(ValueError, match="predicts 1 of 2 lst cases"):
        score_cases(refs, {"m": {"k1": 1.0}}, replicates=10)
    table = score_cases(refs, {"m": {"k1": 11.0, "k2": 11.0}}, replicates=10).to_pylist()
    got = {r["metric"]: r["value"] for r in table}
    assert got["mae"] == pytest.approx(1.0) and got["r2"] == pytest.approx(0.0)
    cases = pa.table({"case_key": ["k1"], "history": [[float(v) for v in range(1, 11)]]})
    assert baseline_predictions(cases) == {"last_year": {"k1": 10.0}, "ten_year_mean": {"k1": 5.5}}
    assert PANEL_YEARS[0] == 2010 and PANEL_YEARS[-1] == 2024
