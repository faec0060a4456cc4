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
import re
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from citycube.catalogue.modalities import parse_yaml_spec
from citycube.catalogue.products import load_products
from citycube.errors import SpecError


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
    ZARR_ANNUAL = "zarr_annual"
    """One year's city window of each variable of a collection-level Zarr store, copied on the
    store's own lattice (no resampling); a derived role is the cell-wise mean of others."""


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


def platform_key(name: str | None) -> str | None:
    """A platform name in one form, whoever wrote it: lower case, words joined by hyphens, a
    hyphen before the number ('LANDSAT_7', 'Landsat 7', 'landsat7' → 'landsat-7'), as the
    Planetary Computer spells it and USGS's own STAC does not."""
    if name is None:
        return None
    key = re.sub(r"[\s_\-]+", "-", str(name).strip().lower())
    return re.sub(r"([a-z])(?=\d)", r"\1-", key)


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
        """The asset key of this band on a platform (platform names in any form)."""
        if platform is None:
            return self.asset
        wanted = platform_key(platform)
        for name, asset in self.asset_by_platform.items():
            if platform_key(name) == wanted:
                return asset
        return self.asset


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


class ZarrVariableSpec(BaseModel):
    """One role of the item and where its values come from in the store."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: str = Field(description="Role in the item (the sample twin's), e.g. 'tmin'.")
    variable: str | None = Field(None, description="Store variable read for it; None if derived.")
    mean_of: tuple[str, ...] = Field(
        default=(), description="Roles averaged cell by cell into this one (a derived role)."
    )
    store_units: str | None = Field(
        None, description="The `units` attribute the store variable must declare (checked)."
    )
    units: str = Field(description="Units written into the item's file.")
    aggregate: str = Field(description="Daymet's name of the annual aggregate: annavg, annttl.")
    title: str = Field(description="What the file holds, in a phrase.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.variable is None) == (not self.mean_of):
            raise ValueError(f"role {self.role!r}: give either a variable or mean_of, not both")
        if self.variable is not None and self.store_units is None:
            raise ValueError(f"role {self.role!r}: a store variable needs its store_units")
        return self


class ZarrSpec(BaseModel):
    """A collection-level Zarr asset (a data cube with time, y and x) and what is read of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    asset: str = Field(description="Collection asset key of the store's HTTPS root.")
    zarr_format: Literal[2, 3] = Field(description="Zarr format version of the store.")
    consolidated: bool = Field(
        description="Read consolidated metadata (the asset's xarray:open_kwargs may say so too)."
    )
    dims: tuple[str, str, str] = Field(description="Dimensions of every variable read, in order.")
    grid_mapping: str = Field(description="CF grid-mapping variable every data variable names.")
    cell_size_m: float = Field(gt=0, description="Cell size along x and y, metres.")
    drop_variables: tuple[str, ...] = Field(
        default=(), description="Store variables never opened (2-D lat/lon, time bounds)."
    )
    nodata: float = Field(description="Nodata value of the written files.")
    file_name: str = Field(
        description="Written file name; {role}, {aggregate} and {year} are filled in."
    )
    variables: tuple[ZarrVariableSpec, ...] = Field(
        min_length=1, description="Roles written, in order; derived roles after their inputs."
    )
    unpublished: dict[str, str] = Field(
        default_factory=dict,
        description="Roles of the sample twin the store does not publish → stable reason code.",
    )

    @model_validator(mode="after")
    def _roles(self) -> Self:
        roles = [v.role for v in self.variables]
        if len(set(roles)) != len(roles):
            raise ValueError(f"roles listed twice: {roles}")
        seen: set[str] = set()
        for v in self.variables:
            unknown = [r for r in v.mean_of if r not in seen]
            if unknown:
                raise ValueError(f"role {v.role!r} averages {unknown}, not listed before it")
            seen.add(v.role)
        both = sorted(set(roles) & set(self.unpublished))
        if both:
            raise ValueError(f"roles both written and unpublished: {both}")
        return self


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
    bands: tuple[BandSpec, ...] = Field(
        default=(), description="Input bands, recipe order (none for a Zarr store)."
    )
    zarr: ZarrSpec | None = Field(None, description="The collection's Zarr store (zarr_annual).")
    coverage_bbox: tuple[float, float, float, float] | None = Field(
        None,
        description="(west, south, east, north), degrees: cities whose centre lies outside get "
        "no source years (outside_source_coverage); None: every city.",
    )
    qa: QaSpec | None = Field(None, description="QA asset and invalid bits (annual products).")
    fill_value: int | None = Field(
        0, description="Raw value that marks fill in input bands (Landsat C2: 0); None: none."
    )
    scale_source: Literal["raster:bands", "none"] = Field(
        description="Where scale and offset of input bands come from."
    )
    scale_fallback: tuple[float, float] | None = Field(
        None,
        description="(scale, offset) of a band whose asset's raster:bands give none (USGS's own "
        "STAC items publish none): the provider's documented factors, e.g. Collection 2 surface "
        "reflectance (0.0000275, -0.2), surface temperature (0.00341802, 149.0). None: such a "
        "scene is refused with missing_scale before any pixel is read.",
    )
    valid_range: tuple[float, float] | None = Field(
        None,
        description="Physical values an input band may take (Collection 2 surface reflectance: "
        "0–1, i.e. counts 7273–43636); an observation with a band outside is invalid, counted "
        "and not composited. None: every value counts.",
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
    output: OutputSpec | None = Field(
        None, description="The data file written (a Zarr recipe describes one file per role)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.product not in load_products():
            raise ValueError(f"{self.product}: not a product of schemas/sources.yaml")
        if self.recipe is Recipe.ZARR_ANNUAL:
            return self._zarr_consistent()
        if self.zarr is not None:
            raise ValueError(f"{self.product}: a zarr store goes with recipe zarr_annual only")
        if self.output is None:
            raise ValueError(f"{self.product}: recipe {self.recipe} needs an output")
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
        if self.valid_range is not None and not self.valid_range[0] < self.valid_range[1]:
            raise ValueError(f"{self.product}: valid_range must rise, got {self.valid_range}")
        if self.scale_fallback is not None and self.scale_source != "raster:bands":
            raise ValueError(f"{self.product}: scale_fallback goes with scale_source raster:bands")
        if (self.recipe is Recipe.RGB_UINT8) != (self.reflectance_range is not None):
            raise ValueError(f"{self.product}: reflectance_range goes with rgb_uint8, only there")
        if self.reflectance_range is not None:
            low, high = self.reflectance_range
            if not low < high:
                raise ValueError(f"{self.product}: reflectance_range must rise, got {low}, {high}")
        return self

    def _zarr_consistent(self) -> Self:
        if self.zarr is None:
            raise ValueError(f"{self.product}: recipe zarr_annual needs a zarr store spec")
        if self.bands or self.qa is not None or self.output is not None:
            raise ValueError(f"{self.product}: a Zarr store has no bands, qa or output")
        if self.temporal != "annual" or self.first_year is None or self.last_year is None:
            raise ValueError(f"{self.product}: zarr_annual needs first_year and last_year")
        if self.first_year > self.last_year:
            raise ValueError(f"{self.product}: first_year is after last_year")
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


def read_stac_catalogue(path: Path) -> StacCatalogue:
    """A STAC products spec from a file of the packaged one's form (a source set's ``spec``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"the STAC products spec {path} cannot be read: {exc}") from exc
    return parse_stac_catalogue(text, str(path))


@cache
def load_stac_catalogue() -> StacCatalogue:
    """The packaged STAC product specs."""
    text = resources.files("schemas").joinpath("stac_products.yaml").read_text(encoding="utf-8")
    return parse_stac_catalogue(text, "schemas/stac_products.yaml")
