"""Landsat Collection 2 Level-2 annual composites: RGB (OPT), NDVI and surface temperature.

A year's scenes over the city window are searched, those of other platforms (named in any
form: USGS writes 'LANDSAT_7') or above the cloud-cover limit are dropped (after the search: not
every STAC API applies ``query``), so is a scene whose item lacks an asset the recipe reads
(recorded with the item, the others still composited), and the least cloudy ``max_scenes`` are
read, once every band's scale and offset is known (``raster:bands``, else the spec's
``scale_fallback``; a scene with neither fails before any read). For each scene only the city
window of the QA_PIXEL asset and the recipe's bands is read (warped from a neighbouring UTM
zone when the scene is there), each band is scaled, and a pixel counts only when it is clear:
no fill (swath edges, Landsat 7 SLC-off gaps), dilated cloud, cirrus, cloud, cloud shadow or
snow, its raw value is not fill, and (with a ``valid_range``) every band lies in the valid
range; observations left out for range are counted and recorded. The composites are per-pixel
statistics over the clear observations (see ``sources.stac.pixels``); a pixel with none is
nodata, never 0.

Composites are computed block by block over the output grid (``composite_block_px``; see
``composite``) and written into their files block by block, so memory follows the block and the
scene count, not the city. A scene's clear
mask is kept on disk block by block (``sources.stac.clearmasks``), so the three products of a
city-year read its QA_PIXEL window once, and so is every band window it reads
(``sources.stac.windows``), so OPT and NDVI read the red band once and a retried fetch reads only
the blocks it lacks. Scenes are read by a bounded thread pool (``read_workers``); their
observations are stacked in the order of the selected scenes, never in the order reads finish,
so a composite is the same bit for bit however the reads interleave.

Files match the sample twins: OPT is uint8 RGB (nodata 0) plus a QA_PIXEL-form layer (bit 6
clear where the composite has a value, bit 0 fill elsewhere); NDVI is float32 (nodata −9999);
surface temperature is float32 Kelvin, band 1 the annual mean and band 2 the annual median
(nodata −9999).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pystac
from odc.geo.geobox import GeoBox

from citycube.errors import SourceUnavailableError
from citycube.items.staging import StagedFiles
from sources.stac import pixels
from sources.stac.adapter import FetchContext
from sources.stac.clearmasks import ClearMaskCache
from sources.stac.grids import (
    city_bbox_wgs84,
    landsat_grid,
)
from sources.stac.reading import AssetRead, Block, grid_blocks
from sources.stac.records import unsigned
from sources.stac.search import SearchRequest, cloud_cover, year_interval
from sources.stac.spec import Recipe, StacProductSpec, platform_key
from sources.stac.windows import WindowCache, grid_key, window_key
from sources.stac.writing import PROVENANCE_FILE, CogBlocks, LayerFile, write_provenance

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
    """The scenes a composite reads: allowed platforms (named in any form: 'LANDSAT_7' is
    'landsat-7'), cloud cover within the limit (scenes that do not say are kept last), the
    least cloudy first, at most ``max_scenes``."""
    allowed = {platform_key(p) for p in spec.platforms}
    kept = []
    for item in items:
        platform = platform_key(item.properties.get("platform"))
        if allowed and platform not in allowed:
            continue
        cover = cloud_cover(item)
        if max_cloud_cover is not None and cover is not None and cover > max_cloud_cover:
            continue
        kept.append(item)
    kept.sort(key=lambda i: (cloud_cover(i) is None, cloud_cover(i) or 0.0, i.id))
    return kept[:max_scenes]


@dataclass(frozen=True)
class DroppedScene:
    """A scene left out of a composite, and why."""

    id: str
    """The STAC item id."""
    reason: str
    """Stable reason code (``missing_asset``)."""
    detail: str
    """What it lacks, in words."""

    def as_dict(self) -> dict[str, str]:
        """As recorded in the item's provenance."""
        return {"id": self.id, "reason": self.reason, "detail": self.detail}


def scene_assets(spec: StacProductSpec, item: pystac.Item) -> list[str]:
    """The asset keys a composite reads of a scene: the recipe's bands, then the QA asset."""
    platform = item.properties.get("platform")
    keys = [band.asset_for(platform) for band in spec.bands]
    assert spec.qa is not None
    return [*keys, spec.qa.asset]


def complete_scenes(
    spec: StacProductSpec, scenes: Sequence[pystac.Item]
) -> tuple[list[pystac.Item], list[DroppedScene]]:
    """The scenes that list every asset the recipe reads, and those that do not (with why),
    each in the given order. A scene without its QA_PIXEL cannot be masked and one without a
    band has nothing to give: it is left out, and the others still make the composite."""
    complete, dropped = [], []
    for item in scenes:
        absent = [key for key in scene_assets(spec, item) if key not in item.assets]
        if absent:
            dropped.append(
                DroppedScene(
                    item.id,
                    "missing_asset",
                    f"the item lists no {', '.join(repr(k) for k in absent)} asset "
                    f"(it has {sorted(item.assets)})",
                )
            )
        else:
            complete.append(item)
    return complete, dropped


def _sensor(item: pystac.Item) -> str:
    """'LC08', 'LE07', … from the scene id (the platform name when the id is not USGS's)."""
    head = item.id.split("_", 1)[0]
    return head if len(head) == 4 else str(item.properties.get("platform", "unknown"))


@dataclass(frozen=True)
class BlockStores:
    """Where a composite's blocks of every scene wait between reading and compositing."""

    masks: ClearMaskCache
    """Clear masks, per scene and block."""
    windows: WindowCache
    """Band windows, per scene, asset and block."""


@contextmanager
def block_stores(ctx: FetchContext) -> Iterator[BlockStores]:
    """The family's caches, or throwaway ones (a temporary folder, removed at exit) for those
    the family does not keep (``share_qa`` / ``cache_reads`` off)."""
    if ctx.clear_masks is not None and ctx.windows is not None:
        yield BlockStores(ctx.clear_masks, ctx.windows)
        return
    if ctx.scratch is not None:
        ctx.scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="composite-", dir=ctx.scratch) as tmp:
        yield BlockStores(
            ctx.clear_masks or ClearMaskCache(Path(tmp) / "qa"),
            ctx.windows or WindowCache(Path(tmp) / "windows"),
        )


def _mask_key(ctx: FetchContext, item: pystac.Item, grid: GeoBox) -> dict[str, Any]:
    """What a scene's clear mask on the grid depends on (a block's adds the block)."""
    qa_spec = ctx.spec.qa
    assert qa_spec is not None
    asset = item.assets.get(qa_spec.asset)
    return {
        "scene": item.id,
        "qa_href": None if asset is None else unsigned(asset.href),
        **grid_key(grid),
        "invalid_mask": qa_spec.mask,
    }


def _in_block(key: dict[str, Any], block: Block) -> dict[str, Any]:
    return {**key, "block": block.as_list()}


def _band_read(ctx: FetchContext) -> tuple[float, float | None]:
    """(fill, nodata) of every band read."""
    spec = ctx.spec
    return (0 if spec.fill_value is None else spec.fill_value), spec.fill_value


def _year(ctx: FetchContext) -> int:
    assert ctx.year is not None
    return ctx.year


def _cut(
    grid: GeoBox, blocks: Sequence[Block], keep: Callable[[Block, AssetRead], None]
) -> tuple[list[Block], Callable[[Block, AssetRead], None]]:
    """What to read and how to keep it: a single block is read alone (a block read again in
    the compositing pass); several are read as the whole window, once, then cut into them."""
    if len(blocks) == 1:
        return list(blocks), keep
    whole = Block(0, grid.height, 0, grid.width)

    def cut(_: Block, read: AssetRead) -> None:
        for block in blocks:
            keep(block, AssetRead(read.values[block.slices], read.covered[block.slices]))

    return [whole], cut


def _read_masks(
    ctx: FetchContext,
    item: pystac.Item,
    grid: GeoBox,
    blocks: Sequence[Block],
    masks: ClearMaskCache,
) -> None:
    """Read the scene's QA_PIXEL for these blocks and keep each block's clear mask: no invalid
    QA bit set, inside the scene's footprint."""
    qa_spec = ctx.spec.qa
    assert qa_spec is not None
    key = _mask_key(ctx, item, grid)

    def keep(block: Block, qa: AssetRead) -> None:
        clear = pixels.qa_clear(qa.values, qa_spec.mask) & qa.covered
        masks.save(ctx.city, _year(ctx), item.id, _in_block(key, block), clear)

    reads, keep_read = _cut(grid, blocks, keep)
    ctx.read_blocks(item, qa_spec.asset, grid, reads, keep_read, fill=QA_NODATA, nodata=QA_NODATA)


def _read_windows(
    ctx: FetchContext,
    item: pystac.Item,
    asset_key: str,
    grid: GeoBox,
    blocks: Sequence[Block],
    windows: WindowCache,
) -> None:
    """Read one band of the scene for these blocks and keep each block."""
    fill, nodata = _band_read(ctx)
    key = window_key(item, asset_key, grid, fill, nodata)

    def keep(block: Block, read: AssetRead) -> None:
        windows.save(ctx.city, _year(ctx), item.id, asset_key, _in_block(key, block), read)

    reads, keep_read = _cut(grid, blocks, keep)
    ctx.read_blocks(item, asset_key, grid, reads, keep_read, fill=fill, nodata=nodata)


def keep_scene_blocks(
    ctx: FetchContext,
    item: pystac.Item,
    grid: GeoBox,
    blocks: Sequence[Block],
    stores: BlockStores,
) -> None:
    """Make sure every block of the scene's clear mask and band windows is kept, reading from
    the source only the blocks not kept yet (another product of the city-year, or an earlier
    attempt of this fetch, may have read them). Each asset is read through one open, under a
    lock per scene and asset, so a second process waits instead of reading the same blocks."""
    city, year = ctx.city, _year(ctx)
    masks, windows = stores.masks, stores.windows
    mask_key = _mask_key(ctx, item, grid)
    with masks.lock(city, year, item.id, mask_key):
        missing = [b for b in blocks if not masks.has(city, year, item.id, _in_block(mask_key, b))]
        if missing:
            _read_masks(ctx, item, grid, missing, masks)
    platform = item.properties.get("platform")
    fill, nodata = _band_read(ctx)
    for band in ctx.spec.bands:
        asset_key = band.asset_for(platform)
        key = window_key(item, asset_key, grid, fill, nodata)
        with windows.lock(city, year, item.id, asset_key, key):
            missing = [
                b
                for b in blocks
                if not windows.has(city, year, item.id, asset_key, _in_block(key, b))
            ]
            if missing:
                _read_windows(ctx, item, asset_key, grid, missing, windows)


def _clear_block(
    ctx: FetchContext, item: pystac.Item, grid: GeoBox, block: Block, stores: BlockStores
) -> np.ndarray:
    """A block of the scene's clear mask: loaded, or read again when its file was damaged or
    removed since it was kept."""
    key = _in_block(_mask_key(ctx, item, grid), block)
    for _ in range(2):
        mask = stores.masks.load(ctx.city, _year(ctx), item.id, key)
        if mask is not None:
            return mask
        _read_masks(ctx, item, grid, [block], stores.masks)
    raise OSError(f"{ctx.where(item.id)}: the clear mask of {block} cannot be kept")


def _window_block(
    ctx: FetchContext,
    item: pystac.Item,
    asset_key: str,
    grid: GeoBox,
    block: Block,
    stores: BlockStores,
) -> AssetRead:
    """A block of one band window: loaded, or read again when its file was damaged or removed
    since it was kept."""
    fill, nodata = _band_read(ctx)
    key = _in_block(window_key(item, asset_key, grid, fill, nodata), block)
    for _ in range(2):
        window = stores.windows.load(ctx.city, _year(ctx), item.id, asset_key, key)
        if window is not None:
            return window
        _read_windows(ctx, item, asset_key, grid, [block], stores.windows)
    raise OSError(f"{ctx.where(item.id, asset_key)}: the window of {block} cannot be kept")


@dataclass(frozen=True)
class Observations:
    """One scene's observations in one block."""

    bands: list[np.ndarray]
    """The recipe's bands, physical values, NaN where the observation is invalid."""
    clear: int
    """Pixels whose QA_PIXEL says clear."""
    out_of_range: int
    """Clear pixels left out because a band lies outside the spec's ``valid_range``."""


def block_observations(
    ctx: FetchContext, item: pystac.Item, grid: GeoBox, block: Block, stores: BlockStores
) -> Observations:
    """The recipe's bands of one scene in one block, physical values, NaN where the
    observation is not clear or (with a ``valid_range``) any of its bands is out of range."""
    spec = ctx.spec
    clear = _clear_block(ctx, item, grid, block, stores)
    platform = item.properties.get("platform")
    values = []
    usable = clear.copy()
    for band in spec.bands:
        key = band.asset_for(platform)
        scale, offset = ctx.scale_offset(item, key)
        read = _window_block(ctx, item, key, grid, block, stores)
        values.append(pixels.scale_dn(read.values, scale, offset, spec.fill_value))
        usable &= read.covered & np.isfinite(values[-1])
    out_of_range = 0
    if spec.valid_range is not None:
        low, high = spec.valid_range
        in_range = np.logical_and.reduce([pixels.in_range(v, low, high) for v in values])
        out_of_range = int((usable & ~in_range).sum())
        usable &= in_range
    bands = [pixels.masked(v, usable) for v in values]
    return Observations(bands, int(clear.sum()), out_of_range)


def keep_scenes(
    ctx: FetchContext,
    scenes: Sequence[pystac.Item],
    grid: GeoBox,
    blocks: Sequence[Block],
    stores: BlockStores,
) -> None:
    """Every scene's blocks kept, up to ``read_workers`` scenes read at once.

    GDAL releases the GIL while it waits on ranges and decodes; each asset read also takes one
    of its host's ``per_host`` slots. The first failure, in scene order, is raised once every
    started read has ended, and reads not yet started are cancelled.
    """
    workers = min(ctx.options.read_workers, len(scenes))
    if workers <= 1:
        for item in scenes:
            keep_scene_blocks(ctx, item, grid, blocks, stores)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stac-read") as pool:
        futures = [
            pool.submit(keep_scene_blocks, ctx, item, grid, blocks, stores) for item in scenes
        ]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


@dataclass(frozen=True)
class Composite:
    """A composite's files, as written, and what each scene gave."""

    layers: list[LayerFile]
    """The recipe's files."""
    clear_pixels: list[int]
    """Clear pixels of each scene on the grid, in scene order."""
    out_of_range: list[int]
    """Clear pixels of each scene left out for a band outside the valid range, in scene
    order."""
    valid_pixels: int
    """Pixels of the data file holding a value."""


def composite(
    ctx: FetchContext,
    scenes: Sequence[pystac.Item],
    grid: GeoBox,
    item_id: str,
    staging: Path,
    tags: Mapping[str, str],
) -> Composite:
    """The recipe's composite of ``scenes`` on ``grid``, computed and written block by block
    into the recipe's COGs in ``staging``.

    First every scene's clear mask and band windows are read (at most ``read_workers`` scenes
    at once) and kept on disk block by block; then each block of the output is composited from
    that block of every scene, loaded from disk, and written into the files (``CogBlocks``):
    one dask task per block, ``composite_workers`` at a time on dask's threaded scheduler
    (numpy's sorts and reductions release the GIL). So a composite holds one block of every
    scene per running task, plus, per reading thread, one asset's raw window (2–3 bytes per
    pixel); no output array of the whole window is held.

    A scene's asset window is read once, whole, and sliced into blocks, rather than read from
    the source block by block: a block boundary cuts through the asset's internal tiles, which
    block reads fetch again (measured on the loopback world: 1.87× the bytes the windows need
    at 512-pixel blocks, 2.96× at 256, against 1.34× for the whole window; GDAL's block cache
    does not stop its multi-range reads from fetching them), and every open fetches the header
    again. The kept blocks are the family's window cache when it is on, so OPT and NDVI still
    read the red band once and a retry reads only what it lacks.

    Every rule is per pixel, so the result is the same bit for bit whatever the block size; a
    pixel with no clear observation stays NaN (the file's nodata), never 0.
    """
    blocks = grid_blocks(grid, ctx.options.composite_block_px)
    files = _layer_files(ctx.spec, item_id)
    nodata = ctx.spec.output.nodata
    with block_stores(ctx) as stores, ExitStack() as writing:
        keep_scenes(ctx, scenes, grid, blocks, stores)
        outputs = [
            writing.enter_context(CogBlocks(staging / file.filename, file, grid, tags))
            for file in files
        ]

        def composite_block(block: Block) -> tuple[list[tuple[int, int]], int] | Exception:
            """One output block composited from every scene and written: (clear and
            out-of-range pixels per scene, valid pixels). A failure is returned, not raised, so
            that every block's task has ended before the files are closed."""
            try:
                stacks: list[list[np.ndarray]] = [[] for _ in ctx.spec.bands]
                clear_counts = []
                for item in scenes:
                    seen = block_observations(ctx, item, grid, block, stores)
                    clear_counts.append((seen.clear, seen.out_of_range))
                    for stack, band in zip(stacks, seen.bands, strict=True):
                        stack.append(band)
                arrays = [np.stack(stack) for stack in stacks]
                del stacks
                values = _block_values(ctx.spec, arrays)
                del arrays
                data = values[0]
                valid = int((~(data == np.asarray(nodata, data.dtype)).all(axis=0)).sum())
                for output, value in zip(outputs, values, strict=True):
                    output.write(block.window(), value)
                return clear_counts, valid
            except Exception as exc:  # raised below, the first in block order
                return exc

        done = dask.compute(
            *[dask.delayed(composite_block, pure=False)(block) for block in blocks],
            scheduler="threads",
            num_workers=ctx.options.composite_workers,
        )
        for result in done:
            if isinstance(result, Exception):
                raise result
    per_scene = list(zip(*(counts for counts, _ in done), strict=True))
    clear_pixels = [sum(clear for clear, _ in counts) for counts in per_scene]
    out_of_range = [sum(bad for _, bad in counts) for counts in per_scene]
    valid_pixels = sum(valid for _, valid in done)
    return Composite(files, clear_pixels, out_of_range, valid_pixels)


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
    candidates = select_scenes(found, spec, limit, len(found))
    if not candidates:
        raise SourceUnavailableError(
            f"{ctx.where()}: the search found {len(found)} scene(s) over the city, none of "
            f"platform {list(spec.platforms)} with eo:cloud_cover ≤ {limit} %",
            reason="no_scenes",
        )
    complete, dropped = complete_scenes(spec, candidates)
    if not complete:
        raise SourceUnavailableError(
            f"{ctx.where()}: none of the {len(candidates)} usable scene(s) lists every asset "
            f"the composite reads ({'; '.join(f'{d.id}: {d.detail}' for d in dropped)})",
            reason="no_complete_scene",
        )
    scenes = complete[: ctx.options.max_scenes or spec.max_scenes]
    for item in scenes:  # before any pixel is read: no window is fetched for nothing
        for key in scene_assets(spec, item)[:-1]:
            ctx.scale_offset(item, key)
    tags = {
        "SYNTHETIC": "false",
        "CITYCUBE_PRODUCT": spec.product,
        "CITYCUBE_CITY": ctx.city,
        "CITYCUBE_SOURCE_YEAR": str(ctx.year),
        "CITYCUBE_SOURCE": ctx.source_id,
        "CITYCUBE_COMPOSITE": COMPOSITE_RULE[spec.recipe],
        "CITYCUBE_SCENES": ",".join(item.id for item in scenes),
    }
    made = composite(ctx, scenes, grid, _item_id(spec, ctx), staging, tags)
    used = [
        _provenance(item, spec, clear, bad)
        for item, clear, bad in zip(scenes, made.clear_pixels, made.out_of_range, strict=True)
    ]
    layers = made.layers
    if not made.valid_pixels:
        raise SourceUnavailableError(
            f"{ctx.where()}: none of the {len(scenes)} scene(s) has a clear pixel in the city "
            "window (cloud, shadow, snow, gaps or reflectance outside its valid range "
            "everywhere)",
            reason="no_clear_observation",
        )
    valid_share = made.valid_pixels / (grid.width * grid.height)
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
            "citycube:valid_share": round(valid_share, 6),
            "citycube:valid_range": None if spec.valid_range is None else list(spec.valid_range),
            "citycube:out_of_range_observations": sum(made.out_of_range),
            "citycube:dropped_scenes": [d.as_dict() for d in dropped],
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
        "valid_share": f"{valid_share:.6f}",
        "out_of_range_observations": str(sum(made.out_of_range)),
        "dropped_scene_count": str(len(dropped)),
        "stac_item_file": PROVENANCE_FILE,
    }
    if dropped:
        extra["dropped_scenes"] = "; ".join(f"{d.id}: {d.reason} ({d.detail})" for d in dropped)
    return StagedFiles(files={layer.role: layer.filename for layer in layers}, extra=extra)


def _item_id(spec: StacProductSpec, ctx: FetchContext) -> str:
    return f"{spec.collection}_{spec.product}_{ctx.city}_{ctx.year}"


def _provenance(
    item: pystac.Item, spec: StacProductSpec, clear_pixels: int, out_of_range: int
) -> dict[str, Any]:
    """What the item records of a source scene: ids and unsigned hrefs, never a token."""
    platform = item.properties.get("platform")
    keys = scene_assets(spec, item)
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
        "out_of_range_pixels": out_of_range,
        "self_href": self_link.split("?", 1)[0] if self_link else None,
        "assets": {key: item.assets[key].href.split("?", 1)[0] for key in keys},
    }


def _proj_code(item: pystac.Item) -> str | None:
    code = item.properties.get("proj:code")
    if code is None and item.properties.get("proj:epsg") is not None:
        code = f"EPSG:{item.properties['proj:epsg']}"
    return None if code is None else str(code)


def _block_values(spec: StacProductSpec, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Each file's pixels, (bands, rows, cols) in the file's type, from the per-band
    observation stacks (scenes, rows, cols) of a block (or of the whole grid)."""
    out = spec.output
    if spec.recipe is Recipe.RGB_UINT8:
        assert spec.reflectance_range is not None
        low, high = spec.reflectance_range
        medians = [pixels.median_composite(stack) for stack in arrays]
        valid = np.logical_and.reduce([np.isfinite(m) for m in medians])
        rgb = np.stack(
            [pixels.reflectance_to_uint8(np.where(valid, m, np.nan), low, high) for m in medians]
        )
        return [rgb, pixels.composite_qa(valid)[None]]
    if spec.recipe is Recipe.NDVI:
        red, nir = arrays
        index = pixels.median_composite(pixels.ndvi(red, nir))
        return [pixels.to_nodata(index, out.nodata, out.dtype)[None]]
    if spec.recipe is Recipe.SURFACE_TEMPERATURE:
        (kelvin,) = arrays
        mean = pixels.mean_composite(kelvin)
        median = pixels.median_composite(kelvin)
        return [np.stack([pixels.to_nodata(v, out.nodata, out.dtype) for v in (mean, median)])]
    raise ValueError(f"{spec.product}: recipe {spec.recipe} is not a Landsat composite")


def _layer_files(spec: StacProductSpec, item_id: str) -> list[LayerFile]:
    """The recipe's files (all but their pixels), in the order ``_block_values`` gives the
    pixels."""
    out = spec.output

    def data_file(suffix: str) -> LayerFile:
        return LayerFile(
            "data",
            f"{item_id}_{suffix}.TIF",
            out.nodata,
            out.band_descriptions,
            out.units,
            out.title,
        )

    if spec.recipe is Recipe.RGB_UINT8:
        qa = LayerFile(
            "qa",
            f"{item_id}_QA_PIXEL.TIF",
            QA_NODATA,
            ("qa_pixel",),
            "bit field",
            "Composite quality: bit 6 clear where a value exists, bit 0 fill elsewhere",
            categorical=True,
        )
        return [data_file("SR_RGB"), qa]
    if spec.recipe is Recipe.NDVI:
        return [data_file("NDVI")]
    if spec.recipe is Recipe.SURFACE_TEMPERATURE:
        return [data_file("ST_ANNUAL")]
    raise ValueError(f"{spec.product}: recipe {spec.recipe} is not a Landsat composite")
