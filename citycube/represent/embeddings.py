"""Embeddings in their native supports and their alignment to the cube's tiles.

CityRep §3.2 aligns every representation to the task's own units: an embedding finer than the
unit is averaged within it, a coarser one is broadcast to every unit it covers, a matching one
is looked up, sparse entities are first pooled to H3 resolution-8 cells and a coordinate
encoder is queried at the unit's representative point. Here the units are the cube's 2 km or
5 km tiles and the representative point is the tile centre.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from affine import Affine
from pyproj import Transformer

from citycube.catalogue.cities import SCALES, Scale, get_city
from citycube.errors import EmbeddingError
from citycube.grid.tiles import city_grid

ENTITY_H3_RESOLUTION = 8
"""Entities are pooled to H3 cells of this resolution before alignment (CityRep App. C.3)."""

MissingPolicy = Literal["drop", "zero"]
MISSING_POLICIES: tuple[MissingPolicy, ...] = ("drop", "zero")


@dataclass(frozen=True)
class TileUnits:
    """The task units of one city and scale: its tiles, in row-major order."""

    city: str
    scale: Scale
    tile_ids: np.ndarray
    row: np.ndarray
    col: np.ndarray
    x: np.ndarray
    """Tile centre easting, city UTM metres."""
    y: np.ndarray
    """Tile centre northing."""
    lon: np.ndarray
    """Tile centre longitude, WGS84."""
    lat: np.ndarray
    tile_size: int
    epsg: int

    def __len__(self) -> int:
        return len(self.tile_ids)

    def locate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Row-major tile index of each UTM point, -1 outside the grid."""
        grid = city_grid(self.city, self.scale)
        col = np.floor((np.asarray(x) - grid.x_min) / grid.tile_size).astype(np.int64)
        row = np.floor((grid.y_max - np.asarray(y)) / grid.tile_size).astype(np.int64)
        inside = (row >= 0) & (row < grid.n_rows) & (col >= 0) & (col < grid.n_cols)
        return np.where(inside, row * grid.n_cols + col, -1)


def tile_units(city: str, scale: str) -> TileUnits:
    """Every tile of ``city`` at ``scale`` with its grid index and centre."""
    if scale not in SCALES:
        raise EmbeddingError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}")
    spec = get_city(city)
    grid = city_grid(city, scale)  # type: ignore[arg-type]
    row, col = np.divmod(np.arange(grid.n_tiles), grid.n_cols)
    x = grid.x_min + (col + 0.5) * grid.tile_size
    y = grid.y_max - (row + 0.5) * grid.tile_size
    lon, lat = Transformer.from_crs(spec.epsg, 4326, always_xy=True).transform(x, y)
    return TileUnits(
        city=city,
        scale=scale,  # type: ignore[arg-type]
        tile_ids=np.array(grid.tile_ids()),
        row=row,
        col=col,
        x=x,
        y=y,
        lon=np.asarray(lon),
        lat=np.asarray(lat),
        tile_size=grid.tile_size,
        epsg=spec.epsg,
    )


@dataclass(frozen=True)
class RasterEmbedding:
    """A (bands, rows, cols) embedding raster with its transform and CRS; NaN is missing."""

    name: str
    data: np.ndarray
    transform: Affine
    crs: str

    @classmethod
    def from_geotiff(cls, name: str, path: Path) -> RasterEmbedding:
        """Read every band of a GeoTIFF; nodata and masked pixels become NaN."""
        import rasterio

        try:
            with rasterio.open(path) as src:
                data = src.read(masked=True).astype(np.float64).filled(np.nan)
                return cls(name, data, src.transform, str(src.crs))
        except rasterio.errors.RasterioIOError as exc:
            raise EmbeddingError(
                f"cannot read the embedding raster {path}: {exc}; give a GeoTIFF"
            ) from exc

    @classmethod
    def from_zarr(cls, name: str, path: Path) -> RasterEmbedding:
        """Read a Zarr store's one (band, y, x) array, georeferenced as rioxarray writes it
        (a CF grid mapping with the CRS and transform); its fill value becomes NaN."""
        import rioxarray  # noqa: F401  (the .rio accessor)
        import xarray as xr

        try:
            dataset = xr.open_zarr(path, mask_and_scale=True, decode_coords="all")
        except (OSError, ValueError, KeyError) as exc:
            raise EmbeddingError(
                f"cannot read the embedding store {path}: {exc}; give a Zarr store"
            ) from exc
        arrays = [v for v in dataset.data_vars.values() if v.ndim in (2, 3)]
        if len(arrays) != 1:
            raise EmbeddingError(
                f"embedding store {path} holds {len(arrays)} gridded arrays "
                f"({', '.join(str(a.name) for a in arrays) or 'none'}); give one (band, y, x) array"
            )
        array = arrays[0] if arrays[0].ndim == 3 else arrays[0].expand_dims("band")
        if array.rio.crs is None:
            raise EmbeddingError(
                f"embedding store {path} has no CRS; write it with rioxarray's rio.write_crs"
            )
        y, x = array.rio.y_dim, array.rio.x_dim
        (band,) = (d for d in array.dims if d not in (y, x))
        data = np.asarray(array.transpose(band, y, x), dtype=np.float64)
        return cls(name, data, array.rio.transform(), str(array.rio.crs))


@dataclass(frozen=True)
class RegionEmbedding:
    """One vector per H3 cell (all cells of one resolution)."""

    name: str
    cells: np.ndarray
    values: np.ndarray

    @property
    def resolution(self) -> int:
        import h3

        resolutions = {h3.get_resolution(str(c)) for c in self.cells}
        if len(resolutions) != 1:
            raise EmbeddingError(
                f"embedding {self.name}: H3 cells of resolutions {sorted(resolutions)}; "
                "give cells of one resolution"
            )
        return resolutions.pop()


@dataclass(frozen=True)
class EntityEmbedding:
    """One vector per entity (POI, building, road) at a WGS84 point."""

    name: str
    lon: np.ndarray
    lat: np.ndarray
    values: np.ndarray

    def pooled(self, resolution: int = ENTITY_H3_RESOLUTION) -> RegionEmbedding:
        """Mean vector of the entities in each H3 cell (CityRep's H3-first aggregation)."""
        import h3

        cells = np.array(
            [
                h3.latlng_to_cell(float(a), float(o), resolution)
                for a, o in zip(self.lat, self.lon, strict=True)
            ]
        )
        unique, inverse = np.unique(cells, return_inverse=True)
        sums = np.zeros((len(unique), self.values.shape[1]))
        np.add.at(sums, inverse, self.values)
        counts = np.bincount(inverse, minlength=len(unique))[:, None]
        return RegionEmbedding(self.name, unique, sums / counts)


@dataclass(frozen=True)
class TileEmbedding:
    """One vector per cube tile id: the units match, alignment is a lookup."""

    name: str
    tile_ids: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class CoordinateEncoder:
    """A callable ``(lon, lat) -> (n, d)`` queried at each tile centre."""

    name: str
    encode: Callable[[np.ndarray, np.ndarray], np.ndarray]


Embedding = RasterEmbedding | RegionEmbedding | EntityEmbedding | TileEmbedding | CoordinateEncoder


def _check_values(name: str, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] == 0:
        raise EmbeddingError(f"embedding {name}: values must be (n, d) with d > 0")
    return values


def read_table_embedding(name: str, path: Path) -> Embedding:
    """Read a Parquet embedding table: its key column says its support.

    ``h3`` → region table, ``lon`` and ``lat`` → entity table, ``tile_id`` → tile table; every
    other numeric column is an embedding dimension.
    """
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise EmbeddingError(f"cannot read the embedding table {path}: {exc}") from exc
    keys = {"h3", "lon", "lat", "tile_id"} & set(table.column_names)
    numeric = (pa.types.is_floating, pa.types.is_integer)
    dims = [
        n
        for n in table.column_names
        if n not in keys and any(test(table.schema.field(n).type) for test in numeric)
    ]
    if not dims:
        raise EmbeddingError(f"{path}: no numeric embedding columns besides {sorted(keys)}")
    values = np.column_stack([table[n].to_numpy(zero_copy_only=False) for n in dims])
    values = _check_values(name, values.astype(np.float64))
    if "h3" in keys:
        return RegionEmbedding(name, np.asarray(table["h3"].to_pylist()), values)
    if {"lon", "lat"} <= keys:
        return EntityEmbedding(name, table["lon"].to_numpy(), table["lat"].to_numpy(), values)
    if "tile_id" in keys:
        return TileEmbedding(name, np.asarray(table["tile_id"].to_pylist()), values)
    raise EmbeddingError(f"{path}: no key column; give an `h3`, `lon` + `lat` or `tile_id` column")


@dataclass
class Aligned:
    """An embedding aligned to a city's tiles: NaN rows have no feature."""

    name: str
    units: TileUnits
    features: np.ndarray
    rule: str
    """Which §3.2 rule applied: mean, broadcast, lookup, h3-first mean, coordinate."""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def covered(self) -> np.ndarray:
        return np.isfinite(self.features).all(axis=1)


def _pixel_area(emb: RasterEmbedding, epsg: int) -> float:
    """Area in the city CRS (m²) of the raster's middle pixel."""
    _, height, width = emb.data.shape
    r, c = height // 2, width // 2
    corners = [(c, r), (c + 1, r), (c + 1, r + 1), (c, r + 1)]
    xs, ys = emb.transform @ (
        np.array([p[0] for p in corners], float),
        np.array([p[1] for p in corners], float),
    )
    x, y = Transformer.from_crs(emb.crs, epsg, always_xy=True).transform(xs, ys)
    x, y = np.asarray(x), np.asarray(y)
    return float(abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2)


def _align_raster(emb: RasterEmbedding, units: TileUnits) -> Aligned:
    """Finer pixels: mean of the valid pixels whose centre lies in the tile. Coarser (or
    matching) pixels: the pixel under the tile centre, shared by every tile it covers."""
    bands, height, width = emb.data.shape
    n = len(units)
    features = np.full((n, bands), np.nan)
    ratio = _pixel_area(emb, units.epsg) / units.tile_size**2
    if ratio < 0.99:
        rows, cols = np.mgrid[0:height, 0:width]
        px, py = emb.transform @ (cols.ravel() + 0.5, rows.ravel() + 0.5)
        to_city = Transformer.from_crs(emb.crs, units.epsg, always_xy=True).transform
        cx, cy = to_city(px, py)
        tile = units.locate(np.asarray(cx), np.asarray(cy))
        pixels = emb.data.reshape(bands, -1).T
        good = (tile >= 0) & np.isfinite(pixels).all(axis=1)
        sums = np.zeros((n, bands))
        np.add.at(sums, tile[good], pixels[good])
        counts = np.bincount(tile[good], minlength=n)
        features[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
        return Aligned(emb.name, units, features, "raster mean")
    to_raster = Transformer.from_crs(units.epsg, emb.crs, always_xy=True).transform
    rx, ry = to_raster(units.x, units.y)
    c, r = (~emb.transform) @ (np.asarray(rx), np.asarray(ry))
    r, c = np.floor(r).astype(int), np.floor(c).astype(int)
    inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
    features[inside] = emb.data[:, r[inside], c[inside]].T
    rule = "lookup" if ratio <= 1.01 else "broadcast"
    return Aligned(emb.name, units, features, f"raster {rule}")


def _align_region(emb: RegionEmbedding, units: TileUnits, rule_prefix: str = "") -> Aligned:
    import h3

    values = _check_values(emb.name, emb.values)
    res = emb.resolution
    n, d = len(units), values.shape[1]
    features = np.full((n, d), np.nan)
    if h3.average_hexagon_area(res, "m^2") < units.tile_size**2:
        # finer cells: mean of the cells whose centre lies in the tile
        latlng = np.array([h3.cell_to_latlng(str(c)) for c in emb.cells]).reshape(-1, 2)
        x, y = Transformer.from_crs(4326, units.epsg, always_xy=True).transform(
            latlng[:, 1], latlng[:, 0]
        )
        tile = units.locate(np.asarray(x), np.asarray(y))
        good = (tile >= 0) & np.isfinite(values).all(axis=1)
        sums = np.zeros((n, d))
        np.add.at(sums, tile[good], values[good])
        counts = np.bincount(tile[good], minlength=n)
        features[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
        rule = "mean"
    else:
        index = {str(c): i for i, c in enumerate(emb.cells)}
        for i, (lat, lon) in enumerate(zip(units.lat, units.lon, strict=True)):
            j = index.get(h3.latlng_to_cell(float(lat), float(lon), res))
            if j is not None:
                features[i] = values[j]
        rule = "broadcast"
    return Aligned(emb.name, units, features, f"{rule_prefix}h3 r{res} {rule}")


def align(emb: Embedding, units: TileUnits) -> Aligned:
    """Align one embedding to the tiles of one city and scale (CityRep §3.2)."""
    if isinstance(emb, RasterEmbedding):
        return _align_raster(emb, units)
    if isinstance(emb, RegionEmbedding):
        return _align_region(emb, units)
    if isinstance(emb, EntityEmbedding):
        return _align_region(emb.pooled(), units, rule_prefix="entities → ")
    if isinstance(emb, TileEmbedding):
        values = _check_values(emb.name, emb.values)
        index = {str(t): i for i, t in enumerate(emb.tile_ids)}
        features = np.full((len(units), values.shape[1]), np.nan)
        for i, t in enumerate(units.tile_ids):
            j = index.get(str(t))
            if j is not None:
                features[i] = values[j]
        return Aligned(emb.name, units, features, "tile lookup")
    if isinstance(emb, CoordinateEncoder):
        values = _check_values(emb.name, emb.encode(units.lon, units.lat))
        if len(values) != len(units):
            raise EmbeddingError(
                f"coordinate encoder {emb.name} returned {len(values)} rows for {len(units)} "
                "points; it must return one row per point"
            )
        return Aligned(emb.name, units, values, "coordinate at tile centre")
    raise EmbeddingError(f"unsupported embedding type {type(emb).__name__}")


@dataclass(frozen=True)
class Features:
    """Aligned features for the task units that have a target, after the missing-row policy."""

    name: str
    tile_ids: np.ndarray
    X: np.ndarray
    zero_filled: np.ndarray
    """True where a row had no aligned feature and was zero-filled (policy ``zero``)."""
    keep: np.ndarray
    """Mask over the task's units: rows kept."""
    policy: MissingPolicy
    l2: bool


def prepare(
    aligned: Aligned,
    task_tiles: np.ndarray,
    policy: MissingPolicy = "drop",
    l2: bool = False,
) -> tuple[Features, dict[str, object]]:
    """The features of ``task_tiles`` under the missing-row policy, and the coverage record.

    ``drop`` removes units without a feature; ``zero`` keeps them with zero features and a flag,
    so every model is scored on the same units. ``l2`` scales each row to unit length.
    """
    if policy not in MISSING_POLICIES:
        raise EmbeddingError(f"unknown missing-row policy {policy!r}; use drop or zero")
    index = {str(t): i for i, t in enumerate(aligned.units.tile_ids)}
    rows = np.array([index.get(str(t), -1) for t in task_tiles], dtype=np.int64)
    d = aligned.features.shape[1]
    X = np.full((len(task_tiles), d), np.nan)
    X[rows >= 0] = aligned.features[rows[rows >= 0]]
    covered = np.isfinite(X).all(axis=1)
    if policy == "drop":
        keep = covered
        zero = np.zeros(int(covered.sum()), bool)
        X = X[keep]
    else:
        keep = np.ones(len(task_tiles), bool)
        zero = ~covered
        X = np.where(covered[:, None], X, 0.0)
    if l2:
        norm = np.linalg.norm(X, axis=1, keepdims=True)
        X = np.divide(X, norm, out=np.zeros_like(X), where=norm > 0)
    record = {
        "embedding": aligned.name,
        "city": aligned.units.city,
        "scale": aligned.units.scale,
        "rule": aligned.rule,
        "dim": d,
        "task_units": len(task_tiles),
        "covered": int(covered.sum()),
        "coverage": float(covered.mean()) if len(task_tiles) else float("nan"),
        "policy": policy,
        "zero_filled": int(zero.sum()),
        "kept": int(keep.sum()),
        "l2": l2,
    }
    features = Features(aligned.name, np.asarray(task_tiles)[keep], X, zero, keep, policy, l2)
    return features, record
