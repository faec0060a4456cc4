"""3D-GloBFP building footprints with heights, from the provider's zipped shapefile tiles.

The provider lists its tiles as JSON file lists (one per dataset part, figshare's article file
lists); each file name carries the tile's extent in degrees. The tiles meeting the city window
are downloaded through the shared manager, their shapefiles read in place (``/vsizip/``) and
cut to the window, and the footprints written in the sample twin's form: one GeoPackage layer
``buildings`` with ``id`` and ``height`` (m) in EPSG:4326, which processing rasterises.

A ``coverage`` file says where the item reports: the union of the listed tiles within the
window, minus the footprints whose height is missing or out of range. Ground no tile covers, or
under a building without a usable height, is therefore unavailable, never a height of 0.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pyogrio
import shapely
from pyproj import CRS

from citycube.catalogue.cities import get_city
from citycube.errors import SourceFetchError, SourceReadError, SourceUnavailableError
from citycube.items.protocol import SourceItem, SourceProduct
from citycube.items.rasters import transformer
from citycube.items.staging import StagedFiles, install_item
from sources.downloads import Downloaded, DownloadManager, redact_url
from sources.http.base import PROVENANCE_FILE, http_source_info
from sources.http.options import HttpFamilyOptions
from sources.http.spec import HttpVectorProductSpec
from sources.osm.base import window_wgs84

COVERAGE_FILE = "coverage.geojson"
"""Where the item reports (listed tiles minus footprints without a usable height)."""
WGS84 = CRS.from_epsg(4326)


@dataclass(frozen=True)
class ListedTile:
    """One tile file of the provider's listings."""

    tile: str
    """Tile id from the file name."""
    name: str
    """File name."""
    url: str
    """Where to download it."""
    bounds: tuple[float, float, float, float]
    """(west, south, east, north) in degrees, from the file name."""


class GlobfpFootprints(SourceProduct):
    """3D-GloBFP: one static release of footprints with heights, tiled by extent."""

    def __init__(
        self, spec: HttpVectorProductSpec, options: HttpFamilyOptions, manager: DownloadManager
    ) -> None:
        self.spec = spec
        self.options = options
        self.manager = manager
        self.base_url = options.base_urls.get(spec.product, spec.base_url).rstrip("/")
        self.info = http_source_info(spec)

    # -- protocol -------------------------------------------------------------------------

    def source_years(self, city: str) -> list[int] | None:
        """Static: one release (reference year in the spec) serves every year."""
        get_city(city)
        return None

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Download (or reuse) the city's tiles and install the footprints in the twin's form."""
        get_city(city)
        if source_year is not None:
            raise ValueError(f"{self.product_id} is static; fetch it with source_year None")

        def write(staging: Path) -> StagedFiles:
            return self._write_item(staging, city)

        installed = install_item(self.item_dir(city, None, dest), self.identity(city), write)
        return self.installed_source_item(installed, city, None)

    def identity(self, city: str) -> dict[str, Any]:
        """What a completion record must say for an item to be reused."""
        spec_text = json.dumps(self.spec.model_dump(mode="json"), sort_keys=True)
        return {
            "product": self.product_id,
            "city": city,
            "source_year": None,
            "source_id": self.info.source_id,
            "version": self.info.version,
            "server": redact_url(self.base_url),
            "spec_digest": hashlib.sha256(spec_text.encode()).hexdigest()[:16],
            "synthetic": False,
        }

    # -- listings and tiles ---------------------------------------------------------------

    def label(self, city: str) -> str:
        """Who is asking, for error messages."""
        return f"{self.info.source_id}: {city} (static, {self.spec.reference_year})"

    def listed_tiles(self, city: str) -> tuple[list[ListedTile], list[str], list[dict[str, Any]]]:
        """Every tile the listings name (first of each tile id), the duplicates left out and
        the listings' provenance."""
        pattern = re.compile(self.spec.listing.name_pattern)
        tiles: dict[str, ListedTile] = {}
        duplicates: list[str] = []
        served: list[dict[str, Any]] = []
        for path in self.spec.listing.listings:
            url = f"{self.base_url}/{path.lstrip('/')}"
            got = self.manager.fetch(url, sha256=None)
            served.append({"url": redact_url(url), "sha256": got.sha256, "bytes": got.size})
            try:
                entries = json.loads(got.path.read_text(encoding="utf-8"))
                if not isinstance(entries, list):
                    raise ValueError("not a JSON array of files")
                listed = [(str(e["name"]), str(e["download_url"])) for e in entries]
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                self.manager.discard(url)
                raise SourceReadError(
                    f"{self.label(city)}: file listing {redact_url(url)} is not a list of "
                    f"{{name, download_url}} entries ({exc}); it was dropped from the download "
                    "cache: fetch again, or fix listing in schemas/http_products.yaml"
                ) from None
            for name, download_url in listed:
                match = pattern.match(name)
                if match is None:
                    continue
                tile = match["tile"]
                if tile in tiles:
                    duplicates.append(name)
                    continue
                bounds = tuple(float(match[k]) for k in ("west", "south", "east", "north"))
                tiles[tile] = ListedTile(tile, name, download_url, bounds)  # type: ignore[arg-type]
        return list(tiles.values()), duplicates, served

    def _download_tile(self, tile: ListedTile, city: str) -> Downloaded:
        try:
            return self.manager.fetch(tile.url, sha256=self.spec.sha256.get(tile.name))
        except SourceFetchError as exc:
            if exc.status == 404:
                raise SourceFetchError(
                    f"{self.label(city)}: tile {tile.name} is listed but its file "
                    f"{redact_url(tile.url)} is not on the server (404): the listing is stale; "
                    "fetch again later",
                    transient=False,
                    status=404,
                ) from None
            raise

    def _corrupt(self, tile: ListedTile, city: str, detail: object) -> SourceReadError:
        self.manager.discard(tile.url)
        return SourceReadError(
            f"{self.label(city)}: served file {tile.name} ({redact_url(tile.url)}) is corrupt or "
            f"truncated: {detail}. It was dropped from the download cache; fetch again, and "
            "report it to the provider if it persists"
        )

    def read_tile(
        self, tile: ListedTile, got: Downloaded, city: str, window: tuple[float, ...]
    ) -> tuple[gpd.GeoDataFrame, str]:
        """The tile's footprints meeting the window, in EPSG:4326 with a ``height`` column,
        and the CRS they were served in."""
        try:
            with zipfile.ZipFile(got.path) as archive:
                layers = sorted(n for n in archive.namelist() if n.lower().endswith(".shp"))
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise self._corrupt(tile, city, exc) from None
        if not layers:
            raise self._corrupt(tile, city, "the zip holds no shapefile")
        frames = []
        served_crs = self.spec.served_crs
        for layer in layers:
            href = f"/vsizip/{{{got.path}}}/{layer}"
            try:
                info = pyogrio.read_info(href)
                crs = CRS.from_user_input(info["crs"]) if info.get("crs") else None
                served_crs = crs.to_string() if crs else self.spec.served_crs
                source_crs = crs or CRS.from_user_input(self.spec.served_crs)
                if self.spec.height_column not in info["fields"]:
                    raise SourceReadError(
                        f"{self.label(city)}: {tile.name} layer {layer} has no column "
                        f"{self.spec.height_column!r} (it has {list(info['fields'])}): the file "
                        "is not the product's, or height_column in schemas/http_products.yaml "
                        "is wrong"
                    )
                bbox = _bounds_in(window, source_crs)
                frame = pyogrio.read_dataframe(
                    href, columns=[self.spec.height_column], bbox=bbox, use_arrow=False
                )
            except SourceReadError:
                raise
            except Exception as exc:  # GDAL reports damaged files in many ways
                raise self._corrupt(tile, city, f"{layer}: {exc}") from None
            if frame.crs is None:
                frame = frame.set_crs(source_crs)
            frame = frame.to_crs(WGS84)
            heights = np.asarray(
                _as_float(frame[self.spec.height_column].to_numpy()), dtype=np.float64
            )
            frames.append(gpd.GeoDataFrame({"height": heights}, geometry=frame.geometry.values))
        merged = gpd.GeoDataFrame(
            {"height": np.concatenate([f["height"].to_numpy() for f in frames])},
            geometry=np.concatenate([f.geometry.to_numpy() for f in frames]),
            crs=WGS84,
        )
        return merged, served_crs

    # -- writing --------------------------------------------------------------------------

    def _write_item(self, staging: Path, city: str) -> StagedFiles:
        window = window_wgs84(city)
        tiles, duplicates, served = self.listed_tiles(city)
        box = shapely.box(*window)
        meeting = [t for t in tiles if shapely.intersects(shapely.box(*t.bounds), box)]
        if not meeting:
            raise SourceUnavailableError(
                f"{self.label(city)}: none of the {len(tiles)} listed tiles meets the city "
                "window; the product does not cover it",
                reason="outside_source_coverage",
            )
        frames, crs_seen = [], set()
        for tile in meeting:
            got = self._download_tile(tile, city)
            frame, crs = self.read_tile(tile, got, city, window)
            frames.append(frame)
            crs_seen.add(crs)
            served.append(
                {
                    "url": redact_url(tile.url),
                    "name": tile.name,
                    "sha256": got.sha256,
                    "bytes": got.size,
                }
            )
        buildings = gpd.GeoDataFrame(
            {"height": np.concatenate([f["height"].to_numpy() for f in frames])},
            geometry=np.concatenate([f.geometry.to_numpy() for f in frames]),
            crs=WGS84,
        )
        buildings = buildings[buildings.intersects(box)].explode(index_parts=False)
        buildings = buildings[buildings.geom_type == "Polygon"]
        lo, hi = self.spec.height_valid_range
        heights = buildings["height"].to_numpy()
        usable = np.isfinite(heights) & (heights >= lo) & (heights <= hi)
        coverage = shapely.intersection(
            shapely.union_all([shapely.box(*t.bounds) for t in meeting]), box
        )
        unusable = buildings.geometry.to_numpy()[~usable]
        if len(unusable):
            coverage = shapely.difference(coverage, shapely.union_all(unusable))
        kept = buildings[usable]
        frame = gpd.GeoDataFrame(
            {
                "id": np.arange(1, len(kept) + 1, dtype=np.int64),
                "height": kept["height"].to_numpy(dtype=np.float64),
            },
            geometry=kept.geometry.to_numpy(),
            crs=WGS84,
        )
        tags = {
            "SYNTHETIC": "false",
            "CITYCUBE_PRODUCT": self.product_id,
            "CITYCUBE_SOURCE": self.info.source_id,
            "CITYCUBE_SOURCE_VERSION": self.spec.version,
            "CITYCUBE_CITY": city,
            "CITYCUBE_UNITS": "m",
        }
        name = self.spec.output_file.format(city=city)
        pyogrio.write_dataframe(
            frame,
            staging / name,
            layer=self.spec.output_layer,
            driver="GPKG",
            geometry_type="Polygon",
            dataset_metadata=tags,
            layer_metadata=tags,
        )
        gpd.GeoDataFrame({"part": [1]}, geometry=[coverage], crs=WGS84).to_file(
            staging / COVERAGE_FILE, driver="GeoJSON"
        )
        notes = {
            "tiles": " ".join(t.name for t in meeting),
            "buildings": str(len(frame)),
            "buildings_without_usable_height": str(int((~usable).sum())),
            "served_crs": " ".join(sorted(crs_seen)),
        }
        if duplicates:
            notes["duplicate_tiles_left_out"] = str(len(duplicates))
        provenance = {
            "product": self.product_id,
            "source_id": self.info.source_id,
            "version": self.spec.version,
            "city": city,
            "reference_year": self.spec.reference_year,
            "served_files": served,
            "notes": notes,
            "licence": self.spec.licence,
            "attribution": self.spec.attribution,
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2), encoding="utf-8")
        return StagedFiles(
            files={"data": name, "coverage": COVERAGE_FILE},
            extra={
                "units": "m",
                "reference_year": str(self.spec.reference_year),
                "served_files": str(len(served)),
                "provenance_file": PROVENANCE_FILE,
                **notes,
            },
        )


def _as_float(values: np.ndarray) -> np.ndarray:
    """Heights as floats; missing (None) becomes NaN."""
    out = np.full(len(values), np.nan)
    for i, value in enumerate(values):
        try:
            out[i] = float(value) if value is not None else np.nan
        except (TypeError, ValueError):
            out[i] = np.nan
    return out


def _bounds_in(window: tuple[float, ...], crs: CRS) -> tuple[float, float, float, float]:
    """The lon/lat window in a layer's CRS (for the read's bounding-box filter)."""
    if crs == WGS84 or crs.to_epsg() == 4326:
        return tuple(window)  # type: ignore[return-value]
    return tuple(transformer(WGS84, crs).transform_bounds(*window, densify_pts=21))  # type: ignore[return-value]
