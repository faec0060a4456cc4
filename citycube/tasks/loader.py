"""Sampled translation instances resolved to arrays on demand.

``InstanceLoader`` has ``len`` and integer indexing, which is all a PyTorch ``Dataset`` needs
to wrap it (the project itself does not depend on torch). Image modalities come from the Zarr
chip stores (the tile's window of values and its validity mask); numeric ones from the
observations, in the catalogue's field order. The lookups are read once through DuckDB; the
pixels are read only when an instance is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from citycube.catalogue.modalities import Catalogue, load_catalogue
from citycube.cube.release import Release
from citycube.items.rasters import transformer


@dataclass(frozen=True)
class ModalityValue:
    """One modality at one key, ready for a model."""

    modality: str
    """Modality code."""
    fields: tuple[str, ...]
    """Band names (images) or field names (numeric), in the order of ``values``."""
    values: np.ndarray
    """(bands, height, width) for images, (fields,) for numeric modalities."""
    valid: np.ndarray | None
    """(height, width) validity of an image chip; None for numeric modalities."""


@dataclass(frozen=True)
class GridContext:
    """Where and when an instance is: the context c of the paper's f(x, c) (AgenticCity-Bench
    App. C), with the tile's WGS84 bounds and centre so a model needs no grid of its own."""

    city: str
    year: int
    scale: str
    tile_id: str
    row: int
    """Tile row in its city grid, 0 at the north edge."""
    col: int
    """Tile column, 0 at the west edge."""
    epsg: int
    """The city's UTM zone."""
    bounds_wgs84: tuple[float, float, float, float]
    """(lon_min, lat_min, lon_max, lat_max) of the tile's (densified) outline."""
    centre_wgs84: tuple[float, float]
    """(lon, lat) of the tile's UTM centre."""


@dataclass(frozen=True)
class Instance:
    """A translation instance with its source and target resolved."""

    instance_id: int
    """Row id in ``instances.parquet``."""
    split: str
    """train, val or test."""
    key: tuple[str, str, str, int]
    """(city, scale, tile_id, year)."""
    source: ModalityValue
    """What the model is given."""
    target: ModalityValue
    """What it must produce."""
    context: GridContext
    """City, year, scale and the tile's position."""


@lru_cache(maxsize=64)
def chip_group(path: str) -> Any:
    """The chip store at ``path`` opened as a Zarr group, kept open for the next read of it."""
    from citycube.cube.chips import open_chip_group

    return open_chip_group(Path(path))


class InstanceLoader:
    """Instances of a release (optionally one split), resolved on demand."""

    def __init__(
        self,
        release: Release,
        split: str | None = None,
        catalogue: Catalogue | None = None,
        instances: pa.Table | None = None,
    ) -> None:
        from citycube.tasks.translation import BenchmarkFiles, published_connection

        self.release = release
        self.catalogue = catalogue or load_catalogue()
        table = instances
        if table is None:
            table = pq.read_table(BenchmarkFiles.published(release).instances)
        if split is not None:
            table = table.filter(pc.equal(table["split"], split))
        self.instances = table
        self.rows = table.to_pylist()
        """The instances' rows as dicts, in table order."""
        needed = pa.table(
            {
                "tile_id": pa.concat_arrays(
                    [table["tile_id"].combine_chunks(), table["tile_id"].combine_chunks()]
                ),
                "year": pa.concat_arrays(
                    [table["year"].combine_chunks(), table["year"].combine_chunks()]
                ),
                "modality": pa.concat_arrays(
                    [table["source"].combine_chunks(), table["target"].combine_chunks()]
                ),
            }
        )
        with published_connection(release) as con:
            con.register("_needed", needed)
            chips = con.execute(
                """
                SELECT c.tile_id, c.year, c.modality, c.store,
                       c.row_off, c.col_off, c.height, c.width
                FROM chip_index AS c
                SEMI JOIN (SELECT DISTINCT * FROM _needed) AS n
                  ON c.tile_id = n.tile_id AND c.year = n.year AND c.modality = n.modality
                """
            ).fetchall()
            numbers = con.execute(
                """
                SELECT o.tile_id, o.year, o.modality, o.field, o.value
                FROM observations AS o
                SEMI JOIN (SELECT DISTINCT * FROM _needed) AS n
                  ON o.tile_id = n.tile_id AND o.year = n.year AND o.modality = n.modality
                """
            ).fetchall()
            tiles = con.execute(
                """
                SELECT tile_id, "row", col, epsg, lon_min, lat_min, lon_max, lat_max,
                       (utm_xmin + utm_xmax) / 2, (utm_ymin + utm_ymax) / 2
                FROM tiles
                WHERE tile_id IN (SELECT DISTINCT tile_id FROM _needed)
                """
            ).fetchall()
        self._tiles = {t[0]: _tile_place(*t) for t in tiles}
        self._chips = {(t, y, m): (s, r, c, h, w) for t, y, m, s, r, c, h, w in chips}
        self._numbers: dict[tuple[str, int, str], dict[str, float]] = {}
        for t, y, m, f, v in numbers:
            self._numbers.setdefault((t, y, m), {})[f] = np.nan if v is None else v

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Instance:
        row = self.rows[index]
        key = (row["city"], row["scale"], row["tile_id"], row["year"])
        return Instance(
            instance_id=row["instance_id"],
            split=row["split"],
            key=key,
            source=self.resolve(row["tile_id"], row["year"], row["source"]),
            target=self.resolve(row["tile_id"], row["year"], row["target"]),
            context=self.context(*key),
        )

    def context(self, city: str, scale: str, tile_id: str, year: int) -> GridContext:
        """The grid context of a key."""
        place = self._tiles.get(tile_id)
        if place is None:
            raise KeyError(f"tile {tile_id} is not in the release's tiles table")
        row, col, epsg, bounds, centre = place
        return GridContext(city, year, scale, tile_id, row, col, epsg, bounds, centre)

    def __iter__(self) -> Iterator[Instance]:
        for i in range(len(self)):
            yield self[i]

    def resolve(self, tile_id: str, year: int, modality: str) -> ModalityValue:
        """One modality at one key: its chip window, or its numeric fields."""
        spec = self.catalogue.get(modality)
        if spec.is_image:
            where = self._chips.get((tile_id, year, modality))
            if where is None:
                raise KeyError(f"no chip of {modality} for {tile_id} {year} in the chip index")
            store, row, col, height, width = where
            group = chip_group(str(Path(self.release.root) / store))
            values = np.asarray(group["data"][:, row : row + height, col : col + width])
            valid = np.asarray(group["valid"][row : row + height, col : col + width]).astype(bool)
            names = tuple(str(b) for b in np.asarray(group["band"][:]))
            return ModalityValue(modality, names, values, valid)
        found = self._numbers.get((tile_id, year, modality))
        if found is None:
            raise KeyError(f"no observation of {modality} for {tile_id} {year}")
        names = tuple(f.name for f in spec.fields)
        values = np.array([found.get(n, np.nan) for n in names], dtype=np.float64)
        return ModalityValue(modality, names, values, None)


def _tile_place(
    tile_id: str,
    row: int,
    col: int,
    epsg: int,
    lon_min: float,
    lat_min: float,
    lon_max: float,
    lat_max: float,
    x_centre: float,
    y_centre: float,
) -> tuple[int, int, int, tuple[float, float, float, float], tuple[float, float]]:
    lon, lat = transformer(f"EPSG:{epsg}", "EPSG:4326").transform(x_centre, y_centre)
    return row, col, epsg, (lon_min, lat_min, lon_max, lat_max), (float(lon), float(lat))
