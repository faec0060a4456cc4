"""Food-access reference items: each city's state (its labelled tracts, or why it has none) is
its fetch record, and an item folder is always a whole item, replaced whole."""

from __future__ import annotations

from pathlib import Path

from citycube.items.staging import COMPLETE_MARKER
from sources.sample.food_access import SampleFoodAtlas
from sources.usda_food_atlas import TRACTS_FILE, fetch_city, item_dir, read_city


class AtlasWithoutBoston(SampleFoodAtlas):
    """The same source (same tag, same records) once it no longer serves Boston."""

    def covers(self, city: str) -> bool:
        return city != "Boston" and super().covers(city)


def test_a_city_the_source_stops_serving_reads_the_reason_and_loses_its_old_item(
    tmp_path: Path,
) -> None:
    sources = tmp_path / "sources"
    served = fetch_city(SampleFoodAtlas(0), "Boston", sources)
    folder = item_dir(SampleFoodAtlas(0), "Boston", sources)
    assert served["available"] and (folder / COMPLETE_MARKER).is_file()
    frame, reason = read_city(SampleFoodAtlas(0), "Boston", sources)
    assert reason is None and frame is not None and len(frame) == served["tracts"]

    unserved = fetch_city(AtlasWithoutBoston(0), "Boston", sources)
    assert not unserved["available"] and "not a US city" in unserved["reason"]
    assert read_city(SampleFoodAtlas(0), "Boston", sources) == (None, unserved["reason"])
    assert not folder.exists(), "the old item is removed whole"
    assert list(folder.parent.iterdir()) == [], "nothing of it is left beside"


def test_a_folder_with_stale_files_is_replaced_by_the_whole_item(tmp_path: Path) -> None:
    sources, source = tmp_path / "sources", SampleFoodAtlas(0)
    folder = item_dir(source, "Boston", sources)
    folder.mkdir(parents=True)
    (folder / "unavailable.json").write_text('{"city": "Boston", "reason": "old"}')
    (folder / TRACTS_FILE).write_bytes(b"not parquet: left by an older install")
    fetch_city(source, "Boston", sources)
    names = {p.name for p in folder.iterdir()}
    assert "unavailable.json" not in names and COMPLETE_MARKER in names
    frame, reason = read_city(source, "Boston", sources)
    assert reason is None and frame is not None and frame["label"].notna().any()


def test_a_city_not_served_has_no_item_folder_and_says_why(tmp_path: Path) -> None:
    sources, source = tmp_path / "sources", SampleFoodAtlas(0)
    fetch_city(source, "Amsterdam", sources)
    assert not item_dir(source, "Amsterdam", sources).exists()
    frame, reason = read_city(source, "Amsterdam", sources)
    assert frame is None and reason is not None and "not a US city" in reason


def test_a_city_never_fetched_or_changed_since_is_not_read(tmp_path: Path) -> None:
    sources, source = tmp_path / "sources", SampleFoodAtlas(0)
    frame, reason = read_city(source, "Boston", sources)
    assert frame is None and reason is not None and "not fetched" in reason
    fetch_city(source, "Boston", sources)
    other_seed = read_city(SampleFoodAtlas(1), "Boston", sources)
    assert other_seed[0] is None, "another source's item is not this one's"
    tracts = item_dir(source, "Boston", sources) / TRACTS_FILE
    tracts.write_bytes(tracts.read_bytes() + b"\0")
    frame, reason = read_city(source, "Boston", sources)
    assert frame is None and reason is not None and "changed since" in reason
