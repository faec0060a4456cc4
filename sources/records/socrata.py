"""Socrata SODA: a resource's rows as JSON, paged with ``$limit``/``$offset`` in a fixed
``$order`` (SODA only promises stable pages under an explicit order; ``:id`` is the row id).

An app token, when the spec names its environment variable and it is set, goes in the
``X-App-Token`` header: it raises the portal's rate limit and is never logged, written to the
item or part of a cache key. A 429 is retried after the server's ``Retry-After`` by the shared
download manager. A page that is an error object instead of a row list fails the fetch.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from citycube.errors import SourceFetchError
from sources.downloads import redact_url
from sources.records.base import Connector, Pager
from sources.records.spec import RecordProductSpec


class SodaResource(Connector):
    """A SODA resource's rows of one year."""

    def rows(self, spec: RecordProductSpec, year: int, pager: Pager, endpoint: str) -> pd.DataFrame:
        """Pages until one is shorter than ``$limit``."""
        size = spec.paging.page_size
        rows: list[dict[str, Any]] = []
        offset = 0
        for _ in range(spec.paging.max_pages):
            params: dict[str, Any] = {
                **{k: v.format(year=year) for k, v in spec.params.items()},
                "$order": spec.order_by or ":id",
                "$limit": size,
                "$offset": offset,
            }
            if spec.year_filter:
                params["$where"] = spec.year_filter.format(year=year)
            page = pager.get_json(endpoint, params)
            if not isinstance(page, list):
                pager.discard(endpoint, params)
                message = page.get("message", page) if isinstance(page, dict) else page
                raise SourceFetchError(
                    f"{pager.source_name}: {pager.city} {year}: {redact_url(endpoint)} answered "
                    f"an error instead of rows: {message}",
                    transient=False,
                )
            rows += page
            offset += len(page)
            if len(page) < size:
                break
        else:
            raise pager.too_many_pages(endpoint)
        return pd.DataFrame(rows)
