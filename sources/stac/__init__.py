"""The STAC adapter family (``planetary-computer``): real products from STAC APIs.

Which products, collections, bands, masks and composites it serves is data
(``schemas/stac_products.yaml``, validated by ``sources.stac.spec``); a source set picks this
family per product and may point it at another API, token endpoint or mirror::

    products: {landsat_c2l2: planetary-computer, cop_dem_glo30: planetary-computer}
    options:
      planetary-computer: {api_url: …, sas_url: …, mirror: {…}, offline: false}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sources.stac import daymet, dem, landsat
from sources.stac.adapter import Recipe as RecipeFunction
from sources.stac.adapter import StacSource
from sources.stac.options import StacFamilyOptions
from sources.stac.retrying import retry_policy
from sources.stac.signing import HrefSigner
from sources.stac.spec import Recipe, load_stac_catalogue, read_stac_catalogue

FAMILY = "planetary-computer"
"""The family's name in source-set files."""

RECIPES: dict[Recipe, RecipeFunction] = {
    Recipe.RGB_UINT8: landsat.compose,
    Recipe.NDVI: landsat.compose,
    Recipe.SURFACE_TEMPERATURE: landsat.compose,
    Recipe.MOSAIC: dem.compose,
    Recipe.ZARR_ANNUAL: daymet.compose,
}
"""Which function carries out each recipe."""


def stac_adapters(options: Mapping[str, Any]) -> list[StacSource]:
    """The family's adapters for a source set's options (see ``StacFamilyOptions``)."""
    try:
        settings = StacFamilyOptions.model_validate(dict(options))
    except ValidationError as exc:
        raise ValueError(f"invalid {FAMILY} options: {exc}") from None
    catalogue = (
        load_stac_catalogue() if settings.spec is None else read_stac_catalogue(settings.spec)
    )
    wanted = settings.products or [p.product for p in catalogue.products]
    policy = retry_policy(settings)
    signers: dict[object, HrefSigner] = {}
    adapters = []
    for product_id in wanted:
        spec = catalogue.product(product_id)
        if settings.api_url:
            spec = spec.model_copy(update={"api_url": settings.api_url})
        assert spec.signing is not None
        if spec.signing not in signers:
            signers[spec.signing] = HrefSigner(
                spec.signing,
                policy,
                sas_url=settings.sas_url,
                mirror=settings.mirror,
                timeout=(settings.connect_timeout_s, settings.timeout_s),
                offline=settings.offline,
                mirror_dir=settings.mirror_dir,
            )
        adapters.append(StacSource(spec, settings, RECIPES[spec.recipe], signers[spec.signing]))
    return adapters


__all__ = ["FAMILY", "RECIPES", "StacFamilyOptions", "StacSource", "stac_adapters"]
