"""A loopback server speaking the record portals' protocols, with scripted misbehaviour.

- **ArcGIS REST** ``/arcgis/rest/services/<service>/FeatureServer/<layer>/query``: ``where``
  (``FIELD = value``), ``orderByFields``, ``resultOffset``/``resultRecordCount`` capped by the
  layer's ``maxRecordCount`` and ``exceededTransferLimit`` while more rows remain, ``outSR``
  (geometry in EPSG:4326 only; another outSR is answered, as some layers do, with the layer's
  own wkid), ``f=json`` Esri JSON. Errors come as ArcGIS sends them: HTTP 200 with
  ``{"error": {"code", "message", "details"}}``.
- **Socrata SODA** ``/resource/<id>.json``: ``$limit``, ``$offset``, ``$order`` (required
  here, as paging needs it) and ``$where`` (``field = 'value'`` or ``field between 'a' and
  'b'`` on ISO dates); errors are SODA's JSON error objects with 400.
- **Paged JSON** ``/api/action/datastore_search`` (CKAN/data.gov.sg): ``resource_id``,
  ``offset``, ``limit``; rows at ``result.records``.
- **World Bank API v2** ``/wb/v2/country/all/indicator/<id>``: ``per_page`` and ``page``.
- **Files** ``/files/<name>``: bulk CSVs, join tables, coverage polygons.

Faults are queued per path and used one request at a time: ``Fault(status=429,
headers={"Retry-After": "1"})`` or ``Fault(arcgis_error=(500, "…"))``. Every request is
recorded with its query and the headers a test asks about.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.faulty_http_server import LoopbackServer


@dataclass(frozen=True)
class Fault:
    """One scripted misbehaviour of one request."""

    status: int | None = None
    """Answer this HTTP status (with ``headers``) and a short body."""
    headers: dict[str, str] = field(default_factory=dict)
    arcgis_error: tuple[int, str] | None = None
    """Answer HTTP 200 with an ArcGIS error object of this code and message."""


@dataclass(frozen=True)
class Seen:
    """A request as the server saw it."""

    at: float
    path: str
    query: dict[str, str]
    app_token: str | None
    api_key: str | None


@dataclass
class Layer:
    """An ArcGIS feature layer: Esri JSON features and the server's page cap."""

    features: list[dict[str, Any]]
    max_record_count: int = 1000
    wkid: int = 4326
    """The layer's own CRS; outSR other than it is ignored when ``honours_out_sr`` is false."""
    honours_out_sr: bool = True


class RecordPortals(LoopbackServer):
    """``with RecordPortals() as portals:`` then ``portals.url('/resource/x.json')``."""

    def __init__(self) -> None:
        self.layers: dict[str, Layer] = {}
        self.soda: dict[str, list[dict[str, Any]]] = {}
        self.datastore: dict[str, list[dict[str, Any]]] = {}
        self.worldbank: dict[str, list[dict[str, Any]]] = {}
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._listen(self._handler(), _QuietServer)

    def fault(self, path: str, *faults: Fault) -> None:
        """Queue faults for the next requests of a path (query ignored)."""
        self.faults["/" + path.lstrip("/")].extend(faults)

    def requests(self, path: str) -> list[Seen]:
        """Requests of one path, in order."""
        return [s for s in self.seen if s.path == "/" + path.lstrip("/")]

    # ------------------------------------------------------------------------ answers

    def _arcgis(self, name: str, query: dict[str, str]) -> tuple[int, Any]:
        layer = self.layers[name]
        if query.get("f") != "json":
            return 200, {"error": {"code": 400, "message": "Invalid format", "details": []}}
        rows = [f for f in layer.features if _where(query.get("where", "1=1"), f["attributes"])]
        order = query.get("orderByFields")
        if order:
            rows.sort(key=lambda f: f["attributes"].get(order.split()[0]))
        offset = int(query.get("resultOffset", 0))
        count = min(
            int(query.get("resultRecordCount", layer.max_record_count)), layer.max_record_count
        )
        page = rows[offset : offset + count]
        out_sr = int(query.get("outSR", layer.wkid))
        wkid = out_sr if layer.honours_out_sr and out_sr == 4326 else layer.wkid
        body: dict[str, Any] = {
            "objectIdFieldName": "OBJECTID",
            "geometryType": "esriGeometryPolygon",
            "spatialReference": {"wkid": wkid, "latestWkid": wkid},
            "fields": [],
            "features": page,
        }
        if offset + count < len(rows):
            body["exceededTransferLimit"] = True
        return 200, body

    def _soda(self, name: str, query: dict[str, str]) -> tuple[int, Any]:
        if "$order" not in query:
            return 400, {"error": True, "message": "paging without $order is not stable"}
        rows = self.soda[name]
        where = query.get("$where")
        if where:
            rows = [r for r in rows if _soda_where(where, r)]
        rows = sorted(rows, key=lambda r: str(r.get(query["$order"].lstrip(":"), r.get("id"))))
        offset, limit = int(query.get("$offset", 0)), int(query.get("$limit", 1000))
        return 200, rows[offset : offset + limit]

    def _datastore(self, query: dict[str, str]) -> tuple[int, Any]:
        rows = self.datastore.get(query.get("resource_id", ""))
        if rows is None:
            return 404, {"success": False, "error": {"message": "Not found"}}
        offset, limit = int(query.get("offset", 0)), int(query.get("limit", 100))
        return 200, {"success": True, "result": {"records": rows[offset : offset + limit]}}

    def _worldbank(self, indicator: str, query: dict[str, str]) -> tuple[int, Any]:
        rows = self.worldbank.get(indicator)
        if rows is None:
            return 200, [{"message": [{"id": "120", "key": "Invalid value"}]}]
        per_page, page = int(query.get("per_page", 50)), int(query.get("page", 1))
        pages = max(1, -(-len(rows) // per_page))
        meta = {"page": page, "pages": pages, "per_page": per_page, "total": len(rows)}
        return 200, [meta, rows[(page - 1) * per_page : page * per_page]]

    def _answer(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        if m := re.fullmatch(r"/arcgis/rest/services/(.+)/(?:Feature|Map)Server/\d+/query", path):
            return self._arcgis(m.group(1), query)
        if m := re.fullmatch(r"/resource/([\w-]+)\.json", path):
            return self._soda(m.group(1), query)
        if path == "/api/action/datastore_search":
            return self._datastore(query)
        if m := re.fullmatch(r"/wb/v2/country/all/indicator/([\w.]+)", path):
            return self._worldbank(m.group(1), query)
        if path.startswith("/files/") and path[len("/files/") :] in self.files:
            return 200, self.files[path[len("/files/") :]]
        return 404, {"error": "not found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        portals = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                with portals._lock:
                    portals.seen.append(
                        Seen(
                            time.monotonic(),
                            parts.path,
                            query,
                            self.headers.get("X-App-Token"),
                            self.headers.get("Ocp-Apim-Subscription-Key"),
                        )
                    )
                    queue = portals.faults[parts.path]
                    fault = queue.popleft() if queue else None
                if fault is not None and fault.status is not None:
                    self._send(fault.status, b'{"error": "scripted"}', fault.headers)
                    return
                if fault is not None and fault.arcgis_error is not None:
                    code, message = fault.arcgis_error
                    error = {"error": {"code": code, "message": message, "details": []}}
                    self._send(200, json.dumps(error).encode())
                    return
                status, body = portals._answer(parts.path, query)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self._send(status, data)

            def _send(
                self, status: int, data: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler


class _QuietServer(ThreadingHTTPServer):
    """Clients closing kept-alive connections are normal here, not errors to print."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def _where(clause: str, attributes: dict[str, Any]) -> bool:
    """ArcGIS ``where``: '1=1' or 'FIELD = value' (numbers or quoted text)."""
    if clause.replace(" ", "") == "1=1":
        return True
    m = re.fullmatch(r"\s*(\w+)\s*=\s*'?([^']*)'?\s*", clause)
    if not m:
        raise ValueError(f"unsupported where {clause!r}")
    return str(attributes.get(m.group(1))) == m.group(2)


def _soda_where(clause: str, row: dict[str, Any]) -> bool:
    """SODA ``$where``: "field = 'v'" or "field between 'a' and 'b'" (text comparison)."""
    if m := re.fullmatch(r"\s*(\w+)\s*=\s*'([^']*)'\s*", clause):
        return str(row.get(m.group(1))) == m.group(2)
    if m := re.fullmatch(r"\s*(\w+)\s+between\s+'([^']*)'\s+and\s+'([^']*)'\s*", clause):
        value = str(row.get(m.group(1), ""))
        return m.group(2) <= value <= m.group(3)
    raise ValueError(f"unsupported $where {clause!r}")


def esri_polygon(ring_lonlat: list[tuple[float, float]]) -> dict[str, Any]:
    """An Esri JSON polygon with one clockwise outer ring (as ArcGIS writes them)."""
    ring = list(ring_lonlat)
    area = sum(
        x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(ring, ring[1:] + ring[:1], strict=True)
    )
    if area > 0:  # counter-clockwise: reverse to Esri's clockwise outer ring
        ring = ring[::-1]
    if ring[0] != ring[-1]:
        ring.append(ring[0])
    return {"rings": [[list(p) for p in ring]]}


def wb_rows(indicator: str, series: dict[str, dict[int, float | None]]) -> list[dict[str, Any]]:
    """World Bank API v2 rows of one indicator: country ISO3 -> year -> value (None: not
    published), newest year first as the API lists them."""
    return [
        {
            "indicator": {"id": indicator, "value": indicator},
            "country": {"id": iso3[:2], "value": iso3},
            "countryiso3code": iso3,
            "date": str(year),
            "value": value,
            "unit": "",
            "obs_status": "",
            "decimal": 1,
        }
        for iso3, years in series.items()
        for year, value in sorted(years.items(), reverse=True)
    ]
