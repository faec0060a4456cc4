"""Reading the two files of the school-capacity reference: the Department for Education's
"School capacity" school-level CSV and the Get Information about Schools (GIAS) establishment
CSV, joined by URN and placed on a city's 2 km tile grid.

The capacity file (explore-education-statistics) has one row per school and academic year,
``time_period`` written as ``202324`` for 2023/24; its suppression and not-applicable symbols
(``z``, ``x``, ``c``, ``:``, ``u``) are unknown values, never zeros. The GIAS file is written in
Windows-1252 (school names with curly apostrophes and accents), its coordinates are British
National Grid eastings and northings (EPSG:27700), transformed here to the city's UTM CRS.
Column names are matched case-insensitively against the few spellings the publishers have used.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from citycube.errors import SourceReadError

if TYPE_CHECKING:
    from citycube.grid.tiles import TileGrid

BNG_CRS = "EPSG:27700"
"""The CRS of GIAS eastings and northings."""
UNKNOWN_SYMBOLS = frozenset({"", "z", "x", "c", ":", "u", "low", "..", "n/a", "na"})
"""Explore-education-statistics symbols for a value that is not given (never a zero)."""

CAPACITY_COLUMNS: dict[str, tuple[str, ...]] = {
    "time_period": ("time_period",),
    "urn": ("urn", "school_urn"),
    "phase": ("school_phase", "phase", "phase_of_education", "phase_type_grouping"),
    "capacity": ("school_capacity", "capacity", "number_of_places", "net_capacity"),
    "pupils": ("number_of_pupils", "pupils_on_roll", "number_on_roll", "pupils", "nor"),
}
"""The capacity file's columns this reader needs, by role, with the spellings accepted."""
GIAS_COLUMNS: dict[str, tuple[str, ...]] = {
    "urn": ("urn",),
    "name": ("establishmentname", "establishment_name"),
    "phase": ("phaseofeducation (name)", "phaseofeducation"),
    "easting": ("easting",),
    "northing": ("northing",),
}
"""The GIAS columns this reader needs, by role."""

SCHOOL_RECORD_SCHEMA = pa.schema(
    [
        ("urn", pa.int64()),
        ("academic_year", pa.int16()),
        ("phase", pa.string()),
        ("capacity", pa.int64()),
        ("pupils", pa.int64()),
        ("source_file", pa.string()),
    ]
)
"""One row per capacity record: URN, the academic year's first calendar year (2023 for
2023/24), phase (lower case), places and pupils on roll (null when not given)."""
SCHOOL_LOCATION_SCHEMA = pa.schema(
    [
        ("urn", pa.int64()),
        ("name", pa.string()),
        ("gias_phase", pa.string()),
        ("easting", pa.float64()),
        ("northing", pa.float64()),
        ("x", pa.float64()),
        ("y", pa.float64()),
        ("tile_id", pa.string()),
        ("location_reason", pa.string()),
    ]
)
"""One row per GIAS establishment: its coordinates in BNG and in the city's UTM CRS, the 2 km
tile it falls in, or why it has none (``no_coordinate``, ``outside_grid``)."""


def academic_year_label(start_year: int) -> str:
    """``2023`` → ``2023/24``."""
    return f"{start_year}/{(start_year + 1) % 100:02d}"


def decode_text(body: bytes, path: Path | str) -> tuple[str, str]:
    """The file's text and the encoding it was read with: UTF-8 (with or without a byte-order
    mark) when it is valid UTF-8, else Windows-1252, else Latin-1 (which reads any byte)."""
    for encoding in ("utf-8-sig", "cp1252", "latin-1"):
        try:
            return body.decode(encoding), encoding
        except UnicodeDecodeError:
            continue
    raise SourceReadError(f"{path}: cannot be decoded as text")  # pragma: no cover - latin-1


def _read_csv(path: Path) -> tuple[pd.DataFrame, str]:
    try:
        body = path.read_bytes()
    except OSError as exc:
        raise SourceReadError(f"{path}: cannot be read ({exc})") from None
    text, encoding = decode_text(body, path)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as exc:
        raise SourceReadError(
            f"{path}: is not a readable CSV ({exc}); download it again from its publisher"
        ) from None
    return frame, encoding


def _columns(
    frame: pd.DataFrame, wanted: Mapping[str, Sequence[str]], path: Path, what: str
) -> dict[str, str]:
    by_lower = {str(c).strip().lower(): c for c in frame.columns}
    found: dict[str, str] = {}
    missing = []
    for role, names in wanted.items():
        hit = next((by_lower[n] for n in names if n in by_lower), None)
        if hit is None:
            missing.append(f"{role} ({' or '.join(names)})")
        else:
            found[role] = hit
    if missing:
        raise SourceReadError(
            f"{path}: is not a {what} file: no column for {', '.join(missing)}; it has "
            f"{', '.join(map(str, list(frame.columns)[:20]))}. Point the source at the "
            "school-level CSV of the release"
        )
    return found


def _integer(value: str) -> int | None:
    text = value.strip().replace(",", "")
    if text.lower() in UNKNOWN_SYMBOLS:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if np.isfinite(number) and number == int(number) else None


def _float(value: str) -> float | None:
    text = value.strip()
    if text.lower() in UNKNOWN_SYMBOLS:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if np.isfinite(number) else None


def academic_start_year(time_period: str, path: Path) -> int:
    """``202324`` (or ``2023/24``) → 2023; anything else is a clear error."""
    text = time_period.strip().replace("/", "").replace("-", "")
    if len(text) == 6 and text.isdigit():
        start, end = int(text[:4]), int(text[4:])
        if (start + 1) % 100 == end:
            return start
    raise SourceReadError(
        f"{path}: time_period {time_period!r} is not an academic year such as 202324"
    )


def read_capacity_csv(path: Path) -> pa.Table:
    """The capacity records of one school-level capacity CSV (every academic year it holds)."""
    frame, _encoding = _read_csv(path)
    cols = _columns(frame, CAPACITY_COLUMNS, path, "school-level capacity")
    rows = []
    for record in frame.to_dict("records"):
        urn = _integer(record[cols["urn"]])
        if urn is None:
            continue  # totals rows of a region or a local authority carry no URN
        rows.append(
            {
                "urn": urn,
                "academic_year": academic_start_year(record[cols["time_period"]], path),
                "phase": record[cols["phase"]].strip().lower() or None,
                "capacity": _integer(record[cols["capacity"]]),
                "pupils": _integer(record[cols["pupils"]]),
                "source_file": path.name,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHOOL_RECORD_SCHEMA)


def read_gias_csv(path: Path, city: str) -> pa.Table:
    """The establishments of a GIAS CSV, located on ``city``'s 2 km grid."""
    from pyproj import Transformer

    from citycube.grid.tiles import city_grid

    frame, _encoding = _read_csv(path)
    cols = _columns(frame, GIAS_COLUMNS, path, "Get Information about Schools establishment")
    grid = city_grid(city, "2km")
    to_utm = Transformer.from_crs(BNG_CRS, grid.crs, always_xy=True)
    kept = [r for r in frame.to_dict("records") if _integer(r[cols["urn"]]) is not None]
    east = np.array([_float(r[cols["easting"]]) for r in kept], dtype=float)
    north = np.array([_float(r[cols["northing"]]) for r in kept], dtype=float)
    # GIAS writes 0 (or nothing) for an establishment without a recorded location
    located = np.isfinite(east) & np.isfinite(north) & ~((east == 0) & (north == 0))
    xs, ys = to_utm.transform(np.where(located, east, 0.0), np.where(located, north, 0.0))
    rows = []
    for k, record in enumerate(kept):
        x = y = None
        tile, reason = None, "no_coordinate"
        if located[k]:
            x, y = float(xs[k]), float(ys[k])
            tile = tile_of(grid, x, y)
            reason = None if tile is not None else "outside_grid"
        rows.append(
            {
                "urn": _integer(record[cols["urn"]]),
                "name": record[cols["name"]].strip(),
                "gias_phase": record[cols["phase"]].strip().lower() or None,
                "easting": None if not np.isfinite(east[k]) else float(east[k]),
                "northing": None if not np.isfinite(north[k]) else float(north[k]),
                "x": x,
                "y": y,
                "tile_id": tile,
                "location_reason": reason,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHOOL_LOCATION_SCHEMA)


def tile_of(grid: TileGrid, x: float, y: float) -> str | None:
    """The id of the grid tile containing (x, y), or None off the grid."""
    col = int(np.floor((x - grid.x_min) / grid.tile_size))
    row = int(np.floor((grid.y_max - y) / grid.tile_size))
    if 0 <= row < grid.n_rows and 0 <= col < grid.n_cols:
        return grid.tile(row, col).tile_id
    return None


def read_school_files(capacity: Iterable[Path], gias: Path, city: str) -> pa.Table:
    """Every capacity record of the files, joined by URN to its GIAS location and tile.

    A record whose URN GIAS does not list keeps null location columns with the reason
    ``not_in_gias``. The same record (URN, academic year) in two files is kept twice: the
    case rule needs exactly one record per year and says so.
    """
    tables = [read_capacity_csv(p) for p in capacity]
    records = pa.concat_tables(tables) if tables else SCHOOL_RECORD_SCHEMA.empty_table()
    locations = read_gias_csv(gias, city)
    duplicated = pc.count_distinct(locations["urn"]).as_py() != locations.num_rows
    if duplicated:
        raise SourceReadError(f"{gias}: lists a URN more than once; it is not a GIAS extract")
    joined = records.join(locations, "urn", join_type="left outer")
    reason = joined["location_reason"].to_pylist()
    names = joined["name"].to_pylist()
    pairs = zip(names, reason, strict=True)
    fixed = ["not_in_gias" if n is None and r is None else r for n, r in pairs]
    joined = joined.set_column(
        joined.schema.get_field_index("location_reason"),
        "location_reason",
        pa.array(fixed, pa.string()),
    )
    return joined.sort_by([("urn", "ascending"), ("academic_year", "ascending")])
