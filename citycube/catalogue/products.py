"""Source product specs (``schemas/sources.yaml``), validated on load."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.errors import SpecError

RecordForm = Literal["point", "parcel", "postcode", "admin_unit"]
"""The spatial forms a record can take (``citycube.items.records_form.SpatialForm``)."""


class PlausibleValues(BaseModel):
    """What a record's value may be in the product's unit, so a file in another unit (Wh
    for kWh: ×1000) is refused rather than summed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    record: tuple[float, float] = Field(description="Every record's value lies within [low, high].")
    median: tuple[float, float] = Field(
        description="The median of a city-year's records lies within [low, high]."
    )


class RecordChecks(BaseModel):
    """Checks a records file of the product passes before its values reach any tile."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    unit: str = Field(description="The unit of a record's value, as the ranges read.")
    key: str | None = Field(
        None, description="A column of the CSV layout that names each record once per year."
    )
    plausible: dict[RecordForm, PlausibleValues] = Field(
        default_factory=dict, description="Plausible values by spatial form (none: unchecked)."
    )


class RasterSchema(BaseModel):
    """What a raster file of the product holds, checked before any pixel is aggregated: a file
    rewritten in another type (float values cut to uint8) or with another nodata reads as data
    otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dtypes: tuple[str, ...] = Field(
        description="The pixel types the product is published in (numpy names)."
    )
    nodata: float | None = Field(
        None, description="The nodata value; a file declaring another one is refused."
    )
    scaled: bool = Field(
        False, description="The file stores scaled integers and must declare scale and offset."
    )


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
    raster: RasterSchema | None = Field(
        None, description="Raster products: the pixel type and nodata a file must have."
    )
    records: RecordChecks | None = Field(
        None, description="Record products: the key and plausible values checked at ingest."
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
