"""Keep a processing process's resident memory to one block, whatever the city's size.

Processing streams a city in 10 km blocks, so the data held at once does not depend on the
city. Three allocator habits nevertheless made a bigger city end with a bigger process, each
measured with ``benchmarks/bench_memory.py`` (OPT, Amsterdam against Christchurch):

* glibc raises its mmap threshold to the size of the largest buffer freed so far, so whether a
  block-sized buffer comes from the heap (and stays there) depended on what the process had
  freed before;
* transparent huge pages, requested by NumPy and Arrow for large buffers, round retained heap
  up to 2 MiB pages, so the tables a partition writes (rows ∝ tiles) kept 2–10 MiB resident;
* Arrow's default mimalloc pool keeps freed pages for reuse (about 14 MiB after writing one
  Parquet file of a few thousand rows).

:func:`bound_process_memory` turns the three off for the current process (a user's explicit
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``ARROW_DEFAULT_MEMORY_POOL`` wins),
and :func:`release_freed` hands freed heap back to the operating system between blocks. Both
are no-ops where the C library or kernel lacks the call (musl, macOS).

The mmap threshold is fixed above a block's largest buffer (a 10 km block of 10 m float64
pixels is 7.6 MiB) rather than at glibc's 128 KiB: there every block-sized temporary was
mapped, faulted in page by page and unmapped again, and page faults took a quarter of a
vector or raster modality's time. Block buffers now reuse the heap, which the trim threshold
and :func:`release_freed` keep to a fixed margin whatever the city.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

import pyarrow as pa

__all__ = [
    "MMAP_THRESHOLD_BYTES",
    "TRIM_GROWTH_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "bound_process_memory",
    "release_freed",
    "resident_bytes",
]

MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024
"""Buffers at least this big are mapped on their own and unmapped when freed; smaller ones,
every block-sized array among them, come from the heap and reuse it."""
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free memory at the top of the heap beyond this is handed back as soon as it is freed."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_PR_SET_THP_DISABLE = 41
_applied = False


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def _libc_call(name: str) -> Callable[..., int] | None:
    return getattr(_LIBC, name, None) if _LIBC is not None else None


def bound_process_memory() -> None:
    """Fix the mmap and trim thresholds, turn off huge pages and use Arrow's system pool (once
    per process).

    Settings are process-wide and inherited by child processes; with block buffers reusing
    the heap, processing is faster with them than without (``benchmarks/results/history.md``).
    """
    global _applied
    if _applied:
        return
    _applied = True
    mallopt = _libc_call("mallopt")
    for variable, option, value in (
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    ):
        if mallopt is not None and variable not in os.environ:
            mallopt(option, value)
    prctl = _libc_call("prctl")
    if prctl is not None:
        prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0)
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())


TRIM_GROWTH_BYTES = 32 * 1024 * 1024
"""Resident growth since the last trim above which :func:`release_freed` trims again."""

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_resident_after_trim: int | None = None


def resident_bytes() -> int | None:
    """The process's resident set size now, or None where ``/proc`` does not say."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def release_freed(*, force: bool = False) -> None:
    """Return freed heap to the operating system (glibc ``malloc_trim``).

    Between blocks, only once the process has grown by ``TRIM_GROWTH_BYTES`` since the last
    trim: trimming after every block handed back pages that the next block faulted in again at
    once (about 450,000 page faults and 1 s of system time in a Christchurch city-year, a sixth
    of its processing), while memory that does pile up is still returned within that margin.
    ``force`` trims regardless, as at the end of a partition's sweep.
    """
    global _resident_after_trim
    trim = _libc_call("malloc_trim")
    if trim is None:
        return
    resident = resident_bytes()
    if (
        not force
        and resident is not None
        and _resident_after_trim is not None
        and resident - _resident_after_trim < TRIM_GROWTH_BYTES
    ):
        return
    trim(0)
    _resident_after_trim = resident_bytes()
