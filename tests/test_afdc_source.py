"""The ``afdc`` adapter against a loopback server speaking the alt-fuel-stations v1 API (JSON,
``limit``/``offset`` paging, the key in ``X-Api-Key``) and serving archived CSV downloads:
real files written here, installed, read back by the EV task's station reader."""

from __future__ import annotations

import csv
import io
import json
import logging
import threading
from collections import deque
from datetime import date
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from citycube.errors import ApiKeyMissingError, SourceUnavailableError, StationFileError
from citycube.grid.tiles import city_grid
from citycube.items.protocol import SourceSetSpec
from citycube.tasks import ev_charging as ev
from sources import build_source_set
from tests.faulty_http_server import LoopbackServer

KEY = "s3cr3t-nrel-key-0123456789"
API = "/api/alt-fuel-stations/v1.json"


class AfdcServer(LoopbackServer):
    """``with AfdcServer() as server:``: the API at :data:`API`, files under ``/files/``."""

    def __init__(self, stations: list[dict[str, Any]]) -> None:
        self.stations = stations
        self.files: dict[str, bytes] = {}
        self.seen: list[tuple[str, dict[str, str], str | None]] = []
        self.statuses: deque[int] = deque()
        self._lock = threading.Lock()
        self._listen(self._handler())

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                with server._lock:
                    server.seen.append((parts.path, query, self.headers.get("X-Api-Key")))
                    status = server.statuses.popleft() if server.statuses else None
                if status is not None:
                    return self._send(status, b'{"error": "scripted"}')
                if parts.path.startswith("/files/"):
                    body = server.files.get(parts.path[len("/files/") :])
                    return self._send(404 if body is None else 200, body or b"not found")
                if parts.path != API:
                    return self._send(404, b"{}")
                if self.headers.get("X-Api-Key") != KEY or "api_key" in query:
                    error = {"error": {"code": "API_KEY_INVALID", "message": "bad key"}}
                    return self._send(403, json.dumps(error).encode())
                rows = [
                    s
                    for s in server.stations
                    if s["fuel_type_code"] == query.get("fuel_type")
                    and s["state"] == query.get("state")
                ]
                offset, limit = int(query.get("offset", 0)), int(query.get("limit", 200))
                page = {
                    "station_locator_url": "https://afdc.energy.gov/stations/",
                    "total_results": len(rows),
                    "fuel_stations": rows[offset : offset + limit],
                }
                self._send(200, json.dumps(page).encode())

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _tile_lonlat(city: str, row: int, col: int) -> tuple[float, float]:
    from pyproj import Transformer

    tile = city_grid(city, "2km").tile(row, col)
    x0, y0, x1, y1 = tile.bounds
    lon, lat = Transformer.from_crs(
        city_grid(city, "2km").crs, "EPSG:4326", always_xy=True
    ).transform((x0 + x1) / 2, (y0 + y1) / 2)
    return float(lon), float(lat)


def _station(sid: int, lonlat: tuple[float, float], **fields: Any) -> dict[str, Any]:
    base = {
        "id": sid,
        "fuel_type_code": "ELEC",
        "status_code": "E",
        "access_code": "public",
        "open_date": "2020-05-01",
        "ev_level1_evse_num": None,
        "ev_level2_evse_num": 2,
        "ev_dc_fast_num": None,
        "latitude": lonlat[1],
        "longitude": lonlat[0],
        "state": "MA",
    }
    return {**base, **fields}


def _csv(stations: list[dict[str, Any]]) -> bytes:
    headers = {v: k for k, v in ev.CSV_HEADERS.items()}
    out = io.StringIO()
    writer = csv.writer(out)
    columns = ["Station Name", *headers.values(), "State"]
    writer.writerow(columns)
    for s in stations:
        row = {headers[k]: s[k if k != "station_id" else "id"] for k in headers}
        writer.writerow(
            ["x", *("" if row[c] is None else row[c] for c in headers.values()), s["state"]]
        )
    return out.getvalue().encode()


def _source_set(tmp_path: Path, server: AfdcServer, **afdc: Any) -> Any:
    options = {
        "cache_dir": str(tmp_path / "cache"),
        "api_url": server.url(API),
        "api_date": "2026-09-30",
        "page_size": 2,
        "attempts": 3,
        "wait_initial_s": 0.01,
        "wait_max_s": 0.02,
        **afdc,
    }
    spec = SourceSetSpec(
        name="afdc-test",
        default="sample",
        products={ev.PRODUCT: "afdc"},
        options={"afdc": options},
    )
    return build_source_set(spec)


@pytest.fixture
def stations() -> list[dict[str, Any]]:
    here = _tile_lonlat("Boston", 6, 6)
    there = _tile_lonlat("Boston", 2, 3)
    return [
        _station(1, here, open_date="2021-03-01", ev_level2_evse_num=4),
        _station(2, here, open_date="2025-06-01", ev_dc_fast_num=2, ev_level2_evse_num=None),
        _station(3, here, status_code="P", open_date=None, ev_level2_evse_num=6),
        _station(4, there, open_date="2023-01-15", ev_level1_evse_num=1),
        _station(5, there, access_code="private", ev_level2_evse_num=10),
        _station(6, there, state="NY"),
    ]


def test_api_pages_by_offset_key_in_header_never_stored(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stations: list[dict[str, Any]],
) -> None:
    monkeypatch.setenv("NREL_API_KEY", KEY)
    archived = [s for s in stations if s["id"] in (1, 4, 5)]  # station 2 not open yet
    with AfdcServer(stations) as server:
        server.files["afdc_2024-09-30.csv"] = _csv(archived)
        server.statuses.append(503)  # one transient failure, retried
        sources = _source_set(
            tmp_path,
            server,
            snapshots={
                "Boston": [{"date": "2024-09-30", "url": server.url("/files/afdc_2024-09-30.csv")}]
            },
        )
        with caplog.at_level(logging.DEBUG):
            item = sources.fetch(ev.PRODUCT, "Boston", None, tmp_path / "sources")
        api_calls = [q for p, q, _ in server.seen if p == API]
    # five MA stations in pages of two: offsets 0, 2, 4, all with the key in the header only
    assert [q["offset"] for q in api_calls] == ["0", "2", "4"]
    assert all(q["state"] == "MA" and q["fuel_type"] == "ELEC" for q in api_calls)
    assert all(key == KEY for p, _, key in server.seen if p == API)
    assert sorted(item.files) == ["snapshot_2024-09-30", "snapshot_2026-09-30"]
    merged = json.loads(Path(item.files["snapshot_2026-09-30"]).read_text())
    assert merged["total_results"] == 5 and [s["id"] for s in merged["fuel_stations"]] == [
        1,
        2,
        3,
        4,
        5,
    ]
    # the key is nowhere on disk nor in the log
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in caplog.text
    # the EV reader counts ports per tile from both files
    ports = ev.tile_ports("Boston", ev.snapshot_roles(item.files)).to_pandas()
    here = ports[ports.tile_id == "Boston_2KM_r6_c6"].set_index("period")
    there = ports[ports.tile_id == "Boston_2KM_r2_c3"].set_index("period")
    assert here.loc["t-2", "ports"] == 4 and here.loc["t", "ports"] == 6  # planned left out
    assert here.loc["t", "ports_dc_fast"] == 2
    assert there.loc["t-4", "ports"] == 0 and there.loc["t-3", "ports"] == 3  # private left out
    assert here.loc["t-2", "snapshot_date"] == date(2024, 9, 30)


def test_missing_key_fails_clearly_and_installs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stations: list[dict[str, Any]]
) -> None:
    monkeypatch.delenv("NREL_API_KEY", raising=False)
    with AfdcServer(stations) as server:
        sources = _source_set(tmp_path, server)
        with pytest.raises(ApiKeyMissingError, match=r"\$NREL_API_KEY") as err:
            sources.fetch(ev.PRODUCT, "Boston", None, tmp_path / "sources")
        assert not err.value.transient
        assert not [p for p, _, _ in server.seen if p == API]
    assert not (tmp_path / "sources" / ev.PRODUCT / "Boston" / "static").exists()


def test_csv_without_port_columns_is_refused_by_name(
    tmp_path: Path, stations: list[dict[str, Any]]
) -> None:
    with AfdcServer(stations) as server:
        server.files["bad.csv"] = b"ID,Fuel Type Code,Latitude,Longitude\n1,ELEC,42.3,-71.0\n"
        sources = _source_set(
            tmp_path,
            server,
            api=False,
            snapshots={"Boston": [{"date": "2023-09-30", "url": server.url("/files/bad.csv")}]},
        )
        with pytest.raises(StationFileError, match="ev_level2_evse_num"):
            sources.fetch(ev.PRODUCT, "Boston", None, tmp_path / "sources")
    assert not (tmp_path / "sources" / ev.PRODUCT / "Boston" / "static").exists()


def test_a_city_outside_the_united_states_is_unavailable(
    tmp_path: Path, stations: list[dict[str, Any]]
) -> None:
    with AfdcServer(stations) as server:
        sources = _source_set(tmp_path, server)
        with pytest.raises(SourceUnavailableError) as err:
            sources.fetch(ev.PRODUCT, "Amsterdam", None, tmp_path / "sources")
    assert err.value.reason == "outside_source_coverage"


def test_the_packaged_source_set_takes_the_stations_from_afdc() -> None:
    from sources import load_source_set

    sources = load_source_set(Path(__file__).parents[1] / "schemas/source_sets/afdc.yaml")
    adapter = sources.product(ev.PRODUCT)
    assert adapter.info.source_id == "afdc:alt-fuel-stations-v1" and not adapter.info.synthetic
    assert sources.product("ghs_pop").info.synthetic
