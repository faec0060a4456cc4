"""The modality catalogue: ``schemas/modalities.yaml`` parsed into validated, frozen specs.

Everything the engine does per modality (masks, thresholds, aggregation, temporal reuse, chips,
rendering) is read from here, so adding a modality is a declaration plus, where needed, one
small function.
"""

from __future__ import annotations

import hashlib
import math
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Literal, Self, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from citycube.catalogue.cities import TILE_SIZE_M
from citycube.errors import SpecError, UnknownModalityError
from citycube.io.spec_yaml import load_yaml


class Kind(StrEnum):
    """How a modality is stored: chips (image / categorical) or tile values only (numeric)."""

    IMAGE = "image"
    CATEGORICAL_IMAGE = "categorical_image"
    NUMERIC = "numeric"


class Temporal(StrEnum):
    """Temporal kinds of AgenticCity-Bench App. B.4."""

    ANNUAL = "annual"
    EPOCH = "epoch"
    STATIC = "static"
    SNAPSHOT = "snapshot"
    CITY_YEARS = "city_years"


class Aggregation(StrEnum):
    """Tile rules of AgenticCity-Bench App. B.4."""

    PIXEL_MEAN = "pixel_mean"
    PIXEL_MODE = "pixel_mode"
    AREA_MEAN = "area_mean"
    SUM_PER_NOMINAL_AREA = "sum_per_nominal_area"
    LOG1P_POINT_DENSITY = "log1p_point_density"


class FieldRule(StrEnum):
    """Tile rules a single field may declare instead of its modality's."""

    MEDIAN_OF_CELL_MEDIANS = "median_of_cell_medians"


class Resampling(StrEnum):
    """Chip resampling; categorical data only ever use nearest or mode."""

    AVERAGE = "average"
    MODE = "mode"
    NEAREST = "nearest"


class Processing(StrEnum):
    """Whether this release processes the modality or only declares it."""

    ENABLED = "enabled"
    PLANNED = "planned"


class RenderMode(StrEnum):
    """Fixed renderings (never stretched per tile)."""

    RGB = "rgb"
    GREY = "grey"
    GREY_LOG1P = "grey_log1p"
    CATEGORICAL = "categorical"
    BINARY = "binary"
    NONE = "none"


_STRICT = ConfigDict(extra="forbid", frozen=True)

MIN_LEGEND_COLOUR_DISTANCE = 20.0
"""Least RGB distance between two classes of one legend: renderings are decoded back to class
ids by the nearest legend colour (AgenticCity-Bench), so no two classes may share or nearly
share one."""


class LegendEntry(BaseModel):
    """One class of a categorical legend."""

    model_config = _STRICT
    name: str = Field(description="Class name.")
    color: tuple[int, int, int] = Field(description="Fixed RGB colour, 0–255 each.")

    @model_validator(mode="after")
    def _rgb(self) -> Self:
        if not all(0 <= c <= 255 for c in self.color):
            raise ValueError(f"colour {self.color} of class {self.name!r} is outside 0–255")
        return self


class Conversion(StrEnum):
    """Value conversions that need more than a scale and offset."""

    PPP_2017 = "ppp_2017"


class FieldAggregation(BaseModel):
    """A field's own tile rule, overriding its modality's aggregation for that field alone.

    ``median_of_cell_medians`` cuts each tile into square cells of ``cell_m`` on the tile
    lattice, takes the median of the valid source values in each cell and then the median of
    those cell medians over the cells that hold any (AgenticCity-Bench App. D's property target).
    """

    model_config = _STRICT
    rule: FieldRule = Field(description="The field's tile rule.")
    cell_m: int = Field(
        gt=0, description="Cell edge in metres on the tile lattice; divides every tile size."
    )

    @field_validator("rule", mode="before")
    @classmethod
    def _known_rule(cls, value: object) -> object:
        known = [r.value for r in FieldRule]
        if value not in known:
            raise ValueError(
                f"unknown field aggregation rule {value!r}; a field may declare one of {known}"
            )
        return value

    @model_validator(mode="after")
    def _nests(self) -> Self:
        sizes = sorted(TILE_SIZE_M.values())
        if any(size % self.cell_m for size in sizes):
            raise ValueError(
                f"cell_m {self.cell_m} m does not divide the tile sizes {sizes} m, so tiles "
                "would not hold a whole number of cells; choose a common divisor (e.g. 500)"
            )
        return self

    def cells_per_tile(self, tile_size_m: int) -> int:
        """Cells in one tile of ``tile_size_m`` (16 for 500 m cells in a 2 km tile)."""
        return (tile_size_m // self.cell_m) ** 2

    def describe(self) -> str:
        """The rule as the card and the field table show it."""
        return f"{self.rule.value} ({self.cell_m} m cells)"


class FieldSpec(BaseModel):
    """One released field: which band of which file of which product, in which unit."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Field name in observations.")
    band: int = Field(1, ge=1, description="1-based band index in the file.")
    unit: str = Field(description="Physical unit of the released value.")
    product: str | None = Field(None, description="Product override (e.g. AQ's two products).")
    role: str = Field("data", description="File role inside the source item.")
    role_by_product: dict[str, str] = Field(
        default_factory=dict, description="File role when a per-city product names it otherwise."
    )
    column: str | None = Field(None, description="Value column for point or record sources.")
    scale: float = Field(1.0, description="Unit conversion applied after the file's own scale.")
    offset: float = Field(0.0, description="Unit conversion offset (e.g. −273.15 for K → °C).")
    conversion: Conversion | None = Field(None, description="e.g. ppp_2017 for property values.")
    currency_unit: bool = Field(
        False,
        description="Money kept in the source's own currency: each row's unit names the item's "
        "ISO 4217 code and price year (e.g. 'GBP (nominal, 2020)') when the item declares one.",
    )
    aggregation: FieldAggregation | None = Field(
        None,
        description="The field's own tile rule (numeric modalities); None: the modality's. "
        "Availability still follows the modality's validity rules.",
    )

    def role_for(self, product: str) -> str:
        """The file role that holds this field in ``product``."""
        return self.role_by_product.get(product, self.role)


class RasterizeSpec(BaseModel):
    """How a vector source becomes an image on the chip grid (no buffering, no dilation)."""

    model_config = _STRICT
    layer: str = Field(description="Layer name in the vector file.")
    filter_column: str | None = Field(None, description="Keep features whose column value ...")
    filter_values: tuple[str, ...] = Field((), description="... is one of these.")
    burn_value: float | None = Field(None, description="Constant value burnt for features.")
    burn_column: str | None = Field(None, description="Numeric column burnt for features.")
    classify: str | None = Field(None, description="Registered classifier giving class ids.")
    background: float = Field(0.0, description="Value where no feature lies (valid).")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = [x is not None for x in (self.burn_value, self.burn_column, self.classify)]
        if sum(given) != 1:
            raise ValueError("rasterize needs exactly one of burn_value, burn_column, classify")
        if self.filter_values and not self.filter_column:
            raise ValueError("rasterize filter_values need a filter_column")
        return self


class Validity(BaseModel):
    """Pixel/cell validity rules and the tile availability threshold."""

    model_config = _STRICT
    nodata: float | None = Field(None, description="The source's nodata value (invalid).")
    valid_range: tuple[float, float] | None = Field(None, description="Inclusive valid range.")
    legend: str | None = Field(None, description="Legend whose ids are the only valid ids.")
    qa_invalid_bits: tuple[int, ...] = Field((), description="QA bits that invalidate a pixel.")
    min_valid_fraction: float = Field(gt=0, le=1, description="Tile availability threshold.")
    non_negative: bool = Field(
        False,
        description="A negative value is invalid (totals, prices and densities); zero stays a "
        "valid, available value.",
    )

    @model_validator(mode="after")
    def _range_order(self) -> Self:
        if self.valid_range and self.valid_range[0] > self.valid_range[1]:
            raise ValueError(f"valid_range {self.valid_range} is reversed")
        if any(not 0 <= b <= 15 for b in self.qa_invalid_bits):
            raise ValueError(f"qa_invalid_bits {self.qa_invalid_bits} must be 0–15")
        return self


class PairingRule(BaseModel):
    """When a modality may take part in a translation pair (AgenticCity-Bench App. C), beyond being
    available.

    A pairing rule, not a release rule: the release keeps a genuine zero as an available value.
    """

    model_config = _STRICT
    positive: bool = Field(False, description="Pairs only where its pairing fields are > 0.")
    fields: tuple[str, ...] = Field(
        (), description="Fields that must be available to pair; empty: every field."
    )
    needs: Literal["all", "any"] = Field(
        "all",
        description="'all': every pairing field must pass; 'any': one is enough (fields from "
        "independent products, scored over the fields present).",
    )


class ChipSpec(BaseModel):
    """How an image modality is warped onto the city's tile-aligned pixel grid."""

    model_config = _STRICT
    resolution_m: float = Field(gt=0, description="Chip pixel size; must divide 1000 m.")
    resampling: Resampling = Field(description="Warp resampling onto the chip grid.")
    dtype: str = Field(description="Stored dtype (numpy name).")

    @model_validator(mode="after")
    def _divides(self) -> Self:
        if 1000 % self.resolution_m:
            raise ValueError(
                f"chip resolution {self.resolution_m} m does not divide 1000 m, so 2 km and "
                "5 km tiles would not hold a whole number of pixels"
            )
        return self

    def pixels(self, tile_size_m: int) -> int:
        """Pixels per tile side at a tile size."""
        return round(tile_size_m / self.resolution_m)


class RenderSpec(BaseModel):
    """Fixed rendering for quick-looks."""

    model_config = _STRICT
    mode: RenderMode
    range: tuple[float, float] | None = Field(None, description="Fixed value range.")
    legend: str | None = None
    color: tuple[int, int, int] | None = None
    background: tuple[int, int, int] | None = None

    @model_validator(mode="after")
    def _needs(self) -> Self:
        ranged = (RenderMode.GREY, RenderMode.GREY_LOG1P)
        if self.mode in ranged and (self.range is None or self.range[0] >= self.range[1]):
            raise ValueError(f"render mode {self.mode} needs an increasing fixed range")
        if self.mode == RenderMode.CATEGORICAL and not self.legend:
            raise ValueError("categorical rendering needs a legend")
        return self


class ModalitySpec(BaseModel):
    """One of the 18 modalities."""

    model_config = _STRICT
    code: str = Field(pattern=r"^[A-Z0-9]+$", description="Short code, e.g. 'CO2'.")
    label: str | None = Field(None, description="Display code when it differs (e.g. 'H&F').")
    name: str = Field(description="Display name.")
    family: str = Field(pattern=r"^(function|activity|environment)$")
    kind: Kind
    temporal: Temporal
    product: str = Field(description="Default source product id for its fields.")
    product_by_city: dict[str, str] = Field(
        default_factory=dict, description="Per-city product (e.g. Daymet for North America)."
    )
    fallback_products: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Per product, the products tried in order when it cannot serve a city's "
        "source period (it does not cover the city or does not publish that year), e.g. "
        "daymet → [chelsa]. The first that serves is read for all of that product's fields.",
    )
    auxiliary_products: tuple[str, ...] = Field(
        (), description="Products needed for conversions (e.g. CPI and PPP series)."
    )
    rasterize: RasterizeSpec | None = Field(None, description="For vector sources of images.")
    fields: tuple[FieldSpec, ...] = Field(min_length=1)
    validity: Validity
    aggregation: Aggregation
    chip: ChipSpec | None = None
    render: RenderSpec
    value_range: tuple[float, float] | None = Field(
        None, description="Plausible range of released values, checked by asset checks."
    )
    pairing: PairingRule = Field(
        default_factory=PairingRule, description="Translation-pair rule (AgenticCity-Bench App. C)."
    )
    processing: Processing

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.code}: duplicate field names {names}")
        unknown = sorted(set(self.pairing.fields) - set(names))
        if unknown:
            raise ValueError(f"{self.code}: pairing names unknown fields {unknown}")
        primary = self._primary_products()
        for product, fallbacks in self.fallback_products.items():
            if product not in primary:
                raise ValueError(
                    f"{self.code}: fallback_products names {product!r}, which it does not read "
                    f"(it reads {primary})"
                )
            if product in fallbacks or len(set(fallbacks)) != len(fallbacks) or not fallbacks:
                raise ValueError(
                    f"{self.code}: the fallbacks of {product!r} must be distinct other products, "
                    f"got {list(fallbacks)}"
                )
        for f in self.fields:
            if f.aggregation is None:
                continue
            if self.kind != Kind.NUMERIC:
                raise ValueError(
                    f"{self.code}: field {f.name} declares its own aggregation, which only "
                    "numeric modalities may (image fields are summarised from their chips)"
                )
            if self.aggregation == Aggregation.LOG1P_POINT_DENSITY:
                raise ValueError(
                    f"{self.code}: field {f.name} declares {f.aggregation.rule.value}, but "
                    "log1p_point_density sources carry no values to take medians of"
                )
        categorical = self.kind == Kind.CATEGORICAL_IMAGE
        if self.kind == Kind.NUMERIC:
            if self.chip is not None:
                raise ValueError(f"{self.code}: numeric modalities have no chips")
            if self.aggregation in (Aggregation.PIXEL_MEAN, Aggregation.PIXEL_MODE):
                raise ValueError(f"{self.code}: numeric modalities need an area rule")
        else:
            if self.chip is None:
                raise ValueError(f"{self.code}: image modalities need a chip spec")
            if self.aggregation not in (Aggregation.PIXEL_MEAN, Aggregation.PIXEL_MODE):
                raise ValueError(f"{self.code}: image modalities use pixel_mean or pixel_mode")
        if categorical:
            if self.aggregation != Aggregation.PIXEL_MODE:
                raise ValueError(f"{self.code}: categorical ids are never averaged; use pixel_mode")
            if self.chip and self.chip.resampling == Resampling.AVERAGE:
                raise ValueError(f"{self.code}: categorical chips use mode or nearest resampling")
            if not self.validity.legend:
                raise ValueError(f"{self.code}: categorical modalities need a legend")
        elif self.aggregation == Aggregation.PIXEL_MODE:
            raise ValueError(f"{self.code}: pixel_mode is only for categorical modalities")
        return self

    @property
    def display_code(self) -> str:
        """The code as the papers write it."""
        return self.label or self.code

    @property
    def pairing_fields(self) -> tuple[str, ...]:
        """Fields that must be available (and positive, if the rule says so) to pair."""
        return self.pairing.fields or tuple(f.name for f in self.fields)

    @property
    def is_image(self) -> bool:
        """True for image and categorical-image modalities."""
        return self.kind != Kind.NUMERIC

    def aggregation_of(self, field: FieldSpec) -> str:
        """The tile rule of one field: its own when it declares one, else the modality's."""
        if field.aggregation is not None:
            return field.aggregation.describe()
        return self.aggregation.value

    def product_for(self, field: FieldSpec, city: str | None = None) -> str:
        """The product a field is read from (for a city, honouring per-city products)."""
        if field.product:
            return field.product
        if city is not None:
            return self.product_by_city.get(city, self.product)
        return self.product

    def _primary_products(self, city: str | None = None) -> list[str]:
        seen: list[str] = []
        cities = [city] if city is not None else [None, *self.product_by_city]
        for c in cities:
            for f in self.fields:
                p = self.product_for(f, c)
                if p not in seen:
                    seen.append(p)
        return seen

    def products(self, city: str | None = None) -> list[str]:
        """Distinct source products this modality reads first (for one city), or may read at
        all (any city, fallbacks included).

        For one city only the first choices count: a fallback product is fetched by the derived
        step when, and only when, the first choice cannot serve a period.
        """
        seen = self._primary_products(city)
        if city is None:
            for fallbacks in self.fallback_products.values():
                seen += [p for p in fallbacks if p not in seen]
        return seen

    def fallbacks(self, product: str) -> tuple[str, ...]:
        """Products tried in order when ``product`` cannot serve a city's source period."""
        return self.fallback_products.get(product, ())

    def field_groups(self, city: str) -> list[tuple[str, list[FieldSpec]]]:
        """Fields grouped by the product that serves them in ``city``; groups are independent."""
        groups: dict[str, list[FieldSpec]] = {}
        for f in self.fields:
            groups.setdefault(self.product_for(f, city), []).append(f)
        return list(groups.items())


class Catalogue(BaseModel):
    """All modalities and the legends they refer to."""

    model_config = _STRICT
    version: str
    legends: dict[str, dict[int, LegendEntry]]
    modalities: tuple[ModalitySpec, ...]

    @model_validator(mode="after")
    def _references(self) -> Self:
        codes = [m.code for m in self.modalities]
        dupes = sorted({c for c in codes if codes.count(c) > 1})
        if dupes:
            raise ValueError(f"duplicate modality codes: {dupes}")
        for name, legend in self.legends.items():
            _check_distinct_colours(name, legend)
        for m in self.modalities:
            for ref in (m.validity.legend, m.render.legend):
                if ref and ref not in self.legends:
                    raise ValueError(
                        f"{m.code}: legend {ref!r} is not declared; known: {sorted(self.legends)}"
                    )
        return self

    def get(self, code: str) -> ModalitySpec:
        """A modality by code, with an error listing the valid codes."""
        for m in self.modalities:
            if m.code == code:
                return m
        raise UnknownModalityError(
            f"unknown modality {code!r}; choose from {', '.join(m.code for m in self.modalities)}"
        )

    def enabled(self) -> list[ModalitySpec]:
        """Modalities this release processes."""
        return [m for m in self.modalities if m.processing == Processing.ENABLED]

    def valid_ids(self, modality: ModalitySpec) -> frozenset[int] | None:
        """The legend ids that count as valid for a categorical modality."""
        if not modality.validity.legend:
            return None
        return frozenset(self.legends[modality.validity.legend])


def _check_distinct_colours(name: str, legend: dict[int, LegendEntry]) -> None:
    ids = sorted(legend)
    for i, first in enumerate(ids):
        for second in ids[i + 1 :]:
            a, b = legend[first].color, legend[second].color
            distance = math.dist(a, b)
            if distance < MIN_LEGEND_COLOUR_DISTANCE:
                raise ValueError(
                    f"legend {name!r}: classes {first} and {second} have colours {a} and {b}, "
                    f"{distance:.1f} apart; give each class a colour at least "
                    f"{MIN_LEGEND_COLOUR_DISTANCE:g} from every other"
                )


SpecModel = TypeVar("SpecModel", bound=BaseModel)


def parse_yaml_spec(model: type[SpecModel], text: str, origin: str, what: str) -> SpecModel:
    """Parse and validate a YAML spec document into ``model``, with an error naming ``origin``."""
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{origin} is not valid YAML: {exc}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"invalid {what} in {origin}:\n{exc}") from exc


def parse_catalogue(text: str, origin: str = "<string>") -> Catalogue:
    """Parse and validate a modality catalogue YAML document, with a readable error."""
    return parse_yaml_spec(Catalogue, text, origin, "modality catalogue")


def catalogue_text() -> str:
    """The packaged catalogue's YAML text."""
    return resources.files("schemas").joinpath("modalities.yaml").read_text(encoding="utf-8")


@cache
def load_catalogue() -> Catalogue:
    """The packaged catalogue (validated once per process)."""
    return parse_catalogue(catalogue_text(), "schemas/modalities.yaml")


def catalogue_digest() -> str:
    """Short hash of the catalogue text, recorded in release metadata."""
    return hashlib.sha256(catalogue_text().encode()).hexdigest()[:12]
