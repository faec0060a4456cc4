"""Registered classifiers that turn vector attributes into class ids (one small function each).

The catalogue names a classifier in a modality's ``rasterize.classify``; the engine looks it up
here. Each takes the features' attribute table and returns one integer class id per feature.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

Classifier = Callable[[pd.DataFrame], np.ndarray]

# OSM building-function classes (AgenticCity-Bench Table 12): 0 = no building (background), 1 =
# building
# without a usable function tag, 2–12 functions, checked in this order (first match wins).
_BUILDING_RULES: list[tuple[int, str, dict[str, set[str]]]] = [
    (
        5,
        "healthcare",
        {
            "amenity": {"hospital", "clinic", "doctors", "dentist", "pharmacy"},
            "building": {"hospital"},
            "healthcare": {"*"},
        },
    ),
    (
        4,
        "education",
        {
            "amenity": {"school", "university", "college", "kindergarten", "library"},
            "building": {"school", "university", "college", "kindergarten"},
        },
    ),
    (
        11,
        "religious",
        {
            "amenity": {"place_of_worship"},
            "building": {
                "church",
                "mosque",
                "temple",
                "cathedral",
                "chapel",
                "synagogue",
                "shrine",
            },
            "religion": {"*"},
        },
    ),
    (
        6,
        "food service",
        {
            "amenity": {"restaurant", "cafe", "fast_food", "bar", "pub", "food_court"},
        },
    ),
    (
        8,
        "transport / parking",
        {
            "amenity": {"parking", "bus_station", "ferry_terminal", "fuel"},
            "building": {"train_station", "transportation", "garage", "garages", "parking"},
            "public_transport": {"*"},
            "railway": {"station", "halt"},
        },
    ),
    (
        7,
        "civic / public",
        {
            "amenity": {
                "townhall",
                "courthouse",
                "police",
                "fire_station",
                "post_office",
                "community_centre",
                "public_building",
            },
            "building": {"public", "civic", "government"},
            "office": {"government"},
        },
    ),
    (
        9,
        "tourism / leisure",
        {
            "tourism": {"*"},
            "leisure": {"*"},
            "building": {"hotel", "stadium", "sports_hall"},
        },
    ),
    (
        10,
        "industrial / warehouse",
        {
            "building": {"industrial", "warehouse", "factory", "manufacture"},
            "landuse": {"industrial"},
        },
    ),
    (
        3,
        "commercial / retail / office",
        {
            "shop": {"*"},
            "office": {"*"},
            "building": {"commercial", "retail", "office", "supermarket", "kiosk"},
        },
    ),
    (
        2,
        "residential",
        {
            "building": {
                "residential",
                "house",
                "apartments",
                "detached",
                "semidetached_house",
                "terrace",
                "bungalow",
                "dormitory",
            },
        },
    ),
    (
        12,
        "other",
        {
            "amenity": {"*"},
            "building": {"*"},
        },
    ),
]
_UNLABELLED = {"yes", "", "building"}


def osm_building_function(features: pd.DataFrame) -> np.ndarray:
    """Class 1–12 per building from OSM tags; ``building=yes`` with no function tag → 1."""
    n = len(features)
    classes = np.zeros(n, dtype=np.uint8)
    assigned = np.zeros(n, dtype=bool)
    # A tag column holds few distinct texts, so each rule is decided once per distinct text
    # and spread to the features through the column's codes (the call is made per 10 km block).
    tags = {
        column: _TagColumn(features[column], _UNLABELLED if column == "building" else set())
        for column in {column for _, _, rules in _BUILDING_RULES for column in rules}
        if column in features
    }
    for class_id, _name, rules in _BUILDING_RULES:
        hit = np.zeros(n, dtype=bool)
        for column, values in rules.items():
            if column in tags:
                hit |= tags[column].matches(values)
        new = hit & ~assigned
        classes[new] = class_id
        assigned |= new
    classes[~assigned] = 1
    return classes


class _TagColumn:
    """One tag column as codes into its distinct texts; missing reads as an empty text."""

    def __init__(self, column: pd.Series, absent: set[str]) -> None:
        """``absent``: texts that count as no tag at all (``building=yes`` says no function)."""
        codes, distinct = pd.factorize(column, use_na_sentinel=True)
        # Code -1 (missing) picks the extra last entry of the per-text arrays.
        self._codes = codes
        self._texts = [*(str(value) for value in distinct), ""]
        self._present = np.array([t != "" and t not in absent for t in self._texts], dtype=bool)

    def matches(self, values: set[str]) -> np.ndarray:
        """Features whose tag is present and, unless ``values`` holds "*", one of ``values``."""
        if "*" in values:
            per_text = self._present
        else:
            per_text = self._present & np.array([t in values for t in self._texts], dtype=bool)
        return per_text[self._codes]


CLASSIFIERS: dict[str, Classifier] = {"osm_building_function": osm_building_function}

OSM_FUNCTION_TAG_COLUMNS = (
    "amenity",
    "shop",
    "office",
    "tourism",
    "leisure",
    "religion",
    "healthcare",
    "public_transport",
    "railway",
    "landuse",
)
"""OSM function keys written as columns next to ``building`` in building layers, in order
(null where a building has none); every family that writes buildings uses this order."""

CLASSIFIER_COLUMNS: dict[str, frozenset[str]] = {
    "osm_building_function": frozenset(c for _, _, rules in _BUILDING_RULES for c in rules)
}
"""Attribute columns each classifier reads; readers fetch only these."""


def get_classifier(name: str) -> Classifier:
    """A registered classifier by name, with an error listing what exists."""
    if name not in CLASSIFIERS:
        raise KeyError(f"unknown classifier {name!r}; registered: {sorted(CLASSIFIERS)}")
    return CLASSIFIERS[name]
