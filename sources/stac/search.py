"""Find the STAC items of a collection over a city and a period (pystac-client)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pystac
import requests
from pystac_client import Client
from pystac_client.exceptions import APIError
from pystac_client.stac_api_io import StacApiIO

from citycube.errors import SourceFetchError
from sources.retries import parse_retry_after
from sources.stac.retrying import RetryPolicy, TransientError, is_transient_status


@dataclass(frozen=True)
class SearchRequest:
    """One search: collection, WGS84 bbox and optional datetime interval."""

    api_url: str
    """STAC API root."""
    collection: str
    """Collection id."""
    bbox_wgs84: tuple[float, float, float, float]
    """(west, south, east, north) in degrees."""
    datetime_interval: str | None
    """RFC 3339 interval, e.g. '2020-01-01T00:00:00Z/2020-12-31T23:59:59Z'; None: any."""
    query: Mapping[str, Any] | None = None
    """STAC API ``query`` (property filter); None: none. Not every API applies it."""
    filter: Mapping[str, Any] | None = None
    """CQL2-JSON ``filter``; None: none."""


def year_interval(year: int) -> str:
    """The RFC 3339 interval of a calendar year (UTC)."""
    return f"{year}-01-01T00:00:00Z/{year}-12-31T23:59:59Z"


class _ApiIO(StacApiIO):
    """pystac-client's IO without retries of its own (one retry policy: ours) that keeps the
    ``Retry-After`` of the last answer, which its ``APIError`` drops."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__(timeout=timeout, max_retries=0)
        self.retry_after: float | None = None
        self.session.hooks["response"].append(self._remember)

    def _remember(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.retry_after = parse_retry_after(response.headers.get("Retry-After"))


def _transient(exc: APIError) -> bool:
    """True for an API failure worth another try (429/5xx, timeout, dropped connection)."""
    status = getattr(exc, "status_code", None)
    cause = exc.__context__
    return is_transient_status(status) or (
        status is None and isinstance(cause, requests.Timeout | requests.ConnectionError)
    )


def search_items(
    request: SearchRequest, policy: RetryPolicy, timeout: tuple[float, float]
) -> list[pystac.Item]:
    """Every item matching the request (all pages), retried on transient failures."""

    def run() -> list[pystac.Item]:
        stac_io = _ApiIO(timeout)
        try:
            client = Client.open(request.api_url, stac_io=stac_io)
            extra: dict[str, Any] = {}
            if request.query is not None:
                extra["query"] = dict(request.query)
            if request.filter is not None:
                extra["filter"] = dict(request.filter)
                extra["filter_lang"] = "cql2-json"
            search = client.search(
                collections=[request.collection],
                bbox=list(request.bbox_wgs84),
                datetime=request.datetime_interval,
                limit=100,
                **extra,
            )
            return list(search.items())
        except APIError as exc:
            if _transient(exc):
                raise TransientError(
                    f"STAC search at {request.api_url}: {_described(exc)}",
                    retry_after=stac_io.retry_after,
                ) from None
            raise SourceFetchError(
                f"the STAC API {request.api_url} failed a search of {request.collection}: "
                f"{_short(exc)}",
                transient=False,
                reason="search_failed",
            ) from None

    return policy.call(run)


def get_collection(
    api_url: str, collection_id: str, policy: RetryPolicy, timeout: tuple[float, float]
) -> pystac.Collection:
    """One collection of the API (its collection-level assets included), retried on transient
    failures."""

    def run() -> pystac.Collection:
        stac_io = _ApiIO(timeout)
        try:
            return Client.open(api_url, stac_io=stac_io).get_collection(collection_id)
        except APIError as exc:
            if _transient(exc):
                raise TransientError(
                    f"STAC collection at {api_url}: {_described(exc)}",
                    retry_after=stac_io.retry_after,
                ) from None
            raise SourceFetchError(
                f"the STAC API {api_url} did not give collection {collection_id}: {_short(exc)}",
                transient=False,
                reason="search_failed",
            ) from None

    return policy.call(run)


def _described(exc: APIError) -> str:
    """'HTTP 429: <body>' (pystac-client's message is the answer's body alone, often empty)."""
    status = getattr(exc, "status_code", None)
    text = _short(exc)
    if status is None:
        return text
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + " …"


def cloud_cover(item: pystac.Item) -> float | None:
    """The scene's eo:cloud_cover (%), if it says."""
    value: Any = item.properties.get("eo:cloud_cover")
    return None if value is None else float(value)


def acquired(item: pystac.Item) -> datetime | None:
    """When the scene was taken."""
    return item.datetime
