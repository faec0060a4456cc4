"""The one retry policy of every source family: what is retried, how long it waits, when it stops.

Only transient failures are retried — HTTP 408, 425, 429 and 5xx gateway statuses, timeouts
and dropped connections, which each family reports by raising :class:`TransientError` — with
exponential back-off and jitter (``stamina``), bounded both in attempts and in total time.
Anything else fails at once.

A server that says how long to wait (``Retry-After`` on a 429 or 503) is waited for as long as
it asks, even beyond ``wait_max_s``, but never beyond the total bound: when what it asks is
more than the time left, the request fails at once, saying so.

The families differ only in their settings (attempts and waits come from each family's options)
and in what their messages may show: a family whose messages can quote secrets raises its own
subclass of :class:`TransientError` that redacts them (the STAC family's strips URL queries).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import stamina

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try."""


def is_transient_status(status: int | None) -> bool:
    """True for an HTTP status worth another try."""
    return status is not None and status in TRANSIENT_STATUS


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class TransientError(Exception):
    """A failure worth another try (the families raise it around a request)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
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
    """First wait (and the jitter added to every wait)."""
    wait_max_s: float
    """Longest wait."""

    def call(
        self,
        request: Callable[[], T],
        on_failure: Callable[[TransientError, int], None] | None = None,
    ) -> T:
        """Run ``request``, retrying it on ``TransientError`` within the bounds; a server's
        ``Retry-After`` replaces the back-off when the total bound leaves time for it.

        ``on_failure(error, attempt)`` is told of every failed try (attempts count from 1).
        The last ``TransientError`` is raised when the bounds are spent.
        """
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
                    try:
                        return request()
                    except TransientError as exc:
                        if on_failure is not None:
                            on_failure(exc, attempt.num)
                        raise
        except TransientError as exc:
            if not refused:
                raise
            asked, left = refused[-1]
            raise type(exc)(
                f"{exc} (the server asked to retry after {asked:g} s, more than the "
                f"{left:.1f} s left of the {self.total_s:g} s retry bound)",
                retry_after=exc.retry_after,
            ) from None
        raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover


__all__ = [
    "TRANSIENT_STATUS",
    "RetryPolicy",
    "TransientError",
    "is_transient_status",
    "parse_retry_after",
]
