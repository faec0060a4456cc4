"""Synthetic AFDC EV charging stations: the archived CSV snapshots and one API JSON response.

A static item per US EV city (Boston, New York City, San Francisco) with the files the real
source serves: CSV downloads (the AFDC download's column headers) dated 30 September 2022,
2023 and 2024, and an alt-fuel-stations v1 JSON response dated 30 September 2026. Stations
open, grow and close tile by tile, denser near the city centre; the gaps are those of the real
data: planned stations (status ``P``, no open date), temporarily unavailable ones, private
ones, stations that close between snapshots (absent from later files), a few stations without
an open date and a few without any port count. Every file says it is synthetic (a
``synthetic`` column in the CSVs, top-level members in the JSON).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import pandas as pd
from pyproj import Transformer

from citycube.errors import SourceUnavailableError
from citycube.grid.tiles import city_grid
from citycube.tasks.ev_charging import CITIES, PRODUCT, SCALE
from sources.sample.layers import CsvLayer, JsonLayer
from sources.sample.world import GeneratedItem, SyntheticCity, stable_hash

CSV_SNAPSHOTS = (date(2022, 9, 30), date(2023, 9, 30), date(2024, 9, 30))
"""Archived CSV snapshots the twin writes."""
API_SNAPSHOT = date(2026, 9, 30)
"""Date of the API response the twin writes."""
FIRST_OPEN = date(2012, 1, 1)
"""Earliest open date of a synthetic station."""
STATE = {"Boston": "MA", "NYC": "NY", "SanFrancisco": "CA"}
"""State code of each city (an AFDC column)."""
WGS84_TO = "EPSG:4326"


def _stations(world: SyntheticCity) -> pd.DataFrame:
    """Every station that ever exists in the city, with its life and ports."""
    city = world.city
    rng = np.random.default_rng(stable_hash("afdc-ev", city, world.seed))
    grid = city_grid(city, SCALE)
    cx, cy = world.centre_xy
    half = max(grid.n_rows, grid.n_cols) * grid.tile_size / 2
    rows: list[dict[str, object]] = []
    span = (date(2026, 9, 1) - FIRST_OPEN).days
    next_id = 100_000 + 10_000 * CITIES.index(city)
    for tile in grid.tiles():
        x0, y0, x1, y1 = tile.bounds
        distance = np.hypot((x0 + x1) / 2 - cx, (y0 + y1) / 2 - cy) / half
        intensity = float(np.exp(rng.normal(1.2 - 2.2 * distance, 0.9)))
        n = int(rng.poisson(intensity * 3))
        for _ in range(n):
            # later years open more stations (adoption grows)
            opened = FIRST_OPEN + timedelta(days=int(span * rng.beta(2.6, 1.0)))
            closes = rng.random() < 0.06
            level2 = int(rng.integers(1, 7))
            fast = int(rng.integers(1, 5)) if rng.random() < 0.2 else 0
            level1 = int(rng.integers(1, 3)) if rng.random() < 0.05 else 0
            rows.append(
                {
                    "id": next_id,
                    "x": rng.uniform(x0 + 1, x1 - 1),
                    "y": rng.uniform(y0 + 1, y1 - 1),
                    "opened": opened,
                    "closed": opened + timedelta(days=int(rng.integers(200, 1500)))
                    if closes
                    else None,
                    "level1": level1,
                    "level2": level2,
                    "fast": fast,
                    "private": rng.random() < 0.08,
                    "temporarily": rng.random() < 0.03,
                    "undated": rng.random() < 0.004,
                    "no_ports": rng.random() < 0.003,
                }
            )
            next_id += 1
    frame = pd.DataFrame(rows)
    to_wgs = Transformer.from_crs(grid.crs, WGS84_TO, always_xy=True)
    lon, lat = to_wgs.transform(frame["x"].to_numpy(), frame["y"].to_numpy())
    frame["longitude"] = np.round(lon, 6)
    frame["latitude"] = np.round(lat, 6)
    return frame


def _snapshot(stations: pd.DataFrame, taken: date, state: str) -> list[dict[str, object]]:
    """Stations as a snapshot taken on ``taken`` lists them (API field names)."""
    out = []
    for s in stations.itertuples():
        if s.closed is not None and s.closed <= taken:
            continue  # closed stations leave the database
        planned = s.opened > taken
        if planned and s.opened > taken + timedelta(days=365):
            continue  # not yet announced
        ports = {
            "ev_level1_evse_num": s.level1 or None,
            "ev_level2_evse_num": s.level2 or None,
            "ev_dc_fast_num": s.fast or None,
        }
        if s.no_ports:
            ports = dict.fromkeys(ports)
        out.append(
            {
                "id": int(s.id),
                "fuel_type_code": "ELEC",
                "status_code": "P" if planned else ("T" if s.temporarily else "E"),
                "access_code": "private" if s.private else "public",
                "open_date": None if planned or s.undated else s.opened.isoformat(),
                "expected_date": s.opened.isoformat() if planned else None,
                **ports,
                "latitude": float(s.latitude),
                "longitude": float(s.longitude),
                "state": state,
                "station_name": f"Synthetic charging site {int(s.id)}",
            }
        )
    return out


CSV_COLUMNS = {
    "fuel_type_code": "Fuel Type Code",
    "station_name": "Station Name",
    "state": "State",
    "status_code": "Status Code",
    "expected_date": "Expected Date",
    "ev_level1_evse_num": "EV Level1 EVSE Num",
    "ev_level2_evse_num": "EV Level2 EVSE Num",
    "ev_dc_fast_num": "EV DC Fast Count",
    "latitude": "Latitude",
    "longitude": "Longitude",
    "id": "ID",
    "open_date": "Open Date",
    "access_code": "Access Code",
}
"""API field → AFDC CSV download header, in the download's order."""


class AfdcEvStations:
    """The AFDC station snapshots of one city (static: one item holds every snapshot)."""

    product_id = PRODUCT

    def years(self) -> list[int] | None:
        """Static: the snapshots are roles of one item."""
        return None

    def covers(self, city: str) -> bool:
        """AFDC covers the United States; the twin serves the EV task's cities."""
        return city in CITIES

    def generate(self, world: SyntheticCity, year: int | None) -> GeneratedItem:
        """CSV snapshots (t−4…t−2) and the API response (t)."""
        if not self.covers(world.city):
            raise SourceUnavailableError(
                f"{PRODUCT} covers only {', '.join(CITIES)} in the sample",
                reason="outside_source_coverage",
            )
        stations = _stations(world)
        state = STATE[world.city]
        bounds = (
            float(stations["longitude"].min()),
            float(stations["latitude"].min()),
            float(stations["longitude"].max()),
            float(stations["latitude"].max()),
        )
        layers: list[CsvLayer | JsonLayer] = []
        for taken in CSV_SNAPSHOTS:
            frame = pd.DataFrame(_snapshot(stations, taken, state), columns=list(CSV_COLUMNS))
            frame = frame.rename(columns=CSV_COLUMNS)
            for column in ("EV Level1 EVSE Num", "EV Level2 EVSE Num", "EV DC Fast Count", "ID"):
                frame[column] = frame[column].astype("Int64")
            layers.append(
                CsvLayer(
                    role=f"snapshot_{taken.isoformat()}",
                    filename=f"alt_fuel_stations_{taken.isoformat()}.csv",
                    title=f"AFDC station download archived {taken.isoformat()} (synthetic)",
                    frame=frame,
                    fallback_bounds=bounds,
                )
            )
        current = _snapshot(stations, API_SNAPSHOT, state)
        layers.append(
            JsonLayer(
                role=f"snapshot_{API_SNAPSHOT.isoformat()}",
                filename=f"alt_fuel_stations_{API_SNAPSHOT.isoformat()}.json",
                title=f"alt-fuel-stations v1 response of {API_SNAPSHOT.isoformat()} (synthetic)",
                payload={
                    "station_locator_url": "https://afdc.energy.gov/stations/",
                    "total_results": len(current),
                    "station_counts": {"fuels": {"ELEC": {"total": len(current)}}},
                    "fuel_stations": current,
                },
            )
        )
        taken = [*CSV_SNAPSHOTS, API_SNAPSHOT]
        return GeneratedItem(
            item_id=f"{PRODUCT}_{world.city}",
            layers=tuple(layers),
            timestamp=None,
            start_datetime=datetime(FIRST_OPEN.year, 1, 1, tzinfo=UTC),
            end_datetime=datetime(API_SNAPSHOT.year, 9, 30, tzinfo=UTC),
            properties={"afdc:snapshots": [d.isoformat() for d in taken]},
            extra={"snapshots": ",".join(d.isoformat() for d in taken), "state": state},
        )
