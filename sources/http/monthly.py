"""Products published as twelve monthly files per year, aggregated to one annual field.

A cell's annual value needs all twelve months valid: a sum or mean over fewer months would
look like a low year, so a cell missing any month is nodata. Sums (emissions, precipitation)
add the months; means weigh each month by its number of days in that year.
"""

from __future__ import annotations

import calendar
import contextlib
from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox

from sources.http.base import (
    Assembled,
    HttpSource,
)
from sources.http.spec import MonthlyAggregation, Variable

MONTHS = range(1, 13)
"""Months of a year."""


def month_weights(year: int) -> np.ndarray:
    """Each month's share of the year's days (leap years included)."""
    days = np.array([calendar.monthrange(year, month)[1] for month in MONTHS], dtype=float)
    return days / days.sum()


def annual(months: list[np.ndarray], how: MonthlyAggregation, year: int) -> np.ndarray:
    """Twelve monthly arrays (NaN invalid) as one annual array; NaN where any month is."""
    stack = np.stack(months)
    if how == MonthlyAggregation.sum:
        return stack.sum(axis=0)
    return np.tensordot(month_weights(year), stack, axes=1)


class MonthlyToAnnual(HttpSource):
    """Twelve monthly files per variable and year, read onto the window and aggregated."""

    @abstractmethod
    def open_month(
        self, url: str, city: str, year: int, scratch: Path, served: list[dict[str, Any]]
    ) -> contextlib.AbstractContextManager[rasterio.DatasetReader]:
        """Open one monthly file (downloaded, or read by windows), recording its provenance."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """Each variable's months read onto the city window and aggregated to the year."""
        values: dict[str, np.ndarray] = {}
        served: list[dict[str, Any]] = []
        for variable in self.spec.variables:
            assert variable.monthly is not None
            months = [self._month(variable, year, m, city, grid, scratch, served) for m in MONTHS]
            values[variable.name] = annual(months, variable.monthly, year)
        rules = ", ".join(f"{v.name}: {v.monthly.value}" for v in self.spec.variables if v.monthly)
        notes = {"aggregation": f"12 months -> year ({rules}); a cell needs all 12 months"}
        return Assembled(grid, values, served, notes)

    def _month(
        self,
        variable: Variable,
        year: int,
        month: int,
        city: str,
        grid: GeoBox,
        scratch: Path,
        served: list[dict[str, Any]],
    ) -> np.ndarray:
        url = self.url(variable, year, mm=month)
        with self.open_month(url, city, year, scratch, served) as ds:
            return self.read_served(ds, variable, grid, url, city, year)
