"""Reading and writing a chip store, whichever format it is in (a Zarr folder or icechunk)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import rioxarray  # noqa: F401  (registers the ``.rio`` accessor)
import xarray as xr
import zarr

from citycube.cube.chips_icechunk import IcechunkChipWriter, icechunk_session, open_icechunk_chips
from citycube.cube.chips_zarr import ICECHUNK_SUFFIX, ChipStoreWriter
from citycube.grid.tiles import PixelGrid, Tile


def open_chips(path: Path, ref: str | None = None, *, draft: bool = False) -> xr.Dataset:
    """Open a chip store lazily with its CRS and transform decoded.

    ``path`` is a plain Zarr store (``.zarr``) or an icechunk repository (``.icechunk``); of a
    repository ``ref`` names the branch or tag to read (default: what the release published,
    see :func:`citycube.cube.chips_icechunk.icechunk_session`), and ``draft`` reads the latest
    commit instead, as the build's own quick-looks do. A plain store has one version only.

    Not dask-backed: a selection reads just the chunks it touches when its values are asked
    for. Inside a dask worker a dask-backed read would be sent back to the cluster as tasks of
    its own, competing with the partition work that asked for it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no chip store at {path}; materialise its chips asset first")
    if path.suffix == ICECHUNK_SUFFIX:
        return open_icechunk_chips(path, "main" if draft and ref is None else ref)
    if ref is not None:
        raise ValueError(f"{path} is a plain Zarr store: it has no versions to open {ref!r} at")
    return xr.open_zarr(
        path,
        chunks=None,
        zarr_format=3,
        consolidated=True,
        decode_coords="all",
        mask_and_scale=False,
    )


def open_chip_group(path: Path, ref: str | None = None) -> zarr.Group:
    """The chip store's root Zarr group, read-only (for readers that slice arrays directly)."""
    path = Path(path)
    if path.suffix == ICECHUNK_SUFFIX:
        return zarr.open_group(icechunk_session(path, ref).store, mode="r", zarr_format=3)
    return zarr.open_group(str(path), mode="r", zarr_format=3)


def chip_writer(
    path: Path,
    pixel_grid: PixelGrid,
    band_names: Sequence[str],
    dtype: Any,
    fill_value: Any,
    attrs: Mapping[str, Any],
) -> ChipStoreWriter:
    """The writer for ``path``'s format: a plain Zarr store, or an icechunk repository."""
    if Path(path).suffix == ICECHUNK_SUFFIX:
        return IcechunkChipWriter(path, pixel_grid, band_names, dtype, fill_value, attrs)
    return ChipStoreWriter(path, pixel_grid, band_names, dtype, fill_value, attrs)


def tile_window(chips: xr.Dataset, pixel_grid: PixelGrid, tile: Tile) -> xr.Dataset:
    """The tile's window of an open chip store (lazy), after checking the store's grid."""
    transform = chips.rio.transform()
    if (
        not transform.almost_equals(pixel_grid.transform)
        or (chips.sizes["y"], chips.sizes["x"]) != pixel_grid.shape
    ):
        raise ValueError(
            f"the chip store grid {transform} {dict(chips.sizes)} is not the pixel grid "
            f"{pixel_grid.transform} {pixel_grid.shape}; rebuild the store for this grid"
        )
    row_off, col_off, height, width = pixel_grid.window(tile)
    return chips.isel(y=slice(row_off, row_off + height), x=slice(col_off, col_off + width))


def read_tile_chip(path: Path, pixel_grid: PixelGrid, tile: Tile) -> xr.Dataset:
    """The tile's window (data + valid), loaded into memory."""
    with open_chips(path) as chips:
        return tile_window(chips, pixel_grid, tile).load()
