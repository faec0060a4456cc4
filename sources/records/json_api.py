"""A generic paged JSON API: rows at a dotted path of each page, paged by an offset or a page
number, until a page shorter than the page size (CKAN's ``datastore_search``, data.gov.sg,
data.go.kr's open APIs, MLIT's reinfolib)."""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from citycube.errors import SourceReadError
from sources.downloads import redact_url
from sources.records.base import Connector, Pager
from sources.records.spec import RecordProductSpec


def at_path(page: Any, path: str) -> Any:
    """The value at a dotted path ('result.records'); '' is the page itself."""
    value = page
    for part in filter(None, path.split(".")):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


class JsonApi(Connector):
    """Rows of one year from a paged JSON API."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Pages until a short one."""
        rows: list[dict[str, Any]] = []
        names = list(spec.expand)
        for combination in itertools.product(*(spec.expand[n] for n in names)):
            asked = {n: v.format(year=year) for n, v in zip(names, combination, strict=True)}
            rows += self._paged(spec, year, pager, endpoint, asked)
        return pd.json_normalize(rows, max_level=0) if rows else pd.DataFrame()

    def _paged(
        self,
        spec: RecordProductSpec,
        year: int,
        pager: Pager,
        endpoint: str,
        asked: dict[str, str],
    ) -> list[dict[str, Any]]:
        """One parameter combination's rows, page by page (one request when unpaged)."""
        paging = spec.paging
        size = paging.page_size
        paged = bool(paging.offset_param or paging.page_param)
        rows: list[dict[str, Any]] = []
        for number in range(paging.max_pages):
            params: dict[str, Any] = {k: v.format(year=year) for k, v in spec.params.items()}
            params.update(asked)
            if paging.offset_param:
                params[paging.offset_param] = number * size
            if paging.page_param:
                params[paging.page_param] = paging.first_page + number
            if paging.size_param:
                params[paging.size_param] = size
            url = endpoint.format(year=year)
            page = pager.get_json(url, params)
            found = at_path(page, paging.records_path)
            if isinstance(found, dict) and paging.records_path:
                found = [found]  # XML-born APIs (data.go.kr) turn a one-row list into an object
            if not isinstance(found, list):
                pager.discard(url, params)
                raise SourceReadError(
                    f"{pager.source_name}: {pager.city} {year}: {redact_url(url)} has no row list "
                    f"at {paging.records_path or 'the top level'!r}: {str(page)[:200]}"
                )
            rows += found
            if not paged or len(found) < size:
                break
        else:
            raise pager.too_many_pages(endpoint)
        return rows
