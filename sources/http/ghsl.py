"""GHSL R2023A epochs (GHS-POP 1 km, GHS-BUILT-V 100 m) from the JRC's zipped Mollweide tiles.

The tiles covering the city window are chosen from the GHSL tile grid (1000 km tiles numbered
R{row}_C{col} from the north-west corner), downloaded, unzipped and pasted onto the window.
GHS-BUILT-V's total and non-residential volumes come as separate tile sets; they become bands
1 and 2 of one file, as in the sample twin. Tiles the server does not have (all-sea tiles are
not published) leave their cells nodata, never zero; when none of a city's tiles exists the URL
is wrong, and the fetch fails.
"""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from odc.geo.geobox import GeoBox

from citycube.errors import SourceFetchError
from sources.downloads import redact_url
from sources.http.base import (
    Assembled,
    HttpSource,
)
from sources.http.spec import FileTiling


def tiles_covering(
    bounds: tuple[float, float, float, float], grid: FileTiling
) -> list[tuple[int, int]]:
    """(row, col) of every tile, numbered from 1, that a box in the product CRS touches."""
    xmin, ymin, xmax, ymax = bounds
    ox, oy = grid.origin_xy
    size = grid.tile_size
    col0 = math.floor((xmin - ox) / size) + 1
    col1 = math.ceil((xmax - ox) / size)
    row0 = math.floor((oy - ymax) / size) + 1
    row1 = math.ceil((oy - ymin) / size)
    rows = range(max(row0, 1), min(row1, grid.rows) + 1)
    cols = range(max(col0, 1), min(col1, grid.cols) + 1)
    return [(row, col) for row in rows for col in cols]


class GhslTiles(HttpSource):
    """A GHSL product whose epochs are mosaics of zipped tiles."""

    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """Each variable's tiles pasted onto the city window (missing tiles stay NaN)."""
        assert self.spec.tile_grid is not None
        tiles = tiles_covering(grid.boundingbox.bbox, self.spec.tile_grid)
        values: dict[str, np.ndarray] = {}
        served: list[dict[str, object]] = []
        missing: list[str] = []
        for variable in self.spec.variables:
            mosaic = np.full(grid.shape, np.nan)
            found = 0
            for row, col in tiles:
                url = self.url(variable, year, row=row, col=col)
                try:
                    got = self.download(url, city, year)
                except SourceFetchError as exc:
                    if exc.status == 404:
                        missing.append(urlsplit(url).path.rsplit("/", 1)[-1])
                        continue
                    raise
                with self.open_served(got, url, city, year, scratch) as ds:
                    self.read_served(ds, variable, grid, url, city, year, into=mosaic)
                served.append({"url": redact_url(url), "sha256": got.sha256, "bytes": got.size})
                found += 1
            if found == 0:
                raise SourceFetchError(
                    f"{self.info.source_id}: {city} {year}: none of the {len(tiles)} GHSL tiles "
                    f"covering the city exists on {redact_url(self.base_url)} (e.g. "
                    f"{redact_url(self.url(variable, year, row=tiles[0][0], col=tiles[0][1]))}); "
                    "the base URL or path template in schemas/http_products.yaml is wrong",
                    transient=False,
                    status=404,
                )
            values[variable.name] = mosaic
        notes = {"tiles": " ".join(f"R{r}_C{c}" for r, c in tiles)}
        if missing:
            notes["missing_tiles"] = " ".join(sorted(set(missing)))
        return Assembled(grid, values, served, notes)
