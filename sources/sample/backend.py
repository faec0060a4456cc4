"""The sample backend: writes each product's synthetic files in the product's native form.

A fetch is idempotent and atomic: the item is generated into a temporary directory next to its
final place, a ``_complete.json`` marker is written last, and the directory is moved into place
with one ``os.replace``. A killed fetch therefore leaves at most a temporary directory (cleaned
up by the next fetch of the same item), never a half item that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from pyproj import CRS, Transformer

from citycube.cities import get_city
from citycube.errors import SourceUnavailableError
from citycube.scratch import process_alive
from sources.base import SourceBackend, SourceItem
from sources.sample.acag import AcagNo2, AcagPm25
from sources.sample.copernicus_dem import CopernicusDemGlo30
from sources.sample.ghsl import GhsBuiltV, GhsPop
from sources.sample.glc import GlcFcs30d
from sources.sample.globfp import GlobfpHeight
from sources.sample.grids import COG_MEDIA_TYPE, cog_profile
from sources.sample.hilda import HildaPlus
from sources.sample.landsat import LandsatC2L2
from sources.sample.landsat_derived import LandsatNdvi, LandsatSurfaceTemperature
from sources.sample.odiac import Odiac
from sources.sample.osm import OsmBuildings, OsmGpsTraces, OsmRoads
from sources.sample.property import CityProperty
from sources.sample.records import CityElectricity, WorldBankIndicators
from sources.sample.viirs import ViirsVnl
from sources.sample.weather import Chelsa, Daymet
from sources.sample.world import (
    SYNTHETIC_NOTICE,
    GeneratedItem,
    RasterLayer,
    SampleProduct,
    synthetic_city,
)

SAMPLE_VERSION = "sample-1"
"""Version of the generators; bump it whenever any product's pixels change."""
COMPLETE_MARKER = "_complete.json"
"""Written last into an item directory; its presence means the item is whole."""
STAC_ITEM_FILE = "item.json"
"""STAC Item describing the files of an item."""

_STAC_EXTENSIONS = [
    "https://stac-extensions.github.io/projection/v1.1.0/schema.json",
    "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
]
_EO_EXTENSION = "https://stac-extensions.github.io/eo/v1.1.0/schema.json"


def _all_products() -> dict[str, SampleProduct]:
    products: list[SampleProduct] = [
        LandsatC2L2(),
        CopernicusDemGlo30(),
        GlcFcs30d(),
        GhsPop(),
        GhsBuiltV(),
        Odiac(),
        LandsatNdvi(),
        LandsatSurfaceTemperature(),
        ViirsVnl(),
        HildaPlus(),
        Chelsa(),
        Daymet(),
        AcagNo2(),
        AcagPm25(),
        CityProperty(),
        OsmRoads(),
        OsmBuildings(),
        GlobfpHeight(),
        OsmGpsTraces(),
        CityElectricity(),
        WorldBankIndicators(),
    ]
    return {p.product_id: p for p in products}


def _years_for(generator: SampleProduct, city: str, seed: int) -> list[int] | None:
    """Years a product covers for one city (products with city-specific years say so)."""
    city_years = getattr(generator, "city_years", None)
    if city_years is not None:
        return city_years(city, seed)
    return generator.years()


class SampleBackend(SourceBackend):
    """Offline default backend: deterministic synthetic stand-ins for every source product."""

    name = "sample"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.version = SAMPLE_VERSION
        self._products = _all_products()

    # ---- catalogue ---------------------------------------------------------------------------

    def products(self) -> list[str]:
        """Product ids this backend serves."""
        return list(self._products)

    def product(self, product: str) -> SampleProduct:
        """The generator of a product, with an error that lists the valid ids."""
        if product not in self._products:
            raise ValueError(
                f"unknown sample product {product!r}; choose one of: {', '.join(self._products)}"
            )
        return self._products[product]

    def source_years(self, product: str, city: str) -> list[int] | None:
        """Years the product covers for a city; None for a static product."""
        generator = self.product(product)
        get_city(city)
        return _years_for(generator, city, self.seed)

    # ---- fetch -------------------------------------------------------------------------------

    def item_dir(self, product: str, city: str, source_year: int | None, dest: Path) -> Path:
        """Where an item's files live: ``dest/<product>/<city>/<year or 'static'>``."""
        return Path(dest) / product / city / ("static" if source_year is None else str(source_year))

    def fetch(self, product: str, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Generate (or reuse) the files of one product, city and source year."""
        generator = self.product(product)
        get_city(city)
        self._check_year(generator, city, source_year)
        final = self.item_dir(product, city, source_year, dest)
        reused = self._reuse(final, product, city, source_year)
        if reused is not None:
            return reused

        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(final)
        staging = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            generated = generator.generate(synthetic_city(city, self.seed), source_year)
            self._write_item(staging, generated, product, city, source_year)
            _install(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when it was installed
        item = self._reuse(final, product, city, source_year)
        if item is None:
            raise RuntimeError(f"sample item {final} vanished right after it was written")
        return item

    def _check_year(self, generator: SampleProduct, city: str, source_year: int | None) -> None:
        years = _years_for(generator, city, self.seed)
        if years is None:
            if source_year is not None:
                raise ValueError(
                    f"{generator.product_id} is static; fetch it with source_year=None"
                )
            return
        if not years:
            raise SourceUnavailableError(
                f"{generator.product_id} does not cover {city}",
                reason="outside_source_coverage",
            )
        if source_year is None:
            raise ValueError(
                f"{generator.product_id} is not static; pass one of its source years "
                f"{years[0]}–{years[-1]}"
            )
        if source_year not in years:
            raise SourceUnavailableError(
                f"{generator.product_id} has no source year {source_year} for {city}; "
                f"it covers {', '.join(str(y) for y in years)}",
                reason="source_year_missing",
            )

    def _reuse(
        self, final: Path, product: str, city: str, source_year: int | None
    ) -> SourceItem | None:
        """The item described by a complete marker of this version and seed, if any."""
        marker_path = final / COMPLETE_MARKER
        try:
            marker = json.loads(marker_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if marker.get("version") != self.version or marker.get("seed") != self.seed:
            return None
        files = {role: final / name for role, name in marker.get("files", {}).items()}
        if not files or not all(path.exists() for path in files.values()):
            return None
        extra = dict(marker.get("extra", {}))
        extra["stac_item"] = str(final / STAC_ITEM_FILE)
        return SourceItem(
            product=product,
            city=city,
            source_year=source_year,
            files=files,
            source_id=f"sample:{product}",
            version=self.version,
            synthetic=True,
            extra=extra,
        )

    def _write_item(
        self,
        staging: Path,
        generated: GeneratedItem,
        product: str,
        city: str,
        source_year: int | None,
    ) -> None:
        """Write rasters, STAC item and (last) the completion marker into ``staging``."""
        tags = {
            "SYNTHETIC": "true",
            "CITYCUBE_PRODUCT": product,
            "CITYCUBE_NOTICE": SYNTHETIC_NOTICE,
            "CITYCUBE_CITY": city,
            "CITYCUBE_SOURCE_YEAR": "static" if source_year is None else str(source_year),
            "CITYCUBE_GENERATOR": f"sample:{product} {self.version} seed={self.seed}",
        }
        for layer in generated.layers:
            if isinstance(layer, RasterLayer):
                write_cog(staging / layer.filename, layer, tags)
            else:
                layer.write(staging / layer.filename, tags)
        stac = stac_item(generated, product, city, source_year)
        _write_json(staging / STAC_ITEM_FILE, stac)
        extra = {
            **generated.extra,
            "notice": SYNTHETIC_NOTICE,
            "item_id": generated.item_id,
            "seed": str(self.seed),
        }
        marker = {
            "product": product,
            "city": city,
            "source_year": source_year,
            "source_id": f"sample:{product}",
            "version": self.version,
            "seed": self.seed,
            "synthetic": True,
            "files": {layer.role: layer.filename for layer in generated.layers},
            "stac_item": STAC_ITEM_FILE,
            "extra": extra,
        }
        _write_json(staging / COMPLETE_MARKER, marker)


# --------------------------------------------------------------------------------------------
# Files.
# --------------------------------------------------------------------------------------------


def write_cog(path: Path, layer: RasterLayer, tags: dict[str, str]) -> None:
    """Write a layer as a DEFLATE-compressed Cloud Optimized GeoTIFF with synthetic tags."""
    data = layer.data
    resampling = "nearest" if layer.categorical else "average"
    profile = cog_profile(layer.grid, data.shape[0], data.dtype.name, layer.nodata, resampling)
    profile["num_threads"] = "ALL_CPUS"
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        dst.update_tags(**tags, CITYCUBE_UNITS=layer.units)
        for band, description in enumerate(layer.band_descriptions, start=1):
            dst.set_band_description(band, description)
            dst.update_tags(band, units=layer.units)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def _install(staging: Path, final: Path) -> None:
    """Move a finished staging directory into place, replacing a stale or partial one."""
    stale: Path | None = None
    if final.exists():
        if _same_marker(final, staging):
            return  # an identical item was installed concurrently; keep it
        stale = final.parent / f".{final.name}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(final, stale)
        except FileNotFoundError:
            stale = None
    try:
        os.replace(staging, final)
    except OSError:
        if not _same_marker(final, staging):
            raise
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)


def _same_marker(a: Path, b: Path) -> bool:
    try:
        first = json.loads((a / COMPLETE_MARKER).read_text(encoding="utf-8"))
        second = json.loads((b / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return first.get("version") == second.get("version") and first.get("seed") == second.get("seed")


def _remove_abandoned(final: Path) -> None:
    """Delete staging directories of this item whose writing process no longer runs."""
    for leftover in final.parent.glob(f".{final.name}.*-*"):
        parts = leftover.name.rsplit("-", 2)
        writing = ".tmp-" in leftover.name and len(parts) == 3 and parts[1].isdigit()
        if writing and process_alive(int(parts[1])):
            continue
        shutil.rmtree(leftover, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# STAC.
# --------------------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _footprint(
    bounds: tuple[float, float, float, float], crs: CRS
) -> tuple[list[float], dict[str, Any]]:
    """WGS84 bbox and polygon of a box in ``crs`` (edges densified before reprojection)."""
    xmin, ymin, xmax, ymax = bounds
    n = 16
    xs = np.concatenate(
        [
            np.linspace(xmin, xmax, n),
            np.full(n, xmax),
            np.linspace(xmax, xmin, n),
            np.full(n, xmin),
        ]
    )
    ys = np.concatenate(
        [
            np.full(n, ymax),
            np.linspace(ymax, ymin, n),
            np.full(n, ymin),
            np.linspace(ymin, ymax, n),
        ]
    )
    if crs.to_epsg() != 4326:
        lon, lat = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform(xs, ys)
    else:
        lon, lat = xs, ys
    ring = [[round(float(a), 7), round(float(b), 7)] for a, b in zip(lon, lat, strict=True)]
    ring.append(ring[0])
    bbox = [
        round(float(np.min(lon)), 7),
        round(float(np.min(lat)), 7),
        round(float(np.max(lon)), 7),
        round(float(np.max(lat)), 7),
    ]
    return bbox, {"type": "Polygon", "coordinates": [ring]}


def stac_item(
    generated: GeneratedItem, product: str, city: str, source_year: int | None
) -> dict[str, Any]:
    """A STAC Item (plain JSON) for the generated files, with projection and raster fields."""
    first = generated.layers[0]
    if isinstance(first, RasterLayer):
        crs = CRS.from_user_input(first.grid.crs)
        bounds = first.grid.bounds
    else:
        if first.crs is None or first.bounds is None:
            raise ValueError(f"the first layer of {generated.item_id} must be spatial")
        crs, bounds = CRS.from_user_input(first.crs), first.bounds
    bbox, geometry = _footprint(bounds, crs)
    properties: dict[str, Any] = {
        "datetime": _iso(generated.timestamp),
        "proj:epsg": crs.to_epsg(),
        "proj:wkt2": crs.to_wkt(),
        "proj:bbox": list(bounds),
        "citycube:synthetic": True,
        "citycube:product": product,
        "citycube:city": city,
        "citycube:source_year": source_year,
        "citycube:notice": SYNTHETIC_NOTICE,
    }
    if generated.start_datetime is not None:
        properties["start_datetime"] = _iso(generated.start_datetime)
    if generated.end_datetime is not None:
        properties["end_datetime"] = _iso(generated.end_datetime)
    if isinstance(first, RasterLayer):
        t = first.grid.transform
        properties["proj:transform"] = [t.a, t.b, t.c, t.d, t.e, t.f]
        properties["proj:shape"] = [first.grid.height, first.grid.width]
    properties.update(generated.properties)
    assets: dict[str, Any] = {}
    for layer in generated.layers:
        if not isinstance(layer, RasterLayer):
            assets[layer.role] = {
                "href": f"./{layer.filename}",
                "type": layer.media_type,
                "title": layer.title,
                "roles": [layer.role],
                **layer.stac_fields(),
            }
            continue
        assets[layer.role] = {
            "href": f"./{layer.filename}",
            "type": COG_MEDIA_TYPE,
            "title": layer.title,
            "roles": [layer.role],
            "raster:bands": layer.stac_bands(),
        }
    extensions = list(_STAC_EXTENSIONS)
    if "eo:cloud_cover" in properties:
        extensions.append(_EO_EXTENSION)
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": extensions,
        "id": generated.item_id,
        "bbox": bbox,
        "geometry": geometry,
        "properties": properties,
        "links": [],
        "assets": assets,
    }
