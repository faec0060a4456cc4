"""Landsat Collection 2 Level-2 annual composites: RGB (OPT), NDVI and surface temperature.

A year's scenes over the city window are searched, those of other platforms or above the
cloud-cover limit are dropped (after the search: not every STAC API applies ``query``), and the
least cloudy ``max_scenes`` are read. For each scene only the city window of the QA_PIXEL asset
and the recipe's bands is read (warped from a neighbouring UTM zone when the scene is there),
each band is scaled by the scene's own ``raster:bands`` scale and offset, and a pixel counts
only when it is clear: no fill (swath edges, Landsat 7 SLC-off gaps), dilated cloud, cirrus,
cloud, cloud shadow or snow, and its raw value is not fill. The composites are per-pixel
statistics over the clear observations (see ``sources.stac.pixels``); a pixel with none is
nodata, never 0.

A scene's clear mask is kept on disk (``sources.stac.clearmasks``), so the three products of a
city-year read its QA_PIXEL window once, and so is every band window it reads
(``sources.stac.windows``), so OPT and NDVI read the red band once and a retried fetch reads only
the windows it lacks. Scenes are read by a bounded thread pool
(``read_workers``); their observations are stacked in the order of the selected scenes, never in
the order reads finish, so a composite is the same bit for bit however the reads interleave.

Files match the sample twins: OPT is uint8 RGB (nodata 0) plus a QA_PIXEL-form layer (bit 6
clear where the composite has a value, bit 0 fill elsewhere); NDVI is float32 (nodata −9999);
surface temperature is float32 Kelvin, band 1 the annual mean and band 2 the annual median
(nodata −9999).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pystac

from citycube.errors import SourceUnavailableError
from citycube.stac_spec import Recipe, StacProductSpec
from citycube.staging import StagedFiles
from sources.stac import pixels
from sources.stac.adapter import FetchContext
from sources.stac.grids import TargetGrid, city_bbox_wgs84, landsat_grid
from sources.stac.reading import AssetRead
from sources.stac.records import unsigned
from sources.stac.search import SearchRequest, cloud_cover, year_interval
from sources.stac.writing import PROVENANCE_FILE, Layer, write_cog, write_provenance

QA_NODATA = pixels.QA_FILL
"""Nodata of the QA layer (the fill bit alone), as the sample twin writes it."""
COMPOSITE_RULE = {
    Recipe.RGB_UINT8: "per-band median of clear observations, fixed reflectance-to-uint8 map",
    Recipe.NDVI: "median of per-observation NDVI over clear observations",
    Recipe.SURFACE_TEMPERATURE: "mean and median of clear surface-temperature observations",
}
"""The composite rule, recorded with every item."""


def select_scenes(
    items: Sequence[pystac.Item],
    spec: StacProductSpec,
    max_cloud_cover: float | None,
    max_scenes: int,
) -> list[pystac.Item]:
    """The scenes a composite reads: allowed platforms, cloud cover within the limit (scenes
    that do not say are kept last), the least cloudy first, at most ``max_scenes``."""
    kept = []
    for item in items:
        platform = item.properties.get("platform")
        if spec.platforms and platform not in spec.platforms:
            continue
        cover = cloud_cover(item)
        if max_cloud_cover is not None and cover is not None and cover > max_cloud_cover:
            continue
        kept.append(item)
    kept.sort(key=lambda i: (cloud_cover(i) is None, cloud_cover(i) or 0.0, i.id))
    return kept[:max_scenes]


def _sensor(item: pystac.Item) -> str:
    """'LC08', 'LE07', … from the scene id (the platform name when the id is not USGS's)."""
    head = item.id.split("_", 1)[0]
    return head if len(head) == 4 else str(item.properties.get("platform", "unknown"))


def clear_mask(ctx: FetchContext, item: pystac.Item, grid: TargetGrid) -> np.ndarray:
    """Where a scene has a clear pixel on the grid (none of the invalid QA bits set, inside its
    footprint): read from QA_PIXEL, or loaded when another product of the city-year read it."""
    spec = ctx.spec
    qa_spec = spec.qa
    assert qa_spec is not None

    def compute() -> np.ndarray:
        qa = ctx.read(item, qa_spec.asset, grid, fill=QA_NODATA, nodata=QA_NODATA)
        return pixels.qa_clear(qa.values, qa_spec.mask) & qa.covered

    asset = item.assets.get(qa_spec.asset)
    if ctx.clear_masks is None or asset is None or ctx.year is None:
        return compute()
    key = {
        "scene": item.id,
        "qa_href": unsigned(asset.href),
        **_grid_key(grid),
        "invalid_mask": qa_spec.mask,
    }
    return ctx.clear_masks.get(ctx.city, ctx.year, item.id, key, compute)


def band_window(
    ctx: FetchContext,
    item: pystac.Item,
    asset_key: str,
    grid: TargetGrid,
    *,
    fill: float,
    nodata: float | None,
) -> AssetRead:
    """One band's window of a scene on the grid: read from the asset, or loaded when a product
    of the city-year (or an earlier attempt of this fetch) read it already."""

    def read() -> AssetRead:
        return ctx.read(item, asset_key, grid, fill=fill, nodata=nodata)

    asset = item.assets.get(asset_key)
    if ctx.windows is None or asset is None or ctx.year is None:
        return read()
    key = {
        "scene": item.id,
        "asset": asset_key,
        "href": unsigned(asset.href),
        **_grid_key(grid),
        "band": 1,
        "fill": float(fill),
        "nodata": None if nodata is None else float(nodata),
    }
    return ctx.windows.get(ctx.city, ctx.year, item.id, asset_key, key, read)


def _grid_key(grid: TargetGrid) -> dict[str, Any]:
    """What identifies the target grid in a cache key."""
    return {
        "crs": grid.crs.to_wkt(),
        "transform": [float(v) for v in tuple(grid.transform)[:6]],
        "shape": [int(v) for v in grid.shape],
    }


def _observations(
    ctx: FetchContext, item: pystac.Item, grid: TargetGrid
) -> tuple[list[np.ndarray], int]:
    """The recipe's bands of one scene on the grid, physical values, NaN where not clear."""
    spec = ctx.spec
    clear = clear_mask(ctx, item, grid)
    platform = item.properties.get("platform")
    bands = []
    for band in spec.bands:
        key = band.asset_for(platform)
        scale, offset = ctx.scale_offset(item, key)
        fill = 0 if spec.fill_value is None else spec.fill_value
        read = band_window(ctx, item, key, grid, fill=fill, nodata=spec.fill_value)
        values = pixels.scale_dn(read.values, scale, offset, spec.fill_value)
        bands.append(pixels.masked(values, clear & read.covered))
    return bands, int(clear.sum())


def read_scenes(
    ctx: FetchContext, scenes: Sequence[pystac.Item], grid: TargetGrid
) -> list[tuple[list[np.ndarray], int]]:
    """Every scene's observations, in the order of ``scenes`` whatever order reads finish in.

    Up to ``read_workers`` scenes are read at once (GDAL releases the GIL while it waits on
    ranges and decodes); each asset read also takes one of its host's ``per_host`` slots. The
    first failure, in scene order, is raised once every started read has ended, and reads not
    yet started are cancelled.
    """
    workers = min(ctx.options.read_workers, len(scenes))
    if workers <= 1:
        return [_observations(ctx, item, grid) for item in scenes]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stac-read") as pool:
        futures = [pool.submit(_observations, ctx, item, grid) for item in scenes]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def compose(ctx: FetchContext, staging: Path) -> StagedFiles:
    """Search, read and composite a city-year, then write the item's files into ``staging``."""
    spec = ctx.spec
    assert ctx.year is not None
    grid = landsat_grid(ctx.city)
    found = ctx.search(
        SearchRequest(
            api_url=spec.api_url or "",
            collection=spec.collection,
            bbox_wgs84=city_bbox_wgs84(ctx.city),
            datetime_interval=year_interval(ctx.year),
        )
    )
    limit = ctx.options.max_cloud_cover
    limit = spec.max_cloud_cover if limit is None else limit
    scenes = select_scenes(found, spec, limit, ctx.options.max_scenes or spec.max_scenes)
    if not scenes:
        raise SourceUnavailableError(
            f"{ctx.where()}: the search found {len(found)} scene(s) over the city, none of "
            f"platform {list(spec.platforms)} with eo:cloud_cover ≤ {limit} %",
            reason="no_scenes",
        )
    stacks: list[list[np.ndarray]] = [[] for _ in spec.bands]
    used: list[dict[str, Any]] = []
    for item, (bands, clear_pixels) in zip(scenes, read_scenes(ctx, scenes, grid), strict=True):
        for stack, band in zip(stacks, bands, strict=True):
            stack.append(band)
        used.append(_provenance(item, spec, clear_pixels))
    arrays = [np.stack(stack) for stack in stacks]
    del stacks
    layers = _layers(spec, arrays, item_id=_item_id(spec, ctx))
    valid = _valid(spec, layers[0])
    if not valid.any():
        raise SourceUnavailableError(
            f"{ctx.where()}: none of the {len(scenes)} scene(s) has a clear pixel in the city "
            "window (cloud, shadow, snow or gaps everywhere)",
            reason="no_clear_observation",
        )
    tags = {
        "SYNTHETIC": "false",
        "CITYCUBE_PRODUCT": spec.product,
        "CITYCUBE_CITY": ctx.city,
        "CITYCUBE_SOURCE_YEAR": str(ctx.year),
        "CITYCUBE_SOURCE": ctx.source_id,
        "CITYCUBE_COMPOSITE": COMPOSITE_RULE[spec.recipe],
        "CITYCUBE_SCENES": ",".join(s["id"] for s in used),
    }
    for layer in layers:
        write_cog(staging / layer.filename, layer, grid, tags)
    covers = [s["eo:cloud_cover"] for s in used if s["eo:cloud_cover"] is not None]
    write_provenance(
        staging / PROVENANCE_FILE,
        item_id=_item_id(spec, ctx),
        product=spec.product,
        city=ctx.city,
        source_year=ctx.year,
        grid=grid,
        layers=layers,
        sources=used,
        properties={
            "citycube:composite": COMPOSITE_RULE[spec.recipe],
            "citycube:source": ctx.source_id,
            "citycube:valid_share": round(float(valid.mean()), 6),
        },
    )
    extra = {
        "item_id": _item_id(spec, ctx),
        "scene_id": ",".join(s["id"] for s in used),
        "scene_count": str(len(used)),
        "sensor": ",".join(sorted({s["sensor"] for s in used})),
        "cloud_cover_percent": f"{np.mean(covers):.2f}" if covers else "unknown",
        "composite": COMPOSITE_RULE[spec.recipe],
        "units": spec.output.units,
        "nodata": str(spec.output.nodata),
        "valid_share": f"{float(valid.mean()):.6f}",
        "stac_item_file": PROVENANCE_FILE,
    }
    return StagedFiles(files={layer.role: layer.filename for layer in layers}, extra=extra)


def _item_id(spec: StacProductSpec, ctx: FetchContext) -> str:
    return f"{spec.collection}_{spec.product}_{ctx.city}_{ctx.year}"


def _provenance(item: pystac.Item, spec: StacProductSpec, clear_pixels: int) -> dict[str, Any]:
    """What the item records of a source scene: ids and unsigned hrefs, never a token."""
    platform = item.properties.get("platform")
    keys = [b.asset_for(platform) for b in spec.bands]
    assert spec.qa is not None
    keys.append(spec.qa.asset)
    self_link = item.get_self_href()
    return {
        "id": item.id,
        "collection": item.collection_id,
        "platform": platform,
        "sensor": _sensor(item),
        "datetime": None if item.datetime is None else item.datetime.isoformat(),
        "eo:cloud_cover": cloud_cover(item),
        "proj:code": _proj_code(item),
        "clear_pixels": clear_pixels,
        "self_href": self_link.split("?", 1)[0] if self_link else None,
        "assets": {key: item.assets[key].href.split("?", 1)[0] for key in keys},
    }


def _proj_code(item: pystac.Item) -> str | None:
    code = item.properties.get("proj:code")
    if code is None and item.properties.get("proj:epsg") is not None:
        code = f"EPSG:{item.properties['proj:epsg']}"
    return None if code is None else str(code)


def _layers(spec: StacProductSpec, arrays: list[np.ndarray], item_id: str) -> list[Layer]:
    """The recipe's files from the per-band observation stacks (scenes, rows, cols)."""
    out = spec.output
    if spec.recipe is Recipe.RGB_UINT8:
        assert spec.reflectance_range is not None
        low, high = spec.reflectance_range
        medians = [pixels.median_composite(stack) for stack in arrays]
        valid = np.logical_and.reduce([np.isfinite(m) for m in medians])
        rgb = np.stack(
            [pixels.reflectance_to_uint8(np.where(valid, m, np.nan), low, high) for m in medians]
        )
        return [
            Layer(
                "data",
                f"{item_id}_SR_RGB.TIF",
                rgb,
                out.nodata,
                out.band_descriptions,
                out.units,
                out.title,
            ),
            Layer(
                "qa",
                f"{item_id}_QA_PIXEL.TIF",
                pixels.composite_qa(valid)[None],
                QA_NODATA,
                ("qa_pixel",),
                "bit field",
                "Composite quality: bit 6 clear where a value exists, bit 0 fill elsewhere",
                categorical=True,
            ),
        ]
    if spec.recipe is Recipe.NDVI:
        red, nir = arrays
        index = pixels.median_composite(pixels.ndvi(red, nir))
        data = pixels.to_nodata(index, out.nodata, out.dtype)[None]
        name = f"{item_id}_NDVI.TIF"
    elif spec.recipe is Recipe.SURFACE_TEMPERATURE:
        (kelvin,) = arrays
        mean = pixels.mean_composite(kelvin)
        median = pixels.median_composite(kelvin)
        data = np.stack([pixels.to_nodata(v, out.nodata, out.dtype) for v in (mean, median)])
        name = f"{item_id}_ST_ANNUAL.TIF"
    else:
        raise ValueError(f"{spec.product}: recipe {spec.recipe} is not a Landsat composite")
    return [Layer("data", name, data, out.nodata, out.band_descriptions, out.units, out.title)]


def _valid(spec: StacProductSpec, data_layer: Layer) -> np.ndarray:
    """Pixels of the data file holding a value."""
    return ~(data_layer.data == np.asarray(spec.output.nodata, data_layer.data.dtype)).all(axis=0)
