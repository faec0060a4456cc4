"""Keep SAS tokens out of every message and log line the STAC family causes.

A signed href carries its token in the URL's query string, and the libraries that open it
name the URL when something goes wrong: GDAL's curl reader in its error messages (which
rasterio logs as warnings), rasterio's own debug lines, aiohttp in its exceptions, and so the
retry warnings that quote those exceptions. Queries are therefore stripped at two points:
:class:`sources.stac.retrying.TransientError` strips them from its message, and
:func:`redact_library_logs` puts a filter on rasterio's loggers that strips them from each
record before any handler sees it.
"""

from __future__ import annotations

import logging
import re

__all__ = ["QUERY_SHOWN_AS", "QueryRedactingFilter", "redact_library_logs", "without_url_queries"]

_QUERY = re.compile(r"\?[^\s'\"]*")
"""A URL's query string, where SAS tokens travel (up to the next blank or quote)."""
QUERY_SHOWN_AS = "?<redacted>"
"""What a removed query string is replaced with."""
REDACTED_LOGGERS = ("rasterio",)
"""Loggers (with every logger below them) whose records may quote a signed href."""


def without_url_queries(text: str) -> str:
    """``text`` with every URL query string replaced by :data:`QUERY_SHOWN_AS`."""
    return _QUERY.sub(QUERY_SHOWN_AS, text) if "?" in text else text


class QueryRedactingFilter(logging.Filter):
    """Rewrites a record whose message holds a URL query; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = without_url_queries(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_FILTER = QueryRedactingFilter()


def redact_library_logs(prefixes: tuple[str, ...] = REDACTED_LOGGERS) -> None:
    """Put the filter on every existing logger under ``prefixes`` (idempotent).

    A logger's filters see only the records made by that very logger, not those its children
    pass up, so each module's logger gets its own; loggers that modules create later are
    caught by the next call (the readers call this before each open).
    """
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if any(name == p or name.startswith(f"{p}.") for p in prefixes)
    ]
    for name in (*prefixes, *names):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
