"""One retry policy for every request the STAC family makes (search, token, pixel reads).

Only transient failures are retried — HTTP 408, 429 and 5xx, timeouts and dropped
connections — with exponential back-off and jitter (``stamina``), bounded both in attempts
and in total time. Anything else fails at once.

A server that says how long to wait (``Retry-After`` on a 429 or 503) is waited for as long as
it asks, even beyond ``wait_max_s``, but never beyond the total bound: when what it asks is
more than the time left, the request fails at once, saying so. Where the header is visible —
the STAC API, the token endpoint and the Zarr store's chunk requests — it is honoured; GDAL's
COG reads report only the status, so they back off as usual.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import requests
import stamina

from sources.stac.options import StacFamilyOptions
from sources.stac.redaction import without_url_queries

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try."""
_GDAL_TRANSIENT = re.compile(
    r"HTTP response code: (408|429|5\d\d)|timed out|Timeout|Connection (reset|refused)|"
    r"Couldn't connect|Operation too slow|Empty reply|Recv failure|transfer closed",
    re.IGNORECASE,
)
"""How GDAL's curl reader words a transient failure in its error messages."""


class TransientError(Exception):
    """A failure worth retrying (the adapters raise it around a request).

    Its message loses any URL query string: the retry warnings quote it, and a signed href's
    query is its SAS token.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(without_url_queries(message))
        self.retry_after = retry_after
        """Seconds the server asked to wait before the next try (``Retry-After``), if it did."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the back-off."""

    attempts: int
    """Tries, the first included."""
    total_s: float
    """Time bound of all tries together."""
    wait_initial_s: float
    """First wait."""
    wait_max_s: float
    """Longest wait."""

    @classmethod
    def from_options(cls, options: StacFamilyOptions) -> RetryPolicy:
        """The policy a family's options describe."""
        return cls(
            options.retry_attempts,
            options.retry_total_s,
            options.retry_wait_initial_s,
            options.retry_wait_max_s,
        )

    def call(self, request: Callable[[], T]) -> T:
        """Run ``request``, retrying it on ``TransientError`` within the bounds; a server's
        ``Retry-After`` replaces the back-off when the total bound leaves time for it."""
        started = time.monotonic()
        refused: list[tuple[float, float]] = []

        def backoff(exc: Exception) -> bool | float:
            if not isinstance(exc, TransientError):
                return False
            if exc.retry_after is None:
                return True
            left = self.total_s - (time.monotonic() - started)
            if exc.retry_after > left:
                refused.append((exc.retry_after, max(left, 0.0)))
                return False
            return max(exc.retry_after, 0.0)

        try:
            for attempt in stamina.retry_context(
                on=backoff,
                attempts=self.attempts,
                timeout=self.total_s,
                wait_initial=self.wait_initial_s,
                wait_max=self.wait_max_s,
                wait_jitter=self.wait_initial_s,
            ):
                with attempt:
                    return request()
        except TransientError as exc:
            if not refused:
                raise
            asked, left = refused[-1]
            raise TransientError(
                f"{exc} (the server asked to retry after {asked:g} s, more than the "
                f"{left:.1f} s left of the {self.total_s:g} s retry bound)",
                retry_after=exc.retry_after,
            ) from None
        raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover


def is_transient_status(status: int | None) -> bool:
    """True for an HTTP status worth another try."""
    return status is not None and status in TRANSIENT_STATUS


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
