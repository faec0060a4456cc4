"""Format-faithful GLC_FCS30D tiles and 3D-GloBFP footprint tiles for loopback servers.

Shared by the adapters' unit tests (``tests/test_http_glc_globfp.py``) and the end-to-end build
(``tests/test_e2e_glc_globfp.py``). GLC: each served tile is a crop of the provider's 5° tile
on its own 30 m lattice (origin on the named north-west corner), 23 bands (2000-2022), zipped
with the other tiles of its 10° band under the provider's names. GloBFP: figshare-style JSON
file listings naming zipped shapefile tiles whose names carry their extent.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import geopandas as gpd
import numpy as np
import pyogrio
import rasterio
import shapely
from affine import Affine

from sources.http.base import city_window
from sources.http.ghsl import tiles_covering
from sources.http.glc import tile_name, tile_west, zone_name
from sources.http.spec import load_http_products, load_http_vector_products
from tests.faulty_http_server import FaultyServer

GLC = load_http_products()["glc_fcs30d"]
GLOBFP = load_http_vector_products()["globfp_height"]
RES = GLC.resolution
TILE_PIXELS = 18554
"""Pixels along a side of a served tile at most (5° is 18553.2 pixels of 30 m)."""
CLASSES = np.array([10, 62, 130, 190, 210, 0, 250, 182], dtype=np.uint8)
"""Block classes a tile is painted with: 0 and 250 are the provider's fill values."""
FILL_VALUES = (0, 250)

Painter = Callable[[Affine, int, int, int], np.ndarray]
"""(crop transform, rows, cols, tile index) -> the year's uint8 classes of a tile crop."""


def tile_crop(west: float, north: float, bounds: tuple[float, ...]) -> tuple[Affine, int, int]:
    """A crop of tile (west, north) around ``bounds`` on the tile's own 30 m lattice."""
    c0 = max(math.floor((bounds[0] - west) / RES) - 3, 0)
    c1 = min(math.ceil((bounds[2] - west) / RES) + 3, TILE_PIXELS)
    r0 = max(math.floor((north - bounds[3]) / RES) - 3, 0)
    r1 = min(math.ceil((north - bounds[1]) / RES) + 3, TILE_PIXELS)
    return Affine(RES, 0, west + c0 * RES, 0, -RES, north - r0 * RES), c1 - c0, r1 - r0


def painted(rows: int, cols: int, seed: int) -> np.ndarray:
    """Classes in blocks of 40 x 40 pixels (compressible), fill values among them."""
    rng = np.random.default_rng(seed)
    blocks = rng.choice(CLASSES, size=(rows // 40 + 1, cols // 40 + 1))
    return np.kron(blocks, np.ones((40, 40), dtype=np.uint8))[:rows, :cols]


def glc_tile_bytes(transform: Affine, values_year: np.ndarray, year: int = 2020) -> bytes:
    """A 23-band tile (2000-2022): ``year`` holds the values, every other year class 120."""
    rows, cols = values_year.shape
    with rasterio.MemoryFile() as memory:
        profile = {
            "driver": "GTiff",
            "width": cols,
            "height": rows,
            "count": 23,
            "dtype": "uint8",
            "crs": "EPSG:4326",
            "transform": transform,
            "compress": "DEFLATE",
            "tiled": True,
        }
        with memory.open(**profile) as dst:
            for band in range(1, 24):
                data = values_year if 1999 + band == year else np.full((rows, cols), 120, np.uint8)
                dst.write(data, band)
        return bytes(memory.read())


def zip_of(members: dict[str, bytes]) -> bytes:
    """A deflated zip holding ``members`` (name -> bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def serve_glc(
    server: FaultyServer, city: str, paint: Painter, year: int = 2020
) -> dict[str, tuple[Affine, np.ndarray]]:
    """Every tile meeting the city window, cropped around it, in its zone's zip under the
    provider's names (plus the 1985-2000 file the adapter must not read); tile name ->
    (crop transform, the year's classes), in the order the adapter reads them."""
    assert GLC.tile_grid is not None
    bounds = city_window(city, GLC).boundingbox.bbox
    zips: dict[str, dict[str, bytes]] = {}
    served: dict[str, tuple[Affine, np.ndarray]] = {}
    for index, (row, col) in enumerate(tiles_covering(bounds, GLC.tile_grid)):
        name = tile_name(row, col, GLC.tile_grid)
        west = tile_west(col, GLC.tile_grid)
        north = round(GLC.tile_grid.origin_xy[1] - (row - 1) * GLC.tile_grid.tile_size)
        transform, cols, rows = tile_crop(west, north, bounds)
        values = paint(transform, rows, cols, index)
        folder = f"GLC_FCS30D_19852022maps_{zone_name(west)}"
        members = zips.setdefault(folder, {})
        members[f"{folder}/GLC_FCS30D_20002022_{name}_Annual_V1.1.tif"] = glc_tile_bytes(
            transform, values, year
        )
        members[f"{folder}/GLC_FCS30D_19852000_{name}_5years_V1.1.tif"] = b"not read"
        served[name] = (transform, values)
    for folder, members in zips.items():
        server.add(f"{folder}.zip", zip_of(members))
    return served


def serve_london_glc(server: FaultyServer) -> dict[str, tuple[Affine, np.ndarray]]:
    """London's tiles W5N55 and E0N55 (zips W5-W10 and E0-E5), painted in random blocks."""
    return serve_glc(server, "London", lambda _t, rows, cols, index: painted(rows, cols, index))


def class_at(
    served: dict[str, tuple[Affine, np.ndarray]], lon: np.ndarray, lat: np.ndarray
) -> np.ndarray:
    """By hand: the served class at each point (float, NaN where no crop covers it), the
    first tile winning where crops overlap, as the adapter places them."""
    out = np.full(np.shape(lon), np.nan)
    done = np.zeros(np.shape(lon), dtype=bool)
    for transform, values in served.values():
        cols = np.floor((lon - transform.c) / transform.a).astype(int)
        rows = np.floor((transform.f - lat) / -transform.e).astype(int)
        inside = (cols >= 0) & (cols < values.shape[1]) & (rows >= 0) & (rows < values.shape[0])
        take = inside & ~done
        out[take] = values[rows[take], cols[take]]
        done |= inside
    return out


# ------------------------------------------------------------------------------- 3D-GloBFP


def shapefile_zip(frame: gpd.GeoDataFrame, stem: str, folder: Path) -> bytes:
    """A zip holding a shapefile (.shp .shx .dbf .prj) of ``frame``."""
    out = folder / f"shp_{stem}"
    out.mkdir(parents=True)
    pyogrio.write_dataframe(frame, out / f"{stem}.shp", driver="ESRI Shapefile")
    return zip_of({p.name: p.read_bytes() for p in sorted(out.iterdir())})


def square(lon: float, lat: float, side_m: float) -> shapely.Polygon:
    """A square footprint of ``side_m`` metres (near Amsterdam) with its south-west at lon/lat."""
    dlat = side_m / 111_320.0
    dlon = side_m / (111_320.0 * math.cos(math.radians(lat)))
    return shapely.box(lon, lat, lon + dlon, lat + dlat)


Building = tuple[float, float, float, float | None]
"""(lon, lat, side m, Height or None)."""

BUILDINGS: list[Building] = [
    (4.80, 52.30, 120.0, 12.5),
    (4.83, 52.32, 90.0, 48.0),
    (4.86, 52.34, 60.0, 0.0),  # zero is a valid height
    (4.88, 52.31, 80.0, None),  # no height: cut out of the coverage
    (4.90, 52.33, 70.0, -3.0),  # out of range: cut out too
    (3.50, 52.30, 50.0, 9.0),  # outside the city window: not in the item
]
GLOBFP_TILE = "1234_4_52_5_53_Europe.zip"
"""The one listed tile: 4-5° E, 52-53° N (5-6° E is listed nowhere)."""


def serve_globfp(
    server: FaultyServer, folder: Path, buildings: Sequence[Building] = BUILDINGS
) -> None:
    """One listed tile (4-5° E, 52-53° N) meeting Amsterdam; the fourth listing names it, the
    sixth names the same tile id again (a duplicate the adapter leaves out)."""
    frame = gpd.GeoDataFrame(
        {"Height": [b[3] for b in buildings]},
        geometry=[square(b[0], b[1], b[2]) for b in buildings],
        crs="EPSG:4326",
    )
    stem = GLOBFP_TILE.removesuffix(".zip")
    server.add(f"/files/{GLOBFP_TILE}", shapefile_zip(frame, stem, folder))
    listing = [{"id": 1, "name": GLOBFP_TILE, "download_url": server.url(f"/files/{GLOBFP_TILE}")}]
    for i, path in enumerate(GLOBFP.listing.listings):
        entries = listing if i == 3 else []
        if i == 5:  # the same tile id in another part: the first is kept
            entries = [{"id": 2, "name": GLOBFP_TILE, "download_url": server.url("/dup.zip")}]
        server.add(path.split("?")[0], json.dumps(entries).encode())
