"""Settings of the ``http`` adapter family, as a source-set file gives them under ``options``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sources.downloads import DownloadOptions


class HttpFamilyOptions(DownloadOptions):
    """Where downloads go, how patient the family is (``DownloadOptions``), and which server
    to ask."""

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
