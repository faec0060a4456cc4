"""Fetching the school-capacity reference: the capacity CSVs and the GIAS extract are
downloaded through the shared download manager (cache, resume, retries) and installed as one
item with a completion record, like every other source item."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import Field, field_validator

from citycube.errors import SourceFetchError
from citycube.items.staging import InstalledItem, StagedFiles, install_item
from sources.dfe_schools.records import read_school_files
from sources.downloads import DownloadManager, DownloadOptions, redact_url

PRODUCT_ID = "dfe_school_capacity"
"""The product id of the item (and its folder under the sources root)."""
ADAPTER_VERSION = "1"
"""Bump when the files installed or their reading change."""


class SchoolSourceOptions(DownloadOptions):
    """Where the two publications are served (the releases' own file URLs)."""

    capacity_urls: tuple[str, ...] = Field(
        min_length=1,
        description="School-level CSVs of the School capacity releases (explore-education-"
        "statistics data files); together they must cover 2021/22 to 2024/25.",
    )
    gias_url: str = Field(
        description="The Get Information about Schools all-establishments CSV (edubasealldata)."
    )

    @field_validator("capacity_urls", "gias_url")
    @classmethod
    def _http_urls(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        for url in (value,) if isinstance(value, str) else value:
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value


def fetch_school_item(options: SchoolSourceOptions, city: str, root: Path) -> InstalledItem:
    """Download the files (or reuse the cache) and install them under
    ``root/dfe_school_capacity/<city>/``: reused while the same URLs and bytes are there."""
    manager = DownloadManager(options.download_settings())
    downloads = []
    for url in (*options.capacity_urls, options.gias_url):
        try:
            downloads.append(manager.fetch(url))
        except SourceFetchError as exc:
            exc.add_context(f"{PRODUCT_ID} {city}")
            raise
    roles = [f"capacity_{i}" for i in range(len(options.capacity_urls))] + ["gias"]
    identity = {
        "product": PRODUCT_ID,
        "city": city,
        "version": ADAPTER_VERSION,
        "sources": [
            {"role": r, "url": redact_url(d.url), "sha256": d.sha256}
            for r, d in zip(roles, downloads, strict=True)
        ],
    }

    def write(staging: Path) -> StagedFiles:
        files = {}
        for role, got in zip(roles, downloads, strict=True):
            name = f"{role}.csv"
            (staging / name).write_bytes(got.path.read_bytes())
            files[role] = name
        urls = {r: redact_url(d.url) for r, d in zip(roles, downloads, strict=True)}
        return StagedFiles(files, {"urls": urls})

    return install_item(root / PRODUCT_ID / city, identity, write)


def item_records(item: InstalledItem, city: str) -> pa.Table:
    """The joined school records of an installed item."""
    files = item.files
    capacity = [files[r] for r in sorted(files) if r.startswith("capacity_")]
    return read_school_files(capacity, files["gias"], city)
