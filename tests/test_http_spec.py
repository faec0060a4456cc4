"""The HTTP product catalogue as data: it loads, and its rules reject broken entries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from citycube.catalogue.products import load_products
from citycube.errors import SpecError
from citycube.items.protocol import load_source_set_spec
from sources import build_source_set
from sources.http.spec import (
    load_http_products,
    load_http_vector_products,
    parse_http_products,
)

CATALOGUE = Path(__file__).resolve().parents[1] / "schemas" / "http_products.yaml"


def entries() -> dict:
    return yaml.safe_load(CATALOGUE.read_text(encoding="utf-8"))


def test_every_product_is_declared_in_the_source_catalogue_with_the_same_crs() -> None:
    products = load_products()
    for product_id, spec in load_http_products().items():
        assert product_id in products
        assert products[product_id].native_crs == spec.native_crs
    for product_id, vector in load_http_vector_products().items():
        assert products[product_id].native_crs == vector.native_crs


def test_broken_glc_and_footprint_entries_are_rejected_with_a_reason() -> None:
    data = entries()
    glc = next(p for p in data["products"] if p["product"] == "glc_fcs30d")
    glc["variables"][0]["path"] = "maps.zip"
    with pytest.raises(SpecError, match="need \\{zone\\}"):
        parse_http_products(yaml.safe_dump(data), "edited")
    data = entries()
    data["vector_products"][0]["listing"]["name_pattern"] = r"^(?P<tile>\d+)\.zip$"
    with pytest.raises(SpecError, match="named groups"):
        parse_http_products(yaml.safe_dump(data), "edited")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p[0].update(tile_grid=None), "needs tile_grid"),
        (lambda p: p[2]["variables"][0].pop("monthly"), "'monthly' is required"),
        (lambda p: p[2].update(years=[1999, 2000]), "outside 2000-2025"),
        (lambda p: p[4]["credentials"].update(env_var="eog token"), "env_var"),
        (lambda p: p[0]["variables"][0].update(path="x_{row}.zip"), "tiled paths need {row}"),
        (lambda p: p[4]["files_by_year"].pop(2012), "files_by_year must name exactly"),
        (lambda p: p[2].update(sha256={"a.gz": "XYZ"}), "64 lowercase hex"),
        (lambda p: p[3].update(access="window", packing="gzip"), "windowed reads need bare"),
        (lambda p: p.append(dict(p[0])), "declared twice"),
    ],
)
def test_broken_entries_are_rejected_with_a_reason(change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = entries()
    change(data["products"])
    with pytest.raises(SpecError, match=message.replace("{", r"\{").replace("}", r"\}")):
        parse_http_products(yaml.safe_dump(data), "edited")


def test_the_http_source_set_takes_five_products_from_http_and_the_rest_from_sample() -> None:
    spec_file = Path(__file__).resolve().parents[1] / "schemas" / "source_sets" / "http.yaml"
    sources = build_source_set(load_source_set_spec(spec_file))
    http = {p for p in sources.products() if sources.product(p).info.source_id.startswith("http:")}
    assert http == {"ghs_pop", "ghs_built_v", "odiac", "chelsa", "viirs_vnl"}
    assert sources.product("landsat_c2l2").info.synthetic
    assert not sources.product("odiac").info.synthetic
    assert sources.source_years("viirs_vnl", "Tokyo")[0] == 2012  # no request needed
