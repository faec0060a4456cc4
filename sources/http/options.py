"""Settings of the ``http`` adapter family, as a source-set file gives them under ``options``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sources.downloads import DownloadSettings

DEFAULT_CACHE_ENV = "CITYCUBE_DOWNLOAD_CACHE"
"""Environment variable naming the download cache when the options do not."""


class HttpFamilyOptions(BaseModel):
    """Where downloads go, how patient the family is, and which server to ask."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cache_dir: Path | None = Field(
        default=None,
        description="Download cache root; default $CITYCUBE_DOWNLOAD_CACHE, else "
        "$CITYCUBE_DATA/downloads, else ./data/downloads.",
    )
    mirror_dir: Path | None = Field(
        default=None, description="Offline mirror laid out as <mirror>/<host>/<path>."
    )
    offline: bool = Field(default=False, description="Never touch the network.")
    products_file: Path | None = Field(
        default=None, description="Another HTTP product catalogue (default: the packaged one)."
    )
    products: list[str] | None = Field(
        default=None, description="Serve only these product ids (default: all in the catalogue)."
    )
    base_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Product id -> base URL replacing the catalogue's (a mirror, a test server).",
    )
    per_host: int = Field(default=2, ge=1, description="Concurrent downloads per host.")
    attempts: int = Field(default=6, ge=1, description="Tries per file, the first included.")
    total_s: float = Field(default=1800.0, gt=0, description="Bound on all tries of one file.")
    wait_initial_s: float = Field(default=1.0, gt=0, description="First back-off wait.")
    wait_max_s: float = Field(default=60.0, gt=0, description="Longest back-off wait.")
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one request.")
    chunk_bytes: int = Field(default=1 << 20, ge=1024, description="Bytes written per chunk.")

    @model_validator(mode="after")
    def _mirror_exists(self) -> Self:
        if self.mirror_dir is not None and not Path(self.mirror_dir).is_dir():
            raise ValueError(f"mirror_dir {self.mirror_dir} is not a directory")
        return self

    def resolved_cache_dir(self) -> Path:
        """The download cache root (options, then environment, then the data root)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        if os.environ.get(DEFAULT_CACHE_ENV):
            return Path(os.environ[DEFAULT_CACHE_ENV])
        return Path(os.environ.get("CITYCUBE_DATA", "data")) / "downloads"

    def download_settings(self) -> DownloadSettings:
        """The shared download manager's settings for this family."""
        return DownloadSettings(
            cache_dir=self.resolved_cache_dir(),
            mirror_dir=self.mirror_dir,
            offline=self.offline,
            per_host=self.per_host,
            attempts=self.attempts,
            total_s=self.total_s,
            wait_initial_s=self.wait_initial_s,
            wait_max_s=self.wait_max_s,
            timeout_s=self.timeout_s,
            chunk_bytes=self.chunk_bytes,
        )
