"""NSW Valuer General bulk Property Sales Information (PSI): yearly zips of weekly ``.DAT`` files.

Each ``.DAT`` file (one per valuation district and week) holds ';'-separated typed records: A
(file header), B (one sale: address, dates, price), C (legal description), D (interests) and Z
(trailer: a property count and the file's total record count, A and Z included). A yearly
archive holds the year's weekly files directly or as weekly zips inside it,
so archives are walked to any depth up to ``MAX_NESTING``; nothing is extracted to disk.

Only the current format (2001 on) is read. Its B-record field order is :data:`B_FIELDS`, as
three independent public readers of the files agree (each citing the Valuer General's
"Current Property Sales Data File Format 2001 to Current"); this connector relies on the post
code (11th field), the contract date (14th, ``YYYYMMDD``) and the purchase price (16th, whole
dollars) and keys a sale by district, property id, strata lot and dealing number. A file whose
last record is not its Z trailer, or whose trailer states no count equal to the records the
file holds, was cut short or padded and is refused by name (not read for less). B records of
the pre-2001 archive format (source tag ``ARCHIVE``/``VALNET1`` in the third field) are counted
and left out, as are malformed lines; every count lands in the item's extras.

A sale is published in the week it is lodged, often after the year of its contract, so a
contract year reads its own archive and ``psi.later_years`` following ones; a later archive the
server does not have (404) is named in the extras rather than failing the year.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from pathlib import Path
from typing import IO

import pandas as pd

from citycube.errors import SourceFetchError, SourceReadError
from sources.downloads import redact_url
from sources.records.base import Connector, Pager
from sources.records.spec import PsiArchives, RecordProductSpec

B_FIELDS = (
    "record_type",
    "district_code",
    "property_id",
    "sale_counter",
    "download_datetime",
    "property_name",
    "unit_number",
    "house_number",
    "street_name",
    "locality",
    "post_code",
    "area",
    "area_type",
    "contract_date",
    "settlement_date",
    "purchase_price",
    "zoning",
    "nature_of_property",
    "primary_purpose",
    "strata_lot_number",
    "component_code",
    "sale_code",
    "percent_interest",
    "dealing_number",
)
"""Fields of a current-format B record, in order."""
MIN_B_FIELDS = B_FIELDS.index("purchase_price") + 1
"""A B record shorter than this lacks the price: malformed."""
RECORD_TYPES = frozenset("ABCDZ")
ARCHIVE_SOURCES = frozenset({"ARCHIVE", "VALNET1"})
"""Third field of a pre-2001 format B record (its property id in the current format)."""
MAX_NESTING = 3
"""Zips inside zips read this deep at most."""
EXAMPLES = 5
_DATE = re.compile(r"^\d{8}$")


class PsiCounts:
    """What the walk over one year's archives saw and left out."""

    def __init__(self) -> None:
        self.archives: list[str] = []
        self.missing_archives: list[str] = []
        self.dat_files = 0
        self.other_members: list[str] = []
        self.b_records = 0
        self.malformed = 0
        self.malformed_examples: list[str] = []
        self.archive_format = 0
        self.no_contract_date = 0
        self.latin1_files = 0

    def bad_line(self, where: str, line_no: int, why: str) -> None:
        self.malformed += 1
        if len(self.malformed_examples) < EXAMPLES:
            self.malformed_examples.append(f"{where}:{line_no} ({why})")

    def notes(self, year: int, other_years: int, duplicates: int) -> dict[str, str]:
        """The counts as item extras."""
        return {
            "psi_archives": " ".join(self.archives),
            "psi_archives_missing": " ".join(self.missing_archives),
            "psi_dat_files": str(self.dat_files),
            "psi_other_members": str(len(self.other_members)),
            "psi_b_records": str(self.b_records),
            "psi_malformed_lines": str(self.malformed),
            "psi_malformed_examples": "; ".join(self.malformed_examples),
            "psi_archive_format_records": str(self.archive_format),
            "psi_without_contract_date": str(self.no_contract_date),
            "psi_other_contract_years": str(other_years),
            "psi_duplicate_sales_dropped": str(duplicates),
            "psi_files_read_as_latin1": str(self.latin1_files),
            "psi_contract_year": str(year),
        }


class NswPsiDat(Connector):
    """The B records of a contract year, from the yearly archives."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Download the year's archive and the later ones, read every ``.DAT`` inside."""
        layout = spec.psi or PsiArchives()
        counts = PsiCounts()
        records: list[list[str]] = []
        for archive_year in range(year, year + layout.later_years + 1):
            url = endpoint.format(year=archive_year)
            name = Path(redact_url(url).split("?")[0]).name
            try:
                got = pager.get_file(url)
            except SourceFetchError as exc:
                if exc.status == 404 and archive_year != year:
                    counts.missing_archives.append(f"{name} (404)")
                    continue
                raise
            counts.archives.append(name)
            try:
                with zipfile.ZipFile(got.path) as archive:
                    self._walk(archive, name, 1, layout, counts, records)
            except SourceReadError as exc:
                pager.manager.discard(url)
                raise SourceReadError(
                    f"{pager.source_name}: {pager.city} {year}: archive {name} "
                    f"({redact_url(url)}): {exc.message}. It was dropped from the download "
                    "cache; fetch again, and report it to the Valuer General if it persists"
                ) from None
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
                pager.manager.discard(url)
                raise SourceReadError(
                    f"{pager.source_name}: {pager.city} {year}: archive {name} "
                    f"({redact_url(url)}) is corrupt or truncated: {exc}. It was dropped from "
                    "the download cache; fetch again, and report it to the Valuer General if it "
                    "persists"
                ) from None
        frame = pd.DataFrame(records, columns=[*B_FIELDS, "source_file"], dtype=object)
        frame = self._one_row_per_sale(frame)
        duplicates = len(records) - len(frame)
        years = frame["contract_date"].str.slice(0, 4)
        other = int((years.notna() & (years != str(year))).sum())
        pager.notes.update(counts.notes(year, other, duplicates))
        return frame.reset_index(drop=True)

    def _walk(
        self,
        archive: zipfile.ZipFile,
        where: str,
        depth: int,
        layout: PsiArchives,
        counts: PsiCounts,
        records: list[list[str]],
    ) -> None:
        """Read every ``.DAT`` member, and the zips inside, of one archive."""
        for info in archive.infolist():
            if info.is_dir():
                continue
            member = f"{where} > {info.filename}"
            lower = info.filename.lower()
            if not lower.endswith((".dat", ".zip")):
                counts.other_members.append(member)
                continue
            if info.file_size > layout.max_member_bytes:
                raise SourceReadError(
                    f"{member} would unpack to {info.file_size} bytes, over psi.max_member_bytes "
                    f"({layout.max_member_bytes}): not read"
                )
            if lower.endswith(".zip"):
                if depth >= MAX_NESTING:
                    raise SourceReadError(f"{member} is a zip nested deeper than {MAX_NESTING}")
                try:
                    with zipfile.ZipFile(io.BytesIO(archive.read(info))) as inner:
                        self._walk(inner, member, depth + 1, layout, counts, records)
                except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                    raise zipfile.BadZipFile(f"{member}: {exc}") from None
                continue
            try:
                with archive.open(info) as handle:
                    self._read_dat(handle, member, counts, records)
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise zipfile.BadZipFile(f"{member}: {exc}") from None

    def _read_dat(
        self, handle: IO[bytes], where: str, counts: PsiCounts, records: list[list[str]]
    ) -> None:
        """The B records of one ``.DAT`` file, current format only."""
        raw = handle.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
            counts.latin1_files += 1
        counts.dat_files += 1
        record_lines = 0
        trailer: list[str] | None = None
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            record_lines += 1
            fields = [f.strip() for f in line.split(";")]
            kind = fields[0]
            trailer = fields if kind == "Z" else None
            if kind not in RECORD_TYPES:
                counts.bad_line(where, line_no, f"record type {kind[:10]!r}")
                continue
            if kind != "B":
                continue
            if len(fields) > 2 and fields[2].upper() in ARCHIVE_SOURCES:
                counts.archive_format += 1
                continue
            if len(fields) < MIN_B_FIELDS:
                counts.bad_line(where, line_no, f"{len(fields)} fields")
                continue
            date = fields[B_FIELDS.index("contract_date")]
            if date and not _DATE.match(date):
                counts.bad_line(where, line_no, f"contract date {date[:12]!r}")
                continue
            counts.b_records += 1
            if not date:
                counts.no_contract_date += 1
            padded = (fields + [""] * len(B_FIELDS))[: len(B_FIELDS)]
            padded[B_FIELDS.index("contract_date")] = (
                f"{date[:4]}-{date[4:6]}-{date[6:]}" if date else ""
            )
            records.append([*padded, where])
        _check_trailer(where, trailer, record_lines)

    @staticmethod
    def _one_row_per_sale(frame: pd.DataFrame) -> pd.DataFrame:
        """One row per sale: the latest published copy of a sale listed in several weeks."""
        if frame.empty:
            return frame
        key = frame["district_code"] + "|" + frame["property_id"] + "|"
        key += frame["strata_lot_number"] + "|"
        dealing = frame["dealing_number"]
        fallback = frame["contract_date"] + "|" + frame["purchase_price"]
        frame = frame.assign(sale_key=key + dealing.where(dealing != "", fallback))
        frame = frame.replace({"": None})
        latest_first = frame.sort_values("download_datetime", ascending=False, kind="stable")
        return latest_first.drop_duplicates("sale_key").sort_index()


def _check_trailer(where: str, trailer: list[str] | None, record_lines: int) -> None:
    """Refuse a ``.DAT`` file that does not end with its Z trailer, or whose trailer states no
    count equal to the records the file holds: the file was cut short or padded, and reading
    it would silently lower the year's sales. The trailer's counts are matched by value, not
    position (the format names a property count and a total record count)."""
    if trailer is None:
        raise SourceReadError(
            f"{where} does not end with its Z trailer record ({record_lines} records read): the "
            "file was cut short"
        )
    declared = [int(f) for f in trailer[1:] if f.isdigit()]
    if record_lines not in declared:
        raise SourceReadError(
            f"{where} holds {record_lines} records, its Z trailer states {declared}: the file "
            "was cut short or padded"
        )
