"""Vector, point and record sources: rasterise onto chip grids, count points, sum records.

Features are drawn exactly as mapped: no buffering, no dilation, no new features. Geometries
are reprojected once per partition into the city's UTM CRS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from pyproj import CRS
from rasterio.features import rasterize
from rasterio.transform import Affine

from citycube.catalogue import RasterizeSpec
from citycube.classify import get_classifier
from citycube.errors import SourceReadError
from citycube.grids import PixelGrid, TileGrid


def _read(path: Path, **kwargs: object) -> gpd.GeoDataFrame:
    if not Path(path).exists():
        raise SourceReadError(f"source file {path} does not exist; re-run its source asset")
    try:
        if Path(path).suffix == ".parquet":
            frame = gpd.read_parquet(path)
        else:
            frame = gpd.read_file(path, **kwargs)
    except Exception as exc:  # pyogrio/pyarrow raise many types for damaged files
        raise SourceReadError(
            f"cannot read {path} as vector data ({exc}); the file is corrupt or truncated: "
            "delete it and re-run its source asset"
        ) from exc
    if frame.crs is None:
        raise SourceReadError(f"{path} has no CRS; vector sources must declare theirs")
    return frame


def check_crs(frame: gpd.GeoDataFrame, expected: CRS, path: Path) -> None:
    """Refuse vector files that are not in their product's native CRS."""
    if not CRS.from_user_input(frame.crs).equals(expected):
        raise SourceReadError(
            f"{path} is in {CRS.from_user_input(frame.crs).to_string()} but the product is "
            f"published in {expected.to_string()}; the file is wrong or mislabelled"
        )


@dataclass
class RasterisableFeatures:
    """Features in the city CRS with the value each burns."""

    geometry: np.ndarray
    """Shapely geometries (city UTM)."""
    values: np.ndarray
    """Value burnt per feature."""
    tree: shapely.STRtree
    """Spatial index over ``geometry``."""
    coverage: shapely.Geometry | None
    """Area the source reports on (None: the whole grid)."""


def load_features(
    path: Path, spec: RasterizeSpec, city_epsg: int, expected_crs: CRS, coverage: Path | None
) -> RasterisableFeatures:
    """Read, filter, value and reproject the features of one vector item."""
    frame = _read(path, layer=spec.layer)
    check_crs(frame, expected_crs, path)
    if spec.filter_column:
        if spec.filter_column not in frame:
            raise SourceReadError(f"{path} layer {spec.layer} has no column {spec.filter_column!r}")
        frame = frame[frame[spec.filter_column].isin(spec.filter_values)]
    frame = frame[frame.geometry.notna() & ~frame.geometry.is_empty]
    if spec.classify:
        values = get_classifier(spec.classify)(pd.DataFrame(frame.drop(columns="geometry")))
    elif spec.burn_column:
        if spec.burn_column not in frame:
            raise SourceReadError(f"{path} layer {spec.layer} has no column {spec.burn_column!r}")
        values = pd.to_numeric(frame[spec.burn_column], errors="coerce").to_numpy(float)
        keep = np.isfinite(values)
        frame, values = frame[keep], values[keep]
    else:
        values = np.full(len(frame), spec.burn_value, dtype=float)
    geometry = frame.to_crs(epsg=city_epsg).geometry.to_numpy()
    area = None
    if coverage is not None:
        cov = _read(coverage)
        area = shapely.union_all(cov.to_crs(epsg=city_epsg).geometry.to_numpy())
    return RasterisableFeatures(geometry, np.asarray(values), shapely.STRtree(geometry), area)


def rasterize_block(
    features: RasterisableFeatures,
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

    Only features meeting the block are drawn, and validity (inside the source's coverage) is
    tested at the block's pixel centres, so the cost and memory follow the block.
    """
    height, width = row_stop - row_start, col_stop - col_start
    res = pixel_grid.resolution
    top = pixel_grid.y_max - row_start * res
    left = pixel_grid.x_min + col_start * res
    transform = Affine(res, 0, left, 0, -res, top)
    hits = features.tree.query(shapely.box(left, top - height * res, left + width * res, top))
    out = np.full((height, width), background, dtype=dtype)
    if len(hits):
        shapes = zip(features.geometry[hits], features.values[hits], strict=True)
        rasterize(shapes, out=out, transform=transform, all_touched=False)
    if features.coverage is None:
        valid = np.ones((height, width), dtype=bool)
    else:
        xs, ys = np.meshgrid(
            pixel_grid.x_coords()[col_start:col_stop],
            top - (np.arange(height) + 0.5) * res,
        )
        valid = shapely.contains_xy(features.coverage, xs, ys)
    return out[None], valid


def load_points(path: Path, city_epsg: int, expected_crs: CRS) -> tuple[np.ndarray, np.ndarray]:
    """Point coordinates (x, y) in the city CRS."""
    frame = _read(path)
    check_crs(frame, expected_crs, path)
    frame = frame[frame.geometry.notna()].to_crs(epsg=city_epsg)
    return frame.geometry.x.to_numpy(), frame.geometry.y.to_numpy()


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


def load_records(
    path: Path, column: str, year: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """lon, lat and value of usable records, plus how many were unusable (blank or non-finite)."""
    if not Path(path).exists():
        raise SourceReadError(f"source file {path} does not exist; re-run its source asset")
    try:
        frame = pd.read_csv(path)
    except Exception as exc:
        raise SourceReadError(f"cannot read {path} as CSV records ({exc})") from exc
    missing = {"lon", "lat", column} - set(frame.columns)
    if missing:
        raise SourceReadError(f"{path} lacks columns {sorted(missing)}")
    if year is not None and "year" in frame:
        frame = frame[frame["year"] == year]
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
    usable = np.isfinite(values)
    return (
        frame["lon"].to_numpy(float)[usable],
        frame["lat"].to_numpy(float)[usable],
        values[usable],
        int((~usable).sum()),
    )


def coverage_fractions(grid: TileGrid, coverage: shapely.Geometry) -> np.ndarray:
    """Exact share of each tile's area inside a coverage polygon (city CRS)."""
    boxes = np.array([shapely.box(*t.bounds) for t in grid.tiles()])
    return shapely.area(shapely.intersection(boxes, coverage)) / float(grid.tile_size**2)


def load_coverage(path: Path, city_epsg: int) -> shapely.Geometry:
    """The union of a coverage file's polygons in the city CRS."""
    frame = _read(path)
    return shapely.union_all(frame.to_crs(epsg=city_epsg).geometry.to_numpy())
