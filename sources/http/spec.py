"""Declarative specs of gridded source products served over plain HTTP.

Each product in ``schemas/http_products.yaml`` says where its files are (a base URL and a path
template per variable), how they are packed (zip, gzip, a bare GeoTIFF read by windows), how
they are tiled, what their raw values mean (scale, offset, units), which years they publish and
how months become a year, and on what terms (licence, attribution, credentials by environment
variable name, never by value). Adapters in ``sources/http`` read these specs; keeping the facts
here as validated data means a new release (a new ODIAC version, another VNL file name) is a
change of YAML, not of code.
"""

from __future__ import annotations

import re
import string
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from citycube.catalogue.modalities import parse_yaml_spec
from citycube.errors import SpecError

CALENDAR = range(2000, 2026)
"""Years of the cube; published years outside it are never asked for."""


class Packing(StrEnum):
    """How a served file wraps its GeoTIFF."""

    tif = "tif"
    """A bare GeoTIFF (COG or not)."""
    zip = "zip"
    """A zip archive holding ``<stem>.tif`` (GHSL tiles)."""
    gzip = "gzip"
    """A gzip-compressed GeoTIFF (ODIAC, VIIRS VNL)."""
    netcdf = "netcdf"
    """A NetCDF file (classic or NetCDF-4) read through GDAL's netCDF driver (ACAG, HILDA+)."""


class OutputFormat(StrEnum):
    """How an item file is written: the sample twin's format."""

    cog = "cog"
    """A Cloud-Optimised GeoTIFF."""
    netcdf = "netcdf"
    """A CF NetCDF-4 file with one variable (the ACAG twins)."""


class Access(StrEnum):
    """How the adapter gets at the pixels."""

    download = "download"
    """Whole files through the shared download manager (cached, resumable, verified)."""
    window = "window"
    """Windowed reads of remote COGs over GDAL ``/vsicurl/`` (only the city's blocks)."""


class Tiling(StrEnum):
    """How the product splits the globe into files."""

    none = "none"
    """One global file per period and variable."""
    ghsl = "ghsl"
    """The GHSL tile grid (rows ``R``, columns ``C``, counted from 1)."""
    glc_fcs30d = "glc_fcs30d"
    """GLC_FCS30D's 5° tiles, named by their north-west corner (``E105N25``: 105-110° E,
    20-25° N) and packed in one zip per 10° band of longitude (``{zone}``, e.g. ``E100-E105``).
    Tiles keep their own geotransforms: 5° is no whole number of 30 m pixels."""


class TemporalForm(StrEnum):
    """How files map to source years."""

    epochs = "epochs"
    """One file set per epoch year (GHSL's 5-year epochs)."""
    annual = "annual"
    """One file set per year."""
    monthly_to_annual = "monthly_to_annual"
    """Twelve monthly files per year, aggregated to one annual value per cell."""


class MonthlyAggregation(StrEnum):
    """How twelve months of a variable become its annual value."""

    sum = "sum"
    """Total over the year (emissions, precipitation)."""
    day_weighted_mean = "day_weighted_mean"
    """Mean over the year's days: each month weighs by its length (temperatures, fluxes)."""


class FileTiling(BaseModel):
    """How a product is cut into files: a regular grid of file tiles in the product CRS, numbered
    from the north-west corner (not a pixel grid: each file has its own lattice)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    origin_xy: tuple[float, float] = Field(description="Upper-left corner (x, y) of tile R1_C1.")
    tile_size: float = Field(gt=0, description="Tile width and height in CRS units.")
    rows: int = Field(gt=0, description="Rows of tiles.")
    cols: int = Field(gt=0, description="Columns of tiles.")


class Credentials(BaseModel):
    """A token the server wants, named by the environment variable that holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env_var: str = Field(
        pattern=r"^[A-Z][A-Z0-9_]*$", description="Environment variable with the token."
    )
    header: str = Field(default="Authorization", description="Request header that carries it.")
    scheme: str = Field(default="Bearer", description="Prefix before the token in the header.")
    how_to_get: str = Field(description="Where a user obtains the token.")


class Variable(BaseModel):
    """One served variable: where its files are, what its raw values mean, how it is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9_]+$", description="Variable name (band description).")
    role: str = Field(default="data", description="Role of the item file it is written to.")
    path: str = Field(description="Path template under the base URL (placeholders below).")
    output_file: str = Field(
        description="Item file name template ({year}, {served_stem}: the served name unpacked)."
    )
    raw_scale: float = Field(
        default=1.0, description="Served value = raw * raw_scale + raw_offset."
    )
    raw_offset: float = Field(default=0.0, description="See raw_scale.")
    raw_units: str = Field(description="Units of the served (scaled) values, as published.")
    to_output: float = Field(
        default=1.0, description="Factor from served units to output units (after the offset)."
    )
    output_offset: float = Field(default=0.0, description="Added after to_output.")
    output_units: str = Field(description="Units written, the sample twin's.")
    monthly: MonthlyAggregation | None = Field(
        default=None, description="Aggregation of months (monthly_to_annual products only)."
    )
    output_dtype: str = Field(default="float32", description="Stored dtype of the written file.")
    output_scale: float = Field(default=1.0, description="GDAL scale of the written band.")
    output_add: float = Field(default=0.0, description="GDAL offset of the written band.")
    netcdf_variable: str | None = Field(
        default=None, description="Variable read from a served NetCDF (netcdf packing only)."
    )
    class_map: dict[int, int] = Field(
        default_factory=dict,
        description="Served class id -> the twin's legend id (categorical products); ids not "
        "listed are kept as served.",
    )
    output_variable: str | None = Field(
        default=None, description="Variable name of a NetCDF item file (netcdf output only)."
    )
    long_name: str | None = Field(default=None, description="long_name of a NetCDF item file.")
    member: str | None = Field(
        default=None,
        description="Name of the GeoTIFF inside a zip holding many (any folder); placeholders "
        "as in path. Default: the served file's stem + '.tif'.",
    )
    band_first_year: int | None = Field(
        default=None,
        description="For files with one band per year: the year of band 1 (band = year - "
        "band_first_year + 1).",
    )


class HttpProductSpec(BaseModel):
    """One product served over HTTP and everything an adapter needs to fetch it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    product: str = Field(description="Product id in schemas/sources.yaml.")
    name: str = Field(description="Product name and release.")
    version: str = Field(description="Release string recorded on every item.")
    base_url: str = Field(pattern=r"^https?://", description="Server and root path.")
    packing: Packing = Field(description="How a file wraps its GeoTIFF.")
    access: Access = Field(default=Access.download, description="Whole files or windows.")
    tiling: Tiling = Field(default=Tiling.none, description="Global files or a tile grid.")
    tile_grid: FileTiling | None = Field(default=None, description="Required for tiled products.")
    native_crs: str = Field(description="CRS of the served files.")
    resolution: float = Field(gt=0, description="Cell size in CRS units.")
    lattice_origin: tuple[float, float] = Field(
        description="A corner (x, y) of the product's global cell lattice."
    )
    nodata: float = Field(description="Nodata written to item files (the sample twin's).")
    raw_nodata: float | None = Field(
        default=None, description="Nodata of served files that declare none in their header."
    )
    fill_values: list[float] = Field(
        default_factory=list,
        description="Served values the provider documents as fill (no data): always invalid, "
        "never a class or a number, whatever the file header says.",
    )
    temporal: TemporalForm = Field(description="How files map to source years.")
    years: list[int] = Field(description="Source years published within 2000-2025.")
    files_by_year: dict[int, str] = Field(
        default_factory=dict,
        description="Per-year value of the {file} placeholder, when names carry build stamps.",
    )
    variables: list[Variable] = Field(min_length=1, description="Served variables, in band order.")
    sha256: dict[str, str] = Field(
        default_factory=dict, description="Published or pinned digests by served file name."
    )
    licence: str = Field(description="Licence of the data as served.")
    attribution: str = Field(description="Required attribution text.")
    credentials: Credentials | None = Field(default=None, description="Token, when required.")
    bytes_per_file: int = Field(gt=0, description="Typical served file size, for estimates.")
    unconfirmed: list[str] = Field(
        default_factory=list, description="Facts that could not be confirmed from public sources."
    )
    cell_rel_tol: float = Field(
        default=1e-6,
        gt=0,
        description="Relative tolerance of the served cell size (NetCDF coordinates stored in "
        "single precision are a few 1e-5 off).",
    )
    categorical: bool = Field(
        default=False, description="Class ids: never scaled, overviews by nearest neighbour."
    )
    output_format: OutputFormat = Field(
        default=OutputFormat.cog, description="Format of the item file (the twin's)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.tiling != Tiling.none and self.tile_grid is None:
            raise ValueError(f"{self.product}: a {self.tiling.value}-tiled product needs tile_grid")
        if self.access == Access.window and (
            self.packing != Packing.tif or self.tiling != Tiling.none
        ):
            raise ValueError(f"{self.product}: windowed reads need bare, untiled GeoTIFFs")
        outside = sorted(set(self.years) - set(CALENDAR))
        if outside:
            raise ValueError(f"{self.product}: years {outside} lie outside 2000-2025")
        if self.packing == Packing.netcdf and any(
            v.netcdf_variable is None for v in self.variables
        ):
            raise ValueError(f"{self.product}: netcdf packing needs netcdf_variable per variable")
        if self.output_format == OutputFormat.netcdf and (
            len(self.variables) != 1 or self.variables[0].output_variable is None
        ):
            raise ValueError(
                f"{self.product}: netcdf output needs one variable with output_variable"
            )
        if self.files_by_year and set(self.files_by_year) != set(self.years):
            raise ValueError(f"{self.product}: files_by_year must name exactly the years")
        monthly = self.temporal == TemporalForm.monthly_to_annual
        allowed = {"year", "yy", "mm", "epoch", "row", "col", "var", "file", "tile", "zone"}
        for variable in self.variables:
            where = f"{self.product}.{variable.name}"
            if monthly != (variable.monthly is not None):
                raise ValueError(
                    f"{where}: 'monthly' is required for, and only for, monthly_to_annual products"
                )
            used = _placeholders(variable.path)
            if used - allowed:
                raise ValueError(
                    f"{self.product}.{variable.name}: unknown {sorted(used - allowed)}"
                )
            if monthly and "mm" not in used:
                raise ValueError(f"{where}: monthly paths need {{mm}}")
            if self.tiling == Tiling.ghsl and not {"row", "col"} <= used:
                raise ValueError(
                    f"{self.product}.{variable.name}: tiled paths need {{row}}, {{col}}"
                )
            if self.tiling == Tiling.glc_fcs30d and not (
                {"zone"} <= used and variable.member and "tile" in _placeholders(variable.member)
            ):
                raise ValueError(f"{where}: glc_fcs30d paths need {{zone}} and members {{tile}}")
            if "file" in used and not self.files_by_year:
                raise ValueError(f"{where}: {{file}} needs files_by_year")
        by_role: dict[str, set[str]] = {}
        for variable in self.variables:
            by_role.setdefault(variable.role, set()).add(variable.output_file)
        mixed = sorted(role for role, names in by_role.items() if len(names) > 1)
        if mixed:
            raise ValueError(f"{self.product}: variables of role(s) {mixed} name different files")
        bad = [k for k, v in self.sha256.items() if not re.fullmatch(r"[0-9a-f]{64}", v)]
        if bad:
            raise ValueError(f"{self.product}: sha256 of {bad} is not 64 lowercase hex digits")
        return self

    def roles(self) -> dict[str, list[Variable]]:
        """Variables grouped by the item file (role) they are written to, in band order."""
        grouped: dict[str, list[Variable]] = {}
        for variable in self.variables:
            grouped.setdefault(variable.role, []).append(variable)
        return grouped


class FileListing(BaseModel):
    """Where a product lists its files (a JSON array of ``{name, download_url}`` objects per
    listing, as figshare's article file lists are) and how a file name gives its extent."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    listings: list[str] = Field(
        min_length=1, description="Listing paths under the base URL, one per dataset part."
    )
    name_pattern: str = Field(
        description="Regular expression a tile file name matches, with named groups west, "
        "south, east, north (degrees) and tile (the tile id)."
    )

    @model_validator(mode="after")
    def _groups(self) -> Self:
        try:
            groups = set(re.compile(self.name_pattern).groupindex)
        except re.error as exc:
            raise ValueError(f"name_pattern is not a regular expression: {exc}") from exc
        needed = {"tile", "west", "south", "east", "north"}
        if not needed <= groups:
            raise ValueError(f"name_pattern needs the named groups {sorted(needed - groups)}")
        return self


class HttpVectorProductSpec(BaseModel):
    """A vector product served as zipped shapefile tiles listed by a file index."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    product: str = Field(description="Product id in schemas/sources.yaml.")
    name: str = Field(description="Product name and release.")
    version: str = Field(description="Release string recorded on every item.")
    base_url: str = Field(pattern=r"^https?://", description="Server of the file listings.")
    listing: FileListing = Field(description="Where the tiles are listed.")
    native_crs: str = Field(description="CRS of the item file (the twin's).")
    served_crs: str = Field(description="CRS assumed for a served layer without a .prj.")
    height_column: str = Field(description="Attribute holding the building height, metres.")
    height_valid_range: tuple[float, float] = Field(
        description="Heights outside it (or missing) are no height: those footprints are cut "
        "out of the item's coverage, never written as 0."
    )
    reference_year: int = Field(description="The year the footprints and heights describe.")
    output_file: str = Field(description="Item GeoPackage name ({city}).")
    output_layer: str = Field(description="Layer name the twin uses.")
    licence: str = Field(description="Licence of the data as served.")
    attribution: str = Field(description="Required attribution text.")
    bytes_per_file: int = Field(gt=0, description="Typical served file size, for estimates.")
    sha256: dict[str, str] = Field(
        default_factory=dict, description="Pinned digests by served file name."
    )
    unconfirmed: list[str] = Field(
        default_factory=list, description="Facts that could not be confirmed from public sources."
    )


class HttpProductCatalogue(BaseModel):
    """Every HTTP-served product, keyed uniquely by product id."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    products: list[HttpProductSpec]
    vector_products: list[HttpVectorProductSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Self:
        ids = [p.product for p in self.products] + [p.product for p in self.vector_products]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"products declared twice: {twice}")
        return self

    def by_id(self) -> dict[str, HttpProductSpec]:
        """Gridded products by id."""
        return {p.product: p for p in self.products}

    def vectors_by_id(self) -> dict[str, HttpVectorProductSpec]:
        """Vector products by id."""
        return {p.product: p for p in self.vector_products}


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def parse_http_products(text: str, origin: str = "<string>") -> HttpProductCatalogue:
    """Parse and validate an HTTP product catalogue, with a readable error."""
    return parse_yaml_spec(HttpProductCatalogue, text, origin, "HTTP product catalogue")


@cache
def _packaged() -> HttpProductCatalogue:
    text = resources.files("schemas").joinpath("http_products.yaml").read_text(encoding="utf-8")
    return parse_http_products(text, "schemas/http_products.yaml")


def _catalogue(path: str | Path | None) -> HttpProductCatalogue:
    if not path:
        return _packaged()
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"HTTP product catalogue {file} does not exist")
    return parse_http_products(file.read_text(encoding="utf-8"), str(file))


def load_http_products(path: str | Path | None = None) -> dict[str, HttpProductSpec]:
    """Gridded HTTP product specs by id: the packaged catalogue, or another file."""
    return _catalogue(path).by_id()


def load_http_vector_products(path: str | Path | None = None) -> dict[str, HttpVectorProductSpec]:
    """Vector HTTP product specs by id (footprint tiles), from the same catalogue."""
    return _catalogue(path).vectors_by_id()
