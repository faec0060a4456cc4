"""The translation pair index: which modalities pair, and the Table 14 counts."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from citycube.catalogue.modalities import load_catalogue
from citycube.cube.release import OBSERVATION_SCHEMA
from citycube.tasks.pairs import (
    TABLE_ORDER,
    mask_matrix,
    modality_order,
    pair_index,
    product_matrix,
    route_count_long,
    route_count_table,
    route_counts,
    route_counts_by_product,
    write_route_heatmap,
)

CAT = load_catalogue()


def _rows(tile: str, year: int, values: dict[str, float | None]) -> list[dict]:
    """Observation rows of every field of the given modalities (None: unavailable)."""
    city, scale = tile.split("_")[0], tile.split("_")[1].lower()
    rows = []
    for code, value in values.items():
        for f in CAT.get(code).fields:
            rows.append(
                {
                    "tile_id": tile,
                    "city": city,
                    "scale": scale,
                    "year": year,
                    "modality": code,
                    "field": f.name,
                    "value": value,
                    "unit": f.unit,
                    "valid_fraction": 1.0,
                    "available": value is not None,
                    "reason": None if value is not None else "outside_source_coverage",
                    "temporal_basis": "annual",
                    "source_year": year,
                    "source_id": "test",
                    "source_version": "0",
                    "synthetic": True,
                }
            )
    return rows


def _index(rows: list[dict]) -> pa.Table:
    with duckdb.connect() as con:
        con.register("observations", pa.Table.from_pylist(rows, schema=OBSERVATION_SCHEMA))
        return pair_index(con, CAT)


def test_order_is_table_14s() -> None:
    assert modality_order(CAT) == list(TABLE_ORDER) and len(TABLE_ORDER) == 18


def test_zero_pairs_except_where_positivity_is_required() -> None:
    # NTL and RD zeros pair; ELEC, GPS and PROP zeros do not; a missing CO2 does not
    rows = _rows(
        "Boston_2KM_r1_c1",
        2020,
        {"NTL": 0.0, "RD": 0.0, "ELEC": 0.0, "GPS": 0.0, "PROP": 0.0, "CO2": None, "POP": 5.0},
    )
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["RD", "POP", "NTL"]
    assert key["n_routes"] == 6
    rows = _rows("Boston_2KM_r1_c1", 2021, {"ELEC": 3.0, "GPS": 0.5, "PROP": 9.0})
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["PROP", "ELEC", "GPS"] and key["year"] == 2021


def test_every_pairing_field_must_pass() -> None:
    rows = _rows("Lyon_5KM_r0_c0", 2020, {"WTH": 10.0, "AQ": 3.0, "OPT": 100.0})
    for row in rows:  # one of the six weather fields is missing: WTH is not offered
        if row["field"] == "prcp_mm":
            row.update(value=None, available=False, reason="no_valid_support")
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["OPT", "AQ"]


def test_property_pairs_on_its_ppp_value() -> None:
    rows = _rows("London_2KM_r0_c0", 2020, {"PROP": 5.0, "POP": 1.0})
    for row in rows:  # no PPP conversion: the local value alone does not pair
        if row["field"] == "property_mean_2017ppp":
            row.update(value=None, available=False, reason="conversion_factor_missing")
    assert _index(rows).num_rows == 0  # one modality left: no route
    rows = _rows("London_2KM_r0_c0", 2020, {"PROP": 5.0, "POP": 1.0})
    for row in rows:  # the local value is not a pairing field
        if row["field"] == "property_mean_local":
            row.update(value=None, available=False, reason="conversion_factor_missing")
    assert _index(rows).to_pylist()[0]["modalities"] == ["POP", "PROP"]


def test_non_finite_values_do_not_pair() -> None:
    rows = _rows("Tokyo_2KM_r0_c0", 2020, {"DEM": float("nan"), "NDVI": 0.1, "LC": 10.0})
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["NDVI", "LC"]


def test_counts_are_keys_offering_both_modalities() -> None:
    masks = np.array([0b0111, 0b0011, 0b0110, 0b1000])
    counts = route_counts(masks, 4)
    expected = np.array(
        [
            [0, 2, 1, 0],
            [2, 0, 2, 0],
            [1, 2, 0, 0],
            [0, 0, 0, 0],
        ]
    )
    assert (counts == expected).all()
    assert (mask_matrix(masks, 4).sum(axis=0) == [2, 3, 2, 1]).all()


def test_table_14_form_and_heatmap(tmp_path: Path) -> None:
    order = modality_order(CAT)
    rng = np.random.default_rng(3)
    masks = rng.integers(0, 1 << 18, 500)
    counts = route_counts(masks, 18)
    table = route_count_table(counts, order, CAT)
    assert table.column_names[:3] == ["source", "source_code", "OPT"]
    assert "H&F" in table.column_names and table["source"][3].as_py() == "H&F"
    assert table["OPT"][0].as_py() is None  # no self-route
    assert table["DEM"][0].as_py() == int(counts[0, 1])
    long = route_count_long(counts, order)
    assert long.num_rows == 306 and sum(long["pairs"].to_pylist()) == counts.sum()
    png = write_route_heatmap(counts, [CAT.get(c).display_code for c in order], tmp_path / "h.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("positive", [0.0, 1.0])
def test_electricity_zero_stays_in_the_cube_but_not_in_pairs(positive: float) -> None:
    rows = _rows("Boston_2KM_r0_c0", 2020, {"ELEC": positive, "NTL": 1.0, "POP": 1.0})
    (key,) = _index(rows).to_pylist()
    assert ("ELEC" in key["modalities"]) is (positive > 0)


def test_air_quality_pairs_on_either_product() -> None:
    """AQ's two products are independent: one missing does not keep the other from pairing."""
    rows = _rows("Boston_2KM_r2_c2", 2020, {"AQ": 7.0, "POP": 3.0})
    for row in rows:
        if row["field"] == "annual_mean_no2":
            row.update(value=None, available=False, reason="source_year_missing")
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["AQ", "POP"]
    rows = _rows("Boston_2KM_r2_c2", 2020, {"AQ": None, "POP": 3.0, "NTL": 1.0})
    (key,) = _index(rows).to_pylist()
    assert key["modalities"] == ["POP", "NTL"]


def test_editing_a_pairing_rule_does_not_recompute_the_cube() -> None:
    from citycube.catalogue.versions import modality_digest

    aq = CAT.get("AQ")
    edited = aq.model_copy(update={"pairing": aq.pairing.model_copy(update={"needs": "all"})})
    assert modality_digest(edited, CAT) == modality_digest(aq, CAT)


def test_products_count_aq_per_product_and_routes_the_papers_way() -> None:
    """Table 14 counts AQ once per product: a key with NO2 and PM2.5 adds two OPT → AQ pairs,
    a key with one of them adds one; one pair per key either way in ``route_counts``."""
    both = _rows("Boston_2KM_r1_c1", 2015, {"OPT": 100.0, "AQ": 5.0, "POP": 2.0})
    one = _rows("Boston_2KM_r1_c2", 2015, {"OPT": 100.0, "AQ": 5.0, "POP": 2.0})
    for row in one:
        if row["field"] == "annual_mean_no2":
            row.update(value=None, available=False, reason="outside_source_coverage")
    index = _index(both + one)
    assert [r["products"] for r in index.to_pylist()] == [[1, 2, 1], [1, 1, 1]]
    order = modality_order(CAT)
    units = product_matrix(index, order)
    by_product = route_counts_by_product(units)
    per_key = route_counts(index["modality_mask"].to_numpy(), len(order))
    opt, aq, pop = (order.index(c) for c in ("OPT", "AQ", "POP"))
    assert by_product[opt, aq] == by_product[aq, opt] == 3 and per_key[opt, aq] == 2
    assert by_product[opt, pop] == per_key[opt, pop] == 2
    assert by_product[opt, opt] == 0
    long = route_count_long(per_key, order, by_product).to_pylist()
    row = next(r for r in long if (r["source"], r["target"]) == ("AQ", "POP"))
    assert (row["pairs"], row["pairs_by_product"]) == (2, 3)
