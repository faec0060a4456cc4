"""Products read from STAC APIs (``schemas/stac_products.yaml``), validated on load.

Each entry says where a product's scenes or tiles are searched (API and collection), which
assets hold its bands (per platform where names differ, as Landsat's thermal band does), where
scale and offset come from, which QA bits make a pixel unusable, how observations are combined
and what the written file looks like. The numbers live here so a reviewer can check them
against the provider's documentation without reading code; the adapters only carry them out.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from citycube.catalogue import parse_yaml_spec
from citycube.errors import SpecError
from citycube.products import load_products


class Signing(StrEnum):
    """How asset hrefs are made readable."""

    PLANETARY_COMPUTER = "planetary-computer"
    """Append a SAS token from the Planetary Computer token endpoint (Azure Blob Storage)."""
    NONE = "none"
    """Read hrefs as served."""


class Recipe(StrEnum):
    """What an item's file is made of (the numeric rule is in the adapter, named here)."""

    RGB_UINT8 = "rgb_uint8"
    """Median reflectance of clear observations per band, mapped to uint8 by a fixed range."""
    NDVI = "ndvi"
    """Per observation (nir − red) / (nir + red), then the median of clear observations."""
    SURFACE_TEMPERATURE = "surface_temperature"
    """Per-pixel mean and median of clear surface-temperature observations, Kelvin."""
    MOSAIC = "mosaic"
    """Static tiles pasted onto one grid on their own lattice (no resampling)."""


RECIPE_OUTPUT_BANDS = {
    Recipe.RGB_UINT8: 3,
    Recipe.NDVI: 1,
    Recipe.SURFACE_TEMPERATURE: 2,
    Recipe.MOSAIC: 1,
}
"""Bands each recipe writes."""
RECIPE_INPUT_BANDS = {
    Recipe.RGB_UINT8: ("red", "green", "blue"),
    Recipe.NDVI: ("red", "nir"),
    Recipe.SURFACE_TEMPERATURE: ("thermal",),
    Recipe.MOSAIC: ("data",),
}
"""Band names each recipe reads, in order."""


class BandSpec(BaseModel):
    """One input band and the asset that holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="Band name the recipe knows (red, nir, thermal, data, …).")
    asset: str = Field(description="STAC asset key holding the band.")
    asset_by_platform: dict[str, str] = Field(
        default_factory=dict,
        description="Asset key per STAC platform where it differs (landsat-7: lwir).",
    )

    def asset_for(self, platform: str | None) -> str:
        """The asset key of this band on a platform."""
        if platform is None:
            return self.asset
        return self.asset_by_platform.get(platform, self.asset)


class QaSpec(BaseModel):
    """The pixel-quality asset and the bits that make an observation unusable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    asset: str = Field(description="STAC asset key of the QA bit field.")
    invalid_bits: tuple[int, ...] = Field(
        min_length=1, description="Bit positions; a pixel with any of them set is not clear."
    )

    @field_validator("invalid_bits")
    @classmethod
    def _bits_in_range(cls, bits: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 0 <= b <= 15 for b in bits) or len(set(bits)) != len(bits):
            raise ValueError(f"invalid_bits must be distinct bit positions 0–15, got {bits}")
        return bits

    @property
    def mask(self) -> int:
        """The bits as one integer mask."""
        return sum(1 << b for b in self.invalid_bits)


class OutputSpec(BaseModel):
    """The file an item is written as: the same form as the sample twin's."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dtype: Literal["uint8", "uint16", "float32"] = Field(description="Pixel type.")
    nodata: float = Field(description="Nodata value of the data file.")
    units: str = Field(description="Units written into the file's tags.")
    band_descriptions: tuple[str, ...] = Field(min_length=1, description="Band names, in order.")
    title: str = Field(description="What the file holds, in a phrase.")


class StacProductSpec(BaseModel):
    """One source product served from a STAC collection."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    product: str = Field(description="Product id from schemas/sources.yaml.")
    collection: str = Field(description="STAC collection id.")
    version: str = Field(description="Product version as published (recorded with items).")
    licence: str = Field(description="Licence of the data as served.")
    attribution: str = Field(description="Required attribution text.")
    api_url: str | None = Field(None, description="STAC API root; default: the catalogue's.")
    signing: Signing | None = Field(None, description="How hrefs are signed; default: catalogue's.")
    temporal: Literal["annual", "static"] = Field(description="Annual composites or one static.")
    first_year: int | None = Field(None, description="First source year (annual products).")
    last_year: int | None = Field(None, description="Last source year (annual products).")
    recipe: Recipe = Field(description="How observations become the item's file.")
    bands: tuple[BandSpec, ...] = Field(min_length=1, description="Input bands, recipe order.")
    qa: QaSpec | None = Field(None, description="QA asset and invalid bits (annual products).")
    fill_value: int | None = Field(
        0, description="Raw value that marks fill in input bands (Landsat C2: 0); None: none."
    )
    scale_source: Literal["raster:bands", "none"] = Field(
        description="Where scale and offset of input bands come from."
    )
    platforms: tuple[str, ...] = Field(
        default=(), description="STAC platforms kept (empty: every platform)."
    )
    max_cloud_cover: float | None = Field(
        None, ge=0, le=100, description="Scenes above this eo:cloud_cover (%) are skipped."
    )
    max_scenes: int = Field(
        32, ge=1, description="At most this many scenes per year, least cloudy first."
    )
    reflectance_range: tuple[float, float] | None = Field(
        None, description="Reflectance mapped to uint8 1–255 (rgb_uint8 only), fixed for all."
    )
    output: OutputSpec = Field(description="The data file written.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = tuple(b.name for b in self.bands)
        wanted = RECIPE_INPUT_BANDS[self.recipe]
        if names != wanted:
            raise ValueError(
                f"{self.product}: recipe {self.recipe} reads bands {wanted}, got {names}"
            )
        count = RECIPE_OUTPUT_BANDS[self.recipe]
        if len(self.output.band_descriptions) != count:
            raise ValueError(
                f"{self.product}: recipe {self.recipe} writes {count} band(s), "
                f"output names {len(self.output.band_descriptions)}"
            )
        if self.temporal == "annual":
            if self.qa is None:
                raise ValueError(f"{self.product}: annual composites need a qa asset")
            if self.first_year is None or self.last_year is None:
                raise ValueError(f"{self.product}: annual products need first_year and last_year")
            if self.first_year > self.last_year:
                raise ValueError(f"{self.product}: first_year is after last_year")
        elif self.recipe is not Recipe.MOSAIC:
            raise ValueError(f"{self.product}: a static product is a mosaic")
        if (self.recipe is Recipe.RGB_UINT8) != (self.reflectance_range is not None):
            raise ValueError(f"{self.product}: reflectance_range goes with rgb_uint8, only there")
        if self.reflectance_range is not None:
            low, high = self.reflectance_range
            if not low < high:
                raise ValueError(f"{self.product}: reflectance_range must rise, got {low}, {high}")
        if self.product not in load_products():
            raise ValueError(f"{self.product}: not a product of schemas/sources.yaml")
        return self

    def digest(self) -> str:
        """Identity of the rules: an item made under other rules is made again."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


class StacCatalogue(BaseModel):
    """Every STAC-served product and the defaults they share."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    api_url: str = Field(description="Default STAC API root.")
    signing: Signing = Field(description="Default signing.")
    products: tuple[StacProductSpec, ...] = Field(min_length=1, description="The products.")

    @model_validator(mode="after")
    def _unique(self) -> Self:
        ids = [p.product for p in self.products]
        duplicates = sorted({p for p in ids if ids.count(p) > 1})
        if duplicates:
            raise ValueError(f"products listed twice: {duplicates}")
        return self

    def product(self, product_id: str) -> StacProductSpec:
        """One product's spec, with its API and signing resolved from the defaults."""
        for spec in self.products:
            if spec.product == product_id:
                return spec.model_copy(
                    update={
                        "api_url": spec.api_url or self.api_url,
                        "signing": spec.signing or self.signing,
                    }
                )
        raise SpecError(
            f"no STAC spec for product {product_id!r}; "
            f"schemas/stac_products.yaml declares {[p.product for p in self.products]}"
        )


def parse_stac_catalogue(text: str, origin: str = "<string>") -> StacCatalogue:
    """Parse and validate a STAC products YAML document, with a readable error."""
    return parse_yaml_spec(StacCatalogue, text, origin, "STAC products spec")


@cache
def load_stac_catalogue() -> StacCatalogue:
    """The packaged STAC product specs."""
    text = resources.files("schemas").joinpath("stac_products.yaml").read_text(encoding="utf-8")
    return parse_stac_catalogue(text, "schemas/stac_products.yaml")
