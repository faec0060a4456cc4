"""The aggregation rules, one module each, and the registry that picks a modality's rule.

Every rule takes one :class:`RuleInput` (see :class:`Rule`) and returns the per-tile results
(:data:`~citycube.processing.rules.shared.RESULT_COLUMNS`). The catalogue's declarations
choose the rule (``is_image`` and ``rasterize``, the modality's ``aggregation``); where they
cannot tell, the item's form does (city records, a ``records`` product, else a raster).
Adding a rule is adding a module here and its entry in :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

import pandas as pd

from citycube.catalogue.modalities import Aggregation, ModalitySpec
from citycube.catalogue.products import load_products
from citycube.errors import SpecError
from citycube.items.protocol import SourceItem
from citycube.processing.records import is_records_item
from citycube.processing.rules import (
    city_records,
    image_raster,
    image_vector,
    numeric_raster,
    point_density,
    record_sums,
)
from citycube.processing.rules.shared import RuleInput

__all__ = [
    "RULES",
    "Rule",
    "RuleInput",
    "RuleKind",
    "declared_kind",
    "item_kind",
    "rule_for",
    "rule_kind",
]


class RuleKind(StrEnum):
    """How a source item becomes tile values: the registry's key."""

    IMAGE_RASTER = "image_raster"
    IMAGE_VECTOR = "image_vector"
    POINT_DENSITY = "point_density"
    CITY_RECORDS = "city_records"
    RECORD_SUMS = "record_sums"
    NUMERIC_RASTER = "numeric_raster"


class Rule(Protocol):
    """One source item of a modality onto both tile grids of a city: the per-tile results.

    Image rules also write the chips into ``release`` (telling ``on_written`` of every block)
    and report ``progress``; ``fields`` are the item's fields (a product's field group).
    """

    def __call__(self, job: RuleInput) -> pd.DataFrame: ...


RULES: Mapping[RuleKind, Rule] = MappingProxyType(
    {
        RuleKind.IMAGE_RASTER: image_raster.tile_results,
        RuleKind.IMAGE_VECTOR: image_vector.tile_results,
        RuleKind.POINT_DENSITY: point_density.tile_results,
        RuleKind.CITY_RECORDS: city_records.tile_results,
        RuleKind.RECORD_SUMS: record_sums.tile_results,
        RuleKind.NUMERIC_RASTER: numeric_raster.tile_results,
    }
)
"""Every rule by its kind."""

_IMAGE_KINDS = {True: RuleKind.IMAGE_VECTOR, False: RuleKind.IMAGE_RASTER}
"""Image rules by whether the modality declares ``rasterize`` (features drawn, not warped)."""
_AGGREGATION_KINDS = {Aggregation.LOG1P_POINT_DENSITY: RuleKind.POINT_DENSITY}
"""Non-image aggregations that decide the rule whatever the item's form."""
_FORMAT_KINDS = {"records": RuleKind.RECORD_SUMS}
"""Rules by the product's declared format; any other format is read as a numeric raster."""


def declared_kind(modality: ModalitySpec) -> RuleKind | None:
    """The rule kind the catalogue alone decides, or None when the item's form decides it."""
    if modality.is_image:
        return _IMAGE_KINDS[modality.rasterize is not None]
    return _AGGREGATION_KINDS.get(modality.aggregation)


def item_kind(item: SourceItem) -> RuleKind:
    """The rule kind an item's form decides: normalised city records, the point records of a
    ``records`` product, or a numeric raster (also for a product the products file lacks)."""
    if is_records_item(item):
        return RuleKind.CITY_RECORDS
    products = load_products()
    fmt = products[item.product].format if item.product in products else "raster"
    return _FORMAT_KINDS.get(fmt, RuleKind.NUMERIC_RASTER)


def rule_kind(modality: ModalitySpec, item: SourceItem) -> RuleKind:
    """The kind of the rule that turns ``item`` into ``modality``'s tile values."""
    declared = declared_kind(modality)
    return declared if declared is not None else item_kind(item)


def rule_for(kind: RuleKind | str) -> Rule:
    """The registered rule of a kind; an unknown kind is a spec error that names the known."""
    rule = RULES.get(kind)  # type: ignore[call-overload]  # a str kind finds its RuleKind
    if rule is None:
        raise SpecError(
            f"no aggregation rule is registered for kind {kind!r} (registered: "
            f"{', '.join(RULES)}); add a module to citycube/processing/rules/ and its entry "
            "in RULES"
        )
    return rule
