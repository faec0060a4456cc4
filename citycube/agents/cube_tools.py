"""The cube-asset inspection tools the agent tasks share (AgenticCity-Bench App. D):
``list_assets``' cube entries, ``read_table``, ``describe_raster`` and ``view_raster``.

:class:`CubeAssetTools` is mixed into a task's :class:`~citycube.agents.session.ToolSession`
ahead of it. It reads only through the session's ``view`` (the task's leakage guard: which
periods and products a case may see) and turns periods, texts and band names into what the
case may be shown through the hooks a task overrides, so one implementation serves the
forecasting, EV charging and school capacity tasks with their results unchanged.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from citycube.agents.session import ToolResult
from citycube.errors import AgentCaseError

if TYPE_CHECKING:
    from pathlib import Path

    from citycube.catalogue.modalities import Catalogue

MAX_ROWS = 5_000
"""Most rows one read_table returns (the rest is reported as truncated)."""


def parse_asset_id(asset_id: Any, listing: str = "list_assets") -> tuple[str, str]:
    """``"HEAT/table"`` → (``HEAT``, ``table``), or a clear error naming the task's ``listing``
    tool."""
    if not isinstance(asset_id, str) or asset_id.count("/") != 1:
        raise AgentCaseError(
            f"asset id {asset_id!r} is not of the form MODALITY/table or MODALITY/raster: "
            f"take ids from {listing}"
        )
    modality, kind = asset_id.split("/")
    if kind not in ("table", "raster"):
        raise AgentCaseError(f"asset id {asset_id!r}: the kind must be 'table' or 'raster'")
    return modality, kind


def band_stats(
    bands: Sequence[str], values: np.ndarray, valid: np.ndarray, *, std: bool
) -> list[dict[str, Any]]:
    """Per band: valid finite pixels and their min, max, mean (and std), None when none."""
    keys = ("min", "max", "mean", "std") if std else ("min", "max", "mean")
    stats = []
    for name, band in zip(bands, values, strict=True):
        x = band[valid].astype(np.float64)
        x = x[np.isfinite(x)]
        summary: dict[str, Any] = dict.fromkeys(keys)
        if x.size:
            every = {"min": x.min(), "max": x.max(), "mean": x.mean()}
            if std:
                every["std"] = x.std()
            summary = {k: float(every[k]) for k in keys}
        stats.append({"band": name, "valid_pixels": int(x.size), **summary})
    return stats


class CubeAssetTools:
    """The shared cube-asset tools; the session provides ``view``, ``case``, ``catalogue`` and
    ``release_root`` and overrides the hooks where its task shows periods or texts
    differently."""

    view: Any
    case: Any
    catalogue: Catalogue
    release_root: Path
    raster_std = True
    """Whether describe_raster reports each band's standard deviation."""

    # ------------------------------------------------------------------ hooks

    def _period_out(self, period: Any) -> Any:
        """A view period as the case shows it."""
        return period

    def _period_in(self, period: Any) -> int:
        """A period the agent asks for as the view's (refusing what the case may not see)."""
        return int(period)

    def _fields_out(self, fields: Any) -> Any:
        """A table asset's field list as the case shows it."""
        return fields

    def _band_name(self, band: str) -> str | None:
        """A raster band's name as the case shows it."""
        return band

    def _table_rows(
        self,
        modality: str,
        tiles: Sequence[str] | None,
        fields: Sequence[str] | None,
        periods: Sequence[int] | None,
    ) -> list[dict[str, Any]]:
        """The rows of a table asset the case may see."""
        return self.view.rows(modality, tiles, fields, periods)

    def _chip(self, modality: str, period: Any, tile_id: str | None) -> tuple[str, tuple, Any]:
        """A chip's store, its (row, col, height, width) window and its metadata."""
        chip = self.view.chip(modality, self._period_in(period), tile_id)
        return chip.store, (chip.row_off, chip.col_off, chip.height, chip.width), chip

    def _raster_facts(self, spec: Any, chip: Any, values: np.ndarray) -> dict[str, Any]:
        """describe_raster's facts between the period and the band statistics."""
        return {
            "source_period": self._period_out(chip.source_period),
            "kind": spec.kind.value,
            "shape": [int(s) for s in values.shape],
            "resolution_m": chip.resolution_m,
            "valid_fraction": chip.valid_fraction,
            "available": chip.available,
        }

    # ------------------------------------------------------------------ shared parts

    def _cube_assets(self) -> list[dict[str, Any]]:
        """list_assets' entries for the cube's tables and rasters."""
        assets: list[dict[str, Any]] = []
        for entry in self.view.table_assets():
            code = entry["modality"]
            assets.append(
                {
                    "asset_id": f"{code}/table",
                    "modality": code,
                    "name": self.catalogue.get(code).name,
                    "kind": "table",
                    "fields": self._fields_out(entry["fields"]),
                    "periods_available": self._periods_out(entry["periods"]),
                }
            )
        for code, periods in self.view.chip_periods().items():
            assets.append(
                {
                    "asset_id": f"{code}/raster",
                    "modality": code,
                    "name": self.catalogue.get(code).name,
                    "kind": "raster",
                    "periods_available": self._periods_out(periods),
                }
            )
        return assets

    def _periods_out(self, periods: Sequence[Any]) -> list[Any]:
        return [self._period_out(p) for p in periods]

    def _raster(self, asset_id: str, period: Any, tile_id: str | None) -> tuple[Any, ...]:
        """(spec, chip metadata, band names, values, valid mask) of a raster asset's chip."""
        from citycube.tasks.loader import chip_group

        modality, kind = parse_asset_id(asset_id)
        if kind != "raster":
            raise AgentCaseError(f"{asset_id} is a table: use read_table")
        store, (r, c, h, w), chip = self._chip(modality, period, tile_id)
        group = chip_group(str(self.release_root / store))
        values = np.asarray(group["data"][:, r : r + h, c : c + w])
        valid = np.asarray(group["valid"][r : r + h, c : c + w]).astype(bool)
        bands = [self._band_name(str(b)) for b in np.asarray(group["band"][:])]
        return self.catalogue.get(modality), chip, bands, values, valid

    # ------------------------------------------------------------------ tools

    def _tool_read_table(
        self,
        evidence: str,
        asset_id: str,
        tiles: Sequence[str] | None = None,
        fields: Sequence[str] | None = None,
        periods: Sequence[int] | None = None,
        limit: int = MAX_ROWS,
    ) -> ToolResult:
        modality, kind = parse_asset_id(asset_id)
        if kind != "table":
            raise AgentCaseError(f"{asset_id} is a raster: use describe_raster or view_raster")
        rows = self._table_rows(modality, tiles, fields, periods)
        limit = max(1, min(int(limit), MAX_ROWS))
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "rows": rows[:limit],
                "row_count": len(rows),
                "truncated": len(rows) > limit,
            }
        )

    def _tool_describe_raster(
        self, evidence: str, asset_id: str, period: int, tile_id: str | None = None
    ) -> ToolResult:
        spec, chip, bands, values, valid = self._raster(asset_id, period, tile_id)
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "tile_id": tile_id or self.case.tile_id,
                "period": int(period),
                **self._raster_facts(spec, chip, values),
                "bands": band_stats(bands, values, valid, std=self.raster_std),
            }
        )

    def _tool_view_raster(
        self, evidence: str, asset_id: str, period: int, tile_id: str | None = None
    ) -> ToolResult:
        from PIL import Image

        from citycube.reports.render import render_chip

        spec, _chip, _bands, values, valid = self._raster(asset_id, period, tile_id)
        rgba = render_chip(spec, self.catalogue, values, valid)
        buffer = io.BytesIO()
        Image.fromarray(rgba, mode="RGBA").save(buffer, format="PNG")
        return ToolResult(
            {
                "evidence_id": evidence,
                "asset_id": asset_id,
                "tile_id": tile_id or self.case.tile_id,
                "period": int(period),
                "width": int(rgba.shape[1]),
                "height": int(rgba.shape[0]),
                "format": "png",
            },
            image=buffer.getvalue(),
        )
