"""Records of STAC searches and collections, so that a build can be made again offline.

Online, every search's answer (the ItemCollection) and every collection read is written to a
record keyed by what was asked — API, collection, WGS84 bbox, datetime interval, ``query`` and
``filter`` — under ``<searches_dir>/<collection>/<sha256 of the key>.json``. Offline, the same
question is answered from its record and nothing is sent; a question never recorded fails with
``OfflineRecordError`` (CC203). A new online answer replaces the record (writes are atomic).

Records hold hrefs **unsigned**: any credential in a query string (SAS ``sig``, ``se``, … and
API keys) is stripped from every ``href`` before the record is written, and hrefs are signed
again when they are opened. A record therefore never holds a token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pystac

from citycube.io.atomic import write_text_atomic
from sources.downloads import SECRET_PARAMS
from sources.stac.search import SearchRequest

RECORD_FORMAT = 1
"""Version of the record layout; a record of another version is not read."""
BBOX_DECIMALS = 9
"""Degrees are keyed to 1e-9 (≈ 0.1 mm), so float noise cannot split one search into two."""


def unsigned(href: str) -> str:
    """``href`` without credentials in its query string (the rest of the query is kept)."""
    parts = urlsplit(href)
    if not parts.query:
        return href
    kept = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if k.lower() not in SECRET_PARAMS
    ]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def strip_credentials(value: Any) -> Any:
    """A copy of a STAC JSON document with every ``href`` unsigned."""
    if isinstance(value, Mapping):
        return {
            k: unsigned(v) if k == "href" and isinstance(v, str) else strip_credentials(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_credentials(v) for v in value]
    return value


def search_key(request: SearchRequest) -> dict[str, Any]:
    """What identifies a search: the record's key, in canonical form."""
    return {
        "kind": "search",
        "api_url": request.api_url.rstrip("/"),
        "collection": request.collection,
        "bbox": [round(float(v), BBOX_DECIMALS) for v in request.bbox_wgs84],
        "datetime": request.datetime_interval,
        "query": request.query,
        "filter": request.filter,
    }


def collection_key(api_url: str, collection_id: str) -> dict[str, Any]:
    """What identifies a collection read."""
    return {"kind": "collection", "api_url": api_url.rstrip("/"), "collection": collection_id}


def _digest(key: Mapping[str, Any]) -> str:
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class SearchRecords:
    """The records under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: Mapping[str, Any]) -> Path:
        """Where the record of ``key`` lives."""
        return self.root / str(key["collection"]) / f"{_digest(key)}.json"

    # -- searches -------------------------------------------------------------------------

    def save_search(self, request: SearchRequest, items: list[pystac.Item]) -> Path:
        """Record a search's answer (unsigned)."""
        body = pystac.ItemCollection(items).to_dict(transform_hrefs=False)
        return self._write(search_key(request), body)

    def load_search(self, request: SearchRequest) -> list[pystac.Item] | None:
        """The recorded answer of a search; None when it was never recorded."""
        body = self._read(search_key(request))
        if body is None:
            return None
        return list(pystac.ItemCollection.from_dict(body, preserve_dict=False))

    # -- collections ----------------------------------------------------------------------

    def save_collection(self, api_url: str, collection: pystac.Collection) -> Path:
        """Record a collection as the API gave it (unsigned)."""
        body = collection.to_dict(include_self_link=True, transform_hrefs=False)
        return self._write(collection_key(api_url, collection.id), body)

    def load_collection(self, api_url: str, collection_id: str) -> pystac.Collection | None:
        """A recorded collection; None when it was never recorded."""
        body = self._read(collection_key(api_url, collection_id))
        if body is None:
            return None
        return pystac.Collection.from_dict(body, preserve_dict=False)

    # -- files ----------------------------------------------------------------------------

    def _write(self, key: Mapping[str, Any], body: Mapping[str, Any]) -> Path:
        path = self.path(key)
        record = {
            "format": RECORD_FORMAT,
            "key": dict(key),
            "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
            "answer": strip_credentials(body),
        }
        return write_text_atomic(json.dumps(record, indent=1, default=str), path)

    def _read(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a damaged record is as good as none; online runs write it again
        if record.get("format") != RECORD_FORMAT or record.get("key") != json.loads(
            json.dumps(dict(key), default=str)
        ):
            return None
        answer = record.get("answer")
        return answer if isinstance(answer, dict) else None
