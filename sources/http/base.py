"""What every HTTP adapter shares: the city's window on the product lattice, served files
fetched through the shared download manager, reads checked against the spec, and item files
written in the sample twin's form and installed atomically.

An adapter subclass only says how a source year's files become arrays on the city window
(``assemble``): one GHSL tile mosaic, twelve ODIAC months summed, one VIIRS composite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import zipfile
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import rasterio
import rasterio.shutil
from odc.geo.geobox import GeoBox
from pyproj import CRS
from rasterio.errors import RasterioError
from rasterio.windows import Window

from citycube.catalogue.cities import get_city
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.grid.tiles import (
    city_extent,
    snapped_grid,
)
from citycube.items.cog import cog_profile, grid_profile
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.rasters import transformer, write_netcdf_variable
from citycube.items.staging import StagedFiles, install_item
from sources.downloads import Downloaded, DownloadManager, redact_url
from sources.http.options import HttpFamilyOptions
from sources.http.spec import HttpProductSpec, HttpVectorProductSpec, Variable

WINDOW_MARGIN_M = 3_000.0
"""Every item covers the city extent plus this margin, as the sample twins' files do."""
PROVENANCE_FILE = "sources.json"
"""Served files (URLs without credentials, digests, sizes) and the aggregation applied."""


"""The city's window on a product's global cell lattice (north-up)."""


def city_window(city: str, spec: HttpProductSpec) -> GeoBox:
    """The smallest window of the product lattice holding the city extent plus the margin."""
    utm = CRS.from_epsg(get_city(city).epsg)
    xmin, ymin, xmax, ymax = city_extent(city)
    m = WINDOW_MARGIN_M
    crs = CRS.from_user_input(spec.native_crs)
    west, south, east, north = transformer(utm, crs).transform_bounds(
        xmin - m, ymin - m, xmax + m, ymax + m, densify_pts=51
    )
    res = spec.resolution
    return snapped_grid(crs, (west, south, east, north), (res, res), spec.lattice_origin)


@dataclass(frozen=True)
class Assembled:
    """A source year's arrays on the city window, in output units (NaN = no valid value)."""

    grid: GeoBox
    """Where the cells are."""
    values: Mapping[str, np.ndarray]
    """Per variable name: (rows, cols) float64 values."""
    served: list[dict[str, Any]] = field(default_factory=list)
    """Provenance of each served file read (URL without secrets, sha256, bytes)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Anything a reader of the item should know (missing tiles, aggregation rule)."""


def http_source_info(spec: HttpProductSpec | HttpVectorProductSpec) -> SourceInfo:
    """Provenance of a product served over HTTP: real, named ``http:<product>``."""
    return SourceInfo(
        product_id=spec.product,
        source_id=f"http:{spec.product}",
        version=spec.version,
        synthetic=False,
        licence=spec.licence,
        attribution=spec.attribution,
    )


class HttpSource(SourceProduct):
    """One product served over HTTP, described by a spec in ``schemas/http_products.yaml``."""

    def __init__(
        self, spec: HttpProductSpec, options: HttpFamilyOptions, manager: DownloadManager
    ) -> None:
        self.spec = spec
        self.options = options
        self.manager = manager
        self.base_url = options.base_urls.get(spec.product, spec.base_url).rstrip("/")
        self.info = http_source_info(spec)

    # -- protocol -------------------------------------------------------------------------

    def source_years(self, city: str) -> list[int] | None:
        """Years the product publishes (from the spec; no request is made)."""
        get_city(city)
        return list(self.spec.years)

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Download (or reuse) one city-year's files and install the item in its twin's form."""
        get_city(city)
        year = self._check_year(city, source_year)

        def write(staging: Path) -> StagedFiles:
            scratch = staging / "_scratch"
            scratch.mkdir()
            try:
                assembled = self.assemble(city, year, city_window(city, self.spec), scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return self._write_item(staging, city, year, assembled)

        installed = install_item(self.item_dir(city, year, dest), self.identity(city, year), write)
        return self.installed_source_item(installed, city, year)

    @abstractmethod
    def assemble(self, city: str, year: int, grid: GeoBox, scratch: Path) -> Assembled:
        """A source year's values on the city window (``scratch`` holds temporary files)."""

    # -- item layout ----------------------------------------------------------------------

    def identity(self, city: str, source_year: int | None) -> dict[str, Any]:
        """What a completion record must say for an item to be reused."""
        spec_text = json.dumps(self.spec.model_dump(mode="json"), sort_keys=True)
        return {
            "product": self.product_id,
            "city": city,
            "source_year": source_year,
            "source_id": self.info.source_id,
            "version": self.info.version,
            "server": redact_url(self.base_url),
            "spec_digest": hashlib.sha256(spec_text.encode()).hexdigest()[:16],
            "synthetic": False,
        }

    def _check_year(self, city: str, source_year: int | None) -> int:
        if source_year is None:
            raise ValueError(
                f"{self.product_id} is not static; pass one of its source years "
                f"{self.spec.years[0]}-{self.spec.years[-1]}"
            )
        if source_year not in self.spec.years:
            raise SourceUnavailableError(
                f"{self.info.source_id} ({self.spec.version}) publishes no source year "
                f"{source_year} (for {city}); it covers {', '.join(map(str, self.spec.years))}",
                reason="source_year_missing",
            )
        return source_year

    # -- served files ---------------------------------------------------------------------

    def url(self, variable: Variable, year: int, **fields: int) -> str:
        """The URL of one served file of a variable."""
        values: dict[str, Any] = {
            "year": year,
            "yy": f"{year % 100:02d}",
            "epoch": year,
            "file": self.spec.files_by_year.get(year, ""),
            **fields,
        }
        if "mm" in fields:
            values["mm"] = f"{fields['mm']:02d}"
        return f"{self.base_url}/{variable.path.format(**values).lstrip('/')}"

    def auth_headers(self, url: str, city: str, year: int) -> dict[str, str]:
        """The credential header the product needs, read from its environment variable."""
        creds = self.spec.credentials
        if creds is None:
            return {}
        token = os.environ.get(creds.env_var, "").strip()
        if token:
            return {creds.header: f"{creds.scheme} {token}".strip()}
        if self.options.offline or self.manager.cached_path(url) is not None:
            return {}  # served from the cache or the mirror: no request is made
        raise SourceFetchError(
            f"{self.info.source_id} needs an account token to download {redact_url(url)} "
            f"({city} {year}): set the environment variable {creds.env_var}. {creds.how_to_get}",
            transient=False,
        )

    def download(self, url: str, city: str, year: int) -> Downloaded:
        """A served file through the shared download manager (checksum when the spec has one)."""
        name = PurePosixPath(urlsplit(url).path).name
        headers = self.auth_headers(url, city, year)
        try:
            return self.manager.fetch(url, sha256=self.spec.sha256.get(name), headers=headers)
        except SourceFetchError as exc:
            if exc.status in (401, 403) and self.spec.credentials is not None:
                raise SourceFetchError(
                    f"{exc.message} — the server refused the token in "
                    f"{self.spec.credentials.env_var} ({city} {year}); tokens expire: get a new "
                    "one",
                    transient=False,
                    status=exc.status,
                ) from None
            raise

    def corrupt(
        self, url: str, city: str, year: int, detail: object, cached: bool = True
    ) -> SourceReadError:
        """The error for a served file that cannot be read; the cached copy is forgotten."""
        if cached:
            self.manager.discard(url)
        name = PurePosixPath(urlsplit(url).path).name
        return SourceReadError(
            f"{self.info.source_id}: {city} {year}: served file {name} ({redact_url(url)}) is "
            f"corrupt or truncated: {detail}. It was dropped from the download cache; fetch "
            "again, and report it to the provider if it persists"
        )

    @contextlib.contextmanager
    def open_served(
        self,
        got: Downloaded,
        url: str,
        city: str,
        year: int,
        scratch: Path,
        variable: Variable | None = None,
    ) -> Iterator[rasterio.DatasetReader]:
        """Open a downloaded file's raster (unzipping, gunzipping or picking the NetCDF
        variable as the spec says)."""
        packing = self.spec.packing.value
        try:
            if packing == "netcdf":
                assert variable is not None and variable.netcdf_variable is not None
                href = f'NETCDF:"{got.path}":{variable.netcdf_variable}'
            elif packing == "zip":
                member = PurePosixPath(urlsplit(url).path).stem + ".tif"
                target = scratch / f"{got.sha256[:16]}.tif"
                with (
                    zipfile.ZipFile(got.path) as archive,
                    archive.open(member) as src,
                    open(target, "wb") as out,
                ):
                    shutil.copyfileobj(src, out, 1 << 20)
                href = str(target)
            elif packing == "gzip":
                href = f"/vsigzip/{got.path}"
            else:
                href = str(got.path)
            dataset = rasterio.open(href)
        except (zipfile.BadZipFile, KeyError, RasterioError, OSError, EOFError) as exc:
            raise self.corrupt(url, city, year, exc) from None
        with dataset:
            self.check_lattice(dataset, url, city, year)
            yield dataset

    def check_lattice(self, ds: rasterio.DatasetReader, url: str, city: str, year: int) -> None:
        """Fail clearly when a served file is not in the spec's CRS and cell size."""
        name = PurePosixPath(urlsplit(url).path).name
        expected = CRS.from_user_input(self.spec.native_crs)
        crs = CRS.from_user_input(ds.crs) if ds.crs else None
        if crs is None and self.spec.packing.value == "netcdf" and cf_lon_lat(ds):
            crs = CRS.from_epsg(4326)  # CF: lat/lon coordinates without a grid mapping
        if crs is None or not (crs == expected or crs.to_wkt() == expected.to_wkt()):
            raise SourceReadError(
                f"{self.info.source_id}: {city} {year}: {name} is in "
                f"{crs.to_string() if crs else 'no CRS'}, the product is published in "
                f"{self.spec.native_crs}; fix schemas/http_products.yaml or the server"
            )
        t = ds.transform
        res = self.spec.resolution
        tol = self.spec.cell_rel_tol
        if not (math.isclose(t.a, res, rel_tol=tol) and math.isclose(-t.e, res, rel_tol=tol)):
            raise SourceReadError(
                f"{self.info.source_id}: {city} {year}: {name} has cells of {t.a} x {-t.e}, the "
                f"spec says {res}"
            )

    # -- reading --------------------------------------------------------------------------

    def read_served(
        self,
        ds: rasterio.DatasetReader,
        variable: Variable,
        grid: GeoBox,
        url: str,
        city: str,
        year: int,
        into: np.ndarray | None = None,
        band: int = 1,
    ) -> np.ndarray:
        """The file's served values (scaled, in served units) on the window; NaN where invalid.

        Only cells the file covers are written (into ``into`` when given, so tiles can be
        pasted one by one); its nodata (or the spec's raw nodata) and non-finite values are
        invalid. A GDAL scale/offset in the file wins over the spec's. Class ids are mapped to
        the twin's legend and never scaled. Offsets are counted in the spec's cell size, since
        a file's single-precision coordinates can make its own a few 1e-5 off.
        """
        out = np.full(grid.shape, np.nan) if into is None else into
        t = ds.transform
        res = self.spec.resolution
        col_f = (grid.transform.c - t.c) / res
        row_f = (t.f - grid.transform.f) / res
        col_off, row_off = round(col_f), round(row_f)
        if abs(col_f - col_off) > 0.01 or abs(row_f - row_off) > 0.01:
            raise SourceReadError(
                f"{self.info.source_id}: {city} {year}: {PurePosixPath(url).name} is not on "
                f"the product lattice (offset {col_f:.3f}, {row_f:.3f} cells from the window)"
            )
        c0, r0 = max(col_off, 0), max(row_off, 0)
        c1, r1 = min(col_off + grid.width, ds.width), min(row_off + grid.height, ds.height)
        if c1 <= c0 or r1 <= r0:
            return out
        try:
            raw = ds.read(band, window=Window(c0, r0, c1 - c0, r1 - r0)).astype(np.float64)
        except RasterioError as exc:
            cached = self.spec.access.value != "window"
            raise self.corrupt(url, city, year, exc, cached=cached) from None
        nodata = ds.nodata if ds.nodata is not None else self.spec.raw_nodata
        invalid = ~np.isfinite(raw)
        if nodata is not None:
            invalid |= raw == nodata
        if self.spec.fill_values:
            invalid |= np.isin(raw, self.spec.fill_values)
        if self.spec.categorical:
            values = raw.copy()
            for served_id, twin_id in variable.class_map.items():
                values[raw == served_id] = twin_id
        else:
            scale, offset = ds.scales[band - 1], ds.offsets[band - 1]
            if scale == 1 and offset == 0:
                scale, offset = variable.raw_scale, variable.raw_offset
            values = raw * scale + offset
        rows = slice(r0 - row_off, r1 - row_off)
        cols = slice(c0 - col_off, c1 - col_off)
        target = out[rows, cols]
        covered = ~invalid
        target[covered] = values[covered]
        return out

    # -- writing --------------------------------------------------------------------------

    def _write_item(self, staging: Path, city: str, year: int, assembled: Assembled) -> StagedFiles:
        files: dict[str, str] = {}
        served_stem = ""
        if assembled.served:
            served_stem = PurePosixPath(urlsplit(assembled.served[0]["url"]).path).name
            for suffix in (".gz", ".zip"):
                served_stem = served_stem.removesuffix(suffix)
        for role, variables in self.spec.roles().items():
            name = variables[0].output_file.format(year=year, served_stem=served_stem, city=city)
            stack = []
            for variable in variables:
                values = assembled.values[variable.name] * variable.to_output
                stack.append(values + variable.output_offset)
            if not np.isfinite(np.stack(stack)).any():
                raise SourceReadError(
                    f"{self.info.source_id}: {city} {year}: no valid cell in the city window for "
                    f"{role!r}; a failed read must not pass as nodata"
                )
            if self.spec.output_format.value == "netcdf":
                self._write_netcdf(
                    staging / name, variables[0], stack[0], assembled.grid, city, year
                )
            else:
                self._write_cog(staging / name, variables, stack, assembled.grid, city, year)
            files[role] = name
        provenance = {
            "product": self.product_id,
            "source_id": self.info.source_id,
            "version": self.spec.version,
            "city": city,
            "source_year": year,
            "served_files": assembled.served,
            "notes": assembled.notes,
            "licence": self.spec.licence,
            "attribution": self.spec.attribution,
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2), encoding="utf-8")
        units = ", ".join(f"{v.name} {v.output_units}" for v in self.spec.variables)
        extra: dict[str, Any] = {
            "units": units if len(self.spec.variables) > 1 else self.spec.variables[0].output_units,
            "nodata": str(self.spec.nodata),
            "served_files": str(len(assembled.served)),
            "provenance_file": PROVENANCE_FILE,
            **assembled.notes,
        }
        if self.spec.temporal.value == "epochs":
            extra["epoch"] = str(year)
        return StagedFiles(files=files, extra=extra)

    def _write_cog(
        self,
        path: Path,
        variables: list[Variable],
        stack: list[np.ndarray],
        grid: GeoBox,
        city: str,
        year: int,
    ) -> None:
        first = variables[0]
        dtype = np.dtype(first.output_dtype)
        data = np.empty((len(stack), *grid.shape), dtype=dtype)
        for band, (variable, values) in enumerate(zip(variables, stack, strict=True)):
            data[band] = encode(values, variable, self.spec.nodata)
        profile = cog_profile(
            grid, len(stack), dtype, self.spec.nodata, categorical=self.spec.categorical
        )
        tags = self._tags(city, year, first)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(data)
            if first.output_scale != 1 or first.output_add != 0:
                dst.scales = tuple(v.output_scale for v in variables)
                dst.offsets = tuple(v.output_add for v in variables)
            dst.update_tags(**tags)
            for band, variable in enumerate(variables, start=1):
                dst.set_band_description(band, variable.name)
                dst.update_tags(band, units=variable.output_units)

    def _tags(self, city: str, year: int, first: Variable) -> dict[str, str]:
        return {
            "SYNTHETIC": "false",
            "CITYCUBE_PRODUCT": self.product_id,
            "CITYCUBE_SOURCE": self.info.source_id,
            "CITYCUBE_SOURCE_VERSION": self.spec.version,
            "CITYCUBE_CITY": city,
            "CITYCUBE_SOURCE_YEAR": str(year),
            "CITYCUBE_UNITS": first.output_units,
        }

    def _write_netcdf(
        self,
        path: Path,
        variable: Variable,
        values: np.ndarray,
        grid: GeoBox,
        city: str,
        year: int,
    ) -> None:
        """One float32 CF variable through GDAL's netCDF driver, as the ACAG twins are written
        (``rasterio.open(path)`` then opens the variable with its CRS, transform and nodata)."""
        assert variable.output_variable is not None
        profile = grid_profile("GTiff", grid, 1, "float32", self.spec.nodata)
        attributes = {
            "Conventions": "CF-1.8",
            "title": self.spec.name,
            "source": redact_url(self.base_url),
            "references": self.spec.attribution,
            "license": self.spec.licence,
            **self._tags(city, year, variable),
        }
        write_netcdf_variable(
            path,
            profile,
            encode(values, variable, self.spec.nodata),
            variable=variable.output_variable,
            units=variable.output_units,
            long_name=variable.long_name or variable.name,
            attributes=attributes,
        )


def cf_lon_lat(ds: rasterio.DatasetReader) -> bool:
    """Whether a NetCDF variable lies on CF latitude/longitude coordinates (degrees)."""
    tags = ds.tags()
    return tags.get("lat#units", "").startswith("degrees_n") and tags.get(
        "lon#units", ""
    ).startswith("degrees_e")


def encode(values: np.ndarray, variable: Variable, nodata: float) -> np.ndarray:
    """Output-unit values in the written dtype: scaled integers or floats, nodata where NaN."""
    invalid = ~np.isfinite(values)
    dtype = np.dtype(variable.output_dtype)
    if np.issubdtype(dtype, np.integer):
        raw = np.rint((np.where(invalid, 0, values) - variable.output_add) / variable.output_scale)
        top = np.iinfo(dtype).max - 1 if nodata == np.iinfo(dtype).max else np.iinfo(dtype).max
        raw = np.clip(raw, np.iinfo(dtype).min, top).astype(dtype)
        raw[invalid] = dtype.type(nodata)
        return raw
    return np.where(invalid, nodata, values).astype(dtype)
