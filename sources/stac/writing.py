"""Write an item's files in the form its sample twin writes: COGs with named bands and units,
plus a provenance STAC Item that names the source scenes by their unsigned hrefs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.crs import CRS as RioCRS

from sources.stac.grids import TargetGrid

COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
"""STAC media type of the COGs written."""
PROVENANCE_FILE = "item.json"
"""The item's STAC Item: source scenes, composite rule, files."""


@dataclass(frozen=True)
class Layer:
    """One file of an item."""

    role: str
    """Role in the item ('data', 'qa')."""
    filename: str
    """File name in the item directory."""
    data: np.ndarray
    """(bands, rows, cols) in the file's type."""
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


def write_cog(path: Path, layer: Layer, grid: TargetGrid, tags: Mapping[str, str]) -> None:
    """A DEFLATE COG with band descriptions and units, as the sample twin writes."""
    count = layer.data.shape[0]
    profile: dict[str, Any] = {
        "driver": "COG",
        "width": grid.width,
        "height": grid.height,
        "count": count,
        "dtype": layer.data.dtype.name,
        "crs": RioCRS.from_wkt(grid.crs.to_wkt()),
        "transform": grid.transform,
        "nodata": layer.nodata,
        "compress": "DEFLATE",
        "level": 6,
        "predictor": "YES",
        "blocksize": 512,
        "overview_resampling": "nearest" if layer.categorical else "average",
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(layer.data)
        dst.update_tags(**tags, CITYCUBE_UNITS=layer.units)
        for band, description in enumerate(layer.band_descriptions, start=1):
            dst.set_band_description(band, description)
            dst.update_tags(band, units=layer.units)


def write_provenance(
    path: Path,
    *,
    item_id: str,
    product: str,
    city: str,
    source_year: int | None,
    grid: TargetGrid,
    layers: Sequence[Layer],
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
