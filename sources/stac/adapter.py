"""One STAC-served product behind the source protocol: search, read windows, install.

A fetch searches the product's collection over the city window (and the year), signs and
reads only the window of each asset it needs, lets the product's recipe combine them, and
installs the files with the core's staging helper, so a killed fetch never leaves a half item
and a complete item made under the same rules is reused. Every failure names the product,
source, city, year and — where one is to blame — the STAC item and asset.

Online, each search and collection read is recorded (``sources.stac.records``); offline
(``offline: true``) they are answered from those records and assets are read from the mirror,
so a build recorded once can be made again without the network. Reads of one fetch run on a
bounded thread pool, at most ``per_host`` at a time against one host per process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pystac
import rasterio
from odc.geo.geobox import GeoBox

from citycube.catalogue.cities import get_city
from citycube.errors import (
    OfflineRecordError,
    SourceFetchError,
    SourceReadError,
    SourceUnavailableError,
)
from citycube.items.protocol import SourceInfo, SourceItem, SourceProduct
from citycube.items.staging import StagedFiles, install_item
from sources.downloads import host_slot
from sources.stac.clearmasks import ClearMaskCache
from sources.stac.options import StacFamilyOptions
from sources.stac.pruning import prune_caches
from sources.stac.reading import (
    AssetNotFoundError,
    AssetRead,
    Block,
    CorruptAssetError,
    gdal_env,
    read_band,
    read_band_blocks,
)
from sources.stac.records import SearchRecords, search_key
from sources.stac.retrying import RetryPolicy, TransientError, retry_policy
from sources.stac.search import SearchRequest, get_collection, search_items
from sources.stac.signing import HrefSigner
from sources.stac.spec import Signing, StacProductSpec
from sources.stac.windows import WindowCache
from sources.stac.zarrcache import ChunkCache

log = logging.getLogger(__name__)
T = TypeVar("T")

ADAPTER_VERSION = "stac-3"
"""Version of this family's recipes; bump it whenever the pixels they write change (2: warped
scenes read by the warped dataset's own blocks, whatever the composite's blocks; 3: reflectance
outside its valid range, and NDVI outside [−1, 1], are invalid)."""
STAC_STATE_DIR = ".stac"
"""Folder of the family's shared state under the sources folder (search records, QA masks,
band windows, Zarr chunks)."""


@dataclass(frozen=True)
class FetchContext:
    """Everything one fetch needs to read assets, and to say what failed."""

    spec: StacProductSpec
    """The product's rules."""
    source_id: str
    """Who serves it, e.g. 'pc:landsat-c2-l2'."""
    city: str
    """City key."""
    year: int | None
    """Source year; None for a static product."""
    signer: HrefSigner
    """Signs and mirrors hrefs."""
    policy: RetryPolicy
    """Retry bounds of every request."""
    options: StacFamilyOptions
    """Family settings (timeouts, limits)."""
    records: SearchRecords
    """Where searches are recorded (online) and answered from (offline)."""
    clear_masks: ClearMaskCache | None = None
    """Scene clear masks shared by the Landsat products; None: every product reads QA."""
    windows: WindowCache | None = None
    """Band windows kept on disk (Landsat); None: every read goes to the source."""
    chunks: ChunkCache | None = None
    """Zarr chunks kept on disk (Daymet); None: every chunk is downloaded."""
    scratch: Path | None = None
    """Where a fetch keeps, in a temporary folder of its own, the blocks it composites when the
    caches above are off (None: the system's temporary folder)."""

    def where(self, item_id: str | None = None, asset: str | None = None) -> str:
        """'landsat_st from pc:landsat-c2-l2 for Boston 2020, item X, asset Y'."""
        period = "static" if self.year is None else str(self.year)
        text = f"{self.spec.product} from {self.source_id} for {self.city} {period}"
        if item_id is not None:
            text += f", item {item_id}"
        if asset is not None:
            text += f", asset {asset!r}"
        return text

    @property
    def timeout(self) -> tuple[float, float]:
        """(connect, read) timeouts of one HTTP request."""
        return (self.options.connect_timeout_s, self.options.timeout_s)

    def search(self, request: SearchRequest) -> list[pystac.Item]:
        """Search with the family's retry policy and record the answer; offline, answer from the
        record. Failures name the product, city and year."""
        if self.options.offline:
            items = self.records.load_search(request)
            if items is None:
                key = search_key(request)
                raise OfflineRecordError(
                    f"{self.where()}: offline, and this search was never recorded (collection "
                    f"{key['collection']}, bbox {key['bbox']}, datetime {key['datetime']}, "
                    f"query {key['query']}, filter {key['filter']}; no record at "
                    f"{self.records.path(key)}). Build it online once to record the search, or "
                    "point searches_dir at the folder holding the records",
                    reason="search_not_recorded",
                )
            return items
        try:
            items = search_items(request, self.policy, self.timeout)
        except TransientError as exc:
            raise SourceFetchError(
                f"{self.where()}: the STAC search kept failing within the retry bounds: "
                f"{self.signer.redact(str(exc))}",
                transient=True,
                reason="search_failed",
            ) from None
        except SourceFetchError as exc:
            raise SourceFetchError(
                f"{self.where()}: {exc.message}", transient=exc.transient, reason=exc.reason
            ) from None
        self._record(lambda: self.records.save_search(request, items))
        return items

    def collection(self) -> pystac.Collection:
        """The product's STAC collection (for collection-level assets), with the retry policy;
        recorded online, answered from the record offline."""
        api_url = self.spec.api_url or ""
        if self.options.offline:
            found = self.records.load_collection(api_url, self.spec.collection)
            if found is None:
                raise OfflineRecordError(
                    f"{self.where()}: offline, and collection {self.spec.collection} of "
                    f"{api_url} was never recorded. Build it online once to record it, or point "
                    "searches_dir at the folder holding the records",
                    reason="search_not_recorded",
                )
            return found
        try:
            collection = get_collection(api_url, self.spec.collection, self.policy, self.timeout)
        except TransientError as exc:
            raise SourceFetchError(
                f"{self.where()}: reading the STAC collection kept failing within the retry "
                f"bounds: {self.signer.redact(str(exc))}",
                transient=True,
                reason="search_failed",
            ) from None
        except SourceFetchError as exc:
            raise SourceFetchError(
                f"{self.where()}: {exc.message}", transient=exc.transient, reason=exc.reason
            ) from None
        self._record(lambda: self.records.save_collection(api_url, collection))
        return collection

    def _record(self, save: Callable[[], Path]) -> None:
        """Write a record; a folder that cannot take it costs only the offline rebuild."""
        try:
            save()
        except OSError as exc:
            log.warning(
                "%s: could not record the STAC answer under %s (%s); an offline rebuild will "
                "not find it",
                self.where(),
                self.records.root,
                exc,
            )

    def open_href(self, href: str) -> str:
        """What to open for an href: signed (online) or the mirror copy (offline)."""
        try:
            return self.signer.sign(href)
        except OfflineRecordError as exc:
            exc.add_context(self.where())
            raise

    def read(
        self,
        item: pystac.Item,
        asset_key: str,
        grid: GeoBox,
        *,
        fill: float,
        nodata: float | None,
    ) -> AssetRead:
        """One asset's window on ``grid``, retried on transient failures."""
        asset = self._asset(item, asset_key)

        def attempt() -> AssetRead:
            href = self.open_href(asset.href)
            with self._slot(href), rasterio.Env(**gdal_env(self.options)):
                return read_band(href, grid, fill=fill, nodata=nodata)

        return self._retried(item, asset_key, attempt)

    def read_blocks(
        self,
        item: pystac.Item,
        asset_key: str,
        grid: GeoBox,
        blocks: Sequence[Block],
        keep: Callable[[Block, AssetRead], None],
        *,
        fill: float,
        nodata: float | None,
    ) -> None:
        """Blocks of one asset's window on ``grid``, each handed to ``keep`` as it is read,
        through one open of the asset; a retry after a transient failure reads only the blocks
        not yet kept."""
        asset = self._asset(item, asset_key)
        kept: set[Block] = set()

        def keep_once(block: Block, read: AssetRead) -> None:
            keep(block, read)
            kept.add(block)

        def attempt() -> None:
            missing = [block for block in blocks if block not in kept]
            href = self.open_href(asset.href)
            with self._slot(href), rasterio.Env(**gdal_env(self.options)):
                read_band_blocks(href, grid, missing, keep_once, fill=fill, nodata=nodata)

        self._retried(item, asset_key, attempt)

    def _asset(self, item: pystac.Item, asset_key: str) -> pystac.Asset:
        asset = item.assets.get(asset_key)
        if asset is None:
            raise SourceReadError(
                f"{self.where(item.id, asset_key)}: the item has no such asset "
                f"(it has {sorted(item.assets)})",
                reason="missing_asset",
            )
        return asset

    def _slot(self, href: str) -> Any:
        """One of the href's host slots (at most ``per_host`` reads in flight per host)."""
        return host_slot(urlsplit(href).netloc or "local", self.options.per_host)

    def _retried(self, item: pystac.Item, asset_key: str, attempt: Callable[[], T]) -> T:
        """``attempt`` under the retry policy; failures name the item and asset."""
        href = item.assets[asset_key].href
        try:
            return self.policy.call(attempt)
        except TransientError as exc:
            raise SourceFetchError(
                f"{self.where(item.id, asset_key)}: reading {href} kept failing within "
                f"the retry bounds: {self.signer.redact(str(exc))}",
                transient=True,
                reason="server_error",
            ) from None
        except AssetNotFoundError as exc:
            raise SourceReadError(
                f"{self.where(item.id, asset_key)}: {href} is not at the server (the item "
                f"lists it, the server says it is missing): {self.signer.redact(str(exc))}. "
                "The provider may have moved or withdrawn the scene; search again later or "
                "report it to the provider",
                reason="asset_not_found",
            ) from None
        except CorruptAssetError as exc:
            raise SourceReadError(
                f"{self.where(item.id, asset_key)}: {href} could not be decoded "
                f"(truncated or not a GeoTIFF): {self.signer.redact(str(exc))}",
                reason="corrupt_asset",
            ) from None

    def scale_offset(self, item: pystac.Item, asset_key: str) -> tuple[float, float]:
        """Scale and offset of an asset's first band, as its ``raster:bands`` say; the spec's
        ``scale_fallback`` (the provider's documented factors) where they say nothing."""
        if self.spec.scale_source == "none":
            return (1.0, 0.0)
        bands = self._asset(item, asset_key).extra_fields.get("raster:bands") or []
        if bands and "scale" in bands[0] and "offset" in bands[0]:
            return (float(bands[0]["scale"]), float(bands[0]["offset"]))
        if self.spec.scale_fallback is not None:
            scale, offset = self.spec.scale_fallback
            return (float(scale), float(offset))
        raise SourceReadError(
            f"{self.where(item.id, asset_key)}: raster:bands gives no scale and offset, and "
            "the spec sets no scale_fallback; raw counts are not physical values. For items "
            "that never carry raster:bands (USGS's own STAC), set scale_fallback to the "
            "provider's documented factors",
            reason="missing_scale",
        )


Recipe = Callable[[FetchContext, Path], StagedFiles]
"""Writes one item's files into a staging directory."""


class StacSource(SourceProduct):
    """A product served from a STAC collection, per the rules of its spec."""

    def __init__(
        self,
        spec: StacProductSpec,
        options: StacFamilyOptions,
        recipe: Recipe,
        signer: HrefSigner,
    ) -> None:
        self.spec = spec
        self.options = options
        self.recipe = recipe
        self.signer = signer
        self.policy = retry_policy(options)
        prefix = "pc" if spec.signing is Signing.PLANETARY_COMPUTER else "stac"
        self.info = SourceInfo(
            product_id=spec.product,
            source_id=f"{prefix}:{spec.collection}",
            version=spec.version,
            synthetic=False,
            licence=spec.licence,
            attribution=spec.attribution,
        )

    def source_years(self, city: str) -> list[int] | None:
        """Years of the product's calendar (none for a city outside its coverage); None for a
        static product."""
        centre = get_city(city).centre
        if self.spec.temporal == "static":
            return None
        if self.spec.coverage_bbox is not None:
            west, south, east, north = self.spec.coverage_bbox
            if not (west <= centre.lon <= east and south <= centre.lat <= north):
                return []
        assert self.spec.first_year is not None and self.spec.last_year is not None
        return list(range(self.spec.first_year, self.spec.last_year + 1))

    def identity(self, city: str, source_year: int | None) -> dict[str, Any]:
        """What a completion record must say for an item to be reused."""
        return {
            "product": self.product_id,
            "city": city,
            "source_year": source_year,
            "source_id": self.info.source_id,
            "version": self.info.version,
            "adapter": ADAPTER_VERSION,
            "rules": self.spec.digest(),
            "synthetic": False,
        }

    def fetch(self, city: str, source_year: int | None, dest: Path) -> SourceItem:
        """Search, read the city's windows, combine and install one item (or reuse it)."""
        get_city(city)
        self._check_year(city, source_year)
        state = Path(dest) / STAC_STATE_DIR
        searches = self.options.searches_dir
        context = FetchContext(
            spec=self.spec,
            source_id=self.info.source_id,
            city=city,
            year=source_year,
            signer=self.signer,
            policy=self.policy,
            options=self.options,
            records=SearchRecords(state / "searches" if searches is None else Path(searches)),
            clear_masks=ClearMaskCache(state / "qa") if self.options.share_qa else None,
            windows=WindowCache(state / "windows") if self.options.cache_reads else None,
            chunks=ChunkCache(state / "zarr") if self.options.cache_reads else None,
            scratch=state / "scratch",
        )
        installed = install_item(
            self.item_dir(city, source_year, dest),
            self.identity(city, source_year),
            lambda staging: self.recipe(context, staging),
        )
        if self.options.cache_max_gb is not None:
            # After the install: this fetch's entries are the newest, so they go last.
            report = prune_caches(state, max_bytes=int(self.options.cache_max_gb * 1e9))
            if report.removed or report.skipped_locked:
                log.info(
                    "%s %s %s: caches pruned: %s",
                    self.product_id,
                    city,
                    source_year,
                    report.summary(),
                )
        return self.installed_source_item(installed, city, source_year)

    def _check_year(self, city: str, source_year: int | None) -> None:
        years = self.source_years(city)
        if years is None:
            if source_year is not None:
                raise ValueError(f"{self.product_id} is static; fetch it with source_year=None")
            return
        if source_year is None:
            raise ValueError(f"{self.product_id} is annual; pass a source year")
        if not years:
            raise SourceUnavailableError(
                f"{self.product_id} from {self.info.source_id} does not cover {city} "
                f"(its domain is {self.spec.coverage_bbox}, west, south, east, north)",
                reason="outside_source_coverage",
            )
        if source_year not in years:
            raise SourceUnavailableError(
                f"{self.product_id} from {self.info.source_id} has no source year "
                f"{source_year}; it covers {years[0]}–{years[-1]}",
                reason="source_year_missing",
            )
