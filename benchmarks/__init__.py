"""CityCube performance benchmarks (``make bench``; not part of the test suite).

Every benchmark reports absolute figures and a ratio against a named baseline measured in the
same run, so results stay comparable on a busy or slow machine. This module holds what the
benchmarks share: repeated timing with a median, progress output and the result layout that
``benchmarks.run`` turns into JSON and a markdown table.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["BenchConfig", "BenchResult", "Timing", "log", "time_repeats"]

T = TypeVar("T")


@dataclass(frozen=True)
class BenchConfig:
    """Options shared by every benchmark."""

    repeats: int
    """Timed repetitions per measurement (≥ 3); the median is reported."""
    quick: bool
    """Smaller scope, for a run of a minute or two."""


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated runs and their median."""

    runs_s: tuple[float, ...]
    """Each run, in order."""

    @property
    def median_s(self) -> float:
        """Median run: robust to a run slowed by other work on the machine."""
        return statistics.median(self.runs_s)

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the JSON results."""
        return {"median_s": self.median_s, "runs_s": list(self.runs_s)}


@dataclass
class BenchResult:
    """What one benchmark reports: a table for people and details for the JSON file."""

    name: str
    """Short name, as accepted by ``--only``."""
    title: str
    """Heading of the benchmark's table."""
    baseline: str
    """What the ratio is measured against, in words."""
    columns: list[str]
    """Table header."""
    rows: list[list[Any]] = field(default_factory=list)
    """Table rows (already formatted for display)."""
    notes: list[str] = field(default_factory=list)
    """Caveats and targets, printed under the table."""
    details: dict[str, Any] = field(default_factory=dict)
    """Unformatted figures for ``latest.json``."""

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the JSON results."""
        return {
            "title": self.title,
            "baseline": self.baseline,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
            "details": self.details,
        }


def log(message: str) -> None:
    """A progress line, flushed at once so a long run shows where it is."""
    print(message, file=sys.stdout, flush=True)


def time_repeats(
    run: Callable[[], T],
    repeats: int,
    *,
    setup: Callable[[], None] | None = None,
    label: str = "",
) -> tuple[Timing, T]:
    """Time ``run`` ``repeats`` times (``setup`` before each, untimed); return the last result.

    The median of several runs is reported because the machine may be busy with other work.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    runs: list[float] = []
    result: Any = None
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        result = run()
        runs.append(time.perf_counter() - start)
    timing = Timing(tuple(runs))
    if label:
        log(f"    {label}: median {timing.median_s:.3f} s over {repeats} runs")
    return timing, result
