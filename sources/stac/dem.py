"""Copernicus DEM GLO-30: a static mosaic of the 1° tiles that cover the city window.

The mosaic stays on the tiles' own geographic lattice (EPSG:4326, pixel centres on whole
arc-seconds, as the sample twin writes it), so tile pixels are copied, not resampled; only
each tile's part inside the window is read, and kept in the family's window cache (under the
city's ``static/`` folder), so a fetch retried after a failure at a later tile, or rerun after
the item was removed, reads no tile window again. GLO-30 publishes no tile over open sea: pixels
that no tile covers stay nodata (unavailable), and so do the product's own voids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pystac
import rasterio
from affine import Affine
from odc.geo.geobox import GeoBox

from citycube.errors import SourceReadError, SourceUnavailableError
from citycube.items.staging import StagedFiles
from sources.stac.adapter import FetchContext
from sources.stac.grids import (
    city_bbox_wgs84,
    geographic_grid,
)
from sources.stac.reading import AssetRead, CorruptAssetError, gdal_env, vsicurl
from sources.stac.retrying import TransientError, is_transient_gdal_message
from sources.stac.search import SearchRequest
from sources.stac.windows import window_key
from sources.stac.writing import PROVENANCE_FILE, Layer, write_cog, write_provenance

STATIC_PERIOD = "static"
"""The window cache's folder for a static product's tiles."""


def tile_lattice(ctx: FetchContext, item: pystac.Item, asset_key: str) -> Affine:
    """A tile's pixel lattice: its ``proj:transform`` if the item says, else its header."""
    asset = item.assets.get(asset_key)
    if asset is None:
        raise SourceReadError(
            f"{ctx.where(item.id, asset_key)}: the item has no such asset", reason="missing_asset"
        )
    stated = asset.extra_fields.get("proj:transform") or item.properties.get("proj:transform")
    if stated is not None and len(stated) >= 6:
        return Affine(*[float(v) for v in stated[:6]])

    def header() -> Affine:
        try:
            with (
                rasterio.Env(**gdal_env(ctx.options)),
                rasterio.open(vsicurl(ctx.open_href(asset.href))) as src,
            ):
                return src.transform
        except rasterio.errors.RasterioError as exc:
            if is_transient_gdal_message(str(exc)):
                raise TransientError(str(exc)) from None
            raise CorruptAssetError(str(exc)) from None

    try:
        return ctx.policy.call(header)
    except CorruptAssetError as exc:
        raise SourceReadError(
            f"{ctx.where(item.id, asset_key)}: {ctx.signer.redact(str(exc))}",
            reason="corrupt_asset",
        ) from None


def read_tile(
    ctx: FetchContext, tile: pystac.Item, asset: str, grid: GeoBox, nodata: float
) -> AssetRead:
    """A tile's window on the mosaic grid: from the window cache when kept and whole, else read
    (with the retry policy) and kept; straight from the source when the family keeps nothing."""

    def read() -> AssetRead:
        return ctx.read(tile, asset, grid, fill=nodata, nodata=nodata)

    if ctx.windows is None:
        return read()
    key = window_key(tile, asset, grid, nodata, nodata)
    return ctx.windows.get(ctx.city, STATIC_PERIOD, tile.id, asset, key, read)


def compose(ctx: FetchContext, staging: Path) -> StagedFiles:
    """Search the tiles over the city window, paste their windows, write the mosaic."""
    spec = ctx.spec
    (band,) = spec.bands
    tiles = ctx.search(
        SearchRequest(
            api_url=spec.api_url or "",
            collection=spec.collection,
            bbox_wgs84=city_bbox_wgs84(ctx.city),
            datetime_interval=None,
        )
    )
    if not tiles:
        raise SourceUnavailableError(
            f"{ctx.where()}: the search found no tile over the city window",
            reason="no_tiles",
        )
    tiles = sorted(tiles, key=lambda t: t.id)
    grid = geographic_grid(ctx.city, tile_lattice(ctx, tiles[0], band.asset))
    nodata = np.float32(spec.output.nodata)
    mosaic = np.full(grid.shape, nodata, dtype=np.float32)
    used = []
    for tile in tiles:
        read = read_tile(ctx, tile, band.asset, grid, float(nodata))
        values = read.values.astype(np.float32)
        take = read.covered & (mosaic == nodata) & (values != nodata) & np.isfinite(values)
        mosaic[take] = values[take]
        used.append(
            {
                "id": tile.id,
                "collection": tile.collection_id,
                "pixels": int(take.sum()),
                "self_href": (tile.get_self_href() or "").split("?", 1)[0] or None,
                "assets": {band.asset: tile.assets[band.asset].href.split("?", 1)[0]},
            }
        )
    valid = mosaic != nodata
    if not valid.any():
        raise SourceUnavailableError(
            f"{ctx.where()}: the {len(tiles)} tile(s) found hold no elevation in the city window",
            reason="no_valid_pixels",
        )
    item_id = f"{spec.collection}_{ctx.city}_mosaic"
    out = spec.output
    layer = Layer(
        "data",
        f"{item_id}.tif",
        out.nodata,
        out.band_descriptions,
        out.units,
        out.title,
        data=mosaic[None],
    )
    tags = {
        "SYNTHETIC": "false",
        "CITYCUBE_PRODUCT": spec.product,
        "CITYCUBE_CITY": ctx.city,
        "CITYCUBE_SOURCE_YEAR": "static",
        "CITYCUBE_SOURCE": ctx.source_id,
        "CITYCUBE_TILES": ",".join(t["id"] for t in used),
    }
    write_cog(staging / layer.filename, layer, grid, tags)
    write_provenance(
        staging / PROVENANCE_FILE,
        item_id=item_id,
        product=spec.product,
        city=ctx.city,
        source_year=None,
        grid=grid,
        layers=[layer],
        sources=used,
        properties={"citycube:source": ctx.source_id, "citycube:composite": "mosaic"},
    )
    extra = {
        "item_id": item_id,
        "tile_ids": ",".join(t["id"] for t in used),
        "units": out.units,
        "nodata": str(out.nodata),
        "valid_share": f"{float(valid.mean()):.6f}",
        "stac_item_file": PROVENANCE_FILE,
    }
    return StagedFiles(files={"data": layer.filename}, extra=extra)
