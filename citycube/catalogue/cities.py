"""City specs: loaded from ``schemas/cities.yaml`` and validated on load."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from citycube.errors import SpecError, UnknownCityError
from citycube.io.spec_yaml import load_yaml

Scale = Literal["2km", "5km"]
SCALES: tuple[Scale, ...] = ("2km", "5km")
TILE_SIZE_M: dict[Scale, int] = {"2km": 2000, "5km": 5000}
PARENT_SIZE_M = 10_000


class Centre(BaseModel):
    """A documented landmark that anchors a city's grids."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    lat: float = Field(ge=-90, le=90, description="Latitude, WGS84 degrees.")
    lon: float = Field(ge=-180, le=180, description="Longitude, WGS84 degrees.")
    landmark: str = Field(description="What the point is, so the choice is documented.")


class GridShape(BaseModel):
    """Rows × columns of one tile grid, as reported in AgenticCity-Bench Table 7."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rows: int = Field(gt=0, description="Tile rows, north to south.")
    cols: int = Field(gt=0, description="Tile columns, west to east.")


class CitySpec(BaseModel):
    """One study city: CRS, centre and the shapes of its two grids."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(pattern=r"^[A-Za-z]+$", description="Id prefix used in tile ids.")
    name: str = Field(description="Display name.")
    country: str = Field(description="Country name.")
    iso3: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 3166-1 alpha-3 code.")
    continent: str = Field(description="Continent, for reporting.")
    epsg: int = Field(description="UTM EPSG code (326xx north, 327xx south).")
    centre: Centre
    grid_2km: GridShape
    grid_5km: GridShape

    @field_validator("epsg")
    @classmethod
    def _utm_only(cls, epsg: int) -> int:
        if not (32601 <= epsg <= 32660 or 32701 <= epsg <= 32760):
            raise ValueError(f"EPSG:{epsg} is not a WGS84 UTM zone (326xx or 327xx)")
        return epsg

    def grid_shape(self, scale: Scale) -> GridShape:
        """The grid shape at a scale."""
        return self.grid_2km if scale == "2km" else self.grid_5km


class CityCatalogue(BaseModel):
    """All cities, keyed uniquely."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cities: list[CitySpec]

    @field_validator("cities")
    @classmethod
    def _unique_keys(cls, cities: list[CitySpec]) -> list[CitySpec]:
        keys = [c.key for c in cities]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"duplicate city keys: {dupes}")
        return cities


def parse_cities(text: str, origin: str = "<string>") -> CityCatalogue:
    """Parse and validate a cities YAML document."""
    try:
        return CityCatalogue.model_validate(load_yaml(text))
    except ValidationError as exc:
        raise SpecError(f"invalid city spec in {origin}:\n{exc}") from exc


@cache
def load_cities() -> dict[str, CitySpec]:
    """The packaged city catalogue, keyed by city key, in declaration order."""
    text = resources.files("schemas").joinpath("cities.yaml").read_text(encoding="utf-8")
    return {c.key: c for c in parse_cities(text, "schemas/cities.yaml").cities}


def get_city(key: str) -> CitySpec:
    """Look up a city, with an error that lists the valid keys."""
    cities = load_cities()
    if key not in cities:
        raise UnknownCityError(
            f"unknown city {key!r}; choose one of: {', '.join(cities)} (or 'all')"
        )
    return cities[key]
