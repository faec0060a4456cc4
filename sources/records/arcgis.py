"""ArcGIS REST: a FeatureServer or MapServer layer's ``/query``, paged with ``resultOffset``.

Each page asks ``resultRecordCount`` rows from ``resultOffset`` in a stable order
(``orderByFields``), with the geometry in the spec's ``outSR`` (EPSG:4326 by default), as Esri
JSON. A layer holds more while the page says ``exceededTransferLimit``; the server may cap a
page below the size asked (its ``maxRecordCount``), so the next offset counts the rows really
received. ArcGIS reports many failures as HTTP 200 with ``{"error": {...}}``: such a page is
dropped from the cache and fails the fetch with the server's code and message (retried when the
code is a transient one), never read as an empty layer.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import shapely

from citycube.errors import SourceFetchError, SourceReadError
from sources.downloads import redact_url
from sources.records.base import GEOMETRY, Connector, Pager
from sources.records.spec import RecordProductSpec
from sources.retries import TRANSIENT_STATUS

WEB_MERCATOR_ALIASES = {3857, 102100, 900913}
"""Codes Esri writes for Web Mercator; an outSR of one of them accepts the others."""


def esri_geometry(geometry: dict[str, Any] | None) -> shapely.Geometry | None:
    """A shapely geometry from Esri JSON (point, multipoint, polyline, polygon rings).

    Esri polygon rings are clockwise for outer boundaries and counter-clockwise for holes; each
    hole goes to the outer ring that contains it.
    """
    if not geometry:
        return None
    if "x" in geometry and "y" in geometry:
        if geometry["x"] is None or geometry["y"] is None:
            return None
        return shapely.Point(geometry["x"], geometry["y"])
    if "points" in geometry:
        return shapely.MultiPoint(geometry["points"])
    if "paths" in geometry:
        return shapely.MultiLineString(geometry["paths"])
    if "rings" in geometry:
        outers: list[shapely.LinearRing] = []
        holes: list[shapely.LinearRing] = []
        for coords in geometry["rings"]:
            if len(coords) < 4:
                continue
            ring = shapely.LinearRing(coords)
            (holes if ring.is_ccw else outers).append(ring)
        if not outers:  # rings written counter-clockwise throughout: take them as outers
            outers, holes = holes, []
        polygons = []
        for outer in outers:
            shell = shapely.Polygon(outer)
            inner = [h for h in holes if shell.contains(shapely.Point(h.coords[0]))]
            polygons.append(shapely.Polygon(outer, inner))
        return polygons[0] if len(polygons) == 1 else shapely.MultiPolygon(polygons)
    return None


class ArcGisQuery(Connector):
    """A layer's features, page by page."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Every feature of the year (server-side ``where`` when the spec has a year filter)."""
        url = endpoint.rstrip("/") + "/query"
        where = spec.year_filter.format(year=year) if spec.year_filter else "1=1"
        size = spec.paging.page_size
        attributes: list[dict[str, Any]] = []
        geometries: list[shapely.Geometry | None] = []
        offset = 0
        for _ in range(spec.paging.max_pages):
            params = {
                "where": where,
                "outFields": "*",
                "returnGeometry": "true",
                "outSR": spec.out_sr,
                "orderByFields": spec.order_by or "OBJECTID",
                "resultOffset": offset,
                "resultRecordCount": size,
                **{k: v.format(year=year) for k, v in spec.params.items()},
                "f": "json",
            }
            page = pager.get_json(url, params)
            self._check(page, spec, pager, url, params)
            features = page.get("features") or []
            for feature in features:
                attributes.append(feature.get("attributes") or {})
                geometries.append(esri_geometry(feature.get("geometry")))
            offset += len(features)
            if not page.get("exceededTransferLimit") or not features:
                break
        else:
            raise pager.too_many_pages(url)
        frame = pd.DataFrame(attributes)
        frame[GEOMETRY] = pd.Series(geometries, dtype=object)
        return frame

    def _check(
        self,
        page: Any,
        spec: RecordProductSpec,
        pager: Pager,
        url: str,
        params: dict[str, Any],
    ) -> None:
        """Refuse error pages (HTTP 200 with an error object) and geometry in another CRS."""
        shown = f"{pager.source_name}: {pager.city} {pager.year}: {redact_url(url)}"
        if not isinstance(page, dict):
            pager.discard(url, params)
            raise SourceReadError(f"{shown} answered {type(page).__name__}, not a query result")
        error = page.get("error")
        if error is not None:
            pager.discard(url, params)
            code = error.get("code") if isinstance(error, dict) else None
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            details = (
                "; ".join(map(str, error.get("details") or [])) if isinstance(error, dict) else ""
            )
            raise SourceFetchError(
                f"{shown} answered an ArcGIS error {code}: {message}"
                + (f" ({details})" if details else ""),
                transient=isinstance(code, int) and code in TRANSIENT_STATUS,
                reason="server_error",
                status=code if isinstance(code, int) else None,
            )
        if "features" not in page:
            pager.discard(url, params)
            raise SourceReadError(f"{shown} answered JSON without 'features': not a layer query")
        reference = page.get("spatialReference") or {}
        wkid = reference.get("latestWkid") or reference.get("wkid")
        if page.get("features") and wkid is not None:
            same = wkid == spec.out_sr or {wkid, spec.out_sr} <= WEB_MERCATOR_ALIASES
            if not same:
                pager.discard(url, params)
                raise SourceReadError(
                    f"{shown} returned geometry in wkid {wkid}, not the outSR {spec.out_sr} "
                    "asked for; the layer ignores outSR, declare its CRS instead"
                )
