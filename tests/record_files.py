"""Small real record files for loopback portals, and the tile geometry to place their records.

Shared by the connector tests (``tests/test_record_bulk_files.py``) and the records end-to-end
build (``tests/test_e2e_records.py``): NSW Valuer General sales records (B records in weekly
``.DAT`` files), a DESNZ-style xlsx workbook, and a city's 2 km tiles as UTM boxes and lon/lat
points, so that expected tile values follow from where a test put each record, not from the
code that places it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import geopandas as gpd
import shapely
from openpyxl import Workbook
from pyproj import Transformer

from citycube.grid.tiles import TileGrid, city_grid


@dataclass(frozen=True)
class CityTiles:
    """A city's 2 km grid, for putting test records on known tiles."""

    city: str

    @cached_property
    def grid(self) -> TileGrid:
        return city_grid(self.city, "2km")

    @cached_property
    def _to_lonlat(self) -> Transformer:
        return Transformer.from_crs(self.grid.epsg, 4326, always_xy=True)

    def box(self, row: int, col: int) -> tuple[float, float, float, float]:
        """UTM bounds of a tile, from the grid's north-west origin and 2 km steps."""
        x0 = self.grid.x_min + col * 2000.0
        y1 = self.grid.y_max - row * 2000.0
        return x0, y1 - 2000.0, x0 + 2000.0, y1

    def lonlat(self, x: float, y: float) -> tuple[float, float]:
        lon, lat = self._to_lonlat.transform(x, y)
        return float(lon), float(lat)

    def point_lonlat(self, row: int, col: int, east: float, north: float) -> tuple[float, float]:
        """The point ``east`` and ``north`` metres from a tile's south-west corner."""
        x0, y0, _, _ = self.box(row, col)
        return self.lonlat(x0 + east, y0 + north)

    def centre_lonlat(self, row: int, col: int) -> tuple[float, float]:
        return self.point_lonlat(row, col, 1000.0, 1000.0)

    def index(self, row: int, col: int) -> int:
        """Position of a tile in the grid's row-major arrays."""
        return row * self.grid.n_cols + col

    def tile_id(self, row: int, col: int) -> str:
        return self.grid.tile(row, col).tile_id

    def polygons_geojson(self, named: dict[str, shapely.Polygon], key: str) -> bytes:
        """UTM polygons as lon/lat GeoJSON with their names in column ``key`` (edges densified,
        so the reprojected shapes keep their areas)."""
        frame = gpd.GeoDataFrame(
            {key: list(named)},
            geometry=[shapely.segmentize(p, 50) for p in named.values()],
            crs=self.grid.epsg,
        )
        return frame.to_crs(4326).to_json().encode()

    def block_geojson(self, rows: range, cols: range) -> bytes:
        """A coverage polygon equal to a block of tiles."""
        x0, y0, _, _ = self.box(rows.stop - 1, cols.start)
        _, _, x1, y1 = self.box(rows.start, cols.stop - 1)
        block = shapely.segmentize(shapely.box(x0, y0, x1, y1), 50)
        frame = gpd.GeoDataFrame(geometry=[block], crs=self.grid.epsg)
        return frame.to_crs(4326).to_json().encode()


# ------------------------------------------------------------------ NSW property sales (.DAT)


def b_record(
    property_id: int, counter: int, lodged: str, postcode: str, contract: str, price: str
) -> str:
    """A current-format B record (24 fields and the trailing ';'), dealing AA<property id>."""
    fields = ["B", "001", str(property_id), str(counter), f"{lodged} 01:07", "", "", "1"]
    fields += ["MAIN ST", "SYDNEY", postcode, "450", "M", contract, contract, price, "R2", "R"]
    fields += ["RESIDENCE", "", "", "", "", f"AA{property_id}"]
    return ";".join(fields) + ";"


def dat_file(lodged: str, *lines: str) -> bytes:
    """A weekly file: A header, the lines (each B followed by its C and D records), Z trailer."""
    out = [f"A;RTSALEDATA;001;{lodged} 01:07;VALNET;"]
    for line in lines:
        out.append(line)
        if line.startswith("B;") and len(line.split(";")) > 20:
            pid = line.split(";")[2]
            out.append(f"C;001;{pid};1;{lodged} 01:07;1/DP{pid};")
            out.append(f"D;001;{pid};1;{lodged} 01:07;P;;;;;;")
            out.append(f"D;001;{pid};1;{lodged} 01:07;V;;;;;;")
    out.append(f"Z;{len(out) + 1};{sum(line.startswith('B;') for line in lines)};")
    return ("\r\n".join(out) + "\r\n").encode()


# ---------------------------------------------------------------------- DESNZ-style xlsx


def workbook_bytes(sheets: dict[str, tuple[int, list[list[Any]]]]) -> bytes:
    """An xlsx with, per sheet, notes down to the header row, the header (names broken over
    lines as the publisher prints them), the rows, a blank row and a footnote. Rows are
    (local authority code, LSOA code, meters, total kWh, mean kWh per meter)."""
    book = Workbook()
    book.remove(book.active)
    for name, (header_row, rows) in sheets.items():
        sheet = book.create_sheet(name)
        sheet.append([f"LSOA domestic electricity consumption, {name}"])
        for note in range(header_row - 2):
            sheet.append([f"Note {note + 1}: figures are not weather corrected"])
        sheet.append(
            [
                "Local authority code",
                "LSOA code",
                "Number\nof meters\n",
                "Total \nconsumption\n(kWh)",
                "Mean \nconsumption\n(kWh per meter)",
            ]
        )
        for row in rows:
            sheet.append(row)
        sheet.append([])
        sheet.append(["Source: loopback statistics"])
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()
