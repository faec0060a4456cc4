"""A product taken from another STAC collection by writing a spec, not code.

A second loopback API serves the DEM tiles as a collection of another name whose items call the
elevation asset ``elevation`` (as NASADEM's do on the Planetary Computer). A spec file that
differs from the packaged ``schemas/stac_products.yaml`` only in the DEM entry's collection and
asset, named by the source set's ``spec`` option, makes the family read it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import yaml

from citycube.errors import SpecError
from sources.stac import stac_adapters
from tests.processes import stop_process
from tests.stac_fixtures import CITY, StacWorld, collection, start_stac_api, wait_for

OTHER = "nasadem-loopback"
"""The other collection's id."""


@pytest.fixture(scope="module")
def other_api(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An API serving the world's DEM tiles as collection ``OTHER``, asset ``elevation``."""
    base = tmp_path_factory.mktemp("other-api")
    catalogue = base / "catalogue"
    catalogue.mkdir()
    (catalogue / f"{OTHER}.json").write_text(json.dumps(collection(OTHER)), encoding="utf-8")
    features = []
    for item in stac_world.items.values():
        if item["collection"] == "cop-dem-glo-30":
            renamed = copy.deepcopy(item)
            renamed["collection"] = OTHER
            renamed["assets"] = {"elevation": renamed["assets"].pop("data")}
            features.append(renamed)
    assert features
    (catalogue / "items.json").write_text(
        json.dumps({"type": "FeatureCollection", "features": features}), encoding="utf-8"
    )
    process, url = start_stac_api(catalogue, base / "rustac.log", (OTHER,))
    try:
        wait_for(url + "/", process, "rustac serve", base / "rustac.log")
        yield url
    finally:
        stop_process(process)


def _spec_with_dem_from(path: Path, collection_id: str, asset: str) -> Path:
    """The packaged spec with only the DEM entry's collection and asset changed."""
    text = resources.files("schemas").joinpath("stac_products.yaml").read_text(encoding="utf-8")
    spec: dict[str, Any] = yaml.safe_load(text)
    (dem,) = [p for p in spec["products"] if p["product"] == "cop_dem_glo30"]
    dem["collection"] = collection_id
    dem["bands"] = [{"name": "data", "asset": asset}]
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _dem(world: StacWorld, dest: Path, **options: Any) -> Any:
    chosen = {a.product_id: a for a in stac_adapters(world.options(**options))}
    return chosen["cop_dem_glo30"].fetch(CITY, None, dest)


def _pixels(item: Any) -> np.ndarray:
    with rasterio.open(item.href("data")) as src:
        return src.read()


def test_a_spec_file_takes_the_dem_from_another_collection(
    stac_world: StacWorld, other_api: str, tmp_path: Path
) -> None:
    spec = _spec_with_dem_from(tmp_path / "my_products.yaml", OTHER, "elevation")
    item = _dem(stac_world, tmp_path / "other", api_url=other_api, spec=str(spec))
    reference = _dem(stac_world, tmp_path / "packaged")
    np.testing.assert_array_equal(_pixels(item), _pixels(reference))  # the same tiles
    assert item.source_id.endswith(f":{OTHER}")
    assert reference.source_id.endswith(":cop-dem-glo-30")


def test_a_spec_naming_an_asset_the_items_lack_fails_clearly(
    stac_world: StacWorld, other_api: str, tmp_path: Path
) -> None:
    spec = _spec_with_dem_from(tmp_path / "wrong_asset.yaml", OTHER, "data")
    with pytest.raises(Exception) as caught:
        _dem(stac_world, tmp_path / "dest", api_url=other_api, spec=str(spec))
    message = str(caught.value)
    assert "'data'" in message and "cop_dem_glo30" in message and CITY in message


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, ("cannot be read",)),
        ("products: [", ("not valid YAML",)),
        ("api_url: x\nsigning: none\nproducts: []\n", ("invalid STAC products spec",)),
    ],
)
def test_a_spec_file_that_is_missing_or_invalid_is_refused_by_name(
    tmp_path: Path, content: str | None, words: tuple[str, ...]
) -> None:
    path = tmp_path / "products.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        stac_adapters({"spec": str(path)})
    assert str(path) in str(caught.value)
    for word in words:
        assert word in str(caught.value)
