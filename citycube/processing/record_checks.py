"""Records checked at the door: what a records file must be before any of its values reaches a
tile, so that a wrong file is refused with its row named instead of summed into zeros.

A tile's value is a sum or mean of the records inside it; records that never reach a tile do
not lower it to zero visibly, they just vanish. So a file whose rows carry another year, whose
points lie outside what the source reports on (lon and lat swapped, another city's file),
whose records repeat, or whose values are in another unit is refused here, naming the file and
the first row at fault. What the checks cannot see is written in docs/sources/records.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from citycube.catalogue.products import RecordChecks
from citycube.errors import SourceReadError
from citycube.items.staging import repair_hint

OUTSIDE_SHARE = 0.01
"""Largest share of a file's usable records that may lie outside the declared coverage (a few
mis-geocoded buildings are left out and counted); more means the positions are wrong."""

RowLabel = Callable[[int], str]
"""Names a record by its position in the file: 'line 7' for CSV, 'row 6' for Parquet."""


def csv_line(position: int) -> str:
    """A CSV record's line (the header is line 1; records hold no line breaks)."""
    return f"line {position + 2}"


def parquet_row(position: int) -> str:
    """A Parquet record's row, counted from 1."""
    return f"row {position + 1}"


def _refuse(path: Path, problem: str) -> SourceReadError:
    return SourceReadError(f"{path} {problem}; {repair_hint(path)}")


def check_year(years: pd.Series, year: int | None, path: Path, label: RowLabel) -> None:
    """Refuse a file holding any record of another year (or of none): a records file holds its
    item's year, and a record of another year would otherwise be dropped without a trace."""
    if year is None:
        return
    numbers = pd.to_numeric(years, errors="coerce").to_numpy(float)
    other = np.flatnonzero(numbers != year)
    if not len(other):
        return

    def name(y: float) -> str:
        return str(int(y)) if np.isfinite(y) else "none"

    found = sorted({name(y) for y in numbers[other]})
    raise _refuse(
        path,
        f"{label(int(other[0]))} carries year {name(numbers[other[0]])}, not {year}: "
        f"{len(other)} of {len(numbers)} records are of another year ({', '.join(found[:5])}), "
        f"so it is another year's file or a mislabelled one",
    )


def check_unique(keys: pd.Series, column: str, path: Path, label: RowLabel) -> None:
    """Refuse a file that names a record twice: a duplicate would be counted twice."""
    repeated = keys.duplicated(keep=False) & keys.notna()
    if not repeated.any():
        return
    duplicates = np.flatnonzero(keys.duplicated(keep="first") & keys.notna())
    second = int(duplicates[0])
    value = keys.iloc[second]
    first = int(np.flatnonzero((keys == value).to_numpy())[0])
    raise _refuse(
        path,
        f"{label(second)} repeats {column} {value!r} of {label(first)}: {len(duplicates)} "
        f"records are duplicates and would be counted twice",
    )


def check_plausible(
    values: np.ndarray,
    positions: np.ndarray,
    checks: RecordChecks | None,
    form: str,
    path: Path,
    label: RowLabel,
) -> None:
    """Refuse values outside the product's plausible range for the form, one by one and by
    their median: a file in another unit or scale (Wh for kWh) would pass as data otherwise."""
    if checks is None or form not in checks.plausible or not len(values):
        return
    plausible, unit = checks.plausible[form], checks.unit  # type: ignore[index]
    low, high = plausible.record
    outside = np.flatnonzero((values < low) | (values > high))
    if len(outside):
        at = int(outside[0])
        raise _refuse(
            path,
            f"{label(int(positions[at]))} holds {values[at]:g} {unit}, outside the plausible "
            f"{low:g}–{high:g} {unit} of a {form} record ({len(outside)} records are): the file "
            f"is in another unit or scale than {unit}",
        )
    median = float(np.median(values))
    low, high = plausible.median
    if not low <= median <= high:
        raise _refuse(
            path,
            f"has a median record of {median:g} {unit}, outside the plausible {low:g}–{high:g} "
            f"{unit} of {form} records: the file is in another unit or scale than {unit} "
            f"(Wh or MWh for kWh?)",
        )


def check_inside(
    inside: np.ndarray,
    positions: np.ndarray,
    where: str,
    path: Path,
    label: RowLabel,
    lonlat: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Refuse a file whose usable records lie outside what the source reports on (``where``)
    beyond ``OUTSIDE_SHARE``: their values would be left out and the tiles read as zero."""
    if not len(inside):
        raise _refuse(path, f"holds no usable record inside {where}")
    outside = np.flatnonzero(~inside)
    if len(outside) <= OUTSIDE_SHARE * len(inside) and inside.any():
        return
    at = int(outside[0])
    position = f" at lon {lonlat[0][at]:g}, lat {lonlat[1][at]:g}" if lonlat is not None else ""
    raise _refuse(
        path,
        f"has {len(outside)} of {len(inside)} usable records outside {where}, where at most "
        f"{OUTSIDE_SHARE:.0%} may be (first: {label(int(positions[at]))}{position}): lon and "
        f"lat swapped, another CRS or another city's file",
    )


def require_declared_count(declared: Mapping[str, str], path: Path) -> None:
    """Refuse a records item whose record declares no record count: without it a file cut at a
    line boundary reads as a whole one with lower totals."""
    if declared.get("records") is None:
        raise _refuse(
            path,
            "comes with an item record that declares no record count ('records'), so a file "
            "cut short could not be told from a whole one",
        )
