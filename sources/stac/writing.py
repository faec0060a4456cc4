"""Write an item's files in the form its sample twin writes: COGs with named bands and units,
plus a provenance STAC Item that names the source scenes by their unsigned hrefs."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from rasterio.shutil import copy as rio_copy
from rasterio.windows import Window

from citycube.items.cog import (
    COG_MEDIA_TYPE,
    cog_options,
    cog_profile,
    grid_profile,
    staging_options,
)

PROVENANCE_FILE = "item.json"
"""The item's STAC Item: source scenes, composite rule, files."""


@dataclass(frozen=True)
class LayerFile:
    """One file of an item, but its pixels."""

    role: str
    """Role in the item ('data', 'qa')."""
    filename: str
    """File name in the item directory."""
    nodata: float
    """Nodata value."""
    band_descriptions: tuple[str, ...]
    """Band names."""
    units: str
    """Units tag."""
    title: str
    """What the file holds."""
    categorical: bool = False
    """Bit fields and classes get nearest-neighbour overviews."""


@dataclass(frozen=True, kw_only=True)
class Layer(LayerFile):
    """One file of an item with its pixels, held whole."""

    data: np.ndarray
    """(bands, rows, cols) in the file's type."""


def _describe(dst: Any, layer: LayerFile, tags: Mapping[str, str]) -> None:
    """Tags, band descriptions and units, as the sample twin writes them."""
    dst.update_tags(**tags, CITYCUBE_UNITS=layer.units)
    for band, description in enumerate(layer.band_descriptions, start=1):
        dst.set_band_description(band, description)
        dst.update_tags(band, units=layer.units)


def write_cog(path: Path, layer: Layer, grid: GeoBox, tags: Mapping[str, str]) -> None:
    """A DEFLATE COG with band descriptions and units, as the sample twin writes."""
    profile = cog_profile(
        grid, layer.data.shape[0], layer.data.dtype, layer.nodata, categorical=layer.categorical
    )
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(layer.data)
        _describe(dst, layer, tags)


class CogBlocks:
    """One COG written block by block, so no array of the whole window is ever held.

    Blocks go into a tiled, uncompressed GTiff next to the target; on a clean exit GDAL's COG
    driver copies that file into place (tiles, DEFLATE and overviews made from it, as for
    :func:`write_cog`, so the pixels are the same) and removes it. On an error the partial
    file is removed and no COG is left. Band count and type come from the first block.
    Blocks may come from several threads in any order; writes and the close are serialised, and
    a write after the close is refused rather than reaching a closed dataset.
    """

    def __init__(self, path: Path, layer: LayerFile, grid: GeoBox, tags: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.layer = layer
        self.grid = grid
        self.tags = dict(tags)
        self._blocks = self.path.with_name(f".{self.path.name}.blocks.tif")
        self._dst: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> CogBlocks:
        return self

    def write(self, window: Window, values: np.ndarray) -> None:
        """Write (bands, h, w) at ``window`` of the grid."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.path.name}: written after it was closed")
            self._write(window, values)

    def _write(self, window: Window, values: np.ndarray) -> None:
        if self._dst is None:
            profile = grid_profile(
                "GTiff", self.grid, values.shape[0], values.dtype, self.layer.nodata
            )
            self._dst = rasterio.open(self._blocks, "w", **{**profile, **staging_options()})
        self._dst.write(values, window=window)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        with self._lock:
            self._closed = True
            self._finish(exc_type is None)

    def _finish(self, succeeded: bool) -> None:
        try:
            if succeeded:
                if self._dst is None:
                    raise ValueError(f"{self.path.name}: no block was written")
                _describe(self._dst, self.layer, self.tags)
                self._dst.close()
                self._dst = None
                rio_copy(self._blocks, self.path, **cog_options(categorical=self.layer.categorical))
        finally:
            if self._dst is not None:
                self._dst.close()
            self._blocks.unlink(missing_ok=True)


def write_provenance(
    path: Path,
    *,
    item_id: str,
    product: str,
    city: str,
    source_year: int | None,
    grid: GeoBox,
    layers: Sequence[LayerFile],
    sources: Sequence[Mapping[str, Any]],
    properties: Mapping[str, Any],
) -> None:
    """A STAC Item for the written files, linking the source items it was made from.

    ``sources`` hold ids, collections and unsigned asset hrefs only: never a token.
    """
    t = grid.transform
    payload = {
        "type": "Feature",
        "stac_version": "1.0.0",
        "id": item_id,
        "bbox": None,
        "geometry": None,
        "properties": {
            "datetime": None if source_year is None else f"{source_year}-07-01T00:00:00Z",
            "proj:epsg": grid.crs.to_epsg(),
            "proj:transform": [t.a, t.b, t.c, t.d, t.e, t.f],
            "proj:shape": [grid.height, grid.width],
            "citycube:synthetic": False,
            "citycube:product": product,
            "citycube:city": city,
            "citycube:source_year": source_year,
            **properties,
        },
        "links": [
            {"rel": "derived_from", "href": s["self_href"], "title": s["id"]}
            for s in sources
            if s.get("self_href")
        ],
        "assets": {
            layer.role: {
                "href": f"./{layer.filename}",
                "type": COG_MEDIA_TYPE,
                "title": layer.title,
                "roles": [layer.role],
            }
            for layer in layers
        },
        "citycube:sources": list(sources),
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
