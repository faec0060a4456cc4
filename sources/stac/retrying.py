"""The STAC family's side of the shared retry policy (:mod:`sources.retries`): its settings,
its redaction, and how its libraries word a transient failure.

Every request the family makes (search, token, pixel reads) goes through one
:class:`~sources.retries.RetryPolicy` made from the family's options. Where the ``Retry-After``
header is visible — the STAC API, the token endpoint and the Zarr store's chunk requests — it
is honoured; GDAL's COG reads report only the status, so they back off as usual.
"""

from __future__ import annotations

import re

import requests

from sources.retries import TRANSIENT_STATUS, RetryPolicy, is_transient_status
from sources.retries import TransientError as _SharedTransientError
from sources.stac.options import StacFamilyOptions
from sources.stac.redaction import without_url_queries

_GDAL_TRANSIENT = re.compile(
    rf"HTTP response code: ({'|'.join(str(s) for s in sorted(TRANSIENT_STATUS))})\b|"
    r"timed out|Timeout|Connection (reset|refused)|"
    r"Couldn't connect|Operation too slow|Empty reply|Recv failure|transfer closed",
    re.IGNORECASE,
)
"""How GDAL's curl reader words a transient failure in its error messages."""


class TransientError(_SharedTransientError):
    """A failure worth retrying (the adapters raise it around a request).

    Its message loses any URL query string: the retry warnings quote it, and a signed href's
    query is its SAS token.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(without_url_queries(message), retry_after)


def retry_policy(options: StacFamilyOptions) -> RetryPolicy:
    """The policy a family's options describe."""
    return RetryPolicy(
        options.retry_attempts,
        options.retry_total_s,
        options.retry_wait_initial_s,
        options.retry_wait_max_s,
    )


def is_transient_requests_error(exc: BaseException) -> bool:
    """True for a requests failure worth another try (timeout, dropped connection, 429/5xx)."""
    if isinstance(exc, requests.Timeout | requests.ConnectionError):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return is_transient_status(exc.response.status_code)
    return False


def is_transient_gdal_message(message: str) -> bool:
    """True when GDAL's message reports a transient HTTP failure."""
    return bool(_GDAL_TRANSIENT.search(message))


__all__ = [
    "TRANSIENT_STATUS",
    "RetryPolicy",
    "TransientError",
    "is_transient_gdal_message",
    "is_transient_requests_error",
    "is_transient_status",
    "retry_policy",
]
