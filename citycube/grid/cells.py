"""The median of cell medians: a tile rule computed on a lattice of cells finer than the tiles.

A field declaring ``aggregation: {rule: median_of_cell_medians, cell_m: …}`` is reduced in two
steps. Each tile is cut into square cells of ``cell_m`` on the tile lattice (the cells of a
grid start at its north-west corner, so a 2 km tile holds 4 × 4 cells of 500 m and a 5 km tile
10 × 10). A cell's median is the median of the valid values placed in it; the tile's value is
the median of the medians of its cells that hold at least one value. Medians follow
``numpy.median``: an even count averages its two middle values.

Where a value lies is decided by the caller (a pixel's centre, a record's point, an admin
unit's cells; see ``citycube.processing.aggregate.cell_median_tiles`` and
``citycube.processing.records.tile_cell_medians``); this module only places points on the lattice
and takes the medians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from citycube.grid.tiles import TileGrid

__all__ = ["CellLattice", "grouped_medians", "median_of_cell_medians"]


@dataclass(frozen=True)
class CellLattice:
    """The cells of ``cell_m`` metres that every tile of ``grid`` is cut into."""

    grid: TileGrid
    """The tile grid the cells nest in."""
    cell_m: int
    """Cell edge, metres; divides the grid's tile size."""

    def __post_init__(self) -> None:
        if self.cell_m <= 0 or self.grid.tile_size % self.cell_m:
            raise ValueError(
                f"cells of {self.cell_m} m do not divide the {self.grid.tile_size} m tiles of "
                f"{self.grid.city} {self.grid.scale}"
            )

    @property
    def per_tile(self) -> int:
        """Cells along one side of a tile."""
        return self.grid.tile_size // self.cell_m

    @property
    def n_rows(self) -> int:
        """Cell rows over the whole grid."""
        return self.grid.n_rows * self.per_tile

    @property
    def n_cols(self) -> int:
        """Cell columns over the whole grid."""
        return self.grid.n_cols * self.per_tile

    def cell_index(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Row-major cell index of each point (city CRS), −1 outside the grid.

        A point on a cell edge belongs to the cell east or south of it, as with tiles
        (``citycube.processing.vectors.tile_index``), so no point counts in two cells.
        """
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            col = np.floor((x - self.grid.x_min) / self.cell_m)
            row = np.floor((self.grid.y_max - y) / self.cell_m)
            inside = (col >= 0) & (col < self.n_cols) & (row >= 0) & (row < self.n_rows)
        index = np.full(x.shape, -1, dtype=np.int64)
        index[inside] = row[inside].astype(np.int64) * self.n_cols + col[inside].astype(np.int64)
        return index

    def tile_of(self, cells: np.ndarray) -> np.ndarray:
        """Row-major tile index (the grid's tile order) of each cell index."""
        row, col = np.divmod(np.asarray(cells, dtype=np.int64), self.n_cols)
        return (row // self.per_tile) * self.grid.n_cols + col // self.per_tile

    def centres(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of every cell's centre in row-major cell order."""
        xs = self.grid.x_min + (np.arange(self.n_cols) + 0.5) * self.cell_m
        ys = self.grid.y_max - (np.arange(self.n_rows) + 0.5) * self.cell_m
        x, y = np.meshgrid(xs, ys)
        return x.ravel(), y.ravel()


def grouped_medians(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys, ascending, and the median of each key's values.

    One sort for all groups: within each group the middle value (or the mean of the two middle
    values of an even group) is read off the sorted order, exactly as ``numpy.median`` would
    give it for that group alone.
    """
    keys = np.asarray(keys)
    values = np.asarray(values, dtype=np.float64)
    if keys.shape != values.shape or keys.ndim != 1:
        raise ValueError(f"keys {keys.shape} and values {values.shape} must be equal 1-D arrays")
    if keys.size == 0:
        return keys[:0], values[:0]
    order = np.lexsort((values, keys))
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    counts = np.diff(np.append(starts, keys.size))
    low = values[starts + (counts - 1) // 2]
    high = values[starts + counts // 2]
    return keys[starts], (low + high) / 2


def median_of_cell_medians(
    lattice: CellLattice, cells: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Tiles with at least one valued cell (ascending indices) and their median of cell medians.

    Args:
        lattice: The cells of the tile grid.
        cells: Cell index of each value (``CellLattice.cell_index``); values at −1 are outside
            the grid and left out.
        values: Valid values only (finite, already masked by the validity rules).
    """
    cells = np.asarray(cells, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    keep = cells >= 0
    cell_ids, cell_medians = grouped_medians(cells[keep], values[keep])
    return grouped_medians(lattice.tile_of(cell_ids), cell_medians)
