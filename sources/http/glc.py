"""GLC_FCS30D annual land cover from the provider's zips of 5° tiles.

A city's tiles are named from the 5° tile grid by their north-west corner (``E105N25`` covers
105-110° E, 20-25° N); each sits, with the other tiles of its 10° band of longitude, in one zip
that is downloaded once through the shared manager and read in place (``/vsizip/``). A tile is
a 23-band GeoTIFF, one band per year from 2000.

Five degrees is no whole number of the product's 30 m pixels, so tiles do not share one global
lattice. The item is written on the lattice of the first tile read (its own geotransform), and
every tile's pixels are placed on it by nearest neighbour: class ids are never blended, and a
tile on the same lattice is copied unchanged. The provider's fill values (0 and 250) and any
nodata the file declares become the twin's nodata (255), never a class; how many cells that
touched is recorded with the item.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import numpy as np
import rasterio
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.crs import CRS as RioCRS
from rasterio.errors import RasterioError
from rasterio.warp import Resampling, reproject
from rasterio.windows import Window, from_bounds

from citycube.errors import SourceFetchError, SourceReadError
from citycube.grid.tiles import snapped_grid
from sources.downloads import Downloaded, redact_url
from sources.http.base import (
    Assembled,
    HttpSource,
)
from sources.http.ghsl import tiles_covering
from sources.http.spec import FileTiling, Variable

NO_SOURCE = -1
"""Marks item cells no tile covers while tiles are placed (raw values are 0-255)."""


def tile_name(row: int, col: int, grid: FileTiling) -> str:
    """The name of tile (row, col), counted from 1 at the north-west: its north-west corner."""
    west = tile_west(col, grid)
    north = round(grid.origin_xy[1] - (row - 1) * grid.tile_size)
    return f"{'E' if west >= 0 else 'W'}{abs(west)}{'N' if north >= 0 else 'S'}{abs(north)}"


def zone_name(west: int) -> str:
    """The zip band holding the tile whose west edge is ``west``: east of 0° the bands start
    at multiples of 10 (E100-E105 holds E100 and E105), west of it at odd fives (W5-W10 holds
    W5, i.e. 5° W-0°, and W10)."""
    if west >= 0:
        start = 10 * (west // 10)
        return f"E{start}-E{start + 5}"
    start = 10 * math.ceil(-west / 10) - 5
    return f"W{start}-W{start + 5}"


def tile_west(col: int, grid: FileTiling) -> int:
    """West edge of the tiles of column ``col`` (counted from 1) in whole degrees."""
    return round(grid.origin_xy[0] + (col - 1) * grid.tile_size)


class GlcTiles(HttpSource):
    """GLC_FCS30D: one band per year of 5° tiles, packed in 10° zips."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """The year's band of every tile meeting the city window, on one tile's lattice."""
        del scratch
        assert self.spec.tile_grid is not None
        variable = self.spec.variables[0]
        tiles = tiles_covering(grid.boundingbox.bbox, self.spec.tile_grid)
        names = [tile_name(r, c, self.spec.tile_grid) for r, c in tiles]
        out_grid: GeoBox | None = None
        served_raw: np.ndarray | None = None
        served: list[dict[str, object]] = []
        missing: list[str] = []
        resampled: list[str] = []
        zips_found = 0
        for (_, col), name in zip(tiles, names, strict=True):
            zone = zone_name(tile_west(col, self.spec.tile_grid))
            url = self.url(variable, year, tile=name, zone=zone)
            try:
                got = self.download(url, city, year)
            except SourceFetchError as exc:
                if exc.status == 404:
                    missing.append(f"{name} (no {PurePosixPath(urlsplit(url).path).name})")
                    continue
                raise
            zips_found += 1
            member_name = variable.member.format(tile=name) if variable.member else ""
            member = self._member(got, url, city, year, member_name)
            if member is None:
                missing.append(f"{name} (not in {PurePosixPath(urlsplit(url).path).name})")
                continue
            with self._open_member(got, url, city, year, member) as ds:
                if out_grid is None:
                    out_grid = self._item_grid(ds, grid)
                    served_raw = np.full(out_grid.shape, NO_SOURCE, dtype=np.int16)
                assert served_raw is not None
                same = self._place(ds, variable, year, out_grid, served_raw, url, city, member)
                if not same:
                    resampled.append(name)
            served.append(
                {
                    "url": redact_url(url),
                    "sha256": got.sha256,
                    "bytes": got.size,
                    "member": member,
                    "band": self._band(variable, year),
                }
            )
        if out_grid is None or served_raw is None:
            raise SourceFetchError(
                f"{self.info.source_id}: {city} {year}: none of the tiles {', '.join(names)} "
                f"covering the city was found on {redact_url(self.base_url)} "
                f"({zips_found} zip(s) found; missing: {'; '.join(missing)}); the base URL, "
                "path or member template in schemas/http_products.yaml is wrong",
                transient=False,
                status=404,
            )
        values, notes = self._classes(served_raw)
        notes["tiles"] = " ".join(names)
        if missing:
            notes["missing_tiles"] = "; ".join(missing)
        if resampled:
            notes["tiles_placed_by_nearest_neighbour"] = " ".join(resampled)
        return Assembled(out_grid, {variable.name: values}, served, notes)

    # -- served files ---------------------------------------------------------------------

    def _member(self, got: Downloaded, url: str, city: str, year: int, wanted: str) -> str | None:
        """The zip member named ``wanted`` (in any folder), or None when the zip lacks it."""
        try:
            with zipfile.ZipFile(got.path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise self.corrupt(url, city, year, exc) from None
        found = [n for n in names if PurePosixPath(n).name == wanted]
        return found[0] if found else None

    def _open_member(
        self, got: Downloaded, url: str, city: str, year: int, member: str
    ) -> rasterio.DatasetReader:
        try:
            dataset = rasterio.open(f"/vsizip/{{{got.path}}}/{member}")
        except (RasterioError, OSError) as exc:
            raise self.corrupt(url, city, year, f"{member}: {exc}") from None
        try:
            self.check_lattice(dataset, url, city, year)
        except SourceReadError:
            dataset.close()
            raise
        return dataset

    def _band(self, variable: Variable, year: int) -> int:
        first = variable.band_first_year if variable.band_first_year is not None else year
        return year - first + 1

    def _item_grid(self, ds: rasterio.DatasetReader, window: GeoBox) -> GeoBox:
        """The city window on this tile's own lattice (its origin and cell size)."""
        t = ds.transform
        return snapped_grid(CRS.from_epsg(4326), window.boundingbox.bbox, (t.a, -t.e), (t.c, t.f))

    def _place(
        self,
        ds: rasterio.DatasetReader,
        variable: Variable,
        year: int,
        out_grid: GeoBox,
        served_raw: np.ndarray,
        url: str,
        city: str,
        member: str,
    ) -> bool:
        """Put the tile's raw values for the year where no earlier tile put any; True when the
        tile is on the item's lattice (a plain copy)."""
        band = self._band(variable, year)
        if band < 1 or band > ds.count:
            raise SourceReadError(
                f"{self.info.source_id}: {city} {year}: {member} has {ds.count} band(s); year "
                f"{year} would be band {band} (band 1 = {variable.band_first_year}): the file is "
                "not the product's annual tile"
            )
        west, south, east, north = out_grid.boundingbox.bbox
        t = ds.transform
        win = from_bounds(west, south, east, north, t)
        col0 = max(math.floor(win.col_off) - 1, 0)
        row0 = max(math.floor(win.row_off) - 1, 0)
        col1 = min(math.ceil(win.col_off + win.width) + 1, ds.width)
        row1 = min(math.ceil(win.row_off + win.height) + 1, ds.height)
        if col1 <= col0 or row1 <= row0:
            return True
        window = Window(col0, row0, col1 - col0, row1 - row0)
        try:
            raw = ds.read(band, window=window).astype(np.int16)
        except RasterioError as exc:
            raise self.corrupt(url, city, year, f"{member}: {exc}") from None
        placed = np.full(out_grid.shape, NO_SOURCE, dtype=np.int16)
        crs = RioCRS.from_epsg(4326)
        reproject(
            source=raw,
            destination=placed,
            src_transform=ds.window_transform(window),
            src_crs=crs,
            src_nodata=None,
            dst_transform=out_grid.transform,
            dst_crs=crs,
            dst_nodata=NO_SOURCE,
            resampling=Resampling.nearest,
        )
        if ds.nodata is not None:
            placed[(placed == ds.nodata) & (placed != NO_SOURCE)] = -2  # declared nodata
        empty = served_raw == NO_SOURCE
        served_raw[empty] = placed[empty]
        res = out_grid.transform.a
        col_f = (out_grid.transform.c - t.c) / res
        row_f = (t.f - out_grid.transform.f) / res
        return (
            abs(col_f - round(col_f)) < 1e-3
            and abs(row_f - round(row_f)) < 1e-3
            and math.isclose(t.a, res, rel_tol=1e-9)
        )

    def _classes(self, served_raw: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
        """Class ids (float, NaN where invalid) and what was made invalid, for the notes."""
        values = served_raw.astype(np.float64)
        uncovered = served_raw == NO_SOURCE
        declared = served_raw == -2
        fill = np.isin(served_raw, self.spec.fill_values)
        values[uncovered | declared | fill] = np.nan
        for served_id, twin_id in self.spec.variables[0].class_map.items():
            values[served_raw == served_id] = twin_id
        notes: dict[str, str] = {}
        if fill.any():
            counts = ", ".join(
                f"{int(v)}: {int((served_raw == v).sum())}"
                for v in self.spec.fill_values
                if (served_raw == v).any()
            )
            notes["fill_cells"] = (
                f"{int(fill.sum())} cells held the provider's fill values ({counts}); they are "
                f"written as nodata {int(self.spec.nodata)}, not as a class"
            )
        if declared.any():
            notes["nodata_cells"] = f"{int(declared.sum())} cells held the files' declared nodata"
        if uncovered.any():
            notes["uncovered_cells"] = f"{int(uncovered.sum())} cells lie in no tile read"
        return values, notes
