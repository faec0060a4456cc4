"""The source asset fetches an item once; the processing step opens what it recorded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from affine import Affine

from citycube.catalogue.modalities import Temporal, load_catalogue
from citycube.cube.release import Release
from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.items.fetched import fetch_and_record, open_fetched
from citycube.items.protocol import SourceItem, SourceSet
from citycube.processing.compute import process_partition
from tests.conftest import LocalFilesProduct

CITY = "Amsterdam"
CAT = load_catalogue()


class CountingProduct(LocalFilesProduct):
    """Hand-made files that count how often they are fetched."""

    fetches = 0

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        self.fetches += 1
        return super().fetch(city, source_year, dest)


def _co2_file(tif_writer: Callable[..., Path], value: float = 1.0) -> Path:
    xmin, _, _, ymax = city_grid(CITY, "2km").bounds
    return tif_writer(
        "co2.tif",
        np.full((200, 280), value, np.float32),
        crs="EPSG:32631",
        transform=Affine(100, 0, xmin, 0, -100, ymax),
    )


def test_processing_opens_the_recorded_item_without_fetching_again(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    adapter = CountingProduct("test_co2", {(CITY, 2020): {"data": _co2_file(tif_writer)}})
    release = Release(tmp_path / "data", "t")
    fetched = fetch_and_record(adapter, Temporal.ANNUAL, CITY, 2020, release.sources_dir)
    assert adapter.fetches == 1

    co2 = CAT.get("CO2").model_copy(update={"product": "test_co2"})
    process_partition(co2, CAT, CITY, 2020, SourceSet([adapter], name="t"), release)
    assert adapter.fetches == 1
    opened = open_fetched(adapter, Temporal.ANNUAL, CITY, 2020, release.sources_dir)
    assert opened.item == fetched.item
    assert adapter.fetches == 1
    rows = pd.read_parquet(release.observations_file(CITY, 2020, "CO2"))
    assert rows["available"].any()


def test_a_file_changed_since_the_fetch_is_fetched_again(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    path = _co2_file(tif_writer)
    adapter = CountingProduct("test_co2", {(CITY, 2020): {"data": path}})
    sources_dir = tmp_path / "sources"
    fetch_and_record(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    _co2_file(tif_writer, value=2.0)  # rewritten in place, as a re-made item would be
    open_fetched(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    assert adapter.fetches == 2


def test_another_adapter_version_does_not_read_the_record(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    files = {(CITY, 2020): {"data": _co2_file(tif_writer)}}
    sources_dir = tmp_path / "sources"
    fetch_and_record(CountingProduct("test_co2", files), Temporal.ANNUAL, CITY, 2020, sources_dir)
    newer = CountingProduct("test_co2", files, version="t2")
    open_fetched(newer, Temporal.ANNUAL, CITY, 2020, sources_dir)
    assert newer.fetches == 1


class RefusingProduct(CountingProduct):
    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        self.fetches += 1
        raise SourceUnavailableError("not served here", reason="outside_source_coverage")


def test_an_unavailable_item_is_recorded_with_its_reason(tmp_path: Path) -> None:
    adapter = RefusingProduct("test_co2", {(CITY, 2020): {}})
    sources_dir = tmp_path / "sources"
    first = fetch_and_record(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    again = open_fetched(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    assert first.missing_reason == again.missing_reason == "outside_source_coverage"
    assert again.item is None
    assert adapter.fetches == 1


def test_without_a_source_asset_the_reader_fetches_and_records_nothing(
    tmp_path: Path, tif_writer: Callable[..., Path]
) -> None:
    adapter = CountingProduct("test_co2", {(CITY, 2020): {"data": _co2_file(tif_writer)}})
    sources_dir = tmp_path / "sources"
    open_fetched(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    open_fetched(adapter, Temporal.ANNUAL, CITY, 2020, sources_dir)
    assert adapter.fetches == 2
    assert not sources_dir.exists()
