"""Settings of the ``records`` adapter family, as a source-set file gives them under ``options``.

Which portal serves a city is data (``schemas/record_products.yaml``); what changes per build is
here: another spec file (a test's loopback endpoints), endpoint overrides, user-supplied files,
and the World Bank API root.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sources.downloads import DownloadOptions

WORLD_BANK_API = "https://api.worldbank.org/v2"
"""World Bank Indicators API v2 root."""


class RecordsFamilyOptions(DownloadOptions):
    """Options of the ``records`` family (download settings plus the record portals)."""

    spec_file: Path | None = Field(
        default=None, description="Record-products YAML; default schemas/record_products.yaml."
    )
    endpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Endpoint overrides by '<product>/<city>' (a mirror, a loopback server).",
    )
    user_files: list[Path] = Field(
        default_factory=list,
        description="Schema files of user-supplied records (each names its data file); they "
        "add cities or replace a portal's entry for their (product, city).",
    )
    worldbank_api: str = Field(default=WORLD_BANK_API, description="World Bank API v2 root.")
    worldbank_per_page: int = Field(default=1000, ge=1, description="Rows per World Bank page.")
