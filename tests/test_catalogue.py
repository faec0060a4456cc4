"""The modality catalogue is complete and rejects inconsistent declarations clearly."""

from __future__ import annotations

import pytest
import yaml

from citycube.catalogue.cities import parse_cities
from citycube.catalogue.modalities import (
    Aggregation,
    FieldRule,
    Kind,
    Temporal,
    catalogue_text,
    load_catalogue,
    parse_catalogue,
)
from citycube.errors import SpecError, UnknownModalityError

EXPECTED = {
    "BV",
    "RD",
    "LC",
    "LU",
    "HF",
    "POI",
    "ELEC",
    "NTL",
    "CO2",
    "GPS",
    "POP",
    "PROP",
    "OPT",
    "DEM",
    "NDVI",
    "WTH",
    "HEAT",
    "AQ",
}


def _doc() -> dict:
    return yaml.safe_load(catalogue_text())


def _modality(doc: dict, code: str) -> dict:
    return next(m for m in doc["modalities"] if m["code"] == code)


def test_all_18_modalities_declared_with_rules() -> None:
    cat = load_catalogue()
    assert {m.code for m in cat.modalities} == EXPECTED
    assert {"OPT", "DEM", "LC", "POP", "CO2"} <= {m.code for m in cat.enabled()}
    assert cat.get("HF").display_code == "H&F"
    assert len(cat.get("WTH").fields) == 6
    assert [f.product for f in cat.get("AQ").fields] == ["acag_no2", "acag_pm25"]


def test_enabled_modalities_cover_every_rule_class() -> None:
    cat = load_catalogue()
    enabled = cat.enabled()
    assert {m.kind for m in enabled} == set(Kind)
    assert {Temporal.ANNUAL, Temporal.EPOCH, Temporal.STATIC} <= {m.temporal for m in enabled}
    assert {
        Aggregation.AREA_MEAN,
        Aggregation.SUM_PER_NOMINAL_AREA,
        Aggregation.PIXEL_MODE,
        Aggregation.PIXEL_MEAN,
    } <= {m.aggregation for m in enabled}
    assert cat.get("POP").validity.min_valid_fraction == 0.5
    assert cat.get("OPT").validity.min_valid_fraction == 0.98


def test_lc_zero_is_a_valid_id() -> None:
    cat = load_catalogue()
    ids = cat.valid_ids(cat.get("LC"))
    assert ids is not None and 0 in ids and 255 not in ids


@pytest.mark.parametrize(
    ("code", "change", "message"),
    [
        ("LC", {"aggregation": "pixel_mean"}, "never averaged"),
        (
            "LC",
            {"chip": {"resolution_m": 25, "resampling": "average", "dtype": "uint8"}},
            "mode or nearest",
        ),
        (
            "OPT",
            {"chip": {"resolution_m": 30, "resampling": "average", "dtype": "uint8"}},
            "does not divide 1000",
        ),
        (
            "POP",
            {"chip": {"resolution_m": 25, "resampling": "average", "dtype": "float32"}},
            "no chips",
        ),
        ("POP", {"temporal": "yearly"}, "temporal"),
        ("POP", {"validity": {"min_valid_fraction": 1.5}}, "min_valid_fraction"),
        ("POP", {"surprise": 1}, "Extra inputs"),
        ("LC", {"validity": {"legend": "nope", "min_valid_fraction": 0.98}}, "legend 'nope'"),
        ("DEM", {"render": {"mode": "grey", "range": [10, 1]}}, "increasing fixed range"),
    ],
)
def test_invalid_declarations_are_rejected_clearly(code: str, change: dict, message: str) -> None:
    doc = _doc()
    _modality(doc, code).update(change)
    with pytest.raises(SpecError, match=message):
        parse_catalogue(yaml.safe_dump(doc, allow_unicode=True))


def _with_field_aggregation(code: str, aggregation: object) -> str:
    doc = _doc()
    fields = _modality(doc, code)["fields"]
    fields[0] = {**fields[0], "aggregation": aggregation}
    return yaml.safe_dump(doc, allow_unicode=True)


def test_property_median_field_declares_its_own_rule() -> None:
    prop = load_catalogue().get("PROP")
    fields = {f.name: f for f in prop.fields}
    assert list(fields) == ["property_mean_2017ppp", "property_mean_local", "property_median_local"]
    median = fields["property_median_local"]
    assert median.aggregation is not None and median.aggregation.cell_m == 500
    assert median.aggregation.rule == FieldRule.MEDIAN_OF_CELL_MEDIANS
    assert median.currency_unit and median.conversion is None
    assert [median.aggregation.cells_per_tile(s) for s in (2000, 5000)] == [16, 100]
    assert prop.aggregation_of(median) == "median_of_cell_medians (500 m cells)"
    assert prop.aggregation_of(fields["property_mean_local"]) == "area_mean"
    assert fields["property_mean_local"].aggregation is None


@pytest.mark.parametrize(
    ("code", "aggregation", "message"),
    [
        ("PROP", {"rule": "median_of_cell_medians", "cell_m": 400}, "does not divide"),
        ("PROP", {"rule": "median_of_cell_medians", "cell_m": 300}, "does not divide"),
        ("PROP", {"rule": "median_of_cell_medians", "cell_m": 0}, "greater than 0"),
        ("PROP", {"rule": "trimmed_mean", "cell_m": 500}, "unknown field aggregation rule"),
        ("PROP", {"rule": "median_of_cell_medians"}, "cell_m"),
        ("DEM", {"rule": "median_of_cell_medians", "cell_m": 500}, "only numeric modalities"),
        ("GPS", {"rule": "median_of_cell_medians", "cell_m": 500}, "carry no values"),
    ],
)
def test_bad_field_aggregations_are_refused_clearly(
    code: str, aggregation: dict, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        parse_catalogue(_with_field_aggregation(code, aggregation))


def test_duplicate_codes_rejected() -> None:
    doc = _doc()
    doc["modalities"].append(dict(_modality(doc, "CO2")))
    with pytest.raises(SpecError, match="duplicate modality codes"):
        parse_catalogue(yaml.safe_dump(doc, allow_unicode=True))


def test_broken_yaml_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        parse_catalogue("modalities: [", "broken.yaml")


def test_unknown_modality_lists_codes() -> None:
    with pytest.raises(UnknownModalityError, match="CO2"):
        load_catalogue().get("CO3")


def test_city_spec_validation() -> None:
    bad = """
cities:
  - {key: X, name: X, country: X, iso3: XXX, continent: X, epsg: 4326,
     centre: {lat: 0, lon: 0, landmark: x}, grid_2km: {rows: 1, cols: 1},
     grid_5km: {rows: 1, cols: 1}}
"""
    with pytest.raises(SpecError, match="not a WGS84 UTM zone"):
        parse_cities(bad)
