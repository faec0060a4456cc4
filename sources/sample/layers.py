"""File layers for the vector and tabular sample products: each one writes itself.

The backend writes rasters as COGs and hands every other file to its layer (the ``FileLayer``
protocol in ``world.py``), so these classes carry the format knowledge: how to embed the
synthetic tags (GeoPackage and GeoParquet metadata, a ``synthetic`` column in CSV, top-level
members in JSON) and which WGS84 bounds the STAC item should use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pyogrio
from pyproj import CRS

from citycube.io.atomic import fsync_path

WGS84 = CRS.from_epsg(4326)
"""Every vector and table file of these products is in plain longitude/latitude."""

Bounds = tuple[float, float, float, float]


def _frame_bounds(frame: gpd.GeoDataFrame, fallback: Bounds | None) -> Bounds:
    """Bounds of the geometries, or ``fallback`` for a frame without any (an empty snapshot)."""
    valid = frame.geometry.notna() & ~frame.geometry.is_empty
    if valid.any():
        xmin, ymin, xmax, ymax = frame.geometry[valid].total_bounds
        return (float(xmin), float(ymin), float(xmax), float(ymax))
    if fallback is None:
        raise ValueError("a layer without geometries needs fallback bounds for its STAC footprint")
    return fallback


def _synthetic_members(tags: dict[str, str]) -> dict[str, object]:
    """The synthetic label as JSON members, for formats that carry it inside the document."""
    return {
        "synthetic": tags.get("SYNTHETIC", "true") == "true",
        "notice": tags.get("CITYCUBE_NOTICE", ""),
        "generator": tags.get("CITYCUBE_GENERATOR", ""),
    }


def _table_columns(frame: pd.DataFrame) -> list[dict[str, str]]:
    """STAC table:columns entries, so a reader knows the schema before opening the file."""
    columns = []
    for name, dtype in frame.dtypes.items():
        kind = "geometry" if isinstance(dtype, gpd.array.GeometryDtype) else str(dtype)
        columns.append({"name": str(name), "type": kind})
    return columns


def _table_fields(frame: pd.DataFrame) -> dict[str, object]:
    """STAC table extension fields every tabular file reports: schema and row count."""
    return {"table:columns": _table_columns(frame), "table:row_count": len(frame)}


def _write_json(path: Path, document: object) -> None:
    """Compact UTF-8 JSON with a final newline, flushed to disk."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, ensure_ascii=False, separators=(",", ":"))
        handle.write("\n")
    fsync_path(path)


@dataclass(frozen=True, eq=False)
class _Asset:
    """What every file layer says about itself."""

    role: str
    """Role in the item."""
    filename: str
    """File name inside the item directory."""
    title: str
    """Human-readable title of the asset."""


class _FrameFootprint:
    """Gives a layer the CRS and bounds of its frame's geometries (``fallback_bounds`` if none)."""

    frame: gpd.GeoDataFrame
    fallback_bounds: Bounds | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "crs", CRS.from_user_input(self.frame.crs))
        object.__setattr__(self, "bounds", _frame_bounds(self.frame, self.fallback_bounds))


@dataclass(frozen=True, eq=False)
class GeoPackageLayer(_FrameFootprint, _Asset):
    """One GeoPackage layer; the synthetic tags go into the dataset and layer metadata."""

    frame: gpd.GeoDataFrame
    """Features with their attribute columns."""
    layer: str
    """Layer name inside the GeoPackage (the engine reads it by name)."""
    fallback_bounds: Bounds | None = None
    """Footprint to report when the frame is empty."""
    media_type: str = "application/geopackage+sqlite3"
    """IANA media type of a GeoPackage."""
    crs: CRS | None = field(init=False)
    """CRS of the features."""
    bounds: Bounds | None = field(init=False)
    """Bounds of the features in ``crs``."""

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write the layer with the tags as GeoPackage metadata (gpkg_metadata tables)."""
        pyogrio.write_dataframe(
            self.frame,
            path,
            layer=self.layer,
            driver="GPKG",
            use_arrow=True,
            dataset_metadata=tags,
            layer_metadata=tags,
        )
        fsync_path(path)

    def stac_fields(self) -> dict[str, object]:
        """Table extension fields: the layer, its columns and row count."""
        return {
            **_table_fields(self.frame),
            "table:primary_geometry": self.frame.geometry.name,
            "citycube:layer": self.layer,
        }


@dataclass(frozen=True, eq=False)
class GeoParquetLayer(_FrameFootprint, _Asset):
    """A GeoParquet file; the synthetic tags go into the Parquet key-value metadata."""

    frame: gpd.GeoDataFrame
    """Features with their attribute columns."""
    fallback_bounds: Bounds | None = None
    """Footprint to report when the frame is empty."""
    media_type: str = "application/vnd.apache.parquet"
    """IANA media type of Parquet."""
    crs: CRS | None = field(init=False)
    """CRS of the features."""
    bounds: Bounds | None = field(init=False)
    """Bounds of the features in ``crs``."""

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write GeoParquet, then add the tags next to the 'geo' metadata.

        geopandas offers no public hook for extra file metadata, so the table is written once,
        read back and rewritten with the tags; the files are small enough for that to be cheap.
        """
        self.frame.to_parquet(path, index=False, compression="zstd")
        table = pq.read_table(path)
        metadata = dict(table.schema.metadata or {})
        metadata.update({k.encode(): v.encode() for k, v in tags.items()})
        pq.write_table(table.replace_schema_metadata(metadata), path, compression="zstd")
        fsync_path(path)

    def stac_fields(self) -> dict[str, object]:
        """Table extension fields."""
        return {**_table_fields(self.frame), "table:primary_geometry": self.frame.geometry.name}


@dataclass(frozen=True, eq=False)
class CsvLayer(_Asset):
    """A plain CSV table; the synthetic label is a ``synthetic`` column on every row.

    Tables with ``lon``/``lat`` columns report the WGS84 bbox of their records, so the item
    footprint follows the records; other tables use ``fallback_bounds`` (or have none).
    """

    frame: pd.DataFrame
    """Rows to write (without the synthetic column; it is added on write)."""
    fallback_bounds: Bounds | None = None
    """Footprint when the table has no coordinates (or no rows)."""
    media_type: str = "text/csv"
    """IANA media type of CSV."""
    crs: CRS | None = field(init=False)
    """WGS84 when the table has coordinates or fallback bounds, else None."""
    bounds: Bounds | None = field(init=False)
    """WGS84 bbox of the records."""

    def __post_init__(self) -> None:
        bounds = self.fallback_bounds
        if {"lon", "lat"} <= set(self.frame.columns) and len(self.frame):
            lon = self.frame["lon"].to_numpy(float)
            lat = self.frame["lat"].to_numpy(float)
            bounds = (float(lon.min()), float(lat.min()), float(lon.max()), float(lat.max()))
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "crs", None if bounds is None else WGS84)

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write UTF-8 CSV with a header; missing values stay blank cells."""
        frame = self.frame.assign(synthetic=_synthetic_members(tags)["synthetic"])
        frame.to_csv(path, index=False, lineterminator="\n")
        fsync_path(path)

    def stac_fields(self) -> dict[str, object]:
        """Table extension fields (the synthetic column included)."""
        columns = _table_columns(self.frame)
        columns.append({"name": "synthetic", "type": "bool"})
        return {"table:columns": columns, "table:row_count": len(self.frame)}


@dataclass(frozen=True, eq=False)
class JsonLayer(_Asset):
    """A JSON document written as given plus tags where the document allows foreign members.

    ``tag_path`` names the object that receives ``synthetic`` and ``notice`` members, as a list
    of keys and indices from the document root (empty: the root itself, which must be an object).
    """

    payload: Any
    """The JSON document."""
    tag_path: tuple[str | int, ...] = ()
    """Where the synthetic members go inside the document."""
    crs: CRS | None = None
    """WGS84 when ``bounds`` is given, else None (country tables have no footprint)."""
    bounds: Bounds | None = None
    """Footprint for the STAC item, when the layer comes first."""
    media_type: str = "application/json"
    """IANA media type of JSON."""
    extra_fields: dict[str, object] = field(default_factory=dict)
    """Extra STAC asset fields."""

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write the document with the synthetic members inserted at ``tag_path``."""
        document = json.loads(json.dumps(self.payload))  # a copy: the payload stays untouched
        target = document
        for key in self.tag_path:
            target = target[key]
        if not isinstance(target, dict):
            raise TypeError(f"{self.filename}: tags need an object at {self.tag_path}")
        target.update(_synthetic_members(tags))
        _write_json(path, document)

    def stac_fields(self) -> dict[str, object]:
        """Whatever the product declared."""
        return dict(self.extra_fields)


@dataclass(frozen=True, eq=False)
class GeoJsonLayer(_Asset):
    """A GeoJSON FeatureCollection; the tags are top-level members and feature properties."""

    frame: gpd.GeoDataFrame
    """Features (EPSG:4326, as RFC 7946 requires)."""
    media_type: str = "application/geo+json"
    """IANA media type of GeoJSON."""
    crs: CRS | None = field(init=False)
    """Always WGS84."""
    bounds: Bounds | None = field(init=False)
    """Bounds of the features."""

    def __post_init__(self) -> None:
        if not CRS.from_user_input(self.frame.crs).equals(WGS84):
            raise ValueError(f"{self.filename}: GeoJSON must be EPSG:4326 (RFC 7946)")
        object.__setattr__(self, "crs", WGS84)
        object.__setattr__(self, "bounds", _frame_bounds(self.frame, None))

    def write(self, path: Path, tags: dict[str, str]) -> None:
        """Write the collection with ``synthetic``/``notice`` at the top and on each feature."""
        members = _synthetic_members(tags)
        frame = self.frame.assign(synthetic=members["synthetic"], notice=members["notice"])
        document = json.loads(frame.to_json(drop_id=True, to_wgs84=False))
        document.pop("crs", None)  # RFC 7946: no crs member, coordinates are WGS84
        document = {
            "type": document["type"],
            **members,
            "bbox": [round(float(v), 7) for v in np.asarray(self.bounds)],
            "features": document["features"],
        }
        _write_json(path, document)

    def stac_fields(self) -> dict[str, object]:
        """Table extension fields of the feature properties."""
        return _table_fields(self.frame)
