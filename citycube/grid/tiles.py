"""City tile grids, the tile-aligned pixel grids that chips are cut from, and product lattices.

Every pixel grid (a product's lattice window, a chip grid, a source raster's cells) is an
odc-geo :class:`~odc.geo.geobox.GeoBox`; a :class:`TileGrid` is the named layout of a city's
tiles, whose ``geobox`` holds one pixel per tile.

Both grids of a city have their west and north edges on the 10 km lattice of the city's UTM
CRS, so every 2 km and 5 km tile nests in exactly one 10 km parent cell (the unit of the
leakage-proof splits). Row 0 is the northern edge.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from affine import Affine
from odc.geo.geobox import GeoBox
from pyproj import CRS, Transformer

from citycube.catalogue.cities import PARENT_SIZE_M, SCALES, TILE_SIZE_M, CitySpec, Scale, get_city


@dataclass(frozen=True)
class Tile:
    """One tile of a city grid."""

    city: str
    """City key."""
    scale: Scale
    """'2km' or '5km'."""
    row: int
    """Row index, 0 at the north edge."""
    col: int
    """Column index, 0 at the west edge."""
    bounds: tuple[float, float, float, float]
    """(xmin, ymin, xmax, ymax) in the city's UTM CRS, metres."""

    @cached_property
    def tile_id(self) -> str:
        """Text id, e.g. ``Boston_2KM_r7_c8`` (formatted once: every per-tile table asks)."""
        return f"{self.city}_{self.scale.upper()}_r{self.row}_c{self.col}"

    @property
    def parent_id(self) -> str:
        """Id of the 10 km lattice cell that contains this tile."""
        return parent_cell_id(self.city, self.bounds[0], self.bounds[3])


def parent_cell_id(city: str, x: float, y_top: float) -> str:
    """Id of the 10 km cell whose interior contains the box starting at (x, y_top)."""
    easting = int(np.floor(x / PARENT_SIZE_M))
    northing = int(np.floor((y_top - 1e-6) / PARENT_SIZE_M))
    return f"{city}_10KM_e{easting}_n{northing}"


@dataclass(frozen=True)
class TileGrid:
    """A regular grid of square tiles in a city's UTM CRS."""

    city: str
    """City key."""
    scale: Scale
    """'2km' or '5km'."""
    epsg: int
    """UTM EPSG code of the city."""
    x_min: float
    """West edge, metres (a multiple of 10 km)."""
    y_max: float
    """North edge, metres (a multiple of 10 km)."""
    tile_size: int
    """Tile edge length, metres."""
    n_rows: int
    """Number of tile rows."""
    n_cols: int
    """Number of tile columns."""

    @property
    def crs(self) -> str:
        """CRS as an authority string."""
        return f"EPSG:{self.epsg}"

    @property
    def n_tiles(self) -> int:
        """Tile count."""
        return self.n_rows * self.n_cols

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax) of the whole grid."""
        return (
            self.x_min,
            self.y_max - self.n_rows * self.tile_size,
            self.x_min + self.n_cols * self.tile_size,
            self.y_max,
        )

    @property
    def transform(self) -> Affine:
        """Affine transform with one 'pixel' per tile."""
        return Affine(self.tile_size, 0, self.x_min, 0, -self.tile_size, self.y_max)

    def tile(self, row: int, col: int) -> Tile:
        """The tile at (row, col)."""
        if not (0 <= row < self.n_rows and 0 <= col < self.n_cols):
            raise IndexError(f"{self.city} {self.scale} has no tile r{row} c{col}")
        x0 = self.x_min + col * self.tile_size
        y1 = self.y_max - row * self.tile_size
        return Tile(
            self.city, self.scale, row, col, (x0, y1 - self.tile_size, x0 + self.tile_size, y1)
        )

    def tiles(self) -> Iterator[Tile]:
        """All tiles, row-major from the north-west corner."""
        for row in range(self.n_rows):
            for col in range(self.n_cols):
                yield self.tile(row, col)

    def tile_ids(self) -> list[str]:
        """Tile ids in row-major order (the order of every per-tile array)."""
        return [t.tile_id for t in self.tiles()]


def _snap(value: float) -> float:
    return float(round(value / PARENT_SIZE_M) * PARENT_SIZE_M)


@cache
def city_grid(city: str, scale: Scale) -> TileGrid:
    """The tile grid of a city at a scale, placed around the city's documented centre."""
    spec: CitySpec = get_city(city)
    shape = spec.grid_shape(scale)
    size = TILE_SIZE_M[scale]
    to_utm = Transformer.from_crs("EPSG:4326", f"EPSG:{spec.epsg}", always_xy=True)
    cx, cy = to_utm.transform(spec.centre.lon, spec.centre.lat)
    return TileGrid(
        city=city,
        scale=scale,
        epsg=spec.epsg,
        x_min=_snap(cx - shape.cols * size / 2),
        y_max=_snap(cy + shape.rows * size / 2),
        tile_size=size,
        n_rows=shape.rows,
        n_cols=shape.cols,
    )


def city_grids(city: str) -> dict[Scale, TileGrid]:
    """Both grids of a city."""
    return {scale: city_grid(city, scale) for scale in SCALES}


def city_extent(city: str) -> tuple[float, float, float, float]:
    """Union bounds of a city's grids (lattice-aligned), in its UTM CRS."""
    boxes = np.array([g.bounds for g in city_grids(city).values()])
    return (boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max())


@dataclass(frozen=True)
class PixelGrid:
    """A city's tile-aligned pixel grid at one resolution; every tile is a window of it."""

    city: str
    """City key."""
    epsg: int
    """UTM EPSG code of the city."""
    x_min: float
    """West edge, metres."""
    y_max: float
    """North edge, metres."""
    resolution: float
    """Pixel size, metres; divides 1000 so 2 km and 5 km tiles hold whole pixels."""
    width: int
    """Columns."""
    height: int
    """Rows."""

    @property
    def crs(self) -> str:
        """CRS as an authority string."""
        return f"EPSG:{self.epsg}"

    @property
    def transform(self) -> Affine:
        """Affine transform of the whole grid."""
        return Affine(self.resolution, 0, self.x_min, 0, -self.resolution, self.y_max)

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width)."""
        return (self.height, self.width)

    def window(self, tile: Tile) -> tuple[int, int, int, int]:
        """(row_off, col_off, height, width) of a tile inside this grid."""
        xmin, _, xmax, ymax = tile.bounds
        row_off = round((self.y_max - ymax) / self.resolution)
        col_off = round((xmin - self.x_min) / self.resolution)
        size = round((xmax - xmin) / self.resolution)
        return (row_off, col_off, size, size)

    def x_coords(self) -> np.ndarray:
        """Pixel-centre eastings."""
        return self.x_min + (np.arange(self.width) + 0.5) * self.resolution

    def y_coords(self) -> np.ndarray:
        """Pixel-centre northings (north to south)."""
        return self.y_max - (np.arange(self.height) + 0.5) * self.resolution


def pixel_grid(city: str, resolution: float) -> PixelGrid:
    """The city's pixel grid covering both tile grids at ``resolution`` metres."""
    if 1000 % resolution:
        raise ValueError(
            f"chip resolution {resolution} m must divide 1000 m so that 2 km and 5 km tiles "
            "hold a whole number of pixels"
        )
    xmin, ymin, xmax, ymax = city_extent(city)
    return PixelGrid(
        city=city,
        epsg=get_city(city).epsg,
        x_min=xmin,
        y_max=ymax,
        resolution=float(resolution),
        width=round((xmax - xmin) / resolution),
        height=round((ymax - ymin) / resolution),
    )


def snapped_grid(
    crs: CRS,
    bounds: tuple[float, float, float, float],
    res_xy: tuple[float, float],
    origin_xy: tuple[float, float],
) -> GeoBox:
    """The smallest window of a product's pixel lattice (a corner ``origin_xy``, pixel size)
    that contains ``bounds``: what every adapter family writes a source item on, so no pixel
    is resampled."""
    res_x, res_y = res_xy
    ox, oy = origin_xy
    xmin, ymin, xmax, ymax = bounds
    col0 = math.floor((xmin - ox) / res_x + 1e-9)
    col1 = math.ceil((xmax - ox) / res_x - 1e-9)
    row0 = math.floor((oy - ymax) / res_y + 1e-9)
    row1 = math.ceil((oy - ymin) / res_y - 1e-9)
    transform = Affine(res_x, 0, ox + col0 * res_x, 0, -res_y, oy - row0 * res_y)
    return GeoBox((row1 - row0, col1 - col0), transform, crs)


def whole_pixels(value: float, what: str) -> int:
    """``value`` as an int, insisting it is whole (a grid that does not nest is a spec error)."""
    rounded = round(value)
    if not math.isclose(value, rounded, rel_tol=0, abs_tol=1e-6):
        raise ValueError(
            f"{what} = {value} is not a whole number of pixels; pick a resolution "
            "that divides the 10 km lattice"
        )
    return int(rounded)
