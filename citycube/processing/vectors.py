"""Vector, point and record sources: rasterise onto chip grids, count points, sum records.

Features are drawn exactly as mapped: no buffering, no dilation, no new features. Vector layers
are read one 10 km block at a time through the file's spatial index, and point files a batch at
a time, so memory follows the block or batch, not the city.
"""

from __future__ import annotations

import csv
import gc
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pyogrio
import shapely
from pyproj import CRS
from rasterio.enums import MergeAlg
from rasterio.features import rasterize
from rasterio.transform import Affine

from citycube.catalogue.modalities import RasterizeSpec
from citycube.catalogue.products import RecordChecks
from citycube.errors import SourceReadError
from citycube.grid.tiles import PixelGrid, TileGrid
from citycube.items.rasters import transformer
from citycube.items.staging import repair_hint
from citycube.processing.classify import CLASSIFIER_COLUMNS, get_classifier
from citycube.processing.record_checks import check_plausible, check_unique, check_year, csv_line

# Reading a GeoPackage makes GDAL's PAM layer write a ``.aux.xml`` copy of the file's metadata
# next to it on close, on every read, although the metadata lives in the GeoPackage itself.
# Sources are read, never written: the sidecar rewrote the item's folder once per 10 km block
# (a file create each time) and, for a data root of hard links, the original's folder too.
pyogrio.set_gdal_config_options({"GDAL_PAM_ENABLED": "NO"})


def _require_file(path: Path) -> None:
    if not Path(path).exists():
        raise SourceReadError(f"source file {path} does not exist; re-run its source asset")


def _damaged(path: Path, what: str, exc: Exception) -> SourceReadError:
    return SourceReadError(
        f"cannot read {path} as {what} ({exc}); the file is corrupt or truncated: "
        f"{repair_hint(path)}"
    )


def _require_crs(actual: object, expected: CRS, path: Path) -> CRS:
    """The file's CRS, refused unless it is the product's native one."""
    if not actual:
        raise SourceReadError(f"{path} has no CRS; vector sources must declare theirs")
    crs = CRS.from_user_input(actual)
    if not crs.equals(expected):
        raise SourceReadError(
            f"{path} is in {crs.to_string()} but the product is published in "
            f"{expected.to_string()}; the file is wrong or mislabelled: {repair_hint(path)}"
        )
    return crs


def _read(path: Path, **kwargs: object) -> gpd.GeoDataFrame:
    _require_file(path)
    try:
        if Path(path).suffix == ".parquet":
            frame = gpd.read_parquet(path)
        else:
            frame = gpd.read_file(path, use_arrow=True, **kwargs)  # Arrow: ~2× faster decode
    except Exception as exc:  # pyogrio/pyarrow raise many types for damaged files
        raise _damaged(path, "vector data", exc) from exc
    if frame.crs is None:
        raise SourceReadError(f"{path} has no CRS; vector sources must declare theirs")
    return frame


def check_crs(frame: gpd.GeoDataFrame, expected: CRS, path: Path) -> None:
    """Refuse vector files that are not in their product's native CRS."""
    _require_crs(frame.crs, expected, path)


FEATURE_MARGIN_DEG = 1e-3
"""Slack added around a block's footprint in a geographic source CRS (about 100 m), so a feature
whose outline just meets the block is never left out by the curvature of the reprojection."""

POINT_BATCH_ROWS = 262_144
"""Points decoded at a time when counting a GeoParquet point file (bounded memory per batch)."""


@dataclass(frozen=True)
class VectorLayer:
    """One vector item, read block by block: only the features under a block are ever held.

    Opening checks what can be checked without the features (readable, native CRS, layer and
    columns present); :func:`_source_features_in` then asks the file's spatial index for one
    block.
    """

    path: Path
    spec: RasterizeSpec
    city_crs: CRS
    source_crs: CRS
    coverage: shapely.Geometry | None
    """Area the source reports on, in the city CRS (None: the whole grid)."""
    columns: tuple[str, ...]
    """Attribute columns the spec needs (filter, burn value, classifier tags) that exist."""
    polygons: bool = False
    """The layer declares polygons, so its blocks may decode as :class:`PlainPolygons` (a line
    or point layer never tries)."""


def open_vector_layer(
    path: Path, spec: RasterizeSpec, city_epsg: int, expected_crs: CRS, coverage: Path | None
) -> VectorLayer:
    """Check one vector item and prepare it for block reads; the coverage polygon is loaded."""
    _require_file(path)
    try:
        info = pyogrio.read_info(path, layer=spec.layer)
    except Exception as exc:  # GDAL reports damage in many ways
        raise _damaged(path, "vector data", exc) from exc
    source_crs = _require_crs(info.get("crs"), expected_crs, path)
    fields = set(info["fields"])
    for column in (spec.filter_column, spec.burn_column):
        if column and column not in fields:
            raise SourceReadError(
                f"{path} layer {spec.layer} has no column {column!r}, which the product's "
                f"features carry: the file is not that product's; {repair_hint(path)}"
            )
    needed = {spec.filter_column, spec.burn_column} - {None}
    if spec.classify:
        needed |= CLASSIFIER_COLUMNS.get(spec.classify, fields)
    columns = tuple(sorted(needed & fields))
    area = load_coverage(coverage, city_epsg) if coverage is not None else None
    polygons = info.get("geometry_type") == "Polygon"
    return VectorLayer(
        Path(path), spec, CRS.from_epsg(city_epsg), source_crs, area, columns, polygons
    )


@dataclass(frozen=True)
class PlainPolygons:
    """2-D polygons without holes, as one coordinate array: what a footprint layer is.

    Decoded straight from the file's WKB, with no geometry object per feature (making tens of
    thousands of shapely polygons per block, only to take their coordinates out again, was a
    fifth of a footprint modality's time). Points are in file order, each ring closed.
    """

    coords: np.ndarray
    """(points, 2) float64, source CRS."""
    counts: np.ndarray
    """Points of each polygon's ring."""

    def __len__(self) -> int:
        return len(self.counts)

    def take(self, keep: np.ndarray) -> PlainPolygons:
        """The polygons where ``keep`` (one bool per polygon) is true."""
        owner = np.repeat(np.arange(len(self.counts)), self.counts)
        return PlainPolygons(self.coords[keep[owner]], self.counts[keep])


def _source_features_in(
    layer: VectorLayer, bounds: tuple[float, float, float, float], plain: bool = False
) -> tuple[np.ndarray | PlainPolygons, np.ndarray]:
    """Geometries (source CRS, not yet projected) and burn values of the features meeting
    ``bounds`` (city CRS).

    With ``plain``, a block whose features are all polygons without holes comes back as
    :class:`PlainPolygons` (no shapely objects); any other block as shapely geometries.
    """
    left, bottom, right, top = transformer(layer.city_crs, layer.source_crs).transform_bounds(
        *bounds, densify_pts=21
    )
    if layer.source_crs.is_geographic:
        m = FEATURE_MARGIN_DEG
        left, bottom, right, top = left - m, bottom - m, right + m, top + m
    spec = layer.spec
    geometry, attributes = _read_block(layer, (left, bottom, right, top), plain)
    if isinstance(geometry, PlainPolygons):  # none is missing or empty, by construction
        keep = np.ones(len(geometry), dtype=bool)
    else:
        keep = ~shapely.is_missing(geometry) & ~shapely.is_empty(geometry)
    if spec.filter_column:
        keep &= attributes[spec.filter_column].isin(spec.filter_values).to_numpy()
    geometry, attributes = _take(geometry, keep), attributes[keep]
    if spec.classify:
        values = get_classifier(spec.classify)(attributes)
    elif spec.burn_column:
        values = pd.to_numeric(attributes[spec.burn_column], errors="coerce").to_numpy(float)
        finite = np.isfinite(values)
        geometry, values = _take(geometry, finite), values[finite]
    else:
        values = np.full(len(geometry), spec.burn_value, dtype=float)
    return geometry, np.asarray(values)


def _take(geometry: np.ndarray | PlainPolygons, keep: np.ndarray) -> np.ndarray | PlainPolygons:
    if keep.all():
        return geometry
    return geometry.take(keep) if isinstance(geometry, PlainPolygons) else geometry[keep]


_WKB_POLYGON = 3
"""ISO WKB type code of a 2-D polygon."""
_WKB_HEADER = 13
"""Bytes before a one-ring polygon's points: byte order, type, ring count, point count."""


def _uint32_at(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Little-endian uint32 values starting at byte ``positions`` of ``data``."""
    values = np.zeros(len(positions), dtype=np.uint32)
    for shift in range(4):
        values |= data[positions + shift].astype(np.uint32) << np.uint32(8 * shift)
    return values


def _wkb_buffers(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets, bytes) of a binary column with no nulls, as numpy views (offsets as int64:
    value ``i`` is ``bytes[offsets[i]:offsets[i + 1]]``); None for a column that is not."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    large = pa.types.is_large_binary(array.type)
    if array.null_count or not (large or pa.types.is_binary(array.type)):
        return None
    if len(array) == 0:
        return np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.uint8)
    _, offset_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int64 if large else np.int32)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    return offsets, np.frombuffer(data_buffer, dtype=np.uint8)


def plain_polygons_from_wkb(column: pa.Array | pa.ChunkedArray) -> PlainPolygons | None:
    """The polygons of a WKB column, if every one is a little-endian 2-D polygon with exactly
    one ring (no holes, not empty); None otherwise (the caller then decodes it with shapely)."""
    buffers = _wkb_buffers(column)
    if buffers is None:
        return None
    offsets, data = buffers
    if len(offsets) == 1:
        return PlainPolygons(np.empty((0, 2)), np.empty(0, dtype=np.int64))
    starts, sizes = offsets[:-1], np.diff(offsets)
    if (sizes < _WKB_HEADER).any() or (data[starts] != 1).any():
        return None
    if (_uint32_at(data, starts + 1) != _WKB_POLYGON).any():
        return None
    if (_uint32_at(data, starts + 5) != 1).any():
        return None
    counts = _uint32_at(data, starts + 9).astype(np.int64)
    if (counts == 0).any() or (sizes != _WKB_HEADER + 16 * counts).any():
        return None
    # The features lie back to back in the buffer: the points are everything but the headers.
    span = data[offsets[0] : offsets[-1]]
    points = np.ones(len(span), dtype=bool)
    points[(starts - offsets[0])[:, None] + np.arange(_WKB_HEADER)] = False
    coords = span[points].view("<f8").astype(np.float64, copy=False).reshape(-1, 2)
    return PlainPolygons(coords, counts)


_WKB_POINT_BYTES = 21
"""A little-endian 2-D point: byte order, type 1, x, y (an empty point is x = y = NaN)."""


def plain_points_from_wkb(column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """(n, 2) coordinates of a WKB column, if every value is a little-endian 2-D point; None
    otherwise (a null, another type or byte order: the caller decodes it with shapely)."""
    buffers = _wkb_buffers(column)
    if buffers is None:
        return None
    offsets, data = buffers
    if (np.diff(offsets) != _WKB_POINT_BYTES).any():
        return None
    data = data[offsets[0] : offsets[-1]]
    points = data.reshape(-1, _WKB_POINT_BYTES)
    types = _uint32_at(data, np.arange(1, len(data), _WKB_POINT_BYTES))
    if (points[:, 0] != 1).any() or (types != 1).any():
        return None
    return points[:, 5:].copy().view("<f8").astype(np.float64, copy=False)


def _read_block(
    layer: VectorLayer, bbox: tuple[float, float, float, float], plain: bool = False
) -> tuple[np.ndarray | PlainPolygons, pd.DataFrame]:
    """Geometries and attribute columns of the features the spatial index finds in ``bbox``,
    in the file's feature order (as :class:`PlainPolygons` when ``plain`` and they all are).

    Read as Arrow and decoded directly: a GeoDataFrame would only be taken apart again. A
    spatial index hands features back in its own order; they are put back in file order, so
    where features overlap the one drawn last is the same whichever blocks the grid is cut in.
    """
    try:
        meta, table = pyogrio.read_arrow(
            layer.path,
            layer=layer.spec.layer,
            bbox=bbox,
            columns=list(layer.columns),
            return_fids=True,
        )
        fid_column = meta["fid_column"]
        fids = table.column(fid_column).to_numpy()
        if len(fids) > 1 and not (np.diff(fids) > 0).all():
            table = table.take(np.argsort(fids, kind="stable"))
        geometry_column = meta["geometry_name"] or "wkb_geometry"
        wkb = table.column(geometry_column)
        geometry = plain_polygons_from_wkb(wkb) if plain else None
        if geometry is None:
            geometry = shapely.from_wkb(wkb.to_numpy(zero_copy_only=False))
        attributes = table.drop_columns([geometry_column, fid_column]).to_pandas()
    except Exception as exc:  # pyogrio/pyarrow/shapely raise many types for damaged files
        raise _damaged(layer.path, "vector data", exc) from exc
    return geometry, attributes


def _to_crs(geometry: np.ndarray, source: CRS, target: CRS) -> np.ndarray:
    to_target = transformer(source, target)

    def reproject(xy: np.ndarray) -> np.ndarray:
        return np.column_stack(to_target.transform(xy[:, 0], xy[:, 1]))

    return shapely.transform(geometry, reproject)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a block's shapes are built and burned.

    A block's shapes are hundreds of thousands of small coordinate lists, none in a reference
    cycle (reference counting frees them). With the collector on, every few hundred new lists
    trigger a collection that rescans the survivors, which cost more than the burn itself.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_POINT, _LINE, _POLYGON, _MULTI_POINT, _MULTI_LINE, _MULTI_POLYGON = 0, 1, 3, 4, 5, 6
_GEOJSON_TYPES = {
    _POINT: "Point",
    _LINE: "LineString",
    _POLYGON: "Polygon",
    _MULTI_POINT: "MultiPoint",
    _MULTI_LINE: "MultiLineString",
    _MULTI_POLYGON: "MultiPolygon",
}


def _burn_shapes(
    geometry: np.ndarray | PlainPolygons, values: np.ndarray, source: CRS, target: CRS
) -> list[tuple[object, object]]:
    """(geometry, value) pairs for ``rasterize``, projected from ``source`` to ``target``.

    Geometries become the GeoJSON-like mappings their ``__geo_interface__`` would give, but
    built from one coordinate array per block: shapely's per-polygon ``__geo_interface__``
    walks every coordinate in Python and was most of a vector modality's time. Coordinates are
    projected point by point exactly as :func:`_to_crs` does, so the same pixels burn. Types
    without a fast form here (collections, rings, 3-D) go through ``__geo_interface__``.
    """
    if isinstance(geometry, PlainPolygons):
        return _ring_shapes(geometry.coords, geometry.counts, values, source, target)
    types = shapely.get_type_id(geometry)
    if _plain_polygons(geometry, types):
        coords, owner = shapely.get_coordinates(geometry, return_index=True)
        counts = np.bincount(owner, minlength=len(geometry))
        return _ring_shapes(coords, counts, values, source, target)
    fast = np.isin(types, list(_GEOJSON_TYPES)) & ~shapely.has_z(geometry)
    parts, part_owner = shapely.get_parts(geometry[fast], return_index=True)
    empty_parts = np.bincount(part_owner, weights=shapely.is_empty(parts), minlength=fast.sum())
    fast[np.flatnonzero(fast)[empty_parts > 0]] = False
    if not fast.all():
        parts, part_owner = shapely.get_parts(geometry[fast], return_index=True)
    # A part's coordinate sequences: a polygon's rings, a line or point itself.
    is_polygon = shapely.get_type_id(parts) == _POLYGON
    rings, ring_owner = shapely.get_rings(parts[is_polygon], return_index=True)
    sequences = np.concatenate([rings, parts[~is_polygon]])
    sequence_part = np.concatenate(
        [np.flatnonzero(is_polygon)[ring_owner], np.flatnonzero(~is_polygon)]
    )
    order = np.argsort(sequence_part, kind="stable")  # rings stay in order within a part
    sequences, sequence_part = sequences[order], sequence_part[order]
    coords, coord_owner = shapely.get_coordinates(sequences, return_index=True)
    x, y = transformer(source, target).transform(coords[:, 0], coords[:, 1])
    xy = np.column_stack([x, y]).tolist()
    sequence_ends = np.cumsum(np.bincount(coord_owner, minlength=len(sequences))).tolist()
    part_ends = np.cumsum(np.bincount(sequence_part, minlength=len(parts))).tolist()
    geometry_ends = np.cumsum(np.bincount(part_owner, minlength=int(fast.sum()))).tolist()
    sequence_lists = [xy[a:b] for a, b in zip([0, *sequence_ends[:-1]], sequence_ends, strict=True)]
    part_lists = [sequence_lists[a:b] for a, b in zip([0, *part_ends[:-1]], part_ends, strict=True)]
    burn = np.asarray(values).tolist()
    if fast.all() and (types == _POLYGON).all():  # the usual layer: one list of rings each
        return [
            ({"type": "Polygon", "coordinates": rings}, value)
            for rings, value in zip(part_lists, burn, strict=True)
        ]
    shapes: list[tuple[object, object]] = []
    fast_index = 0
    for index, type_id in enumerate(types.tolist()):
        if not fast[index]:
            projected = _to_crs(geometry[index : index + 1], source, target)[0]
            shapes.append((projected, burn[index]))
            continue
        start = geometry_ends[fast_index - 1] if fast_index else 0
        own = part_lists[start : geometry_ends[fast_index]]
        fast_index += 1
        if type_id == _POINT:
            coordinates: object = own[0][0][0]
        elif type_id in (_LINE, _POLYGON):
            coordinates = own[0][0] if type_id == _LINE else own[0]
        elif type_id == _MULTI_POINT:
            coordinates = [part[0][0] for part in own]
        elif type_id == _MULTI_LINE:
            coordinates = [part[0] for part in own]
        else:
            coordinates = own
        shapes.append(({"type": _GEOJSON_TYPES[type_id], "coordinates": coordinates}, burn[index]))
    return shapes


def _plain_polygons(geometry: np.ndarray, types: np.ndarray) -> bool:
    """Whether every geometry is a 2-D polygon without holes (footprint layers usually are)."""
    return bool(
        (types == _POLYGON).all()
        and not shapely.has_z(geometry).any()
        and not shapely.is_empty(geometry).any()
        and not shapely.get_num_interior_rings(geometry).any()
    )


def _ring_shapes(
    coords: np.ndarray, counts: np.ndarray, values: np.ndarray, source: CRS, target: CRS
) -> list[tuple[object, object]]:
    """``_burn_shapes`` for polygons without holes: each one's coordinates are its exterior
    ring, ``counts[i]`` points of ``coords`` in order, so there are no parts or rings to split.

    A closed ring's last point (its first again) is left out: the burn closes every ring with
    its first point, so the same points are drawn, and a footprint of four corners has a fifth
    fewer points to project, list and hand over. A triangle keeps it: ``rasterize`` skips a
    ring of fewer than four points.
    """
    ends = np.cumsum(counts)
    starts = ends - counts
    closed = (counts > 4) & (coords[starts] == coords[ends - 1]).all(axis=1)
    if closed.any():
        keep = np.ones(len(coords), dtype=bool)
        keep[ends[closed] - 1] = False
        coords, counts = coords[keep], counts - closed
    x, y = transformer(source, target).transform(coords[:, 0], coords[:, 1])
    xy = np.column_stack([x, y]).tolist()
    ends = np.cumsum(counts).tolist()
    return [
        ({"type": "Polygon", "coordinates": [xy[start:end]]}, value)
        for start, end, value in zip(
            [0, *ends[:-1]], ends, np.asarray(values).tolist(), strict=True
        )
    ]


def burn(shapes: list[tuple[object, object]], out: np.ndarray, transform: Affine) -> None:
    """Burn (geometry, value) pairs into ``out`` in place, pixel centres inside (not all-touched).

    ``rasterio.features.rasterize`` splits multi-polygons and collections into parts
    (rasterio#1253: burning a multi-polygon whole can fill the holes between its parts).
    """
    if shapes:
        rasterize(
            shapes, out=out, transform=transform, all_touched=False, merge_alg=MergeAlg.replace
        )


def rasterize_block(
    layer: VectorLayer,
    pixel_grid: PixelGrid,
    row_start: int,
    row_stop: int,
    col_start: int,
    col_stop: int,
    *,
    background: float,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """Burn features into one block of the grid: (values[1,h,w], valid[h,w]).

    Only the features meeting the block are read and drawn, and validity (inside the source's
    coverage) is tested at the block's pixel centres, so cost and memory follow the block.
    """
    height, width = row_stop - row_start, col_stop - col_start
    res = pixel_grid.resolution
    top = pixel_grid.y_max - row_start * res
    left = pixel_grid.x_min + col_start * res
    transform = Affine(res, 0, left, 0, -res, top)
    geometry, values = _source_features_in(
        layer, (left, top - height * res, left + width * res, top), plain=layer.polygons
    )
    out = np.full((height, width), background, dtype=dtype)
    if len(geometry):
        with _collector_paused():
            shapes = _burn_shapes(geometry, values, layer.source_crs, layer.city_crs)
            burn(shapes, out, transform)
            del shapes
    if layer.coverage is None:
        valid = np.ones((height, width), dtype=bool)
    else:
        xs, ys = np.meshgrid(
            pixel_grid.x_coords()[col_start:col_stop],
            top - (np.arange(height) + 0.5) * res,
        )
        valid = shapely.contains_xy(layer.coverage, xs, ys)
    return out[None], valid


def iter_points(
    path: Path, city_epsg: int, expected_crs: CRS
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Point coordinates (x, y) in the city CRS, a batch at a time.

    GeoParquet files are decoded ``POINT_BATCH_ROWS`` rows at a time, so a city's trace file is
    never held whole; other formats are read in one go.
    """
    if Path(path).suffix != ".parquet":
        frame = _read(path)
        check_crs(frame, expected_crs, path)
        yield _xy(frame.geometry.to_numpy(), frame.crs, city_epsg, path)
        return
    _require_file(path)
    try:
        parquet = pq.ParquetFile(path)
        column, crs = _geoparquet_geometry(parquet, path)
        _require_crs(crs, expected_crs, path)
        for batch in parquet.iter_batches(batch_size=POINT_BATCH_ROWS, columns=[column]):
            plain = plain_points_from_wkb(batch.column(0))
            if plain is not None:  # no geometry object per point
                yield _projected(plain[:, 0], plain[:, 1], crs, city_epsg)
                continue
            geometry = shapely.from_wkb(batch.column(0).to_numpy(zero_copy_only=False))
            yield _xy(geometry, crs, city_epsg, path)
    except SourceReadError:
        raise
    except Exception as exc:  # pyarrow/shapely raise many types for damaged files
        raise _damaged(path, "GeoParquet points", exc) from exc


def _geoparquet_geometry(parquet: pq.ParquetFile, path: Path) -> tuple[str, CRS]:
    """The primary geometry column of a GeoParquet file and its CRS (OGC:CRS84 when unset)."""
    meta = (parquet.schema_arrow.metadata or {}).get(b"geo")
    if meta is None:
        raise SourceReadError(
            f"{path} is Parquet without GeoParquet metadata (no 'geo' key), so its points have no "
            f"declared geometry column or CRS; {repair_hint(path)}"
        )
    geo = json.loads(meta)
    column = geo["primary_column"]
    spec = geo["columns"][column]
    if spec.get("encoding", "WKB") != "WKB":
        raise SourceReadError(f"{path} encodes geometry as {spec['encoding']}; expected WKB")
    if "crs" not in spec:
        return column, CRS.from_user_input("OGC:CRS84")
    if spec["crs"] is None:
        raise SourceReadError(f"{path} has no CRS; vector sources must declare theirs")
    return column, _crs_from_projjson(json.dumps(spec["crs"], sort_keys=True))


@lru_cache(maxsize=16)
def _crs_from_projjson(text: str) -> CRS:
    """Parsed once per definition: a PROJJSON parse costs tens of milliseconds."""
    return CRS.from_json(text)


def _xy(
    geometry: np.ndarray, crs: object, city_epsg: int, path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of the present points in the city CRS (NaN for an empty point).

    Projected straight from the coordinate arrays: a GeoSeries would build a CRS and a new
    point geometry per point for every batch, several times the cost of the projection.
    """
    points = geometry[~shapely.is_missing(geometry)]
    if not (shapely.get_type_id(points) == _POINT).all():
        raise SourceReadError(
            f"{path} holds geometries other than points, and its product holds points only: the "
            f"file is not that product's; {repair_hint(path)}"
        )
    x, y = np.full(len(points), np.nan), np.full(len(points), np.nan)
    present = ~shapely.is_empty(points)
    x[present], y[present] = shapely.get_x(points[present]), shapely.get_y(points[present])
    return _projected(x, y, crs, city_epsg)


def _projected(
    x: np.ndarray, y: np.ndarray, crs: object, city_epsg: int
) -> tuple[np.ndarray, np.ndarray]:
    """Points in the city CRS; an empty point (x = y = NaN) stays at NaN."""
    out_x, out_y = np.full(len(x), np.nan), np.full(len(x), np.nan)
    present = ~(np.isnan(x) & np.isnan(y))
    to_city = transformer(CRS.from_user_input(crs), f"EPSG:{city_epsg}")
    out_x[present], out_y[present] = to_city.transform(x[present], y[present])
    return out_x, out_y


def tile_index(grid: TileGrid, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-major tile index of each point, −1 outside the grid (edges belong to one tile)."""
    col = np.floor((x - grid.x_min) / grid.tile_size).astype(np.int64)
    row = np.floor((grid.y_max - y) / grid.tile_size).astype(np.int64)
    inside = (col >= 0) & (col < grid.n_cols) & (row >= 0) & (row < grid.n_rows)
    return np.where(inside, row * grid.n_cols + col, -1)


def point_counts(grid: TileGrid, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Number of points in each tile."""
    index = tile_index(grid, x, y)
    return np.bincount(index[index >= 0], minlength=grid.n_tiles)


@dataclass(frozen=True)
class Records:
    """Point records of one file: the usable ones, and what was read to get them."""

    lon: np.ndarray
    lat: np.ndarray
    values: np.ndarray
    rows: int
    """Rows the file holds (every year)."""
    unusable: int
    """Rows of the requested year whose value or position is blank or not a finite number."""
    positions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Position in the file of each usable record (0 = the first record), to name its row."""


def load_records(
    path: Path, column: str, year: int | None, checks: RecordChecks | None = None
) -> Records:
    """Records with a finite value and position; the others are counted, never dropped silently.

    Checked at the door (``citycube.processing.record_checks``): every record is of ``year``,
    the product's key names each record once, and the values are plausible for the product's
    unit; a failure names the file and line.
    """
    _require_file(path)
    try:
        frame = pd.read_csv(path)
    except Exception as exc:
        raise SourceReadError(
            f"cannot read {path} as CSV records ({exc}); {repair_hint(path)}"
        ) from exc
    missing = {"lon", "lat", column} - set(frame.columns)
    if missing:
        raise SourceReadError(
            f"{path} lacks columns {sorted(missing)} (has {sorted(map(str, frame.columns))}): "
            f"the file is not a records file of its product; {repair_hint(path)}"
        )
    ragged = _ragged_record(path)
    if ragged is not None:
        line, fields, expected = ragged
        raise SourceReadError(
            f"{path} line {line} has {fields} fields where the header has {expected}: the file "
            f"is cut or garbled, and its values would land in the wrong columns; "
            f"{repair_hint(path)}"
        )
    rows = len(frame)
    if year is not None:
        if "year" not in frame:
            raise SourceReadError(
                f"{path} has no 'year' column, so its records cannot be told to be of {year}; "
                f"{repair_hint(path)}"
            )
        check_year(frame["year"], year, path, csv_line)
    if checks is not None and checks.key is not None and checks.key in frame:
        check_unique(frame[checks.key].reset_index(drop=True), checks.key, path, csv_line)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
    lon = pd.to_numeric(frame["lon"], errors="coerce").to_numpy(float)
    lat = pd.to_numeric(frame["lat"], errors="coerce").to_numpy(float)
    usable = np.isfinite(values) & np.isfinite(lon) & np.isfinite(lat)
    positions = np.flatnonzero(usable)
    check_plausible(values[usable], positions, checks, "point", path, csv_line)
    return Records(lon[usable], lat[usable], values[usable], rows, int((~usable).sum()), positions)


def _ragged_record(path: Path) -> tuple[int, int, int] | None:
    """(line, fields, header fields) of the first record whose field count is not the
    header's, or None. pandas fills a short record with blanks, so a record cut at the end of a
    truncated file, or with a separator lost, would otherwise be read with shifted values."""
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        for row in reader:
            if row and len(row) != len(header):
                return reader.line_num, len(row), len(header)
    return None


def check_declared_counts(records: Records, declared: Mapping[str, str], path: Path) -> None:
    """Refuse a records file whose row count or unusable rows exceed what its source declared.

    A cut or garbled file otherwise just lowers every total. Sources that declare nothing
    (``records``, ``blank_values`` in the item's metadata) are not checked.
    """
    expected_rows = declared.get("records")
    if expected_rows is not None and records.rows != int(expected_rows):
        raise SourceReadError(
            f"{path} holds {records.rows} records, its source declares {expected_rows}: the file "
            f"is truncated or padded; {repair_hint(path)}"
        )
    expected_blank = declared.get("blank_values")
    if expected_blank is not None and records.unusable > int(expected_blank):
        raise SourceReadError(
            f"{path} has {records.unusable} records without a usable value or position, its "
            f"source declares {expected_blank} blank: the file is garbled; {repair_hint(path)}"
        )


def coverage_fractions(grid: TileGrid, coverage: shapely.Geometry) -> np.ndarray:
    """Exact share of each tile's area inside a coverage polygon (city CRS)."""
    boxes = np.array([shapely.box(*t.bounds) for t in grid.tiles()])
    return shapely.area(shapely.intersection(boxes, coverage)) / float(grid.tile_size**2)


def load_coverage(path: Path, city_epsg: int) -> shapely.Geometry:
    """The union of a coverage file's polygons in the city CRS.

    A coverage decides where a tile is unavailable rather than zero, so one that is empty,
    not made of polygons or invalid (self-intersecting rings) is refused, never guessed at.
    """
    frame = _read(path)
    geometry = frame.to_crs(epsg=city_epsg).geometry.to_numpy()
    present = geometry[~shapely.is_missing(geometry) & ~shapely.is_empty(geometry)]
    problem = None
    if len(present) == 0:
        problem = "holds no polygon"
    elif not np.isin(shapely.get_type_id(present), (_POLYGON, _MULTI_POLYGON)).all():
        problem = "holds geometries other than polygons"
    else:
        invalid = present[~shapely.is_valid(present)]
        if len(invalid):
            problem = f"holds an invalid polygon ({shapely.is_valid_reason(invalid[0])})"
    if problem is not None:
        raise SourceReadError(
            f"coverage file {path} {problem}; it must outline the area the source reports on "
            f"with valid polygons: {repair_hint(path)}"
        )
    return shapely.union_all(present)
