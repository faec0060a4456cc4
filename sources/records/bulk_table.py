"""Bulk table downloads: a CSV (optionally gzipped) or an xlsx workbook, downloaded whole.

UK Price Paid publishes ``pp-<year>.csv`` without a header; geo-DVF publishes
``<year>/departements/<dep>.csv.gz`` with one. DESNZ publishes its LSOA electricity statistics
as one workbook with a sheet per year, the column names a few rows down under notes and broken
over lines ("Total \\nconsumption\\n(kWh)"). Every file goes through the shared download manager
(cache, resume, retries) and is read as text or as the cells' own values, so codes such as
postcodes keep their leading zeros; the spec's ``row_filter`` cuts a national file to the city.
A file that cannot be read is dropped from the cache and named, with its source, city and year.
"""

from __future__ import annotations

import gzip
import io
import re
import zipfile
import zlib
from typing import Any

import pandas as pd

from citycube.errors import SourceReadError
from sources.downloads import redact_url
from sources.records.base import Connector, Pager
from sources.records.spec import RecordProductSpec, XlsxLayout

_SPACE = re.compile(r"\s+")


def header_text(cell: object) -> str:
    """A column name as printed: runs of blanks and line breaks become one space."""
    return _SPACE.sub(" ", str(cell)).strip() if cell is not None else ""


def _unreadable(pager: Pager, year: int, url: str, what: str, detail: object) -> SourceReadError:
    pager.manager.discard(url)
    return SourceReadError(
        f"{pager.source_name}: {pager.city} {year}: {redact_url(url)} is not a readable {what} "
        f"({detail}); it was dropped from the download cache: fetch again, and report it to the "
        "publisher if it persists"
    )


class BulkCsv(Connector):
    """The year's rows of a bulk CSV file."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Download the file and read it as text columns."""
        url = endpoint.format(year=year)
        body = pager.get_bytes(url)
        layout = spec.csv
        try:
            if url.split("?")[0].endswith(".gz"):
                body = gzip.decompress(body)
            return pd.read_csv(
                io.BytesIO(body),
                sep=layout.delimiter if layout else ",",
                header=0 if layout is None or layout.header else None,
                names=list(layout.columns) if layout and not layout.header else None,
                dtype=str,
                keep_default_na=False,
                na_values=[""],
                encoding=layout.encoding if layout else "utf-8",
            )
        except (OSError, EOFError, zlib.error, ValueError, pd.errors.ParserError) as exc:
            raise _unreadable(pager, year, url, "CSV", exc) from None


class BulkXlsx(Connector):
    """The year's rows of a sheet of a bulk xlsx workbook."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Download the workbook (once for every year it holds) and read the year's sheet."""
        from openpyxl import load_workbook  # only builds reading xlsx need it

        assert spec.xlsx is not None
        url = endpoint.format(year=year)
        body = pager.get_bytes(url)
        sheet = spec.xlsx.sheet.format(year=year)
        try:
            book = load_workbook(io.BytesIO(body), read_only=True, data_only=True)
        except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError) as exc:
            raise _unreadable(pager, year, url, "xlsx workbook", exc) from None
        try:
            if sheet not in book.sheetnames:
                raise SourceReadError(
                    f"{pager.source_name}: {pager.city} {year}: {redact_url(url)} has no sheet "
                    f"{sheet!r} (it has {book.sheetnames}): the year is not in this release, or "
                    "xlsx.sheet in the record spec is wrong"
                )
            try:
                cells = [list(r) for r in book[sheet].iter_rows(values_only=True)]
            except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError, zlib.error) as exc:
                raise _unreadable(pager, year, url, f"xlsx sheet {sheet!r}", exc) from None
        finally:
            book.close()
        return self._table(cells, spec, year, pager, url, sheet)

    def _table(
        self,
        cells: list[list[Any]],
        spec: RecordProductSpec,
        year: int,
        pager: Pager,
        url: str,
        sheet: str,
    ) -> pd.DataFrame:
        """The rows under the header row, named by the header's printed text."""
        assert spec.xlsx is not None
        wanted = _mapped_fields(spec)
        index = _header_index(cells, spec.xlsx, wanted)
        if index is None:
            shown = [[header_text(c) for c in row if c is not None] for row in cells[:8]]
            where = (
                f"row {spec.xlsx.header_row}"
                if spec.xlsx.header_row
                else f"any of the first {spec.xlsx.header_search_rows} rows"
            )
            raise SourceReadError(
                f"{pager.source_name}: {pager.city} {year}: sheet {sheet!r} of {redact_url(url)} "
                f"has no header row with {sorted(wanted)} in {where}; its first rows hold "
                f"{shown}: fix fields or xlsx in the record spec"
            )
        names = [header_text(c) or f"column_{i + 1}" for i, c in enumerate(cells[index])]
        body = [row for row in cells[index + 1 :] if any(c not in (None, "") for c in row)]
        width = len(names)
        padded = [(row + [None] * width)[:width] for row in body]
        pager.notes["sheet"] = sheet
        pager.notes["header_row"] = str(index + 1)
        return pd.DataFrame(padded, columns=names, dtype=object)


def _mapped_fields(spec: RecordProductSpec) -> set[str]:
    """The column names the spec's field mapping and row filter read."""
    f = spec.fields
    names = [*(p.strip() for p in f.value.split("+")), f.year, f.lon, f.lat, f.postcode, f.unit_id]
    names += [f.geometry, *spec.row_filter]
    return {header_text(n) for n in names if n}


def _header_index(cells: list[list[Any]], layout: XlsxLayout, wanted: set[str]) -> int | None:
    """0-based index of the header row: the declared one if it holds the mapped fields, else
    (no row declared) the first row among the first rows that does."""
    rows = [layout.header_row - 1] if layout.header_row else range(layout.header_search_rows)
    for index in rows:
        if index < len(cells) and wanted <= {header_text(c) for c in cells[index]}:
            return index
    return None
