"""Declarative specs of city records (property values, electricity use) and their portals.

Each entry of ``schemas/record_products.yaml`` says, for one city and one product, which portal
serves the records and how: the protocol (ArcGIS REST, Socrata SODA, a bulk CSV download, a
generic paged JSON API, or a user-supplied file), the endpoint and its paging, which source
field holds the value, the year and the location, the value's unit and currency, the years
published, and the spatial form of a record (a point, a parcel polygon, a postcode joined to a
declared centroid table, or an administrative unit apportioned by area). Licence, portal page
and known gaps are data here too, so the README's table and the code cannot drift apart.

Connectors in ``sources/records`` read these specs and write every item in one normalised form
(:data:`RECORD_COLUMNS`), which the core turns into tile values by the rule of its spatial form
(``citycube.processing.records``).
"""

from __future__ import annotations

import string
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from citycube.catalogue.modalities import parse_yaml_spec
from citycube.errors import SpecError
from citycube.items.records_form import SpatialForm

RECORD_PRODUCTS = ("city_property", "city_electricity")
"""Products served from city records."""

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Protocol(StrEnum):
    """How a portal hands out its records."""

    arcgis = "arcgis"
    """ArcGIS REST FeatureServer/MapServer layer ``/query``, paged with ``resultOffset``."""
    socrata = "socrata"
    """Socrata SODA resource, paged with ``$limit``/``$offset`` in a fixed ``$order``."""
    bulk_csv = "bulk_csv"
    """One CSV file (optionally gzipped) per year, downloaded whole."""
    bulk_xlsx = "bulk_xlsx"
    """An xlsx workbook downloaded whole: one sheet per year, or one file per year."""
    nsw_psi_dat = "nsw_psi_dat"
    """NSW Valuer General bulk sales: yearly zips of weekly ``.DAT`` files of typed records."""
    json_api = "json_api"
    """A JSON API paged by an offset or page-number parameter."""
    user_file = "user_file"
    """A CSV, GeoJSON or Parquet file supplied by the user with a schema file."""


class Paging(BaseModel):
    """How many rows a page holds and how many pages are allowed."""

    model_config = _STRICT
    page_size: int = Field(1000, ge=1, description="Rows asked per page.")
    max_pages: int = Field(10_000, ge=1, description="Pages after which a fetch refuses to go on.")
    offset_param: str | None = Field(
        None, description="json_api: query parameter of the row offset (e.g. 'offset')."
    )
    page_param: str | None = Field(
        None, description="json_api: query parameter of the page number (e.g. 'pageNo')."
    )
    first_page: int = Field(1, ge=0, description="json_api: number of the first page.")
    size_param: str | None = Field(
        None, description="json_api: query parameter of the page size (e.g. 'limit')."
    )
    records_path: str = Field(
        "", description="json_api: dotted path to the list of rows in a page ('' = the page)."
    )


class FieldMap(BaseModel):
    """Which source fields hold the value, the year and the location of a record."""

    model_config = _STRICT
    value: str = Field(
        description="Field of the value (a price, an assessed value, kWh); 'a + b' sums fields "
        "(land plus improvement value), blank when any part is."
    )
    year: str | None = Field(
        None, description="Field of the record's year or date (first four digits are the year)."
    )
    lon: str | None = Field(None, description="Point form: longitude (or x) field.")
    lat: str | None = Field(None, description="Point form: latitude (or y) field.")
    geometry: str | None = Field(
        None,
        description="Point or parcel form: a GeoJSON geometry field (Socrata location, "
        "GeoJSON features); ArcGIS features carry their own geometry.",
    )
    postcode: str | None = Field(None, description="Postcode form: the key field.")
    unit_id: str | None = Field(None, description="Admin-unit form: the unit key field.")


class JoinTable(BaseModel):
    """A declared table the records are joined to: postcode centroids or unit boundaries."""

    model_config = _STRICT
    href: str = Field(description="URL or local path of the table (CSV, GeoJSON or Parquet).")
    key: str = Field(description="Key column, matched with the records' key after normalising.")
    lon: str | None = Field(None, description="Postcode tables: longitude column.")
    lat: str | None = Field(None, description="Postcode tables: latitude column.")
    licence: str = Field("", description="Licence of the table.")


class CsvLayout(BaseModel):
    """How a bulk CSV file is laid out."""

    model_config = _STRICT
    delimiter: str = Field(",", description="Field separator.")
    header: bool = Field(True, description="False when the file has no header row.")
    columns: tuple[str, ...] = Field(
        (), description="Column names of a file without a header (in order)."
    )
    encoding: str = Field("utf-8", description="Text encoding.")

    @model_validator(mode="after")
    def _columns_without_header(self) -> Self:
        if not self.header and not self.columns:
            raise ValueError("a CSV without a header needs its columns listed")
        return self


class XlsxLayout(BaseModel):
    """Where a bulk xlsx workbook keeps a year's table."""

    model_config = _STRICT
    sheet: str = Field(
        "{year}", description="Sheet name; '{year}' is filled in (one sheet per year)."
    )
    header_row: int | None = Field(
        None,
        ge=1,
        description="1-based row of the column names; unset: the first of the first "
        "header_search_rows rows that holds every mapped field (notes above a table move it).",
    )
    header_search_rows: int = Field(30, ge=1, description="Rows searched for the header.")


class PsiArchives(BaseModel):
    """Which yearly archives of the NSW bulk sales a contract year needs."""

    model_config = _STRICT
    later_years: int = Field(
        1,
        ge=0,
        le=5,
        description="Archives of this many following years are read too: a sale is published "
        "in the week it was lodged, often after the year of its contract.",
    )
    max_member_bytes: int = Field(
        2_000_000_000,
        ge=1,
        description="Largest uncompressed member read from an archive (a guard against "
        "damaged or hostile zips).",
    )


class RecordProductSpec(BaseModel):
    """One city's records of one product, from one portal."""

    model_config = _STRICT
    city: str = Field(description="City key from schemas/cities.yaml.")
    product: str = Field(description="city_property or city_electricity.")
    protocol: Protocol = Field(description="How the portal serves the records.")
    portal: str = Field(description="Human-readable page of the dataset.")
    endpoint: str = Field(
        "",
        description="Query endpoint (ArcGIS layer URL, SODA resource URL, JSON API URL) or a "
        "URL template with {year} (bulk files); empty for user files, which name theirs.",
    )
    params: dict[str, str] = Field(
        default_factory=dict,
        description="Extra query parameters; values may hold {year} (e.g. a where clause).",
    )
    year_filter: str | None = Field(
        None,
        description="Server-side filter selecting one year: an ArcGIS/SODA where clause with "
        "{year}. Without it, rows of other years are dropped after the download.",
    )
    row_filter: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Keep only rows whose column holds one of these values (a national file cut "
        "to the city, e.g. county: [GREATER LONDON]); applied after the download.",
    )
    expand: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="json_api: parameters asked once per value (every combination is paged), "
        "e.g. a district code and the months '{year}01'…'{year}12'.",
    )
    dedupe_by: str | None = Field(
        None,
        description="Keep one row per value of this field (a sale listed once per lot, as "
        "geo-DVF repeats a mutation's value on each of its rows).",
    )
    min_value: float | None = Field(
        None,
        description="Values below this are not market values (e.g. $0 transfers): kept as blank "
        "records, counted, never averaged in.",
    )
    paging: Paging = Field(default_factory=Paging, description="Page size and limits.")
    order_by: str | None = Field(
        None, description="Stable order of rows across pages (SODA $order, ArcGIS orderByFields)."
    )
    out_sr: int = Field(4326, description="ArcGIS: EPSG code the geometry is asked in (outSR).")
    source_crs: str = Field(
        "EPSG:4326", description="CRS of coordinates in CSV/JSON fields (lon/lat columns)."
    )
    csv: CsvLayout | None = Field(None, description="bulk_csv: delimiter, header, compression.")
    xlsx: XlsxLayout | None = Field(None, description="bulk_xlsx: sheet and header row.")
    psi: PsiArchives | None = Field(
        None, description="nsw_psi_dat: archives read per year (default: the year and the next)."
    )
    fields: FieldMap = Field(description="Which source fields mean what.")
    spatial_form: SpatialForm = Field(description="point, parcel, postcode or admin_unit.")
    points_table: JoinTable | None = Field(
        None, description="Postcode form: the centroid table records are joined to."
    )
    units_table: JoinTable | None = Field(
        None, description="Admin-unit form: the unit boundaries (polygons) records refer to."
    )
    coverage: str | None = Field(
        None,
        description="URL or path of the area the records report on (a city limit polygon). "
        "Admin units default to their own union.",
    )
    unit: str = Field(description="Unit of the value as published, e.g. 'kWh/year', 'GBP'.")
    value_scale: float = Field(
        1.0, gt=0, description="Multiplier to the modality's unit (e.g. MWh → kWh: 1000)."
    )
    currency: str | None = Field(
        None, pattern=r"^[A-Z]{3}$", description="ISO 4217 code of money values (PROP)."
    )
    years: tuple[int, ...] = Field(description="Years the portal publishes, ascending.")
    token_env: str | None = Field(
        None,
        description="Environment variable holding an optional app token (its value is sent, "
        "never logged or written).",
    )
    token_header: str = Field("X-App-Token", description="Header that carries the token.")
    token_param: str | None = Field(
        None, description="Query parameter carrying the token instead of a header."
    )
    licence: str = Field(description="Licence of the records.")
    attribution: str = Field(description="Attribution text.")
    known_gaps: str = Field("", description="What the records lack (years, areas, fields).")
    confirmed: bool = Field(
        False,
        description="True when the endpoint and field names were checked against the "
        "portal's own documentation; false marks a best reading still to confirm.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.product not in RECORD_PRODUCTS:
            raise ValueError(f"product {self.product!r} is not one of {RECORD_PRODUCTS}")
        if list(self.years) != sorted(set(self.years)):
            raise ValueError(f"{self.city}/{self.product}: years must ascend without repeats")
        if self.product == "city_property" and self.currency is None:
            raise ValueError(f"{self.city}/city_property: a currency code is required")
        form, f = self.spatial_form, self.fields
        # ArcGIS features and user GeoJSON/GeoParquet files carry their own geometry.
        own_geometry = self.protocol in (Protocol.arcgis, Protocol.user_file)
        if form == SpatialForm.point and not (f.geometry or (f.lon and f.lat)) and not own_geometry:
            raise ValueError(f"{self.city}/{self.product}: point form needs lon/lat fields")
        if form == SpatialForm.parcel and not f.geometry and not own_geometry:
            raise ValueError(f"{self.city}/{self.product}: parcel form needs a geometry field")
        if form == SpatialForm.postcode and not (f.postcode and self.points_table):
            raise ValueError(
                f"{self.city}/{self.product}: postcode form needs fields.postcode and a "
                "points_table"
            )
        if form == SpatialForm.postcode and not (self.points_table.lon and self.points_table.lat):  # type: ignore[union-attr]
            raise ValueError(f"{self.city}/{self.product}: points_table needs lon and lat")
        located_by_point = form in (SpatialForm.point, SpatialForm.postcode)
        if located_by_point and not self.coverage and self.protocol != Protocol.user_file:
            # Points say where records are, not where they could have been: without the area
            # the records report on, no tile can be told from one outside them.
            raise ValueError(
                f"{self.city}/{self.product}: {form.value} records need a coverage polygon "
                "(the area they report on, e.g. a city limit)"
            )
        if form == SpatialForm.admin_unit and not (f.unit_id and self.units_table):
            raise ValueError(
                f"{self.city}/{self.product}: admin_unit form needs fields.unit_id and a "
                "units_table"
            )
        if self.protocol == Protocol.bulk_xlsx and self.xlsx is None:
            raise ValueError(f"{self.city}/{self.product}: bulk_xlsx needs an xlsx layout")
        sheet = self.xlsx.sheet if self.xlsx else ""
        yearless_bulk = (
            self.protocol in (Protocol.bulk_csv, Protocol.bulk_xlsx)
            and "{year}" not in self.endpoint
            and "{year}" not in sheet
        )
        if yearless_bulk and self.fields.year is None:
            raise ValueError(
                f"{self.city}/{self.product}: a bulk file without {{year}} in its URL (or its "
                "sheet name) needs a year field"
            )
        if self.protocol == Protocol.nsw_psi_dat and "{year}" not in self.endpoint:
            raise ValueError(
                f"{self.city}/{self.product}: nsw_psi_dat needs {{year}} in its endpoint (one "
                "archive per year)"
            )
        if self.protocol != Protocol.user_file and not self.endpoint:
            raise ValueError(f"{self.city}/{self.product}: {self.protocol} needs an endpoint")
        expanded = [v for values in self.expand.values() for v in values]
        templates = (self.endpoint, self.year_filter or "", sheet, *self.params.values())
        for template in (*templates, *expanded):
            names = {n for _, n, _, _ in string.Formatter().parse(template) if n}
            if names - {"year"}:
                raise ValueError(f"{template!r}: only {{year}} may be filled in")
        return self

    @property
    def key(self) -> tuple[str, str]:
        """(product, city)."""
        return (self.product, self.city)


class RecordProductCatalogue(BaseModel):
    """Every city's record portals."""

    model_config = _STRICT
    records: tuple[RecordProductSpec, ...] = Field(description="One entry per (city, product).")

    @model_validator(mode="after")
    def _unique(self) -> Self:
        seen: set[tuple[str, str]] = set()
        for spec in self.records:
            if spec.key in seen:
                raise ValueError(f"{spec.product} of {spec.city} is declared twice")
            seen.add(spec.key)
        return self


def parse_record_products(text: str, origin: str = "<string>") -> RecordProductCatalogue:
    """Parse and validate a record-products YAML document, with a readable error."""
    catalogue = parse_yaml_spec(RecordProductCatalogue, text, origin, "record products")
    from citycube.catalogue.cities import load_cities

    unknown = sorted({s.city for s in catalogue.records} - set(load_cities()))
    if unknown:
        raise SpecError(f"{origin}: unknown cities {unknown}")
    return catalogue


@cache
def _packaged() -> RecordProductCatalogue:
    text = resources.files("schemas").joinpath("record_products.yaml").read_text("utf-8")
    return parse_record_products(text, "schemas/record_products.yaml")


def load_record_products(
    path: str | Path | None = None,
) -> dict[tuple[str, str], RecordProductSpec]:
    """(product, city) → spec, from a YAML file or the packaged catalogue."""
    if path:
        file = Path(path)
        if not file.is_file():
            raise SpecError(f"record products file {file} does not exist")
        catalogue = parse_record_products(file.read_text(encoding="utf-8"), str(file))
    else:
        catalogue = _packaged()
    return {spec.key: spec for spec in catalogue.records}
