"""Loopback STAC infrastructure: real COGs, a Range-serving file server, ``rustac serve`` and
a SAS token endpoint, all on 127.0.0.1 and started and stopped by the fixtures.

The COGs are laid out like Planetary Computer's ``landsat-c2-l2`` and ``cop-dem-glo-30``: asset
keys, uint16 counts with ``raster:bands`` scale and offset, ``proj:*`` fields, platforms and
blob-storage hrefs. The hrefs name Azure blob storage, as the real items do, so
``planetary_computer``'s URL rules apply; the family's ``mirror`` option then sends the signed
URLs to the local file server, which refuses any request without the token.

Pixel values encode their own position (the pixel's column and row on the zone's 30 m
lattice) plus a little seeded noise, so a misplaced or wrongly reprojected read shows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import requests
from affine import Affine
from pyproj import CRS, Transformer
from rasterio.windows import Window, from_bounds

from pipelines.ports import free_loopback_port
from sources.stac.grids import geographic_grid, landsat_grid
from tests.processes import stop_process

ROOT = Path(__file__).resolve().parents[1]
SR_SCALE, SR_OFFSET = 0.0000275, -0.2
"""Collection 2 surface-reflectance scale and offset."""
ST_SCALE, ST_OFFSET = 0.00341802, 149.0
"""Collection 2 surface-temperature scale and offset (Kelvin)."""
QA_CLEAR_L8 = 21824
"""QA_PIXEL of a clear OLI pixel: clear bit plus low confidences."""
QA_CLEAR_L7 = 5440
"""QA_PIXEL of a clear TM or ETM+ pixel (no cirrus confidence)."""
LANDSAT_ACCOUNT = "landsateuwest"
DEM_ACCOUNT = "elevationeuwest"
BLOB = "blob.core.windows.net"
TOKEN_SECRET = "LoopbackSecret0123456789abcdefXYZ"
"""The signature part of the loopback SAS token: no log, file or message may show it."""
SAS_TOKEN = (
    "st=2026-12-01T00%3A00%3A00Z&se=2026-12-02T00%3A00%3A00Z&sp=rl&sv=2024-05-04&sr=c"
    f"&sig={TOKEN_SECRET}%3D"
)
"""The token the local SAS endpoint hands out; it must never reach a written file."""
CITY = "Boston"
SOUTH_CITY = "CapeTown"
DEM_RES = 6 / 3600
"""Test DEM tiles are 6 arc-second (600 × 600): real GLO-30 is 1″, the lattice logic is the same."""
DAYMET_ACCOUNT = "daymeteuwest"
DAYMET_STORE = "daymet-zarr/annual/na.zarr"
"""Container and path of the annual North America store, as the Planetary Computer names them."""
DAYMET_LCC = (
    "+proj=lcc +lat_1=25 +lat_2=60 +lat_0=42.5 +lon_0=-100 +x_0=0 +y_0=0 +ellps=WGS84 +units=m"
)
DAYMET_X0, DAYMET_Y0 = -4_560_250.0, 4_984_000.0
"""Centre of the first cell of Daymet's North America lattice (x rises, y falls, 1 km)."""
DAYMET_YEARS = (2015, 2016, 2017, 2018, 2019, 2020)
"""Years of the loopback store (the tmax chunk of 2015–2017 under Boston is corrupted)."""
DAYMET_CHUNK = 32
"""Chunk edge of the loopback store (the real one uses far larger chunks)."""
DAYMET_TIME_CHUNK = 3
"""Time steps per chunk: 2015–2017 and 2018–2020 each share their chunks, as years do in a
store chunked along time."""
DAYMET_CORRUPT_YEAR = 2016
DAYMET_CITIES = (CITY, "NYC")
"""Cities the loopback store covers (Boston first: the corrupt chunk and the sea are its)."""


@dataclass(frozen=True)
class SceneSpec:
    """One synthetic Landsat C2 L2 scene of the loopback collection."""

    scene_id: str
    """USGS product id."""
    platform: str
    """landsat-5/7/8/9."""
    epsg: int
    """The scene's UTM zone."""
    top_left_xy: tuple[float, float]
    """Upper-left pixel corner in the scene's CRS."""
    shape: tuple[int, int]
    """(rows, cols)."""
    acquired: datetime
    """Acquisition time."""
    cloud_cover: float
    """eo:cloud_cover (%)."""
    seed: int
    """Shifts values and places clouds."""
    clouds: bool = True
    """Cloud, dilated cloud, shadow, snow, cirrus (OLI) and water patches."""
    slc_off: bool = False
    """Landsat 7 scan-line-corrector gaps (fill stripes)."""
    unscaled: tuple[str, ...] = ()
    """Assets whose ``raster:bands`` leave out scale and offset (a broken item)."""

    @property
    def oli(self) -> bool:
        """OLI/TIRS (Landsat 8 and 9) rather than TM (5) or ETM+ (7)."""
        return self.platform in ("landsat-8", "landsat-9")

    @property
    def thermal_asset(self) -> str:
        """Thermal asset key: 'lwir' on TM/ETM+, 'lwir11' on TIRS."""
        return "lwir11" if self.oli else "lwir"

    @property
    def folder(self) -> str:
        """Path of its files under the storage account, as USGS lays scenes out."""
        instrument = {"landsat-5": "tm", "landsat-7": "etm"}.get(self.platform, "oli-tirs")
        path_row = self.scene_id.split("_")[2]
        return (
            f"landsat-c2/level-2/standard/{instrument}/{self.acquired:%Y}/"
            f"{path_row[:3]}/{path_row[3:]}/{self.scene_id}"
        )

    def file_name(self, asset: str) -> str:
        """The asset's file name, with the sensor's own band numbers (TM/ETM+ count from
        blue = 1, OLI from coastal = 1; the thermal band is 6 on TM/ETM+, 10 on TIRS)."""
        bands = OLI_FILES if self.oli else TM_ETM_FILES
        return f"{self.scene_id}_{bands[asset]}.TIF"


OLI_FILES = {
    "blue": "SR_B2",
    "green": "SR_B3",
    "red": "SR_B4",
    "nir08": "SR_B5",
    "lwir11": "ST_B10",
    "qa_pixel": "QA_PIXEL",
}
"""File suffix of each asset of a Landsat 8 or 9 scene."""
TM_ETM_FILES = {
    "blue": "SR_B1",
    "green": "SR_B2",
    "red": "SR_B3",
    "nir08": "SR_B4",
    "lwir": "ST_B6",
    "qa_pixel": "QA_PIXEL",
}
"""File suffix of each asset of a Landsat 5 or 7 scene."""


def write_cog(
    path: Path, data: np.ndarray, crs: CRS, transform: Affine, nodata: float | None
) -> None:
    """A small tiled DEFLATE COG (256-pixel blocks, no overviews)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(
        path,
        "w",
        driver="COG",
        width=data.shape[1],
        height=data.shape[0],
        count=1,
        dtype=data.dtype,
        crs=rasterio.crs.CRS.from_wkt(crs.to_wkt()),
        transform=transform,
        nodata=nodata,
        compress="DEFLATE",
        predictor="YES",
        blocksize=256,
        overviews="NONE",
    ) as dst:
        dst.write(data, 1)


def scene_arrays(scene: SceneSpec) -> dict[str, np.ndarray]:
    """Raw counts of every asset of a scene (uint16), fill 0 (QA fill bit 1)."""
    rows, cols = scene.shape
    x0, y0 = scene.top_left_xy
    lattice_col = np.round((x0 + 15) / 30).astype(int) + np.arange(cols)[None, :]
    lattice_row = np.round((-(y0 - 15)) / 30).astype(int) + np.arange(rows)[:, None]
    rng = np.random.default_rng(scene.seed)
    noise = rng.integers(0, 8, size=(rows, cols))
    s = scene.seed % 5

    def sr(reflectance: np.ndarray) -> np.ndarray:
        return np.round((reflectance - SR_OFFSET) / SR_SCALE).astype(np.int64) + noise

    red = sr(0.04 + 0.001 * (lattice_col % 97) + 0.01 * s + 0 * lattice_row)
    green = sr(0.05 + 0.001 * (lattice_row % 89) + 0.01 * s + 0 * lattice_col)
    blue = sr(0.03 + 0.0005 * ((lattice_col + lattice_row) % 101) + 0.01 * s)
    nir = sr(0.25 + 0.001 * (lattice_row % 53) - 0.01 * s + 0 * lattice_col)
    kelvin = 290 + 0.05 * (lattice_col % 61) + 0.5 * s + 0 * lattice_row
    thermal = np.round((kelvin - ST_OFFSET) / ST_SCALE).astype(np.int64) + noise

    oli = scene.oli
    qa = np.full((rows, cols), QA_CLEAR_L8 if oli else QA_CLEAR_L7, dtype=np.int64)
    yy, xx = np.mgrid[0:rows, 0:cols]
    if scene.clouds:
        cy, cx = rng.integers(rows // 4, 3 * rows // 4), rng.integers(cols // 4, 3 * cols // 4)
        r = np.hypot(yy - cy, xx - cx)
        cloud = r < 60
        dilated = (r >= 60) & (r < 75)
        shadow = np.hypot(yy - cy - 90, xx - cx + 90) < 50
        snow = (np.abs(yy - rows // 5) < 12) & (np.abs(xx - cols // 5) < 12)
        water = (np.abs(yy - 4 * rows // 5) < 20) & (np.abs(xx - cols // 3) < 30)
        qa[cloud] = (qa[cloud] & ~(3 << 8)) | (1 << 3) | (3 << 8)
        qa[dilated] |= 1 << 1
        qa[shadow & ~cloud] |= 1 << 4
        qa[snow] = (qa[snow] & ~(1 << 6)) | (1 << 5)
        qa[water] |= 1 << 7
        if oli:
            cirrus = (np.abs(yy - rows // 2) < 10) & (xx > cols - 80)
            qa[cirrus] |= (1 << 2) | (3 << 14)
    fill = (yy + xx) < 40  # the scene's tilted edge cuts a corner
    if scene.slc_off:
        fill |= ((xx + 2 * yy) % 20) < 4
    qa[fill] = 1
    arrays = {
        "red": red,
        "green": green,
        "blue": blue,
        "nir08": nir,
        scene.thermal_asset: thermal,
    }
    out = {k: np.where(fill, 0, np.clip(v, 1, 65535)).astype(np.uint16) for k, v in arrays.items()}
    out["qa_pixel"] = qa.astype(np.uint16)
    return out


def _footprint(crs: CRS, bounds: tuple[float, float, float, float]) -> tuple[list, dict]:
    to_wgs84 = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
    west, south, east, north = to_wgs84.transform_bounds(*bounds, densify_pts=21)
    ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
    return [west, south, east, north], {"type": "Polygon", "coordinates": [ring]}


def write_scene(storage: Path, scene: SceneSpec) -> dict[str, Any]:
    """Write a scene's COGs under ``storage`` and return its STAC item (blob hrefs)."""
    crs = CRS.from_epsg(scene.epsg)
    x0, y0 = scene.top_left_xy
    transform = Affine(30, 0, x0, 0, -30, y0)
    rows, cols = scene.shape
    assets: dict[str, Any] = {}
    for key, data in scene_arrays(scene).items():
        relative = f"{scene.folder}/{scene.file_name(key)}"
        nodata = 1 if key == "qa_pixel" else 0
        write_cog(storage / LANDSAT_ACCOUNT / relative, data, crs, transform, nodata)
        band: dict[str, Any] = {"nodata": nodata, "data_type": "uint16", "spatial_resolution": 30}
        if key in ("red", "green", "blue", "nir08"):
            band.update(scale=SR_SCALE, offset=SR_OFFSET, unit="none")
        elif key in ("lwir", "lwir11"):
            band.update(scale=ST_SCALE, offset=ST_OFFSET, unit="kelvin")
        else:
            band["unit"] = "bit index"
        if key in scene.unscaled:
            band.pop("scale", None)
            band.pop("offset", None)
        assets[key] = {
            "href": f"https://{LANDSAT_ACCOUNT}.{BLOB}/{relative}",
            "type": "image/tiff; application=geotiff; profile=cloud-optimized",
            "roles": ["data"],
            "raster:bands": [band],
        }
    bounds = (x0, y0 - 30 * rows, x0 + 30 * cols, y0)
    bbox, geometry = _footprint(crs, bounds)
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [
            "https://stac-extensions.github.io/eo/v1.1.0/schema.json",
            "https://stac-extensions.github.io/projection/v2.0.0/schema.json",
            "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
        ],
        "id": scene.scene_id,
        "collection": "landsat-c2-l2",
        "bbox": bbox,
        "geometry": geometry,
        "properties": {
            "datetime": scene.acquired.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "platform": scene.platform,
            "eo:cloud_cover": scene.cloud_cover,
            "proj:epsg": scene.epsg,
            "proj:code": f"EPSG:{scene.epsg}",
            "proj:shape": [rows, cols],
            "proj:transform": [30.0, 0.0, x0, 0.0, -30.0, y0],
            "landsat:collection_category": "T1",
        },
        "assets": assets,
        "links": [],
    }


def dem_tile_item(storage: Path, lat: int, lon: int) -> dict[str, Any]:
    """A 1° Copernicus DEM tile (EPSG:4326, pixel centres on the lattice) and its item."""
    ns, ew = ("N" if lat >= 0 else "S"), ("E" if lon >= 0 else "W")
    name = f"Copernicus_DSM_COG_10_{ns}{abs(lat):02d}_00_{ew}{abs(lon):03d}_00_DEM"
    n = round(1 / DEM_RES)
    transform = Affine(DEM_RES, 0, lon - DEM_RES / 2, 0, -DEM_RES, lat + 1 + DEM_RES / 2)
    rows, cols = np.mgrid[0:n, 0:n]
    lon_c = transform.c + (cols + 0.5) * DEM_RES
    lat_c = transform.f - (rows + 0.5) * DEM_RES
    elevation = (
        40 * np.sin(lon_c * 37.0) + 30 * np.cos(lat_c * 23.0) + 5 * (lon_c - lon) - 8
    ).astype(np.float32)
    elevation[(rows - 400) ** 2 + (cols - 50) ** 2 < 16] = -32767  # a radar void in the window
    relative = f"copernicus-dem/COP30_hh/{name}.tif"
    write_cog(storage / DEM_ACCOUNT / relative, elevation, CRS.from_epsg(4326), transform, -32767)
    west, north = transform.c, transform.f
    east, south = west + n * DEM_RES, north - n * DEM_RES
    ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "id": name,
        "collection": "cop-dem-glo-30",
        "bbox": [west, south, east, north],
        "geometry": {"type": "Polygon", "coordinates": [ring]},
        "properties": {
            "datetime": "2021-04-22T00:00:00Z",
            "platform": "TanDEM-X",
            "proj:epsg": 4326,
            "proj:code": "EPSG:4326",
            "proj:shape": [n, n],
            "proj:transform": list(transform)[:6],
            "gsd": 30,
        },
        "assets": {
            "data": {
                "href": f"https://{DEM_ACCOUNT}.{BLOB}/{relative}",
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"],
                "raster:bands": [{"nodata": -32767, "data_type": "float32", "unit": "metre"}],
            }
        },
        "links": [],
    }


@dataclass(frozen=True)
class DaymetStore:
    """The loopback copy of ``daymet-annual-na``: where its cells are and where it lives."""

    path: Path
    """The store's folder on disk (served by the file server)."""
    href: str
    """Its blob-storage root, as the collection asset names it."""
    col0: int
    """Column of its first cell on the full North America lattice."""
    row0: int
    """Row of its first cell on the full North America lattice."""
    shape: tuple[int, int]
    """(rows, cols)."""
    corrupt_chunk: str
    """Store key of the chunk overwritten with garbage (tmax, 2015–2017, under Boston)."""


def daymet_values(name: str, year: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """A variable's values at full-lattice (rows, cols): they encode position and year."""
    t = year - DAYMET_YEARS[0]
    tmin = 1.5 + 0.01 * (cols % 89) + 0.02 * (rows % 67) + 0.25 * t
    table = {
        "tmin": tmin,
        "tmax": tmin + 9.0 + 0.03 * (cols % 29),
        "prcp": 950.0 + 1.5 * (cols % 71) + 2.0 * (rows % 53) + 12.0 * t,
        "vp": 850.0 + 0.5 * (cols % 41) + 3.0 * t + 0 * rows,
        "swe": 4.0 + 0.1 * (rows % 17) + 0 * cols - 0.2 * t,
    }
    return np.asarray(table[name], dtype=np.float64)


def write_daymet_store(storage: Path, cities: tuple[str, ...] = DAYMET_CITIES) -> DaymetStore:
    """A small Zarr v2 store laid out like the Planetary Computer's annual North America one.

    Same variables (prcp, tmax, tmin, vp, swe; 2-D lat/lon; time bounds), dimensions, CF
    attributes, ``lambert_conformal_conic`` grid mapping, fill value and consolidated metadata,
    on the real 1 km lattice around the cities, in chunks of 32 × 32 cells so a window needs
    only some of them, and of 3 time steps so years share chunks. A patch of "sea" near the
    first city is fill in every variable and year.
    """
    import xarray as xr
    from numcodecs import Blosc

    from sources.stac.grids import city_crs, city_window

    lcc = CRS.from_proj4(DAYMET_LCC)
    pad = 40
    extents = []
    for city in cities:
        to_lcc = Transformer.from_crs(city_crs(city), lcc, always_xy=True)
        xmin, ymin, xmax, ymax = to_lcc.transform_bounds(*city_window(city), densify_pts=21)
        extents.append(
            (
                int((DAYMET_Y0 - ymax) // 1000) - pad,
                int((DAYMET_Y0 - ymin) // 1000) + pad,
                int((xmin - DAYMET_X0) // 1000) - pad,
                int((xmax - DAYMET_X0) // 1000) + pad,
            )
        )
    row0, col0 = min(e[0] for e in extents), min(e[2] for e in extents)
    row1, col1 = max(e[1] for e in extents), max(e[3] for e in extents)
    rows, cols = np.mgrid[row0:row1, col0:col1]
    x = DAYMET_X0 + 1000.0 * np.arange(col0, col1)
    y = DAYMET_Y0 - 1000.0 * np.arange(row0, row1)
    xx, yy = np.meshgrid(x, y)
    lon, lat = Transformer.from_crs(lcc, "EPSG:4326", always_xy=True).transform(xx, yy)
    first = extents[0]
    centre_r, centre_c = (first[0] + first[1]) // 2, (first[2] + first[3]) // 2
    sea = (rows - centre_r - 25) ** 2 + (cols - centre_c - 30) ** 2 < 15**2
    years = np.array(DAYMET_YEARS)
    days = (
        np.array([f"{y}-07-01T12:00" for y in years], dtype="datetime64[m]")
        - np.datetime64("1950-01-01T00:00", "m")
    ) / np.timedelta64(1, "D")
    attrs = {
        "prcp": ("annual total precipitation", "mm", "sum within days time: sum over days"),
        "swe": ("annual average snow water equivalent", "kg/m2", "sum within days time: mean"),
        "tmax": ("annual average of daily maximum temperature", "degrees C", "maximum"),
        "tmin": ("annual average of daily minimum temperature", "degrees C", "minimum"),
        "vp": ("annual average of daily average vapor pressure", "Pa", "mean within days"),
    }
    data_vars: dict[str, Any] = {}
    for name, (long_name, units, method) in attrs.items():
        stack = np.stack([daymet_values(name, int(yr), rows, cols) for yr in years])
        stack[:, sea] = np.nan
        data_vars[name] = xr.Variable(
            ("time", "y", "x"),
            stack.astype(np.float32),
            {
                "long_name": long_name,
                "units": units,
                "cell_methods": f"area: mean time: {method}",
                "grid_mapping": "lambert_conformal_conic",
            },
        )
    data_vars["lambert_conformal_conic"] = xr.Variable(
        (),
        np.int16(0),
        {
            "grid_mapping_name": "lambert_conformal_conic",
            "longitude_of_central_meridian": -100.0,
            "latitude_of_projection_origin": 42.5,
            "false_easting": 0.0,
            "false_northing": 0.0,
            "standard_parallel": [25.0, 60.0],
            "semi_major_axis": 6378137.0,
            "inverse_flattening": 298.257223563,
        },
    )
    bounds = np.stack([days - 182.5, days + 182.5], axis=1)
    data_vars["time_bnds"] = xr.Variable(("time", "nv"), bounds)
    coords = {
        "time": xr.Variable(
            "time",
            days,
            {"units": "days since 1950-01-01 00:00:00", "calendar": "standard",
             "long_name": "24-hour day based on local time", "bounds": "time_bnds"},
        ),
        "x": xr.Variable("x", x.astype(np.float32), {"units": "m", "long_name": "x coordinate"}),
        "y": xr.Variable("y", y.astype(np.float32), {"units": "m", "long_name": "y coordinate"}),
        "lat": xr.Variable(("y", "x"), lat.astype(np.float32), {"units": "degrees_north"}),
        "lon": xr.Variable(("y", "x"), lon.astype(np.float32), {"units": "degrees_east"}),
    }  # fmt: skip
    dataset = xr.Dataset(data_vars, coords=coords, attrs={"source": "loopback copy for tests"})
    blosc = Blosc(cname="lz4", clevel=5, shuffle=1)
    chunks = (DAYMET_TIME_CHUNK, DAYMET_CHUNK, DAYMET_CHUNK)
    encoding: dict[str, dict[str, Any]] = {
        name: {"chunks": chunks, "_FillValue": -9999.0, "compressors": blosc} for name in attrs
    }
    path = storage / DAYMET_ACCOUNT / DAYMET_STORE
    dataset.to_zarr(path, mode="w", zarr_format=2, consolidated=True, encoding=encoding)
    # Garbage in the chunk of 2016's tmax under the first city's centre: a decoder must fail.
    t = DAYMET_YEARS.index(DAYMET_CORRUPT_YEAR) // DAYMET_TIME_CHUNK
    key = f"tmax/{t}.{(centre_r - row0) // DAYMET_CHUNK}.{(centre_c - col0) // DAYMET_CHUNK}"
    chunk = path / key
    chunk.write_bytes(b"\x02\x01not a blosc frame" + chunk.read_bytes()[40:])
    return DaymetStore(
        path=path,
        href=f"https://{DAYMET_ACCOUNT}.{BLOB}/{DAYMET_STORE}",
        col0=col0,
        row0=row0,
        shape=rows.shape,
        corrupt_chunk=key,
    )


def daymet_collection(store: DaymetStore) -> dict[str, Any]:
    """The ``daymet-annual-na`` collection as the Planetary Computer serves it (no items; the
    store as collection-level assets with ``xarray:open_kwargs``)."""
    body = collection("daymet-annual-na")
    body["extent"]["spatial"]["bbox"] = [[-178.1333, 14.0749, -53.0567, 82.9143]]
    body["extent"]["temporal"]["interval"] = [
        [f"{DAYMET_YEARS[0]}-07-01T12:00:00Z", f"{DAYMET_YEARS[-1]}-07-01T12:00:00Z"]
    ]
    body["msft:storage_account"] = DAYMET_ACCOUNT
    body["msft:container"] = "daymet-zarr"
    body["assets"] = {
        "zarr-https": {
            "href": store.href,
            "type": "application/vnd+zarr",
            "title": "Annual North America Daymet HTTPS Zarr root",
            "roles": ["data", "zarr", "https"],
            "xarray:open_kwargs": {"consolidated": True},
        },
        "zarr-abfs": {
            "href": f"abfs://{DAYMET_STORE}",
            "type": "application/vnd+zarr",
            "roles": ["data", "zarr", "abfs"],
            "xarray:storage_options": {"account_name": DAYMET_ACCOUNT},
            "xarray:open_kwargs": {"consolidated": True},
        },
    }
    return body


def collection(collection_id: str) -> dict[str, Any]:
    """A minimal STAC collection."""
    return {
        "type": "Collection",
        "stac_version": "1.0.0",
        "id": collection_id,
        "description": f"Loopback copy of {collection_id}",
        "license": "proprietary",
        "extent": {
            "spatial": {"bbox": [[-180, -90, 180, 90]]},
            "temporal": {"interval": [["1982-01-01T00:00:00Z", None]]},
        },
        "links": [],
    }


def boston_scenes() -> dict[str, SceneSpec]:
    """The loopback scenes over Boston, by role in the tests.

    2020: three usable scenes in zone 19 (two OLI, one Landsat 7 SLC-off), one too cloudy,
    one from zone 18; 2019: one scene (fault tests); 2018: a scene whose QA file is truncated;
    2017: a scene whose thermal asset declares no scale and offset. One Landsat 5 (TM) scene
    in 2009 and one Landsat 9 scene in 2022, each alone in its year, with their own asset names
    (thermal ``lwir`` and ``lwir11``). Plus one Cape Town scene of 2020 as USGS publishes
    southern scenes: in the northern zone code (32634) with negative northings.
    """
    grid = landsat_grid(CITY)
    south = landsat_grid(SOUTH_CITY).transform
    gx, gy = grid.transform.c, grid.transform.f

    def at(col: int, row: int) -> tuple[float, float]:
        return (gx + 30 * col, gy - 30 * row)

    summer = datetime(2020, 6, 12, 15, 30, tzinfo=UTC)
    zone18 = Transformer.from_crs(32619, 32618, always_xy=True)
    x18, y18 = zone18.transform(gx + 30 * 500, gy - 30 * 400)
    x18 = 30 * round(x18 / 30) + 15
    y18 = 30 * round(y18 / 30) + 15
    return {
        "clear": SceneSpec(
            "LC08_L2SP_012031_20200612_20200823_02_T1", "landsat-8", 32619, at(-150, -150),
            (640, 640), summer, 12.5, 1,
        ),
        "second": SceneSpec(
            "LC08_L2SP_011031_20200707_20200912_02_T1", "landsat-8", 32619, at(250, -100),
            (640, 640), summer + timedelta(days=25), 20.0, 2,
        ),
        "slc_off": SceneSpec(
            "LE07_L2SP_012031_20200721_20200916_02_T1", "landsat-7", 32619, at(100, 300),
            (640, 640), summer + timedelta(days=39), 8.0, 3, slc_off=True,
        ),
        "cloudy": SceneSpec(
            "LC08_L2SP_012031_20200815_20200919_02_T1", "landsat-8", 32619, at(0, 0),
            (640, 640), summer + timedelta(days=64), 91.0, 4,
        ),
        "zone18": SceneSpec(
            "LC08_L2SP_013030_20200603_20200825_02_T1", "landsat-8", 32618, (x18, y18),
            (640, 640), summer - timedelta(days=9), 15.0, 5,
        ),
        "faulty": SceneSpec(
            "LC08_L2SP_012031_20190610_20200827_02_T1", "landsat-8", 32619, at(200, 200),
            (512, 512), datetime(2019, 6, 10, 15, 30, tzinfo=UTC), 10.0, 6,
        ),
        "south": SceneSpec(
            "LC08_L2SP_175084_20200215_20200823_02_T1", "landsat-8", 32634,
            (south.c + 30 * 300, south.f - 30 * 400 - 10_000_000), (512, 512),
            datetime(2020, 2, 15, 8, 40, tzinfo=UTC), 5.0, 8,
        ),
        "truncated": SceneSpec(
            "LC08_L2SP_012031_20180607_20200831_02_T1", "landsat-8", 32619, at(200, 200),
            (512, 512), datetime(2018, 6, 7, 15, 30, tzinfo=UTC), 10.0, 7,
        ),
        "unscaled": SceneSpec(
            "LC08_L2SP_012031_20170620_20200903_02_T1", "landsat-8", 32619, at(250, 150),
            (384, 384), datetime(2017, 6, 20, 15, 30, tzinfo=UTC), 10.0, 9,
            unscaled=("lwir11",),
        ),
        "tm": SceneSpec(
            "LT05_L2SP_012031_20090710_20200827_02_T1", "landsat-5", 32619, at(300, 250),
            (512, 512), datetime(2009, 7, 10, 15, 10, tzinfo=UTC), 14.0, 10,
        ),
        "oli2": SceneSpec(
            "LC09_L2SP_012031_20220615_20230415_02_T1", "landsat-9", 32619, at(250, 300),
            (512, 512), datetime(2022, 6, 15, 15, 30, tzinfo=UTC), 6.0, 11,
        ),
    }  # fmt: skip


def wait_for(url: str, process: subprocess.Popen[Any], what: str, log: Path) -> None:
    """Wait until ``url`` answers 200, or fail with the server's output."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {process.returncode} before serving: {log.read_text()}"
            )
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    process.terminate()
    raise RuntimeError(f"{what} did not answer at {url} within 20 s: {log.read_text()}")


class _SasHandler(BaseHTTPRequestHandler):
    """Answers GET /<account>/<container> with a token, as the SAS endpoint does."""

    served: list[str]

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "token":
            self.send_error(404)
            return
        self.served.append(self.path)
        expiry = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = json.dumps({"msft:expiry": expiry, "token": SAS_TOKEN}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@dataclass
class ThrottledApi:
    """A loopback proxy of the STAC API that answers some requests with scripted statuses."""

    url: str
    """The proxy's root (links in the answers it forwards point back at it)."""
    seen: list[tuple[float, str, str, int]]
    """(monotonic time, method, path, status) of every request, in arrival order."""


@contextmanager
def throttled_api(
    upstream: str, prefix: str, answers: list[tuple[int, dict[str, str]]]
) -> Iterator[ThrottledApi]:
    """Serve a proxy of ``upstream`` until exit: the first requests whose path starts with
    ``prefix`` get ``answers`` (status and headers, e.g. 429 with Retry-After) in turn, every
    other request is forwarded."""
    left = list(answers)
    seen: list[tuple[float, str, str, int]] = []
    lock = threading.Lock()
    own: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            arrived = time.monotonic()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            with lock:
                scripted = left.pop(0) if self.path.startswith(prefix) and left else None
            if scripted is not None:
                status, headers = scripted
                seen.append((arrived, self.command, self.path, status))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            forwarded = {
                k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")
            }
            response = requests.request(
                self.command, upstream + self.path, data=body, headers=forwarded, timeout=10
            )
            content = response.content.replace(upstream.encode(), own[0].encode())
            seen.append((arrived, self.command, self.path, response.status_code))
            self.send_response(response.status_code)
            self.send_header("Content-Type", response.headers.get("Content-Type", "text/plain"))
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    own.append(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ThrottledApi(own[0], seen)
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class StacWorld:
    """The running loopback services and what they serve."""

    api_url: str
    """rustac's STAC API root."""
    files_url: str
    """The file server's root (mirror of the storage accounts)."""
    sas_url: str
    """The SAS token endpoint."""
    storage: Path
    """Folder the file server serves (one sub-folder per storage account)."""
    request_log: Path
    """The file server's request log."""
    faults: Path
    """Faults file the file server reads."""
    scenes: dict[str, SceneSpec]
    """Landsat scenes by role."""
    items: dict[str, dict[str, Any]]
    """STAC items by id."""
    sas_requests: list[str] = field(default_factory=list)
    """Token requests the SAS endpoint answered."""
    daymet: DaymetStore | None = None
    """The loopback Daymet Zarr store."""
    catalogue: Path | None = None
    """Collections and items rustac serves (``start_stac_api`` serves them again)."""

    def options(self, **overrides: Any) -> dict[str, Any]:
        """Family options pointing at the loopback services (quick retries)."""
        return {
            "api_url": self.api_url,
            "sas_url": self.sas_url,
            "mirror": {
                f"https://{LANDSAT_ACCOUNT}.{BLOB}/": f"{self.files_url}/{LANDSAT_ACCOUNT}/",
                f"https://{DEM_ACCOUNT}.{BLOB}/": f"{self.files_url}/{DEM_ACCOUNT}/",
                f"https://{DAYMET_ACCOUNT}.{BLOB}/": f"{self.files_url}/{DAYMET_ACCOUNT}/",
            },
            "timeout_s": 5,
            "connect_timeout_s": 2,
            "retry_attempts": 3,
            "retry_total_s": 20,
            "retry_wait_initial_s": 0.05,
            "retry_wait_max_s": 0.2,
            **overrides,
        }

    def local_path(self, href: str) -> Path:
        """The served file behind a blob href."""
        return self.storage / href.split("://", 1)[1].split(".", 1)[0] / href.split("/", 3)[3]

    def log_lines(self) -> list[str]:
        """Request-log lines so far."""
        if not self.request_log.exists():
            return []
        return self.request_log.read_text(encoding="utf-8").splitlines()

    def set_faults(self, rules: list[dict[str, Any]]) -> None:
        """Replace the file server's fault rules (the token rule always stays)."""
        token_rule = {"match": "/", "require_query": "sig=LoopbackSecret"}
        self.faults.write_text(json.dumps([token_rule, *rules]), encoding="utf-8")
        time.sleep(0.01)  # a new mtime even on coarse clocks


WORLD_COLLECTIONS = ("landsat-c2-l2", "cop-dem-glo-30", "daymet-annual-na")
"""The collections the loopback world's API serves."""


def start_stac_api(
    catalogue: Path, log: Path, collection_ids: tuple[str, ...] = WORLD_COLLECTIONS
) -> tuple[subprocess.Popen[Any], str]:
    """``rustac serve`` of a catalogue folder's collections (``<id>.json``) and items
    (``items.json``) on a free port (the caller waits for it and stops it)."""
    rustac = shutil.which("rustac", path=str(Path(sys.executable).parent))
    if rustac is None:
        raise RuntimeError("rustac is not installed in this environment: run `make install`")
    port = free_loopback_port()
    collections = [catalogue / f"{cid}.json" for cid in collection_ids]
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            [
                rustac,
                "serve",
                "--addr",
                f"127.0.0.1:{port}",
                *[str(c) for c in collections],
                str(catalogue / "items.json"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def stac_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StacWorld]:
    """Loopback COGs, file server, ``rustac serve`` and SAS endpoint for the session."""
    with loopback_stac_world(tmp_path_factory.mktemp("stac")) as world:
        yield world


@contextmanager
def loopback_stac_world(base: Path) -> Iterator[StacWorld]:
    """Write the COGs and items under ``base`` and run the loopback services until exit.

    Also used by ``make bench`` (``benchmarks/bench_stac_bytes.py``) to count the bytes a
    city-year's fetch takes against the bytes its windows need.
    """
    storage = base / "storage"
    scenes = boston_scenes()
    items = {s.scene_id: write_scene(storage, s) for s in scenes.values()}
    for lon in (-72, -71):
        item = dem_tile_item(storage, 42, lon)
        items[item["id"]] = item
    truncated = scenes["truncated"]
    qa_file = items[truncated.scene_id]["assets"]["qa_pixel"]["href"]
    qa_path = storage / LANDSAT_ACCOUNT / qa_file.split("/", 3)[3]
    qa_path.write_bytes(qa_path.read_bytes()[: qa_path.stat().st_size // 3])

    daymet = write_daymet_store(storage)

    catalogue = base / "catalogue"
    catalogue.mkdir()
    for cid in ("landsat-c2-l2", "cop-dem-glo-30"):
        (catalogue / f"{cid}.json").write_text(json.dumps(collection(cid)), encoding="utf-8")
    (catalogue / "daymet-annual-na.json").write_text(
        json.dumps(daymet_collection(daymet)), encoding="utf-8"
    )
    features = {"type": "FeatureCollection", "features": list(items.values())}
    (catalogue / "items.json").write_text(json.dumps(features), encoding="utf-8")

    log = base / "requests.log"
    faults = base / "faults.json"
    world_faults = [{"match": "/", "require_query": "sig=LoopbackSecret"}]
    faults.write_text(json.dumps(world_faults), encoding="utf-8")
    files = subprocess.Popen(
        [sys.executable, "-m", "tests.http_file_server", str(storage), str(log), str(faults)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    api, api_url = start_stac_api(catalogue, base / "rustac.log")
    served: list[str] = []
    handler = type("SasHandler", (_SasHandler,), {"served": served})
    sas = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    sas_thread = threading.Thread(target=sas.serve_forever, daemon=True)
    sas_thread.start()
    try:
        assert files.stdout is not None
        line = files.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the loopback file server did not start: {line!r}")
        files_url = f"http://127.0.0.1:{int(line)}"
        wait_for(api_url + "/", api, "rustac serve", base / "rustac.log")
        yield StacWorld(
            api_url=api_url,
            files_url=files_url,
            sas_url=f"http://127.0.0.1:{sas.server_address[1]}/token",
            storage=storage,
            request_log=log,
            faults=faults,
            scenes=scenes,
            items=items,
            sas_requests=served,
            daymet=daymet,
            catalogue=catalogue,
        )
    finally:
        sas.shutdown()
        sas.server_close()
        for process in (api, files):
            stop_process(process)


# ---- bytes fetched against bytes needed ------------------------------------------------------


def needed_bytes(path: Path, grid: Any) -> int:
    """Compressed bytes of the internal tiles under the grid's footprint in the file."""
    with rasterio.open(path) as src:
        bounds = grid.boundingbox.bbox
        if src.crs.to_epsg() != grid.crs.to_epsg():
            bounds = Transformer.from_crs(grid.crs, src.crs, always_xy=True).transform_bounds(
                *bounds, densify_pts=21
            )
        window = from_bounds(*bounds, transform=src.transform).round_offsets().round_lengths()
        window = window.intersection(Window(0, 0, src.width, src.height))
        block_h, block_w = src.block_shapes[0]
        total = 0
        for bi in range(
            int(window.row_off) // block_h, -(-int(window.row_off + window.height) // block_h)
        ):
            for bj in range(
                int(window.col_off) // block_w, -(-int(window.col_off + window.width) // block_w)
            ):
                total += src.block_size(1, bi, bj)
        return total


KINDS = ("landsat", "dem", "daymet")
"""Kinds of assets the byte accounting counts apart."""


def asset_kind(path: str) -> str:
    """'landsat', 'dem' or 'daymet': which product family a served path belongs to."""
    if f"/{DAYMET_ACCOUNT}/" in path:
        return "daymet"
    return "dem" if "copernicus-dem" in path else "landsat"


def byte_accounting(world: StacWorld, requests: list[str], city: str) -> dict[str, dict[str, int]]:
    """Per kind (landsat, dem, daymet): bytes the server sent, bytes the windows needed, and
    bytes of the whole files, for the file server's request-log lines of a set of fetches.

    A file is counted **once** as needed, however many reads asked for it (the red band read by
    OPT and by NDVI, a Zarr chunk shared by two years or two cities): an ideal fetch of the set
    transfers each needed byte once. For a COG that is the compressed tiles under the city's
    window; a Zarr object is always fetched whole, so it needs its whole size (the Daymet tests
    check that only the chunks under the windows are read).
    """
    served: dict[str, int] = {}
    for line in requests:
        _, path, _, _, sent = line.split()[:5]
        served[path] = served.get(path, 0) + int(sent)
    totals = {kind: {"fetched": 0, "needed": 0, "whole": 0} for kind in KINDS}
    for path, sent in served.items():
        local = world.storage / path.lstrip("/")
        kind = asset_kind(path)
        whole = local.stat().st_size if local.is_file() else 0
        totals[kind]["fetched"] += sent
        totals[kind]["whole"] += whole
        if kind == "daymet":
            totals[kind]["needed"] += whole
            continue
        if kind == "dem":
            with rasterio.open(local) as src:
                grid = geographic_grid(city, src.transform)
        else:
            grid = landsat_grid(city)
        totals[kind]["needed"] += needed_bytes(local, grid)
    return totals
