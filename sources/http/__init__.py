"""The ``http`` adapter family: gridded products served as files over plain HTTP.

Products are described as data in ``schemas/http_products.yaml`` (see
``sources.http.spec``); one module per provider turns a product's files into items of the
sample twin's form. Every download goes through the shared ``sources.downloads`` manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sources.downloads import DownloadManager
from sources.http.acag import AcagAnnual
from sources.http.base import HttpSource
from sources.http.chelsa import ChelsaMonthly
from sources.http.ghsl import GhslTiles
from sources.http.glc import GlcTiles
from sources.http.globfp import GlobfpFootprints
from sources.http.hilda import HildaStates
from sources.http.odiac import OdiacMonthly
from sources.http.options import HttpFamilyOptions
from sources.http.spec import HttpProductSpec, load_http_products, load_http_vector_products
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
    "glc_fcs30d": GlcTiles,
}
"""Adapter class per gridded product id."""
VECTOR_ADAPTERS: dict[str, type[GlobfpFootprints]] = {"globfp_height": GlobfpFootprints}
"""Adapter class per vector product id."""


def http_adapters(options: Mapping[str, Any]) -> list[HttpSource | GlobfpFootprints]:
    """The family's adapters for a source-set's ``options: {http: …}``."""
    try:
        parsed = HttpFamilyOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid http options: {exc}") from exc
    specs: dict[str, HttpProductSpec] = load_http_products(parsed.products_file)
    vectors = load_http_vector_products(parsed.products_file)
    known = set(specs) | set(vectors)
    wanted = parsed.products if parsed.products is not None else sorted(known)
    unknown = sorted(set(wanted) - known | set(parsed.base_urls) - known)
    if unknown:
        raise ValueError(f"http options name products {unknown}; the catalogue has {sorted(known)}")
    unserved = sorted(p for p in wanted if p not in ADAPTERS and p not in VECTOR_ADAPTERS)
    if unserved:
        raise ValueError(
            f"no http adapter class for {unserved}; known: {sorted(ADAPTERS | VECTOR_ADAPTERS)}"
        )
    manager = DownloadManager(parsed.download_settings())
    return [
        VECTOR_ADAPTERS[p](vectors[p], parsed, manager)
        if p in vectors
        else ADAPTERS[p](specs[p], parsed, manager)
        for p in wanted
    ]


__all__ = ["ADAPTERS", "VECTOR_ADAPTERS", "HttpFamilyOptions", "http_adapters"]
