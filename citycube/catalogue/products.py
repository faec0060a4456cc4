"""Source product specs (``schemas/sources.yaml``), validated on load."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.errors import SpecError


class ProductSpec(BaseModel):
    """A source product and its native form."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z0-9_]+$", description="Product id used by backends.")
    name: str = Field(description="Product name and version.")
    provider: str = Field(description="Who publishes it.")
    native_crs: str = Field(description="Authority code, or 'city_utm'.")
    resolution: str = Field(description="Native cell size, as published.")
    coverage: str = Field(description="Temporal coverage, as published.")
    format: Literal["raster", "vector", "points", "records", "table"] = Field(
        "raster", description="How the engine reads it."
    )

    def expected_crs(self, city: str) -> CRS:
        """The CRS a file of this product must have for a city."""
        if self.native_crs == "none":
            raise SpecError(f"{self.id} is a table without a CRS")
        if self.native_crs == "city_utm":
            return CRS.from_epsg(get_city(city).epsg)
        return CRS.from_user_input(self.native_crs)


class ProductCatalogue(BaseModel):
    """All source products."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    products: tuple[ProductSpec, ...]


@cache
def load_products() -> dict[str, ProductSpec]:
    """The packaged product specs keyed by id."""
    from citycube.catalogue.modalities import parse_yaml_spec

    text = resources.files("schemas").joinpath("sources.yaml").read_text(encoding="utf-8")
    specs = parse_yaml_spec(ProductCatalogue, text, "schemas/sources.yaml", "source spec").products
    return {p.id: p for p in specs}
