"""The registry of aggregation rules: every modality of the catalogue reaches a rule, and an
unknown kind is refused with an error that names the registered ones."""

from __future__ import annotations

import inspect

import pytest

from citycube.catalogue.modalities import load_catalogue
from citycube.errors import SpecError
from citycube.items.protocol import SourceItem
from citycube.items.records_form import SpatialForm
from citycube.processing.records import SPATIAL_FORM_KEY
from citycube.processing.rules import RULES, RuleInput, RuleKind, declared_kind, rule_for, rule_kind

CAT = load_catalogue()


def _item(product: str, records_form: bool = False) -> SourceItem:
    extra = {SPATIAL_FORM_KEY: SpatialForm.point.value} if records_form else {}
    return SourceItem(
        product, "Boston", 2020, {"data": "x"}, "test", "v1", True, extra, fingerprint="f"
    )


def test_every_kind_has_one_rule_that_takes_a_rule_input() -> None:
    assert set(RULES) == set(RuleKind)
    for kind, rule in RULES.items():
        (parameter,) = inspect.signature(rule).parameters.values()
        assert parameter.annotation in (RuleInput, "RuleInput"), kind
        assert rule_for(kind) is rule and rule_for(kind.value) is rule


@pytest.mark.parametrize("code", [m.code for m in CAT.modalities])
def test_every_modality_of_the_catalogue_reaches_a_rule(code: str) -> None:
    modality = CAT.get(code)
    for product in modality.products():
        for records_form in (False, True):
            kind = rule_kind(modality, _item(product, records_form))
            assert callable(rule_for(kind)), (code, product, records_form)
            if declared_kind(modality) is not None:  # the catalogue decides, not the item
                assert kind == declared_kind(modality)


@pytest.mark.parametrize(
    ("code", "records_form", "kind"),
    [
        ("BV", False, RuleKind.IMAGE_RASTER),
        ("LC", False, RuleKind.IMAGE_RASTER),
        ("RD", False, RuleKind.IMAGE_VECTOR),
        ("POI", False, RuleKind.IMAGE_VECTOR),
        ("GPS", False, RuleKind.POINT_DENSITY),
        ("ELEC", False, RuleKind.RECORD_SUMS),
        ("ELEC", True, RuleKind.CITY_RECORDS),
        ("PROP", True, RuleKind.CITY_RECORDS),
        ("PROP", False, RuleKind.NUMERIC_RASTER),
        ("NTL", False, RuleKind.NUMERIC_RASTER),
        ("AQ", False, RuleKind.NUMERIC_RASTER),
    ],
)
def test_the_rule_follows_the_declarations_then_the_item_form(
    code: str, records_form: bool, kind: RuleKind
) -> None:
    modality = CAT.get(code)
    assert rule_kind(modality, _item(modality.products()[0], records_form)) == kind


def test_a_product_the_products_file_lacks_is_read_as_a_raster() -> None:
    assert rule_kind(CAT.get("NTL"), _item("test_ntl")) == RuleKind.NUMERIC_RASTER


def test_an_unknown_kind_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(SpecError, match=r"no aggregation rule .* 'voronoi_mean'") as raised:
        rule_for("voronoi_mean")
    assert "[CC100]" in str(raised.value)
    assert all(kind.value in str(raised.value) for kind in RuleKind)
