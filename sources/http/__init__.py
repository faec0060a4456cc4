"""The ``http`` adapter family: gridded products served as files over plain HTTP.

Products are described as data in ``schemas/http_products.yaml`` (see
``citycube.http_spec``); one module per provider turns a product's files into items of the
sample twin's form. Every download goes through the shared ``sources.downloads`` manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from citycube.http_spec import HttpProductSpec, load_http_products
from sources.downloads import DownloadManager
from sources.http.acag import AcagAnnual
from sources.http.base import HttpSource
from sources.http.chelsa import ChelsaMonthly
from sources.http.ghsl import GhslTiles
from sources.http.hilda import HildaStates
from sources.http.odiac import OdiacMonthly
from sources.http.options import HttpFamilyOptions
from sources.http.viirs import VnlAnnual

ADAPTERS: dict[str, type[HttpSource]] = {
    "ghs_pop": GhslTiles,
    "ghs_built_v": GhslTiles,
    "odiac": OdiacMonthly,
    "chelsa": ChelsaMonthly,
    "viirs_vnl": VnlAnnual,
    "acag_pm25": AcagAnnual,
    "acag_no2": AcagAnnual,
    "hilda_plus": HildaStates,
}
"""Adapter class per product id."""


def http_adapters(options: Mapping[str, Any]) -> list[HttpSource]:
    """The family's adapters for a source-set's ``options: {http: …}``."""
    try:
        parsed = HttpFamilyOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid http options: {exc}") from exc
    specs: dict[str, HttpProductSpec] = load_http_products(parsed.products_file)
    wanted = parsed.products if parsed.products is not None else list(specs)
    unknown = sorted(set(wanted) - set(specs) | set(parsed.base_urls) - set(specs))
    if unknown:
        raise ValueError(f"http options name products {unknown}; the catalogue has {sorted(specs)}")
    unserved = sorted(p for p in wanted if p not in ADAPTERS)
    if unserved:
        raise ValueError(f"no http adapter class for {unserved}; known: {sorted(ADAPTERS)}")
    manager = DownloadManager(parsed.download_settings())
    return [ADAPTERS[p](specs[p], parsed, manager) for p in wanted]


__all__ = ["ADAPTERS", "HttpFamilyOptions", "http_adapters"]
