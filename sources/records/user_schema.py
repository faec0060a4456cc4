"""User-supplied city records: a CSV, GeoJSON or Parquet file described by a small schema file.

Any city can be given property or electricity records this way (Shanghai's collected listings,
a city whose portal has no API). The schema file (YAML) declares the data file, the type and
rules of each column it relies on, which columns are the value, year and location, the unit,
the currency and the spatial form; it becomes an ordinary record spec with the ``user_file``
protocol. Rows are checked against the declared columns before anything is written, and every
failure names the file, the row and the column, so a user can fix the file rather than guess.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Self

import geopandas as gpd
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from citycube.catalogue.modalities import parse_yaml_spec
from citycube.errors import SourceReadError, SpecError
from sources.records.spec import FieldMap, JoinTable, Protocol, RecordProductSpec, SpatialForm

MAX_REPORTED = 20
"""Row failures listed in one error (the count of all is given too)."""


class UserFileError(SourceReadError):
    """A user-supplied records file does not match its schema."""

    code = "CC203"


class ColumnType(StrEnum):
    """What a declared column must hold."""

    number = "number"
    integer = "integer"
    string = "string"
    date = "date"
    """A date or date-time text (ISO 8601 or what pandas reads unambiguously)."""
    year = "year"
    """A four-digit year."""


class ColumnRule(BaseModel):
    """One declared column and what its values must satisfy."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: ColumnType = Field(description="Type of the values.")
    required: bool = Field(True, description="False allows blank cells (counted, not dropped).")
    min: float | None = Field(None, description="Smallest allowed number.")
    max: float | None = Field(None, description="Largest allowed number.")
    pattern: str | None = Field(None, description="Regular expression a text must match.")


class UserRecordSchema(BaseModel):
    """The schema file of one user-supplied records file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    city: str = Field(description="City key from schemas/cities.yaml.")
    product: str = Field(description="city_property or city_electricity.")
    file: Path = Field(description="Data file (CSV, GeoJSON or Parquet), relative to the schema.")
    columns: dict[str, ColumnRule] = Field(description="Declared columns and their rules.")
    fields: FieldMap = Field(description="Which declared columns are value, year, location.")
    spatial_form: SpatialForm = Field(description="point, parcel, postcode or admin_unit.")
    unit: str = Field(description="Unit of the value column, e.g. 'CNY' or 'kWh/year'.")
    value_scale: float = Field(1.0, gt=0, description="Multiplier to the modality's unit.")
    currency: str | None = Field(None, pattern=r"^[A-Z]{3}$", description="ISO 4217 code.")
    years: tuple[int, ...] = Field(description="Years the file holds records for.")
    source_crs: str = Field("EPSG:4326", description="CRS of lon/lat columns.")
    points_table: JoinTable | None = Field(None, description="Postcode form: centroid table.")
    units_table: JoinTable | None = Field(None, description="Admin-unit form: boundaries.")
    coverage: str | None = Field(
        None, description="Polygon file of the area the file covers (point and postcode forms)."
    )
    portal: str = Field("user-supplied file", description="Where the records come from.")
    licence: str = Field("as supplied by the user", description="Licence of the records.")
    attribution: str = Field("user-supplied records", description="Attribution text.")
    known_gaps: str = Field("", description="What the records lack.")

    @model_validator(mode="after")
    def _mapped_columns_declared(self) -> Self:
        f = self.fields
        mapped = [
            c for c in (f.value, f.year, f.lon, f.lat, f.geometry, f.postcode, f.unit_id) if c
        ]
        undeclared = [c for c in mapped if c not in self.columns and c != "geometry"]
        if undeclared:
            raise ValueError(f"fields map columns {undeclared} that `columns` does not declare")
        if self.file.suffix.lower() not in (".csv", ".geojson", ".json", ".parquet"):
            raise ValueError(f"file {self.file} must be .csv, .geojson or .parquet")
        if self.spatial_form in (SpatialForm.point, SpatialForm.postcode) and not self.coverage:
            raise ValueError(
                f"{self.spatial_form.value} records need `coverage`: a polygon file of the area "
                "the file reports on (tiles outside it are unavailable, never zero)"
            )
        return self

    def record_spec(self) -> RecordProductSpec:
        """The equivalent record spec (protocol ``user_file``)."""
        return RecordProductSpec(
            city=self.city,
            product=self.product,
            protocol=Protocol.user_file,
            portal=self.portal,
            fields=self.fields,
            spatial_form=self.spatial_form,
            points_table=self.points_table,
            units_table=self.units_table,
            coverage=self.coverage,
            unit=self.unit,
            value_scale=self.value_scale,
            currency=self.currency,
            years=self.years,
            source_crs=self.source_crs,
            licence=self.licence,
            attribution=self.attribution,
            known_gaps=self.known_gaps,
            confirmed=True,
        )


def _relative(base: Path, href: str | None) -> str | None:
    if href is None or "://" in href or Path(href).is_absolute():
        return href
    return str((base / href).resolve())


def load_user_schema(path: str | Path) -> tuple[RecordProductSpec, Path, UserRecordSchema]:
    """(record spec, data file, schema) of a schema file; relative paths are the schema's."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"user records schema {file} does not exist")
    schema = parse_yaml_spec(
        UserRecordSchema, file.read_text(encoding="utf-8"), str(file), "user records schema"
    )
    base = file.resolve().parent
    updates: dict[str, object] = {"coverage": _relative(base, schema.coverage)}
    for name in ("points_table", "units_table"):
        table = getattr(schema, name)
        if table is not None:
            updates[name] = table.model_copy(update={"href": _relative(base, table.href)})
    schema = schema.model_copy(update=updates)
    try:
        spec = schema.record_spec()
    except ValueError as exc:
        raise SpecError(f"user records schema {file}: {exc}") from exc
    data = schema.file if schema.file.is_absolute() else base / schema.file
    return spec, data, schema


def read_user_file(path: Path) -> tuple[pd.DataFrame, str]:
    """The file's rows (text cells for CSV) and how its rows are counted in messages."""
    if not path.is_file():
        raise UserFileError(f"user records file {path} does not exist")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
            return frame, "line"
        if suffix == ".parquet":
            try:
                return gpd.read_parquet(path), "row"
            except ValueError:
                return pd.read_parquet(path), "row"
        return gpd.read_file(path), "feature"
    except Exception as exc:  # pandas/pyogrio/pyarrow raise many types for bad files
        raise UserFileError(f"cannot read user records file {path}: {exc}") from exc


def _row_label(kind: str, index: int) -> str:
    """Line numbers count the CSV header; features and rows count from 1."""
    return f"line {index + 2}" if kind == "line" else f"{kind} {index + 1}"


def validate_user_records(frame: pd.DataFrame, schema: UserRecordSchema, path: Path, kind: str):
    """Refuse the file unless every declared column exists and every cell meets its rule."""
    missing = [c for c in schema.columns if c not in frame.columns]
    if missing:
        raise UserFileError(
            f"{path}: column(s) {missing} declared in the schema are missing; the file has "
            f"{[c for c in frame.columns if c != 'geometry']}"
        )
    failures: list[str] = []
    total = 0
    for column, rule in schema.columns.items():
        cells = frame[column]
        blank = cells.isna() | (cells.astype("string").str.strip() == "")
        problems: dict[int, str] = {}
        if rule.required:
            for i in np.flatnonzero(blank.to_numpy()):
                problems[int(i)] = "is blank but required"
        text = cells.astype("string").str.strip()
        if rule.type in (ColumnType.number, ColumnType.integer, ColumnType.year):
            numbers = pd.to_numeric(text, errors="coerce")
            bad = numbers.isna() & ~blank
            if rule.type != ColumnType.number:
                bad |= numbers.notna() & (numbers % 1 != 0)
            if rule.type == ColumnType.year:
                bad |= numbers.notna() & ((numbers < 1800) | (numbers > 2100))
            for i in np.flatnonzero(bad.to_numpy()):
                problems.setdefault(int(i), f"is not a {rule.type.value}")
            if rule.min is not None:
                for i in np.flatnonzero((numbers < rule.min).fillna(False).to_numpy()):
                    problems.setdefault(int(i), f"is below the minimum {rule.min:g}")
            if rule.max is not None:
                for i in np.flatnonzero((numbers > rule.max).fillna(False).to_numpy()):
                    problems.setdefault(int(i), f"is above the maximum {rule.max:g}")
        elif rule.type == ColumnType.date:
            dates = pd.to_datetime(text, errors="coerce", format="mixed")
            for i in np.flatnonzero((dates.isna() & ~blank).to_numpy()):
                problems.setdefault(int(i), "is not a date")
        if rule.pattern is not None:
            matches = text.str.fullmatch(re.compile(rule.pattern)).fillna(True).astype(bool)
            for i in np.flatnonzero((~matches & ~blank).to_numpy()):
                problems.setdefault(int(i), f"does not match {rule.pattern!r}")
        total += len(problems)
        for i, what in sorted(problems.items()):
            if len(failures) < MAX_REPORTED:
                value = cells.iloc[i]
                failures.append(
                    f"{path}, {_row_label(kind, i)}, column {column!r}: {value!r} {what}"
                )
    if failures:
        more = f" (and {total - len(failures)} more)" if total > len(failures) else ""
        raise UserFileError(
            f"{path} does not match its schema: {total} cell(s) fail{more}:\n" + "\n".join(failures)
        )
