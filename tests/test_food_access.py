"""Food-access cases: tract-to-cell transfer, the paper's selection rule, scorer and baselines."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import pandas as pd
import pytest
import shapely
from openpyxl import load_workbook

from citycube.errors import FoodAccessCaseError, FoodAtlasSourceError
from citycube.grid.tiles import city_grid
from citycube.tasks.food_access import (
    CELLS,
    LABELS,
    QUOTAS,
    baseline_scores,
    baseline_table,
    build_case_set,
    case_tables,
    majority_class,
    score,
    select_cases,
    transfer_labels,
)
from sources.sample.backend import task_reference_sources
from sources.sample.food_access import SampleFoodAtlas
from sources.usda_food_atlas import read_atlas, read_item, read_tracts

NLA, LA, LILA = LABELS


def test_a_cell_takes_the_label_of_the_tract_covering_most_of_it() -> None:
    grid = city_grid("Boston", "2km")
    tile = grid.tile(5, 5)
    x0, y0, x1, y1 = tile.bounds
    # NW cell: 70 % lila tract, 30 % low-access tract. The rest of the tile: one NLA tract,
    # except the SE cell, half of which lies in a tract the Atlas does not label.
    tracts = gpd.GeoDataFrame(
        {"geoid": ["a", "b", "c", "d"], "label": [LILA, LA, NLA, None]},
        geometry=[
            shapely.box(x0, y1 - 1000, x0 + 700, y1),
            shapely.box(x0 + 700, y1 - 1000, x0 + 1000, y1),
            shapely.difference(
                shapely.box(x0 + 1000, y0, x1, y1).union(shapely.box(x0, y0, x0 + 1000, y1 - 1000)),
                shapely.box(x0 + 1500, y0, x1, y0 + 1000),
            ),
            shapely.box(x0 + 1500, y0, x1, y0 + 1000),
        ],
        crs=grid.crs,
    ).to_crs("EPSG:4269")
    cells = transfer_labels("Boston", tracts).set_index(["tile_id", "cell"])
    nw = cells.loc[(tile.tile_id, "s00")]
    assert nw["label"] == LILA
    assert nw["assignment_score"] == pytest.approx(0.7, abs=1e-3)
    assert nw["coverage"] == pytest.approx(1.0, abs=1e-3)
    assert nw["n_tracts"] == 2
    se = cells.loc[(tile.tile_id, "s11")]
    assert se["label"] == NLA and se["coverage"] == pytest.approx(0.5, abs=1e-3)
    far = cells.loc[(grid.tile(0, 0).tile_id, "s00")]
    assert pd.isna(far["label"]) and far["coverage"] == 0.0


Where = dict[tuple[int, int], float]


def cells_for(
    tiles: dict[tuple[int, int], list[str]],
    scores: Where | None = None,
    coverage: Where | None = None,
) -> pd.DataFrame:
    rows = []
    for (r, c), labels in tiles.items():
        for cell, label in zip(CELLS, labels, strict=True):
            rows.append(
                {
                    "city": "Boston",
                    "tile_id": f"Boston_2KM_r{r}_c{c}",
                    "row": r,
                    "col": c,
                    "cell": cell,
                    "label": label,
                    "coverage": (coverage or {}).get((r, c), 1.0),
                    "assignment_score": (scores or {}).get((r, c), 1.0),
                    "tract_geoid": "x",
                    "n_tracts": 1,
                }
            )
    return pd.DataFrame(rows)


def test_selection_prefers_lila_cells_then_separation_then_assignment_score() -> None:
    tiles = {
        (0, 0): [LILA, LILA, LA, LA],  # 2 LILA
        (0, 1): [LILA, LILA, LILA, LA],  # 3 LILA: first
        (9, 9): [LA, LA, LA, LA],  # 0 LILA, far from (0, 1)
        (1, 1): [LA, LA, LA, LA],  # 0 LILA, near
        (5, 5): [NLA, NLA, NLA, NLA],
        (5, 6): [NLA, NLA, NLA, NLA],
        (2, 2): [NLA, LA, NLA, NLA],
        (3, 3): [None, NLA, NLA, NLA],  # no label: not eligible
        (4, 4): [NLA, NLA, NLA, NLA],  # 94 % coverage: not eligible
    }
    cells = cells_for(tiles, scores={(5, 5): 0.6, (5, 6): 0.9}, coverage={(4, 4): 0.94})
    quotas = {"Boston": {"all": 3, "mixed": 1, "none": 1}}
    picked = select_cases(cells, ["Boston"], quotas=quotas)
    order = picked.cases.sort_values("order")["tile_id"].tolist()
    assert order == [
        "Boston_2KM_r0_c1",
        "Boston_2KM_r0_c0",
        "Boston_2KM_r9_c9",
        "Boston_2KM_r2_c2",
        "Boston_2KM_r5_c6",
    ]
    counts = picked.counts.set_index(["city", "stratum"])
    assert counts.loc[("Boston", "all"), "selected"] == 3
    assert counts.loc[("Boston", "none"), "eligible"] == 2
    assert len(picked.reference) == 4 * 5
    assert set(picked.reference["label"]) <= set(LABELS)


def test_a_short_stratum_and_a_city_out_of_scope_are_explained() -> None:
    cells = cells_for({(0, 0): [NLA] * 4, (3, 3): [None, NLA, NLA, NLA]})
    picked = select_cases(
        cells, ["Amsterdam", "Boston"], unavailable={"Amsterdam": "not a US city"}
    )
    counts = picked.counts.set_index(["city", "stratum"])
    assert counts.loc[("Boston", "none"), "selected"] == 1
    assert counts.loc[("Boston", "all"), "reason"] == (
        "only 0 eligible tiles in this stratum; of the city's 2 tiles 0 fail the 95 % coverage "
        "rule and 1 have a cell without a label"
    )
    assert counts.loc[("DC", "mixed"), "reason"] == "city not in this build's scope"
    assert counts.loc[("Amsterdam", ""), "reason"] == "not a US city"
    assert sum(q for city in QUOTAS.values() for q in city.values()) == 150


def test_scores_count_cells_cases_and_classes() -> None:
    reference = pd.DataFrame(
        {
            "case_id": ["a"] * 4 + ["b"] * 4,
            "cell": list(CELLS) * 2,
            "label": [NLA, NLA, LA, LILA, LILA, LILA, LILA, LILA],
        }
    )
    predictions = reference.copy()
    predictions.loc[2, "label"] = NLA  # case a: one cell wrong
    predictions = predictions.drop(index=7)  # case b: one cell missing
    scores = score(reference, predictions)
    assert scores["cell_accuracy"] == pytest.approx(6 / 8)
    assert scores["exact_case_accuracy"] == 0.0
    assert scores["recall_lila_land10"] == pytest.approx(4 / 5)
    assert scores["recall_low_access_land10"] == 0.0
    # F1: NLA 2*2/(2+3) = 0.8; LA 0; LILA 2*4/(5+4) = 8/9.
    assert scores["macro_f1"] == pytest.approx((0.8 + 0 + 8 / 9) / 3)


def test_the_majority_baseline_is_the_pools_most_frequent_class() -> None:
    cells = cells_for({(0, 0): [NLA] * 4, (0, 3): [NLA, NLA, LA, NLA], (6, 6): [LILA] * 4})
    picked = select_cases(cells, ["Boston"])
    assert majority_class(picked.pool) == NLA
    table = baseline_scores(picked).set_index("label")
    assert bool(table.loc[NLA, "majority"])
    assert table.loc[LILA, "cell_accuracy"] == pytest.approx(4 / 12)
    with pytest.raises(FoodAccessCaseError, match="CC421"):
        majority_class(picked.pool.iloc[:0])


def test_the_sample_twin_writes_the_atlas_workbook_and_tract_zips_and_fills_boston(
    tmp_path: Path,
) -> None:
    twin = task_reference_sources(seed=0)["usda_food_atlas"]
    files = twin.write_files("Boston", tmp_path / "raw")
    assert files.atlas.suffix == ".xlsx" and files.provenance["synthetic"] is True
    book = load_workbook(files.atlas, read_only=True)
    assert book.sheetnames == ["Read Me", "Variable Lookup", "Food Access Research Atlas"]
    assert "Synthetic" in str(next(book["Read Me"].iter_rows(values_only=True))[0])
    atlas = read_atlas(files.atlas)
    tracts = read_tracts(files.tracts[0])
    assert tracts.crs.to_epsg() == 4269
    assert atlas["label"].isna().any(), "the twin has NULL flags, as the real table does"
    assert len(set(tracts["geoid"]) - set(atlas["geoid"])) > 0, "and unlisted tracts"
    twin.install("Boston", tmp_path / "item")
    again = SampleFoodAtlas(0)
    again.install("Boston", tmp_path / "item2")
    first, second = read_item(tmp_path / "item"), read_item(tmp_path / "item2")
    assert first.drop(columns="geometry").equals(second.drop(columns="geometry"))
    picked = select_cases(transfer_labels("Boston", first), ["Boston"])
    assert picked.cases["stratum"].value_counts().to_dict() == QUOTAS["Boston"]
    with pytest.raises(FoodAtlasSourceError, match="US census tracts only"):
        twin.install("Amsterdam", tmp_path / "ams")


def test_a_scope_without_us_cities_gives_empty_tables_and_says_why() -> None:
    found = build_case_set({}, ["Amsterdam"], {"Amsterdam": "not a US city"})
    cases, reference, counts = case_tables(found)
    assert cases.num_rows == 0 and reference.num_rows == 0
    assert baseline_table(found).num_rows == 0
    reasons = {(r["city"], r["stratum"]): r["reason"] for r in counts.to_pylist()}
    assert reasons[("Amsterdam", "")] == "not a US city"
    assert reasons[("Boston", "all")] == "city not in this build's scope"
