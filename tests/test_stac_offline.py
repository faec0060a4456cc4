"""Offline STAC builds: searches recorded online are answered from their records offline.

A STAC API of its own (``rustac serve`` over the loopback catalogue) answers the searches of an
online fetch of Boston; it is then stopped, and the same products are fetched offline from the
records and a mirror of the storage accounts laid out as ``<mirror>/<host>/<path>``. The
composites must be the same, bit for bit; a search never recorded must fail clearly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pystac
import pytest
import rasterio
import requests

from citycube.errors import OfflineRecordError, SourceFetchError
from sources.stac import stac_adapters
from sources.stac.adapter import StacSource
from sources.stac.records import SearchRecords, search_key, unsigned
from sources.stac.search import SearchRequest
from tests.processes import stop_process
from tests.stac_fixtures import (
    BLOB,
    CITY,
    DAYMET_ACCOUNT,
    DEM_ACCOUNT,
    LANDSAT_ACCOUNT,
    SAS_TOKEN,
    StacWorld,
    start_stac_api,
    wait_for,
)

PRODUCTS_2020 = ("landsat_c2l2", "landsat_ndvi", "landsat_st", "daymet")
SECRET = SAS_TOKEN.split("sig=")[1]


def _adapters(world: StacWorld, **overrides: Any) -> dict[str, StacSource]:
    return {a.product_id: a for a in stac_adapters(world.options(**overrides))}


def _mirror(world: StacWorld, root: Path) -> Path:
    """The storage accounts as ``<mirror>/<host>/<path>`` (links to the served folders)."""
    root.mkdir(parents=True, exist_ok=True)
    for account in (LANDSAT_ACCOUNT, DEM_ACCOUNT, DAYMET_ACCOUNT):
        (root / f"{account}.{BLOB}").symlink_to(world.storage / account, target_is_directory=True)
    return root


def _arrays(item_dir: Path) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(item_dir.glob("*.tif")) + sorted(item_dir.glob("*.TIF")):
        with rasterio.open(path) as src:
            out[path.name] = src.read()
    return out


@pytest.fixture(scope="module")
def recorded(stac_world: StacWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Boston fetched online through an API of its own, which is then stopped."""
    assert stac_world.catalogue is not None
    base = tmp_path_factory.mktemp("offline")
    api, api_url = start_stac_api(stac_world.catalogue, base / "rustac.log")
    try:
        wait_for(api_url + "/", api, "rustac serve", base / "rustac.log")
        stac_world.set_faults([])
        online = _adapters(stac_world, api_url=api_url, searches_dir=str(base / "records"))
        dest = base / "online"
        items = {p: online[p].fetch(CITY, 2020, dest) for p in PRODUCTS_2020}
        items["cop_dem_glo30"] = online["cop_dem_glo30"].fetch(CITY, None, dest)
    finally:
        stop_process(api)
    with pytest.raises(requests.ConnectionError):
        requests.get(api_url + "/", timeout=2)
    return {
        "base": base,
        "api_url": api_url,
        "items": items,
        "records": base / "records",
        "mirror": _mirror(stac_world, base / "mirror"),
    }


def _offline(world: StacWorld, recorded: dict[str, Any], **overrides: Any) -> dict[str, StacSource]:
    options = {
        "api_url": recorded["api_url"],
        "searches_dir": str(recorded["records"]),
        "offline": True,
        "mirror": {},
        "mirror_dir": str(recorded["mirror"]),
        "sas_url": "http://127.0.0.1:9/unreachable",
        **overrides,
    }
    return _adapters(world, **options)


def test_an_offline_rebuild_gives_the_same_composites_without_the_api(
    stac_world: StacWorld, recorded: dict[str, Any]
) -> None:
    tokens_before = len(stac_world.sas_requests)
    served_before = len(stac_world.log_lines())
    offline = _offline(stac_world, recorded)
    dest = recorded["base"] / "offline"
    items = {p: offline[p].fetch(CITY, 2020, dest) for p in PRODUCTS_2020}
    items["cop_dem_glo30"] = offline["cop_dem_glo30"].fetch(CITY, None, dest)
    for product, item in items.items():
        online = recorded["items"][product]
        got = _arrays(Path(next(iter(item.files.values()))).parent)
        want = _arrays(Path(next(iter(online.files.values()))).parent)
        assert got and sorted(got) == sorted(want), product
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{product} {name}")
        assert item.extra.get("scene_id") == online.extra.get("scene_id"), product
    # Nothing went over the network: no token asked for, no byte served by the file server.
    assert len(stac_world.sas_requests) == tokens_before
    assert len(stac_world.log_lines()) == served_before


def test_records_hold_unsigned_hrefs_and_no_token(recorded: dict[str, Any]) -> None:
    files = sorted(Path(recorded["records"]).rglob("*.json"))
    collections = {json.loads(f.read_text())["key"]["collection"] for f in files}
    assert collections == {"landsat-c2-l2", "cop-dem-glo-30", "daymet-annual-na"}
    hrefs = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert SECRET not in text and "sig=" not in text, path
        hrefs += text.count(f".{BLOB}/")
    assert hrefs > 20


def test_an_unrecorded_search_offline_names_product_city_and_year(
    stac_world: StacWorld, recorded: dict[str, Any], tmp_path: Path
) -> None:
    offline = _offline(stac_world, recorded)
    with pytest.raises(OfflineRecordError) as caught:
        offline["landsat_st"].fetch(CITY, 2019, tmp_path)
    error = caught.value
    assert str(error).startswith("[CC203]")
    for word in ("landsat_st", "Boston", "2019", "never recorded", "online"):
        assert word in str(error)
    assert isinstance(error, SourceFetchError) and not error.transient
    assert error.reason == "search_not_recorded"
    assert not list(tmp_path.rglob("_complete.json"))


def test_an_asset_missing_from_the_mirror_offline_is_a_clear_error(
    stac_world: StacWorld, recorded: dict[str, Any], tmp_path: Path
) -> None:
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    offline = _offline(stac_world, recorded, mirror_dir=str(empty))
    with pytest.raises(OfflineRecordError) as caught:
        offline["landsat_st"].fetch(CITY, 2020, tmp_path / "dest")
    assert caught.value.reason == "asset_not_mirrored"
    for word in ("landsat_st", "Boston", "2020", str(empty)):
        assert word in str(caught.value)


# ---- the records themselves ------------------------------------------------------------------


def _item(href: str) -> pystac.Item:
    item = pystac.Item(
        "scene", None, None, pystac.utils.str_to_datetime("2020-06-12T00:00:00Z"), {}
    )
    item.add_asset("red", pystac.Asset(href))
    return item


def test_a_signed_href_is_recorded_without_its_token(tmp_path: Path) -> None:
    records = SearchRecords(tmp_path)
    request = SearchRequest("http://api", "landsat-c2-l2", (1.0, 2.0, 3.0, 4.0), None)
    blob = f"https://{LANDSAT_ACCOUNT}.{BLOB}/c/x.TIF"
    path = records.save_search(request, [_item(f"{blob}?version=2&{SAS_TOKEN}")])
    assert SECRET not in path.read_text() and "sig=" not in path.read_text()
    (loaded,) = records.load_search(request) or []
    assert loaded.assets["red"].href == f"{blob}?version=2"
    assert unsigned(f"{blob}?{SAS_TOKEN}") == blob


def test_a_record_answers_only_the_same_question(tmp_path: Path) -> None:
    records = SearchRecords(tmp_path)
    bbox = (-71.2, 42.2, -70.9, 42.5)
    request = SearchRequest("http://api/", "landsat-c2-l2", bbox, "2020-01-01/2020-12-31")
    records.save_search(request, [_item("https://a/b.TIF")])
    year = request.datetime_interval
    # The API's trailing slash and float noise in the bbox are the same question.
    same = SearchRequest("http://api", "landsat-c2-l2", tuple(v + 1e-12 for v in bbox), year)
    assert records.load_search(same) is not None
    others = [
        SearchRequest("http://api", "landsat-c2-l2", bbox, "2019-01-01/2019-12-31"),
        SearchRequest("http://api", "landsat-c2-l2", (-71.3, 42.2, -70.9, 42.5), year),
        SearchRequest("http://api", "cop-dem-glo-30", bbox, request.datetime_interval),
        SearchRequest("http://other", "landsat-c2-l2", bbox, request.datetime_interval),
        SearchRequest(
            "http://api", "landsat-c2-l2", bbox, request.datetime_interval,
            query={"eo:cloud_cover": {"lt": 60}},
        ),
        SearchRequest(
            "http://api", "landsat-c2-l2", bbox, request.datetime_interval,
            filter={"op": "<", "args": [{"property": "eo:cloud_cover"}, 60]},
        ),
    ]  # fmt: skip
    for other in others:
        assert records.load_search(other) is None, search_key(other)
    records.path(search_key(request)).write_text("{ damaged", encoding="utf-8")
    assert records.load_search(request) is None


def test_a_folder_that_cannot_take_records_costs_only_the_offline_rebuild(
    stac_world: StacWorld, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the records would go", encoding="utf-8")
    stac_world.set_faults([])
    chosen = _adapters(stac_world, searches_dir=str(blocked))
    with caplog.at_level("WARNING", logger="sources.stac.adapter"):
        item = chosen["cop_dem_glo30"].fetch(CITY, None, tmp_path / "dest")
    assert Path(item.href("data")).exists()
    assert "could not record the STAC answer" in caplog.text
