"""The OSM building-function classifier: each building gets the first rule its tags match."""

from __future__ import annotations

import numpy as np
import pandas as pd

from citycube.processing.classify import _BUILDING_RULES, _UNLABELLED, osm_building_function


def _one_by_one(row: dict[str, object]) -> int:
    """The rules read literally, one building at a time."""
    for class_id, _name, rules in _BUILDING_RULES:
        for column, values in rules.items():
            raw = row.get(column)
            text = "" if raw is None or pd.isna(raw) else str(raw)
            tagged = text != "" and not (column == "building" and text in _UNLABELLED)
            if tagged and ("*" in values or text in values):
                return class_id
    return 1


def test_classes_follow_the_rules_in_order_for_any_mix_of_tags() -> None:
    rng = np.random.default_rng(3)
    choices = {
        "building": ["yes", "", "building", "house", "church", "school", "garage", "retail"],
        "amenity": ["school", "restaurant", "parking", "bench", "place_of_worship", ""],
        "shop": ["bakery", ""],
        "religion": ["christian", ""],
        "tourism": ["hotel", ""],
        "office": ["government", "company"],
    }
    n = 2_000
    frame = pd.DataFrame(
        {
            column: pd.Series(
                [None if rng.random() < 0.5 else rng.choice(texts) for _ in range(n)],
                dtype="str",
            )
            for column, texts in choices.items()
        }
    )
    expected = [_one_by_one(row) for row in frame.to_dict("records")]
    classes = osm_building_function(frame)
    assert classes.dtype == np.uint8
    np.testing.assert_array_equal(classes, expected)
    assert len(set(expected)) >= 9  # the mix reaches most rules


def test_a_block_without_tag_columns_or_buildings_classifies() -> None:
    assert osm_building_function(pd.DataFrame({"building": ["yes", "house"]})).tolist() == [1, 2]
    assert osm_building_function(pd.DataFrame({"amenity": pd.Series([], dtype="str")})).size == 0
