"""Settings of the STAC family, as a source set names them under ``options:``."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StacFamilyOptions(BaseModel):
    """Where the STAC API, the token endpoint and the data are, and how patient to be.

    Nothing secret goes here: a source-set file is recorded with the release. A Planetary
    Computer subscription key, if any, is read by the ``planetary_computer`` package from its
    own settings (``PC_SDK_SUBSCRIPTION_KEY``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    api_url: str | None = Field(None, description="STAC API root for every product (override).")
    sas_url: str | None = Field(
        None,
        description="Planetary Computer SAS token endpoint; default: planetary_computer's "
        "settings (PC_SDK_SAS_URL, else the public endpoint).",
    )
    mirror: dict[str, str] = Field(
        default_factory=dict,
        description="Href prefix → replacement, applied after signing (a mirror of the blob "
        "storage, e.g. a local cache or a test server).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Timeout of one HTTP request, seconds.")
    connect_timeout_s: float = Field(10.0, gt=0, description="Connect timeout, seconds.")
    retry_attempts: int = Field(6, ge=1, description="Tries of one request, the first included.")
    retry_total_s: float = Field(120.0, gt=0, description="Bound on the time spent retrying.")
    retry_wait_initial_s: float = Field(1.0, ge=0, description="First back-off wait, seconds.")
    retry_wait_max_s: float = Field(20.0, ge=0, description="Longest back-off wait, seconds.")
    max_cloud_cover: float | None = Field(
        None, ge=0, le=100, description="Overrides every product's scene cloud-cover limit."
    )
    max_scenes: int | None = Field(
        None, ge=1, description="Overrides every product's scenes-per-year bound."
    )
    products: list[str] | None = Field(
        None, description="Serve only these products (default: every product of the spec)."
    )
    spec: Path | None = Field(
        None,
        description="A STAC products spec of the form of schemas/stac_products.yaml, read "
        "instead of the packaged one: a product is taken from another collection, or another "
        "API, by writing its entry there, without code (a relative path is taken from the "
        "directory the build runs in).",
    )
    offline: bool = Field(
        False,
        description="Never touch the network (the download manager's switch): searches and "
        "collections are answered from their records, assets read from mirror_dir (or a "
        "local `mirror` prefix), no token is fetched.",
    )
    mirror_dir: Path | None = Field(
        None,
        description="Offline copy of the assets laid out as <mirror>/<host>/<path>, as the "
        "download manager's mirror.",
    )
    searches_dir: Path | None = Field(
        None,
        description="Where search and collection records live; default "
        "<data root>/sources/.stac/searches (next to the items the fetches install).",
    )
    read_workers: int = Field(
        4, ge=1, description="Scenes of one fetch read at the same time (threads)."
    )
    per_host: int = Field(
        4, ge=1, description="Asset reads in flight against one host, per process."
    )
    composite_block_px: int = Field(
        512,
        ge=16,
        description="Edge, in output pixels, of the square blocks a Landsat composite is "
        "computed over: a composite holds one block of every scene at a time, so its memory "
        "follows this and the scene count, not the city's size.",
    )
    composite_workers: int = Field(
        2,
        ge=1,
        description="Blocks of a Landsat composite computed at the same time (dask's threaded "
        "scheduler, one task per block); memory grows with it: each holds one block of every "
        "scene.",
    )
    share_qa: bool = Field(
        True,
        description="Keep each scene's clear mask on disk (<data root>/sources/.stac/qa) so "
        "OPT, NDVI and HEAT of a city-year read QA_PIXEL once.",
    )
    cache_reads: bool = Field(
        True,
        description="Keep every fetched Landsat band window (<data root>/sources/.stac/windows) "
        "and Zarr chunk (<data root>/sources/.stac/zarr) on disk, checksummed, so OPT and NDVI "
        "read the red band once, a retried fetch reads only what it lacks, and Daymet's cities "
        "and years sharing a chunk download it once.",
    )

    cache_max_gb: float | None = Field(
        None,
        ge=0,
        description="After each fetch, delete the least recently used entries of those caches "
        "(and of the clear masks) until they hold at most this many GB; a deleted entry is "
        "only read from the source again when needed. Unset: keep everything (prune by hand "
        "with `citycube prune-cache`).",
    )

    @model_validator(mode="after")
    def _waits(self) -> Self:
        if self.retry_wait_max_s < self.retry_wait_initial_s:
            raise ValueError("retry_wait_max_s must be at least retry_wait_initial_s")
        if self.mirror_dir is not None and not Path(self.mirror_dir).is_dir():
            raise ValueError(f"mirror_dir {self.mirror_dir} is not a directory")
        return self
