"""Which food-access reference source a source set asks for: the real Atlas adapter or its
sample twin (kept apart from the adapter, which the twin imports)."""

from __future__ import annotations

from citycube.errors import FoodAtlasSourceError
from citycube.items.protocol import SourceSetSpec
from sources.sample.food_access import SampleFoodAtlas
from sources.usda_food_atlas import FoodAtlasOptions, FoodAtlasSource


def food_atlas_source(spec: SourceSetSpec) -> FoodAtlasSource | SampleFoodAtlas:
    """The food-access reference source a source-set spec asks for: the real adapter when the
    spec has ``options.usda_food_atlas`` or its default family is not ``sample``, else the
    sample twin (with the sample family's seed)."""
    options = spec.options.get("usda_food_atlas")
    if options is not None or spec.default != "sample":
        try:
            return FoodAtlasSource(FoodAtlasOptions(**(options or {})))
        except ValueError as exc:
            raise FoodAtlasSourceError(
                f"source set {spec.name!r}: options.usda_food_atlas are not valid ({exc})"
            ) from exc
    return SampleFoodAtlas(int(spec.options.get("sample", {}).get("seed", 0)))
