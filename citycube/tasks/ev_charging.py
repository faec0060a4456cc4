"""EV charging expansion cases (AgenticCity-Bench App. D.1, D.3.1, Table 15) and their scoring.

The reference source is the Alternative Fuels Data Center (AFDC) station data: the
alt-fuel-stations API's JSON and its archived CSV snapshots. Public charging ports (Level 1 +
Level 2 + DC fast) are counted per 2 km tile at five dates: t−4, t−3, t−2 (what the agent sees),
and t (the target); the outcome is ports(t) − ports(t−2), the net change over two years from
September 2024 to September 2026.

**How a station counts at a date D.** Its count is read from the *earliest snapshot dated on or
after D* (a station closed before that snapshot is no longer in it; a later snapshot would
forget stations that closed after D). In that snapshot a station counts when its fuel type is
``ELEC``, its access is public (when the file has an access column), its status is ``E``
(available) or ``T`` (temporarily unavailable: installed, so part of the port stock) — never
``P`` (planned) — and its open date is on or before D. Its ports are its Level 1, Level 2 and
DC fast counts; a blank level is none of that level when the station gives another level, and
a station that gives none is unknown. A tile's count at D is unknown (NULL, with a reason),
never zero, when no snapshot is dated on or after D, or when a counted-status station in the
tile has no open date or no port count.

**Cases.** A tile is eligible when its counts at t−2 and t are known; its range is the city's
Table 15 interval its net change falls in (A includes zero and negative change). Strata are
city × range; within a stratum, tiles are taken in the order of
``sha256("<seed>:<city>:<range>:<tile>")``. The paper gives 50 tiles per city and 38/38/37/37
cases by range but not the 12 cells; :data:`ALLOCATION` is the one split that puts 13 in two
ranges of each city and meets both totals. Where a stratum has fewer eligible tiles, all are
taken and the shortfall is reported with its reason; nothing is borrowed from another stratum.

**Scoring.** Accuracy, macro-F1 over the four ranges (a range with no prediction and no
reference case has F1 0), balanced accuracy (mean recall over the ranges present in the
reference) and the confusion matrix. The direct baseline is the constant class ``A`` (the
paper's constant-class baseline: 25.3 % accuracy and macro-F1 0.101 on its 150 cases, which a
constant A or B gives; A is the no-growth answer), with a second, trend baseline: the range
of the previous two-year change ports(t−2) − ports(t−4) (A where t−4 is unknown).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyproj import Transformer

from citycube.errors import StationFileError

PRODUCT = "afdc_ev_stations"
"""Source product id of the AFDC station data."""
SCALE = "2km"
"""Cases are 2 km tiles."""
CITIES: tuple[str, ...] = ("Boston", "NYC", "SanFrancisco")
"""Cities of the EV cases (App. D.1)."""
RANGES: tuple[str, ...] = ("A", "B", "C", "D")
"""Expansion ranges, smallest first."""
RANGE_BOUNDS: dict[str, tuple[int, int, int]] = {
    "Boston": (0, 5, 10),
    "NYC": (0, 4, 18),
    "SanFrancisco": (0, 3, 8),
}
"""Table 15: the upper ends of A, B and C per city (D is everything above C)."""
ALLOCATION: dict[str, dict[str, int]] = {
    "Boston": {"A": 13, "B": 13, "C": 12, "D": 12},
    "NYC": {"A": 13, "B": 12, "C": 13, "D": 12},
    "SanFrancisco": {"A": 12, "B": 13, "C": 12, "D": 13},
}
"""Cases per city × range: 50 per city, 38/38/37/37 per range (App. D.3.1)."""
PERIODS: dict[str, date] = {
    "t-4": date(2022, 9, 30),
    "t-3": date(2023, 9, 30),
    "t-2": date(2024, 9, 30),
    "t": date(2026, 9, 30),
}
"""The counting dates: the baseline t−2 is September 2024, the target t September 2026."""
HISTORY_PERIODS: tuple[str, ...] = ("t-4", "t-3", "t-2")
"""Periods an agent sees."""
CALENDAR_YEAR_OF_T_MINUS_2 = 2024
"""The cube year of t−2: urban data an agent may read stop here."""
SAMPLING_SEED = 0
"""Seed of the stratum hash order."""
COUNTED_STATUS = ("E", "T")
"""Status codes of stations that exist at the snapshot (available, temporarily unavailable)."""
BASELINES: tuple[str, ...] = ("constant_A", "recent_change")
"""Direct baselines, in reporting order."""


# -------------------------------------------------------------------------------- stations

STATION_COLUMNS = (
    "station_id",
    "fuel_type_code",
    "status_code",
    "access_code",
    "open_date",
    "ev_level1_evse_num",
    "ev_level2_evse_num",
    "ev_dc_fast_num",
    "latitude",
    "longitude",
)
"""Normalised station columns (the API's field names)."""
CSV_HEADERS = {
    "ID": "station_id",
    "Fuel Type Code": "fuel_type_code",
    "Status Code": "status_code",
    "Access Code": "access_code",
    "Open Date": "open_date",
    "EV Level1 EVSE Num": "ev_level1_evse_num",
    "EV Level2 EVSE Num": "ev_level2_evse_num",
    "EV DC Fast Count": "ev_dc_fast_num",
    "Latitude": "latitude",
    "Longitude": "longitude",
}
"""Column headers of the AFDC CSV download → API field names."""
REQUIRED = tuple(c for c in STATION_COLUMNS if c != "access_code")
"""Columns a station file must have (access is optional: the API query already asks public)."""
PORT_COLUMNS = ("ev_level1_evse_num", "ev_level2_evse_num", "ev_dc_fast_num")
"""Port counts by level."""


def _parse_date(value: Any, path: Path, station: Any) -> date | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    if not text:
        return None
    for fmt in ("%Y-%m-%d", "%m/%d/%Y", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).date()
        except ValueError:
            continue
    raise StationFileError(
        f"{path}: station {station}: open date {text!r} is not YYYY-MM-DD or MM/DD/YYYY; "
        "fix the file or fetch it again"
    )


def _parse_count(value: Any, path: Path, station: Any, column: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise StationFileError(
            f"{path}: station {station}: {column} {value!r} is not a number"
        ) from None
    if math.isnan(number):
        return math.nan
    if number < 0 or number != int(number):
        raise StationFileError(f"{path}: station {station}: {column} {value!r} is not a count")
    return number


def _frame(rows: list[dict[str, Any]], path: Path) -> pd.DataFrame:
    """Normalised stations from raw rows keyed by API field names."""
    out: dict[str, list[Any]] = {c: [] for c in STATION_COLUMNS}
    for row in rows:
        station = row.get("station_id")
        try:
            out["station_id"].append(int(station))
        except (TypeError, ValueError):
            raise StationFileError(f"{path}: a station has id {station!r}, not a number") from None
        for column in ("fuel_type_code", "status_code", "access_code"):
            value = row.get(column)
            out[column].append(None if value in (None, "") else str(value).strip())
        out["open_date"].append(_parse_date(row.get("open_date"), path, station))
        for column in PORT_COLUMNS:
            out[column].append(_parse_count(row.get(column), path, station, column))
        for column in ("latitude", "longitude"):
            out[column].append(_parse_count_free(row.get(column), path, station, column))
    return pd.DataFrame(out)


def _parse_count_free(value: Any, path: Path, station: Any, column: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise StationFileError(
            f"{path}: station {station}: {column} {value!r} is missing"
        ) from None
    if not math.isfinite(number):
        raise StationFileError(f"{path}: station {station}: {column} is not finite")
    return number


def read_station_file(path: Path) -> pd.DataFrame:
    """Stations of one AFDC file: the API's JSON (``fuel_stations``) or a CSV download."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StationFileError(f"{path} is not readable JSON ({exc})") from None
        stations = document.get("fuel_stations") if isinstance(document, dict) else None
        if not isinstance(stations, list):
            raise StationFileError(
                f"{path} has no 'fuel_stations' list: not an alt-fuel-stations v1 response"
            )
        rows = []
        for station in stations:
            missing = [c for c in REQUIRED if c != "station_id" and c not in station]
            if "id" not in station:
                missing.insert(0, "id")
            if missing:
                raise StationFileError(f"{path}: station {station.get('id')} lacks {missing}")
            rows.append({**station, "station_id": station["id"]})
        return _frame(rows, path)
    if path.suffix == ".csv":
        try:
            with path.open(encoding="utf-8-sig", newline="") as handle:
                reader = csv.DictReader(handle)
                header = reader.fieldnames or []
                names = {h: CSV_HEADERS.get(h.strip(), h.strip()) for h in header}
                missing = [c for c in REQUIRED if c not in names.values()]
                if missing:
                    raise StationFileError(
                        f"{path} lacks the columns {missing} of an AFDC station download "
                        f"(it has {header[:12]}…)"
                    )
                rows = [{names[k]: v for k, v in r.items() if k in names} for r in reader]
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise StationFileError(f"{path} is not a readable CSV ({exc})") from None
        return _frame(rows, path)
    raise StationFileError(f"{path}: station files are .json (API) or .csv (download)")


@dataclass(frozen=True)
class Snapshot:
    """One dated station file of a city."""

    taken: date
    """When the snapshot was taken (its archive date, or the API download's date)."""
    path: Path
    """The file."""


def snapshot_roles(files: Mapping[str, str | Path]) -> list[Snapshot]:
    """The item's snapshots from its roles ``snapshot_YYYY-MM-DD``, oldest first."""
    found = []
    for role, path in files.items():
        if role.startswith("snapshot_"):
            try:
                taken = date.fromisoformat(role[len("snapshot_") :])
            except ValueError:
                raise StationFileError(f"item role {role!r} does not end in a date") from None
            found.append(Snapshot(taken, Path(path)))
    return sorted(found, key=lambda s: s.taken)


# -------------------------------------------------------------------------------- tile counts

TILE_PORT_SCHEMA = pa.schema(
    [
        pa.field("city", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("period", pa.string(), nullable=False),
        pa.field("count_date", pa.date32(), nullable=False),
        pa.field("snapshot_date", pa.date32()),
        pa.field("stations", pa.int32()),
        pa.field("ports_level1", pa.int32()),
        pa.field("ports_level2", pa.int32()),
        pa.field("ports_dc_fast", pa.int32()),
        pa.field("ports", pa.int32()),
        pa.field("reason", pa.string()),
    ]
)
"""Ports per tile and period; NULL counts carry a reason."""


def _tile_index(city: str, stations: pd.DataFrame) -> np.ndarray:
    """Index of each station's 2 km tile in row-major order, −1 outside the grid."""
    from citycube.grid.tiles import city_grid

    grid = city_grid(city, SCALE)
    to_utm = Transformer.from_crs("EPSG:4326", grid.crs, always_xy=True)
    x, y = to_utm.transform(stations["longitude"].to_numpy(), stations["latitude"].to_numpy())
    col = np.floor((np.asarray(x) - grid.x_min) / grid.tile_size).astype(np.int64)
    row = np.floor((grid.y_max - np.asarray(y)) / grid.tile_size).astype(np.int64)
    inside = (col >= 0) & (col < grid.n_cols) & (row >= 0) & (row < grid.n_rows)
    return np.where(inside, row * grid.n_cols + col, -1)


def tile_ports(city: str, snapshots: Sequence[Snapshot]) -> pa.Table:
    """Every tile's ports at each period (:data:`PERIODS`) from a city's snapshots."""
    from citycube.grid.tiles import city_grid

    tile_ids = city_grid(city, SCALE).tile_ids()
    columns: dict[str, list[Any]] = {f.name: [] for f in TILE_PORT_SCHEMA}
    read: dict[Path, pd.DataFrame] = {}
    for period, when in PERIODS.items():
        snapshot = next((s for s in snapshots if s.taken >= when), None)
        per_tile = _count_at(city, snapshot, when, read, len(tile_ids))
        for i, tile in enumerate(tile_ids):
            stations, levels, reason = per_tile[i]
            columns["city"].append(city)
            columns["tile_id"].append(tile)
            columns["period"].append(period)
            columns["count_date"].append(when)
            columns["snapshot_date"].append(None if snapshot is None else snapshot.taken)
            columns["stations"].append(stations)
            for name, value in zip(
                ("ports_level1", "ports_level2", "ports_dc_fast"), levels, strict=True
            ):
                columns[name].append(value)
            columns["ports"].append(None if levels[0] is None else sum(levels))
            columns["reason"].append(reason)
    return pa.table(columns, schema=TILE_PORT_SCHEMA)


def _count_at(
    city: str,
    snapshot: Snapshot | None,
    when: date,
    read: dict[Path, pd.DataFrame],
    n_tiles: int,
) -> list[tuple[int | None, tuple[int | None, ...], str | None]]:
    """(stations, ports by level, reason) of every tile at one date."""
    unknown = (None, None, None)
    if snapshot is None:
        return [(None, unknown, "no_snapshot_on_or_after_date")] * n_tiles
    if snapshot.path not in read:
        frame = read_station_file(snapshot.path)
        frame["tile"] = _tile_index(city, frame)
        read[snapshot.path] = frame
    frame = read[snapshot.path]
    counted = (
        (frame["fuel_type_code"] == "ELEC")
        & frame["status_code"].isin(COUNTED_STATUS)
        & (frame["access_code"].isna() | (frame["access_code"].str.lower() == "public"))
        & (frame["tile"] >= 0)
    )
    frame = frame[counted]
    undated = frame["open_date"].isna()
    opened = frame[~undated & (frame["open_date"] <= when)]
    ports = opened[list(PORT_COLUMNS)]
    no_ports = ports.isna().all(axis=1)
    result: list[tuple[int | None, tuple[int | None, ...], str | None]] = []
    undated_tiles = set(frame.loc[undated, "tile"].tolist())
    no_port_tiles = set(opened.loc[no_ports, "tile"].tolist())
    sums = ports.fillna(0).groupby(opened["tile"]).sum()
    counts = opened.groupby("tile").size()
    for tile in range(n_tiles):
        if tile in undated_tiles:
            result.append((None, unknown, "station_without_open_date"))
        elif tile in no_port_tiles:
            result.append((None, unknown, "station_without_port_count"))
        elif tile in counts.index:
            levels = tuple(int(sums.loc[tile, c]) for c in PORT_COLUMNS)
            result.append((int(counts.loc[tile]), levels, None))
        else:
            result.append((0, (0, 0, 0), None))
    return result


STATION_RECORD_SCHEMA = pa.schema(
    [
        pa.field("city", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("station_id", pa.int64(), nullable=False),
        pa.field("status_code", pa.string()),
        pa.field("ports_level1", pa.int32()),
        pa.field("ports_level2", pa.int32()),
        pa.field("ports_dc_fast", pa.int32()),
        pa.field("opened_by", pa.string()),
    ]
)
"""Baseline records: the stations counted at t−2 in a tile, with the first history period
at which each was open (``t-4`` also for older ones; no calendar date)."""


def baseline_stations(city: str, snapshots: Sequence[Snapshot], tiles: Iterable[str]) -> pa.Table:
    """The stations counted at t−2 in ``tiles`` (from the snapshot that gives t−2's count)."""
    from citycube.grid.tiles import city_grid

    wanted = set(tiles)
    rows: dict[str, list[Any]] = {f.name: [] for f in STATION_RECORD_SCHEMA}
    when = PERIODS["t-2"]
    snapshot = next((s for s in snapshots if s.taken >= when), None)
    if snapshot is None or not wanted:
        return pa.table(rows, schema=STATION_RECORD_SCHEMA)
    tile_ids = city_grid(city, SCALE).tile_ids()
    frame = read_station_file(snapshot.path)
    frame["tile"] = _tile_index(city, frame)
    frame = frame[
        (frame["fuel_type_code"] == "ELEC")
        & frame["status_code"].isin(COUNTED_STATUS)
        & (frame["access_code"].isna() | (frame["access_code"].str.lower() == "public"))
        & (frame["tile"] >= 0)
        & frame["open_date"].notna()
    ]
    frame = frame[frame["open_date"] <= when].sort_values("station_id")
    for station in frame.itertuples():
        tile = tile_ids[int(station.tile)]
        if tile not in wanted:
            continue
        opened_by = next(p for p in HISTORY_PERIODS if station.open_date <= PERIODS[p])
        rows["city"].append(city)
        rows["tile_id"].append(tile)
        rows["station_id"].append(int(station.station_id))
        rows["status_code"].append(station.status_code)
        for name, column in zip(
            ("ports_level1", "ports_level2", "ports_dc_fast"), PORT_COLUMNS, strict=True
        ):
            value = getattr(station, column)
            rows[name].append(None if pd.isna(value) else int(value))
        rows["opened_by"].append(opened_by)
    return pa.table(rows, schema=STATION_RECORD_SCHEMA)


# -------------------------------------------------------------------------------- cases


def range_of(city: str, change: int) -> str:
    """The Table 15 range of a net port change in a city."""
    a, b, c = RANGE_BOUNDS[city]
    if change <= a:
        return "A"
    if change <= b:
        return "B"
    if change <= c:
        return "C"
    return "D"


def range_texts(city: str) -> dict[str, str]:
    """The four ranges as an agent reads them (``A: ≤ 0``, ``B: 1–5``, …)."""
    a, b, c = RANGE_BOUNDS[city]
    return {"A": f"<= {a}", "B": f"{a + 1}-{b}", "C": f"{b + 1}-{c}", "D": f">= {c + 1}"}


def case_id(city: str, tile_id: str) -> str:
    """The paper-form case id."""
    return f"ev_{tile_id}"


def case_key(case: str) -> str:
    """An opaque key for a case id (what an agent sees)."""
    return "ev-" + hashlib.sha256(case.encode()).hexdigest()[:12]


def _rank(seed: int, city: str, label: str, tile: str) -> str:
    return hashlib.sha256(f"{seed}:{city}:{label}:{tile}".encode()).hexdigest()


CASE_SCHEMA = pa.schema(
    [
        pa.field("case_key", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("ports_t_minus_4", pa.int32()),
        pa.field("ports_t_minus_3", pa.int32()),
        pa.field("ports_t_minus_2", pa.int32(), nullable=False),
        pa.field("history_json", pa.string(), nullable=False),
        pa.field("ranges_json", pa.string(), nullable=False),
    ]
)
"""What an agent may see of a case: the history at t−4…t−2 by level and the ranges."""
REFERENCE_SCHEMA = pa.schema(
    [
        pa.field("case_key", pa.string(), nullable=False),
        pa.field("case_id", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("tile_id", pa.string(), nullable=False),
        pa.field("ports_t", pa.int32(), nullable=False),
        pa.field("net_change", pa.int32(), nullable=False),
        pa.field("range", pa.string(), nullable=False),
        pa.field("stratum_rank", pa.int32(), nullable=False),
    ]
)
"""The held-out reference of each case."""
COUNT_SCHEMA = pa.schema(
    [
        pa.field("city", pa.string(), nullable=False),
        pa.field("range", pa.string(), nullable=False),
        pa.field("wanted", pa.int32(), nullable=False),
        pa.field("eligible", pa.int32(), nullable=False),
        pa.field("selected", pa.int32(), nullable=False),
        pa.field("reason", pa.string()),
    ]
)
"""Cases per stratum: the paper's count, the eligible tiles, how many were taken and why not
the paper's count where short."""


@dataclass(frozen=True)
class EvCaseSet:
    """The selected cases, their references and the count per stratum."""

    cases: pa.Table
    references: pa.Table
    counts: pa.Table

    def found(self) -> dict[str, int]:
        """Cases per city."""
        out = dict.fromkeys(CITIES, 0)
        for city in self.references.column("city").to_pylist():
            out[city] += 1
        return out


def _history(rows: pd.DataFrame) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for period in HISTORY_PERIODS:
        row = rows.loc[period]
        out[period] = {
            "ports": _int(row["ports"]),
            "level1": _int(row["ports_level1"]),
            "level2": _int(row["ports_level2"]),
            "dc_fast": _int(row["ports_dc_fast"]),
            "stations": _int(row["stations"]),
            **({"unknown_reason": row["reason"]} if row["reason"] else {}),
        }
    return out


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def select_cases(
    ports: Mapping[str, pa.Table],
    unavailable: Mapping[str, str],
    seed: int = SAMPLING_SEED,
) -> EvCaseSet:
    """Cases from each city's tile ports; ``unavailable`` says why a city has no ports table."""
    cases: dict[str, list[Any]] = {f.name: [] for f in CASE_SCHEMA}
    refs: dict[str, list[Any]] = {f.name: [] for f in REFERENCE_SCHEMA}
    counts: dict[str, list[Any]] = {f.name: [] for f in COUNT_SCHEMA}
    for city in CITIES:
        if city not in ports:
            reason = unavailable.get(city, "no station data for the city")
            for label in RANGES:
                for name, value in zip(
                    COUNT_SCHEMA.names,
                    (city, label, ALLOCATION[city][label], 0, 0, reason),
                    strict=True,
                ):
                    counts[name].append(value)
            continue
        frame = ports[city].to_pandas().set_index(["tile_id", "period"]).sort_index()
        candidates: dict[str, list[tuple[str, str, int, int]]] = {r: [] for r in RANGES}
        ineligible: dict[str, int] = {}
        for tile in sorted(frame.index.get_level_values(0).unique()):
            rows = frame.loc[tile]
            base, target = rows.loc["t-2"], rows.loc["t"]
            if pd.isna(base["ports"]) or pd.isna(target["ports"]):
                why = base["reason"] if pd.isna(base["ports"]) else target["reason"]
                ineligible[why] = ineligible.get(why, 0) + 1
                continue
            change = int(target["ports"]) - int(base["ports"])
            label = range_of(city, change)
            candidates[label].append(
                (_rank(seed, city, label, tile), tile, change, int(target["ports"]))
            )
        for label in RANGES:
            wanted = ALLOCATION[city][label]
            pool = sorted(candidates[label])
            chosen = pool[:wanted]
            reason = None
            if len(chosen) < wanted:
                skipped = ", ".join(f"{n} {k}" for k, n in sorted(ineligible.items()))
                reason = f"only {len(pool)} eligible tiles have a net change in range {label}" + (
                    f" (tiles without a known count at t-2 or t: {skipped})" if skipped else ""
                )
            for name, value in zip(
                COUNT_SCHEMA.names,
                (city, label, wanted, len(pool), len(chosen), reason),
                strict=True,
            ):
                counts[name].append(value)
            for rank, (_, tile, change, ports_t) in enumerate(chosen):
                rows = frame.loc[tile]
                cid = case_id(city, tile)
                key = case_key(cid)
                history = _history(rows)
                cases["case_key"].append(key)
                cases["city"].append(city)
                cases["tile_id"].append(tile)
                cases["ports_t_minus_4"].append(history["t-4"]["ports"])
                cases["ports_t_minus_3"].append(history["t-3"]["ports"])
                cases["ports_t_minus_2"].append(history["t-2"]["ports"])
                cases["history_json"].append(json.dumps(history, sort_keys=True))
                cases["ranges_json"].append(json.dumps(range_texts(city)))
                for name, value in zip(
                    REFERENCE_SCHEMA.names,
                    (key, cid, city, tile, ports_t, change, label, rank),
                    strict=True,
                ):
                    refs[name].append(value)
    case_table = pa.table(cases, schema=CASE_SCHEMA).sort_by("case_key")
    ref_table = pa.table(refs, schema=REFERENCE_SCHEMA).sort_by("case_key")
    return EvCaseSet(case_table, ref_table, pa.table(counts, schema=COUNT_SCHEMA))


# -------------------------------------------------------------------------------- scoring


def baseline_predictions(cases: pa.Table, name: str) -> dict[str, str]:
    """A direct baseline's range per case key."""
    keys = cases.column("case_key").to_pylist()
    if name == "constant_A":
        return dict.fromkeys(keys, "A")
    if name == "recent_change":
        out = {}
        for key, city, old, new in zip(
            keys,
            cases.column("city").to_pylist(),
            cases.column("ports_t_minus_4").to_pylist(),
            cases.column("ports_t_minus_2").to_pylist(),
            strict=True,
        ):
            out[key] = "A" if old is None else range_of(city, new - old)
        return out
    raise ValueError(f"unknown EV baseline {name!r}: one of {', '.join(BASELINES)}")


@dataclass(frozen=True)
class EvScores:
    """Classification scores of one method over a set of cases."""

    n: int
    accuracy: float
    macro_f1: float
    balanced_accuracy: float
    confusion: list[list[int]]
    """Rows: reference range A–D; columns: predicted range A–D."""


def score(reference: Sequence[str], predicted: Sequence[str]) -> EvScores:
    """Accuracy, macro-F1, balanced accuracy and the confusion matrix over ranges A–D."""
    if len(reference) != len(predicted):
        raise ValueError("reference and predictions differ in length")
    index = {r: i for i, r in enumerate(RANGES)}
    matrix = np.zeros((len(RANGES), len(RANGES)), dtype=np.int64)
    for ref, pred in zip(reference, predicted, strict=True):
        matrix[index[ref], index[pred]] += 1
    n = int(matrix.sum())
    if n == 0:
        return EvScores(0, math.nan, math.nan, math.nan, matrix.tolist())
    diag = np.diag(matrix).astype(float)
    support = matrix.sum(axis=1).astype(float)
    predicted_n = matrix.sum(axis=0).astype(float)
    f1 = np.where(support + predicted_n > 0, 2 * diag / np.maximum(support + predicted_n, 1), 0.0)
    present = support > 0
    recall = diag[present] / support[present]
    return EvScores(
        n=n,
        accuracy=float(diag.sum() / n),
        macro_f1=float(f1.mean()),
        balanced_accuracy=float(recall.mean()),
        confusion=matrix.tolist(),
    )


SCORE_SCHEMA = pa.schema(
    [
        pa.field("method", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("n", pa.int32(), nullable=False),
        pa.field("accuracy", pa.float64()),
        pa.field("macro_f1", pa.float64()),
        pa.field("balanced_accuracy", pa.float64()),
        pa.field("confusion_json", pa.string(), nullable=False),
    ]
)
"""One row per method and city (``all``: every case pooled)."""


def score_table(references: pa.Table, predictions: Mapping[str, Mapping[str, str]]) -> pa.Table:
    """Scores of each method's predictions (case key → range), pooled and per city."""
    keys = references.column("case_key").to_pylist()
    cities = references.column("city").to_pylist()
    truth = references.column("range").to_pylist()
    rows: dict[str, list[Any]] = {f.name: [] for f in SCORE_SCHEMA}
    for method, predicted in predictions.items():
        missing = [k for k in keys if k not in predicted]
        if missing:
            raise ValueError(f"{method} has no prediction for {len(missing)} cases ({missing[:3]})")
        for city in ("all", *CITIES):
            chosen = [i for i, c in enumerate(cities) if city in ("all", c)]
            if city != "all" and not chosen:
                continue
            result = score([truth[i] for i in chosen], [predicted[keys[i]] for i in chosen])
            for name, value in zip(
                SCORE_SCHEMA.names,
                (
                    method,
                    city,
                    result.n,
                    result.accuracy,
                    result.macro_f1,
                    result.balanced_accuracy,
                    json.dumps(result.confusion),
                ),
                strict=True,
            ):
                rows[name].append(value)
    return pa.table(rows, schema=SCORE_SCHEMA)


def baseline_scores(case_set: EvCaseSet) -> pa.Table:
    """The direct baselines' scores."""
    return score_table(
        case_set.references,
        {name: baseline_predictions(case_set.cases, name) for name in BASELINES},
    )


def city_ports(files_by_city: Mapping[str, Mapping[str, str | Path]]) -> dict[str, pa.Table]:
    """Tile ports of every city from its item's files (roles ``snapshot_<date>``)."""
    return {city: tile_ports(city, snapshot_roles(files)) for city, files in files_by_city.items()}


def unavailable_reasons(
    scope: Iterable[str], served: Iterable[str], failures: Mapping[str, str]
) -> dict[str, str]:
    """Why each EV city without a ports table has none."""
    scope, served = set(scope), set(served)
    out = {}
    for city in CITIES:
        if city in served:
            continue
        if city not in scope:
            out[city] = "city outside the release's scope"
        else:
            out[city] = failures.get(city, "the station source serves no item for the city")
    return out


# -------------------------------------------------------------------------------- release files


@dataclass(frozen=True)
class EvFiles:
    """Paths of the EV task's files in one benchmark folder."""

    root: Path

    @classmethod
    def draft(cls, release: Any) -> EvFiles:
        """Where a build writes them."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.draft_dir / BENCHMARK_DIR)

    @classmethod
    def published(cls, release: Any) -> EvFiles:
        """The published ones (what readers and agents' tools see)."""
        from citycube.cube.release import BENCHMARK_DIR

        return cls(release.published_root / BENCHMARK_DIR)

    @property
    def cases(self) -> Path:
        """What an agent is given: history t−4…t−2 and the ranges, no reference."""
        return self.root / "ev_cases.parquet"

    @property
    def references(self) -> Path:
        """Held out: ports at t, net change and range."""
        return self.root / "ev_targets.parquet"

    @property
    def counts(self) -> Path:
        """Per city × range: the paper's count, eligible, selected and why short."""
        return self.root / "ev_case_counts.parquet"

    @property
    def ports(self) -> Path:
        """Held out: every tile's ports at t−4…t of the cities served (the reference source)."""
        return self.root / "ev_tile_ports.parquet"

    @property
    def stations(self) -> Path:
        """Baseline records: the stations counted at t−2 in each case's tile."""
        return self.root / "ev_baseline_stations.parquet"

    @property
    def scores(self) -> Path:
        """The direct baselines' scores."""
        return self.root / "ev_baseline_scores.parquet"

    @property
    def manifest(self) -> Path:
        """Rules, counts found per city and why the rest are missing, file hashes."""
        return self.root / "ev_manifest.json"


def write_ev_cases(
    release: Any,
    files_by_city: Mapping[str, Mapping[str, str | Path]],
    unavailable: Mapping[str, str],
    seed: int = SAMPLING_SEED,
) -> tuple[EvCaseSet, pa.Table]:
    """Cases, references, counts, tile ports, baseline scores and manifest into the draft."""
    from citycube.cube.release import file_metadata, write_json_atomic, write_parquet_atomic
    from citycube.io.digest import file_sha256

    files = EvFiles.draft(release)
    snapshots = {c: snapshot_roles(f) for c, f in files_by_city.items()}
    ports = {c: tile_ports(c, s) for c, s in snapshots.items()}
    case_set = select_cases(ports, unavailable, seed)
    scores = baseline_scores(case_set)
    tiles = case_set.cases.column("tile_id").to_pylist()
    stations = pa.concat_tables(
        [STATION_RECORD_SCHEMA.empty_table()]
        + [baseline_stations(c, snapshots[c], tiles) for c in sorted(snapshots)]
    )
    meta = file_metadata(release)
    all_ports = (
        pa.concat_tables([ports[c] for c in sorted(ports)])
        if ports
        else TILE_PORT_SCHEMA.empty_table()
    )
    for table, path in (
        (case_set.cases, files.cases),
        (case_set.references, files.references),
        (case_set.counts, files.counts),
        (all_ports, files.ports),
        (stations, files.stations),
        (scores, files.scores),
    ):
        write_parquet_atomic(table, path, meta)
    found = case_set.found()
    manifest = {
        "release": release.version,
        "seed": seed,
        "periods": {k: v.isoformat() for k, v in PERIODS.items()},
        "ranges": {c: range_texts(c) for c in CITIES},
        "allocation": ALLOCATION,
        "wanted": {c: sum(ALLOCATION[c].values()) for c in CITIES},
        "found": found,
        "missing": {
            c: unavailable.get(c) or _short_reason(case_set.counts, c)
            for c in CITIES
            if found[c] < sum(ALLOCATION[c].values())
        },
        "files": {
            p.stem: {"path": p.name, "sha256": file_sha256(p)}
            for p in (
                files.cases,
                files.references,
                files.counts,
                files.ports,
                files.stations,
                files.scores,
            )
        },
    }
    write_json_atomic(manifest, files.manifest)
    return case_set, scores


def _short_reason(counts: pa.Table, city: str) -> str:
    reasons = [
        f"{r['range']}: {r['reason']}"
        for r in counts.to_pylist()
        if r["city"] == city and r["reason"]
    ]
    return "; ".join(reasons)


EV_VIEWS = {
    "ev_cases": "cases",
    "ev_targets": "references",
    "ev_case_counts": "counts",
    "ev_tile_ports": "ports",
    "ev_baseline_stations": "stations",
    "ev_baseline_scores": "scores",
}
"""View name → :class:`EvFiles` property."""


def create_ev_views(con: Any, folder: Path) -> list[str]:
    """Views over the EV files present now in ``folder`` (a snapshot's benchmark folder)."""
    from citycube.cube.release import create_file_view

    files = EvFiles(folder)
    created = []
    for name, attribute in EV_VIEWS.items():
        path: Path = getattr(files, attribute)
        if path.exists():
            create_file_view(con, name, path)
            created.append(name)
    return created
